/* peak_probe.c - arithmetic peak of this CPU for the operations Kwker's matmuls are made of, so
 * that prompt speeds can be stated as a share of what the cores can do (docs/benchmarks.md):
 * float32 fused multiply-adds (preserve), int8 dot products (vpdpbusd with AVX-512 VNNI;
 * maddubs + madd with AVX2).
 * Each thread runs long chains of independent register-only instructions; the main thread
 * starts and joins them.
 *
 *   peak_probe [-t threads] [-s seconds] [--json]
 *
 * Prints, per operation, the best of 5 passes in giga multiply-accumulates per second over all
 * threads. Instruction sets are chosen per function with target attributes; operations the CPU
 * lacks are reported as absent. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <immintrin.h>

#define CHAINS 12 /* independent accumulators: enough to cover latency x ports on current cores */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Each kernel runs n trips of CHAINS instructions on its accumulators and returns something
 * derived from all of them, so none is optimized away. MACs per instruction are in ops[]. */
__attribute__((target("avx512f"))) static float fma512(long n)
{
    __m512 acc[CHAINS], a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (long t = 0; t < n; t++) {
        for (int i = 0; i < CHAINS; i++)
            acc[i] = _mm512_fmadd_ps(acc[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512 s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma256(long n)
{
    __m256 acc[CHAINS], a = _mm256_set1_ps(1.0001f), b = _mm256_set1_ps(0.9999f);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm256_set1_ps((float)i);
    for (long t = 0; t < n; t++) {
        for (int i = 0; i < CHAINS; i++)
            acc[i] = _mm256_fmadd_ps(acc[i], a, b);
        __asm__ volatile("" : "+x"(a));
    }
    __m256 s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm256_add_ps(s, acc[i]);
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[7];
}

__attribute__((target("avx512f,avx512vnni"))) static float vnni512(long n)
{
    __m512i acc[CHAINS], a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm512_set1_epi32(i);
    for (long t = 0; t < n; t++) {
        for (int i = 0; i < CHAINS; i++)
            acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512i s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm512_add_epi32(s, acc[i]);
    return (float)_mm512_reduce_add_epi32(s);
}

/* bf16 pairs: 32 multiply-accumulates into float (the act8 attention's vdpbf16ps). */
__attribute__((target("avx512f,avx512bf16"))) static float bf16_512(long n)
{
    __m512 acc[CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3f7f3f7f);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm512_set1_ps((float)i);
    for (long t = 0; t < n; t++) {
        for (int i = 0; i < CHAINS; i++)
            acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512 s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

/* AVX2's int8 dot product: maddubs (u8 x s8 pairs to s16) then madd with ones (s16 pairs to s32)
 * and an add: three instructions for 32 multiply-accumulates. */
__attribute__((target("avx2"))) static float maddubs256(long n)
{
    __m256i acc[CHAINS], a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm256_set1_epi32(i);
    for (long t = 0; t < n; t++) {
        for (int i = 0; i < CHAINS; i++)
            acc[i] = _mm256_add_epi32(acc[i],
                                      _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
        __asm__ volatile("" : "+x"(a));
    }
    __m256i s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm256_add_epi32(s, acc[i]);
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, s);
    return (float)(v[0] + v[7]);
}

struct op {
    const char *name;
    const char *feature; /* __builtin_cpu_supports name(s) needed, comma-separated */
    float (*fn)(long);
    double macs; /* multiply-accumulates per instruction (per maddubs+madd+add triple) */
};

static const struct op ops[] = {
    {"fp32_fma_avx512", "avx512f", fma512, 16},
    {"fp32_fma_avx2", "avx2,fma", fma256, 8},
    {"int8_vnni_avx512", "avx512f,avx512vnni", vnni512, 64},
    {"bf16_dp_avx512", "avx512f,avx512bf16", bf16_512, 32},
    {"int8_maddubs_avx2", "avx2", maddubs256, 32},
};

static int cpu_has(const char *features)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", features);
    for (char *save = NULL, *f = strtok_r(buf, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        int ok = !strcmp(f, "avx512f")      ? __builtin_cpu_supports("avx512f")
                 : !strcmp(f, "avx2")       ? __builtin_cpu_supports("avx2")
                 : !strcmp(f, "fma")        ? __builtin_cpu_supports("fma")
                 : !strcmp(f, "avx512vnni") ? __builtin_cpu_supports("avx512vnni")
                 : !strcmp(f, "avx512bf16") ? __builtin_cpu_supports("avx512bf16")
                                            : 0;
        if (!ok)
            return 0;
    }
    return 1;
}

struct job {
    const struct op *op;
    long trips;
    pthread_barrier_t *bar;
    volatile float sink;
};

static void *worker(void *arg)
{
    struct job *j = arg;
    pthread_barrier_wait(j->bar);
    j->sink = j->op->fn(j->trips);
    pthread_barrier_wait(j->bar);
    return NULL;
}

/* Wall time of one pass of `trips` on every thread. */
static double pass(const struct op *op, int n_threads, long trips)
{
    pthread_t th[256];
    struct job jobs[256];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n_threads + 1);
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (struct job){.op = op, .trips = trips, .bar = &bar};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    pthread_barrier_wait(&bar);
    double t0 = now_s();
    pthread_barrier_wait(&bar);
    double t = now_s() - t0;
    for (int i = 0; i < n_threads; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    return t;
}

int main(int argc, char **argv)
{
    int n_threads = 1, json = 0;
    double seconds = 0.3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: peak_probe [-t threads] [-s seconds per pass] [--json]\n");
            return 2;
        }
    }
    if (n_threads < 1 || n_threads > 256 || !(seconds > 0.0 && seconds < 60.0)) {
        fprintf(stderr, "peak_probe: -t must be 1..256 and -s in (0, 60)\n");
        return 2;
    }
    if (json)
        printf("{\"threads\": %d", n_threads);
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        const struct op *op = &ops[k];
        if (!cpu_has(op->feature)) {
            if (json)
                printf(", \"%s\": null", op->name);
            else
                printf("%-20s absent\n", op->name);
            continue;
        }
        /* size a pass to about `seconds`: double the trips on this thread until one call
         * takes a quarter of it (a pool of threads would add its start-up to the estimate) */
        long trips = 1 << 12;
        for (;;) {
            double t0 = now_s();
            volatile float r = op->fn(trips);
            (void)r;
            double t = now_s() - t0;
            if (t >= seconds / 4 || trips > (1L << 40)) {
                trips = (long)((double)trips * seconds / (t > 1e-9 ? t : 1e-9));
                break;
            }
            trips *= 2;
        }
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            double tp = pass(op, n_threads, trips);
            best = tp < best ? tp : best;
        }
        double gmacs = (double)trips * CHAINS * op->macs * n_threads / best * 1e-9;
        if (json)
            printf(", \"%s\": %.1f", op->name, gmacs);
        else
            printf("%-20s %8.1f GMAC/s (%d threads)\n", op->name, gmacs, n_threads);
    }
    if (json)
        printf("}\n");
    return 0;
}
