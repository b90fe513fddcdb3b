/* ref.c - the kernels in plain C: the specification every SIMD table is tested against, and the
 * fallback when the CPU has no AVX2. Pure functions; any thread. */
#include <math.h>

#include "base/base.h"
#include "kernels/bf16t.h"
#include "kernels/kernels.h"
#include "kernels/panel.h"
#include "kernels/quant.h"

/* Sequential float32 sums in index order: the simplest statement of each kernel. */

static float row_dot_f32(const float *w, const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t k = 0; k < n; k++)
        s += w[k] * x[k];
    return s;
}

static float row_dot_f16(const uint16_t *w, const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t k = 0; k < n; k++)
        s += kwk_f16_to_f32(w[k]) * x[k];
    return s;
}

static float row_dot_bf16(const uint16_t *w, const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t k = 0; k < n; k++)
        s += kwk_bf16_to_f32(w[k]) * x[k];
    return s;
}

static float row_dot(const struct kwk_mat *w, int64_t r, const float *x)
{
    int64_t n = w->cols;
    switch (w->wtype) {
    case KWK_W_F16:
        return row_dot_f16((const uint16_t *)w->data + r * n, x, n);
    case KWK_W_BF16:
        return row_dot_bf16((const uint16_t *)w->data + r * n, x, n);
    default:
        return row_dot_f32((const float *)w->data + r * n, x, n);
    }
}

static void ref_matmul(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                       int64_t r0, int64_t r1)
{
    if (w->wtype == KWK_W_Q8 || w->wtype == KWK_W_Q4 || w->wtype == KWK_W_Q6) {
        kwk_quant_matmul_ref(w, x, n_tok, y, ldy, r0, r1);
        return;
    }
    if (w->wtype == KWK_W_BF16P) {
        kwk_panel_matmul_ref(w, x, n_tok, y, ldy, r0, r1);
        return;
    }
    if (w->wtype == KWK_W_BF16T) {
        kwk_bf16t_matmul_ref(w, x, n_tok, y, ldy, r0, r1);
        return;
    }
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = r0; r < r1; r++)
            y[(int64_t)t * ldy + r] = row_dot(w, r, x + (int64_t)t * w->cols);
}

static void ref_mat_row(const struct kwk_mat *w, int64_t r, float *out)
{
    if (w->wtype == KWK_W_Q8 || w->wtype == KWK_W_Q4 || w->wtype == KWK_W_Q6) {
        kwk_quant_mat_row_ref(w, r, out);
        return;
    }
    if (w->wtype == KWK_W_BF16P) {
        kwk_panel_mat_row(w, r, out);
        return;
    }
    if (w->wtype == KWK_W_BF16T) {
        kwk_bf16t_mat_row(w, r, out);
        return;
    }
    int64_t n = w->cols;
    const uint16_t *h = (const uint16_t *)w->data + r * n;
    switch (w->wtype) {
    case KWK_W_F16:
        for (int64_t k = 0; k < n; k++)
            out[k] = kwk_f16_to_f32(h[k]);
        break;
    case KWK_W_BF16:
        for (int64_t k = 0; k < n; k++)
            out[k] = kwk_bf16_to_f32(h[k]);
        break;
    default:
        for (int64_t k = 0; k < n; k++)
            out[k] = ((const float *)w->data)[r * n + k];
        break;
    }
}

static float ref_dot(const float *a, const float *b, long n)
{
    return row_dot_f32(a, b, n);
}

static void ref_axpy(float *y, float a, const float *x, long n)
{
    for (long i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* As PyTorch's RMSNorm in float32: mean of squares, 1/sqrt(mean + eps), then x * scale * w. */
static void ref_rmsnorm(float *y, const float *x, const float *w, long n, float eps)
{
    float ss = 0.0f;
    for (long i = 0; i < n; i++)
        ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (long i = 0; i < n; i++)
        y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

static void ref_softmax(float *x, long n)
{
    if (n <= 0)
        return;
    float mx = x[0];
    for (long i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (long i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (long i = 0; i < n; i++)
        x[i] /= sum;
}

/* SiLU written as PyTorch computes it: g / (1 + exp(-g)). */
static void ref_swiglu(float *g, const float *u, long n)
{
    for (long i = 0; i < n; i++)
        g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void ref_geglu(float *g, const float *u, long n)
{
    for (long i = 0; i < n; i++) {
        float x = g[i];
        g[i] = x / (1.0f + expf(-x * (KWK_GELU_A + KWK_GELU_B * x * x))) * u[i];
    }
}

static void ref_gelu(float *x, long n)
{
    for (long i = 0; i < n; i++)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

static void ref_to_half(uint16_t *y, const float *x, long n)
{
    for (long i = 0; i < n; i++)
        y[i] = kwk_f32_to_f16(x[i]);
}

static void ref_from_half(float *y, const uint16_t *x, long n)
{
    for (long i = 0; i < n; i++)
        y[i] = kwk_f16_to_f32(x[i]);
}

const struct kwk_kernels kwk_kernels_ref = {
    .name = "scalar",
    .matmul = ref_matmul,
    .mat_row = ref_mat_row,
    .quant_rows = kwk_quant_rows_ref,
    .matmul_q = kwk_quant_matmul_q_ref,
    .dot = ref_dot,
    .axpy = ref_axpy,
    .rmsnorm = ref_rmsnorm,
    .softmax = ref_softmax,
    .swiglu = ref_swiglu,
    .geglu = ref_geglu,
    .gelu = ref_gelu,
    .to_half = ref_to_half,
    .from_half = ref_from_half,
    .dec_runs = 1,
};
