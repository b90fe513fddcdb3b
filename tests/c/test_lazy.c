/* test_lazy.c - float32 copies made on demand (kwk_model_load_ex lazy) are bitwise the ones made
 * at load: embedding rows, held matrices, one-matrix copies, (once the runtime reads lazy models)
 * a decoder's logits, and the file type each matrix is made from. Uses the bundled quantized
 * GGUF (Q4_1, llama q/k permutation, tied embeddings). Single-threaded test driver. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test.h"

#define MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static int same_floats(const struct kwk_mat *a, const struct kwk_mat *b)
{
    if (a->wtype != b->wtype || a->rows != b->rows || a->cols != b->cols || !a->data || !b->data)
        return 0;
    size_t bytes = (size_t)a->rows * (size_t)a->cols * sizeof(float);
    return !memcmp(a->data, b->data, bytes);
}

/* The matrices a test compares: every layer's, the table and the head. */
static int n_mats(const struct kwk_model *m)
{
    return 7 * m->cfg.n_layers + 2;
}

static const struct kwk_mat *mat_at(const struct kwk_model *m, int i)
{
    if (i == 7 * m->cfg.n_layers)
        return &m->tok_emb;
    if (i == 7 * m->cfg.n_layers + 1)
        return &m->lm_head;
    const struct kwk_layer *l = &m->layers[i / 7];
    const struct kwk_mat *ms[7] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                   &l->w_down};
    return ms[i % 7];
}

static void test_rows_and_mats(const struct kwk_model *eager, const struct kwk_model *lazy)
{
    const struct kwk_kernels *k = kwk_kernels();
    int d = eager->cfg.d_model, n_vocab = eager->cfg.n_vocab;
    T_EQ(lazy->n_params, eager->n_params);
    T_TRUE(lazy->n_lazy > 0);
    T_TRUE(lazy->tok_emb.data == NULL && lazy->layers[0].wq.data == NULL);
    T_TRUE(eager->n_lazy == 0);
    float *a = malloc(sizeof(float) * (size_t)d), *b = malloc(sizeof(float) * (size_t)d);
    T_TRUE(a && b);
    if (!a || !b)
        goto out;
    /* embedding rows: the first, the last and a spread between */
    int ok = 1;
    for (int64_t id = 0; id < n_vocab; id += id < 3 ? 1 : 997) {
        k->mat_row(&eager->tok_emb, id, a);
        kwk_model_embed_row(lazy, k, id, b);
        ok &= !memcmp(a, b, sizeof(float) * (size_t)d);
        kwk_model_embed_row(eager, k, id, b);
        ok &= !memcmp(a, b, sizeof(float) * (size_t)d);
    }
    k->mat_row(&eager->tok_emb, n_vocab - 1, a);
    kwk_model_embed_row(lazy, k, n_vocab - 1, b);
    ok &= !memcmp(a, b, sizeof(float) * (size_t)d);
    T_TRUE(ok);
    /* one-matrix copies (permuted q / k, plain others, the tied head), freed on release */
    struct kwk_err err;
    ok = 1;
    for (int i = 0; i < n_mats(lazy); i += 5) {
        struct kwk_mat tmp;
        if (kwk_model_mat_acquire(lazy, mat_at(lazy, i), &tmp, &err)) {
            ok = 0;
            break;
        }
        ok &= same_floats(&tmp, mat_at(eager, i));
        kwk_model_mat_release(lazy, mat_at(lazy, i), &tmp);
        ok &= tmp.data == NULL && mat_at(lazy, i)->data == NULL;
    }
    T_TRUE(ok);
    /* an eager model's matrices are lent as they are */
    struct kwk_mat tmp;
    T_EQ(kwk_model_mat_acquire(eager, &eager->layers[1].w_up, &tmp, &err), 0);
    T_TRUE(tmp.data == eager->layers[1].w_up.data);
    kwk_model_mat_release(eager, &eager->layers[1].w_up, &tmp);
    T_TRUE(eager->layers[1].w_up.data != NULL);
    /* held floats: all of them, counted */
    T_EQ(kwk_model_floats_acquire(lazy, &err), 0);
    T_EQ(kwk_model_floats_acquire(lazy, &err), 0);
    ok = 1;
    for (int i = 0; i < n_mats(lazy); i++)
        ok &= same_floats(mat_at(lazy, i), mat_at(eager, i));
    T_TRUE(ok);
    T_TRUE(lazy->lm_head.data == lazy->tok_emb.data);
    kwk_model_floats_release(lazy);
    T_TRUE(lazy->layers[2].w_down.data != NULL);
    kwk_model_floats_release(lazy);
    T_TRUE(lazy->layers[2].w_down.data == NULL && lazy->lm_head.data == NULL);
    kwk_model_floats_release(lazy); /* one too many: ignored */
    T_EQ(lazy->lazy_refs, 0);
    T_EQ(kwk_model_floats_acquire(eager, &err), 0); /* eager: a no-op */
    kwk_model_floats_release(eager);
out:
    free(a);
    free(b);
}

/* kwk_model_embed_row reads a table used in place (bf16 / f16 safetensors) with pread and
 * kwk_dequant_row instead of the kernels' mat_row on the mapping: the same floats for every
 * 16-bit pattern (NaNs: any NaN). */
static void test_widen_matches_kernels(void)
{
    const struct kwk_kernels *k = kwk_kernels();
    static uint16_t bits[65536];
    static float a[65536], b[65536];
    for (int i = 0; i < 65536; i++)
        bits[i] = (uint16_t)i;
    const int wt[2] = {KWK_W_BF16, KWK_W_F16}, dt[2] = {KWK_DT_BF16, KWK_DT_F16};
    for (int t = 0; t < 2; t++) {
        struct kwk_mat w = {.wtype = wt[t], .rows = 1, .cols = 65536, .data = bits};
        k->mat_row(&w, 0, a);
        kwk_dequant_row(dt[t], bits, b, 65536);
        int bad = 0;
        for (int i = 0; i < 65536; i++)
            bad += (a[i] != a[i]) != (b[i] != b[i]) ||
                   (a[i] == a[i] && memcmp(&a[i], &b[i], sizeof(float)) != 0);
        T_CHECK(bad == 0, "%s: %d patterns widen differently", kwk_dtype_name(dt[t]), bad);
    }
}

#if KWK_MODEL_LAZY_DEFAULT
/* Logits of a few tokens, prompt then one step. */
static int run_logits(const struct kwk_model *m, int precision, float *out)
{
    static const int32_t ids[] = {1, 504, 3458, 314, 260, 1345, 28, 5};
    struct kwk_decoder_params p;
    kwk_decoder_params_init(&p);
    p.precision = precision;
    p.max_cache_len = 64;
    p.n_threads = 2;
    struct kwk_err err;
    kwk_decoder *d = kwk_decoder_new(m, &p, &err);
    if (!d) {
        fprintf(stderr, "decoder: %s\n", err.msg);
        return -1;
    }
    int n_vocab = m->cfg.n_vocab;
    int rc = kwk_decoder_eval(d, ids, 7, out, KWK_LOGITS_LAST);
    if (!rc)
        rc = kwk_decoder_eval(d, ids + 7, 1, out + n_vocab, KWK_LOGITS_LAST);
    kwk_decoder_free(d);
    return rc;
}

static void test_logits(const struct kwk_model *eager, const struct kwk_model *lazy)
{
    size_t n = 2 * (size_t)eager->cfg.n_vocab;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    T_TRUE(a && b);
    for (int prec = KWK_PRECISION_PRESERVE; a && b && prec <= KWK_PRECISION_INT4; prec++) {
        T_EQ(run_logits(eager, prec, a), 0);
        T_EQ(run_logits(lazy, prec, b), 0);
        T_CHECK(!memcmp(a, b, n * sizeof(float)), "precision %d: lazy logits differ", prec);
        /* a preserve decoder's hold ends with it; packing holds nothing afterwards */
        T_EQ(lazy->lazy_refs, 0);
        T_TRUE(lazy->layers[0].wq.data == NULL);
    }
    free(a);
    free(b);
}
#endif

/* Both loads name the file's type of every matrix (int4 keeps a mixed file's wider ones wide):
 * this file's layers are Q4_1, its table (and so its tied head) Q8_0. */
static void test_mat_dtypes(const struct kwk_model *eager, const struct kwk_model *lazy)
{
    int n = 7 * eager->cfg.n_layers;
    for (int i = 0; i < n_mats(eager); i++) {
        int want = i < n ? KWK_DT_Q4_1 : KWK_DT_Q8_0;
        T_EQ(kwk_model_mat_dtype(eager, mat_at(eager, i)), want);
        T_EQ(kwk_model_mat_dtype(lazy, mat_at(lazy, i)), want);
    }
    struct kwk_mat plain = {.wtype = KWK_W_BF16, .rows = 1, .cols = 1, .data = NULL};
    T_EQ(kwk_model_mat_dtype(eager, &plain), KWK_DT_BF16); /* not the model's: its own type */
    T_EQ(kwk_dtype_bits(KWK_DT_Q4_K), 4);
    T_EQ(kwk_dtype_bits(KWK_DT_Q5_0), 5);
    T_EQ(kwk_dtype_bits(KWK_DT_Q6_K), 6);
    T_EQ(kwk_dtype_bits(-1), 0);
}

int main(void)
{
    struct kwk_err err;
    test_widen_matches_kernels();
    kwk_model *eager = kwk_model_load_ex(MODEL, 0, &err);
    T_CHECK(eager != NULL, "eager: %s", err.msg);
    kwk_model *lazy = kwk_model_load_ex(MODEL, 1, &err);
    T_CHECK(lazy != NULL, "lazy: %s", err.msg);
    if (eager && lazy) {
        test_rows_and_mats(eager, lazy);
        test_mat_dtypes(eager, lazy);
#if KWK_MODEL_LAZY_DEFAULT
        test_logits(eager, lazy);
#endif
    }
    kwk_model_free(lazy);
    kwk_model_free(eager);
    return t_report("test_lazy");
}
