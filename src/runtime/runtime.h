/* runtime.h - the decoder: KV cache, scratch and the forward pass over a loaded model.
 * A decoder is driven by one thread at a time; its pool runs the kernels. */
#ifndef KWK_RUNTIME_H
#define KWK_RUNTIME_H

#include "base/pool.h"
#include "kernels/attn.h"
#include "kernels/kernels.h"
#include "model/model.h"

struct kwk_decoder {
    const struct kwk_model *m;
    const struct kwk_config *c;
    const struct kwk_kernels *k;
    struct kwk_pool *pool;
    int n_threads;
    int max_len;  /* KV positions per slot */
    int n_slots;  /* KV slots: independent sequences (1 for a plain decoder, max_batch for an
                     engine); slot 0 is the one the public decoder API reads and appends to */
    int pos;      /* positions filled in slot 0 */
    int32_t *tokens; /* [max_len] the ids whose K/V fill the cache, for prompt reuse */
    int n_batch;  /* tokens per forward chunk (scratch rows) */
    int holds_floats; /* 1: holds the model's float matrices (kwk_model_floats_acquire) */
    int q_dim;    /* n_heads * head_dim */
    int kv_dim;   /* n_kv_heads * head_dim */
    const struct kwk_layer *layers; /* [n_layers]: the model's own, or repacked (packed) */
    const struct kwk_mat *lm_head;  /* [n_vocab][d_model] */
    const float *out_norm;          /* [d_model]: the model's, or the packed head's own */
    struct kwk_packed *packed;      /* weights repacked for balanced / int4; NULL for preserve */
    struct kwk_capture *capture;    /* calibration: keeps the matrices' inputs (NULL: off) */

    /* [n_slots][n_layers][n_kv_heads][max_len][head_dim] elements (head-major: a decode step
     * reads each head's positions as one run): IEEE halves (uint16_t) when kv_half, else floats
     * (kwk_decoder_params.kv_bits); bf16 rounded from halves when bf16_kv */
    void *k_cache;
    void *v_cache;
    int kv_half;
    /* With kv_half and a bf16 attention table (half_to_bf16, head_dim % 32 == 0): the caches
     * hold the keys' and values' halves already rounded to bf16 as the tiles would round them
     * each step (kwk_attn_args.k_bf16, v_bf16; the same numbers). */
    int bf16_kv;
    /* Half caches: [2][n_kv_heads][max_len][head_dim] one slot's K, then V, of one layer
     * widened to floats for a prompt chunk's attention (forward.c stage_slot); NULL for float
     * caches. */
    float *kv_stage;
    int *row_slot;   /* [n_batch] slot of each row of the chunk being run */
    int *row_pos;    /* [n_batch] position of each row in its slot */
    float *inv_freq; /* [head_dim/2] rotary frequencies, scaling applied */
    float *rope_cs;  /* [n_batch][head_dim] rotary table of each row of the chunk being run */
    /* The same for local layers with a rotary base of their own (Gemma 3), else NULL. */
    float *inv_freq_local;
    float *rope_cs_local;

    /* scratch, n_batch rows each */
    float *x;      /* [n_batch][d_model] residual stream */
    float *xn;     /* [n_batch][d_model] normed input of a block */
    float *q;      /* [n_batch][q_dim] */
    float *kx;     /* [n_batch][kv_dim] */
    float *vx;     /* [n_batch][kv_dim] */
    float *att;    /* [n_batch][q_dim] attention output */
    float *gate;   /* [n_batch][d_ff] */
    float *up;     /* [n_batch][d_ff] */
    float *scores; /* [n_threads][scores_per_thread] attention scratch per thread */
    /* The attention table's span for this head size (kwk_attn_span; 0: none) and one row's span
     * parts (kwk_attn_parts_floats), for a decode step shared out by positions (forward.c). */
    int att_span;
    float *att_parts;
    /* kwk_attn_args.whole_groups: the table's choice for this model's heads and bytes a token
     * (kwk_attn_whole_groups_for) */
    int att_whole_groups;
    size_t scores_per_thread;
    const struct kwk_attn_kernel *ak; /* attention kernels (kernels/attn.h) */
    const void **att_k, **att_v;      /* [n_batch] each row's K / V cache for the layer */
    int *att_first, *att_last;        /* [n_batch] positions each row attends */
    float *logits; /* [n_vocab] last row of logits */
    /* Quantized precisions: a product task's activations quantized once for all its jobs and
     * threads (kernels/quant.h struct kwk_qact), n_batch rows of up to qact_cols columns. */
    void *qact_mem;
    int64_t qact_cols;
};

/* The inputs a calibration capture sees (runtime/calib.h): where each layer's matrices read. */
enum kwk_site {
    KWK_SITE_QKV = 0, /* normed input of q, k, v       [d_model] */
    KWK_SITE_O = 1,   /* attention output, input of o  [n_heads * head_dim] */
    KWK_SITE_GU = 2,  /* normed input of gate, up      [d_model] */
    KWK_SITE_DOWN = 3,/* SiLU(gate) * up, input of down [d_ff] */
    KWK_SITE_COUNT
};
/* Hand n rows of one site's input (row stride dim) to the capture (runtime/calib.c). */
void kwk_capture_rows(struct kwk_capture *c, int layer, int site, const float *x, int n);

/* Index of the largest of x[n], the first on ties (torch.argmax's choice). */
int32_t kwk_argmax(const float *x, int n);
/* OpenAI's logprobs of the raw logits[n_vocab]: token's and the n_top best (sample.c), the same
 * numbers kwk_sampler_sample gives, for a token chosen from other (masked) logits. */
void kwk_sampler_raw_logprobs(const kwk_sampler *s, const float *logits, int32_t token,
                              float *logprob, int32_t *top_ids, float *top_lps, int n_top);

/* Rotary frequencies for the config (default, linear or llama3 scaling) into inv[head_dim/2]. */
void kwk_rope_freqs(const struct kwk_config *c, float *inv);
/* Local layers' frequencies (kwk_config.rope_theta_local, no scaling) into inv[head_dim/2]. */
void kwk_rope_freqs_local(const struct kwk_config *c, float *inv);
/* Rotary embedding in two steps, so that a row's angles are computed once for all its heads and
 * layers: cs[head_dim] = cos, then sin, of pos * inv[i]; then rotate one head vector x[head_dim]
 * by it (rotate-half layout, as transformers). */
void kwk_rope_table(int head_dim, const float *inv, int pos, float *cs);
void kwk_rope_rotate(float *x, int head_dim, const float *cs);

/* A decoder with n_slots KV slots and scratch for n_batch rows a pass (0: the default). */
struct kwk_decoder *kwk_decoder_new_slots(const struct kwk_model *m,
                                          const struct kwk_decoder_params *p, int n_slots,
                                          int n_batch, struct kwk_err *err);

/* Run n tokens (n <= n_batch) through every layer: row i is token ids[i] of slot d->row_slot[i]
 * at position d->row_pos[i]. Leaves the final hidden states (before the output norm) in d->x
 * and writes each row's K/V into its slot. A row attends to positions 0 .. row_pos[i] of its own
 * slot, so rows of one slot must come in position order and cover every position not already
 * in the cache. Each row's result is bitwise independent of the other rows (batch invariance). */
void kwk_forward_rows(struct kwk_decoder *d, const int32_t *ids, int n);
/* The same for n tokens of slot 0 at positions d->pos .. d->pos+n-1; advances d->pos. */
void kwk_forward_chunk(struct kwk_decoder *d, const int32_t *ids, int n);

/* y = x w^T for n rows of x (n <= n_batch, w->cols <= the decoder's widest input), split across
 * the pool as the layers' products are: rows from a shared counter for short chunks (the
 * threads' reads end together), the input quantized once for every thread. */
void kwk_forward_matmul(struct kwk_decoder *d, int n, const struct kwk_mat *w, const float *x,
                        float *y, long ldy);

/* The same product for a user without a decoder (an encoder): n_w (1 to 3) matrices of one
 * input x, y[j] = x w[j]^T, shared out as one task; qact_mem holds kwk_qact_bytes(qact_cols, n)
 * bytes when the matrices are quantized (NULL: plain only). */
void kwk_matmul_pool(const struct kwk_kernels *k, struct kwk_pool *pool, void *qact_mem,
                     int64_t qact_cols, int n, const struct kwk_mat *const *w, const float *x,
                     float *const *y, long ldy, int n_w);

/* Bytes of one K or V cache element: 2 (half) or 4 (float). */
size_t kwk_kv_elem_size(const struct kwk_decoder *d);

/* Copy positions 0 .. n-1 of slot src's K/V into slot dst (every layer). */
void kwk_kv_copy(struct kwk_decoder *d, int dst, int src, int n);

/* Output norm and lm_head of rows[n] of d->x into y[n][n_vocab]. */
void kwk_logits_rows(struct kwk_decoder *d, const int *rows, int n, float *y);

#endif
