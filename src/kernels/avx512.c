/* avx512.c - the kernels with AVX-512 F/BW/VL/DQ (compiled with those flags only; chosen at run
 * time by dispatch.c). Pure functions; any thread. Must agree with ref.c to float rounding. */
#include <immintrin.h>
#include <math.h>

#include "base/base.h"
#include "kernels/amx_bf16.h"
#include "kernels/avx512_exp.h"
#include "kernels/bf16t.h"
#include "kernels/float_rows.h"
#include "kernels/gelu_erf.h"
#include "kernels/kernels.h"
#include "kernels/panel.h"
#include "kernels/quant.h"

#define INLINE static inline __attribute__((always_inline))

/* Tile shape of the prompt path: ROWS x TOKS accumulators (24 of the 32 zmm registers), plus one
 * register per row of weights and one for activations. */
#define ROWS 4
#define TOKS 6
/* Columns per pass of the prompt path: a 4-row slice of weights (8..16 KiB) stays in L1 while it
 * is used for every token of the block. */
#define KC 2048
/* Tokens per pass: their KC-column slice of activations (TB * 8 KiB) stays in L2. */
#define TB 96

/* 16 weights from element idx of a row, widened exactly to float32. wt is a constant after
 * inlining, so the switch folds away. */
INLINE __m512 ldw(const void *row, int64_t idx, int wt)
{
    switch (wt) {
    case KWK_W_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + idx)));
    case KWK_W_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + idx));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default:
        return _mm512_loadu_ps((const float *)row + idx);
    }
}

/* The same for the last n < 16 elements; lanes past n are zero and nothing past n is read. */
INLINE __m512 ldw_tail(const void *row, int64_t idx, __mmask16 m, int wt)
{
    switch (wt) {
    case KWK_W_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + idx));
    case KWK_W_BF16: {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + idx);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default:
        return _mm512_maskz_loadu_ps(m, (const float *)row + idx);
    }
}

INLINE __mmask16 tail_mask(int64_t n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* ---- one code path for any number of tokens: each (row, token) sum is accumulated in the same
 * order whatever n_tok, the row range or the tile it falls in, so a token's logits are bitwise
 * the same alone or in a batch (speculation and batched serving rely on it). Decode (n_tok = 1)
 * is memory-bound: four rows of one accumulator each keep enough FMAs in flight. */

/* ---- prompt: many tokens, compute-bound. An R x T register tile of dot products over the
 * columns [k0, k1): every weight load feeds T FMAs and every activation load feeds R. The tile's
 * sums are stored (first column pass) or added (later passes) to y. R and T are constants after
 * inlining, so the accumulator array lives in registers. */
INLINE void tile(const struct kwk_mat *w, const float *x, float *y, long ldy, int64_t r, int t,
                 int64_t k0, int64_t k1, int first, int R, int T, int wt)
{
    const void *wr[ROWS];
    const float *xt[TOKS];
    __m512 acc[ROWS][TOKS];
    int64_t cols = w->cols;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        wr[i] = kwk_row_ptr(w, r + i, wt);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++)
            acc[i][j] = _mm512_setzero_ps();
    }
#pragma GCC unroll 8
    for (int j = 0; j < T; j++)
        xt[j] = x + (int64_t)(t + j) * cols;
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
        __m512 wv[ROWS];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            wv[i] = ldw(wr[i], k, wt);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m512 xv = _mm512_loadu_ps(xt[j] + k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
    if (k < k1) {
        __mmask16 m = tail_mask(k1 - k);
        __m512 wv[ROWS];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            wv[i] = ldw_tail(wr[i], k, m, wt);
#pragma GCC unroll 8
        for (int j = 0; j < T; j++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, xt[j] + k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i][j] = _mm512_fmadd_ps(wv[i], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < T; j++) {
        float *yt = y + (int64_t)(t + j) * ldy + r;
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            float s = _mm512_reduce_add_ps(acc[i][j]);
            yt[i] = first ? s : yt[i] + s;
        }
    }
}

/* One instance per (R, T) used (TILE_FN, float_rows.h): full tiles, a partial token block, and
 * single leftover rows. */

#define TILES_FOR(WT, NAME)                                                                      \
    TILE_FN(4, 1, WT, NAME) TILE_FN(4, 2, WT, NAME) TILE_FN(4, 3, WT, NAME)                      \
    TILE_FN(4, 4, WT, NAME) TILE_FN(4, 5, WT, NAME) TILE_FN(4, 6, WT, NAME)                      \
    TILE_FN(1, 1, WT, NAME) TILE_FN(1, 2, WT, NAME) TILE_FN(1, 3, WT, NAME)                      \
    TILE_FN(1, 4, WT, NAME) TILE_FN(1, 5, WT, NAME) TILE_FN(1, 6, WT, NAME)                      \
    static const tile_fn tiles_##NAME[2][TOKS + 1] = {                                           \
        {NULL, tile_##NAME##_1_1, tile_##NAME##_1_2, tile_##NAME##_1_3, tile_##NAME##_1_4,       \
         tile_##NAME##_1_5, tile_##NAME##_1_6},                                                  \
        {NULL, tile_##NAME##_4_1, tile_##NAME##_4_2, tile_##NAME##_4_3, tile_##NAME##_4_4,       \
         tile_##NAME##_4_5, tile_##NAME##_4_6},                                                  \
    };

TILES_FOR(KWK_W_F32, f32)
TILES_FOR(KWK_W_F16, f16)
TILES_FOR(KWK_W_BF16, bf16)

/* ---- decode: one token, memory-bound. As avx2.c, through float_rows.h: a thread's rows are
 * read as KWK_DEC_STREAMS runs of consecutive rows, long sequential streams, each prefetched
 * KWK_DEC_PF_BYTES ahead. Before, the prompt tile read 4 adjacent rows and asked for the next
 * tile's as it went (short streams). Zen 5, 2 threads, interleaved: bench_kernels 2560 960 bf16
 * 34-43 -> 38-62 GB/s; preserve generation x1.39 (SmolLM2-360M), x1.13 (135M). (The quantized
 * decode's tiles of 4 adjacent blocks measured the same as 4 runs of blocks there:
 * avx512_quant.c keeps them.) Each row keeps the prompt tile's one accumulator, masked tail and
 * KC passes: its sums, bitwise. */

INLINE void dec_rows(const struct kwk_mat *w, const float *x, float *y, int64_t r, int64_t run,
                     int64_t end, int pf_l2, int R, int wt)
{
    const char *wr[KWK_DEC_STREAMS], *stop[KWK_DEC_STREAMS];
    int64_t cols = w->cols;
    size_t esz = kwk_wt_bytes(wt);
    kwk_dec_streams(w, r, run, end, R, wt, wr, stop);
    for (int64_t k0 = 0; k0 < cols; k0 += KC) {
        int64_t k1 = KWK_MIN(cols, k0 + KC), k = k0;
        __m512 acc[KWK_DEC_STREAMS];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++)
            acc[i] = _mm512_setzero_ps();
        for (; k + 16 <= k1; k += 16) {
            kwk_dec_prefetch(wr, stop, R, k, esz, pf_l2);
            __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i] = _mm512_fmadd_ps(ldw(wr[i], k, wt), xv, acc[i]);
        }
        if (k < k1) {
            __mmask16 m = tail_mask(k1 - k);
            __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++)
                acc[i] = _mm512_fmadd_ps(ldw_tail(wr[i], k, m, wt), xv, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            float s = _mm512_reduce_add_ps(acc[i]);
            float *yr = y + r + i * run;
            *yr = k0 == 0 ? s : *yr + s;
        }
    }
}

DECS_FOR(KWK_W_F32, f32)
DECS_FOR(KWK_W_F16, f16)
DECS_FOR(KWK_W_BF16, bf16)

/* Loop order: token blocks of TB (activations slice stays in L2), column passes of KC, then
 * 4-row groups (weights slice stays in L1 across the token tiles of the block). */
static void gemm(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                 int64_t r0, int64_t r1, const tile_fn tiles[2][TOKS + 1])
{
    int64_t cols = w->cols;
    for (int tb = 0; tb < n_tok; tb += TB) {
        int te = KWK_MIN(n_tok, tb + TB);
        for (int64_t k0 = 0; k0 < cols; k0 += KC) {
            int64_t k1 = KWK_MIN(cols, k0 + KC);
            int first = k0 == 0;
            for (int64_t r = r0; r < r1;) {
                int R = r + ROWS <= r1 ? ROWS : 1;
                for (int t = tb; t < te; t += TOKS) {
                    int T = KWK_MIN(TOKS, te - t);
                    tiles[R == ROWS][T](w, x, y, ldy, r, t, k0, k1, first);
                }
                r += R;
            }
        }
    }
}

static void avx512_matmul(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
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
        kwk_quant_matmul_avx512(w, x, n_tok, y, ldy, r0, r1);
        break;
    case KWK_W_BF16P: /* preserve packs panels for the AVX2 table only (kernels.h) */
        kwk_panel_matmul_avx2(w, x, n_tok, y, ldy, r0, r1);
        break;
    case KWK_W_BF16T: /* preserve's pack where kwk_cpu_amx_preserve() */
        kwk_bf16t_matmul_avx512(w, x, n_tok, y, ldy, r0, r1);
        break;
    case KWK_W_F16:
        if (n_tok == 1)
            kwk_dec_gemm(w, x, y, r0, r1, decs_f16);
        else
            gemm(w, x, n_tok, y, ldy, r0, r1, tiles_f16);
        break;
    case KWK_W_BF16:
        if (kwk_cpu_amx_preserve())
            kwk_bf16_matmul_amx(w, x, n_tok, y, ldy, r0, r1);
        else if (n_tok == 1)
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

static void avx512_mat_row(const struct kwk_mat *w, int64_t r, float *out)
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
    int64_t n = w->cols, k = 0;
    int wt = w->wtype;
    const void *row = kwk_row_ptr(w, r, wt);
    for (; k + 16 <= n; k += 16) {
        __m512 v = wt == KWK_W_F16 ? ldw(row, k, KWK_W_F16)
                   : wt == KWK_W_BF16 ? ldw(row, k, KWK_W_BF16)
                                      : ldw(row, k, KWK_W_F32);
        _mm512_storeu_ps(out + k, v);
    }
    if (k < n) {
        __mmask16 m = tail_mask(n - k);
        __m512 v = wt == KWK_W_F16 ? ldw_tail(row, k, m, KWK_W_F16)
                   : wt == KWK_W_BF16 ? ldw_tail(row, k, m, KWK_W_BF16)
                                      : ldw_tail(row, k, m, KWK_W_F32);
        _mm512_mask_storeu_ps(out + k, m, v);
    }
}

static float avx512_dot(const float *a, const float *b, long n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    long i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void avx512_axpy(float *y, float a, const float *x, long n)
{
    __m512 av = _mm512_set1_ps(a);
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i),
                                   _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static void avx512_rmsnorm(float *y, const float *x, const float *w, long n, float eps)
{
    float ss = avx512_dot(x, x, n);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    __m512 sv = _mm512_set1_ps(scale);
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), sv);
        if (w)
            v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        _mm512_storeu_ps(y + i, v);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), sv);
        if (w)
            v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}


static void avx512_softmax(float *x, long n)
{
    if (n <= 0)
        return;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    long i = 0;
    for (; i + 16 <= n; i += 16)
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
    float mx = _mm512_reduce_max_ps(mv);
    for (long j = i; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    __m512 mxv = _mm512_set1_ps(mx), sv = _mm512_setzero_ps();
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mxv));
        _mm512_storeu_ps(x + i, e);
        sv = _mm512_add_ps(sv, e);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mxv));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(x + i, m, e);
        sv = _mm512_add_ps(sv, e);
    }
    __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(sv));
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_div_ps(_mm512_loadu_ps(x + i), sum));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), sum));
    }
}

INLINE __m512 swiglu16(__m512 g, __m512 u)
{
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

/* gelu_tanh(g) * u as g / (1 + exp(-g (A + B g^2))): kernels.h's geglu; the polynomial rounded
 * as ref.c's (no FMA), so that tails and bodies agree. */
INLINE __m512 geglu16(__m512 g, __m512 u)
{
    const __m512 a = _mm512_set1_ps(KWK_GELU_A), b = _mm512_set1_ps(KWK_GELU_B);
    __m512 z = _mm512_mul_ps(g, _mm512_add_ps(a, _mm512_mul_ps(_mm512_mul_ps(b, g), g)));
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), z));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

/* g = gate(g) * u over n elements, 16 at a time and a masked tail; gelu is a constant at each
 * call, so the branch folds away. */
INLINE void gated_rows(float *g, const float *u, long n, int gelu)
{
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i), uv = _mm512_loadu_ps(u + i);
        _mm512_storeu_ps(g + i, gelu ? geglu16(gv, uv) : swiglu16(gv, uv));
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
        _mm512_mask_storeu_ps(g + i, m, gelu ? geglu16(gv, uv) : swiglu16(gv, uv));
    }
}

static void avx512_swiglu(float *g, const float *u, long n)
{
    gated_rows(g, u, n, 0);
}

static void avx512_geglu(float *g, const float *u, long n)
{
    gated_rows(g, u, n, 1);
}

/* exp(-x^2 / 2) as exp(-s) (1 - e), s = x^2 / 2 rounded and e = x^2 / 2 - s exact (an FMA):
 * from z = x / sqrt2 rounded, exp(-z^2) would be off by up to 1e-5 of itself near z = 8. */
INLINE __m512 exp_neg_half_sq512(__m512 x)
{
    /* past |x| = sqrt2 GELU_A_MAX the value is 0 in float anyway; clamped, x^2 cannot reach
     * inf (and inf - inf make NaN) for a huge or infinite x */
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-1.4142135f * GELU_A_MAX)),
                      _mm512_set1_ps(1.4142135f * GELU_A_MAX));
    const __m512 half = _mm512_set1_ps(0.5f);
    __m512 sq = _mm512_mul_ps(x, x);
    __m512 e = _mm512_mul_ps(_mm512_fmsub_ps(x, x, sq), half);
    __m512 v = exp512(_mm512_mul_ps(sq, _mm512_set1_ps(-0.5f)));
    return _mm512_fnmadd_ps(v, e, v);
}

/* x Phi(x) by kernels/gelu_erf.h's two polynomials, both computed, one chosen per lane. */
INLINE __m512 gelu16(__m512 x)
{
    __m512 z = _mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f));
    __m512 a = _mm512_abs_ps(z), s = _mm512_mul_ps(z, z);
    __m512 p = _mm512_set1_ps(gelu_p[GELU_P_DEG]);
    for (int k = GELU_P_DEG - 1; k >= 0; k--)
        p = _mm512_fmadd_ps(p, s, _mm512_set1_ps(gelu_p[k]));
    __m512 half = _mm512_set1_ps(0.5f);
    __m512 phi_in = _mm512_fmadd_ps(_mm512_mul_ps(z, p), half, half); /* (1 + erf z) / 2 */
    __m512 u = _mm512_sub_ps(_mm512_div_ps(_mm512_set1_ps(1.0f),
                                           _mm512_min_ps(_mm512_max_ps(a, _mm512_set1_ps(1.0f)),
                                                         _mm512_set1_ps(GELU_A_MAX))),
                             _mm512_set1_ps(GELU_U0));
    __m512 g = _mm512_set1_ps(gelu_g[GELU_G_DEG]);
    for (int k = GELU_G_DEG - 1; k >= 0; k--)
        g = _mm512_fmadd_ps(g, u, _mm512_set1_ps(gelu_g[k]));
    __m512 half_erfc = _mm512_mul_ps(_mm512_mul_ps(exp_neg_half_sq512(x),
                                                   g), half);
    /* beyond a = GELU_A_MAX erfc is 0 (its float would be subnormal, which a huge x scales
     * back up) */
    half_erfc = _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(a, _mm512_set1_ps(GELU_A_MAX), _CMP_LE_OQ), half_erfc);
    __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
    __m512 phi_out = _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc),
                                          half_erfc);
    __mmask16 inner = _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.0f), _CMP_LE_OQ);
    return _mm512_mul_ps(x, _mm512_mask_blend_ps(inner, phi_out, phi_in));
}

static void avx512_gelu(float *x, long n)
{
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, gelu16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, gelu16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* kwk_f32_to_f16 sixteen at a time: the hardware's conversion (nearest even), then its
 * saturation and NaN patched in 32-bit lanes. */
static void avx512_to_half(uint16_t *y, const float *x, long n)
{
    const __m512i sgn = _mm512_set1_epi32(0x8000), sat = _mm512_set1_epi32(0x7bff);
    const __m512i nan = _mm512_set1_epi32(0x7e00);
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 f = _mm512_loadu_ps(x + i);
        __m512i s = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(f), 16), sgn);
        __m512i v = _mm512_cvtepu16_epi32(
            _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(f), _mm512_set1_ps(65504.0f), _CMP_GT_OQ);
        v = _mm512_mask_or_epi32(v, big, s, sat);
        v = _mm512_mask_or_epi32(v, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), s, nan);
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(v));
    }
    for (; i < n; i++)
        y[i] = kwk_f32_to_f16(x[i]);
}

static void avx512_from_half(float *y, const uint16_t *x, long n)
{
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    for (; i < n; i++)
        y[i] = kwk_f16_to_f32(x[i]);
}

const struct kwk_kernels kwk_kernels_avx512 = {
    .name = "avx512",
    .matmul = avx512_matmul,
    .mat_row = avx512_mat_row,
    .quant_rows = kwk_quant_rows_avx512,
    .matmul_q = kwk_quant_matmul_q_avx512,
    .dot = avx512_dot,
    .axpy = avx512_axpy,
    .rmsnorm = avx512_rmsnorm,
    .softmax = avx512_softmax,
    .swiglu = avx512_swiglu,
    .geglu = avx512_geglu,
    .gelu = avx512_gelu,
    .to_half = avx512_to_half,
    .from_half = avx512_from_half,
    .dec_runs = KWK_DEC_STREAMS, /* float_rows.h; avx2_panel.c reads panels alike */
};
