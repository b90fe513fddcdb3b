/* calib.h - calibration for packing: run the float model over the user's token ids and keep, for
 * every layer, the inputs of its matrices (a uniform sample of rows, and each channel's mean |x|
 * over all tokens) for activation-aware scales and GPTQ (runtime/quantfit.h). Made and used on
 * the owner thread of the decoder being packed; the capture's own decoder runs on its own pool. */
#ifndef KWK_CALIB_H
#define KWK_CALIB_H

#include <stdint.h>

#include "model/model.h"
#include "runtime/quantfit.h"

/* Calibration text is run as independent sequences of at most this many tokens (llama.cpp's
 * imatrix does the same), so attention sees realistic context without a huge KV cache. */
#define KWK_CALIB_SEQ 512
/* Rows kept per matrix input: GPTQ's Hessian and AWQ's error are estimated from them. */
#define KWK_CALIB_MAX_ROWS 1024
/* ... and no more than this many bytes of kept rows over the whole model (rows shrink). */
#define KWK_CALIB_MAX_BYTES ((int64_t)1 << 30)
/* The longest calibration accepted: a limit, not a need (means converge long before). */
#define KWK_CALIB_MAX_TOKENS (1 << 20)

struct kwk_capture;

/* Gram matrices (X^T X over every calibration token, for GPTQ) are kept while all of them
 * together fit in this many bytes; beyond, GPTQ works from the kept rows. */
#define KWK_CALIB_MAX_GRAM_BYTES ((int64_t)2 << 30)

/* Run m in float over ids[n] (every id in [0, n_vocab)) on n_threads and keep every layer's matrix
 * inputs (with want_gram, their Gram matrices too). 0 with *out, or a negative code with err. */
int kwk_calib_capture(const struct kwk_model *m, const int32_t *ids, int64_t n, int n_threads,
                      int want_gram, struct kwk_capture **out, struct kwk_err *err);
void kwk_capture_free(struct kwk_capture *c);

/* The input of layer `layer`'s matrices at `site` (enum kwk_site); layer == n_layers is the
 * lm_head's input (the output-normed final hidden state; site ignored). */
const struct kwk_calib_input *kwk_capture_input(const struct kwk_capture *c, int layer,
                                                int site);

/* X^T X ([dim][dim], symmetric) of that input over every calibration token, or NULL when none
 * was kept. */
const float *kwk_capture_gram(const struct kwk_capture *c, int layer, int site);

#endif
