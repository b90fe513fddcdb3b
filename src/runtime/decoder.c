/* decoder.c - the public decoder API: creating a KV cache and scratch, evaluating tokens, greedy
 * generation. A decoder is used by one thread at a time. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/ab.h"
#include "kernels/quant.h"
#include "runtime/packcache.h"
#include "runtime/packed.h"
#include "runtime/runtime.h"

/* Prompt chunks: big enough to keep matrix kernels compute-bound, small enough for scratch. */
#define KWK_DEFAULT_BATCH 256

void kwk_decoder_params_init(struct kwk_decoder_params *p)
{
    memset(p, 0, sizeof *p);
    p->precision = KWK_PRECISION_PRESERVE;
}

static int alloc_floats(float **out, size_t a, size_t b)
{
    size_t n, bytes;
    if (kwk_mul_size(a, b, &n) || kwk_mul_size(n, sizeof(float), &bytes))
        return -1;
    *out = kwk_malloc_aligned(bytes);
    return *out ? 0 : -1;
}

void kwk_decoder_free(kwk_decoder *d)
{
    if (!d)
        return;
    kwk_pool_free(d->pool);
    kwk_packed_free(d->packed);
    if (d->holds_floats)
        kwk_model_floats_release(d->m);
    kwk_free(d->tokens);
    kwk_free(d->row_slot);
    kwk_free(d->row_pos);
    kwk_free((void *)d->att_k);
    kwk_free((void *)d->att_v);
    kwk_free(d->att_first);
    kwk_free(d->att_last);
    void *bufs[] = {d->k_cache, d->v_cache, d->inv_freq, d->rope_cs,        d->inv_freq_local,
                    d->rope_cs_local,       d->x,        d->xn,             d->q,
                    d->kx,      d->vx,      d->att,      d->gate,           d->up,
                    d->scores,  d->logits};
    for (size_t i = 0; i < KWK_ARRAY_LEN(bufs); i++)
        kwk_free_aligned(bufs[i]);
    kwk_free_aligned(d->qact_mem);
    kwk_free_aligned(d->kv_stage);
    kwk_free_aligned(d->att_parts);
    kwk_free(d);
}

static int decoder_alloc(struct kwk_decoder *d)
{
    const struct kwk_config *c = d->c;
    size_t nb = (size_t)d->n_batch;
    size_t cache, dff = (size_t)c->d_ff;
    if (kwk_mul_size((size_t)d->n_slots * (size_t)c->n_layers, (size_t)d->max_len, &cache))
        return -1;
    d->row_slot = kwk_calloc(nb, sizeof(int));
    d->row_pos = kwk_calloc(nb, sizeof(int));
    d->att_k = kwk_calloc(nb, sizeof(void *));
    d->att_v = kwk_calloc(nb, sizeof(void *));
    d->att_first = kwk_calloc(nb, sizeof(int));
    d->att_last = kwk_calloc(nb, sizeof(int));
    if (!d->row_slot || !d->row_pos || !d->att_k || !d->att_v || !d->att_first || !d->att_last)
        return -1;
    d->ak = kwk_attn_kernel();
    struct kwk_attn_args shape = {.head_dim = c->head_dim, .n_heads = c->n_heads,
                                  .n_kv_heads = c->n_kv_heads};
    d->scores_per_thread = kwk_attn_scratch_floats(&shape, d->max_len);
    size_t kv_bytes;
    if (kwk_mul_size(cache, (size_t)d->kv_dim * kwk_kv_elem_size(d), &kv_bytes))
        return -1;
    d->k_cache = kwk_malloc_aligned(kv_bytes);
    d->v_cache = kwk_malloc_aligned(kv_bytes);
    if (!d->k_cache || !d->v_cache)
        return -1;
    /* Small pages for the KV cache: each layer's (and slot's) positions start in a huge page
     * of their own, so with 2 MiB pages a short sequence would make 2 MiB resident per layer,
     * slot, K and V (120 MiB for SmolLM2-135M's default 4096 positions); small pages make it
     * resident as it fills. */
    kwk_mem_small_pages(d->k_cache, kv_bytes);
    kwk_mem_small_pages(d->v_cache, kv_bytes);
    if (d->kv_half) {
        /* resident only as far as prompts reach (small pages, as the cache) */
        if (alloc_floats(&d->kv_stage, 2 * (size_t)d->max_len, (size_t)d->kv_dim))
            return -1;
        kwk_mem_small_pages(d->kv_stage,
                            2 * (size_t)d->max_len * (size_t)d->kv_dim * sizeof(float));
    }
    if (c->rope_theta_local > 0.0f &&
        (alloc_floats(&d->inv_freq_local, (size_t)c->head_dim / 2 + 1, 1) ||
         alloc_floats(&d->rope_cs_local, nb, (size_t)c->head_dim)))
        return -1;
    return alloc_floats(&d->inv_freq, (size_t)c->head_dim / 2 + 1, 1) ||
           alloc_floats(&d->rope_cs, nb, (size_t)c->head_dim) ||
           alloc_floats(&d->x, nb, (size_t)c->d_model) ||
           alloc_floats(&d->xn, nb, (size_t)c->d_model) ||
           alloc_floats(&d->q, nb, (size_t)KWK_MAX(d->q_dim, c->d_model)) ||
           alloc_floats(&d->kx, nb, (size_t)d->kv_dim) ||
           alloc_floats(&d->vx, nb, (size_t)d->kv_dim) ||
           alloc_floats(&d->att, nb, (size_t)d->q_dim) || alloc_floats(&d->gate, nb, dff) ||
           alloc_floats(&d->up, nb, dff) ||
           alloc_floats(&d->scores, (size_t)d->n_threads, d->scores_per_thread) ||
           alloc_floats(&d->logits, (size_t)c->n_vocab, 1);
}

/* KWKER_BF16_KV=off keeps a bf16 attention table's keys and values as halves in the cache,
 * rounded anew by every tile that reads them (the numbers are the same; for comparing the two). */
static int bf16_kv_on(void)
{
    return kwk_env_word("KWKER_BF16_KV", (const char *const[]){"on", "off"}, 2) != 1;
}

kwk_decoder *kwk_decoder_new(const kwk_model *m, const struct kwk_decoder_params *p,
                             struct kwk_err *err)
{
    return kwk_decoder_new_slots(m, p, 1, 0, err);
}

/* Whether preserve runs m's matrices packed (bf16 panels for the AVX2 table, AMX tile order
 * where the AVX-512 table's products run on AMX: kwk_preserve_wtype): the table wants them,
 * every matrix is bf16
 * (a float32 checkpoint or a GGUF keeps its row-major matrices), and there is a pack cache to
 * keep them in. Without one the panels would be a private copy made at every load (SmolLM2-360M:
 * 1.3 s, most of it the kernel zeroing 724 MB of fresh pages) beside weights a caller may
 * already hold (a torch model), so preserve then reads the checkpoint in place.
 * KWKER_BF16_PANELS=1 takes panels without a cache too, =0 never (measurements). */
static int preserve_panels(const struct kwk_kernels *k, const struct kwk_model *m,
                           const char *cache_dir)
{
    int want = kwk_env_word("KWKER_BF16_PANELS", (const char *const[]){"0", "1"}, 2);
    if (want < 0)
        want = cache_dir && cache_dir[0];
    return want && kwk_preserve_wtype(k) != KWK_W_BF16 && kwk_packed_panels_apply(m);
}

struct kwk_decoder *kwk_decoder_new_slots(const struct kwk_model *m,
                                          const struct kwk_decoder_params *p, int n_slots,
                                          int n_batch, struct kwk_err *err)
{
    struct kwk_decoder_params defaults;
    if (!p) {
        kwk_decoder_params_init(&defaults);
        p = &defaults;
    }
    if (!m) {
        kwk_err_set(err, KWK_EARG, "no model");
        return NULL;
    }
    const struct kwk_config *c = &m->cfg;
    if (c->encoder) {
        kwk_err_set(err, KWK_EUNSUPPORTED, "%s is an encoder (%s): it makes embeddings "
                    "(kwk_encoder_new), not tokens", m->path, c->arch_name);
        return NULL;
    }
    if (p->precision < KWK_PRECISION_PRESERVE || p->precision > KWK_PRECISION_INT4) {
        kwk_err_set(err, KWK_EARG, "unknown precision %d", p->precision);
        return NULL;
    }
    if (p->act_bits != 0 && p->act_bits != 8 && p->act_bits != 16) {
        kwk_err_set(err, KWK_EARG, "act_bits %d: 8 or 16 (0 = 16)", p->act_bits);
        return NULL;
    }
    if (p->act_bits == 8 && p->precision == KWK_PRECISION_PRESERVE) {
        /* refused rather than ignored: someone asking for it expects a speed-up that float32
         * weights cannot give */
        kwk_err_set(err, KWK_EARG, "act_bits 8 applies to balanced and int4 (preserve computes "
                    "in float32)");
        return NULL;
    }
    if (p->kv_bits != 0 && p->kv_bits != 16 && p->kv_bits != 32) {
        kwk_err_set(err, KWK_EARG,
                    "kv_bits %d: 16 or 32 (0 = 16 for balanced and int4, 32 for "
                    "preserve)",
                    p->kv_bits);
        return NULL;
    }
    if (p->max_cache_len < 0 || p->max_cache_len > (1 << 24) || p->n_threads < 0 ||
        p->n_threads > 1024 || n_slots < 1 || n_slots > 4096 || n_batch < 0 ||
        n_batch > (1 << 16)) {
        kwk_err_set(err, KWK_EARG,
                    "max_cache_len %d, n_threads %d, slots %d or batch %d out of range",
                    p->max_cache_len, p->n_threads, n_slots, n_batch);
        return NULL;
    }
    struct kwk_decoder *d = kwk_calloc(1, sizeof *d);
    if (!d)
        goto out_nomem;
    d->m = m;
    d->c = c;
    d->k = kwk_kernels();
    d->n_threads = p->n_threads ? p->n_threads : kwk_default_threads();
    d->max_len = p->max_cache_len;
    if (d->max_len == 0)
        d->max_len = c->max_position > 0 ? KWK_MIN(c->max_position, 4096) : 4096;
    d->n_slots = n_slots;
    d->n_batch = n_batch ? n_batch : KWK_MIN(d->max_len, KWK_DEFAULT_BATCH);
    d->q_dim = c->n_heads * c->head_dim;
    d->kv_dim = c->n_kv_heads * c->head_dim;
    /* Preserve keeps float32 (transformers' numbers); the quantized precisions, whose weights
     * already round far more than a half does, read half the cache bytes a step (llama.cpp's
     * default cache type too). */
    d->kv_half = p->kv_bits == 16 || (p->kv_bits == 0 && p->precision != KWK_PRECISION_PRESERVE);
    d->tokens = kwk_calloc((size_t)d->max_len, sizeof(int32_t));
    if (!d->tokens || decoder_alloc(d))
        goto out_nomem;
    /* 8-bit activations already round each matrix's input to 8 bits; attention's products in
     * bfloat16 (8 bits of mantissa) run twice as fast where the CPU has them. */
    if (p->act_bits == 8)
        d->ak = kwk_attn_kernel_act8();
    d->bf16_kv = d->kv_half && d->ak->half_to_bf16 && c->head_dim % 32 == 0 && bf16_kv_on();
    d->att_span = kwk_attn_span(d->ak, c->head_dim);
    if (d->att_span) {
        struct kwk_attn_args shape = {.head_dim = c->head_dim, .n_heads = c->n_heads,
                                      .n_kv_heads = c->n_kv_heads};
        if (alloc_floats(&d->att_parts, kwk_attn_parts_floats(&shape, d->att_span, d->max_len),
                         1))
            goto out_nomem;
    }
    d->pool = kwk_pool_new(d->n_threads);
    if (!d->pool)
        goto out_nomem;
    kwk_rope_freqs(c, d->inv_freq);
    if (d->inv_freq_local)
        kwk_rope_freqs_local(c, d->inv_freq_local);
    d->layers = m->layers;
    d->lm_head = &m->lm_head;
    d->out_norm = m->out_norm;
    struct kwk_packcache_opts cache = {.dir = p->cache_dir, .max_bytes = p->cache_max_bytes};
    if (p->cache_max_bytes < 0) {
        kwk_err_set(err, KWK_EARG, "cache_max_bytes %lld is negative",
                    (long long)p->cache_max_bytes);
        goto out_err;
    }
    if (p->precision == KWK_PRECISION_PRESERVE && preserve_panels(d->k, m, p->cache_dir)) {
        /* the same bf16 values in the layout this table multiplies fastest (kernels/panel.h,
         * kernels/bf16t.h) */
        d->packed = kwk_packed_new(m, p->precision, NULL, &cache, d->pool, err);
        if (!d->packed)
            goto out_err;
        d->layers = kwk_packed_layers(d->packed);
        d->lm_head = kwk_packed_lm_head(d->packed);
        kwk_model_release_pages(m); /* as below: the pack is what runs */
    } else if (p->precision == KWK_PRECISION_PRESERVE) {
        /* the model's float matrices are what runs: made now when the model makes them on
         * demand (a quantized GGUF), held for the decoder's life */
        if (kwk_model_floats_acquire(m, err))
            goto out_err;
        d->holds_floats = 1;
        kwk_model_huge_pages(m); /* read on every token: +2-3% on 2 MiB pages */
    } else {
        struct kwk_quant_opts q = {.mix_bits = p->mix_bits, .calib = p->calib,
                                   .n_calib = p->n_calib, .gptq = p->gptq,
                                   .n_threads = d->n_threads, .act8 = p->act_bits == 8};
        d->packed = kwk_packed_new(m, p->precision, &q, &cache, d->pool, err);
        if (!d->packed)
            goto out_err;
        d->layers = kwk_packed_layers(d->packed);
        d->lm_head = kwk_packed_lm_head(d->packed);
        d->out_norm = kwk_packed_out_norm(d->packed);
        /* Packing (or hashing them for the pack cache) read every checkpoint page; from now on
         * the packed copy is what runs, so those pages need not stay resident (peak memory of
         * a balanced / int4 process: the pack, not the pack plus the checkpoint). */
        kwk_model_release_pages(m);
        d->qact_cols = KWK_MAX(KWK_MAX((int64_t)c->d_model, (int64_t)d->q_dim), (int64_t)c->d_ff);
        d->qact_mem = kwk_malloc_aligned(kwk_qact_bytes(d->qact_cols, d->n_batch));
        if (!d->qact_mem)
            goto out_nomem;
    }
    /* A decode step's attention by whole kv groups where the table wants that for these heads and
     * the bytes a token reads (those of a pack; unpacked float matrices count as none) */
    d->att_whole_groups = kwk_attn_whole_groups_for(
        d->ak, c->head_dim, d->packed ? (double)kwk_packed_bytes(d->packed) : 0.0);
    return d;
out_nomem:
    kwk_err_set(err, -ENOMEM, "out of memory for a decoder with %d slots of %d cache positions",
                n_slots, d ? d->max_len : p->max_cache_len);
out_err:
    kwk_decoder_free(d);
    return NULL;
}

static int64_t mat_bits(const struct kwk_mat *w, int64_t *n)
{
    *n += w->rows * w->cols;
    return w->rows * w->cols * (w->wtype == KWK_W_F32 ? 32 : 16);
}

int kwk_decoder_kv_bits(const kwk_decoder *d)
{
    return d->kv_half ? 16 : 32;
}

const char *kwk_decoder_attn_name(const kwk_decoder *d)
{
    return d->ak->name;
}

const char *kwk_decoder_matmul_name(const kwk_decoder *d)
{
    /* every layer's matrices take the same path: quantized ones all AMX or none (kwk_mat_amx),
     * preserve's all of the checkpoint's one storage type */
    const struct kwk_mat *w = &d->layers[0].wq;
    if (kwk_mat_amx(d->k, w))
        return kwk_quant_group(w->wtype) ? "amx-int8" : "amx-bf16";
    return d->k->name;
}

double kwk_decoder_bits_per_weight(const kwk_decoder *d)
{
    if (!d)
        return 0.0;
    if (d->packed)
        return kwk_packed_bits_per_weight(d->packed);
    int64_t bits = 0, n = 0;
    for (int L = 0; L < d->c->n_layers; L++) {
        const struct kwk_layer *l = &d->layers[L];
        const struct kwk_mat *ms[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                      &l->w_down};
        for (size_t i = 0; i < KWK_ARRAY_LEN(ms); i++)
            bits += mat_bits(ms[i], &n);
    }
    bits += mat_bits(d->lm_head, &n);
    return n ? (double)bits / (double)n : 0.0;
}

int kwk_decoder_pos(const kwk_decoder *d)
{
    return d->pos;
}

int kwk_decoder_truncate(kwk_decoder *d, int n)
{
    if (n < 0 || n > d->pos)
        return KWK_ERANGE;
    d->pos = n;
    return 0;
}

const int32_t *kwk_decoder_tokens(const kwk_decoder *d)
{
    return d->tokens;
}

int kwk_decoder_reuse_prefix(kwk_decoder *d, const int32_t *ids, int n)
{
    int keep = 0, limit = KWK_MIN(d->pos, n - 1);
    while (keep < limit && d->tokens[keep] == ids[keep])
        keep++;
    d->pos = keep;
    return keep;
}

const float *kwk_decoder_logits(const kwk_decoder *d)
{
    return d->logits;
}

/* Output norm and lm_head for n rows of d->x into y (row stride n_vocab): rows x, x + 1, ...
 * or, with idx, rows x + idx[i]. */
struct head_task {
    struct kwk_decoder *d;
    const float *x;
    const int *idx;
    int n;
};

static void head_norm_run(void *ctx, int ith, int nth)
{
    struct head_task *t = ctx;
    int dm = t->d->c->d_model;
    long lo, hi;
    kwk_split_range(t->n, ith, nth, 1, &lo, &hi);
    for (long i = lo; i < hi; i++) {
        long row = t->idx ? t->idx[i] : i;
        t->d->k->rmsnorm(t->d->xn + i * dm, t->x + row * dm, t->d->out_norm, dm,
                         t->d->c->rms_eps);
    }
}

/* The lm_head goes through the layers' product (its row split and shared activations) rather
 * than a split of its own; one row's norm is the owner's alone, one pool round trip fewer a
 * token. Same numbers (batch invariance); tokens/s unchanged on SmolLM2-135M int4, where the
 * head is a quarter of the bytes a token. */
static void compute_logits(struct kwk_decoder *d, const float *x, const int *idx, int n,
                           float *y)
{
    struct head_task ht = {.d = d, .x = x, .idx = idx, .n = n};
    if (n <= 1)
        head_norm_run(&ht, 0, 1);
    else
        kwk_pool_run(d->pool, head_norm_run, &ht);
    kwk_forward_matmul(d, n, d->lm_head, d->xn, y, (long)d->lm_head->rows);
}

void kwk_logits_rows(struct kwk_decoder *d, const int *rows, int n, float *y)
{
    compute_logits(d, d->x, rows, n, y);
}

static int decoder_eval(kwk_decoder *d, const int32_t *ids, int n_ids, float *logits, int mode)
{
    if (n_ids < 0 || (n_ids > 0 && !ids) || mode < KWK_LOGITS_NONE || mode > KWK_LOGITS_ALL)
        return KWK_EARG;
    if (n_ids > d->max_len - d->pos)
        return KWK_ELIMIT;
    for (int i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= d->c->n_vocab)
            return KWK_ERANGE;
    size_t nv = (size_t)d->c->n_vocab;
    for (int done = 0; done < n_ids;) {
        int n = KWK_MIN(d->n_batch, n_ids - done);
        memcpy(d->tokens + d->pos, ids + done, sizeof(int32_t) * (size_t)n);
        kwk_forward_chunk(d, ids + done, n);
        if (mode == KWK_LOGITS_ALL && logits)
            compute_logits(d, d->x, NULL, n, logits + (size_t)done * nv);
        done += n;
        if (done == n_ids && mode != KWK_LOGITS_NONE) {
            const float *last_x = d->x + (size_t)(n - 1) * d->c->d_model;
            if (mode == KWK_LOGITS_ALL && logits)
                memcpy(d->logits, logits + (size_t)(n_ids - 1) * nv, nv * sizeof(float));
            else
                compute_logits(d, last_x, NULL, 1, d->logits);
            if (mode == KWK_LOGITS_LAST && logits)
                memcpy(logits, d->logits, nv * sizeof(float));
        }
    }
    return 0;
}

int kwk_decoder_eval(kwk_decoder *d, const int32_t *ids, int n_ids, float *logits, int mode)
{
#ifdef KWK_AB_TIMING
    double t0 = kwk_ab_start(n_ids);
    int rc = decoder_eval(d, ids, n_ids, logits, mode);
    kwk_ab_stop(n_ids, t0);
    return rc;
#else
    return decoder_eval(d, ids, n_ids, logits, mode);
#endif
}

size_t kwk_kv_elem_size(const struct kwk_decoder *d)
{
    return d->kv_half ? sizeof(uint16_t) : sizeof(float);
}

void kwk_kv_copy(struct kwk_decoder *d, int dst, int src, int n)
{
    /* a (slot, layer) block holds each kv head's max_len positions in turn (forward.c kv_base) */
    size_t pos = (size_t)d->c->head_dim * kwk_kv_elem_size(d), len = (size_t)n * pos;
    size_t head = (size_t)d->max_len * pos, block = head * (size_t)d->c->n_kv_heads;
    for (int L = 0; L < d->c->n_layers; L++)
        for (int h = 0; h < d->c->n_kv_heads; h++) {
            size_t to = ((size_t)dst * (size_t)d->c->n_layers + (size_t)L) * block + h * head;
            size_t from = ((size_t)src * (size_t)d->c->n_layers + (size_t)L) * block + h * head;
            memcpy((char *)d->k_cache + to, (char *)d->k_cache + from, len);
            memcpy((char *)d->v_cache + to, (char *)d->v_cache + from, len);
        }
}

int32_t kwk_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int kwk_decoder_generate_greedy(kwk_decoder *d, const int32_t *prompt, int n_prompt,
                                int max_new, const int32_t *eos, int n_eos, int32_t *out,
                                int *n_out)
{
    *n_out = 0;
    if (n_prompt < 1 || max_new < 0)
        return KWK_EARG;
    d->pos = 0;
    int rc = kwk_decoder_eval(d, prompt, n_prompt, NULL, KWK_LOGITS_LAST);
    for (int i = 0; rc == 0 && i < max_new; i++) {
        int32_t tok = kwk_argmax(d->logits, d->c->n_vocab);
        out[(*n_out)++] = tok;
        for (int e = 0; e < n_eos; e++)
            if (tok == eos[e])
                return 0;
        if (i + 1 == max_new || d->pos >= d->max_len)
            break; /* a full cache ends generation like max_new does */
        rc = kwk_decoder_eval(d, &tok, 1, NULL, KWK_LOGITS_LAST);
    }
    return rc;
}
