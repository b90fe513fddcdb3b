/* encoder.c - a BERT encoder's forward pass and pooling: whole sequences in, one embedding each
 * out. Sequences are packed into passes of up to n_batch tokens; every token attends to all the
 * tokens of its own sequence (no cache, no causal mask), so a pass is a prompt's work: the
 * decoder's matrix products (kwk_matmul_pool, packed weights for balanced / int4) and its
 * attention kernels, with each row's keys those of its sequence. Norms, biases and GELU are
 * per-row work shared out by rows. Driven by one thread at a time; its pool runs the kernels. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "base/pool.h"
#include "kernels/attn.h"
#include "kernels/quant.h"
#include "runtime/packed.h"
#include "runtime/runtime.h"

#define ENC_DEFAULT_BATCH 2048
#define ENC_MAX_BATCH (1 << 16)

struct kwk_encoder {
    const struct kwk_model *m;
    const struct kwk_config *c;
    const struct kwk_kernels *k;
    const struct kwk_attn_kernel *ak;
    struct kwk_pool *pool;
    int n_threads;
    int n_batch; /* rows a pass holds */
    int pooling, normalize;
    int max_tokens;                     /* the longest sequence it takes */
    int holds_floats;                   /* holds the model's lazy float matrices (preserve) */
    const struct kwk_enc_layer *layers; /* the model's, or packed (packed_layers) */
    struct kwk_enc_layer *packed_layers;
    void **packed_data; /* [n_packed] blocks of the packed matrices */
    int n_packed;
    void *qact_mem; /* quantized precisions: activations of one product */
    int64_t qact_cols;
    /* scratch, n_batch rows each */
    float *x;                       /* [n_batch][d] the residual stream, then the states */
    float *q, *kx, *vx, *att, *tmp; /* [n_batch][d] */
    float *up;                      /* [n_batch][d_ff] */
    float *scores;                  /* [n_threads][scores_per_thread] attention scratch */
    size_t scores_per_thread;
    const void **k_rows, **v_rows; /* [n_batch] each row's sequence's keys and values */
    int *first, *last;             /* [n_batch] positions each row attends: its sequence */
    int *pos;                      /* [n_batch] each row's position in its sequence */
    int *keep;                     /* [n_batch] the rows the last layer finishes (one_row) */
    const int32_t *ids;            /* the pass's tokens (borrowed during a pass) */
    const int32_t *types;          /* their type ids, or NULL for type 0 (borrowed too) */
};

void kwk_encoder_params_init(struct kwk_encoder_params *p)
{
    memset(p, 0, sizeof *p);
    p->pooling = -1;
    p->normalize = -1;
}

/* ---- per-row work ------------------------------------------------------------------------- */

/* y = (x - mean) / sqrt(var + eps) * w + b over n floats (y may be x): transformers' LayerNorm,
 * its mean and biased variance summed in double, so the float result is within a rounding of
 * PyTorch's own sums whatever their order. */
static void layer_norm(float *y, const float *x, const float *w, const float *b, int n, float eps)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += x[i];
    double mean = s / n, v = 0.0;
    for (int i = 0; i < n; i++)
        v += ((double)x[i] - mean) * ((double)x[i] - mean);
    float mf = (float)mean, rstd = (float)(1.0 / sqrt(v / n + (double)eps));
    for (int i = 0; i < n; i++)
        y[i] = (x[i] - mf) * rstd * w[i] + b[i];
}

/* BERT's GELU: erf's ("gelu": the kernels'), or the tanh form ("gelu_new",
 * "gelu_pytorch_tanh"), which only such checkpoints use. */
static void gelu(const struct kwk_kernels *k, float *x, int n, int act)
{
    if (act == KWK_ACT_GELU) {
        k->gelu(x, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
}

static void add_bias(float *y, const float *b, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += b[i];
}

struct row_task {
    struct kwk_encoder *e;
    const struct kwk_enc_layer *l;
    int n;
};

/* Thread ith's rows of the pass. */
static void my_rows(const struct row_task *t, int ith, int nth, long *r0, long *r1)
{
    kwk_split_range(t->n, ith, nth, 1, r0, r1);
}

/* Embeddings: (word + token type) + position, then their LayerNorm, as BertEmbeddings adds
 * them. */
static void embed_run(void *ctx, int ith, int nth)
{
    const struct row_task *t = ctx;
    struct kwk_encoder *e = t->e;
    const struct kwk_model *m = e->m;
    int d = e->c->d_model;
    long r0, r1;
    my_rows(t, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++) {
        float *x = e->x + r * d;
        const float *pos = m->pos_emb + (size_t)e->pos[r] * d;
        const float *typ = m->type_emb + (e->types ? (size_t)e->types[r] * d : 0);
        kwk_model_embed_row(m, e->k, e->ids[r], x);
        for (int i = 0; i < d; i++)
            x[i] = (x[i] + typ[i]) + pos[i];
        layer_norm(x, x, m->emb_ln, m->emb_ln_b, d, e->c->rms_eps);
    }
}

static void qkv_bias_run(void *ctx, int ith, int nth)
{
    const struct row_task *t = ctx;
    struct kwk_encoder *e = t->e;
    int d = e->c->d_model;
    long r0, r1;
    my_rows(t, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++) {
        add_bias(e->q + r * d, t->l->bq, d);
        add_bias(e->kx + r * d, t->l->bk, d);
        add_bias(e->vx + r * d, t->l->bv, d);
    }
}

/* Attention of the pass's (row, head) items, shared out evenly. */
static void attn_run(void *ctx, int ith, int nth)
{
    const struct row_task *t = ctx;
    struct kwk_encoder *e = t->e;
    const struct kwk_config *c = e->c;
    struct kwk_attn_args a = {.head_dim = c->head_dim,
                              .n_heads = c->n_heads,
                              .n_kv_heads = c->n_heads,
                              .ld_pos = c->d_model,
                              .ld_head = c->head_dim,
                              .scale = c->attn_scale,
                              .q = e->q,
                              .ldq = c->d_model,
                              .out = e->att,
                              .ldo = c->d_model,
                              .k_rows = e->k_rows,
                              .v_rows = e->v_rows,
                              .first = e->first,
                              .last = e->last};
    long i0, i1;
    kwk_split_range((long)t->n * c->n_heads, ith, nth, 1, &i0, &i1);
    if (i0 < i1)
        e->ak->items(&a, i0, i1, e->scores + (size_t)ith * e->scores_per_thread);
}

/* x = LN(x + (y + b)): a block's output (in tmp) joins the residual stream. */
static void residual_norm(struct kwk_encoder *e, long r, const float *b, const float *w,
                          const float *bn)
{
    int d = e->c->d_model;
    float *x = e->x + r * d, *y = e->tmp + r * d;
    for (int i = 0; i < d; i++)
        y[i] = (y[i] + b[i]) + x[i];
    layer_norm(x, y, w, bn, d, e->c->rms_eps);
}

static void attn_out_run(void *ctx, int ith, int nth)
{
    const struct row_task *t = ctx;
    long r0, r1;
    my_rows(t, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++)
        residual_norm(t->e, r, t->l->bo, t->l->attn_ln, t->l->attn_ln_b);
}

static void up_run(void *ctx, int ith, int nth)
{
    const struct row_task *t = ctx;
    struct kwk_encoder *e = t->e;
    int ff = e->c->d_ff;
    long r0, r1;
    my_rows(t, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++) {
        float *u = e->up + r * ff;
        add_bias(u, t->l->b_up, ff);
        gelu(e->k, u, ff, e->c->act);
    }
}

static void ffn_out_run(void *ctx, int ith, int nth)
{
    const struct row_task *t = ctx;
    long r0, r1;
    my_rows(t, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++)
        residual_norm(t->e, r, t->l->b_down, t->l->ffn_ln, t->l->ffn_ln_b);
}

/* ---- a pass ------------------------------------------------------------------------------- */

static void matmul(struct kwk_encoder *e, int n, const struct kwk_mat *const *w, const float *x,
                   float *const *y, long ldy, int n_w)
{
    kwk_matmul_pool(e->k, e->pool, e->qact_mem, e->qact_cols, n, w, x, y, ldy, n_w);
}

/* The last layer's rows after its keys and values: only e->keep[n_keep], moved to the pass's
 * first n_keep rows (in order, so no row is overwritten before it is read: keep[j] >= j). */
static void keep_rows(struct kwk_encoder *e, int n_keep)
{
    size_t d = (size_t)e->c->d_model;
    for (int j = 0; j < n_keep; j++) {
        int r = e->keep[j];
        if (r == j)
            continue;
        memcpy(e->q + j * d, e->q + (size_t)r * d, sizeof(float) * d);
        memcpy(e->x + j * d, e->x + (size_t)r * d, sizeof(float) * d);
        e->k_rows[j] = e->k_rows[r];
        e->v_rows[j] = e->v_rows[r];
        e->first[j] = e->first[r];
        e->last[j] = e->last[r];
    }
}

/* Runs the n rows of a pass (whole sequences, laid out by set_sequence) through every layer;
 * the last layer's states are left in e->x. With n_keep > 0 only the rows e->keep[n_keep] are
 * wanted (one a sequence, for CLS or last-token pooling and a classification head): the last
 * layer computes every row's keys and values but the rest of its work for those rows alone,
 * left in rows 0 .. n_keep - 1. Each row's numbers are the same either way: attention is per
 * (row, head) and the products per row. */
static void forward_pass(struct kwk_encoder *e, const int32_t *ids, const int32_t *types, int n,
                         int n_keep)
{
    const struct kwk_config *c = e->c;
    struct row_task t = {.e = e, .n = n};
    e->ids = ids;
    e->types = types;
    kwk_pool_run(e->pool, embed_run, &t);
    for (int L = 0; L < c->n_layers; L++) {
        const struct kwk_enc_layer *l = &e->layers[L];
        t.l = l;
        const struct kwk_mat *qkv[3] = {&l->wq, &l->wk, &l->wv};
        float *qkv_out[3] = {e->q, e->kx, e->vx};
        matmul(e, t.n, qkv, e->x, qkv_out, c->d_model, 3);
        kwk_pool_run(e->pool, qkv_bias_run, &t);
        if (n_keep > 0 && L == c->n_layers - 1) {
            keep_rows(e, n_keep);
            t.n = n_keep;
        }
        kwk_pool_run(e->pool, attn_run, &t);
        const struct kwk_mat *wo[1] = {&l->wo};
        matmul(e, t.n, wo, e->att, &e->tmp, c->d_model, 1);
        kwk_pool_run(e->pool, attn_out_run, &t);
        const struct kwk_mat *wu[1] = {&l->w_up};
        matmul(e, t.n, wu, e->x, &e->up, c->d_ff, 1);
        kwk_pool_run(e->pool, up_run, &t);
        const struct kwk_mat *wd[1] = {&l->w_down};
        matmul(e, t.n, wd, e->up, &e->tmp, c->d_model, 1);
        kwk_pool_run(e->pool, ffn_out_run, &t);
    }
}

/* Rows [r0, r1) of the pass are one sequence: each attends to all of them. */
static void set_sequence(struct kwk_encoder *e, int r0, int r1)
{
    int d = e->c->d_model;
    for (int r = r0; r < r1; r++) {
        e->k_rows[r] = e->kx + (size_t)r0 * d;
        e->v_rows[r] = e->vx + (size_t)r0 * d;
        e->first[r] = 0;
        e->last[r] = r1 - r0 - 1;
        e->pos[r] = r - r0;
    }
}

/* The embedding of the sequence in rows [r0, r1) of e->x into out[d]. */
static void pool_rows(const struct kwk_encoder *e, int r0, int r1, float *out)
{
    int d = e->c->d_model, n = r1 - r0;
    const float *x = e->x;
    switch (e->pooling) {
    case KWK_POOLING_CLS:
        memcpy(out, x + (size_t)r0 * d, sizeof(float) * (size_t)d);
        break;
    case KWK_POOLING_LAST:
        memcpy(out, x + (size_t)(r1 - 1) * d, sizeof(float) * (size_t)d);
        break;
    case KWK_POOLING_MAX:
        memcpy(out, x + (size_t)r0 * d, sizeof(float) * (size_t)d);
        for (int r = r0 + 1; r < r1; r++)
            for (int i = 0; i < d; i++)
                out[i] = fmaxf(out[i], x[(size_t)r * d + i]);
        break;
    default: /* MEAN, MEAN_SQRT_LEN: sums in double, one rounding */
        for (int i = 0; i < d; i++) {
            double s = 0.0;
            for (int r = r0; r < r1; r++)
                s += x[(size_t)r * d + i];
            out[i] = (float)(e->pooling == KWK_POOLING_MEAN ? s / n : s / sqrt((double)n));
        }
    }
    if (e->normalize) {
        /* torch.nn.functional.normalize: x / max(||x||, 1e-12) */
        double ss = 0.0;
        for (int i = 0; i < d; i++)
            ss += (double)out[i] * out[i];
        float norm = (float)fmax(sqrt(ss), 1e-12);
        for (int i = 0; i < d; i++)
            out[i] /= norm;
    }
}

/* ---- checks and the public calls ----------------------------------------------------------- */

static int check_seq(const struct kwk_encoder *e, const int32_t *ids, int n, int i,
                     struct kwk_err *err)
{
    if (n <= 0)
        return kwk_err_set(err, KWK_EARG, "sequence %d is empty", i);
    if (n > e->max_tokens && e->max_tokens < e->c->max_position)
        return kwk_err_set(err, KWK_ELIMIT, "sequence %d has %d tokens; the encoder takes at "
                           "most %d (%s; its positions hold %d)", i, n, e->max_tokens,
                           e->max_tokens == kwk_config_max_tokens(e->c)
                               ? "the model's sentence-transformers max_seq_length or tokenizer "
                                 "model_max_length"
                               : "the limit it was made with",
                           e->c->max_position);
    if (n > e->max_tokens)
        return kwk_err_set(err, KWK_ELIMIT, "sequence %d has %d tokens; the model takes at most "
                           "%d", i, n, e->max_tokens);
    for (int j = 0; j < n; j++)
        if (ids[j] < 0 || ids[j] >= e->c->n_vocab)
            return kwk_err_set(err, KWK_ERANGE,
                               "sequence %d: token %d is id %d, outside the "
                               "vocabulary of %d",
                               i, j, (int)ids[j], e->c->n_vocab);
    return 0;
}

/* Which rows of a sequence its output reads from the last layer: all, or one (the last layer
 * then finishes that row alone, forward_pass's n_keep). */
enum { ROW_ALL, ROW_FIRST, ROW_LAST };

/* What a batch's sequences become once their pass has run: an embedding (pool_rows), or the
 * classification head's logits; rows [r0, r1) are the sequence's, or its one kept row. */
typedef void (*seq_out_fn)(const struct kwk_encoder *e, int r0, int r1, float *out);

/* y[n] = w[n][d] x[d] + b (b may be NULL), each dot product summed in double and rounded once,
 * so the float result is within a rounding of PyTorch's whatever its order. */
static void head_linear(float *y, const float *w, const float *b, const float *x, int n, int d)
{
    for (int o = 0; o < n; o++) {
        const float *wr = w + (size_t)o * d;
        double s = 0.0;
        for (int i = 0; i < d; i++)
            s += (double)wr[i] * x[i];
        y[o] = b ? (float)s + b[o] : (float)s;
    }
}

/* The head on the sequence's first token: tanh(dense x + b), then out_w that + out_b. */
static void classify_out(const struct kwk_encoder *e, int r0, int r1, float *out)
{
    (void)r1;
    const struct kwk_model *m = e->m;
    int d = e->c->d_model;
    const float *x = e->x + (size_t)r0 * d;
    if (m->head_dense_w) {
        float *h = e->tmp; /* free once the pass is done; the pooled rows are read from x */
        head_linear(h, m->head_dense_w, m->head_dense_b, x, d, d);
        for (int i = 0; i < d; i++)
            h[i] = tanhf(h[i]);
        x = h;
    }
    head_linear(out, m->head_out_w, m->head_out_b, x, e->c->n_labels, d);
}

/* Checks every sequence, then runs them in passes of whole sequences, writing width floats a
 * sequence to out. */
static int run_seqs(kwk_encoder *e, const int32_t *ids, const int32_t *types, const int32_t *offs,
                    int n_seqs, float *out, int width, seq_out_fn fn, int one_row,
                    struct kwk_err *err)
{
    if (n_seqs > 0 && offs[0] != 0)
        return kwk_err_set(err, KWK_EARG, "offs[0] is %d, not 0", (int)offs[0]);
    for (int i = 0; i < n_seqs; i++) {
        if (offs[i + 1] < offs[i])
            return kwk_err_set(err, KWK_EARG, "offs[%d] < offs[%d]", i + 1, i);
        int rc = check_seq(e, ids + offs[i], offs[i + 1] - offs[i], i, err);
        if (rc)
            return rc;
        for (int j = offs[i]; types && j < offs[i + 1]; j++)
            if (types[j] < 0 || types[j] >= e->c->n_types)
                return kwk_err_set(err, KWK_ERANGE, "sequence %d: token %d has type id %d; the "
                                   "model has %d token types", i, j - offs[i], (int)types[j],
                                   e->c->n_types);
    }
    for (int s0 = 0; s0 < n_seqs;) {
        /* the next pass: whole sequences while they fit (one always does: n_batch >= the
         * longest a sequence may be) */
        int s1 = s0, rows = 0;
        while (s1 < n_seqs && rows + (offs[s1 + 1] - offs[s1]) <= e->n_batch) {
            int len = offs[s1 + 1] - offs[s1];
            set_sequence(e, rows, rows + len);
            if (one_row != ROW_ALL)
                e->keep[s1 - s0] = one_row == ROW_FIRST ? rows : rows + len - 1;
            rows += len;
            s1++;
        }
        int n_keep = one_row != ROW_ALL ? s1 - s0 : 0;
        forward_pass(e, ids + offs[s0], types ? types + offs[s0] : NULL, rows, n_keep);
        for (int s = s0, r = 0; s < s1; s++) {
            int len = offs[s + 1] - offs[s];
            if (n_keep)
                fn(e, s - s0, s - s0 + 1, out + (size_t)s * width); /* its kept row */
            else
                fn(e, r, r + len, out + (size_t)s * width);
            r += len;
        }
        s0 = s1;
    }
    return 0;
}

int kwk_encoder_embed(kwk_encoder *e, const int32_t *ids, const int32_t *offs, int n_seqs,
                      float *out, struct kwk_err *err)
{
    if (!e || n_seqs < 0 || (n_seqs > 0 && (!ids || !offs || !out)))
        return kwk_err_set(err, KWK_EARG, "kwk_encoder_embed: bad arguments");
    int one_row = e->pooling == KWK_POOLING_CLS    ? ROW_FIRST
                  : e->pooling == KWK_POOLING_LAST ? ROW_LAST
                                                   : ROW_ALL;
    return run_seqs(e, ids, NULL, offs, n_seqs, out, e->c->d_model, pool_rows, one_row, err);
}

int kwk_encoder_classify(kwk_encoder *e, const int32_t *ids, const int32_t *types,
                         const int32_t *offs, int n_seqs, float *out, struct kwk_err *err)
{
    if (!e || n_seqs < 0 || (n_seqs > 0 && (!ids || !offs || !out)))
        return kwk_err_set(err, KWK_EARG, "kwk_encoder_classify: bad arguments");
    if (!e->c->cls_head || !e->m->head_out_w)
        return kwk_err_set(err, KWK_EUNSUPPORTED, "%s has no classification head (a "
                           "*ForSequenceClassification checkpoint, or a GGUF of pooling_type "
                           "4): it gives embeddings, not scores", e->m->path);
    /* a model of one token type (RoBERTa, XLM-R) has no segments: a pair's type ids, which a
     * tokenizer of BERT's family gives it, all read as 0, as llama.cpp sends them */
    if (e->c->n_types == 1)
        types = NULL;
    return run_seqs(e, ids, types, offs, n_seqs, out, e->c->n_labels, classify_out, ROW_FIRST,
                    err);
}

int kwk_encoder_n_labels(const kwk_encoder *e)
{
    return e ? e->c->n_labels : 0;
}

int kwk_encoder_states(kwk_encoder *e, const int32_t *ids, int n, float *out, struct kwk_err *err)
{
    if (!e || (n > 0 && (!ids || !out)))
        return kwk_err_set(err, KWK_EARG, "kwk_encoder_states: bad arguments");
    int rc = check_seq(e, ids, n, 0, err);
    if (rc)
        return rc;
    set_sequence(e, 0, n);
    forward_pass(e, ids, NULL, n, 0);
    memcpy(out, e->x, sizeof(float) * (size_t)n * (size_t)e->c->d_model);
    return 0;
}

int kwk_encoder_dim(const kwk_encoder *e)
{
    return e ? e->c->d_model : 0;
}

int kwk_encoder_max_tokens(const kwk_encoder *e)
{
    return e ? e->max_tokens : 0;
}

int kwk_encoder_pooling(const kwk_encoder *e)
{
    return e ? e->pooling : 0;
}

int kwk_encoder_normalize(const kwk_encoder *e)
{
    return e ? e->normalize : 0;
}

/* ---- construction -------------------------------------------------------------------------- */

/* Every layer matrix packed into wtype (a quantized format), from the model's floats. */
static int pack_layers(struct kwk_encoder *e, int wtype, int act8, struct kwk_err *err)
{
    const struct kwk_config *c = e->c;
    e->packed_layers = kwk_calloc((size_t)c->n_layers, sizeof *e->packed_layers);
    e->packed_data = kwk_calloc((size_t)c->n_layers * 6, sizeof *e->packed_data);
    if (!e->packed_layers || !e->packed_data)
        return kwk_err_set(err, -ENOMEM, "out of memory packing the encoder");
    for (int L = 0; L < c->n_layers; L++) {
        const struct kwk_enc_layer *src = &e->m->enc_layers[L];
        struct kwk_enc_layer *dst = &e->packed_layers[L];
        *dst = *src; /* biases and norms are the model's */
        const struct kwk_mat *from[6] = {&src->wq, &src->wk,   &src->wv,
                                         &src->wo, &src->w_up, &src->w_down};
        struct kwk_mat *to[6] = {&dst->wq, &dst->wk, &dst->wv, &dst->wo, &dst->w_up, &dst->w_down};
        for (int j = 0; j < 6; j++) {
            size_t bytes;
            int rc = kwk_quant_bytes(wtype, from[j]->rows, from[j]->cols, &bytes);
            if (rc)
                return kwk_err_set(err, KWK_ELIMIT, "a matrix too large to pack");
            void *data = kwk_malloc_aligned(bytes);
            if (!data)
                return kwk_err_set(err, -ENOMEM, "out of memory packing the encoder");
            e->packed_data[e->n_packed++] = data;
            *to[j] = (struct kwk_mat){
                .wtype = wtype, .rows = from[j]->rows, .cols = from[j]->cols, .data = data};
            if ((rc = kwk_packed_mat(e->m, from[j], to[j], e->pool, err)))
                return rc;
            to[j]->act8 = act8;
        }
    }
    e->layers = e->packed_layers;
    e->qact_cols = KWK_MAX((int64_t)c->d_model, (int64_t)c->d_ff);
    e->qact_mem = kwk_malloc_aligned(kwk_qact_bytes(e->qact_cols, e->n_batch));
    if (!e->qact_mem)
        return kwk_err_set(err, -ENOMEM, "out of memory for the encoder's activations");
    return 0;
}

static int alloc_scratch(struct kwk_encoder *e)
{
    const struct kwk_config *c = e->c;
    size_t nb = (size_t)e->n_batch, d = (size_t)c->d_model;
    struct kwk_attn_args shape = {.head_dim = c->head_dim,
                                  .n_heads = c->n_heads,
                                  .n_kv_heads = c->n_heads,
                                  .ld_pos = c->d_model,
                                  .ld_head = c->head_dim};
    e->scores_per_thread = kwk_attn_scratch_floats(&shape, c->max_position);
    float **bufs[] = {&e->x, &e->q, &e->kx, &e->vx, &e->att, &e->tmp};
    for (size_t i = 0; i < KWK_ARRAY_LEN(bufs); i++)
        if (!(*bufs[i] = kwk_malloc_aligned(sizeof(float) * nb * d)))
            return -ENOMEM;
    e->up = kwk_malloc_aligned(sizeof(float) * nb * (size_t)c->d_ff);
    e->scores = kwk_malloc_aligned(sizeof(float) * e->scores_per_thread * (size_t)e->n_threads);
    e->k_rows = kwk_calloc(nb, sizeof *e->k_rows);
    e->v_rows = kwk_calloc(nb, sizeof *e->v_rows);
    e->first = kwk_calloc(nb, sizeof *e->first);
    e->last = kwk_calloc(nb, sizeof *e->last);
    e->pos = kwk_calloc(nb, sizeof *e->pos);
    e->keep = kwk_calloc(nb, sizeof *e->keep);
    if (!e->up || !e->scores || !e->k_rows || !e->v_rows || !e->first || !e->last || !e->pos ||
        !e->keep)
        return -ENOMEM;
    return 0;
}

kwk_encoder *kwk_encoder_new(const kwk_model *m, const struct kwk_encoder_params *p,
                             struct kwk_err *err)
{
    struct kwk_encoder_params defaults;
    if (!p) {
        kwk_encoder_params_init(&defaults);
        p = &defaults;
    }
    if (!m) {
        kwk_err_set(err, KWK_EARG, "no model");
        return NULL;
    }
    const struct kwk_config *c = &m->cfg;
    if (!c->encoder) {
        kwk_err_set(err, KWK_EUNSUPPORTED,
                    "%s is a decoder (%s), not an encoder: it generates "
                    "tokens (kwk_decoder_new), it makes no embeddings",
                    m->path, c->arch_name);
        return NULL;
    }
    if (p->precision < KWK_PRECISION_PRESERVE || p->precision > KWK_PRECISION_INT4 ||
        (p->act_bits != 0 && p->act_bits != 8 && p->act_bits != 16) ||
        (p->act_bits == 8 && p->precision == KWK_PRECISION_PRESERVE) || p->n_threads < 0 ||
        p->n_threads > 1024 || p->pooling < -1 || p->pooling > KWK_POOLING_MEAN_SQRT_LEN ||
        p->pooling == KWK_POOLING_NONE || p->normalize < -1 || p->normalize > 1 ||
        p->batch_tokens < 0 || p->batch_tokens > ENC_MAX_BATCH || p->max_tokens < 0 ||
        p->max_tokens > c->max_position) {
        kwk_err_set(err, KWK_EARG,
                    "encoder params out of range (precision %d, act_bits %d: 8 "
                    "only for balanced / int4, threads %d, pooling %d, normalize %d, "
                    "batch_tokens %d, max_tokens %d: at most the model's %d positions)",
                    p->precision, p->act_bits, p->n_threads, p->pooling, p->normalize,
                    p->batch_tokens, p->max_tokens, c->max_position);
        return NULL;
    }
    if (c->max_position > ENC_MAX_BATCH) {
        kwk_err_set(err, KWK_ELIMIT,
                    "%s: max_position_embeddings %d is more than an encoder "
                    "pass holds (%d)",
                    m->path, c->max_position, ENC_MAX_BATCH);
        return NULL;
    }
    struct kwk_encoder *e = kwk_calloc(1, sizeof *e);
    if (!e) {
        kwk_err_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    e->m = m;
    e->c = c;
    e->k = kwk_kernels();
    e->ak = kwk_attn_kernel();
    e->n_threads = p->n_threads ? p->n_threads : kwk_default_threads();
    e->n_batch = KWK_MAX(p->batch_tokens ? p->batch_tokens : ENC_DEFAULT_BATCH, c->max_position);
    e->pooling = p->pooling >= 0 ? p->pooling : c->pooling;
    e->normalize = p->normalize >= 0 ? p->normalize : c->normalize;
    e->max_tokens = p->max_tokens ? p->max_tokens : kwk_config_max_tokens(c);
    e->layers = m->enc_layers;
    e->pool = kwk_pool_new(e->n_threads);
    if (!e->pool || alloc_scratch(e)) {
        kwk_err_set(err, -ENOMEM, "out of memory for an encoder of %d tokens a pass", e->n_batch);
        goto fail;
    }
    if (p->precision == KWK_PRECISION_PRESERVE) {
        /* the model's float matrices run as they are: made now if the model makes them on
         * demand (a quantized GGUF), held for the encoder's life */
        if (kwk_model_floats_acquire(m, err))
            goto fail;
        e->holds_floats = 1;
    } else {
        int wtype = p->precision == KWK_PRECISION_BALANCED ? KWK_W_Q8 : KWK_W_Q4;
        if (pack_layers(e, wtype, p->act_bits == 8, err))
            goto fail;
        kwk_model_release_pages(m); /* the pack is what runs (the word table faults back) */
    }
    return e;
fail:
    kwk_encoder_free(e);
    return NULL;
}

void kwk_encoder_free(kwk_encoder *e)
{
    if (!e)
        return;
    kwk_pool_free(e->pool);
    if (e->holds_floats)
        kwk_model_floats_release(e->m);
    for (int i = 0; i < e->n_packed; i++)
        kwk_free_aligned(e->packed_data[i]);
    kwk_free(e->packed_data);
    kwk_free(e->packed_layers);
    kwk_free_aligned(e->qact_mem);
    float *bufs[] = {e->x, e->q, e->kx, e->vx, e->att, e->tmp, e->up, e->scores};
    for (size_t i = 0; i < KWK_ARRAY_LEN(bufs); i++)
        kwk_free_aligned(bufs[i]);
    kwk_free(e->k_rows);
    kwk_free(e->v_rows);
    kwk_free(e->first);
    kwk_free(e->last);
    kwk_free(e->pos);
    kwk_free(e->keep);
    kwk_free(e);
}
