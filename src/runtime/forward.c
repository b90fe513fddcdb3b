/* forward.c - one chunk of tokens through every layer: the math of Llama-family decoders, in
 * float32, split across the decoder's pool. Called by the decoder's owner thread. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/quant.h"
#include "runtime/runtime.h"

/* ---- matrix products: up to three independent y = x W^T, rows split across threads ---------- */

struct mm_job {
    const struct kwk_mat *w;
    const float *x;
    float *y;
    long ldy;
};

struct mm_task;
/* Work a thread does on the rows it has just computed, for its tokens [t0, t1) of the chunk,
 * before the task ends: lo[j], hi[j] are its rows of job j. Fusing it here saves a whole pool
 * round trip. */
typedef void (*mm_post_fn)(const struct mm_task *t, const long *lo, const long *hi, long t0,
                           long t1);

/* Threads up to which each takes its own big chunk first (MAX_OWN claim flags a task). */
#define MAX_OWN 64

struct mm_task {
    const struct kwk_kernels *k;
    int n_tok;
    int n_jobs;
    int unit;     /* 0: each job's rows split on its own in blocks of 16; > 0: the jobs' rows taken
                     together in units of this many rows (a head), each unit on one thread */
    mm_post_fn post; /* NULL: none */
    const void *post_ctx;
    struct mm_job jobs[3];
    /* Quantized jobs sharing their input: its rows quantized once (NULL: each job quantizes
     * them itself). qa_ready: already filled; else the threads fill their share of the rows
     * and meet at a barrier before the products. */
    const struct kwk_qact *qa;
    int qa_ready;
    struct kwk_pool *pool;
    /* Short chunks (generation): rows are taken in ranges from a shared counter instead of
     * split evenly up front (see DYN_TOK_MAX). Ranges of units: heads (unit > 0), else row
     * blocks of 16 (the same rows of every job when the jobs are alike, else each job's blocks
     * in job order). */
    int dyn;
    int alike; /* all jobs have the same rows (set for every task) */
    int nth;
    long n_units; /* count_units: set for every task */
    long big;     /* units of each of the first nth chunks, one a thread */
    long align;   /* units a range is a multiple of */
    atomic_long tail; /* the first unit of the tail not yet taken */
    /* Longer chunks (prompts): the threads as a grid of grid_r row parts x grid_t token parts
     * (see plan_grid); threads past grid_r * grid_t have no share. */
    int grid_r, grid_t;
    /* Short chunks on at most MAX_OWN threads: thread i takes big chunk i first, claimed here,
     * then ranges of the tail (which starts after the big chunks), then any big chunk a late
     * thread has not begun (see mm_run_dyn). */
    atomic_int claimed[MAX_OWN];
    /* The product that follows (planned, not run; NULL: none or unknown): each thread asks for
     * its first rows of it while it waits at the end of this one (see prefetch_next). */
    const struct mm_task *after;
};

/* Chunks of at most this many tokens take rows from a shared counter: a token's products are
 * memory-bound, and with a fixed even split the thread whose reads happen to be slower keeps
 * the others waiting at the end of every product (14% of SmolLM2-360M's generation samples in
 * pool waits, 160 products a token; 8% with the counter, at the same tokens/s on 2 cores, where
 * the other thread reads faster meanwhile; the imbalance grows with the thread count). The first
 * nth chunks are seven eighths of an even share each (one per thread, each thread's own first:
 * mm_run_dyn); the rest, the tail, is taken guided: each range a 1 / (2 nth) share of what is
 * left, so ranges shrink to one decode tile at the end (each range has its own start-up, so a
 * thread should take few, and the last ones small). Against session 18's tail of equal small
 * chunks after three-quarter shares, token by token (session 22): 0.97-1.006 of the time a
 * token, about 0.7% less in the median over SmolLM2-135M / 360M, Qwen2.5-0.5B. Longer chunks are
 * compute-bound and split evenly. Each row's numbers do not depend on its thread or chunk (batch
 * invariance of the kernels). */
#define DYN_TOK_MAX 16
/* Row blocks of a range are a multiple of this: the decode tile's height. */
#define DYN_ALIGN 4
/* A prompt product's token parts: at least GRID_MIN_TOK tokens (the tiles stay full), cut on
 * multiples of GRID_TOK_ALIGN. */
#define GRID_MIN_TOK 32
#define GRID_TOK_ALIGN 8
/* On AMX tiles, ties go to more token parts only while each keeps at least this many tokens.
 * Each token part reads its rows' weights again: with many threads and the most parts, AMX's
 * rate would make a prompt memory-bound (break-even at about rate x bytes a weight / a core's
 * bandwidth: some 35-70 tokens a part on a many-core server with int8 tiles). On 2 threads,
 * parts of 128 tokens ran 7-11% faster than the row split, parts of 64 from 6% slower to 8%
 * faster (SmolLM2-135M int4, 360M balanced and AMX preserve; session 29). */
#define GRID_AMX_TOK 128

/* Whether all jobs have the same rows: then a chunk is the same rows of every job (the gate/up
 * post step wants both halves of its rows on one thread). */
static int jobs_alike(const struct mm_task *t)
{
    for (int j = 1; j < t->n_jobs; j++)
        if (t->jobs[j].w->rows != t->jobs[0].w->rows)
            return 0;
    return 1;
}

static long blocks_of(long rows)
{
    return (rows + 15) / 16;
}

/* Units of job j: heads (unit > 0) or 16-row blocks. */
static long job_units(const struct mm_task *t, int j)
{
    long rows = (long)t->jobs[j].w->rows;
    return t->unit > 0 ? rows / t->unit : blocks_of(rows);
}

/* Units of the whole task: the jobs' units one after the other, or (alike row blocks, handed
 * out as the same rows of every job) the largest job's. */
static long count_units(const struct mm_task *t)
{
    long total = 0;
    for (int j = 0; j < t->n_jobs; j++)
        total = t->unit == 0 && t->alike ? KWK_MAX(total, job_units(t, j))
                                         : total + job_units(t, j);
    return total;
}

/* The rows of units [u0, u1) into lo/hi, one range per job (empty where it has none). */
static void unit_rows(const struct mm_task *t, long u0, long u1, long *lo, long *hi)
{
    int alike = t->unit == 0 && t->alike;
    long base = 0;
    for (int j = 0; j < t->n_jobs; j++) {
        long rows = (long)t->jobs[j].w->rows, size = t->unit > 0 ? t->unit : 16;
        long units = job_units(t, j);
        if (alike)
            base = 0;
        lo[j] = KWK_MIN(rows, (KWK_MAX(u0, base) - base) * size);
        hi[j] = KWK_MIN(rows, (KWK_MAX(KWK_MIN(u1, base + units), base) - base) * size);
        if (hi[j] < lo[j])
            hi[j] = lo[j];
        base += units;
    }
}

/* Units and chunks of t on nth threads. */
static void plan_chunks(struct mm_task *t, int nth)
{
    long total = t->n_units;
    /* Chunks of whole decode tiles, unless that would leave threads without any (fewer than
     * DYN_ALIGN blocks a thread: small matrices on many cores, where every thread's reads count
     * more than each reading longer streams). */
    long align = t->unit > 0 || total < (long)nth * DYN_ALIGN ? 1 : DYN_ALIGN;
    t->nth = nth;
    t->align = align;
    t->big = total * 7 / (8 * (long)nth) / align * align;
}

/* The units of big chunk c (c < nth). */
static void chunk_units(const struct mm_task *t, long c, long *u0, long *u1)
{
    *u0 = c * t->big;
    *u1 = *u0 + t->big;
}

/* Rows lo[j]..hi[j] of each job for tokens [t0, t1). */
static void mm_rows(const struct mm_task *t, const long *lo, const long *hi, long t0, long t1)
{
    if (t0 >= t1)
        return;
    int n = (int)(t1 - t0);
    struct kwk_qact qa;
    if (t->qa)
        qa = kwk_qact_at(t->qa, t0, 0);
    for (int j = 0; j < t->n_jobs; j++) {
        const struct mm_job *job = &t->jobs[j];
        if (lo[j] >= hi[j])
            continue;
        float *y = job->y + t0 * job->ldy;
        if (t->qa)
            t->k->matmul_q(job->w, &qa, n, y, job->ldy, lo[j], hi[j]);
        else
            t->k->matmul(job->w, job->x + t0 * (long)job->w->cols, n, y, job->ldy, lo[j], hi[j]);
    }
    if (t->post)
        t->post(t, lo, hi, t0, t1);
}

/* Units (heads, or 16-row blocks) of the largest share when the rows are cut in r parts. */
static long row_share(const struct mm_task *t, int r)
{
    if (t->unit > 0)
        return (t->n_units + r - 1) / r;
    long share = 0;
    for (int j = 0; j < t->n_jobs; j++)
        share += (job_units(t, j) + r - 1) / r; /* each job cut on its own */
    return share;
}

/* A prompt product on nth threads: rows cut in grid_r parts and tokens in grid_t, the grid with
 * the smallest largest share (units x tokens); among equals the fewest token parts, or where
 * every job runs on AMX tiles (kwk_mat_amx) the most that keep GRID_AMX_TOK tokens each.
 * Cutting the rows alone leaves threads idle once they outnumber the row blocks (SmolLM2-135M's
 * k and v: 12 blocks; its 15 heads) and unbalances them well before; each token part reads the
 * weights again, which a prompt's compute-bound tiles absorb. The AMX kernels stage every token
 * they are given into tiles on each thread (preserve's three bf16 parts; int8's tile layout),
 * so there fewer tokens a thread is less work: on 2 threads 5-13% more prompt tokens/s split by
 * tokens than by rows (SmolLM2-135M / 360M, Qwen2.5-0.5B int4, balanced, preserve with
 * KWKER_AMX_PRESERVE=on; SmolLM2-1.7B int4 the same), while the vector kernels ran 0-4% slower
 * so (docs/benchmarks.md, session 29). Any grid gives the same numbers (batch invariance). */
static void plan_grid(struct mm_task *t, int nth)
{
    long best = -1;
    int max_t = KWK_MAX(1, KWK_MIN(nth, t->n_tok / GRID_MIN_TOK)), amx = 1;
    for (int j = 0; j < t->n_jobs; j++)
        amx &= kwk_mat_amx(t->k, t->jobs[j].w);
    t->grid_r = nth;
    t->grid_t = 1;
    for (int gt = 1; gt <= max_t; gt++) {
        int gr = nth / gt;
        long cost = row_share(t, gr) * ((t->n_tok + gt - 1) / gt);
        if (best < 0 || cost < best ||
            (amx && cost == best && t->n_tok / gt >= GRID_AMX_TOK)) {
            best = cost;
            t->grid_r = gr;
            t->grid_t = gt;
        }
    }
}

/* Runs units [u0, u1) (generation). */
static void mm_units(const struct mm_task *t, long u0, long u1)
{
    long lo[3], hi[3];
    if (u0 >= u1)
        return;
    unit_rows(t, u0, u1, lo, hi);
    mm_rows(t, lo, hi, 0, t->n_tok);
}

/* Runs big chunk c unless another thread has claimed it. */
static void mm_claim(struct mm_task *t, long c)
{
    long u0, u1;
    chunk_units(t, c, &u0, &u1);
    if (!atomic_exchange_explicit(&t->claimed[c], 1, memory_order_relaxed))
        mm_units(t, u0, u1);
}

/* The next range of the tail: a 1 / (2 nth) share of what is left, in whole tiles. 0 when
 * nothing is left. */
static int claim_tail(struct mm_task *t, long *u0, long *u1)
{
    long cur = atomic_load_explicit(&t->tail, memory_order_relaxed);
    for (;;) {
        if (cur >= t->n_units)
            return 0;
        long take = (t->n_units - cur + 2L * t->nth - 1) / (2L * t->nth);
        take = (take + t->align - 1) / t->align * t->align;
        long end = KWK_MIN(t->n_units, cur + take);
        if (atomic_compare_exchange_weak_explicit(&t->tail, &cur, end, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *u0 = cur;
            *u1 = end;
            return 1;
        }
    }
}

/* Generation: thread ith's own big chunk first, so that a product's rows go to the same thread
 * token after token (its caches, and on a NUMA host its node's memory, can keep them: with
 * chunks taken first come first served they wander between threads), then ranges of the tail,
 * then the big chunks of threads that had not begun theirs (a late or descheduled thread holds
 * nothing up). Past MAX_OWN threads, everything is tail. */
static void mm_run_dyn(struct mm_task *t, int ith)
{
    int own = t->nth <= MAX_OWN;
    if (own)
        mm_claim(t, ith);
    long u0, u1;
    while (claim_tail(t, &u0, &u1))
        mm_units(t, u0, u1);
    if (own)
        for (int i = 1; i < t->nth; i++)
            mm_claim(t, (ith + i) % t->nth);
}

/* Bytes of the next product a thread asks for while it waits, at most: about what the waits at
 * the end of a generation product can fill, within L2 (on SmolLM2-135M / 360M, 512 KiB took up to
 * 2% less time a token than 128 KiB; 256 KiB and the whole share within 1% of 512 KiB). Token by
 * token without the prefetch (session 22): 1.005-1.04 of the time a token quantized, 1.002-1.018
 * preserve (AVX-512 rows and AVX2 panels, read as 4 runs). */
#define PREFETCH_MAX (512 * 1024)

/* Thread ith's first spans of the planned product `after` into s, at most max: its own first
 * chunk's start of each run the kernel reads side by side (kwk_mat_decode_spans), of the first
 * `jobs` jobs with rows (the kernels read jobs one after the other). Returns their count. */
static int next_spans(const struct mm_task *after, int ith, int jobs, struct kwk_span *s, int max)
{
    if (!after || !after->dyn || after->nth > MAX_OWN || ith >= after->nth)
        return 0;
    long u0, u1, lo[3], hi[3];
    chunk_units(after, ith, &u0, &u1);
    if (u0 >= u1)
        return 0;
    unit_rows(after, u0, u1, lo, hi);
    int n = 0;
    for (int j = 0; j < after->n_jobs && jobs > 0 && n < max; j++) {
        if (lo[j] >= hi[j])
            continue;
        const void *p[KWK_POOL_SPANS];
        size_t bytes[KWK_POOL_SPANS];
        int got = kwk_mat_decode_spans(after->k, after->jobs[j].w, lo[j], hi[j], PREFETCH_MAX, p,
                                       bytes, KWK_MIN(max - n, KWK_POOL_SPANS));
        for (int i = 0; i < got; i++)
            s[n++] = (struct kwk_span){p[i], bytes[i]};
        jobs--;
    }
    return n;
}

/* Hands the pool what thread ith reads first in the planned product `after`, to be asked for
 * while this thread waits for the others or for the next task; and, where spans are left, the
 * first rows of every job of `then`, the product after it (NULL: none). A decode step's
 * attention shared by whole kv groups that do not go evenly round the threads (SmolLM2-135M's
 * three on two threads: 2 + 1) leaves a thread idle for a third of it; asking for the gate/up
 * product's rows there as well took 1-2% off a generated token, token by token (135M int4:
 * 1.007-1.016 of the time without at 512-640 positions, 1.021-1.024 at 1024-1152; 360M, whose
 * o-product share fills more of that wait, 1.003-1.006; session 38). */
static void prefetch_next(const struct mm_task *after, const struct mm_task *then,
                          struct kwk_pool *pool, int ith)
{
    struct kwk_span s[KWK_POOL_SPANS];
    int n = next_spans(after, ith, 1, s, KWK_POOL_SPANS);
    if (then)
        n += next_spans(then, ith, then->n_jobs, s + n, KWK_POOL_SPANS - n);
    if (n > 0)
        kwk_pool_prefetch(pool, ith, s, n);
}

/* Rows are handed out in blocks of 16 (or whole units, multiples of 16) so SIMD kernels work on
 * whole row groups; a prompt's tokens in parts of the grid. The kernels' batch invariance makes
 * any such split give the same numbers. */
static void mm_run(void *ctx, int ith, int nth)
{
    struct mm_task *t = ctx;
    long lo[3], hi[3];
    if (t->qa && !t->qa_ready) {
        long t0, t1;
        kwk_split_range(t->n_tok, ith, nth, 1, &t0, &t1);
        t->k->quant_rows(t->jobs[0].x, t->qa, (int)t0, (int)t1);
        kwk_pool_barrier(t->pool);
    }
    if (t->dyn) {
        mm_run_dyn(t, ith);
        prefetch_next(t->after, NULL, t->pool, ith);
        return;
    }
    if (ith >= t->grid_r * t->grid_t)
        return;
    int ri = ith % t->grid_r, ti = ith / t->grid_r;
    if (t->unit > 0) {
        long u0, u1;
        kwk_split_range(t->n_units, ri, t->grid_r, 1, &u0, &u1);
        unit_rows(t, u0, u1, lo, hi);
    } else
        for (int j = 0; j < t->n_jobs; j++)
            kwk_split_range((long)t->jobs[j].w->rows, ri, t->grid_r, 16, &lo[j], &hi[j]);
    long t0, t1;
    kwk_split_range(t->n_tok, ti, t->grid_t, GRID_TOK_ALIGN, &t0, &t1);
    mm_rows(t, lo, hi, t0, t1);
}

/* Whether the jobs can share one quantization of their input: all quantized, one input, one
 * activation mode. */
static int qact_usable(const struct kwk_decoder *d, int n_jobs, const struct mm_job *jobs)
{
    if (!d->qact_mem || !d->k->matmul_q)
        return 0;
    for (int j = 0; j < n_jobs; j++) {
        const struct kwk_mat *w = jobs[j].w;
        if (!kwk_quant_group(w->wtype) || w->cols > d->qact_cols || w->cols != jobs[0].w->cols ||
            w->act8 != jobs[0].w->act8 || jobs[j].x != jobs[0].x)
            return 0;
    }
    return 1;
}

/* Plans t: the product jobs, with post after each thread's rows; run by mm_exec. */
static void mm_plan(struct kwk_decoder *d, struct mm_task *t, int n_tok, int n_jobs,
                    const struct mm_job *jobs, int unit, mm_post_fn post, const void *post_ctx)
{
    memset(t, 0, sizeof *t);
    t->k = d->k;
    t->n_tok = n_tok;
    t->n_jobs = n_jobs;
    t->unit = unit;
    t->post = post;
    t->post_ctx = post_ctx;
    t->pool = d->pool;
    memcpy(t->jobs, jobs, sizeof(*jobs) * (size_t)n_jobs);
    t->alike = jobs_alike(t);
    t->n_units = count_units(t);
    int nth = kwk_pool_size(d->pool);
    t->dyn = nth > 1 && n_tok <= DYN_TOK_MAX;
    if (t->dyn)
        plan_chunks(t, nth);
    else
        plan_grid(t, nth);
}

/* Runs the planned product t; after: the product that follows it, if known (planned only). */
static void mm_exec(struct kwk_decoder *d, struct mm_task *t, const struct mm_task *after)
{
    t->after = after;
    struct kwk_qact qa;
    if (qact_usable(d, t->n_jobs, t->jobs)) {
        const struct kwk_mat *w = t->jobs[0].w;
        kwk_qact_init(&qa, d->qact_mem, w->cols, t->n_tok, w->act8);
        t->qa = &qa;
        /* A few rows take the owner less time than the barrier would: quantized here, while
         * the workers are still waiting for the task. */
        if (t->n_tok <= DYN_TOK_MAX) {
            d->k->quant_rows(t->jobs[0].x, &qa, 0, t->n_tok);
            t->qa_ready = 1;
        }
    }
    int own = t->dyn && t->nth <= MAX_OWN;
    atomic_init(&t->tail, own ? t->nth * t->big : 0);
    for (int c = 0; own && c < t->nth; c++)
        atomic_init(&t->claimed[c], 0);
    kwk_pool_run(d->pool, mm_run, t);
}

/* The product jobs, with post after each thread's rows. */
static void matmul_post(struct kwk_decoder *d, int n_tok, int n_jobs, const struct mm_job *jobs,
                        int unit, mm_post_fn post, const void *post_ctx)
{
    struct mm_task t;
    mm_plan(d, &t, n_tok, n_jobs, jobs, unit, post, post_ctx);
    mm_exec(d, &t, NULL);
}

static void matmul(struct kwk_decoder *d, int n_tok, int n_jobs, const struct mm_job *jobs)
{
    matmul_post(d, n_tok, n_jobs, jobs, 0, NULL, NULL);
}

void kwk_forward_matmul(struct kwk_decoder *d, int n, const struct kwk_mat *w, const float *x,
                        float *y, long ldy)
{
    struct mm_job job = {w, x, y, ldy};
    matmul(d, n, 1, &job);
}

void kwk_matmul_pool(const struct kwk_kernels *k, struct kwk_pool *pool, void *qact_mem,
                     int64_t qact_cols, int n, const struct kwk_mat *const *w, const float *x,
                     float *const *y, long ldy, int n_w)
{
    /* mm_plan and mm_exec read only these four fields of a decoder (kept so by
     * tests/python/test_encoder.py, which runs every kernel path through here) */
    struct kwk_decoder d = {.k = k, .pool = pool, .qact_mem = qact_mem, .qact_cols = qact_cols};
    struct mm_job jobs[3];
    if (n_w < 1 || n_w > (int)KWK_ARRAY_LEN(jobs))
        return; /* the callers' constant: one product, or q / k / v */
    for (int j = 0; j < n_w; j++)
        jobs[j] = (struct mm_job){w[j], x, y[j], ldy};
    matmul(&d, n, n_w, jobs);
}

/* Tasks split by token leave every thread but the first idle on a one-token chunk (generation):
 * there the owner runs the task alone, which gives the same rows the same arithmetic and saves
 * the pool's round trip. */
static void run_tokens(struct kwk_decoder *d, int n, kwk_task_fn fn, void *ctx)
{
    if (n <= 1)
        fn(ctx, 0, 1);
    else
        kwk_pool_run(d->pool, fn, ctx);
}

/* ---- per-token work: norms, biases, rotary, cache writes, attention --------------------------- */

struct tok_task {
    struct kwk_decoder *d;
    const struct kwk_layer *l;
    int layer;
    int n; /* rows in the chunk */
};

/* Offset of (slot, layer, kv head 0, position 0) in the K and V caches, in elements. Within a
 * (slot, layer) the caches are head-major: kv head h, position p at (h * max_len + p) *
 * head_dim, so attention reads each head's positions as one run. */
static size_t kv_base(const struct kwk_decoder *d, int slot, int layer)
{
    return (((size_t)slot * (size_t)d->c->n_layers + (size_t)layer) * (size_t)d->max_len) *
           (size_t)d->kv_dim;
}

static void add_bias(float *y, const float *b, int n)
{
    if (b)
        for (int i = 0; i < n; i++)
            y[i] += b[i];
}

/* The rotary table of token tok (cos, then sin, of its angles) for the task's layer, made once
 * a chunk for all its heads and layers by kwk_forward_rows (local layers' of Gemma 3 apart). */
static const float *rope_table(const struct tok_task *t, int tok)
{
    const struct kwk_decoder *d = t->d;
    const float *cs = kwk_config_layer_local_rope(d->c, t->layer) ? d->rope_cs_local : d->rope_cs;
    return cs + (size_t)tok * (size_t)d->c->head_dim;
}

/* Bias, q norm and rotary of query head h of token tok (cs: its rotary table). */
static void prep_q_head(const struct tok_task *t, int tok, int h, const float *cs)
{
    struct kwk_decoder *d = t->d;
    const struct kwk_layer *l = t->l;
    int hd = d->c->head_dim;
    float *q = d->q + (size_t)tok * d->q_dim + (size_t)h * hd;
    add_bias(q, l->bq ? l->bq + (size_t)h * hd : NULL, hd);
    if (l->q_norm)
        d->k->rmsnorm(q, q, l->q_norm, hd, d->c->rms_eps);
    kwk_rope_rotate(q, hd, cs);
}

/* Cache offset of kv head h of token tok's position in its slot. */
static size_t kv_at(const struct tok_task *t, int tok, int h)
{
    const struct kwk_decoder *d = t->d;
    return kv_base(d, d->row_slot[tok], t->layer) +
           ((size_t)h * (size_t)d->max_len + (size_t)d->row_pos[tok]) * (size_t)d->c->head_dim;
}

/* n values into a cache at element at: rounded to halves (nearest even) or copied. */
static void kv_store(const struct kwk_decoder *d, void *cache, size_t at, const float *x, int n)
{
    if (d->kv_half)
        d->k->to_half((uint16_t *)cache + at, x, n);
    else
        memcpy((float *)cache + at, x, sizeof(float) * (size_t)n);
}

/* Bias, k norm and rotary of key head h of token tok, then into the cache. */
static void prep_k_head(const struct tok_task *t, int tok, int h, const float *cs)
{
    struct kwk_decoder *d = t->d;
    const struct kwk_layer *l = t->l;
    int hd = d->c->head_dim;
    float *k = d->kx + (size_t)tok * d->kv_dim + (size_t)h * hd;
    add_bias(k, l->bk ? l->bk + (size_t)h * hd : NULL, hd);
    if (l->k_norm)
        d->k->rmsnorm(k, k, l->k_norm, hd, d->c->rms_eps);
    kwk_rope_rotate(k, hd, cs);
    size_t at = kv_at(t, tok, h);
    kv_store(d, d->k_cache, at, k, hd);
    if (d->bf16_kv) {
        uint16_t *kc = (uint16_t *)d->k_cache + at;
        d->ak->half_to_bf16(kc, kc, hd);
    }
}

/* Bias of value head h of token tok, then into the cache. */
static void prep_v_head(const struct tok_task *t, int tok, int h)
{
    struct kwk_decoder *d = t->d;
    int hd = d->c->head_dim;
    float *v = d->vx + (size_t)tok * d->kv_dim + (size_t)h * hd;
    add_bias(v, t->l->bv ? t->l->bv + (size_t)h * hd : NULL, hd);
    size_t at = kv_at(t, tok, h);
    kv_store(d, d->v_cache, at, v, hd);
    if (d->bf16_kv) {
        uint16_t *vc = (uint16_t *)d->v_cache + at;
        d->ak->half_to_bf16(vc, vc, hd);
    }
}

/* Everything between the q/k/v products and attention, for token tok: each head on its own, so
 * that the fused path (qkv_post) can do it head by head on the thread that computed the head. */
static void qk_prepare(struct tok_task *t, int tok)
{
    const struct kwk_config *c = t->d->c;
    const float *cs = rope_table(t, tok);
    for (int h = 0; h < c->n_heads; h++)
        prep_q_head(t, tok, h, cs);
    for (int h = 0; h < c->n_kv_heads; h++) {
        prep_k_head(t, tok, h, cs);
        prep_v_head(t, tok, h);
    }
}

static void qk_prepare_run(void *ctx, int ith, int nth)
{
    struct tok_task *t = ctx;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 1, &lo, &hi);
    for (long i = lo; i < hi; i++)
        qk_prepare(t, (int)i);
}

/* The qkv task's post step (jobs q, k, v split by head): this thread's heads and tokens. */
static void qkv_post(const struct mm_task *mt, const long *lo, const long *hi, long t0, long t1)
{
    const struct tok_task *t = mt->post_ctx;
    long hd = t->d->c->head_dim;
    for (int tok = (int)t0; tok < (int)t1; tok++) {
        const float *cs = rope_table(t, tok);
        for (long h = lo[0] / hd; h < hi[0] / hd; h++)
            prep_q_head(t, tok, (int)h, cs);
        for (long h = lo[1] / hd; h < hi[1] / hd; h++)
            prep_k_head(t, tok, (int)h, cs);
        for (long h = lo[2] / hd; h < hi[2] / hd; h++)
            prep_v_head(t, tok, (int)h);
    }
}

/* ---- attention: the kernels of kernels/attn.h over each row's own slot ------------------------ */

struct att_task {
    struct kwk_decoder *d;
    const struct kwk_attn_args *a;
    int n;
    const struct mm_task *after; /* the o-product, planned: see prefetch_next */
    const struct mm_task *then;  /* the gate/up product after it, planned */
};

/* Items (row, head) are shared out by the positions they attend (a prompt chunk's last rows
 * attend many more than its first); each item's numbers do not depend on the share. */
static void attend_run(void *ctx, int ith, int nth)
{
    struct att_task *t = ctx;
    long lo, hi;
    kwk_attn_split(t->a, t->n, ith, nth, &lo, &hi);
    if (lo < hi)
        t->d->ak->items(t->a, lo, hi, t->d->scores + (size_t)ith * t->d->scores_per_thread);
    prefetch_next(t->after, t->then, t->d->pool, ith);
}

/* A decode step shared by positions: each thread computes a balanced run of the row's (kv
 * group, span) parts, then, after a barrier, merges its share of the heads (the table's
 * span_part and span_merge: the bits its items give). */
static void attend_spans_run(void *ctx, int ith, int nth)
{
    struct att_task *t = ctx;
    struct kwk_decoder *d = t->d;
    float *scratch = d->scores + (size_t)ith * d->scores_per_thread;
    long u0, u1, h0, h1, ns = (t->a->last[0] - t->a->first[0] + d->att_span) / d->att_span;
    kwk_attn_span_split(t->a, 0, d->att_span, ith, nth, &u0, &u1);
    for (long u = u0; u < u1; u++)
        d->ak->span_part(t->a, 0, (int)(u / ns), (int)(u % ns), d->att_parts, scratch);
    kwk_pool_barrier(d->pool);
    kwk_split_range(t->a->n_heads, ith, nth, 1, &h0, &h1);
    if (h0 < h1)
        d->ak->span_merge(t->a, 0, (int)h0, (int)h1, d->att_parts);
    prefetch_next(t->after, t->then, d->pool, ith);
}

/* Positions from which a decode step whose kv groups do not go evenly round the threads is shared
 * by positions (attend_spans_run) rather than by whole groups. Token by token on two threads
 * (SmolLM2-135M / 360M int4, spans of 512): 4% / 1-3% less time a token at 2048 positions, 14% /
 * 7% at 4096 (session 37); with the shares' edges at the nearest span (kwk_attn_span_split,
 * session 38) 0.975-0.980 of the time at 1024-1152 positions on 135M, 0.986-0.994 on 360M,
 * 0.989-0.995 at 640-896 on 135M (360M 0.993-1.001 at 768-896), and 1.016 (slower) at 512-640,
 * where 512-position spans cannot balance three groups and the barrier and merge cost more. */
#define KWK_SPAN_SPLIT_MIN 768

static int span_split_wanted(const struct kwk_decoder *d, int n)
{
    int nth = kwk_pool_size(d->pool), groups = d->c->n_kv_heads;
    if (n != 1 || !d->att_span || nth < 2 || groups % nth == 0 || groups >= 4 * nth)
        return 0;
    return d->att_last[0] - d->att_first[0] + 1 >= KWK_SPAN_SPLIT_MIN;
}

/* Rows from which a prompt chunk over a half cache reads its slot's keys and values widened. */
#define KWK_STAGE_ROWS 16

struct stage_task {
    struct kwk_decoder *d;
    const uint16_t *k, *v; /* the slot's layer cache (kv head 0, position 0) */
    void *ks, *vs;         /* d->kv_stage's K and V, laid out alike */
    int lo, hi;            /* the positions staged, lo..hi */
    long per_head, n;      /* units a head (elements; bf16: position pairs); of all heads */
    size_t head;           /* elements from one head's run to the next (max_len * head_dim) */
};

/* Floats: elements widened, lo's first onwards. */
static void stage_run(void *ctx, int ith, int nth)
{
    struct stage_task *t = ctx;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 64, &lo, &hi);
    size_t first = (size_t)t->lo * (size_t)t->d->c->head_dim;
    while (lo < hi) { /* this thread's elements, head by head */
        long h = lo / t->per_head, i = lo % t->per_head, m = KWK_MIN(hi - lo, t->per_head - i);
        size_t at = (size_t)h * t->head + first + (size_t)i;
        t->d->k->from_half((float *)t->ks + at, t->k + at, m);
        t->d->k->from_half((float *)t->vs + at, t->v + at, m);
        lo += m;
    }
}

/* bf16 (the attention table's stage_bf16): position pairs from lo (even). */
static void stage_bf16_run(void *ctx, int ith, int nth)
{
    struct stage_task *t = ctx;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 1, &lo, &hi);
    int hd = t->d->c->head_dim;
    while (lo < hi) { /* this thread's pairs, head by head */
        long h = lo / t->per_head, i = lo % t->per_head, m = KWK_MIN(hi - lo, t->per_head - i);
        size_t at = (size_t)h * t->head;
        long p0 = t->lo + 2 * i, p1 = KWK_MIN((long)t->hi + 1, p0 + 2 * m);
        t->d->ak->stage_bf16(t->d->bf16_kv ? 2 : 1, t->k + at, t->v + at,
                             t->d->bf16_kv ? NULL : (uint16_t *)t->ks + at,
                             (uint16_t *)t->vs + at, p0, p1, hd);
        lo += m;
    }
}

/* A prompt chunk of one slot over a half cache: every tile of its attention reads the slot's
 * keys and values, and widening them in each tile costs a fifth of the attention, so they are
 * converted once here and the tiles read the staged copy: widened to floats (exactly: the same
 * numbers), or for a table that computes with bf16 products, rounded to bf16 as its tiles would
 * round them (the same numbers again), values in the pairs its products take. Points att_k /
 * att_v at the copy and returns 1 (floats) or 2 (bf16, kwk_attn_args.kv_bf16); 0 (nothing done)
 * for float caches, decode steps and chunks mixing slots, which read the cache. */
static int stage_slot(struct kwk_decoder *d, int layer, int n)
{
    if (!d->kv_half || n < KWK_STAGE_ROWS)
        return 0;
    int hd = d->c->head_dim, slot = d->row_slot[0], lo = d->att_first[0], hi = d->att_last[0];
    int bf = d->ak->stage_bf16 && hd % 32 == 0;
    for (int r = 0; r < n; r++) {
        if (d->row_slot[r] != slot)
            return 0;
        bf &= d->att_first[r] % 2 == 0; /* pairs start on even positions */
        lo = KWK_MIN(lo, d->att_first[r]);
        hi = KWK_MAX(hi, d->att_last[r]);
    }
    if (hi < lo || (d->bf16_kv && !bf)) /* a bf16 cache is read as it is, never widened */
        return 0;
    size_t base = kv_base(d, slot, layer);
    float *ks = d->kv_stage, *vs = d->kv_stage + (size_t)d->max_len * (size_t)d->kv_dim;
    struct stage_task t = {.d = d,
                           .k = (const uint16_t *)d->k_cache + base,
                           .v = (const uint16_t *)d->v_cache + base,
                           .ks = ks,
                           .vs = vs,
                           .lo = lo,
                           .hi = hi,
                           .per_head = bf ? (hi - lo + 2) / 2 : (long)(hi - lo + 1) * hd,
                           .head = (size_t)d->max_len * (size_t)hd};
    t.n = t.per_head * d->c->n_kv_heads;
    kwk_pool_run(d->pool, bf ? stage_bf16_run : stage_run, &t);
    for (int r = 0; r < n; r++) {
        if (!d->bf16_kv) /* else the cache's keys, laid out as the staged ones */
            d->att_k[r] = ks;
        d->att_v[r] = vs;
    }
    return bf ? 2 : 1;
}

/* Causal attention of the chunk's rows, with a sliding window where the layer has one (every
 * layer of Mistral's, Gemma 3's local layers); after: the
 * planned product that follows, then: the one after it. */
static void attend(struct kwk_decoder *d, int layer, int n, const struct mm_task *after,
                   const struct mm_task *then)
{
    const struct kwk_config *c = d->c;
    int window = kwk_config_layer_windowed(c, layer) ? c->sliding_window : 0;
    for (int r = 0; r < n; r++) {
        size_t base = kv_base(d, d->row_slot[r], layer);
        int p = d->row_pos[r];
        d->att_k[r] = (const char *)d->k_cache + base * kwk_kv_elem_size(d);
        d->att_v[r] = (const char *)d->v_cache + base * kwk_kv_elem_size(d);
        d->att_last[r] = p;
        d->att_first[r] = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    }
    int staged = stage_slot(d, layer, n);
    struct kwk_attn_args a = {.head_dim = c->head_dim,
                              .n_heads = c->n_heads,
                              .n_kv_heads = c->n_kv_heads,
                              .ld_pos = c->head_dim,
                              .ld_head = (long)d->max_len * c->head_dim,
                              .scale = c->attn_scale,
                              .kv_half = d->kv_half && !staged,
                              .kv_bf16 = staged == 2,
                              .k_bf16 = d->bf16_kv,
                              .v_bf16 = d->bf16_kv,
                              .q = d->q,
                              .ldq = d->q_dim,
                              .out = d->att,
                              .ldo = d->q_dim,
                              .k_rows = d->att_k,
                              .v_rows = d->att_v,
                              .first = d->att_first,
                              .last = d->att_last,
                              .whole_groups = d->att_whole_groups};
    struct att_task t = {.d = d, .a = &a, .n = n, .after = after, .then = then};
    kwk_pool_run(d->pool, span_split_wanted(d, n) ? attend_spans_run : attend_run, &t);
}

/* ---- elementwise work on n rows of the residual stream ---------------------------------------- */

struct rows_task {
    struct kwk_decoder *d;
    int n;
    const float *norm_w; /* rmsnorm(x) * norm_w -> xn */
    float *add;          /* x += add (applied before the norm) */
    const float *add_norm; /* NULL, or add = rmsnorm(add) * add_norm first (Gemma 3's output
                              norms) */
};

static void rows_run(void *ctx, int ith, int nth)
{
    struct rows_task *t = ctx;
    struct kwk_decoder *d = t->d;
    int dm = d->c->d_model;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 1, &lo, &hi);
    for (long i = lo; i < hi; i++) {
        float *x = d->x + (size_t)i * dm;
        if (t->add_norm)
            d->k->rmsnorm(t->add + (size_t)i * dm, t->add + (size_t)i * dm, t->add_norm, dm,
                          d->c->rms_eps);
        /* x + 1 * add is exactly x + add: the table's vector loop instead of a scalar one */
        if (t->add)
            d->k->axpy(x, 1.0f, t->add + (size_t)i * dm, dm);
        if (t->norm_w)
            d->k->rmsnorm(d->xn + (size_t)i * dm, x, t->norm_w, dm, d->c->rms_eps);
    }
}

struct swiglu_task {
    struct kwk_decoder *d;
    int n;
};

/* The MLP's gated product: SiLU(gate) * up, or Gemma's GELU-tanh(gate) * up. */
static void gated(const struct kwk_decoder *d, float *g, const float *u, long n)
{
    if (d->c->act == KWK_ACT_GELU_TANH)
        d->k->geglu(g, u, n);
    else
        d->k->swiglu(g, u, n);
}

static void swiglu_run(void *ctx, int ith, int nth)
{
    struct swiglu_task *t = ctx;
    size_t dff = (size_t)t->d->c->d_ff;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 1, &lo, &hi);
    for (long i = lo; i < hi; i++)
        gated(t->d, t->d->gate + i * dff, t->d->up + i * dff, (long)dff);
}

/* The gate/up task's post step: gate and up are split alike, so this thread owns the same rows of
 * both and turns them into SiLU(gate) * up for each of its tokens. Rows start on multiples of 16,
 * so a SIMD kernel puts each element in its vector body or its tail exactly as a whole-row call
 * does. */
static void swiglu_post(const struct mm_task *mt, const long *lo, const long *hi, long t0,
                        long t1)
{
    const struct kwk_decoder *d = mt->post_ctx;
    size_t dff = (size_t)d->c->d_ff;
    for (int tok = (int)t0; tok < (int)t1; tok++)
        gated(d, d->gate + tok * dff + lo[0], d->up + tok * dff + lo[0], hi[0] - lo[0]);
}

/* Whether the q, k, v products can be split by head with each head's preparation fused in: heads
 * must be whole row groups, and the head split must not unbalance the threads where the separate
 * pass would have split tokens evenly (short chunks take heads one at a time: no imbalance). */
static int qkv_fusable(const struct kwk_decoder *d, const struct kwk_layer *l, int n)
{
    const struct kwk_config *c = d->c;
    int hd = c->head_dim, nth = kwk_pool_size(d->pool);
    if (hd % 16 != 0 || l->wq.rows != d->q_dim || l->wk.rows != d->kv_dim ||
        l->wv.rows != d->kv_dim)
        return 0;
    return n < nth || n <= DYN_TOK_MAX || (c->n_heads + 2 * c->n_kv_heads) % nth == 0;
}

/* ---- one layer, one chunk ---------------------------------------------------------------------- */

/* Plans layer's q, k, v products into t; returns whether they are split by head with each head's
 * preparation fused in (tt: the post step's context; NULL for a plan that is never run). */
static int plan_qkv(struct kwk_decoder *d, int layer, int n, const struct tok_task *tt,
                    struct mm_task *t)
{
    const struct kwk_layer *l = &d->layers[layer];
    struct mm_job qkv[3] = {
        {&l->wq, d->xn, d->q, d->q_dim},
        {&l->wk, d->xn, d->kx, d->kv_dim},
        {&l->wv, d->xn, d->vx, d->kv_dim},
    };
    int fused = qkv_fusable(d, l, n);
    if (fused)
        mm_plan(d, t, n, 3, qkv, d->c->head_dim, qkv_post, tt);
    else
        mm_plan(d, t, n, 3, qkv, 0, NULL, NULL);
    return fused;
}

/* Every product of the layer is planned first, so that each task knows the one after it: its
 * threads read their first rows of that while they wait (prefetch_next). */
static void layer_forward(struct kwk_decoder *d, int layer, int n, const float *next_norm)
{
    const struct kwk_layer *l = &d->layers[layer];
    struct tok_task tt = {.d = d, .l = l, .layer = layer, .n = n};
    struct mm_task qkv, o, gu, down, next_qkv;
    int fused = plan_qkv(d, layer, n, &tt, &qkv);
    /* o-projection into q's buffer (free by then) */
    struct mm_job o_job = {&l->wo, d->att, d->q, d->c->d_model};
    mm_plan(d, &o, n, 1, &o_job, 0, NULL, NULL);
    struct mm_job gu_jobs[2] = {
        {&l->w_gate, d->xn, d->gate, d->c->d_ff},
        {&l->w_up, d->xn, d->up, d->c->d_ff},
    };
    int gu_fused = l->w_gate.rows == d->c->d_ff && l->w_up.rows == d->c->d_ff;
    mm_plan(d, &gu, n, 2, gu_jobs, 0, gu_fused ? swiglu_post : NULL, d);
    struct mm_job down_job = {&l->w_down, d->gate, d->q, d->c->d_model};
    mm_plan(d, &down, n, 1, &down_job, 0, NULL, NULL);
    const struct mm_task *after_down = NULL;
    if (layer + 1 < d->c->n_layers) {
        plan_qkv(d, layer + 1, n, NULL, &next_qkv);
        after_down = &next_qkv;
    }

    if (d->capture)
        kwk_capture_rows(d->capture, layer, KWK_SITE_QKV, d->xn, n);
    mm_exec(d, &qkv, &o); /* the keys and values it writes are read next */
    if (!fused)
        run_tokens(d, n, qk_prepare_run, &tt);
    attend(d, layer, n, &o, &gu);

    if (d->capture)
        kwk_capture_rows(d->capture, layer, KWK_SITE_O, d->att, n);
    mm_exec(d, &o, &gu);
    /* residual add, then the FFN norm */
    struct rows_task rt = {
        .d = d, .n = n, .norm_w = l->ffn_norm, .add = d->q, .add_norm = l->post_attn_norm};
    run_tokens(d, n, rows_run, &rt);

    if (d->capture)
        kwk_capture_rows(d->capture, layer, KWK_SITE_GU, d->xn, n);
    mm_exec(d, &gu, &down);
    if (!gu_fused) {
        struct swiglu_task st = {.d = d, .n = n};
        run_tokens(d, n, swiglu_run, &st);
    }
    if (d->capture)
        kwk_capture_rows(d->capture, layer, KWK_SITE_DOWN, d->gate, n);
    mm_exec(d, &down, after_down);
    /* residual add, then the next layer's attention norm (none after the last layer) */
    struct rows_task rt2 = {
        .d = d, .n = n, .norm_w = next_norm, .add = d->q, .add_norm = l->post_ffn_norm};
    run_tokens(d, n, rows_run, &rt2);
}

void kwk_forward_rows(struct kwk_decoder *d, const int32_t *ids, int n)
{
    const struct kwk_model *m = d->m;
    int dm = d->c->d_model;
    for (int i = 0; i < n; i++) {
        float *x = d->x + (size_t)i * dm;
        kwk_model_embed_row(m, d->k, ids[i], x);
        if (d->c->embed_scale != 1.0f) /* Gemma: sqrt(d_model), in float32 as transformers */
            for (int j = 0; j < dm; j++)
                x[j] *= d->c->embed_scale;
        kwk_rope_table(d->c->head_dim, d->inv_freq, d->row_pos[i],
                       d->rope_cs + (size_t)i * (size_t)d->c->head_dim);
        if (d->rope_cs_local)
            kwk_rope_table(d->c->head_dim, d->inv_freq_local, d->row_pos[i],
                           d->rope_cs_local + (size_t)i * (size_t)d->c->head_dim);
    }
    struct rows_task rt = {.d = d, .n = n, .norm_w = d->layers[0].attn_norm, .add = NULL};
    run_tokens(d, n, rows_run, &rt);
    for (int L = 0; L < d->c->n_layers; L++) {
        const float *next = L + 1 < d->c->n_layers ? d->layers[L + 1].attn_norm : NULL;
        layer_forward(d, L, n, next);
    }
}

void kwk_forward_chunk(struct kwk_decoder *d, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++) {
        d->row_slot[i] = 0;
        d->row_pos[i] = d->pos + i;
    }
    kwk_forward_rows(d, ids, n);
    d->pos += n;
}
