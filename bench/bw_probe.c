/* bw_probe.c - read-bandwidth probe of the side-by-side benchmark (bench/side_by_side.py): reads a
 * buffer (256 MiB by default) with AVX-512 or AVX2 loads on N threads and prints GB/s. The main
 * thread starts and joins the workers; each worker reads only its own slice.
 *
 *   bw_probe [-t threads] [-m MiB] [-r passes] [--isa avx512|avx2] [--pages huge|4k]
 *            [--streams N --stream-bytes B [--prefetch D]] [--json]
 *
 * --streams N reads each slice as runs of N consecutive B-byte blocks read side by side, one
 * 64-byte line of each in turn: the pattern of a decode tile that walks N rows of B bytes at once,
 * or with B a quarter of a slice, N = 4 long streams as the float decodes read them (B a multiple
 * of 64; the default, 1 stream, is a plain sequential read). --prefetch D asks for each stream's
 * line D bytes ahead as it reads one (D a multiple of 64, inside the block), as those decodes
 * do (kernels/float_rows.h): with 4 long streams a thread that is the fastest reader measured on
 * Zen 3, the pattern side_by_side.py's ceiling also probes so that no kernel reads faster than
 * its ceiling.
 *
 * The figure is the best of -r timed passes (after one untimed pass that faults the pages in):
 * the machine's bandwidth flips between states every few minutes, and within one state the best
 * pass is the one least disturbed by other processes. The buffer gets MADV_HUGEPAGE by default
 * (2 MiB pages read about 1.5x faster here than 4 KiB ones; the stricter ceiling), --pages 4k
 * advises MADV_NOHUGEPAGE instead. Instruction sets are chosen per function with target
 * attributes, so this file builds with the default flags and runs on any x86-64 CPU. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BW_X86 1
#else
#define BW_X86 0
#endif

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

static volatile uint64_t g_sink; /* the loads' result is stored here, so none is optimized out */

struct job {
    const unsigned char *p;
    size_t n;            /* bytes of this thread's slice, a multiple of 256 */
    int isa;
    int passes;          /* untimed warm-up pass + timed ones */
    int streams;         /* blocks read side by side (1: sequential) */
    size_t stream_bytes; /* bytes of each block, a multiple of 64 */
    size_t prefetch;     /* bytes ahead each stream's next lines are asked for; 0: none */
    pthread_barrier_t *bar;
    double *t_pass;      /* [passes] filled by thread 0: wall time of each pass */
    int id;
    uint64_t sink;       /* keeps the loads alive */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t read_scalar(const unsigned char *p, size_t n)
{
    const uint64_t *q = (const uint64_t *)(const void *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return a ^ b ^ c ^ d;
}

#if BW_X86
__attribute__((target("avx2"))) static uint64_t read_avx2(const unsigned char *p, size_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const unsigned char *p, size_t n)
{
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 256) {
        a = _mm512_xor_si512(a, _mm512_load_si512((const void *)(p + i)));
        b = _mm512_xor_si512(b, _mm512_load_si512((const void *)(p + i + 64)));
        c = _mm512_xor_si512(c, _mm512_load_si512((const void *)(p + i + 128)));
        d = _mm512_xor_si512(d, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    return (uint64_t)_mm512_reduce_add_epi64(a);
}

/* Runs of ns blocks of nb bytes, one line of each block in turn (the tail that does not fill a
 * run is not read; the caller counts only what is), each block's line pf bytes ahead asked for
 * while it is inside the block (pf 0: never). */
__attribute__((target("avx512f"))) static uint64_t read_streams_avx512(const unsigned char *p,
                                                                       size_t n, int ns, size_t nb,
                                                                       size_t pf)
{
    __m512i a = _mm512_setzero_si512();
    size_t run = (size_t)ns * nb;
    for (size_t r = 0; r + run <= n; r += run)
        for (size_t off = 0; off < nb; off += 64)
            for (int s = 0; s < ns; s++) {
                const unsigned char *q = p + r + s * nb + off;
                if (pf && nb - off > pf)
                    _mm_prefetch((const char *)(q + pf), _MM_HINT_T0);
                a = _mm512_xor_si512(a, _mm512_load_si512((const void *)q));
            }
    return (uint64_t)_mm512_reduce_add_epi64(a);
}

/* read_streams_avx512 with AVX2 loads (two to a line). */
__attribute__((target("avx2"))) static uint64_t read_streams_avx2(const unsigned char *p,
                                                                   size_t n, int ns, size_t nb,
                                                                   size_t pf)
{
    __m256i a = _mm256_setzero_si256(), b = a;
    size_t run = (size_t)ns * nb;
    for (size_t r = 0; r + run <= n; r += run)
        for (size_t off = 0; off < nb; off += 64)
            for (int s = 0; s < ns; s++) {
                const unsigned char *q = p + r + s * nb + off;
                if (pf && nb - off > pf)
                    _mm_prefetch((const char *)(q + pf), _MM_HINT_T0);
                a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(const void *)q));
                b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(const void *)(q + 32)));
            }
    a = _mm256_xor_si256(a, b);
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}
#endif

/* Bytes read_slice reads of an n-byte slice. */
static size_t slice_read_bytes(size_t n, int streams, size_t stream_bytes)
{
    if (streams <= 1)
        return n;
    size_t run = (size_t)streams * stream_bytes;
    return n / run * run;
}

static uint64_t read_slice(const unsigned char *p, size_t n, int isa, int streams, size_t nb,
                           size_t pf)
{
#if BW_X86
    if (streams <= 1)
        nb = n; /* one stream: the whole slice (only read this way with a prefetch) */
    if ((streams > 1 || pf) && isa == ISA_AVX512)
        return read_streams_avx512(p, n, streams, nb, pf);
    if ((streams > 1 || pf) && isa == ISA_AVX2)
        return read_streams_avx2(p, n, streams, nb, pf);
    if (isa == ISA_AVX512)
        return read_avx512(p, n);
    if (isa == ISA_AVX2)
        return read_avx2(p, n);
#endif
    (void)isa;
    (void)pf;
    return read_scalar(p, n);
}

static void *worker(void *arg)
{
    struct job *j = arg;
    for (int r = 0; r < j->passes; r++) {
        pthread_barrier_wait(j->bar);
        double t0 = now_s();
        j->sink ^= read_slice(j->p, j->n, j->isa, j->streams, j->stream_bytes, j->prefetch);
        pthread_barrier_wait(j->bar);
        if (j->id == 0)
            j->t_pass[r] = now_s() - t0;
    }
    return NULL;
}

static int best_isa(void)
{
#if BW_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2"))
        return ISA_AVX2;
#endif
    return ISA_SCALAR;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

struct opts {
    int threads, mib, passes, json, huge, isa, streams, stream_bytes, prefetch;
};

static int parse_opts(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.threads = 1,
                       .mib = 256,
                       .passes = 10,
                       .huge = 1,
                       .isa = best_isa(),
                       .streams = 1,
                       .stream_bytes = 4096};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "-t"))
            bad = parse_int(v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-m"))
            bad = parse_int(v, 1, 1 << 16, &o->mib);
        else if (!strcmp(a, "-r"))
            bad = parse_int(v, 1, 10000, &o->passes);
        else if (!strcmp(a, "--streams"))
            bad = parse_int(v, 1, 64, &o->streams);
        else if (!strcmp(a, "--stream-bytes"))
            bad = parse_int(v, 64, 1 << 30, &o->stream_bytes) || o->stream_bytes % 64;
        else if (!strcmp(a, "--prefetch"))
            bad = parse_int(v, 0, 1 << 20, &o->prefetch) || o->prefetch % 64;
        else if (!strcmp(a, "--isa")) {
            int want = !v ? -1 : !strcmp(v, "avx512") ? ISA_AVX512 : !strcmp(v, "avx2") ? ISA_AVX2
                               : !strcmp(v, "scalar") ? ISA_SCALAR : -1;
            bad = want < 0;
            if (want >= 0 && want < o->isa) /* lowered, never raised above what the CPU has */
                o->isa = want;
        } else if (!strcmp(a, "--pages")) {
            bad = !v || (strcmp(v, "huge") && strcmp(v, "4k"));
            o->huge = v && !strcmp(v, "huge");
        } else
            bad = -1;
        if (bad)
            return -1;
        i++;
    }
    if ((o->streams > 1 || o->prefetch) && o->isa == ISA_SCALAR) {
        fprintf(stderr, "bw_probe: --streams and --prefetch need AVX2 or AVX-512 loads\n");
        return -1;
    }
    return 0;
}

/* Best read rate in bytes/s over o->passes passes of buf[bytes] split over o->threads threads;
 * 0 on failure (message printed). */
static double measure(const struct opts *o, const unsigned char *buf, size_t bytes)
{
    double best = 0;
    int n_started = 0;
    pthread_barrier_t bar;
    pthread_t *tid = calloc((size_t)o->threads, sizeof *tid);
    struct job *jobs = calloc((size_t)o->threads, sizeof *jobs);
    double *t_pass = calloc((size_t)o->passes + 1, sizeof *t_pass);
    if (!tid || !jobs || !t_pass || pthread_barrier_init(&bar, NULL, (unsigned)o->threads)) {
        fprintf(stderr, "bw_probe: out of memory\n");
        goto out;
    }
    size_t slice = bytes / (size_t)o->threads;
    for (int i = 0; i < o->threads; i++) {
        jobs[i] = (struct job){.p = buf + (size_t)i * slice,
                               .n = slice,
                               .isa = o->isa,
                               .passes = o->passes + 1,
                               .streams = o->streams,
                               .stream_bytes = (size_t)o->stream_bytes,
                               .prefetch = (size_t)o->prefetch,
                               .bar = &bar,
                               .t_pass = t_pass,
                               .id = i};
        if (i > 0 && pthread_create(&tid[i], NULL, worker, &jobs[i]) != 0) {
            /* the barrier counts every thread: without all of them nobody passes it, so the
             * workers already started stay blocked until the process exits */
            fprintf(stderr, "bw_probe: pthread_create failed\n");
            exit(1);
        }
        n_started = i + 1;
    }
    worker(&jobs[0]);
    uint64_t sink = 0;
    for (int i = 1; i < n_started; i++)
        pthread_join(tid[i], NULL);
    for (int i = 0; i < n_started; i++)
        sink ^= jobs[i].sink;
    g_sink = sink;
    double read = (double)slice_read_bytes(slice, o->streams, (size_t)o->stream_bytes) * o->threads;
    for (int r = 1; r <= o->passes; r++) /* pass 0 is the warm-up */
        if (t_pass[r] > 0 && read / t_pass[r] > best)
            best = read / t_pass[r];
    pthread_barrier_destroy(&bar);
out:
    free(tid);
    free(jobs);
    free(t_pass);
    return best;
}

int main(int argc, char **argv)
{
    static const char *isa_names[] = {"scalar", "avx2", "avx512"};
    struct opts o;
    if (parse_opts(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: bw_probe [-t threads] [-m MiB] [-r passes] "
                        "[--isa avx512|avx2|scalar] [--pages huge|4k] "
                        "[--streams N --stream-bytes B [--prefetch D]] [--json]\n");
        return 2;
    }
    size_t unit = (size_t)o.threads * 256, bytes = (size_t)o.mib << 20;
    bytes -= bytes % unit; /* every slice a whole number of 256-byte steps */
    if (bytes == 0) {
        fprintf(stderr, "bw_probe: %d MiB is less than %zu bytes per step\n", o.mib, unit);
        return 2;
    }
    if (slice_read_bytes(bytes / (size_t)o.threads, o.streams, (size_t)o.stream_bytes) == 0) {
        fprintf(stderr, "bw_probe: a thread's %zu bytes hold no run of %d streams of %d bytes\n",
                bytes / (size_t)o.threads, o.streams, o.stream_bytes);
        return 2;
    }
    unsigned char *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                              -1, 0);
    if (buf == MAP_FAILED) {
        perror("bw_probe: mmap");
        return 1;
    }
    madvise(buf, bytes, o.huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE); /* advice only: may be off */
    for (size_t i = 0; i < bytes; i += 64) /* touch every line: no zero-page reads */
        buf[i] = (unsigned char)(i >> 6);
    double best = measure(&o, buf, bytes);
    munmap(buf, bytes);
    if (best <= 0)
        return 1;
    if (o.json)
        printf("{\"gbps\": %.3f, \"threads\": %d, \"mib\": %.1f, \"passes\": %d, \"isa\": \"%s\", "
               "\"pages\": \"%s\", \"streams\": %d, \"stream_bytes\": %d, \"prefetch\": %d}\n",
               best / 1e9, o.threads, bytes / 1048576.0, o.passes, isa_names[o.isa],
               o.huge ? "huge" : "4k", o.streams, o.stream_bytes, o.prefetch);
    else
        printf("bw_probe: %.2f GB/s read (%d threads, %.1f MiB, best of %d passes, %s loads, %s "
               "pages, %d stream%s of %d bytes, %d bytes ahead)\n",
               best / 1e9, o.threads, bytes / 1048576.0, o.passes, isa_names[o.isa],
               o.huge ? "huge" : "4k", o.streams, o.streams > 1 ? "s" : "", o.stream_bytes,
               o.prefetch);
    return 0;
}
