/* bench_kernels.c - the pool's synchronization cost (an empty task's round trip, an in-task
 * barrier), then matmul speed per instruction set and weight type (f32, f16, bf16, and bf16
 * panels, kernels/panel.h): GB/s of weights streamed for one token (decode) and GFLOP/s for 64
 * tokens (prompt; BENCH_TOKENS=N for another count), on 1 thread and on the whole pool, the
 * plain matrices on 64-byte boundaries or BENCH_OFFSET=N bytes (even, below 64) past them; or
 * (`quant`) the quantized matmul with 8-bit against 16-bit activations on SmolLM2-135M's shapes
 * (or others; for one token over copies cycled through DRAM, with GB/s).
 * Prints; asserts nothing. Single-threaded driver. Usage: bench_kernels [rows cols | pool | quant
 * [n_tok [threads [avx2|avx512 [RxC,...]]]]] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/pool.h"
#include "kernels/bf16t.h"
#include "kernels/kernels.h"
#include "kernels/panel.h"
#include "kernels/quant.h"

/* Weights are cycled through several copies larger together than the last-level cache, so that
 * decode numbers are DRAM bandwidth as in a real model. */
#define WORKING_SET (1024.0 * 1024 * 1024)

struct job {
    const struct kwk_kernels *k;
    const struct kwk_mat *w;
    const float *x;
    float *y;
    int n_tok;
};

static void job_run(void *ctx, int ith, int nth)
{
    struct job *j = ctx;
    long lo, hi;
    kwk_split_range((long)j->w->rows, ith, nth, 16, &lo, &hi);
    j->k->matmul(j->w, j->x, j->n_tok, j->y, (long)j->w->rows, lo, hi);
}

/* Seconds per call over the n_mats matrices mats[]: repeat until about 0.5 s have passed (after
 * one warm-up pass). */
static double time_job(struct kwk_pool *p, struct job *j, const struct kwk_mat *mats, int n_mats)
{
    for (int i = 0; i < n_mats; i++) {
        j->w = &mats[i];
        kwk_pool_run(p, job_run, j);
    }
    long reps = 0;
    double t0 = kwk_time_s(), t;
    do {
        j->w = &mats[reps % n_mats];
        kwk_pool_run(p, job_run, j);
        reps++;
        t = kwk_time_s() - t0;
    } while (t < 0.5 || reps < n_mats);
    return t / (double)reps;
}

static void empty_run(void *ctx, int ith, int nth)
{
    (void)ctx, (void)ith, (void)nth;
}

#define BARRIERS_PER_TASK 1000

static void barrier_run(void *ctx, int ith, int nth)
{
    (void)ith, (void)nth;
    for (int i = 0; i < BARRIERS_PER_TASK; i++)
        kwk_pool_barrier(ctx);
}

/* What a forward pass pays per synchronization, apart from any imbalance of the work: the
 * median over passes of back-to-back empty tasks, and of barriers inside one task. */
static void bench_pool(void)
{
    struct kwk_pool *p = kwk_pool_new(0);
    if (!p)
        return;
    double run_ns[9], bar_ns[9];
    for (int pass = 0; pass < 9; pass++) {
        int reps = 20000;
        double t0 = kwk_time_s();
        for (int i = 0; i < reps; i++)
            kwk_pool_run(p, empty_run, NULL);
        run_ns[pass] = (kwk_time_s() - t0) / reps * 1e9;
        t0 = kwk_time_s();
        for (int i = 0; i < reps / BARRIERS_PER_TASK * 10; i++)
            kwk_pool_run(p, barrier_run, p);
        bar_ns[pass] = (kwk_time_s() - t0) / (reps * 10) * 1e9;
    }
    /* insertion sort: nine values */
    for (int i = 1; i < 9; i++)
        for (int j = i; j > 0 && run_ns[j] < run_ns[j - 1]; j--) {
            double r = run_ns[j], b = bar_ns[j];
            run_ns[j] = run_ns[j - 1], run_ns[j - 1] = r;
            bar_ns[j] = bar_ns[j - 1], bar_ns[j - 1] = b;
        }
    for (int i = 1; i < 9; i++)
        for (int j = i; j > 0 && bar_ns[j] < bar_ns[j - 1]; j--) {
            double b = bar_ns[j];
            bar_ns[j] = bar_ns[j - 1], bar_ns[j - 1] = b;
        }
    printf("pool threads=%d  empty task round trip: %.0f ns (min %.0f)  in-task barrier: %.0f ns "
           "(min %.0f), medians of 9 passes\n",
           kwk_pool_size(p), run_ns[4], run_ns[0], bar_ns[4], bar_ns[0]);
    kwk_pool_free(p);
}

/* Seconds per call of job j over the n matrices mats[] in turn, repeated for about secs (and at
 * least once over all) after one warm-up round. */
static double time_calls(struct kwk_pool *p, struct job *j, const struct kwk_mat *mats, int n,
                         double secs)
{
    for (int i = 0; i < n; i++) {
        j->w = &mats[i];
        kwk_pool_run(p, job_run, j);
    }
    long reps = 0;
    double t0 = kwk_time_s(), t;
    do {
        j->w = &mats[reps % n];
        kwk_pool_run(p, job_run, j);
        reps++;
        t = kwk_time_s() - t0;
    } while (t < secs || reps < n);
    return t / (double)reps;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define QUANT_ROUNDS 7

/* act8 against 16-bit activations, GOP/s of the quantized matmul (2 * rows * cols * n_tok) per
 * ISA, format and shape (SmolLM2-135M's unless given); the two modes alternate round by round (A B
 * A B ...) so that a machine shared with other work slows both alike: the ratio of the medians is
 * the figure to read. One token (decode) cycles through copies of the packed matrix larger
 * together than the last-level cache, as a model's weights are read, and also prints GB/s. */
static void bench_quant(int n_tok, int n_threads, const char *isa_name, const char *shape_list)
{
    int64_t shapes[8][2] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}};
    size_t n_shapes = 4;
    if (shape_list) { /* "ROWSxCOLS,..." (other models' shapes) */
        n_shapes = 0;
        for (const char *q = shape_list; *q && n_shapes < KWK_ARRAY_LEN(shapes);) {
            long long r, c;
            int used;
            if (sscanf(q, "%lldx%lld%n", &r, &c, &used) != 2 || r <= 0 || c <= 0 || r > 65536 ||
                c > 65536) {
                fprintf(stderr, "bench_kernels: bad shape list '%s' (ROWSxCOLS,...)\n", shape_list);
                return;
            }
            shapes[n_shapes][0] = r;
            shapes[n_shapes++][1] = c;
            q += used;
            q += *q == ',';
        }
    }
    int64_t max_rows = 1, max_cols = 1, max_el = 1;
    for (size_t i = 0; i < n_shapes; i++) {
        max_rows = KWK_MAX(max_rows, shapes[i][0]);
        max_cols = KWK_MAX(max_cols, shapes[i][1]);
        max_el = KWK_MAX(max_el, shapes[i][0] * shapes[i][1]);
    }
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    struct kwk_pool *p = kwk_pool_new(n_threads);
    float *src = kwk_malloc_aligned((size_t)max_el * 4);
    float *x = kwk_malloc_aligned((size_t)n_tok * (size_t)max_cols * 4);
    float *y = kwk_malloc_aligned((size_t)n_tok * (size_t)max_rows * 4);
    size_t bytes = 0; /* the largest packed matrix: q8 of the largest shape */
    kwk_quant_bytes(KWK_W_Q8, max_rows, max_cols, &bytes);
    bytes = (bytes + 4095) & ~(size_t)4095;
    int n_copies = n_tok == 1 ? (int)(WORKING_SET / (double)bytes) + 1 : 1;
    uint8_t *data = kwk_malloc_aligned(bytes * (size_t)n_copies);
    struct kwk_mat *mats = kwk_calloc((size_t)n_copies, sizeof *mats);
    if (!p || !src || !x || !y || !data || !mats)
        goto out;
    for (int64_t i = 0; i < max_el; i++)
        src[i] = (float)((i * 7919) % 2001 - 1000) * 1e-4f;
    for (int64_t i = 0; i < (int64_t)n_tok * max_cols; i++)
        x[i] = (float)((i * 104729) % 1999 - 999) * 1e-3f;
    printf("quantized matmul, n_tok=%d, threads=%d, GOP/s medians of %d alternating rounds%s\n",
           n_tok, kwk_pool_size(p), QUANT_ROUNDS,
           n_copies > 1 ? " over copies cycled (GB/s of weights read)" : "");
    for (int isa = KWK_ISA_AVX2; isa <= kwk_isa(); isa++) {
        const struct kwk_kernels *k = kwk_kernels_for(isa);
        if (isa_name && strcmp(isa_name, k->name) != 0)
            continue;
        for (size_t wi = 0; wi < KWK_ARRAY_LEN(wts); wi++)
            for (size_t si = 0; si < n_shapes; si++) {
                int64_t rows = shapes[si][0], cols = shapes[si][1];
                size_t mb = 0;
                kwk_quant_bytes(wts[wi], rows, cols, &mb);
                for (int64_t rb = 0; rb * KWK_QROWS < rows; rb++)
                    kwk_quant_pack_rows(wts[wi], data, rows, cols, rb,
                                        src + rb * KWK_QROWS * cols, (long)cols);
                for (int c = 0; c < n_copies; c++) {
                    if (c > 0)
                        memcpy(data + (size_t)c * bytes, data, mb);
                    mats[c] = (struct kwk_mat){
                        .wtype = wts[wi], .rows = rows, .cols = cols, .data = data + (size_t)c * bytes};
                }
                double t[2][QUANT_ROUNDS];
                for (int r = 0; r < QUANT_ROUNDS; r++)
                    for (int a8 = 0; a8 < 2; a8++) {
                        for (int c = 0; c < n_copies; c++)
                            mats[c].act8 = a8;
                        struct job j = {k, &mats[0], x, y, n_tok};
                        t[a8][r] = time_calls(p, &j, mats, n_copies, 0.15);
                    }
                qsort(t[0], QUANT_ROUNDS, sizeof(double), cmp_double);
                qsort(t[1], QUANT_ROUNDS, sizeof(double), cmp_double);
                double op = 2.0 * (double)rows * (double)cols * n_tok * 1e-9;
                double s16 = t[0][QUANT_ROUNDS / 2], s8 = t[1][QUANT_ROUNDS / 2];
                printf("%-7s %s %4lldx%-4lld  16-bit %7.1f  act8 %7.1f  act8/16-bit %.2fx", k->name,
                       wts[wi] == KWK_W_Q8   ? "q8"
                       : wts[wi] == KWK_W_Q6 ? "q6"
                                             : "q4",
                       (long long)rows, (long long)cols, op / s16, op / s8, s16 / s8);
                if (n_copies > 1)
                    printf("  (%.1f / %.1f GB/s)", (double)mb / s16 * 1e-9,
                           (double)mb / s8 * 1e-9);
                printf("\n");
            }
    }
out:
    kwk_pool_free(p);
    kwk_free_aligned(src);
    kwk_free_aligned(x);
    kwk_free_aligned(y);
    kwk_free_aligned(data);
    kwk_free(mats);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "quant") == 0) {
        bench_quant(argc > 2 ? atoi(argv[2]) : 512, argc > 3 ? atoi(argv[3]) : 1,
                    argc > 4 ? argv[4] : NULL, argc > 5 ? argv[5] : NULL);
        return 0;
    }
    /* Where a checkpoint's tensors lie: safetensors aligns them to 8 bytes only (the bench
     * checkpoints' tensors lie 32 bytes past a cache line, docs/benchmarks.md, session 30), and
     * kernels that read the weights in place may care. Packs (bf16 panels) are Kwker's own,
     * aligned. */
    long offset = getenv("BENCH_OFFSET") ? atol(getenv("BENCH_OFFSET")) : 0;
    if (offset < 0 || offset >= 64 || offset % 2) {
        fprintf(stderr, "bench_kernels: BENCH_OFFSET must be even, 0 to 62 (bytes)\n");
        return 1;
    }
    bench_pool();
    if (argc == 2 && strcmp(argv[1], "pool") == 0)
        return 0;
    int64_t rows = argc > 2 ? atol(argv[1]) : 4096, cols = argc > 2 ? atol(argv[2]) : 4096;
    /* prompt tokens: BENCH_TOKENS (default 64; the model's prompt chunks are 512) */
    int max_tok = getenv("BENCH_TOKENS") ? atoi(getenv("BENCH_TOKENS")) : 64;
    if (max_tok < 2 || max_tok > 4096)
        max_tok = 64;
    size_t n_el = (size_t)(rows * cols);
    int n_mats = (int)(WORKING_SET / ((double)n_el * 4)) + 1;
    size_t buf_bytes = n_el * 4 * (size_t)n_mats + 64;
    uint8_t *buf = kwk_malloc_aligned(buf_bytes);
    float *x = kwk_malloc_aligned((size_t)(max_tok * cols) * 4);
    float *y = kwk_malloc_aligned((size_t)(max_tok * rows) * 4);
    struct kwk_mat *mats = kwk_calloc((size_t)n_mats, sizeof *mats);
    if (!buf || !x || !y || !mats)
        return 1;
    /* f32 values that also read as sane f16 / bf16 pairs: the timing does not depend on them. */
    float *f = (float *)buf;
    for (size_t i = 0; i < buf_bytes / 4; i++)
        f[i] = 1.0f + (float)(i % 255) * (1.0f / 256);
    for (int64_t i = 0; i < max_tok * cols; i++)
        x[i] = (float)(i % 97) * 0.01f;
    printf("matrix %lldx%lld, %d copies cycled, plain types %ld bytes past a cache line\n",
           (long long)rows, (long long)cols, n_mats, offset);
    int n_threads[2] = {1, kwk_default_threads()};
    for (int isa = 0; isa <= kwk_isa(); isa++) {
        const struct kwk_kernels *k = kwk_kernels_for(isa);
        for (int ti = 0; ti < 2; ti++) {
            if (ti == 1 && n_threads[1] == 1)
                break;
            struct kwk_pool *p = kwk_pool_new(n_threads[ti]);
            /* the plain types, then bf16 panels and bf16 in tile order (the same bytes read
             * so; the tile order on the AVX-512 table only: the others run its specification) */
            static const int wts[] = {KWK_W_F32, KWK_W_F16, KWK_W_BF16, KWK_W_BF16P,
                                      KWK_W_BF16T};
            static const char *const wt_names[] = {"f32", "f16", "bf16", "bf16p", "bf16t"};
            for (size_t wi = 0; wi < KWK_ARRAY_LEN(wts); wi++) {
                int wt = wts[wi];
                size_t esz = wt == KWK_W_F32 ? 4 : 2, stride = n_el * esz;
                if (wt == KWK_W_BF16P && kwk_panel_bytes(rows, cols, &stride))
                    continue;
                if (wt == KWK_W_BF16T &&
                    (isa != KWK_ISA_AVX512 || kwk_bf16t_bytes(rows, cols, &stride)))
                    continue;
                if (stride > n_el * 4)
                    continue; /* a panel of fewer than 8 rows: larger than the buffer's share */
                for (int i = 0; i < n_mats; i++)
                    mats[i] = (struct kwk_mat){.wtype = wt,
                                               .rows = rows,
                                               .cols = cols,
                                               .data = buf + (size_t)i * stride +
                                                       (wt >= KWK_W_COUNT ? 0 : offset)};
                double bytes = (double)stride;
                struct job j = {k, &mats[0], x, y, 1};
                double s1 = time_job(p, &j, mats, n_mats);
                j.n_tok = max_tok;
                double s64 = isa == KWK_ISA_SCALAR ? 0 : time_job(p, &j, mats, 1);
                printf("%-7s %-5s threads=%d  n_tok=1: %7.2f GB/s (%.3f ms)", k->name,
                       wt_names[wi], n_threads[ti], bytes / s1 * 1e-9, s1 * 1e3);
                if (s64 > 0)
                    printf("  n_tok=%d: %7.1f GFLOP/s", max_tok,
                           2.0 * rows * cols * max_tok / s64 * 1e-9);
                printf("\n");
            }
            kwk_pool_free(p);
        }
    }
    kwk_free_aligned(buf);
    kwk_free(mats);
    kwk_free_aligned(x);
    kwk_free_aligned(y);
    return 0;
}
