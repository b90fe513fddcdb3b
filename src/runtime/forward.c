/* forward.c - one chunk of tokens through every layer: the math of Llama-family decoders, in
 * float32, split across the decoder's pool. Called by the decoder's owner thread. */
#include <math.h>
#include <string.h>

#include "runtime/runtime.h"

/* ---- matrix products: up to three independent y = x W^T, rows split across threads ---------- */

struct mm_job {
    const struct kwk_mat *w;
    const float *x;
    float *y;
    long ldy;
};

struct mm_task {
    const struct kwk_kernels *k;
    int n_tok;
    int n_jobs;
    struct mm_job jobs[3];
};

/* Rows are handed out in blocks of 16 so SIMD kernels work on whole row groups. */
static void mm_run(void *ctx, int ith, int nth)
{
    struct mm_task *t = ctx;
    for (int j = 0; j < t->n_jobs; j++) {
        const struct mm_job *job = &t->jobs[j];
        long lo, hi;
        kwk_split_range((long)job->w->rows, ith, nth, 16, &lo, &hi);
        if (lo < hi)
            t->k->matmul(job->w, job->x, t->n_tok, job->y, job->ldy, lo, hi);
    }
}

static void matmul(struct kwk_decoder *d, int n_tok, int n_jobs, const struct mm_job *jobs)
{
    struct mm_task t = {.k = d->k, .n_tok = n_tok, .n_jobs = n_jobs};
    memcpy(t.jobs, jobs, sizeof(*jobs) * (size_t)n_jobs);
    kwk_pool_run(d->pool, mm_run, &t);
}

/* ---- per-token work: norms, biases, rotary, cache writes, attention --------------------------- */

struct tok_task {
    struct kwk_decoder *d;
    const struct kwk_layer *l;
    int layer;
    int n; /* rows in the chunk */
};

/* Offset of (slot, layer, position 0) in the K and V caches. */
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

/* Bias, per-head q/k norm and rotary for token t; then its k and v go into the cache. */
static void qk_prepare(struct tok_task *t, int tok)
{
    struct kwk_decoder *d = t->d;
    const struct kwk_config *c = d->c;
    const struct kwk_layer *l = t->l;
    int hd = c->head_dim, p = d->row_pos[tok];
    float *q = d->q + (size_t)tok * d->q_dim;
    float *k = d->kx + (size_t)tok * d->kv_dim;
    float *v = d->vx + (size_t)tok * d->kv_dim;
    add_bias(q, l->bq, d->q_dim);
    add_bias(k, l->bk, d->kv_dim);
    add_bias(v, l->bv, d->kv_dim);
    for (int h = 0; h < c->n_heads; h++) {
        if (l->q_norm)
            d->k->rmsnorm(q + h * hd, q + h * hd, l->q_norm, hd, c->rms_eps);
        kwk_rope_apply(q + h * hd, hd, d->inv_freq, p);
    }
    for (int h = 0; h < c->n_kv_heads; h++) {
        if (l->k_norm)
            d->k->rmsnorm(k + h * hd, k + h * hd, l->k_norm, hd, c->rms_eps);
        kwk_rope_apply(k + h * hd, hd, d->inv_freq, p);
    }
    size_t off = kv_base(d, d->row_slot[tok], t->layer) + (size_t)p * d->kv_dim;
    memcpy(d->k_cache + off, k, sizeof(float) * d->kv_dim);
    memcpy(d->v_cache + off, v, sizeof(float) * d->kv_dim);
}

static void qk_prepare_run(void *ctx, int ith, int nth)
{
    struct tok_task *t = ctx;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 1, &lo, &hi);
    for (long i = lo; i < hi; i++)
        qk_prepare(t, (int)i);
}

/* Causal attention of one query head over the cache, with Mistral's sliding window when set. */
static void attend_head(struct tok_task *t, int tok, int h, float *scores)
{
    struct kwk_decoder *d = t->d;
    const struct kwk_config *c = d->c;
    int hd = c->head_dim, p = d->row_pos[tok];
    int kvh = h / (c->n_heads / c->n_kv_heads);
    int first = 0;
    if (c->sliding_window > 0 && p - c->sliding_window + 1 > 0)
        first = p - c->sliding_window + 1;
    const float *q = d->q + (size_t)tok * d->q_dim + (size_t)h * hd;
    size_t base = kv_base(d, d->row_slot[tok], t->layer) + (size_t)kvh * hd;
    const float *kc = d->k_cache + base;
    const float *vc = d->v_cache + base;
    float scale = 1.0f / sqrtf((float)hd);
    int n = p - first + 1;
    for (int j = 0; j < n; j++)
        scores[j] = d->k->dot(q, kc + (size_t)(first + j) * d->kv_dim, hd) * scale;
    d->k->softmax(scores, n);
    float *out = d->att + (size_t)tok * d->q_dim + (size_t)h * hd;
    memset(out, 0, sizeof(float) * hd);
    for (int j = 0; j < n; j++)
        d->k->axpy(out, scores[j], vc + (size_t)(first + j) * d->kv_dim, hd);
}

static void attend_run(void *ctx, int ith, int nth)
{
    struct tok_task *t = ctx;
    int n_heads = t->d->c->n_heads;
    float *scores = t->d->scores + (size_t)ith * t->d->max_len;
    long lo, hi;
    kwk_split_range((long)t->n * n_heads, ith, nth, 1, &lo, &hi);
    for (long i = lo; i < hi; i++)
        attend_head(t, (int)(i / n_heads), (int)(i % n_heads), scores);
}

/* ---- elementwise work on n rows of the residual stream ---------------------------------------- */

struct rows_task {
    struct kwk_decoder *d;
    int n;
    const float *norm_w; /* rmsnorm(x) * norm_w -> xn */
    const float *add;    /* x += add (applied before the norm) */
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
        if (t->add)
            for (int j = 0; j < dm; j++)
                x[j] += t->add[(size_t)i * dm + j];
        if (t->norm_w)
            d->k->rmsnorm(d->xn + (size_t)i * dm, x, t->norm_w, dm, d->c->rms_eps);
    }
}

struct swiglu_task {
    struct kwk_decoder *d;
    int n;
};

static void swiglu_run(void *ctx, int ith, int nth)
{
    struct swiglu_task *t = ctx;
    size_t dff = (size_t)t->d->c->d_ff;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 1, &lo, &hi);
    for (long i = lo; i < hi; i++)
        t->d->k->swiglu(t->d->gate + i * dff, t->d->up + i * dff, (long)dff);
}

/* ---- one layer, one chunk ---------------------------------------------------------------------- */

static void layer_forward(struct kwk_decoder *d, int layer, int n, const float *next_norm)
{
    const struct kwk_layer *l = &d->layers[layer];
    struct mm_job qkv[3] = {
        {&l->wq, d->xn, d->q, d->q_dim},
        {&l->wk, d->xn, d->kx, d->kv_dim},
        {&l->wv, d->xn, d->vx, d->kv_dim},
    };
    matmul(d, n, 3, qkv);

    struct tok_task tt = {.d = d, .l = l, .layer = layer, .n = n};
    kwk_pool_run(d->pool, qk_prepare_run, &tt);
    kwk_pool_run(d->pool, attend_run, &tt);

    /* o-projection into q's buffer (free now), then residual add and the FFN norm */
    struct mm_job o = {&l->wo, d->att, d->q, d->c->d_model};
    matmul(d, n, 1, &o);
    struct rows_task rt = {.d = d, .n = n, .norm_w = l->ffn_norm, .add = d->q};
    kwk_pool_run(d->pool, rows_run, &rt);

    struct mm_job gu[2] = {
        {&l->w_gate, d->xn, d->gate, d->c->d_ff},
        {&l->w_up, d->xn, d->up, d->c->d_ff},
    };
    matmul(d, n, 2, gu);
    struct swiglu_task st = {.d = d, .n = n};
    kwk_pool_run(d->pool, swiglu_run, &st);
    struct mm_job down = {&l->w_down, d->gate, d->q, d->c->d_model};
    matmul(d, n, 1, &down);
    /* residual add, then the next layer's attention norm (none after the last layer) */
    struct rows_task rt2 = {.d = d, .n = n, .norm_w = next_norm, .add = d->q};
    kwk_pool_run(d->pool, rows_run, &rt2);
}

void kwk_forward_rows(struct kwk_decoder *d, const int32_t *ids, int n)
{
    const struct kwk_model *m = d->m;
    int dm = d->c->d_model;
    for (int i = 0; i < n; i++)
        d->k->mat_row(&m->tok_emb, ids[i], d->x + (size_t)i * dm);
    struct rows_task rt = {.d = d, .n = n, .norm_w = d->layers[0].attn_norm, .add = NULL};
    kwk_pool_run(d->pool, rows_run, &rt);
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
