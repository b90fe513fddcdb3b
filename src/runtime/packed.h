/* packed.h - a model's matrices repacked for a quantized precision (balanced = 8-bit, int4),
 * owned by a decoder. Built on the decoder's owner thread (its pool may help); read-only after. */
#ifndef KWK_PACKED_H
#define KWK_PACKED_H

#include "base/pool.h"
#include "model/model.h"

struct kwk_packed;

struct kwk_packcache_opts;

/* How the weights are fitted (kwk_decoder_params has the same fields and their meaning). */
struct kwk_quant_opts {
    int mix_bits;         /* int4: 8, 6 or 4; 0 = by the model's size */
    const int32_t *calib; /* calibration token ids, NULL = none */
    int64_t n_calib;
    int gptq;
    int n_threads;        /* for the calibration run's own decoder (0 = default) */
    /* 1: every packed matrix gets kwk_mat.act8 (8-bit activations; kwk_decoder_params's
     * act_bits 8). Set once packing or mapping is done: it changes how the blocks are read,
     * never what they hold, so it is neither part of the pack cache's key nor seen by the
     * fitting (whose matmuls keep 16-bit activations whatever it says). */
    int act8;
};

/* Repack every layer matrix and the lm_head of m for precision (enum kwk_precision): BALANCED
 * and INT4 into blocks, PRESERVE into bf16 panels (the same values; only when
 * kwk_packed_panels_apply(m), with q empty). Norms and biases are the model's, except where
 * calibration folds scales into them (then the packed layers carry their own). q may be NULL
 * (defaults). With cache (NULL = none; see runtime/packcache.h) the blocks are mapped from a pack
 * file when one matches, or written to one. NULL with err on failure; the cache never makes it
 * fail. */
struct kwk_packed *kwk_packed_new(const struct kwk_model *m, int precision,
                                  const struct kwk_quant_opts *q,
                                  const struct kwk_packcache_opts *cache, struct kwk_pool *pool,
                                  struct kwk_err *err);
void kwk_packed_free(struct kwk_packed *p);
/* One matrix of m packed into dst as kwk_packed_new packs it without calibration (a 4-bit
 * file's grid kept for int4, the source's floats made and dropped around it): dst->wtype, rows
 * and cols set, dst->data holding packed_bytes of them. For a user of m's matrices outside its
 * decoder layers (an encoder's). Returns 0 or a negative code with err. */
int kwk_packed_mat(const struct kwk_model *m, const struct kwk_mat *src, struct kwk_mat *dst,
                   struct kwk_pool *pool, struct kwk_err *err);
/* 1 when every layer matrix and the lm_head of m is bf16: preserve can run them as panels. */
int kwk_packed_panels_apply(const struct kwk_model *m);
/* [n_layers] layers whose matrices are the packed ones. */
const struct kwk_layer *kwk_packed_layers(const struct kwk_packed *p);
const struct kwk_mat *kwk_packed_lm_head(const struct kwk_packed *p);
/* Bits per weight of the packed matrices (blocks and scales over weights). */
double kwk_packed_bits_per_weight(const struct kwk_packed *p);
/* Bytes of p's packed matrices: what a generated token reads of them. */
size_t kwk_packed_bytes(const struct kwk_packed *p);
/* [d_model] the output norm's weights to use with the packed lm_head. */
const float *kwk_packed_out_norm(const struct kwk_packed *p);

#endif
