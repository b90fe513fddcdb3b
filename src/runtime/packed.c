/* packed.c - repacking a model's matrices into the int8 / int4 block formats of kernels/quant.h,
 * in parallel on the decoder's pool. Built on the decoder's owner thread; read-only after. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/quant.h"
#include "runtime/packcache.h"
#include "runtime/packed.h"

struct kwk_packed {
    struct kwk_layer *layers; /* [n_layers] the model's layers with matrices replaced */
    struct kwk_mat lm_head;   /* [n_vocab][d_model] packed */
    void **bufs;              /* [n_bufs] block storage, one per matrix (aligned) */
    int n_bufs;
    int64_t n_weights;        /* weights of the packed matrices */
    size_t n_bytes;           /* bytes of their blocks */
    struct kwk_packcache *cache; /* the pack file the blocks are mapped from, or NULL */
};

/* Matrices of a layer, in the order of kwk_layer; names for KWKER_INT4_KEEP8. */
enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_HEAD, M_COUNT };
static const char *const mat_names[M_COUNT] = {"q", "k", "v", "o", "gate", "up", "down", "head"};

static struct kwk_mat *layer_mat(struct kwk_layer *l, int which)
{
    struct kwk_mat *const ms[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                  &l->w_down};
    return ms[which];
}

/* int4's mixed precision: which matrices stay at 8 bits. By default the lm_head (its errors go
 * straight into every logit) and the value and down projections (the ones that move the logits
 * most at 4 bits, as llama.cpp's Q4_K_M also finds) of the layers more_bits_layer picks: 6.10
 * bits per weight on SmolLM2-135M, under Q4_K_M's 6.17. KWKER_INT4_KEEP8 (a comma list of
 * q,k,v,o,gate,up,down,head, or "none") overrides it for measurements, in every layer
 * (bit M_COUNT of the mask says "every layer"). */
static unsigned keep8_mask(void)
{
    unsigned mask = 1u << M_HEAD | 1u << M_V | 1u << M_DOWN;
    const char *env = getenv("KWKER_INT4_KEEP8");
    if (!env)
        return mask;
    mask = 1u << M_COUNT;
    for (int i = 0; i < M_COUNT; i++) {
        size_t n = strlen(mat_names[i]);
        for (const char *p = env; (p = strstr(p, mat_names[i])) != NULL; p += n)
            if ((p == env || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
                mask |= 1u << i;
    }
    return mask;
}

/* The first and last eighth of the layers and every third one between: where 4-bit value and
 * down projections hurt most (the layers llama.cpp's Q4_K_M gives more bits). */
static int more_bits_layer(int L, int n_layers)
{
    return L < n_layers / 8 || L >= 7 * n_layers / 8 || (L - n_layers / 8) % 3 == 2;
}

static int keeps8(unsigned mask, int which, int L, int n_layers)
{
    if (!(mask >> which & 1))
        return 0;
    return which == M_HEAD || mask >> M_COUNT & 1 || more_bits_layer(L, n_layers);
}

/* ---- the parallel repack ------------------------------------------------------------------- */

struct pack_job {
    const struct kwk_mat *src;
    struct kwk_mat *dst;
    long first_unit; /* units (row blocks) before this job */
};

struct pack_task {
    const struct kwk_kernels *k;
    struct pack_job *jobs;
    int n_jobs;
    long n_units;
    float *scratch;         /* [nth][KWK_QROWS * max_cols] */
    size_t scratch_stride;  /* floats per thread */
    _Atomic long next;      /* next unit to take (relaxed: units are independent) */
};

/* Threads take row blocks from a shared counter; each reads its 16 rows as float (any source
 * type, through the kernels' mat_row) and packs them. */
static void pack_run(void *ctx, int ith, int nth)
{
    struct pack_task *t = ctx;
    float *buf = t->scratch + (size_t)ith * t->scratch_stride;
    int j = 0;
    for (;;) {
        long u = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (u >= t->n_units)
            break;
        while (j + 1 < t->n_jobs && t->jobs[j + 1].first_unit <= u)
            j++; /* units only grow for a thread, so the job index only moves forward */
        const struct pack_job *job = &t->jobs[j];
        int64_t rb = u - job->first_unit, rows = job->src->rows, cols = job->src->cols;
        int64_t r1 = KWK_MIN(rows, (rb + 1) * KWK_QROWS);
        for (int64_t r = rb * KWK_QROWS; r < r1; r++)
            t->k->mat_row(job->src, r, buf + (size_t)(r - rb * KWK_QROWS) * (size_t)cols);
        kwk_quant_pack_rows(job->dst->wtype, (void *)job->dst->data, rows, cols, rb, buf,
                            (long)cols);
    }
}

/* Give dst the source's shape in wtype and storage of its own. */
static int alloc_mat(struct kwk_packed *p, const struct kwk_mat *src, struct kwk_mat *dst,
                     int wtype, struct kwk_err *err)
{
    size_t bytes;
    if (kwk_quant_bytes(wtype, src->rows, src->cols, &bytes))
        return kwk_err_set(err, KWK_ELIMIT, "a %lld x %lld matrix is too large to pack",
                           (long long)src->rows, (long long)src->cols);
    void *data = kwk_malloc_aligned(bytes ? bytes : 64);
    if (!data)
        return kwk_err_set(err, -ENOMEM, "out of memory packing a %lld x %lld matrix",
                           (long long)src->rows, (long long)src->cols);
    p->bufs[p->n_bufs++] = data;
    *dst = (struct kwk_mat){wtype, src->rows, src->cols, data};
    p->n_weights += src->rows * src->cols;
    p->n_bytes += bytes;
    return 0;
}

static int run_jobs(struct pack_job *jobs, int n_jobs, struct kwk_pool *pool,
                    struct kwk_err *err)
{
    int64_t max_cols = 1;
    long units = 0;
    for (int i = 0; i < n_jobs; i++) {
        jobs[i].first_unit = units;
        units += (long)((jobs[i].src->rows + KWK_QROWS - 1) / KWK_QROWS);
        max_cols = KWK_MAX(max_cols, jobs[i].src->cols);
    }
    int nth = pool ? kwk_pool_size(pool) : 1;
    struct pack_task t = {.k = kwk_kernels(), .jobs = jobs, .n_jobs = n_jobs, .n_units = units,
                          .scratch_stride = (size_t)KWK_QROWS * (size_t)max_cols};
    size_t n, bytes;
    if (kwk_mul_size(t.scratch_stride, (size_t)nth, &n) || kwk_mul_size(n, sizeof(float), &bytes))
        return kwk_err_set(err, KWK_ELIMIT, "packing scratch overflows");
    t.scratch = kwk_malloc_aligned(bytes);
    if (!t.scratch)
        return kwk_err_set(err, -ENOMEM, "out of memory for packing scratch");
    atomic_init(&t.next, 0);
    if (pool)
        kwk_pool_run(pool, pack_run, &t);
    else
        pack_run(&t, 0, 1);
    kwk_free_aligned(t.scratch);
    return 0;
}

/* The pack cache's key for m: the bytes of every tensor of its files (the matrices are made from
 * them; a GGUF's quantized tensors are far fewer bytes than their float32 expansion) and what
 * else turns those into the matrices. NULL sources (in-memory models) key on the matrices. */
static int pack_sources(const struct kwk_model *m, struct kwk_packcache_opts *o)
{
    int n = m->gguf ? m->gguf->n_tensors : 0;
    for (int i = 0; i < m->n_st; i++)
        n += m->st[i].n_tensors;
    if (n == 0)
        return 0;
    struct kwk_pack_source *s = kwk_calloc((size_t)n, sizeof *s);
    if (!s)
        return -1;
    int k = 0;
    for (int i = 0; m->gguf && i < m->gguf->n_tensors; i++)
        s[k++] = (struct kwk_pack_source){m->gguf->tensors[i].data, m->gguf->tensors[i].nbytes};
    for (int j = 0; j < m->n_st; j++)
        for (int i = 0; i < m->st[j].n_tensors; i++)
            s[k++] = (struct kwk_pack_source){m->st[j].tensors[i].data, m->st[j].tensors[i].nbytes};
    const struct kwk_config *c = &m->cfg;
    const int64_t shape[] = {m->gguf != NULL, c->arch, c->n_vocab, c->n_layers, c->d_model,
                             c->n_heads, c->n_kv_heads, c->head_dim, c->d_ff,
                             c->tie_embeddings, c->qkv_bias, c->qk_norm};
    o->salt ^= kwk_hash64(shape, sizeof shape, 0x5eed);
    o->sources = s;
    o->n_sources = n;
    return 0;
}

/* A pack file names its format version, but a change to packing that forgets to bump it would
 * go unseen: pack the smallest matrix of each target type again and compare (0.1% of packing
 * SmolLM2-135M). 1 = the mapped blocks are what this build packs. */
static int cached_blocks_match(const struct pack_job *jobs, int n_jobs, struct kwk_pool *pool)
{
    int ok = 1;
    for (int i = 0; i < n_jobs && ok; i++) {
        const struct kwk_mat *d = jobs[i].dst;
        int first = 1, best = i;
        for (int j = 0; j < n_jobs; j++) {
            const struct kwk_mat *o = jobs[j].dst;
            if (o->wtype == d->wtype && j < i)
                first = 0; /* this type was checked at its first matrix */
            const struct kwk_mat *cur = jobs[best].dst;
            if (o->wtype == d->wtype && o->rows * o->cols < cur->rows * cur->cols)
                best = j;
        }
        size_t bytes;
        const struct kwk_mat *b = jobs[best].dst;
        if (!first || kwk_quant_bytes(b->wtype, b->rows, b->cols, &bytes))
            continue;
        struct kwk_mat fresh = {b->wtype, b->rows, b->cols,
                                kwk_malloc_aligned(bytes ? bytes : 64)};
        struct pack_job job = {jobs[best].src, &fresh, 0};
        if (fresh.data && !run_jobs(&job, 1, pool, NULL))
            ok = !memcmp(fresh.data, b->data, bytes);
        kwk_free_aligned((void *)fresh.data);
    }
    return ok;
}

struct kwk_packed *kwk_packed_new(const struct kwk_model *m, int precision,
                                  const struct kwk_packcache_opts *cache, struct kwk_pool *pool,
                                  struct kwk_err *err)
{
    if (precision != KWK_PRECISION_BALANCED && precision != KWK_PRECISION_INT4) {
        kwk_err_set(err, KWK_EARG, "precision %d has no packed form", precision);
        return NULL;
    }
    double t0 = kwk_time_s();
    const char *label = precision == KWK_PRECISION_INT4 ? "int4" : "balanced";
    int n_layers = m->cfg.n_layers, n_mats = 7 * n_layers + 1;
    unsigned keep8 = precision == KWK_PRECISION_INT4 ? keep8_mask() : 0;
    struct pack_job *jobs = NULL;
    struct kwk_pack_entry *ents = NULL;
    struct kwk_packcache_opts opts = {0};
    struct kwk_packed *p = kwk_calloc(1, sizeof *p);
    if (!p)
        goto out_nomem;
    p->layers = kwk_calloc((size_t)n_layers, sizeof *p->layers);
    p->bufs = kwk_calloc((size_t)n_mats, sizeof *p->bufs);
    jobs = kwk_calloc((size_t)n_mats, sizeof *jobs);
    ents = kwk_calloc((size_t)n_mats, sizeof *ents);
    if (!p->layers || !p->bufs || !jobs || !ents)
        goto out_nomem;
    /* First every matrix's target type and size, so the pack cache can key on exactly what is
     * packed; then storage: a mapped pack file, or blocks of our own. */
    int n_jobs = 0;
    for (int L = 0; L < n_layers; L++) {
        p->layers[L] = m->layers[L]; /* norms and biases: the model's, shared */
        for (int w = 0; w < 7; w++) {
            int wt = precision == KWK_PRECISION_INT4 && !keeps8(keep8, w, L, n_layers) ? KWK_W_Q4
                                                                                        : KWK_W_Q8;
            jobs[n_jobs++] = (struct pack_job){layer_mat(&m->layers[L], w),
                                               layer_mat(&p->layers[L], w), 0};
            *jobs[n_jobs - 1].dst = (struct kwk_mat){wt, 0, 0, NULL};
        }
    }
    int wt_head = precision == KWK_PRECISION_INT4 && !(keep8 >> M_HEAD & 1) ? KWK_W_Q4 : KWK_W_Q8;
    jobs[n_jobs++] = (struct pack_job){&m->lm_head, &p->lm_head, 0};
    p->lm_head.wtype = wt_head;
    for (int i = 0; i < n_jobs; i++) {
        struct kwk_mat *d = jobs[i].dst;
        d->rows = jobs[i].src->rows;
        d->cols = jobs[i].src->cols;
        if (kwk_quant_bytes(d->wtype, d->rows, d->cols, &ents[i].bytes)) {
            kwk_err_set(err, KWK_ELIMIT, "a %lld x %lld matrix is too large to pack",
                        (long long)d->rows, (long long)d->cols);
            goto out_err;
        }
        ents[i] = (struct kwk_pack_entry){jobs[i].src, d, ents[i].bytes};
    }
    if (cache)
        opts = *cache;
    opts.label = label;
    opts.sources = NULL; /* ours to make (and free) */
    opts.n_sources = 0;
    if (opts.dir && opts.dir[0] && pack_sources(m, &opts))
        goto out_nomem;
    int cached = kwk_packcache_open(&opts, ents, n_jobs, pool, &p->cache);
    for (int tries = 0; cached == KWK_PACKCACHE_HIT && !cached_blocks_match(jobs, n_jobs, pool);
         tries++) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: its blocks differ from what this build packs "
                "(a packing change without a KWK_PACK_FORMAT_VERSION bump?); packing again",
                kwk_packcache_path(p->cache));
        kwk_packcache_discard(p->cache);
        p->cache = NULL;
        cached = tries ? KWK_PACKCACHE_OFF
                       : kwk_packcache_open(&opts, ents, n_jobs, pool, &p->cache);
    }
    for (int i = 0; i < n_jobs; i++) {
        struct kwk_mat *d = jobs[i].dst;
        if (cached == KWK_PACKCACHE_OFF && alloc_mat(p, jobs[i].src, d, d->wtype, err))
            goto out_err;
        if (cached != KWK_PACKCACHE_OFF) {
            p->n_weights += d->rows * d->cols;
            p->n_bytes += ents[i].bytes;
        }
    }
    if (cached != KWK_PACKCACHE_HIT) {
        /* a layer at a time, so a progress bar can move */
        char what[64];
        snprintf(what, sizeof what, "packing %s", label);
        struct kwk_progress bar;
        kwk_progress_init(&bar, what);
        for (int i = 0; i < n_jobs; i += 7) {
            if (run_jobs(jobs + i, KWK_MIN(7, n_jobs - i), pool, err))
                goto out_err;
            kwk_progress_update(&bar, KWK_MIN(i + 7, n_jobs), n_jobs);
        }
        kwk_progress_end(&bar);
        kwk_packcache_commit(p->cache, pool);
    }
    kwk_free(jobs);
    kwk_free(ents);
    kwk_free((void *)opts.sources);
    kwk_log(KWK_LOG_INFO, "%s %s: %lld weights in %.1f MB, %.3f bits per weight, %.2f s",
            cached == KWK_PACKCACHE_HIT ? "mapped packed" : "packed", label,
            (long long)p->n_weights, (double)p->n_bytes / 1e6,
            8.0 * (double)p->n_bytes / (double)p->n_weights, kwk_time_s() - t0);
    return p;
out_nomem:
    kwk_err_set(err, -ENOMEM, "out of memory packing the model");
out_err:
    kwk_free(jobs);
    kwk_free(ents);
    kwk_free((void *)opts.sources);
    kwk_packed_free(p);
    return NULL;
}

void kwk_packed_free(struct kwk_packed *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_bufs; i++)
        kwk_free_aligned(p->bufs[i]);
    kwk_packcache_free(p->cache);
    kwk_free(p->bufs);
    kwk_free(p->layers);
    kwk_free(p);
}

const struct kwk_layer *kwk_packed_layers(const struct kwk_packed *p)
{
    return p->layers;
}

const struct kwk_mat *kwk_packed_lm_head(const struct kwk_packed *p)
{
    return &p->lm_head;
}
