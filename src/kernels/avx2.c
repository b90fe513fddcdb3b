/* avx2.c - the kernels with AVX2 + FMA + F16C (compiled with those flags only; chosen at run time
 * by dispatch.c). Pure functions; any thread. Must agree with ref.c to float rounding. */
#include <immintrin.h>
#include <math.h>

#include "base/base.h"
#include "kernels/avx2_exp.h"
#include "kernels/bf16t.h"
#include "kernels/float_rows.h"
#include "kernels/gelu_erf.h"
#include "kernels/kernels.h"
#include "kernels/panel.h"
#include "kernels/quant.h"

#define INLINE static inline __attribute__((always_inline))

/* Tile shape of the prompt path: 3 x 4 accumulators + 3 weight registers + 1 activation register
 * = the 16 ymm registers. Each step loads 3 + 4 vectors for 12 FMAs; with 2 x 6 it loaded 2 + 6,
 * the 6 activation rows streaming from L2 (only the weights stay in L1 across a block's token
 * tiles) at ~32 bytes a cycle, Zen 3's L2 bandwidth: bf16 n_tok = 64 on one thread 62-68 ->
 * 76-81 GFLOP/s (bench_kernels 576 1536 / 1536 576 / 960 2560). 4 x 3 needs 17 registers. */
#define ROWS 3
#define TOKS 4
/* Columns per pass: a tile's rows of weights (3 x 4 KiB in bf16) stay in L1 across the token
 * tiles of a block. */
#define KC 2048
/* Tokens per pass: their KC-column slice of activations (TB * 8 KiB) stays in L2. */
#define TB 48

/* 8 weights from element idx of a row, widened exactly to float32 (wt folds after inlining). */
INLINE __m256 ldw(const void *row, int64_t idx, int wt)
{
    switch (wt) {
    case KWK_W_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + idx)));
    case KWK_W_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + idx));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    default:
        return _mm256_loadu_ps((const float *)row + idx);
    }
}

/* One weight, widened exactly (the scalar tails). */
INLINE float ldw1(const void *row, int64_t idx, int wt)
{
    switch (wt) {
    case KWK_W_F16:
        return _cvtsh_ss(((const uint16_t *)row)[idx]);
    case KWK_W_BF16:
        return kwk_bf16_to_f32(((const uint16_t *)row)[idx]);
    default:
        return ((const float *)row)[idx];
    }
}

INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- each (row, token) sum is accumulated in the same order whatever n_tok, the row range or
 * the tile it falls in, and decode (below) keeps that order too, so a token's logits are bitwise
 * the same alone or in a batch (speculation and batched serving rely on it): 8 lanes over
 * columns [k0, k1) of a KC pass in steps of 8, their sum, the columns left one by one, then
 * added to the earlier passes' sum. */

/* ---- prompt: many tokens, compute-bound. An R x T register tile of dot products over columns
 * [k0, k1); R and T are constants after inlining so the accumulators live in registers. */
INLINE void tile(const struct kwk_mat *w, const float *x, float *y, long ldy, int64_t r, int t,
                 int64_t k0, int64_t k1, int first, int R, int T, int wt)
{
    const void *wr[ROWS];
    const float *xt[TOKS];
    __m256 acc[ROWS][TOKS];
    int64_t cols = w->cols;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        wr[i] = kwk_row_ptr(w, r + i, wt);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm256_setzero_ps();
    }
#pragma GCC unroll 8
    for (int j = 0; j < T; j++)
        xt[j] = x + (int64_t)(t + j) * cols;
    int64_t k = k0;
    for (; k + 8 <= k1; k += 8) {
        __m256 wv[ROWS];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            wv[i] = ldw(wr[i], k, wt);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m256 xv = _mm256_loadu_ps(xt[j] + k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i][j] = _mm256_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        float *yt = y + (int64_t)(t + j) * ldy + r;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            float s = hsum(acc[i][j]);
            for (int64_t kk = k; kk < k1; kk++)
                s = fmaf(ldw1(wr[i], kk, wt), xt[j][kk], s);
            yt[i] = first ? s : yt[i] + s;
        }
    }
}

/* The tiles of R rows (1 .. 3) and T tokens (1 .. 4): tiles_NAME[R][T]. */
#define TILES_OF(R, WT, NAME)                                                                    \
    TILE_FN(R, 1, WT, NAME) TILE_FN(R, 2, WT, NAME) TILE_FN(R, 3, WT, NAME) TILE_FN(R, 4, WT, NAME)
#define TILES_ROW(R, NAME)                                                                       \
    {NULL, tile_##NAME##_##R##_1, tile_##NAME##_##R##_2, tile_##NAME##_##R##_3,                \
     tile_##NAME##_##R##_4}
#define TILES_FOR(WT, NAME)                                                                      \
    TILES_OF(1, WT, NAME) TILES_OF(2, WT, NAME) TILES_OF(3, WT, NAME)                            \
    static const tile_fn tiles_##NAME[ROWS + 1][TOKS + 1] = {                                    \
        {NULL}, TILES_ROW(1, NAME), TILES_ROW(2, NAME), TILES_ROW(3, NAME)};
_Static_assert(ROWS == 3 && TOKS == 4, "TILES_FOR lists the tiles of 3 x 4");

TILES_FOR(KWK_W_F32, f32)
TILES_FOR(KWK_W_F16, f16)
TILES_FOR(KWK_W_BF16, bf16)

/* Loop order: token blocks (activations slice in L2), column passes, then row groups (weights
 * slice in L1 across the token tiles of the block). */
static void gemm(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                 int64_t r0, int64_t r1, const tile_fn tiles[ROWS + 1][TOKS + 1])
{
    int64_t cols = w->cols;
    for (int tb = 0; tb < n_tok; tb += TB) {
        int te = KWK_MIN(n_tok, tb + TB);
        for (int64_t k0 = 0; k0 < cols; k0 += KC) {
            int64_t k1 = KWK_MIN(cols, k0 + KC);
            int first = k0 == 0;
            for (int64_t r = r0; r < r1;) {
                int R = (int)KWK_MIN(ROWS, r1 - r);
                for (int t = tb; t < te; t += TOKS) {
                    int T = KWK_MIN(TOKS, te - t);
                    tiles[R][T](w, x, y, ldy, r, t, k0, k1, first);
                }
                r += R;
            }
        }
    }
}

/* ---- decode: one token, memory-bound. A thread's rows [r0, r1) lie contiguous in memory; they
 * are cut into KWK_DEC_STREAMS runs of consecutive rows and each step takes the next row of every
 * run, so the matrix is read as KWK_DEC_STREAMS long sequential streams, each also prefetched
 * KWK_DEC_PF_BYTES ahead. Before, a tile read 2 adjacent rows side by side, asking for the next
 * tile's rows as it went: short streams (a row of SmolLM2-360M is 1920 bytes in bf16) that end
 * about when the hardware prefetcher has learnt them. Zen 3, bf16, bench_kernels 2560 960 /
 * 1536 576, one thread: 13-16 -> 27-30 GB/s (a plain one-stream read: 22.6); preserve
 * generation x1.41 (135M), x1.63 (360M). 2 or 3 streams, or 1024 / 3072 / no prefetch,
 * measured the same or slower. Each row keeps its one accumulator and its KC passes: the
 * prompt tile's sums, bitwise. */

INLINE void dec_rows(const struct kwk_mat *w, const float *x, float *y, int64_t r, int64_t run,
                     int64_t end, int pf_l2, int R, int wt)
{
    const char *wr[KWK_DEC_STREAMS], *stop[KWK_DEC_STREAMS];
    int64_t cols = w->cols;
    size_t esz = kwk_wt_bytes(wt);
    kwk_dec_streams(w, r, run, end, R, wt, wr, stop);
    for (int64_t k0 = 0; k0 < cols; k0 += KC) {
        int64_t k1 = KWK_MIN(cols, k0 + KC), k = k0;
        __m256 acc[KWK_DEC_STREAMS];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            acc[i] = _mm256_setzero_ps();
        for (; k + 8 <= k1; k += 8) {
            kwk_dec_prefetch(wr, stop, R, k, esz, pf_l2);
            __m256 xv = _mm256_loadu_ps(x + k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i] = _mm256_fmadd_ps(ldw(wr[i], k, wt), xv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            float s = hsum(acc[i]);
            for (int64_t kk = k; kk < k1; kk++)
                s = fmaf(ldw1(wr[i], kk, wt), x[kk], s);
            float *yr = y + r + i * run;
            *yr = k0 == 0 ? s : *yr + s;
        }
    }
}

DECS_FOR(KWK_W_F32, f32)
DECS_FOR(KWK_W_F16, f16)
DECS_FOR(KWK_W_BF16, bf16)

static void avx2_matmul(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                        int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
    if (w->cols <= 0) {
        for (int t = 0; t < n_tok; t++)
            for (int64_t r = r0; r < r1; r++)
                y[(int64_t)t * ldy + r] = 0.0f;
        return;
    }
    switch (w->wtype) {
    case KWK_W_Q8:
    case KWK_W_Q4:
    case KWK_W_Q6:
        kwk_quant_matmul_avx2(w, x, n_tok, y, ldy, r0, r1);
        break;
    case KWK_W_BF16P:
        kwk_panel_matmul_avx2(w, x, n_tok, y, ldy, r0, r1);
        break;
    case KWK_W_BF16T: /* packed for the AVX-512 table (bf16t.h): the specification serves */
        kwk_bf16t_matmul_ref(w, x, n_tok, y, ldy, r0, r1);
        break;
    case KWK_W_F16:
        if (n_tok == 1)
            kwk_dec_gemm(w, x, y, r0, r1, decs_f16);
        else
            gemm(w, x, n_tok, y, ldy, r0, r1, tiles_f16);
        break;
    case KWK_W_BF16:
        if (n_tok == 1)
            kwk_dec_gemm(w, x, y, r0, r1, decs_bf16);
        else
            gemm(w, x, n_tok, y, ldy, r0, r1, tiles_bf16);
        break;
    default:
        if (n_tok == 1)
            kwk_dec_gemm(w, x, y, r0, r1, decs_f32);
        else
            gemm(w, x, n_tok, y, ldy, r0, r1, tiles_f32);
        break;
    }
}

INLINE void widen_row(const void *row, int64_t n, float *out, int wt)
{
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(out + k, ldw(row, k, wt));
    for (; k < n; k++)
        out[k] = ldw1(row, k, wt);
}

static void avx2_mat_row(const struct kwk_mat *w, int64_t r, float *out)
{
    switch (w->wtype) {
    case KWK_W_Q8:
    case KWK_W_Q4:
    case KWK_W_Q6:
        kwk_quant_mat_row_ref(w, r, out);
        break;
    case KWK_W_BF16P:
        kwk_panel_mat_row(w, r, out);
        break;
    case KWK_W_BF16T:
        kwk_bf16t_mat_row(w, r, out);
        break;
    case KWK_W_F16:
        widen_row(kwk_row_ptr(w, r, KWK_W_F16), w->cols, out, KWK_W_F16);
        break;
    case KWK_W_BF16:
        widen_row(kwk_row_ptr(w, r, KWK_W_BF16), w->cols, out, KWK_W_BF16);
        break;
    default:
        widen_row(kwk_row_ptr(w, r, KWK_W_F32), w->cols, out, KWK_W_F32);
        break;
    }
}

static float avx2_dot(const float *a, const float *b, long n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    long i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s = fmaf(a[i], b[i], s);
    return s;
}

static void avx2_axpy(float *y, float a, const float *x, long n)
{
    __m256 av = _mm256_set1_ps(a);
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] = fmaf(a, x[i], y[i]);
}

static void avx2_rmsnorm(float *y, const float *x, const float *w, long n, float eps)
{
    float ss = avx2_dot(x, x, n);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 sv = _mm256_set1_ps(scale);
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sv);
        if (w)
            v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++)
        y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}


static void avx2_softmax(float *x, long n)
{
    if (n <= 0)
        return;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    long i = 0;
    for (; i + 8 <= n; i += 8)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float mx = _mm_cvtss_f32(m4);
    for (long j = i; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    __m256 mxv = _mm256_set1_ps(mx), sv = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mxv));
        _mm256_storeu_ps(x + i, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum(sv);
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    __m256 sumv = _mm256_set1_ps(sum);
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), sumv));
    for (; i < n; i++)
        x[i] /= sum;
}

/* SiLU(x) = x / (1 + exp(-x)); gelu_tanh(x) = x / (1 + exp(-x (A + B x^2))), kernels.h's
 * geglu, its polynomial rounded as ref.c's (no FMA). */
INLINE __m256 gate8(__m256 x, int gelu)
{
    __m256 z = x;
    if (gelu) {
        const __m256 a = _mm256_set1_ps(KWK_GELU_A), b = _mm256_set1_ps(KWK_GELU_B);
        z = _mm256_mul_ps(x, _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(b, x), x)));
    }
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* g = gate(g) * u; gelu is a constant at each call. The tail is ref.c's own: scalar code here
 * may be contracted into FMAs (clang does under this file's -mfma) and round otherwise. */
INLINE void gated_rows(float *g, const float *u, long n, int gelu)
{
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, _mm256_mul_ps(gate8(_mm256_loadu_ps(g + i), gelu),
                                              _mm256_loadu_ps(u + i)));
    if (i < n)
        (gelu ? kwk_kernels_ref.geglu : kwk_kernels_ref.swiglu)(g + i, u + i, n - i);
}

static void avx2_swiglu(float *g, const float *u, long n)
{
    gated_rows(g, u, n, 0);
}

static void avx2_geglu(float *g, const float *u, long n)
{
    gated_rows(g, u, n, 1);
}

/* exp(-x^2 / 2) as exp(-s) (1 - e), s = x^2 / 2 rounded and e = x^2 / 2 - s exact (an FMA):
 * from z = x / sqrt2 rounded, exp(-z^2) would be off by up to 1e-5 of itself near z = 8. */
INLINE __m256 exp_neg_half_sq256(__m256 x)
{
    /* past |x| = sqrt2 GELU_A_MAX the value is 0 in float anyway; clamped, x^2 cannot reach
     * inf (and inf - inf make NaN) for a huge or infinite x */
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-1.4142135f * GELU_A_MAX)),
                      _mm256_set1_ps(1.4142135f * GELU_A_MAX));
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256 sq = _mm256_mul_ps(x, x);
    __m256 e = _mm256_mul_ps(_mm256_fmsub_ps(x, x, sq), half);
    __m256 v = exp256(_mm256_mul_ps(sq, _mm256_set1_ps(-0.5f)));
    return _mm256_fnmadd_ps(v, e, v);
}

/* x Phi(x) by kernels/gelu_erf.h's two polynomials, both computed, one chosen per lane. */
INLINE __m256 gelu8(__m256 x)
{
    __m256 z = _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f));
    __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), z), s = _mm256_mul_ps(z, z);
    __m256 p = _mm256_set1_ps(gelu_p[GELU_P_DEG]);
    for (int k = GELU_P_DEG - 1; k >= 0; k--)
        p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(gelu_p[k]));
    __m256 half = _mm256_set1_ps(0.5f);
    __m256 phi_in = _mm256_fmadd_ps(_mm256_mul_ps(z, p), half, half); /* (1 + erf z) / 2 */
    __m256 u = _mm256_sub_ps(_mm256_div_ps(_mm256_set1_ps(1.0f),
                                           _mm256_min_ps(_mm256_max_ps(a, _mm256_set1_ps(1.0f)),
                                                         _mm256_set1_ps(GELU_A_MAX))),
                             _mm256_set1_ps(GELU_U0));
    __m256 g = _mm256_set1_ps(gelu_g[GELU_G_DEG]);
    for (int k = GELU_G_DEG - 1; k >= 0; k--)
        g = _mm256_fmadd_ps(g, u, _mm256_set1_ps(gelu_g[k]));
    __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(exp_neg_half_sq256(x),
                                                   g), half);
    /* beyond a = GELU_A_MAX erfc is 0 (its float would be subnormal, which a huge x scales
     * back up) */
    half_erfc = _mm256_and_ps(half_erfc,
                              _mm256_cmp_ps(a, _mm256_set1_ps(GELU_A_MAX), _CMP_LE_OQ));
    __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
    __m256 phi_out = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc,
                                      neg);
    __m256 inner = _mm256_cmp_ps(a, _mm256_set1_ps(1.0f), _CMP_LE_OQ);
    return _mm256_mul_ps(x, _mm256_blendv_ps(phi_out, phi_in, inner));
}

static void avx2_gelu(float *x, long n)
{
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, gelu8(_mm256_loadu_ps(x + i)));
    if (i < n)
        kwk_kernels_ref.gelu(x + i, n - i);
}

/* kwk_f32_to_f16 eight at a time: the F16C conversion (nearest even), then its saturation and
 * NaN patched in 32-bit lanes and the lanes packed back to 16 bits. */
static void avx2_to_half(uint16_t *y, const float *x, long n)
{
    const __m256i sgn = _mm256_set1_epi32(0x8000), sat = _mm256_set1_epi32(0x7bff);
    const __m256i nan = _mm256_set1_epi32(0x7e00);
    const __m256 lim = _mm256_set1_ps(65504.0f);
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_loadu_ps(x + i);
        __m256i s = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(f), 16), sgn);
        __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), f);
        __m256i v = _mm256_cvtepu16_epi32(
            _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        v = _mm256_blendv_epi8(v, _mm256_or_si256(s, sat),
                               _mm256_castps_si256(_mm256_cmp_ps(a, lim, _CMP_GT_OQ)));
        v = _mm256_blendv_epi8(v, _mm256_or_si256(s, nan),
                               _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
        __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storeu_si128((__m128i *)(y + i), h);
    }
    for (; i < n; i++)
        y[i] = kwk_f32_to_f16(x[i]);
}

static void avx2_from_half(float *y, const uint16_t *x, long n)
{
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++)
        y[i] = kwk_f16_to_f32(x[i]);
}

const struct kwk_kernels kwk_kernels_avx2 = {
    .name = "avx2",
    .matmul = avx2_matmul,
    .mat_row = avx2_mat_row,
    .quant_rows = kwk_quant_rows_avx2,
    .matmul_q = kwk_quant_matmul_q_avx2,
    .dot = avx2_dot,
    .axpy = avx2_axpy,
    .rmsnorm = avx2_rmsnorm,
    .softmax = avx2_softmax,
    .swiglu = avx2_swiglu,
    .geglu = avx2_geglu,
    .gelu = avx2_gelu,
    .to_half = avx2_to_half,
    .from_half = avx2_from_half,
    .bf16_panels = 1,
    .dec_runs = KWK_DEC_STREAMS, /* float_rows.h; avx2_panel.c reads panels alike */
};
