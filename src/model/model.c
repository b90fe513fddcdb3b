/* model.c - assembling a model from a folder of safetensors or one GGUF file: every expected
 * tensor found, shape-checked and viewed (or widened / dequantized, at load or on demand) as the
 * runtime wants it. kwk_model_load runs on the caller's thread; a loaded model is shareable
 * across threads (its float copies made on demand are guarded by the model's lock). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"

#define INDEX_JSON_MAX ((size_t)64 << 20)

/* The state of one load: the model being filled and where errors go. */
struct loader {
    struct kwk_model *m;
    int gguf;        /* tensor names in llama.cpp style */
    int permute_qk;  /* undo llama.cpp's row permutation of attn_q / attn_k */
    int lazy;        /* copies on demand: record them in m->lazy instead of making them */
    struct kwk_err *err;
};

static int model_own(struct kwk_model *m, void *p)
{
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **n = kwk_realloc(m->owned, sizeof *n * (size_t)cap);
        if (!n)
            return -ENOMEM;
        m->owned = n;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

/* An owned buffer of bytes bytes, 64-byte aligned (freed with the model); NULL with the error
 * set when out of memory. */
static void *own_bytes(struct loader *ld, size_t bytes)
{
    void *p = kwk_malloc_aligned(bytes ? bytes : 64);
    if (!p || model_own(ld->m, p)) {
        kwk_free_aligned(p);
        kwk_err_set(ld->err, -ENOMEM, "%s: out of memory (%zu bytes)", ld->m->path, bytes);
        return NULL;
    }
    return p;
}

/* An owned float buffer of n elements (freed with the model). */
static float *own_floats(struct loader *ld, int64_t n)
{
    size_t bytes;
    if (n < 0 || kwk_mul_size((size_t)n, sizeof(float), &bytes)) {
        kwk_err_set(ld->err, KWK_ELIMIT, "%s: tensor too large", ld->m->path);
        return NULL;
    }
    return own_bytes(ld, bytes);
}

/* Find a tensor by name in the shards or the GGUF file; *file names the file holding it. */
static const struct kwk_tensor_ref *find_tensor(const struct kwk_model *m, const char *name,
                                                const char **file)
{
    if (m->gguf) {
        for (int i = 0; i < m->gguf->n_tensors; i++)
            if (!strcmp(m->gguf->tensors[i].name, name)) {
                *file = m->gguf->path;
                return &m->gguf->tensors[i];
            }
        return NULL;
    }
    for (int s = 0; s < m->n_st; s++)
        for (int i = 0; i < m->st[s].n_tensors; i++)
            if (!strcmp(m->st[s].tensors[i].name, name)) {
                *file = m->st[s].path;
                return &m->st[s].tensors[i];
            }
    return NULL;
}

static void fmt_shape(char *buf, size_t cap, int n_dims, const int64_t *shape)
{
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int i = 0; i < n_dims && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

/* Look a tensor up and check its shape against what the config needs. */
static const struct kwk_tensor_ref *want_tensor(struct loader *ld, const char *name, int n_dims,
                                                int64_t d0, int64_t d1, int optional, int *rc)
{
    const char *file = NULL;
    const struct kwk_tensor_ref *t = find_tensor(ld->m, name, &file);
    *rc = 0;
    if (!t) {
        for (int s = 0; s < ld->m->n_st; s++)
            for (int i = 0; i < ld->m->st[s].n_unrun; i++)
                if (!strcmp(ld->m->st[s].unrun[i], name)) {
                    *rc = kwk_err_set(ld->err, KWK_EUNSUPPORTED, "%s: tensor %s has a type Kwker "
                                      "does not run (supported: F32, F16, BF16)", ld->m->st[s].path,
                                      name);
                    return NULL;
                }
        if (!optional)
            *rc = kwk_err_set(ld->err, KWK_ENOTFOUND, "%s: %s is missing", ld->m->path, name);
        return NULL;
    }
    int64_t want[2] = {d0, d1};
    if (t->n_dims != n_dims || t->shape[0] != d0 || (n_dims == 2 && t->shape[1] != d1)) {
        char have_s[96], want_s[96];
        fmt_shape(have_s, sizeof have_s, t->n_dims, t->shape);
        fmt_shape(want_s, sizeof want_s, n_dims, want);
        *rc = kwk_err_set(ld->err, KWK_EFORMAT, "%s: %s: shape %s but config needs %s", file,
                          name, have_s, want_s);
        return NULL;
    }
    return t;
}

/* A 1-D tensor (norm weight, bias) as an owned float32 array; NULL when optional and absent. */
static int get_vec(struct loader *ld, const char *name, int64_t n, int optional, float **out)
{
    int rc;
    *out = NULL;
    const struct kwk_tensor_ref *t = want_tensor(ld, name, 1, n, 0, optional, &rc);
    if (!t)
        return rc;
    float *v = own_floats(ld, n);
    if (!v)
        return ld->err ? ld->err->code : -ENOMEM;
    kwk_dequant_row(t->dtype, t->data, v, n);
    *out = v;
    return 0;
}

static int plain_wtype(int dtype)
{
    switch (dtype) {
    case KWK_DT_F32: return KWK_W_F32;
    case KWK_DT_F16: return KWK_W_F16;
    case KWK_DT_BF16: return KWK_W_BF16;
    default: return -1;
    }
}

/* Where stored row r goes with n_head > 0: llama.cpp stored row (h, i, j) of head h what
 * Hugging Face has at (h, j, i), i < head_dim/2, j in {0, 1}. */
static int64_t hf_row(int64_t r, int64_t rows, int n_head)
{
    if (n_head <= 0)
        return r;
    int64_t per_head = rows / n_head, h = r / per_head, k = r % per_head;
    return h * per_head + (k % 2) * (per_head / 2) + k / 2;
}

/* Dequantize (or widen) tensor t, [rows][cols], into w; with n_head > 0, rows come back in
 * Hugging Face order (hf_row). */
static void dequant_into(const struct kwk_tensor_ref *t, int64_t rows, int64_t cols, int n_head,
                         float *w)
{
    size_t rb = kwk_dtype_row_bytes(t->dtype, cols);
    for (int64_t r = 0; r < rows; r++)
        kwk_dequant_row(t->dtype, t->data + (size_t)r * rb,
                        w + (size_t)hf_row(r, rows, n_head) * (size_t)cols, cols);
}

/* The type of t's copy: its own when plain (f32 / f16 / bf16: moving whole rows is exact in any
 * type, so a bf16 GGUF's permuted q / k stay bf16, half the bytes of float32, and preserve's bf16
 * panels, which want every matrix bf16, apply), else float32. */
static int copy_wtype(const struct kwk_tensor_ref *t)
{
    int wt = plain_wtype(t->dtype);
    return wt >= 0 ? wt : KWK_W_F32;
}

/* Bytes of a [rows][cols] copy of type wt (a plain one); -1 when they overflow. */
static int copy_bytes(int wt, int64_t rows, int64_t cols, size_t *bytes)
{
    size_t total;
    if (rows < 0 || cols < 0 || kwk_mul_size((size_t)rows, (size_t)cols, &total) ||
        total > (size_t)INT64_MAX || kwk_mul_size(total, wt == KWK_W_F32 ? 4 : 2, bytes))
        return -1;
    return 0;
}

/* Fill dst, t's copy in copy_wtype(t), rows in Hugging Face order. */
static void fill_copy(const struct kwk_tensor_ref *t, int64_t rows, int64_t cols, int n_head,
                      void *dst)
{
    if (plain_wtype(t->dtype) < 0) {
        dequant_into(t, rows, cols, n_head, dst);
        return;
    }
    size_t rb = kwk_dtype_row_bytes(t->dtype, cols);
    for (int64_t r = 0; r < rows; r++)
        memcpy((uint8_t *)dst + (size_t)hf_row(r, rows, n_head) * rb, t->data + (size_t)r * rb,
               rb);
}

/* Record a matrix made on demand: out says its type and shape (data NULL until acquired). */
static int lazy_mat(struct loader *ld, const struct kwk_tensor_ref *t, int64_t rows, int64_t cols,
                    int n_head, struct kwk_mat *out)
{
    struct kwk_model *m = ld->m;
    size_t bytes;
    if (copy_bytes(copy_wtype(t), rows, cols, &bytes))
        return kwk_err_set(ld->err, KWK_ELIMIT, "%s: %s too large", m->path, t->name);
    /* the matrices live in m->layers (allocated once) and in m itself: pointers stay valid */
    struct kwk_lazy_mat *n = kwk_realloc(m->lazy, sizeof *n * (size_t)(m->n_lazy + 1));
    if (!n)
        return kwk_err_set(ld->err, -ENOMEM, "%s: out of memory", m->path);
    m->lazy = n;
    m->lazy[m->n_lazy++] = (struct kwk_lazy_mat){.mat = out, .t = t, .n_head = n_head};
    out->wtype = copy_wtype(t);
    out->rows = rows;
    out->cols = cols;
    out->data = NULL;
    return 0;
}

/* Remember the file's type of out, a copy of a tensor of that type: a float32 copy no longer
 * says whether it came from 4 or 8 bits, which int4's packing asks (kwk_model_mat_dtype). */
static int note_src(struct loader *ld, const struct kwk_mat *out,
                    const struct kwk_tensor_ref *t, int n_head)
{
    struct kwk_model *m = ld->m;
    struct kwk_mat_src *n = kwk_realloc(m->srcs, sizeof *n * (size_t)(m->n_srcs + 1));
    if (!n)
        return kwk_err_set(ld->err, -ENOMEM, "%s: out of memory", m->path);
    m->srcs = n;
    m->srcs[m->n_srcs++] =
        (struct kwk_mat_src){.mat = out, .dtype = t->dtype, .t = t, .n_head = n_head};
    return 0;
}

/* A copy of t owned by the model (or, lazy, recorded for later): in t's own type when plain,
 * else float32 (copy_wtype). */
static int copy_mat(struct loader *ld, const struct kwk_tensor_ref *t, int64_t rows,
                    int64_t cols, int n_head, struct kwk_mat *out)
{
    size_t bytes;
    int rc = note_src(ld, out, t, n_head);
    if (rc)
        return rc;
    if (ld->lazy)
        return lazy_mat(ld, t, rows, cols, n_head, out);
    if (copy_bytes(copy_wtype(t), rows, cols, &bytes))
        return kwk_err_set(ld->err, KWK_ELIMIT, "%s: %s too large", ld->m->path, t->name);
    void *w = own_bytes(ld, bytes);
    if (!w)
        return ld->err ? ld->err->code : -ENOMEM;
    fill_copy(t, rows, cols, n_head, w);
    out->wtype = copy_wtype(t);
    out->rows = rows;
    out->cols = cols;
    out->data = w;
    return 0;
}

/* A weight matrix [rows][cols]: borrowed from the mapping when the kernels can read it in place,
 * otherwise a copy (copy_mat). n_head > 0 asks to undo llama.cpp's q/k permutation. */
static int get_mat(struct loader *ld, const char *name, int64_t rows, int64_t cols, int n_head,
                   int optional, struct kwk_mat *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    const struct kwk_tensor_ref *t = want_tensor(ld, name, 2, rows, cols, optional, &rc);
    if (!t)
        return rc;
    if (n_head > 0 && (rows % n_head != 0 || (rows / n_head) % 2 != 0))
        return kwk_err_set(ld->err, KWK_EFORMAT, "%s: %s: %lld rows do not split into %d heads "
                           "of pairs", ld->m->path, name, (long long)rows, n_head);
    int wt = plain_wtype(t->dtype);
    size_t esize = wt >= 0 ? kwk_dtype_block_bytes(t->dtype) : 0;
    /* Misaligned plain data (odd safetensors header lengths) is copied: kernels load whole
     * elements. */
    if (wt >= 0 && n_head == 0 && (uintptr_t)t->data % esize == 0) {
        out->wtype = wt;
        out->rows = rows;
        out->cols = cols;
        out->data = t->data;
        return 0;
    }
    return copy_mat(ld, t, rows, cols, n_head, out);
}

/* ---- the architecture's tensors ------------------------------------------------------------*/

/* Gemma's norms scale by 1 + w, computed in float32 as transformers does: adding the 1 once at
 * load gives the same floats. */
static void norm_add_one(float *w, int64_t n)
{
    for (int64_t i = 0; w && i < n; i++)
        w[i] = 1.0f + w[i];
}

static int load_layer(struct loader *ld, int i, struct kwk_layer *L)
{
    const struct kwk_config *c = &ld->m->cfg;
    int64_t d = c->d_model, q = (int64_t)c->n_heads * c->head_dim;
    int64_t kv = (int64_t)c->n_kv_heads * c->head_dim, ff = c->d_ff;
    int pq = ld->permute_qk ? c->n_heads : 0, pk = ld->permute_qk ? c->n_kv_heads : 0;
    char n[14][96];
    if (ld->gguf) {
        static const char *const g[14] = {
            "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
            "attn_output.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
            "attn_q_norm.weight", "attn_k_norm.weight", "ffn_norm.weight", "ffn_gate.weight",
            "ffn_up.weight", "ffn_down.weight"};
        for (int k = 0; k < 14; k++)
            snprintf(n[k], sizeof n[k], "blk.%d.%s", i, g[k]);
    } else {
        static const char *const h[14] = {
            "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
            "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.bias",
            "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.q_norm.weight",
            "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
            "mlp.up_proj.weight", "mlp.down_proj.weight"};
        for (int k = 0; k < 14; k++)
            snprintf(n[k], sizeof n[k], "model.layers.%d.%s", i, h[k]);
        if (c->post_norms) /* the FFN's input norm */
            snprintf(n[10], sizeof n[10], "model.layers.%d.pre_feedforward_layernorm.weight", i);
    }
    int rc;
    if ((rc = get_vec(ld, n[0], d, 0, &L->attn_norm)) ||
        (rc = get_mat(ld, n[1], q, d, pq, 0, &L->wq)) ||
        (rc = get_mat(ld, n[2], kv, d, pk, 0, &L->wk)) ||
        (rc = get_mat(ld, n[3], kv, d, 0, 0, &L->wv)) ||
        (rc = get_mat(ld, n[4], d, q, 0, 0, &L->wo)))
        return rc;
    if (c->qkv_bias && ((rc = get_vec(ld, n[5], q, 0, &L->bq)) ||
                        (rc = get_vec(ld, n[6], kv, 0, &L->bk)) ||
                        (rc = get_vec(ld, n[7], kv, 0, &L->bv))))
        return rc;
    if (c->qk_norm && ((rc = get_vec(ld, n[8], c->head_dim, 0, &L->q_norm)) ||
                       (rc = get_vec(ld, n[9], c->head_dim, 0, &L->k_norm))))
        return rc;
    if ((rc = get_vec(ld, n[10], d, 0, &L->ffn_norm)) ||
        (rc = get_mat(ld, n[11], ff, d, 0, 0, &L->w_gate)) ||
        (rc = get_mat(ld, n[12], ff, d, 0, 0, &L->w_up)) ||
        (rc = get_mat(ld, n[13], d, ff, 0, 0, &L->w_down)))
        return rc;
    if (ld->permute_qk && c->qkv_bias)
        return kwk_err_set(ld->err, KWK_EUNSUPPORTED, "%s: biases with permuted q/k rows",
                           ld->m->path);
    if (c->post_norms) {
        /* Gemma 3: around each block an input norm and an output norm; its pre_feedforward
         * norm is what the index above named the FFN norm */
        char pa[96], pf[96];
        snprintf(pa, sizeof pa, ld->gguf ? "blk.%d.post_attention_norm.weight"
                                         : "model.layers.%d.post_attention_layernorm.weight", i);
        snprintf(pf, sizeof pf, ld->gguf ? "blk.%d.post_ffw_norm.weight"
                                         : "model.layers.%d.post_feedforward_layernorm.weight", i);
        if ((rc = get_vec(ld, pa, d, 0, &L->post_attn_norm)) ||
            (rc = get_vec(ld, pf, d, 0, &L->post_ffn_norm)))
            return rc;
    }
    if (c->norm_plus_one) {
        float *v[] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm, L->post_attn_norm,
                      L->post_ffn_norm};
        int64_t len[] = {d, d, c->head_dim, c->head_dim, d, d};
        for (size_t k = 0; k < KWK_ARRAY_LEN(v); k++)
            norm_add_one(v[k], len[k]);
    }
    return 0;
}

/* ---- encoders (BERT) ----------------------------------------------------------------------- */

/* A small 2-D table (positions, token types) as owned float32 rows. */
static int get_table(struct loader *ld, const char *name, int64_t rows, int64_t cols,
                     float **out)
{
    int rc;
    const struct kwk_tensor_ref *t = want_tensor(ld, name, 2, rows, cols, 0, &rc);
    if (!t)
        return rc;
    float *v = own_floats(ld, rows * cols);
    if (!v)
        return ld->err ? ld->err->code : -ENOMEM;
    size_t row_bytes = kwk_dtype_row_bytes(t->dtype, cols);
    if (!row_bytes)
        return kwk_err_set(ld->err, KWK_EFORMAT, "%s: %s: rows of %lld do not split into %s "
                           "blocks", ld->m->path, name, (long long)cols,
                           kwk_dtype_name(t->dtype));
    for (int64_t r = 0; r < rows; r++)
        kwk_dequant_row(t->dtype, t->data + (size_t)r * row_bytes, v + r * cols, cols);
    *out = v;
    return 0;
}

/* Tensor names of one BERT layer: Hugging Face's (under prefix) or llama.cpp's. */
enum { EN_Q, EN_K, EN_V, EN_O, EN_ALN, EN_UP, EN_DOWN, EN_FLN, EN_COUNT };

static void enc_names(const struct loader *ld, const char *prefix, int i,
                      char n[EN_COUNT][128])
{
    static const char *const g[EN_COUNT] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                            "attn_output_norm", "ffn_up", "ffn_down",
                                            "layer_output_norm"};
    static const char *const h[EN_COUNT] = {
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
        "output.dense", "output.LayerNorm"};
    for (int k = 0; k < EN_COUNT; k++) {
        if (ld->gguf)
            snprintf(n[k], sizeof n[k], "blk.%d.%s", i, g[k]);
        else
            snprintf(n[k], sizeof n[k], "%sencoder.layer.%d.%s", prefix, i, h[k]);
    }
}

/* Matrix base.weight [rows][cols] and its bias base.bias [rows]. */
static int get_linear(struct loader *ld, const char *base, int64_t rows, int64_t cols,
                      struct kwk_mat *w, float **b)
{
    char wn[160], bn[160];
    snprintf(wn, sizeof wn, "%s.weight", base);
    snprintf(bn, sizeof bn, "%s.bias", base);
    int rc = get_mat(ld, wn, rows, cols, 0, 0, w);
    return rc ? rc : get_vec(ld, bn, rows, 0, b);
}

/* LayerNorm base.weight and base.bias [n]. */
static int get_layernorm(struct loader *ld, const char *base, int64_t n, float **w, float **b)
{
    char wn[160], bn[160];
    snprintf(wn, sizeof wn, "%s.weight", base);
    snprintf(bn, sizeof bn, "%s.bias", base);
    int rc = get_vec(ld, wn, n, 0, w);
    return rc ? rc : get_vec(ld, bn, n, 0, b);
}

static int load_enc_layer(struct loader *ld, const char *prefix, int i, struct kwk_enc_layer *L)
{
    const struct kwk_config *c = &ld->m->cfg;
    int64_t d = c->d_model, ff = c->d_ff;
    char n[EN_COUNT][128];
    enc_names(ld, prefix, i, n);
    int rc;
    if ((rc = get_linear(ld, n[EN_Q], d, d, &L->wq, &L->bq)) ||
        (rc = get_linear(ld, n[EN_K], d, d, &L->wk, &L->bk)) ||
        (rc = get_linear(ld, n[EN_V], d, d, &L->wv, &L->bv)) ||
        (rc = get_linear(ld, n[EN_O], d, d, &L->wo, &L->bo)) ||
        (rc = get_layernorm(ld, n[EN_ALN], d, &L->attn_ln, &L->attn_ln_b)) ||
        (rc = get_linear(ld, n[EN_UP], ff, d, &L->w_up, &L->b_up)) ||
        (rc = get_linear(ld, n[EN_DOWN], d, ff, &L->w_down, &L->b_down)))
        return rc;
    return get_layernorm(ld, n[EN_FLN], d, &L->ffn_ln, &L->ffn_ln_b);
}

/* A [rows][cols] float table whose row count the tensor decides (a classifier's labels):
 * 2-D, cols wide, 1 to 65536 rows. 0 rows when optional and absent. */
static int get_head_rows(struct loader *ld, const char *name, int64_t cols, int optional,
                         int64_t *rows)
{
    const char *file = NULL;
    const struct kwk_tensor_ref *t = find_tensor(ld->m, name, &file);
    *rows = 0;
    if (!t) {
        int rc;
        want_tensor(ld, name, 2, 1, cols, optional, &rc); /* its missing / unrun message */
        return rc;
    }
    if (t->n_dims != 2 || t->shape[1] != cols || t->shape[0] < 1 || t->shape[0] > 65536)
        return kwk_err_set(ld->err, KWK_EFORMAT, "%s: %s: a classifier's matrix must be "
                           "[labels (1 to 65536)][%lld]", file, name, (long long)cols);
    *rows = t->shape[0];
    return 0;
}

/* The classification head of a cross-encoder: BERT's pooler then classifier, RoBERTa's
 * classifier.dense then classifier.out_proj (as transformers' *ForSequenceClassification), or
 * llama.cpp's cls then cls.output (a GGUF may lack cls and either bias, as llama.cpp's
 * loader allows; its rerankers of cls alone, with no cls.output, are not run). */
static int load_cls_head(struct loader *ld, const char *prefix)
{
    struct kwk_model *m = ld->m;
    struct kwk_config *c = &m->cfg;
    int64_t d = c->d_model, n_dense = 0, n_out = 0;
    const char *file;
    char dense[96], out[96], wn[112], bn[112];
    if (ld->gguf) {
        snprintf(dense, sizeof dense, "cls");
        snprintf(out, sizeof out, "cls.output");
    } else if (find_tensor(m, "classifier.out_proj.weight", &file)) {
        snprintf(dense, sizeof dense, "classifier.dense");
        snprintf(out, sizeof out, "classifier.out_proj");
    } else {
        snprintf(dense, sizeof dense, "%spooler.dense", prefix);
        snprintf(out, sizeof out, "classifier");
    }
    int rc;
    snprintf(wn, sizeof wn, "%s.weight", dense);
    if ((rc = get_head_rows(ld, wn, d, ld->gguf, &n_dense)))
        return rc;
    if (n_dense && n_dense != d)
        return kwk_err_set(ld->err, KWK_EFORMAT, "%s: %s is [%lld][%lld], not [%lld][%lld]",
                           m->path, wn, (long long)n_dense, (long long)d, (long long)d,
                           (long long)d);
    if (n_dense) {
        snprintf(bn, sizeof bn, "%s.bias", dense);
        if ((rc = get_table(ld, wn, d, d, &m->head_dense_w)) ||
            (rc = get_vec(ld, bn, d, ld->gguf, &m->head_dense_b)))
            return rc;
    }
    snprintf(wn, sizeof wn, "%s.weight", out);
    snprintf(bn, sizeof bn, "%s.bias", out);
    if ((rc = get_head_rows(ld, wn, d, 0, &n_out)) ||
        (rc = get_table(ld, wn, n_out, d, &m->head_out_w)) ||
        (rc = get_vec(ld, bn, n_out, ld->gguf, &m->head_out_b)))
        return rc;
    c->n_labels = (int)n_out;
    if (c->score_act < 0)
        c->score_act = c->n_labels == 1 ? KWK_SCORE_SIGMOID : KWK_SCORE_IDENTITY;
    m->n_params += (n_dense ? d * d : 0) + (m->head_dense_b ? d : 0) + n_out * d +
                   (m->head_out_b ? n_out : 0);
    return 0;
}

/* A BERT encoder: its tables, embedding LayerNorm and layers. Hugging Face's names come bare
 * (BertModel, RobertaModel) or under "bert." / "roberta." (the models with heads, whose own
 * tensors are not read). */
static int assemble_encoder(struct loader *ld)
{
    struct kwk_model *m = ld->m;
    const struct kwk_config *c = &m->cfg;
    const char *prefix = "";
    const char *file;
    static const char *const heads[] = {"bert.", "roberta."};
    for (size_t i = 0; !ld->gguf && i < KWK_ARRAY_LEN(heads); i++) {
        char name[64];
        snprintf(name, sizeof name, "%sembeddings.word_embeddings.weight", heads[i]);
        if (!find_tensor(m, "embeddings.word_embeddings.weight", &file) &&
            find_tensor(m, name, &file))
            prefix = heads[i];
    }
    char emb[128], pos[128], typ[128], ln[128];
    if (ld->gguf) {
        snprintf(emb, sizeof emb, "token_embd.weight");
        snprintf(pos, sizeof pos, "position_embd.weight");
        snprintf(typ, sizeof typ, "token_types.weight");
        snprintf(ln, sizeof ln, "token_embd_norm");
    } else {
        snprintf(emb, sizeof emb, "%sembeddings.word_embeddings.weight", prefix);
        snprintf(pos, sizeof pos, "%sembeddings.position_embeddings.weight", prefix);
        snprintf(typ, sizeof typ, "%sembeddings.token_type_embeddings.weight", prefix);
        snprintf(ln, sizeof ln, "%sembeddings.LayerNorm", prefix);
    }
    int rc;
    if ((rc = get_mat(ld, emb, c->n_vocab, c->d_model, 0, 0, &m->tok_emb)) ||
        (rc = get_table(ld, pos, (int64_t)c->max_position + c->pos_offset, c->d_model,
                        &m->pos_emb)) ||
        (rc = get_table(ld, typ, c->n_types, c->d_model, &m->type_emb)) ||
        (rc = get_layernorm(ld, ln, c->d_model, &m->emb_ln, &m->emb_ln_b)))
        return rc;
    m->pos_emb += (size_t)c->pos_offset * (size_t)c->d_model; /* rows before are never read */
    m->enc_layers = kwk_calloc((size_t)c->n_layers, sizeof *m->enc_layers);
    if (!m->enc_layers)
        return kwk_err_set(ld->err, -ENOMEM, "%s: out of memory", m->path);
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = load_enc_layer(ld, prefix, i, &m->enc_layers[i])))
            return rc;
    int64_t d = c->d_model, ff = c->d_ff;
    m->n_params = ((int64_t)c->n_vocab + c->max_position + c->n_types + 2) * d +
                  (int64_t)c->n_layers * (4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d);
    return c->cls_head ? load_cls_head(ld, prefix) : 0;
}

static int64_t mat_params(const struct kwk_mat *w)
{
    return w->rows * w->cols; /* absent optional matrices are all zero */
}

static void count_params(struct kwk_model *m)
{
    const struct kwk_config *c = &m->cfg;
    int64_t n = mat_params(&m->tok_emb) + c->d_model;
    if (!c->tie_embeddings)
        n += mat_params(&m->lm_head);
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    for (int i = 0; i < c->n_layers; i++) {
        const struct kwk_layer *L = &m->layers[i];
        n += 2 * (int64_t)c->d_model + mat_params(&L->wq) + mat_params(&L->wk) +
             mat_params(&L->wv) + mat_params(&L->wo) + mat_params(&L->w_gate) +
             mat_params(&L->w_up) + mat_params(&L->w_down);
        if (L->bq)
            n += q + 2 * kv;
        if (L->q_norm)
            n += 2 * (int64_t)c->head_dim;
        if (L->post_attn_norm)
            n += 2 * (int64_t)c->d_model;
    }
    m->n_params = n;
}

static int assemble(struct loader *ld)
{
    struct kwk_model *m = ld->m;
    const struct kwk_config *c = &m->cfg;
    int rc;
    if (c->encoder)
        return assemble_encoder(ld);
    m->layers = kwk_calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers)
        return kwk_err_set(ld->err, -ENOMEM, "%s: out of memory", m->path);
    const char *emb = ld->gguf ? "token_embd.weight" : "model.embed_tokens.weight";
    const char *norm = ld->gguf ? "output_norm.weight" : "model.norm.weight";
    const char *head = ld->gguf ? "output.weight" : "lm_head.weight";
    if ((rc = get_mat(ld, emb, c->n_vocab, c->d_model, 0, 0, &m->tok_emb)))
        return rc;
    for (int i = 0; i < c->n_layers; i++)
        if ((rc = load_layer(ld, i, &m->layers[i])))
            return rc;
    if ((rc = get_vec(ld, norm, c->d_model, 0, &m->out_norm)))
        return rc;
    if (c->norm_plus_one)
        norm_add_one(m->out_norm, c->d_model);
    if (c->tie_embeddings) {
        m->lm_head = m->tok_emb;
        for (int i = 0; i < m->n_lazy; i++)
            if (m->lazy[i].mat == &m->tok_emb)
                m->lazy[i].alias = &m->lm_head;
    } else if ((rc = get_mat(ld, head, c->n_vocab, c->d_model, 0, 0, &m->lm_head))) {
        if (rc == KWK_ENOTFOUND && ld->err)
            kwk_err_set(ld->err, rc, "%s: %s is missing (and the embeddings are not tied)",
                        m->path, head);
        return rc;
    }
    count_params(m);
    return 0;
}

/* ---- folders of safetensors ----------------------------------------------------------------*/

static int add_shard(struct kwk_model *m, const char *dir, const char *file, struct kwk_err *err)
{
    char path[4096];
    if (strstr(file, "..") || file[0] == '/')
        return kwk_err_set(err, KWK_EFORMAT, "%s: shard name \"%s\" leaves the folder", dir, file);
    if (kwk_path_join(path, sizeof path, dir, file))
        return kwk_err_set(err, KWK_ELIMIT, "%s: path too long", dir);
    for (int i = 0; i < m->n_st; i++)
        if (!strcmp(m->st[i].path, path))
            return 0;
    struct kwk_st_file *n = kwk_realloc(m->st, sizeof *n * (size_t)(m->n_st + 1));
    if (!n)
        return kwk_err_set(err, -ENOMEM, "%s: out of memory", dir);
    m->st = n;
    int rc = kwk_st_open(&m->st[m->n_st], path, err);
    if (rc == 0)
        m->n_st++;
    return rc;
}

/* The shards named by model.safetensors.index.json's weight_map. */
static int shards_from_index(struct kwk_model *m, const char *dir, const char *index,
                             struct kwk_err *err)
{
    char *text = NULL;
    size_t n = 0;
    int rc = kwk_read_file(index, INDEX_JSON_MAX, &text, &n, err);
    if (rc)
        return rc;
    json_error_t jerr;
    json_t *root = json_loadb(text, n, 0, &jerr);
    kwk_free(text);
    if (!root)
        return kwk_err_set_pos(err, KWK_EFORMAT, jerr.position, "%s: invalid JSON at line %d "
                               "column %d: %s", index, jerr.line, jerr.column, jerr.text);
    const json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        rc = kwk_err_set(err, KWK_EFORMAT, "%s: no \"weight_map\" object", index);
        goto out;
    }
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)wm, key, val) {
        if (!json_is_string(val)) {
            rc = kwk_err_set(err, KWK_EFORMAT, "%s: weight_map[\"%s\"] is not a file name", index,
                             key);
            goto out;
        }
        if ((rc = add_shard(m, dir, json_string_value(val), err)))
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int st_filter(const struct dirent *e)
{
    return e->d_name[0] != '.' && ends_with(e->d_name, ".safetensors");
}

static int open_shards(struct kwk_model *m, const char *dir, struct kwk_err *err)
{
    char path[4096];
    if (kwk_path_join(path, sizeof path, dir, "model.safetensors.index.json"))
        return kwk_err_set(err, KWK_ELIMIT, "%s: path too long", dir);
    if (kwk_file_exists(path))
        return shards_from_index(m, dir, path, err);
    if (kwk_path_join(path, sizeof path, dir, "model.safetensors") == 0 && kwk_file_exists(path))
        return add_shard(m, dir, "model.safetensors", err);
    struct dirent **list = NULL;
    int n = scandir(dir, &list, st_filter, alphasort), rc = 0;
    if (n < 0)
        return kwk_err_set(err, -errno, "%s: %s", dir, strerror(errno));
    for (int i = 0; i < n; i++) {
        if (rc == 0)
            rc = add_shard(m, dir, list[i]->d_name, err);
        free(list[i]);
    }
    free(list);
    if (rc == 0 && m->n_st == 0)
        rc = kwk_err_set(err, KWK_ENOTFOUND, "%s: no model.safetensors, "
                         "model.safetensors.index.json or *.safetensors file", dir);
    return rc;
}

static int load_folder(struct kwk_model *m, const char *dir, int lazy, struct kwk_err *err)
{
    int rc = kwk_config_load_dir(&m->cfg, dir, err);
    if (rc)
        return rc;
    if (m->cfg.unsupported[0])
        return kwk_err_set(err, KWK_EUNSUPPORTED, "%s: %s", dir, m->cfg.unsupported);
    if ((rc = open_shards(m, dir, err)))
        return rc;
    struct loader ld = {.m = m, .gguf = 0, .permute_qk = 0, .lazy = lazy, .err = err};
    return assemble(&ld);
}

static int load_gguf(struct kwk_model *m, const char *path, int lazy, struct kwk_err *err)
{
    m->gguf = kwk_calloc(1, sizeof *m->gguf);
    if (!m->gguf)
        return kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
    int rc = kwk_gguf_open(m->gguf, path, err);
    if (rc) {
        kwk_free(m->gguf);
        m->gguf = NULL;
        return rc;
    }
    if ((rc = kwk_config_from_gguf(&m->cfg, m->gguf, err)))
        return rc;
    if (m->cfg.unsupported[0])
        return kwk_err_set(err, KWK_EUNSUPPORTED, "%s: %s", path, m->cfg.unsupported);
    struct loader ld = {.m = m, .gguf = 1, .permute_qk = m->cfg.arch == KWK_ARCH_LLAMA,
                        .lazy = lazy, .err = err};
    return assemble(&ld);
}

/* The file and offset of the embedding table, for kwk_model_embed_row's reads; none (the
 * mapping is read instead) when the file cannot be opened again. */
static void open_emb_file(struct kwk_model *m)
{
    const char *file = NULL;
    const char *name = m->gguf ? "token_embd.weight" : "model.embed_tokens.weight";
    const struct kwk_tensor_ref *t = find_tensor(m, name, &file);
    const struct kwk_map *map = NULL;
    if (!t)
        return;
    if (m->gguf)
        map = &m->gguf->map;
    for (int i = 0; i < m->n_st; i++)
        if (!strcmp(m->st[i].path, file))
            map = &m->st[i].map;
    if (!map || !map->data || t->data < map->data || t->data + t->nbytes > map->data + map->size)
        return;
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kwk_log(KWK_LOG_DEBUG, "%s: cannot open again (%s): embedding rows read from the mapping",
                file, strerror(errno));
        return;
    }
    m->emb_fd = fd;
    m->emb_file = 1;
    m->emb_dtype = t->dtype;
    m->emb_off = (int64_t)(t->data - map->data);
    m->emb_row_bytes = kwk_dtype_row_bytes(t->dtype, m->tok_emb.cols);
}

/* A path to a safetensors shard or config.json stands for its folder. */
static int folder_of_file(const char *path)
{
    return ends_with(path, ".safetensors") || ends_with(path, "/config.json") ||
           !strcmp(path, "config.json");
}

kwk_model *kwk_model_load(const char *path_or_id, struct kwk_err *err)
{
    return kwk_model_load_ex(path_or_id, KWK_MODEL_LAZY_DEFAULT, err);
}

struct kwk_model *kwk_model_load_ex(const char *path_or_id, int lazy, struct kwk_err *err)
{
    char path[4096];
    kwk_err_clear(err);
    if (!path_or_id)
        return kwk_err_set(err, KWK_EARG, "kwk_model_load: path is NULL"), NULL;
    if (kwk_hf_resolve(path_or_id, path, sizeof path, err))
        return NULL;
    struct kwk_model *m = kwk_calloc(1, sizeof *m);
    if (!m) {
        kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    pthread_mutex_init(&m->lazy_lock, NULL);
    if (!(m->path = kwk_strdup(path))) {
        kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
        goto out_free;
    }
    double t0 = kwk_time_s();
    int rc;
    if (kwk_dir_exists(path))
        rc = load_folder(m, path, lazy, err);
    else if (folder_of_file(path))
        rc = kwk_err_set(err, KWK_EARG, "%s: pass the model folder (with config.json), not one "
                         "of its files", path);
    else
        rc = load_gguf(m, path, lazy, err);
    if (rc)
        goto out_free;
    open_emb_file(m);
    /* Loading read the headers and copied the norms and biases, a few bytes each, from pages
     * spread over the whole file. Where the page cache holds the file in 2 MiB folios (a run
     * that read it in huge pages before) each of those reads maps a whole 2 MiB page: 117 MiB
     * of SmolLM2-135M's 257 resident after loading, still there while a pack is mapped beside
     * them (the peak of a cached pack's load). Nothing of the file needs to stay mapped now;
     * whoever reads matrices in place faults them in again (or kwk_model_huge_pages). */
    kwk_model_release_pages(m);
    kwk_log(KWK_LOG_INFO, "loaded %s (%s, %lld parameters) in %.2f s", path, m->cfg.arch_name,
            (long long)m->n_params, kwk_time_s() - t0);
    return m;
out_free:
    kwk_model_free(m);
    return NULL;
}

/* ---- float copies on demand ----------------------------------------------------------------*/

/* The model's lazy floats are its one mutable part (under lazy_lock): a shared const model
 * is what every caller has. */
static struct kwk_model *mutable_model(const struct kwk_model *m)
{
    return (struct kwk_model *)m;
}

/* The whole pages of bytes [p, p + n) of one of m's files leave this process's resident memory:
 * once a matrix is dequantized or packed it is read again only for embedding rows, and the
 * file's pages would otherwise stay resident beside the copies and the pack. Only ranges inside
 * m's read-only file mappings (MADV_DONTNEED on anonymous memory would zero it). */
static void drop_in_map(const struct kwk_map *map, const uint8_t *p, size_t n, int *done)
{
    const uint8_t *lo_map = map->data, *hi_map = lo_map + map->size;
    if (*done || !lo_map || p < lo_map || p > hi_map || n > (size_t)(hi_map - p))
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
    *done = 1;
}

static void drop_file_pages(const struct kwk_model *m, const void *p, size_t n)
{
    int done = 0;
    if (m->gguf)
        drop_in_map(&m->gguf->map, p, n, &done);
    for (int i = 0; i < m->n_st; i++)
        drop_in_map(&m->st[i].map, p, n, &done);
}

void kwk_model_drop_pages(const struct kwk_model *m, const void *p, size_t n)
{
    drop_file_pages(m, p, n);
}

int kwk_model_floats_acquire(const struct kwk_model *cm, struct kwk_err *err)
{
    struct kwk_model *m = mutable_model(cm);
    int rc = 0;
    if (m->n_lazy == 0)
        return 0;
    pthread_mutex_lock(&m->lazy_lock);
    for (int i = 0; i < m->n_lazy && m->lazy_refs == 0; i++) {
        struct kwk_lazy_mat *l = &m->lazy[i];
        size_t bytes = 0;
        copy_bytes(l->mat->wtype, l->mat->rows, l->mat->cols, &bytes); /* checked at load */
        l->copy = kwk_malloc_aligned(bytes ? bytes : 64);
        if (!l->copy) {
            rc = kwk_err_set(err, -ENOMEM, "%s: out of memory for a copy of %s (%zu bytes)",
                             m->path, l->t->name, bytes);
            for (int j = 0; j <= i; j++) {
                kwk_free_aligned(m->lazy[j].copy);
                m->lazy[j].copy = NULL;
                m->lazy[j].mat->data = NULL;
                if (m->lazy[j].alias)
                    m->lazy[j].alias->data = NULL;
            }
            goto out_unlock;
        }
        fill_copy(l->t, l->mat->rows, l->mat->cols, l->n_head, l->copy);
        drop_file_pages(m, l->t->data, l->t->nbytes);
        l->mat->data = l->copy;
        if (l->alias)
            l->alias->data = l->copy;
    }
    m->lazy_refs++;
out_unlock:
    pthread_mutex_unlock(&m->lazy_lock);
    return rc;
}

void kwk_model_floats_release(const struct kwk_model *cm)
{
    struct kwk_model *m = mutable_model(cm);
    if (m->n_lazy == 0)
        return;
    pthread_mutex_lock(&m->lazy_lock);
    if (m->lazy_refs > 0 && --m->lazy_refs == 0)
        for (int i = 0; i < m->n_lazy; i++) {
            struct kwk_lazy_mat *l = &m->lazy[i];
            kwk_free_aligned(l->copy);
            l->copy = NULL;
            l->mat->data = NULL;
            if (l->alias)
                l->alias->data = NULL;
        }
    pthread_mutex_unlock(&m->lazy_lock);
}

/* The lazy record of w (the model's own matrix, or the tied lm_head), or NULL. The table is
 * fixed after load: no lock. */
static const struct kwk_lazy_mat *find_lazy(const struct kwk_model *m, const struct kwk_mat *w)
{
    for (int i = 0; i < m->n_lazy; i++)
        if (m->lazy[i].mat == w || m->lazy[i].alias == w)
            return &m->lazy[i];
    return NULL;
}

const struct kwk_tensor_ref *kwk_model_mat_tensor(const struct kwk_model *m,
                                                  const struct kwk_mat *w, int *n_head)
{
    if (w == &m->lm_head && m->cfg.tie_embeddings)
        w = &m->tok_emb; /* the same matrix */
    for (int i = 0; i < m->n_srcs; i++)
        if (m->srcs[i].mat == w) {
            *n_head = m->srcs[i].n_head;
            return m->srcs[i].t;
        }
    *n_head = 0;
    return NULL;
}

/* hf_row's inverse: Hugging Face's row (h, j, i) was stored at (h, i, j). */
int64_t kwk_model_file_row(int64_t r, int64_t rows, int n_head)
{
    if (n_head <= 0)
        return r;
    int64_t per_head = rows / n_head, h = r / per_head, k = r % per_head, half = per_head / 2;
    return h * per_head + (k < half ? 2 * k : 2 * (k - half) + 1);
}

int kwk_model_mat_dtype(const struct kwk_model *m, const struct kwk_mat *w)
{
    if (w == &m->lm_head && m->cfg.tie_embeddings)
        w = &m->tok_emb; /* the same matrix */
    for (int i = 0; i < m->n_srcs; i++)
        if (m->srcs[i].mat == w)
            return m->srcs[i].dtype;
    switch (w->wtype) {
    case KWK_W_F32: return KWK_DT_F32;
    case KWK_W_F16: return KWK_DT_F16;
    case KWK_W_BF16: return KWK_DT_BF16;
    default: return -1;
    }
}

int kwk_model_mat_acquire(const struct kwk_model *m, const struct kwk_mat *w, struct kwk_mat *out,
                          struct kwk_err *err)
{
    const struct kwk_lazy_mat *l = find_lazy(m, w);
    *out = *w;
    if (!l)
        return 0;
    /* A private copy even when the floats are held by someone else: their last release could
     * free them while we read. */
    size_t bytes = 0;
    copy_bytes(w->wtype, w->rows, w->cols, &bytes); /* checked at load */
    void *copy = kwk_malloc_aligned(bytes ? bytes : 64);
    if (!copy)
        return kwk_err_set(err, -ENOMEM, "%s: out of memory for a copy of %s (%zu bytes)",
                           m->path, l->t->name, bytes);
    fill_copy(l->t, w->rows, w->cols, l->n_head, copy);
    drop_file_pages(m, l->t->data, l->t->nbytes);
    out->data = copy;
    return 0;
}

void kwk_model_mat_release(const struct kwk_model *m, const struct kwk_mat *w,
                           struct kwk_mat *out)
{
    size_t esize = w->wtype == KWK_W_F32 ? 4 : 2, cells, bytes;
    if (find_lazy(m, w))
        kwk_free_aligned((void *)out->data);
    else if (w->wtype < KWK_W_COUNT && w->data &&
             !kwk_mul_size((size_t)w->rows, (size_t)w->cols, &cells) &&
             !kwk_mul_size(cells, esize, &bytes))
        drop_file_pages(m, w->data, bytes); /* a matrix used in place from its file */
    out->data = NULL;
}

/* Row id of the table read from the file in chunks of whole blocks: 0, or -1 on a read error. */
static int embed_row_pread(const struct kwk_model *m, int64_t id, float *out)
{
    uint8_t buf[4096];
    int dt = m->emb_dtype;
    int64_t cols = m->tok_emb.cols, blk = kwk_dtype_block(dt);
    size_t bb = kwk_dtype_block_bytes(dt);
    if (blk <= 0 || bb == 0 || bb > sizeof buf)
        return -1;
    int64_t per = (int64_t)(sizeof buf / bb) * blk; /* elements a chunk */
    off_t at = (off_t)(m->emb_off + id * (int64_t)m->emb_row_bytes);
    for (int64_t c = 0; c < cols; c += per) {
        int64_t n = KWK_MIN(per, cols - c);
        size_t want = (size_t)(n / blk) * bb, got = 0;
        while (got < want) {
            ssize_t r = pread(m->emb_fd, buf + got, want - got, at + (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return -1;
            got += (size_t)r;
        }
        kwk_dequant_row(dt, buf, out + c, n);
        at += (off_t)want;
    }
    return 0;
}

void kwk_model_embed_row(const struct kwk_model *m, const struct kwk_kernels *k, int64_t id,
                         float *out)
{
    /* widening and dequantizing are exact functions of the bytes: the same floats as the
     * float32 table's row, or the kernels' row of a table used in place */
    if (m->emb_file && embed_row_pread(m, id, out) == 0)
        return;
    const struct kwk_lazy_mat *l = find_lazy(m, &m->tok_emb);
    if (!l) {
        k->mat_row(&m->tok_emb, id, out);
        return;
    }
    /* the table is never permuted (n_head 0): row id of the copy is row id of the tensor */
    int64_t cols = m->tok_emb.cols;
    kwk_dequant_row(l->t->dtype, l->t->data + (size_t)id * kwk_dtype_row_bytes(l->t->dtype, cols),
                    out, cols);
}

void kwk_model_huge_pages(const struct kwk_model *cm)
{
    struct kwk_model *m = mutable_model(cm);
    /* a lazy float32 expansion (a quantized GGUF) runs from its copies; lazy plain copies
     * (permuted q / k of a bf16 GGUF) leave the rest read in place */
    int expands = 0;
    for (int i = 0; i < m->n_lazy; i++)
        expands |= plain_wtype(m->lazy[i].t->dtype) < 0;
    pthread_mutex_lock(&m->lazy_lock);
    if (!m->huge_done && !expands) {
        m->huge_done = 1;
        for (int i = 0; i < m->n_st; i++)
            kwk_map_huge(&m->st[i].map, m->st[i].path);
        if (m->gguf)
            kwk_map_huge(&m->gguf->map, m->gguf->path);
        /* an untied embedding table is read a row at a time (kwk_model_embed_row): its pages
         * need not stay resident */
        const struct kwk_mat *e = &m->tok_emb;
        if (e->data && e->data != m->lm_head.data && e->wtype < KWK_W_COUNT)
            drop_file_pages(m, e->data,
                            (size_t)(e->rows * e->cols) * (e->wtype == KWK_W_F32 ? 4 : 2));
    }
    pthread_mutex_unlock(&m->lazy_lock);
}

void kwk_model_release_pages(const struct kwk_model *m)
{
    for (int i = 0; i < m->n_st; i++)
        kwk_map_release(&m->st[i].map);
    if (m->gguf)
        kwk_map_release(&m->gguf->map);
}

void kwk_model_free(kwk_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_owned; i++)
        kwk_free_aligned(m->owned[i]);
    for (int i = 0; i < m->n_lazy; i++)
        kwk_free_aligned(m->lazy[i].copy); /* holds not released: the model goes anyway */
    kwk_free(m->lazy);
    kwk_free(m->srcs);
    pthread_mutex_destroy(&m->lazy_lock);
    if (m->emb_file)
        close(m->emb_fd);
    kwk_free(m->owned);
    kwk_free(m->layers);
    kwk_free(m->enc_layers);
    for (int i = 0; i < m->n_st; i++)
        kwk_st_close(&m->st[i]);
    kwk_free(m->st);
    if (m->gguf) {
        kwk_gguf_close(m->gguf);
        kwk_free(m->gguf);
    }
    kwk_free(m->path);
    kwk_free(m);
}

void kwk_model_get_info(const kwk_model *m, struct kwk_model_info *info)
{
    memset(info, 0, sizeof *info);
    if (!m)
        return;
    const struct kwk_config *c = &m->cfg;
    info->arch = c->arch;
    info->n_vocab = c->n_vocab;
    info->n_layers = c->n_layers;
    info->d_model = c->d_model;
    info->n_heads = c->n_heads;
    info->n_kv_heads = c->n_kv_heads;
    info->head_dim = c->head_dim;
    info->d_ff = c->d_ff;
    info->max_position = c->max_position;
    info->bos_id = c->bos_id;
    info->n_eos = c->n_eos;
    memcpy(info->eos_ids, c->eos_ids, sizeof info->eos_ids);
    info->n_params = m->n_params;
    snprintf(info->arch_name, sizeof info->arch_name, "%s", c->arch_name);
    info->is_encoder = c->encoder;
    info->pooling = c->pooling;
    info->normalize = c->normalize;
    info->n_labels = c->n_labels;
    info->score_act = c->score_act > 0 ? c->score_act : KWK_SCORE_IDENTITY;
    info->max_seq_length = c->st_max_seq_length;
    info->model_max_length = c->tok_max_length;
    info->max_tokens = c->encoder ? kwk_config_max_tokens(c) : 0;
}

/* The configuration alone: a folder's config.json or a GGUF file's metadata. */
static int check_config(const char *path, struct kwk_config *cfg, struct kwk_err *err)
{
    if (kwk_dir_exists(path))
        return kwk_config_load_dir(cfg, path, err);
    if (folder_of_file(path))
        return kwk_err_set(err, KWK_EARG, "%s: pass the model folder (with config.json), not "
                           "one of its files", path);
    struct kwk_gguf g;
    int rc = kwk_gguf_open(&g, path, err);
    if (rc)
        return rc;
    rc = kwk_config_from_gguf(cfg, &g, err);
    kwk_gguf_close(&g);
    return rc;
}

int kwk_model_check(const char *path_or_id, int max_cache_len, char *reason, size_t cap)
{
    struct kwk_err err;
    struct kwk_config cfg;
    char path[4096];
    kwk_err_clear(&err);
    int rc = 0;
    if (reason && cap)
        reason[0] = '\0';
    if (!path_or_id) {
        rc = kwk_err_set(&err, KWK_EARG, "path is NULL");
        goto out;
    }
    if (max_cache_len < 0) {
        rc = kwk_err_set(&err, KWK_EARG, "max_cache_len %d is negative", max_cache_len);
        goto out;
    }
    if ((rc = kwk_hf_resolve(path_or_id, path, sizeof path, &err)) ||
        (rc = check_config(path, &cfg, &err)))
        goto out;
    if (cfg.unsupported[0])
        rc = kwk_err_set(&err, KWK_EUNSUPPORTED, "%s", cfg.unsupported);
out:
    if (rc && reason && cap)
        snprintf(reason, cap, "%s", err.msg);
    return rc;
}
