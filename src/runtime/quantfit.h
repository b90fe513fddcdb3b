/* quantfit.h - fitting quantized weights to calibration activations: AWQ per-input-channel
 * scales and GPTQ packing (error feedback through the inputs' Hessian). Pure functions of their
 * arguments; any thread, concurrently on different pools. A pool passed in must be idle and
 * driven by the calling thread (these functions run tasks on it); NULL runs on this thread. */
#ifndef KWK_QUANTFIT_H
#define KWK_QUANTFIT_H

#include <stdint.h>

#include "base/base.h"
#include "base/pool.h"
#include "kernels/kernels.h"

/* The activations that enter one set of matrices (e.g. the q/k/v projections' shared input),
 * captured by running the float model over the calibration tokens. Borrowed by the functions
 * below, never modified. */
struct kwk_calib_input {
    int64_t dim;      /* input channels (= the matrices' cols) */
    int64_t n_rows;   /* activation rows kept (<= a few thousand) */
    const float *x;   /* [n_rows][dim] kept activations (a uniform sample of the calib tokens) */
    const float *absmean; /* [dim] mean |x| over every calib token */
};

/* kwk_awq_scales evaluates its error on at most KWK_AWQ_MAX_ROWS rows of in->x and
 * KWK_AWQ_MAX_OUT rows of each matrix (uniform subsamples, each matrix's error scaled to all its
 * rows): the error's ranking of alphas, not its value, is what matters, and packing each
 * candidate is most of the cost. */
#define KWK_AWQ_MAX_ROWS 256
#define KWK_AWQ_MAX_OUT 256
/* The alpha grid: alpha = i / KWK_AWQ_STEPS, i in [0, KWK_AWQ_STEPS] (AWQ's 0.05), searched
 * coarse to fine (10 evaluations). Must be a multiple of 4. */
#define KWK_AWQ_STEPS 20
/* The least relative gain in output error over alpha = 0 for which scales are kept. */
#define KWK_AWQ_MIN_GAIN 0.05

/* AWQ (Lin et al. 2023): per-input-channel scales s[dim] for the n_w matrices w[i] (each
 * rows_i x dim, any wtype mat_row reads) that share input `in`, quantized in wtypes[i]
 * (KWK_W_Q8, KWK_W_Q4, ...). s = absmean^alpha normalised so sqrt(max(s) * min(s)) = 1
 * (channels with absmean 0 take the smallest positive one); alpha is the grid point whose
 * quantized outputs are closest (sum of squared output error over the evaluated rows of every
 * matrix, see above) to the float outputs, where W is quantized as
 * Q(W diag(s)) and its input is x diag(1/s). alpha = 0 gives s = 1 exactly. *alpha_out (may be
 * NULL) = the choice. pool NULL = this thread; the result does not depend on the pool's size.
 * Returns 0, KWK_EARG (shapes disagree, a wtype that does not quantize, n_w < 1), KWK_ELIMIT
 * (sizes overflow) or -ENOMEM; s is then unspecified. */
/* The scales kwk_awq_scales uses for exponent alpha: absmean^alpha normalised so that
 * sqrt(max * min) = 1 (exactly 1 for alpha = 0 or equal channels; channels never active take the
 * smallest positive mean). */
void kwk_awq_scales_at(const float *absmean, long dim, double alpha, float *s);

int kwk_awq_scales(const struct kwk_mat *const *w, const int *wtypes, int n_w,
                   const struct kwk_calib_input *in, float *s, float *alpha_out,
                   struct kwk_pool *pool, struct kwk_err *err);

/* GPTQ (Frantar et al. 2022), packing into dst directly. dst->wtype, rows and cols are set
 * (rows, cols = src's) and dst->data holds kwk_quant_bytes(dst->wtype, rows, cols) bytes,
 * owned by the caller. The matrix quantized is W'[r][k] = row_scale[r] * src[r][k] * col_scale[k]
 * (either scale NULL = 1) for inputs x diag(1/col_scale): H = X'^T X' of the kept rows, dead
 * inputs (H_jj == 0) given H_jj = 1 (their weights are kept, not zeroed), damped by
 * damp x mean diagonal (GPTQ's 0.01; grown tenfold, up to 3 times, if H is still not positive
 * definite in double); the upper Cholesky factor U of H^-1 (double). Columns are quantized in
 * order, each group's parameters fitted (kwk_quant_fit) on the current updated weights when the
 * group starts, the rounding error e spread over later columns: w_k -= e / U_jj * U_jk.
 * Memory: dim^2 doubles + dim^2 floats + in->n_rows * dim floats. pool NULL = this thread; the
 * bytes do not depend on the pool's size. Returns 0, KWK_EARG (shapes, wtype, a column scale
 * not positive and finite, a row scale not finite, damp < 0 or not finite), KWK_ELIMIT (sizes
 * overflow), KWK_ERUNTIME (H not positive definite even damped: non-finite activations) or
 * -ENOMEM. */
int kwk_gptq_pack(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                  const struct kwk_calib_input *in, float damp, struct kwk_mat *dst,
                  struct kwk_pool *pool, struct kwk_err *err);

/* kwk_gptq_pack with H given as gram ([dim][dim] float, symmetric, borrowed): X^T X of the
 * unscaled activations, e.g. summed over every calibration token rather than the kept rows
 * (GPTQ overfits an H of fewer rows than channels: it moves error into directions the rows do
 * not span). The scaled H' is gram[j][k] / (col_scale[j] * col_scale[k]). Memory: dim^2
 * doubles + dim^2 floats. Returns as kwk_gptq_pack (KWK_EARG when dim != src->cols). */
int kwk_gptq_pack_gram(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                       const float *gram, int64_t dim, float damp, struct kwk_mat *dst,
                       struct kwk_pool *pool, struct kwk_err *err);

/* Round-to-nearest packing of W' (as kwk_gptq_pack defines it, no calibration) into dst
 * (prepared as for kwk_gptq_pack) through kwk_quant_pack_rows: the one place AWQ-only matrices
 * are packed. With both scales NULL the bytes equal plain packing. Returns 0, KWK_EARG,
 * KWK_ELIMIT or -ENOMEM. pool NULL = this thread. */
int kwk_scaled_pack(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                    struct kwk_mat *dst, struct kwk_pool *pool, struct kwk_err *err);

#endif
