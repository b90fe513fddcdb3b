/* peak_probe.c - arithmetic peak of this CPU for the operations Kwker's matmuls are made of, so
 * that prompt speeds can be stated as a share of what the cores can do (docs/benchmarks.md):
 * float32 fused multiply-adds (preserve), int8 dot products (vpdpbusd with AVX-512 VNNI;
 * maddubs + madd with AVX2), the same operations in the act8 prompt tiles' shape (below), and
 * AMX tile multiplies (bf16 and int8). Each thread runs long chains of independent
 * register-only instructions (or the tile shapes on data in L1); the main thread starts and
 * joins them.
 *
 *   peak_probe [-t threads] [-s seconds] [--only NAME[,NAME..]] [--json]
 *
 * Prints, per operation, the best and the median of 5 passes in giga multiply-accumulates per
 * second over all threads (JSON: NAME and NAME_median). Instruction sets are chosen per function with target attributes; operations the CPU
 * lacks are reported as absent. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>

#define PASSES 5  /* passes an operation: the best and the median are printed */
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

/* ---- tile-shaped probes: the quantized prompt tiles' instruction mix on data in L1 ----------
 * The register-only peaks above bound what a kernel could do; these bound what the act8 prompt
 * tiles (kernels/avx512_quant.c tile8_q8 4 x 4, kernels/avx2_quant.c tile8_q8 one half x 4) can
 * do on this core with their memory operands and their per-group epilogue, so a tile's measured
 * speed (bench_kernels quant) reads as a share of its own ceiling. Each trip is one 32-column
 * group over weights cycling through 8 groups (16 KB, in L1). */
#define TILE_GROUPS 8

static uint8_t tile_w[4][TILE_GROUPS][32 * 16] __attribute__((aligned(64)));
static int8_t tile_x[4][TILE_GROUPS * 32] __attribute__((aligned(64)));
static float tile_dx[4][TILE_GROUPS];
static uint16_t tile_dw[4][TILE_GROUPS][16];

static void tile_data(void)
{
    memset(tile_w, 130, sizeof tile_w);
    memset(tile_x, 3, sizeof tile_x);
    for (int j = 0; j < 4; j++)
        for (int g = 0; g < TILE_GROUPS; g++) {
            tile_dx[j][g] = 1e-3f;
            for (int r = 0; r < 16; r++)
                tile_dw[j][g][r] = 0x1400; /* half 2^-10 */
        }
}

/* 4 row blocks x 4 tokens: per group 8 steps of 4 weight loads, 4 broadcasts and 16 vpdpbusd,
 * then (epi) 16 x (convert, d_w * d_x, FMA) into float sums, as tile8_q8; without epi the
 * integer sums carry on (the loop alone). */
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c"), always_inline)) static inline float
tile512(long n, int epi)
{
    __m512 facc[4][4];
    __m512i acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            facc[i][j] = _mm512_setzero_ps();
            acc[i][j] = _mm512_setzero_si512();
        }
    for (long t = 0; t < n; t++) {
        int g = (int)(t % TILE_GROUPS);
        if (epi)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] = _mm512_setzero_si512();
        for (int k4 = 0; k4 < 8; k4++) {
            __m512i wv[4];
            for (int i = 0; i < 4; i++)
                wv[i] = _mm512_load_si512(tile_w[i][g] + 64 * k4);
            for (int j = 0; j < 4; j++) {
                int32_t v;
                memcpy(&v, tile_x[j] + 32 * g + 4 * k4, 4);
                __m512i xb = _mm512_set1_epi32(v);
                for (int i = 0; i < 4; i++)
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[i], xb);
            }
        }
        if (epi)
            for (int i = 0; i < 4; i++) {
                __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile_dw[i][g]));
                for (int j = 0; j < 4; j++)
                    facc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j]),
                                                 _mm512_mul_ps(dw, _mm512_set1_ps(tile_dx[j][g])),
                                                 facc[i][j]);
            }
    }
    __m512 s = _mm512_setzero_ps();
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            s = _mm512_add_ps(s, _mm512_add_ps(facc[i][j], _mm512_cvtepi32_ps(acc[i][j])));
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,f16c"))) static float tile512_epi(long n)
{
    return tile512(n, 1);
}

__attribute__((target("avx512f,avx512bw,avx512vnni,f16c"))) static float tile512_loop(long n)
{
    return tile512(n, 0);
}

/* AVX2: both 8-row halves of a block x 4 tokens, weights stored + 128 as tile8_q8 takes them:
 * per step and half a load, flip and absolute value, then per token a broadcast and per half
 * psignb, maddubs, madd and add; per group 2 x 4 x (convert, d_w * d_x, FMA).
 * Two shapes Kwker does not run, to price that product's parts (docs/benchmarks.md, session
 * 25): kind NOSIGN takes the stored weights as maddubs' unsigned operand with no psignb, which
 * is exact only for activations of 7 bits (|x| <= 63: 2 * 255 * 63 < 32768); kind PMADDWD has
 * 16-bit weights and activations and one pmaddwd (16 products) in place of maddubs + madd. */
enum { SIGN, NOSIGN, PMADDWD };

__attribute__((target("avx2,fma,f16c"), always_inline)) static inline float tile256(long n,
                                                                                   int kind)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 facc[2][4];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            facc[h][j] = _mm256_setzero_ps();
    for (long t = 0; t < n; t++) {
        int g = (int)(t % TILE_GROUPS);
        __m256i acc[2][4];
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                acc[h][j] = _mm256_setzero_si256();
        /* 8 steps of 4 columns, or 16 of 2 columns of 16-bit numbers (tile_w and tile_x hold
         * twice the bytes a group needs: the 16-bit shape reads group g's as g % 4) */
        for (int k = 0; k < (kind == PMADDWD ? 16 : 8); k++) {
            const uint8_t *wp = kind == PMADDWD ? tile_w[0][0] + 1024 * (g % 4) + 64 * k
                                                : tile_w[0][g] + 64 * k;
            __m256i wv[2], aw[2];
            for (int h = 0; h < 2; h++) {
                wv[h] = _mm256_load_si256((const __m256i *)(wp + 32 * h));
                if (kind == SIGN) {
                    wv[h] = _mm256_xor_si256(wv[h], flip);
                    aw[h] = _mm256_abs_epi8(wv[h]);
                }
            }
            for (int j = 0; j < 4; j++) {
                int32_t v;
                memcpy(&v, kind == PMADDWD ? tile_x[j] + 64 * (g % 4) + 4 * k
                                           : tile_x[j] + 32 * g + 4 * k, 4);
                __m256i xb = _mm256_set1_epi32(v);
                for (int h = 0; h < 2; h++) {
                    __m256i p =
                        kind == SIGN     ? _mm256_madd_epi16(_mm256_maddubs_epi16(
                                               aw[h], _mm256_sign_epi8(xb, wv[h])), ones)
                        : kind == NOSIGN ? _mm256_madd_epi16(_mm256_maddubs_epi16(wv[h], xb),
                                                             ones)
                                         : _mm256_madd_epi16(wv[h], xb);
                    acc[h][j] = _mm256_add_epi32(acc[h][j], p);
                    __asm__("" : "+x"(acc[h][j])); /* as avx2_quant.c's KEEP */
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tile_dw[0][g] + 8 * h)));
            for (int j = 0; j < 4; j++)
                facc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][j]),
                                             _mm256_mul_ps(dw, _mm256_set1_ps(tile_dx[j][g])),
                                             facc[h][j]);
        }
    }
    float v[8];
    __m256 s = _mm256_setzero_ps();
    for (int h = 0; h < 2; h++)
        s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(facc[h][0], facc[h][1]),
                                           _mm256_add_ps(facc[h][2], facc[h][3])));
    _mm256_storeu_ps(v, s);
    return v[0] + v[7];
}

__attribute__((target("avx2,fma,f16c"))) static float tile256_sign(long n)
{
    return tile256(n, SIGN);
}

__attribute__((target("avx2,fma,f16c"))) static float tile256_nosign(long n)
{
    return tile256(n, NOSIGN);
}

__attribute__((target("avx2,fma,f16c"))) static float tile256_pmaddwd(long n)
{
    return tile256(n, PMADDWD);
}

/* ---- the AMX tile unit: register-only tile multiplies ----------------------------------------
 * Four C tiles from two A and two B tiles (the 2 x 2 block of kernels/amx_bf16t.c and
 * amx_quant.c, without their loads): the tile unit's own rate. One unit serves a physical core,
 * so where a hypervisor's vCPU is one hardware thread, the tenant on its sibling thread shares it
 * (docs/benchmarks.md, session 33): the median of the passes shows that, the best the unit
 * alone. Each trip is four multiplies, 16 x 16 x 32 bf16 pairs or 16 x 16 x 64 int8 products. */
struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static const _Alignas(64) struct amx_config AMX_CONFIG = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static _Alignas(64) uint8_t amx_data[2][1024];

/* 1 where the tile unit can run here: CPUID's AMX bits and the kernel's permission for the tile
 * state (asked for once a process). */
static int amx_ok(int int8)
{
    static int perm = -1;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) ||
        !(d & (1u << (int8 ? 25 : 22))))
        return 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
    if (perm < 0) /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA */
        perm = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return perm;
#else
    return 0;
#endif
}

/* The probes' tiles: A in 4 and 5, B in 6 and 7 (from amx_data), C 0-3 zeroed. */
__attribute__((target("amx-tile"), always_inline)) static inline void amx_tiles_init(void)
{
    _tile_loadconfig(&AMX_CONFIG);
    _tile_loadd(4, amx_data[0], 64);
    _tile_loadd(5, amx_data[1], 64);
    _tile_loadd(6, amx_data[1], 64);
    _tile_loadd(7, amx_data[0], 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

#define AMX_PROBE(NAME, TARGET, OP)                                                                \
    __attribute__((target(TARGET))) static float NAME(long n)                                     \
    {                                                                                              \
        amx_tiles_init();                                                                          \
        for (long t = 0; t < n; t++) {                                                             \
            OP(0, 4, 6);                                                                           \
            OP(1, 4, 7);                                                                           \
            OP(2, 5, 6);                                                                           \
            OP(3, 5, 7);                                                                           \
        }                                                                                          \
        _Alignas(64) float c[16][16];                                                              \
        _tile_stored(0, c, 64);                                                                    \
        _tile_release();                                                                           \
        return c[0][0];                                                                            \
    }
AMX_PROBE(bf16_amx, "amx-tile,amx-bf16", _tile_dpbf16ps)
AMX_PROBE(int8_amx, "amx-tile,amx-int8", _tile_dpbssd)

/* float32 FMAs with int8 tile multiplies beside them on the same thread: 4 multiplies and
 * 4 x FMA_ROUNDS x CHAINS FMAs a trip, reported as the FMAs' rate. The quantized AMX tiles hand
 * every 32-column group's sums to a vector epilogue (kernels/amx_quant.c), so what they cost is
 * the tile work and the epilogue's time together where the two take turns on a core, and the
 * larger of them where they overlap. With 384 FMAs (about twice a free tile unit's time for the
 * 4 multiplies) this equals fp32_fma_avx512 where they overlap fully; about half of it where
 * they take turns (session 34, docs/benchmarks.md). */
#define FMA_ROUNDS 8
__attribute__((target("amx-tile,amx-int8,avx512f"))) static float fma_beside_amx(long n)
{
    amx_tiles_init();
    __m512 acc[CHAINS], a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
    for (int i = 0; i < CHAINS; i++)
        acc[i] = _mm512_set1_ps((float)i);
#define FMA_ROUND                                                                                  \
    for (int r = 0; r < FMA_ROUNDS; r++)                                                           \
        for (int i = 0; i < CHAINS; i++)                                                           \
            acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    for (long t = 0; t < n; t++) {
        _tile_dpbssd(0, 4, 6);
        FMA_ROUND
        _tile_dpbssd(1, 4, 7);
        FMA_ROUND
        _tile_dpbssd(2, 5, 6);
        FMA_ROUND
        _tile_dpbssd(3, 5, 7);
        FMA_ROUND
        __asm__ volatile("" : "+v"(a));
    }
#undef FMA_ROUND
    _tile_release();
    __m512 s = acc[0];
    for (int i = 1; i < CHAINS; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

struct op {
    const char *name;
    const char *feature; /* __builtin_cpu_supports name(s) needed, comma-separated */
    float (*fn)(long);
    double macs; /* multiply-accumulates per instruction (per maddubs+madd+add triple) */
    double trip_macs; /* tile probes: multiply-accumulates per trip (one group), else 0 */
};

static const struct op ops[] = {
    {"fp32_fma_avx512", "avx512f", fma512, 16, 0},
    {"fp32_fma_avx2", "avx2,fma", fma256, 8, 0},
    {"int8_vnni_avx512", "avx512f,avx512vnni", vnni512, 64, 0},
    {"bf16_dp_avx512", "avx512f,avx512bf16", bf16_512, 32, 0},
    {"int8_maddubs_avx2", "avx2", maddubs256, 32, 0},
    {"int8_tile_loop_avx512", "avx512f,avx512bw,avx512vnni", tile512_loop, 0, 8 * 16 * 64},
    {"int8_tile_avx512", "avx512f,avx512bw,avx512vnni", tile512_epi, 0, 8 * 16 * 64},
    {"int8_tile_avx2", "avx2,fma", tile256_sign, 0, 16 * 4 * 32},
    {"int8_tile_avx2_nosign", "avx2,fma", tile256_nosign, 0, 16 * 4 * 32},
    {"int16_tile_avx2_pmaddwd", "avx2,fma", tile256_pmaddwd, 0, 16 * 4 * 32},
    {"bf16_amx", "amx-bf16", bf16_amx, 0, 4 * 16 * 16 * 32},
    {"int8_amx", "amx-int8", int8_amx, 0, 4 * 16 * 16 * 64},
    {"fp32_fma_beside_amx", "amx-int8", fma_beside_amx, 0, 4 * FMA_ROUNDS * CHAINS * 16},
};

static int cpu_has(const char *features)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", features);
    for (char *save = NULL, *f = strtok_r(buf, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        int ok = !strcmp(f, "avx512f")      ? __builtin_cpu_supports("avx512f")
                 : !strcmp(f, "avx2")       ? __builtin_cpu_supports("avx2")
                 : !strcmp(f, "fma")        ? __builtin_cpu_supports("fma")
                 : !strcmp(f, "avx512bw")   ? __builtin_cpu_supports("avx512bw")
                 : !strcmp(f, "avx512vnni") ? __builtin_cpu_supports("avx512vnni")
                 : !strcmp(f, "avx512bf16") ? __builtin_cpu_supports("avx512bf16")
                 : !strcmp(f, "amx-bf16")   ? amx_ok(0)
                 : !strcmp(f, "amx-int8")   ? amx_ok(1)
                                            : 0;
        if (!ok)
            return 0;
    }
    return 1;
}

/* 1 where name is one of list's comma-separated names. */
static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strcspn(p, ",") == n && !strncmp(p, name, n))
            return 1;
    }
    return 0;
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
    const char *only = NULL;
    double seconds = 0.3;
    tile_data();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc)
            n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: peak_probe [-t threads] [-s seconds per pass] "
                            "[--only NAME[,NAME..]] [--json]\n");
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
        if (only && !listed(only, op->name))
            continue;
        if (!cpu_has(op->feature)) {
            if (json)
                printf(", \"%s\": null", op->name);
            else
                printf("%-24s absent\n", op->name);
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
        double t[PASSES];
        for (int r = 0; r < PASSES; r++) { /* insertion-sorted */
            double tp = pass(op, n_threads, trips);
            int i = r;
            for (; i > 0 && t[i - 1] > tp; i--)
                t[i] = t[i - 1];
            t[i] = tp;
        }
        double per_trip = op->trip_macs > 0 ? op->trip_macs : CHAINS * op->macs;
        double gmacs = (double)trips * per_trip * n_threads / t[0] * 1e-9;
        double median = (double)trips * per_trip * n_threads / t[PASSES / 2] * 1e-9;
        if (json)
            printf(", \"%s\": %.1f, \"%s_median\": %.1f", op->name, gmacs, op->name, median);
        else
            printf("%-24s %8.1f GMAC/s (%d threads; median pass %.1f)\n", op->name, gmacs,
                   n_threads, median);
    }
    if (json)
        printf("}\n");
    return 0;
}
