/* quant_ref.c - the quantized formats (int8, int4, int6) in plain C: packing float rows into
 * blocks, activation quantization, and the quantized matmul that every SIMD kernel is tested
 * against. Pure functions; any thread. */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "kernels/quant.h"

/* Every format's group is 32 columns: one stack buffer size serves them all. */
#define QG 32
_Static_assert(KWK_Q8_GROUP == QG && KWK_Q4_GROUP == QG && KWK_Q6_GROUP == QG, "groups of 32");

int kwk_quant_group(int wtype)
{
    switch (wtype) {
    case KWK_W_Q8:
        return KWK_Q8_GROUP;
    case KWK_W_Q4:
        return KWK_Q4_GROUP;
    case KWK_W_Q6:
        return KWK_Q6_GROUP;
    default:
        return 0;
    }
}

static size_t block_bytes(int wtype)
{
    return wtype == KWK_W_Q8   ? sizeof(struct kwk_q8_block)
           : wtype == KWK_W_Q6 ? sizeof(struct kwk_q6_block)
                               : sizeof(struct kwk_q4_block);
}

int64_t kwk_quant_n_groups(int wtype, int64_t cols)
{
    int g = kwk_quant_group(wtype);
    return g ? (cols + g - 1) / g : 0;
}

int kwk_quant_bytes(int wtype, int64_t rows, int64_t cols, size_t *out)
{
    *out = 0;
    if (!kwk_quant_group(wtype) || rows < 0 || cols < 0)
        return -1;
    size_t rb = (size_t)((rows + KWK_QROWS - 1) / KWK_QROWS), n;
    if (kwk_mul_size(rb, (size_t)kwk_quant_n_groups(wtype, cols), &n) ||
        kwk_mul_size(n, block_bytes(wtype), out))
        return -1;
    return 0;
}

uint16_t kwk_f32_to_f16(float f)
{
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000u;
    float a = fabsf(f);
    if (a != a)
        return (uint16_t)(sign | 0x7e00u);
    if (a > 65504.0f) /* scales never get here; saturate rather than make an infinity */
        return (uint16_t)(sign | 0x7bffu);
    if (a < 6.103515625e-05f) {
        /* subnormal: units of 2^-24, nearest even by the FPU's rounding of the float */
        uint32_t m = (uint32_t)nearbyintf(a * 16777216.0f);
        return (uint16_t)(sign | m);
    }
    union { float f; uint32_t u; } b = {a};
    uint32_t mant = b.u & 0x7fffffu, exp = (b.u >> 23) - 127 + 15;
    uint32_t h = (exp << 10) | (mant >> 13), rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is still the right value */
    return (uint16_t)(sign | h);
}

/* Round x to the nearest integer (ties to even, as cvtps2dq does) within [-lim, lim]. NaN is 0 so
 * no input reaches an undefined conversion. Adding and removing 1.5 * 2^23 rounds in the FPU's
 * default mode without a libm call (|x| <= KWK_QX_SCALE here, far below 2^22). */
static int round_clamp(float x, float lim)
{
    if (!(x == x))
        return 0;
    x = x > lim ? lim : x < -lim ? -lim : x;
    const float big = 12582912.0f; /* IEEE semantics (no -ffast-math) keep x + big - big */
    return (int)((x + big) - big);
}

/* f = x * 127 / amax rounded twice: to h (the int8 step) and, times 254, to v. |f| <= 127 and
 * 254 * (h +- 0.5) is a float, so v lies within 127 of 254 * h: l = v - 254 * h fits int8. */
void kwk_quant_act(const float *x, int64_t n, int group, int8_t *xh, int8_t *xl, float *xd,
                   int32_t *xs)
{
    int64_t ng = (n + group - 1) / group;
    for (int64_t g = 0; g < ng; g++) {
        int64_t k0 = g * group, k1 = KWK_MIN(n, k0 + group);
        float amax = 0.0f;
        for (int64_t k = k0; k < k1; k++)
            amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
        float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t s = 0;
        for (int64_t k = k0; k < k0 + group; k++) {
            float f = k < k1 ? x[k] * id : 0.0f;
            int h = round_clamp(f, 127.0f), v = round_clamp(f * 254.0f, (float)KWK_QX_SCALE);
            xh[k] = (int8_t)h;
            xl[k] = (int8_t)(v - 254 * h);
            s += v;
        }
        xd[g] = amax / (float)KWK_QX_SCALE;
        xs[g] = s;
    }
}

/* ---- packing --------------------------------------------------------------------------------- */

/* Squared error of w against d * q with q chosen by rounding w / d into [-lim, lim]. */
static float sym_err(const float *w, int n, float d, float lim)
{
    float id = d > 0.0f ? 1.0f / d : 0.0f, e = 0.0f;
    for (int k = 0; k < n; k++) {
        float r = d * (float)round_clamp(w[k] * id, lim) - w[k];
        e += r * r;
    }
    return e;
}

/* Symmetric 8-bit: w = d * q. Start from amax / 127; then try slightly different steps (smaller
 * ones clip the extreme value) and for each rounding fit d by least squares: the grid that fits
 * the bulk of the group often beats the one pinned to its largest value. A trial is judged by
 * its own rounding's error with the stored (half) d, sum (d q - w)^2 from three sums, in one
 * pass; rounding again with the chosen d can only lower that error. */
static float fit_q8(const float *w, int n)
{
    float amax = 0.0f, sww = 0.0f;
    for (int k = 0; k < n; k++) {
        amax = fabsf(w[k]) > amax ? fabsf(w[k]) : amax;
        sww += w[k] * w[k];
    }
    uint16_t bd = kwk_f32_to_f16(amax / 127.0f);
    float best = sym_err(w, n, kwk_f16_to_f32(bd), 127.0f);
    for (int s = -8; s <= 24 && amax > 0.0f && n > 1; s++) {
        if (s == 0)
            continue;
        float id = (127.0f + 0.25f * (float)s) / amax;
        float sqq = 0.0f, sqw = 0.0f;
        for (int k = 0; k < n; k++) {
            float fq = (float)round_clamp(w[k] * id, 127.0f);
            sqq += fq * fq;
            sqw += fq * w[k];
        }
        if (!(sqq > 0.0f) || !(sqw > 0.0f))
            continue;
        uint16_t hd = kwk_f32_to_f16(sqw / sqq);
        float d = kwk_f16_to_f32(hd), e = sww - 2.0f * d * sqw + d * d * sqq;
        if (e < best) {
            best = e;
            bd = hd;
        }
    }
    return kwk_f16_to_f32(bd);
}

/* Squared error of w against d * q + m with q chosen by rounding (w - m) / d into [0, 15]. */
static float q4_err(const float *w, int n, float d, float m)
{
    float id = d > 0.0f ? 1.0f / d : 0.0f, e = 0.0f;
    for (int k = 0; k < n; k++) {
        int v = round_clamp((w[k] - m) * id, 15.0f);
        float r = d * (float)(v < 0 ? 0 : v) + m - w[k];
        e += r * r;
    }
    return e;
}

/* Asymmetric 4-bit: w = d * q + m. Start from the group's range [min, max] in 15 steps; then try
 * slightly different steps, and for each rounding fit d and m by least squares (the rounding of
 * a smaller or larger step often fits the bulk of the values better than the two extremes do).
 * The choice is judged with the stored (half) d and m, which are what the kernels use. */
static void fit_q4(const float *w, int n, float *d_out, float *m_out)
{
    float mn = n > 0 ? w[0] : 0.0f, mx = mn;
    for (int k = 1; k < n; k++) {
        mn = w[k] < mn ? w[k] : mn;
        mx = w[k] > mx ? w[k] : mx;
    }
    uint16_t bd = kwk_f32_to_f16((mx - mn) / 15.0f), bm = kwk_f32_to_f16(mn);
    float best = q4_err(w, n, kwk_f16_to_f32(bd), kwk_f16_to_f32(bm));
    for (int s = -4; s <= 4 && mx > mn && n > 1; s++) {
        if (s == 0)
            continue;
        float id = (15.0f + 0.1f * (float)s) / (mx - mn);
        float sq = 0.0f, sqq = 0.0f, sw = 0.0f, sqw = 0.0f;
        for (int k = 0; k < n; k++) {
            int v = round_clamp((w[k] - mn) * id, 15.0f);
            float fq = (float)(v < 0 ? 0 : v);
            sq += fq;
            sqq += fq * fq;
            sw += w[k];
            sqw += fq * w[k];
        }
        float det = (float)n * sqq - sq * sq;
        if (det <= 0.0f)
            continue;
        float d = ((float)n * sqw - sq * sw) / det, m = (sw - d * sq) / (float)n;
        if (!(d > 0.0f))
            continue;
        uint16_t hd = kwk_f32_to_f16(d), hm = kwk_f32_to_f16(m);
        float e = q4_err(w, n, kwk_f16_to_f32(hd), kwk_f16_to_f32(hm));
        if (e < best) {
            best = e;
            bd = hd;
            bm = hm;
        }
    }
    *d_out = kwk_f16_to_f32(bd);
    *m_out = kwk_f16_to_f32(bm);
}

/* The int6 code of x = w / d: [-32, 31]. */
static int code_q6(float x)
{
    int v = round_clamp(x, 32.0f);
    return v > 31 ? 31 : v;
}

/* Squared error of w against d * q with q the int6 code of w / d. */
static float q6_err(const float *w, int n, float d)
{
    float id = d != 0.0f ? 1.0f / d : 0.0f, e = 0.0f;
    for (int k = 0; k < n; k++) {
        float r = d * (float)code_q6(w[k] * id) - w[k];
        e += r * r;
    }
    return e;
}

/* Symmetric 6-bit: w = d * q, q in [-32, 31]. d's sign puts the largest magnitude wmax at -32
 * (the longer side); then the search of fit_q8: slightly larger or smaller steps (32 - 1 to
 * 32 + 3 codes across |wmax|: measured on Gaussian rows, wider trials gain nothing), each
 * rounding's least-squares d judged with its half rounding. */
static float fit_q6(const float *w, int n)
{
    float amax = 0.0f, wmax = 0.0f, sww = 0.0f;
    for (int k = 0; k < n; k++) {
        if (fabsf(w[k]) > amax) {
            amax = fabsf(w[k]);
            wmax = w[k];
        }
        sww += w[k] * w[k];
    }
    uint16_t bd = kwk_f32_to_f16(-wmax / 32.0f);
    float best = q6_err(w, n, kwk_f16_to_f32(bd));
    for (int s = -8; s <= 24 && amax > 0.0f && n > 1; s++) {
        if (s == 0)
            continue;
        float id = -(32.0f + 0.125f * (float)s) / wmax;
        float sqq = 0.0f, sqw = 0.0f;
        for (int k = 0; k < n; k++) {
            float fq = (float)code_q6(w[k] * id);
            sqq += fq * fq;
            sqw += fq * w[k];
        }
        if (!(sqq > 0.0f) || !(sqw != 0.0f))
            continue;
        uint16_t hd = kwk_f32_to_f16(sqw / sqq);
        float d = kwk_f16_to_f32(hd), e = sww - 2.0f * d * sqw + d * d * sqq;
        if (e < best) {
            best = e;
            bd = hd;
        }
    }
    return kwk_f16_to_f32(bd);
}

void kwk_quant_fit(int wtype, const float *w, int n, float *d, float *m)
{
    *d = *m = 0.0f;
    if (wtype == KWK_W_Q8)
        *d = fit_q8(w, n);
    else if (wtype == KWK_W_Q6)
        *d = fit_q6(w, n);
    else if (wtype == KWK_W_Q4)
        fit_q4(w, n, d, m);
}

int kwk_quant_code(int wtype, float w, float d, float m)
{
    if (wtype == KWK_W_Q6)
        return code_q6(w * (d != 0.0f ? 1.0f / d : 0.0f));
    float id = d > 0.0f ? 1.0f / d : 0.0f;
    if (wtype == KWK_W_Q8)
        return round_clamp(w * id, 127.0f);
    int v = round_clamp((w - m) * id, 15.0f);
    return v < 0 ? 0 : v;
}

/* Row i of one block from its n codes (columns past n, which meet zero activations, get code
 * 0: any code is exact there and 0 keeps sums small). */
static void put_row(int wtype, void *blk, int i, const int8_t *q, int n, float d, float m)
{
    int8_t c[QG] = {0};
    int G = kwk_quant_group(wtype);
    if (n > 0)
        memcpy(c, q, (size_t)n);
    if (wtype == KWK_W_Q8) {
        struct kwk_q8_block *b = blk;
        b->d[i] = kwk_f32_to_f16(d);
        for (int k = 0; k < G; k++)
            b->q[k / 4][i][k % 4] = (uint8_t)(c[k] + 128);
    } else if (wtype == KWK_W_Q6) {
        struct kwk_q6_block *b = blk;
        b->d[i] = kwk_f32_to_f16(d);
        for (int j = 0; j < 4; j++) {
            unsigned lo[QG / 8] = {0}, hi[QG / 16] = {0};
            for (int sl = 0; sl < QG / 4; sl++) {
                unsigned u = (unsigned)(c[4 * sl + j] + 32);
                lo[sl / 2] |= (u & 15u) << 4 * (sl % 2);
                hi[sl / 4] |= (u >> 4) << 2 * (sl % 4);
            }
            for (int c8 = 0; c8 < QG / 8; c8++)
                b->ql[c8][i][j] = (uint8_t)lo[c8];
            for (int c16 = 0; c16 < QG / 16; c16++)
                b->qh[c16][i][j] = (uint8_t)hi[c16];
        }
    } else {
        struct kwk_q4_block *b = blk;
        b->d[i] = kwk_f32_to_f16(d);
        b->m[i] = kwk_f32_to_f16(m);
        for (int g8 = 0; g8 < G / 8; g8++)
            for (int j = 0; j < 4; j++)
                b->q[g8][i][j] = (uint8_t)(c[8 * g8 + j] | c[8 * g8 + 4 + j] << 4);
    }
}

static void *block_at(int wtype, void *data, int64_t idx)
{
    return (uint8_t *)data + (size_t)idx * block_bytes(wtype);
}

void kwk_quant_pack_codes(int wtype, void *data, int64_t rows, int64_t cols, int64_t rb,
                          const int8_t *q, long ldq, const float *d, const float *m)
{
    int G = kwk_quant_group(wtype);
    int64_t ng = kwk_quant_n_groups(wtype, cols);
    int n_rows = (int)KWK_MIN((int64_t)KWK_QROWS, rows - rb * KWK_QROWS);
    for (int64_t g = 0; g < ng; g++) {
        int64_t k0 = g * G;
        int n = (int)KWK_MIN((int64_t)G, cols - k0);
        void *blk = block_at(wtype, data, rb * ng + g);
        for (int i = 0; i < KWK_QROWS; i++) {
            if (i >= n_rows) {
                put_row(wtype, blk, i, NULL, 0, 0.0f, 0.0f);
                continue;
            }
            size_t p = (size_t)i * (size_t)ng + (size_t)g;
            put_row(wtype, blk, i, q + (size_t)i * (size_t)ldq + k0, n, d[p], m ? m[p] : 0.0f);
        }
    }
}

/* Groups of 16 rows with the SIMD twin of fit and code: the scale search is nearly all of
 * packing's time, and one row a lane runs it about ten times faster (same bytes). */
static void pack_group16(int wtype, void *blk, const float *src, long ld, int n_rows, int n,
                         int isa)
{
    float wt[QG * KWK_QROWS], d[KWK_QROWS], m[KWK_QROWS];
    int8_t qt[QG * KWK_QROWS], q[QG];
    for (int k = 0; k < n; k++)
        for (int i = 0; i < KWK_QROWS; i++)
            wt[k * KWK_QROWS + i] = i < n_rows ? src[(size_t)i * (size_t)ld + (size_t)k] : 0.0f;
    if (isa >= KWK_ISA_AVX512)
        kwk_quant_fit_rows_avx512(wtype, wt, n, d, m, qt);
    else
        kwk_quant_fit_rows_avx2(wtype, wt, n, d, m, qt);
    for (int i = 0; i < KWK_QROWS; i++) {
        for (int k = 0; k < n && i < n_rows; k++)
            q[k] = qt[k * KWK_QROWS + i];
        if (i < n_rows)
            put_row(wtype, blk, i, q, n, d[i], m[i]);
        else
            put_row(wtype, blk, i, NULL, 0, 0.0f, 0.0f);
    }
}

void kwk_quant_pack_rows(int wtype, void *data, int64_t rows, int64_t cols, int64_t rb,
                         const float *src, long ld)
{
    int G = kwk_quant_group(wtype), isa = kwk_isa();
    int64_t ng = kwk_quant_n_groups(wtype, cols);
    int n_rows = (int)KWK_MIN((int64_t)KWK_QROWS, rows - rb * KWK_QROWS);
    for (int64_t g = 0; g < ng; g++) {
        int64_t k0 = g * G;
        int n = (int)KWK_MIN((int64_t)G, cols - k0);
        void *blk = block_at(wtype, data, rb * ng + g);
        if (isa >= KWK_ISA_AVX2) {
            pack_group16(wtype, blk, src + k0, ld, n_rows, n, isa);
            continue;
        }
        for (int i = 0; i < KWK_QROWS; i++) {
            int8_t q[QG];
            float d = 0.0f, m = 0.0f;
            if (i >= n_rows) {
                put_row(wtype, blk, i, NULL, 0, 0.0f, 0.0f);
                continue;
            }
            const float *w = src + (size_t)i * (size_t)ld + k0;
            kwk_quant_fit(wtype, w, n, &d, &m);
            for (int k = 0; k < n; k++)
                q[k] = (int8_t)kwk_quant_code(wtype, w[k], d, m);
            put_row(wtype, blk, i, q, n, d, m);
        }
    }
}

/* ---- the specification of the quantized matmul ----------------------------------------------- */

/* The 16-bit activation v of column k of a group. */
static int32_t act_v(const int8_t *xh, const int8_t *xl, int k)
{
    return 254 * (int32_t)xh[k] + xl[k];
}

/* |isum| <= 32 * 127 * KWK_QX_SCALE < 2^31. */
static int32_t q8_isum(const struct kwk_q8_block *b, int i, const int8_t *xh, const int8_t *xl)
{
    int32_t s = 0;
    for (int c = 0; c < KWK_Q8_GROUP / 4; c++)
        for (int j = 0; j < 4; j++)
            s += ((int32_t)b->q[c][i][j] - 128) * act_v(xh, xl, 4 * c + j);
    return s;
}

static int32_t q4_isum(const struct kwk_q4_block *b, int i, const int8_t *xh, const int8_t *xl)
{
    int32_t s = 0;
    for (int c = 0; c < KWK_Q4_GROUP / 8; c++)
        for (int j = 0; j < 4; j++) {
            uint8_t v = b->q[c][i][j];
            s += (int32_t)(v & 15) * act_v(xh, xl, 8 * c + j) +
                 (int32_t)(v >> 4) * act_v(xh, xl, 8 * c + 4 + j);
        }
    return s;
}

/* u of column k (slice k / 4) of row i: its nibble and its two high bits (quant.h). */
static int q6_u(const struct kwk_q6_block *b, int i, int k)
{
    int sl = k / 4, j = k % 4;
    int lo = b->ql[sl / 2][i][j] >> 4 * (sl % 2) & 15, hi = b->qh[sl / 4][i][j] >> 2 * (sl % 4) & 3;
    return lo | hi << 4;
}

static int32_t q6_isum(const struct kwk_q6_block *b, int i, const int8_t *xh, const int8_t *xl)
{
    int32_t s = 0;
    for (int k = 0; k < KWK_Q6_GROUP; k++)
        s += (q6_u(b, i, k) - 32) * act_v(xh, xl, k);
    return s;
}

/* Groups [g0, g1) of row r for one token's quantized activations (indexed from group g0). */
static float row_groups(const struct kwk_mat *w, int64_t r, int64_t g0, int64_t g1,
                        const int8_t *xh, const int8_t *xl, const float *xd, const int32_t *xs)
{
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), rb = r / KWK_QROWS;
    int i = (int)(r % KWK_QROWS), G = kwk_quant_group(w->wtype);
    float s = 0.0f;
    for (int64_t g = g0; g < g1; g++) {
        int64_t j = g - g0;
        const int8_t *h = xh + j * G, *l = xl + j * G;
        if (w->wtype == KWK_W_Q8) {
            const struct kwk_q8_block *b = (const struct kwk_q8_block *)w->data + rb * ng + g;
            float d = kwk_f16_to_f32(b->d[i]);
            s += (float)q8_isum(b, i, h, l) * (d * xd[j]);
        } else if (w->wtype == KWK_W_Q6) {
            const struct kwk_q6_block *b = (const struct kwk_q6_block *)w->data + rb * ng + g;
            float d = kwk_f16_to_f32(b->d[i]);
            s += (float)q6_isum(b, i, h, l) * (d * xd[j]);
        } else {
            const struct kwk_q4_block *b = (const struct kwk_q4_block *)w->data + rb * ng + g;
            float d = kwk_f16_to_f32(b->d[i]), m = kwk_f16_to_f32(b->m[i]);
            s += (float)q4_isum(b, i, h, l) * (d * xd[j]);
            s += m * (xd[j] * (float)xs[j]);
        }
    }
    return s;
}

/* 8-bit activations (quant.h): the 16-bit quantization of ng groups with the low halves taken
 * as zero, v = 254 * h, and the sums of v recomputed to match. */
static void act8_halves(int64_t ng, int G, const int8_t *xh, int8_t *xl, int32_t *xs)
{
    memset(xl, 0, (size_t)(ng * G));
    for (int64_t g = 0; g < ng; g++) {
        int32_t s = 0;
        for (int k = 0; k < G; k++)
            s += 254 * (int32_t)xh[g * G + k];
        xs[g] = s;
    }
}

/* Column passes of KWK_QX_COLS; a row's passes add up in order. */
void kwk_quant_matmul_ref(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                          int64_t r0, int64_t r1)
{
    int G = kwk_quant_group(w->wtype);
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), gc = KWK_QX_COLS / G;
    int8_t xh[KWK_QX_COLS], xl[KWK_QX_COLS];
    float xd[KWK_QX_COLS / KWK_Q4_GROUP];
    int32_t xs[KWK_QX_COLS / KWK_Q4_GROUP];
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (int64_t)t * w->cols;
        float *yt = y + (int64_t)t * ldy;
        for (int64_t r = r0; r < r1; r++)
            yt[r] = 0.0f;
        for (int64_t g0 = 0; g0 < ng; g0 += gc) {
            int64_t g1 = KWK_MIN(ng, g0 + gc);
            kwk_quant_act(xt + g0 * G, KWK_MIN(w->cols, g1 * G) - g0 * G, G, xh, xl, xd, xs);
            if (w->act8)
                act8_halves(g1 - g0, G, xh, xl, xs);
            for (int64_t r = r0; r < r1; r++)
                yt[r] += row_groups(w, r, g0, g1, xh, xl, xd, xs);
        }
    }
}

/* ---- activations quantized once for several products ----------------------------------------- */

static size_t align64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

size_t kwk_qact_bytes(int64_t cols, int n)
{
    size_t ng = (size_t)((cols + KWK_QACT_GROUP - 1) / KWK_QACT_GROUP), rows = (size_t)n;
    return 2 * align64(rows * ng * KWK_QACT_GROUP) + 3 * align64(rows * ng * 4);
}

void kwk_qact_init(struct kwk_qact *qa, void *mem, int64_t cols, int n, int act8)
{
    size_t ng = (size_t)((cols + KWK_QACT_GROUP - 1) / KWK_QACT_GROUP), rows = (size_t)n;
    uint8_t *p = mem;
    qa->cols = cols;
    qa->act8 = act8 != 0;
    qa->ldh = (long)(ng * KWK_QACT_GROUP);
    qa->ldg = (long)ng;
    qa->h = (int8_t *)p;
    p += align64(rows * ng * KWK_QACT_GROUP);
    qa->l = (int8_t *)p;
    p += align64(rows * ng * KWK_QACT_GROUP);
    qa->d = (float *)p;
    p += align64(rows * ng * 4);
    qa->s = (int32_t *)p;
    p += align64(rows * ng * 4);
    qa->m = (float *)p;
}

struct kwk_qact kwk_qact_at(const struct kwk_qact *qa, long t, int64_t g)
{
    struct kwk_qact v = *qa;
    long oh = t * qa->ldh + (long)g * KWK_QACT_GROUP, og = t * qa->ldg + (long)g;
    v.h += oh;
    v.l += oh;
    v.d += og;
    v.s += og;
    v.m += og;
    return v;
}

struct kwk_qact kwk_qx_view(struct kwk_qx *b, int64_t cols, int act8)
{
    return (struct kwk_qact){.cols = cols,
                             .act8 = act8 != 0,
                             .ldh = KWK_QX_COLS,
                             .ldg = KWK_QX_COLS / KWK_QACT_GROUP,
                             .h = b->q[0],
                             .l = b->l[0],
                             .d = b->d[0],
                             .s = b->s[0],
                             .m = b->m[0]};
}

/* kwk_quant_act of each row (one call covers every column pass: groups are quantized one by
 * one), then in the 8-bit mode the low halves zeroed as kwk_quant_matmul_ref does. */
void kwk_quant_rows_ref(const float *x, const struct kwk_qact *qa, int t0, int t1)
{
    for (int t = t0; t < t1; t++) {
        int8_t *h = qa->h + (long)t * qa->ldh, *l = qa->l + (long)t * qa->ldh;
        int32_t *xs = qa->s + (long)t * qa->ldg;
        kwk_quant_act(x + (int64_t)t * qa->cols, qa->cols, KWK_QACT_GROUP, h, l,
                      qa->d + (long)t * qa->ldg, xs);
        if (qa->act8)
            act8_halves(qa->ldg, KWK_QACT_GROUP, h, l, xs);
    }
}

void kwk_quant_matmul_q_ref(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok, float *y,
                            long ldy, int64_t r0, int64_t r1)
{
    int G = kwk_quant_group(w->wtype);
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), gc = KWK_QX_COLS / G;
    for (int t = 0; t < n_tok; t++) {
        const int8_t *h = qa->h + (long)t * qa->ldh, *l = qa->l + (long)t * qa->ldh;
        const float *xd = qa->d + (long)t * qa->ldg;
        const int32_t *xs = qa->s + (long)t * qa->ldg;
        float *yt = y + (int64_t)t * ldy;
        for (int64_t r = r0; r < r1; r++)
            yt[r] = 0.0f;
        for (int64_t g0 = 0; g0 < ng; g0 += gc) {
            int64_t g1 = KWK_MIN(ng, g0 + gc);
            for (int64_t r = r0; r < r1; r++)
                yt[r] += row_groups(w, r, g0, g1, h + g0 * G, l + g0 * G, xd + g0, xs + g0);
        }
    }
}

void kwk_quant_mat_row_ref(const struct kwk_mat *w, int64_t r, float *out)
{
    int G = kwk_quant_group(w->wtype);
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), rb = r / KWK_QROWS;
    int i = (int)(r % KWK_QROWS);
    for (int64_t g = 0; g < ng; g++) {
        float v[QG];
        if (w->wtype == KWK_W_Q8) {
            const struct kwk_q8_block *b = (const struct kwk_q8_block *)w->data + rb * ng + g;
            float d = kwk_f16_to_f32(b->d[i]);
            for (int k = 0; k < G; k++)
                v[k] = d * (float)((int)b->q[k / 4][i][k % 4] - 128);
        } else if (w->wtype == KWK_W_Q6) {
            const struct kwk_q6_block *b = (const struct kwk_q6_block *)w->data + rb * ng + g;
            float d = kwk_f16_to_f32(b->d[i]);
            for (int k = 0; k < G; k++)
                v[k] = d * (float)(q6_u(b, i, k) - 32);
        } else {
            const struct kwk_q4_block *b = (const struct kwk_q4_block *)w->data + rb * ng + g;
            float d = kwk_f16_to_f32(b->d[i]), m = kwk_f16_to_f32(b->m[i]);
            for (int c = 0; c < G / 8; c++)
                for (int j = 0; j < 4; j++) {
                    v[8 * c + j] = d * (float)(b->q[c][i][j] & 15) + m;
                    v[8 * c + 4 + j] = d * (float)(b->q[c][i][j] >> 4) + m;
                }
        }
        int64_t n = KWK_MIN((int64_t)G, w->cols - g * G);
        memcpy(out + g * G, v, sizeof(float) * (size_t)n);
    }
}
