/* bench_attn.c - attention time in SmolLM2-135M's shape (9 heads, 3 kv heads, head_dim 64,
 * causal), per instruction set: the decoder's old loop (a dot per key, softmax, an axpy per key,
 * one (row, head) at a time, through the kernels table) against the attention table
 * (kernels/attn.h). A 512-token prompt chunk on one thread (its CPU time) and on the whole pool
 * (wall time; old = even split of the items, new = kwk_attn_split), and one decode row at several
 * lengths on one thread; the table again over a half cache (the balanced / int4 default), and
 * on AVX-512 with AVX512_BF16 the act8 decoders' bf16 table over it, and for prompt chunks over
 * the copy the decoder stages for it (stage_bf16, its time included), and for decode rows over
 * the cache such decoders keep (half_to_bf16: keys and values rounded once, k_bf16 / v_bf16).
 * Runs alternate old, new, half, bf16, staged or bf16 cache, old, ... and medians are printed;
 * asserts nothing. The
 * caches are head-major (each kv head's positions in one run), as the decoder's.
 * Single-threaded driver. Usage: bench_attn [reps] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/pool.h"
#include "kernels/attn.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

#define HD 64
#define N_HEADS 9
#define N_KV 3
#define KV_DIM (N_KV * HD)
#define N_LAYERS 30   /* calls cycle through the layers' caches, as a forward pass does */
#define MAX_LEN 4096

/* The decoder's attention as it was (forward.c attend_head), on the args' data. */
static void old_items(const struct kwk_kernels *k, const struct kwk_attn_args *a, long i0, long i1,
                      float *scores)
{
    for (long i = i0; i < i1; i++) {
        int row = (int)(i / a->n_heads), h = (int)(i % a->n_heads), hd = a->head_dim;
        int kvh = h / (a->n_heads / a->n_kv_heads), first = a->first[row];
        int n = a->last[row] - first + 1;
        const float *q = a->q + row * a->ldq + (long)h * hd;
        const float *kc = (const float *)a->k_rows[row] + kvh * a->ld_head;
        const float *vc = (const float *)a->v_rows[row] + kvh * a->ld_head;
        for (int j = 0; j < n; j++)
            scores[j] = k->dot(q, kc + (first + j) * a->ld_pos, hd) * a->scale;
        k->softmax(scores, n);
        float *out = a->out + row * a->ldo + (long)h * hd;
        memset(out, 0, sizeof(float) * hd);
        for (int j = 0; j < n; j++)
            k->axpy(out, scores[j], vc + (first + j) * a->ld_pos, hd);
    }
}

struct bench {
    float *kc, *vc, *q, *out, *scratch;
    uint16_t *kh, *vh; /* the same cache in halves */
    uint16_t *kb, *vb; /* the halves rounded to bf16 (half_to_bf16), as an act8 decoder's */
    uint16_t *ks, *vs; /* one layer staged for the bf16 table (stage_bf16) */
    const void *k_rows[512], *v_rows[512];
    int first[512], last[512];
    struct kwk_attn_args a;
};

/* n_rows rows ending at position last_pos (rows at last_pos - n_rows + 1 .. last_pos), over the
 * float cache (half 0), the half one (1) or its bf16 rounding (2). */
static void set_rows(struct bench *b, int layer, int n_rows, int last_pos, int half)
{
    size_t at = (size_t)layer * MAX_LEN * KV_DIM;
    b->a.kv_half = half > 0;
    b->a.kv_bf16 = 0;
    b->a.k_bf16 = b->a.v_bf16 = half == 2;
    for (int r = 0; r < n_rows; r++) {
        b->k_rows[r] = half == 2 ? (const void *)(b->kb + at)
                       : half    ? (const void *)(b->kh + at)
                                 : (const void *)(b->kc + at);
        b->v_rows[r] = half == 2 ? (const void *)(b->vb + at)
                       : half    ? (const void *)(b->vh + at)
                                 : (const void *)(b->vc + at);
        b->first[r] = 0;
        b->last[r] = last_pos - n_rows + 1 + r;
    }
}

/* CPU time of this thread: the machine may be shared, and wall time would count the others. */
static double thread_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* The act8 decoders' table (bf16 products) when the ISA is avx512 and the CPU has it, else
 * NULL: its column is left out. */
static const struct kwk_attn_kernel *bf16_table(int isa)
{
    const struct kwk_attn_kernel *t = kwk_attn_kernel_act8();
    return isa == KWK_ISA_AVX512 && t != kwk_attn_kernel_for(isa) ? t : NULL;
}

/* Positions [p0, p1) of the layer's half cache staged for the bf16 table, head by head (each
 * head's share of the decoder's stage_slot), and the rows pointed at the copy. */
static void stage_rows(struct bench *b, int layer, int n_rows, long p0, long p1)
{
    const struct kwk_attn_kernel *t = kwk_attn_kernel_act8();
    size_t at = (size_t)layer * MAX_LEN * KV_DIM;
    for (int g = 0; g < N_KV; g++) {
        size_t h = (size_t)g * MAX_LEN * HD;
        t->stage_bf16(1, b->kh + at + h, b->vh + at + h, b->ks + h, b->vs + h, p0, p1, HD);
    }
    b->a.kv_half = 0;
    b->a.kv_bf16 = 1;
    for (int r = 0; r < n_rows; r++) {
        b->k_rows[r] = b->ks;
        b->v_rows[r] = b->vs;
    }
}

/* Variants timed: old, new, half, then bf16 and, where the table exists, staged (prompt chunks,
 * as the decoder stages them for a table with stage_bf16) or the bf16 cache (decode rows, and
 * prompt chunks of a table without: the AMX one reads it as it is). */
static int n_variants(int isa, int n_rows)
{
    (void)n_rows;
    return !bf16_table(isa) ? 3 : 5;
}

/* Seconds per call of one layer's n_rows x N_HEADS items, old (which = 0), new (1), new over
 * the half cache (2), the bf16 table over it (3) or over its staged copy (4, the staging
 * counted): the calls cycle through the layers for about 0.2 s. */
static double time_once(struct bench *b, int which, const struct kwk_kernels *k,
                        const struct kwk_attn_kernel *ak, int n_rows, int last_pos)
{
    long reps = 0, n_items = (long)n_rows * N_HEADS;
    double t0 = thread_s(), t;
    if (which >= 3)
        ak = kwk_attn_kernel_act8();
    do {
        int staged = which == 4 && n_rows > 1 && ak->stage_bf16;
        set_rows(b, (int)(reps % N_LAYERS), n_rows, last_pos,
                 which == 4 && !staged ? 2 : which >= 2);
        if (staged)
            stage_rows(b, (int)(reps % N_LAYERS), n_rows, 0, last_pos + 1);
        if (which)
            ak->items(&b->a, 0, n_items, b->scratch);
        else
            old_items(k, &b->a, 0, n_items, b->scratch);
        reps++;
        t = thread_s() - t0;
    } while (t < 0.2 || reps < N_LAYERS);
    return t / (double)reps;
}

/* The prompt chunk on the whole pool, as the decoder runs it: old = the old loop on an even split
 * of the items (forward.c's attend_run), new = the table on kwk_attn_split's work-balanced split. */
struct pool_job {
    struct bench *b;
    const struct kwk_kernels *k;
    const struct kwk_attn_kernel *ak;
    int which, n_rows;
    float *scratch; /* [nth][scratch floats] */
    size_t per_thread;
};

static void pool_run(void *ctx, int ith, int nth)
{
    struct pool_job *j = ctx;
    long lo, hi, n_items = (long)j->n_rows * N_HEADS;
    float *scratch = j->scratch + (size_t)ith * j->per_thread;
    if (j->which) {
        kwk_attn_split(&j->b->a, j->n_rows, ith, nth, &lo, &hi);
        (j->which == 3 ? kwk_attn_kernel_act8() : j->ak)->items(&j->b->a, lo, hi, scratch);
    } else {
        kwk_split_range(n_items, ith, nth, 1, &lo, &hi);
        old_items(j->k, &j->b->a, lo, hi, scratch);
    }
}

/* Wall seconds per call on the pool (about 0.2 s of calls cycling through the layers). */
static double time_pool(struct kwk_pool *pool, struct pool_job *j, int which)
{
    long reps = 0;
    double t0 = kwk_time_s(), t;
    j->which = which;
    do {
        set_rows(j->b, (int)(reps % N_LAYERS), j->n_rows, j->n_rows - 1, which >= 2);
        kwk_pool_run(pool, pool_run, j);
        reps++;
        t = kwk_time_s() - t0;
    } while (t < 0.2 || reps < N_LAYERS);
    return t / (double)reps;
}

static void compare_pool(struct bench *b, int isa, int reps)
{
    struct kwk_pool *pool = kwk_pool_new(0);
    if (!pool)
        return;
    int nth = kwk_pool_size(pool);
    struct pool_job j = {.b = b, .k = kwk_kernels_for(isa), .ak = kwk_attn_kernel_for(isa),
                         .n_rows = 512, .per_thread = kwk_attn_scratch_floats(&b->a, MAX_LEN)};
    j.scratch = malloc(sizeof(float) * j.per_thread * (size_t)nth);
    double t[4][64];
    int nw = KWK_MIN(4, n_variants(isa, 512)); /* no staged column: the decoder stages on the pool */
    for (int r = 0; j.scratch && r < reps; r++)
        for (int w = 0; w < nw; w++)
            t[w][r] = time_pool(pool, &j, w);
    if (j.scratch) {
        for (int w = 0; w < nw; w++)
            qsort(t[w], (size_t)reps, sizeof(double), cmp_double);
        double mo = t[0][reps / 2], mn = t[1][reps / 2], mh = t[2][reps / 2];
        printf("%-7s  512 rows, %d threads (wall time)   old %9.1f us   new %9.1f us   x%.2f   "
               "half %9.1f us",
               j.ak->name, nth, mo * 1e6, mn * 1e6, mo / mn, mh * 1e6);
        if (nw == 4)
            printf("   bf16 %9.1f us   x%.2f", t[3][reps / 2] * 1e6, mh / t[3][reps / 2]);
        printf("\n");
    }
    free(j.scratch);
    kwk_pool_free(pool);
}

static void compare(struct bench *b, int isa, int n_rows, int last_pos, int reps)
{
    const struct kwk_kernels *k = kwk_kernels_for(isa);
    const struct kwk_attn_kernel *ak = kwk_attn_kernel_for(isa);
    double t[5][64];
    int nw = n_variants(isa, n_rows);
    for (int r = 0; r < reps; r++)
        for (int w = 0; w < nw; w++)
            t[w][r] = time_once(b, w, k, ak, n_rows, last_pos);
    for (int w = 0; w < nw; w++)
        qsort(t[w], (size_t)reps, sizeof(double), cmp_double);
    double mo = t[0][reps / 2], mn = t[1][reps / 2], mh = t[2][reps / 2];
    printf("%-7s %4d rows  last pos %4d   old %9.1f us   new %9.1f us   x%.2f   half %9.1f us   "
           "x%.2f",
           ak->name, n_rows, last_pos, mo * 1e6, mn * 1e6, mo / mn, mh * 1e6, mn / mh);
    if (nw >= 4)
        printf("   bf16 %9.1f us   x%.2f", t[3][reps / 2] * 1e6, mh / t[3][reps / 2]);
    if (nw == 5)
        printf("   %s %9.1f us   x%.2f",
               n_rows > 1 && kwk_attn_kernel_act8()->stage_bf16 ? "staged" : "bf16 cache",
               t[4][reps / 2] * 1e6, t[3][reps / 2] / t[4][reps / 2]);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
    struct bench b;
    memset(&b, 0, sizeof b);
    size_t cache = (size_t)N_LAYERS * MAX_LEN * KV_DIM;
    /* aligned as the decoder's caches are */
    b.kc = kwk_malloc_aligned(sizeof(float) * cache);
    b.vc = kwk_malloc_aligned(sizeof(float) * cache);
    b.kh = kwk_malloc_aligned(sizeof(uint16_t) * cache);
    b.vh = kwk_malloc_aligned(sizeof(uint16_t) * cache);
    b.kb = kwk_malloc_aligned(sizeof(uint16_t) * cache);
    b.vb = kwk_malloc_aligned(sizeof(uint16_t) * cache);
    b.ks = kwk_malloc_aligned(sizeof(uint16_t) * MAX_LEN * KV_DIM);
    b.vs = kwk_malloc_aligned(sizeof(uint16_t) * MAX_LEN * KV_DIM);
    b.q = malloc(sizeof(float) * 512 * N_HEADS * HD);
    b.out = malloc(sizeof(float) * 512 * N_HEADS * HD);
    b.a = (struct kwk_attn_args){.head_dim = HD,
                                 .n_heads = N_HEADS,
                                 .n_kv_heads = N_KV,
                                 .ld_pos = HD,
                                 .ld_head = (long)MAX_LEN * HD,
                                 .scale = 1.0f / sqrtf((float)HD),
                                 .q = b.q,
                                 .ldq = N_HEADS * HD,
                                 .out = b.out,
                                 .ldo = N_HEADS * HD,
                                 .k_rows = b.k_rows,
                                 .v_rows = b.v_rows,
                                 .first = b.first,
                                 .last = b.last};
    b.scratch = malloc(sizeof(float) * kwk_attn_scratch_floats(&b.a, MAX_LEN));
    if (!b.kc || !b.vc || !b.kh || !b.vh || !b.kb || !b.vb || !b.ks || !b.vs || !b.q || !b.out ||
        !b.scratch) {
        fprintf(stderr, "bench_attn: out of memory\n");
        return 1;
    }
    srand(1);
    for (size_t i = 0; i < cache; i++) {
        b.kc[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        b.vc[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        b.kh[i] = kwk_f32_to_f16(b.kc[i]);
        b.vh[i] = kwk_f32_to_f16(b.vc[i]);
    }
    const struct kwk_attn_kernel *act8 = kwk_attn_kernel_act8();
    if (act8->half_to_bf16) {
        act8->half_to_bf16(b.kb, b.kh, (long)cache);
        act8->half_to_bf16(b.vb, b.vh, (long)cache);
    }
    for (size_t i = 0; i < 512 * N_HEADS * HD; i++)
        b.q[i] = 2.0f * ((float)rand() / (float)RAND_MAX - 0.5f);
    printf("bench_attn: one thread (its CPU time), %d heads / %d kv heads, head_dim %d, %d layers cycled; "
           "medians of %d alternating runs\n", N_HEADS, N_KV, HD, N_LAYERS, reps);
    for (int isa = KWK_ISA_AVX2; isa <= kwk_isa(); isa++) {
        compare(&b, isa, 512, 511, reps);
        compare_pool(&b, isa, reps);
        int lens[] = {100, 500, 1000, 2000, 4000};
        for (int i = 0; i < 5; i++)
            compare(&b, isa, 1, lens[i] - 1, reps);
    }
    kwk_free_aligned(b.kc);
    kwk_free_aligned(b.vc);
    kwk_free_aligned(b.kh);
    kwk_free_aligned(b.vh);
    kwk_free_aligned(b.ks);
    kwk_free_aligned(b.vs);
    free(b.q);
    free(b.out);
    free(b.scratch);
    return 0;
}
