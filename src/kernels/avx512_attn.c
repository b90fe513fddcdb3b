/* avx512_attn.c - attention with AVX-512 F (compiled with those flags only; chosen at run time by
 * kwk_attn_kernel). Pure functions; any thread. Agrees with attn_ref.c to float rounding.
 *
 * The query heads of one kv group in one row are done together: each block of 16 keys is read
 * from memory once and then from L1 for every head; each value row is loaded once into registers
 * and feeds every head's accumulators. Scores of 16 keys come out of one transposed reduction
 * (no horizontal sum per key). Batch invariance: the operations on an item's numbers, and their
 * order, depend only on the item (its q, its keys and values, head_dim, its position count), never
 * on which heads share its loads: every head runs the same code on its own registers. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "kernels/attn.h"
#include "kernels/avx512_exp.h"

#define INLINE static inline __attribute__((always_inline))

#define KB 16   /* keys per score block: one zmm of scores */
#define MAXG 8  /* query heads done together at most (sums[] on the stack) */
#define MAXH 4  /* query heads per value pass (their accumulators stay in registers) */


/* Lane-wise partial dot products of q and one key: lane l sums elements l, l+16, ... in order. */
INLINE __m512 key_partial(const float *q, const float *k, int hd)
{
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
#pragma GCC unroll 8
    for (int e = 16; e < hd; e += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + e), _mm512_loadu_ps(k + e), acc);
    return acc;
}

/* Four keys' partials folded to one vector: lane 4m + u of each 128-bit quarter holds a partial
 * sum of key u (two levels of the transposed reduction). */
INLINE __m512 fold4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    return _mm512_add_ps(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xee));
}

/* The dot products of q with keys k, k + ldk, ... (nk of them, 1..16; the rest read as zero), in
 * key order. Every key's sum has the same tree whatever nk is: lanes never mix keys. */
INLINE __m512 score_block(const float *q, const float *k, long ldk, int hd, int nk)
{
    __m512 quad[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        __m512 a[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            int j = 4 * t + u;
            a[u] = j < nk ? key_partial(q, k + j * ldk, hd) : _mm512_setzero_ps();
        }
        quad[t] = fold4(a[0], a[1], a[2], a[3]);
    }
    __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[0], quad[1], 0x88),
                              _mm512_shuffle_f32x4(quad[0], quad[1], 0xdd));
    __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[2], quad[3], 0x88),
                              _mm512_shuffle_f32x4(quad[2], quad[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

/* Scaled scores of nh heads (queries q + g*hd) over n keys into p + g*ldp; the lanes past n in
 * the last block get -inf. hd is a constant after inlining where scores() makes it one. */
INLINE void scores_hd(const float *q, int nh, int hd, const float *k, long ldk, int n, float scale,
                   float *p, long ldp)
{
    __m512 sv = _mm512_set1_ps(scale);
    int b = 0;
    for (; b + KB <= n; b += KB)
        for (int g = 0; g < nh; g++) {
            __m512 s = score_block(q + g * hd, k + b * ldk, ldk, hd, KB);
            _mm512_storeu_ps(p + g * ldp + b, _mm512_mul_ps(s, sv));
        }
    if (b < n) {
        __mmask16 m = (__mmask16)((1u << (n - b)) - 1);
        for (int g = 0; g < nh; g++) {
            __m512 s = _mm512_mul_ps(score_block(q + g * hd, k + b * ldk, ldk, hd, n - b), sv);
            _mm512_storeu_ps(p + g * ldp + b, _mm512_mask_blend_ps(m, _mm512_set1_ps(-INFINITY), s));
        }
    }
}

/* scores_hd, unrolled for the common head sizes: the same operations in the same order. */
static void scores(const float *q, int nh, int hd, const float *k, long ldk, int n, float scale,
                   float *p, long ldp)
{
    switch (hd) {
    case 64: scores_hd(q, nh, 64, k, ldk, n, scale, p, ldp); break;
    case 128: scores_hd(q, nh, 128, k, ldk, n, scale, p, ldp); break;
    default: scores_hd(q, nh, hd, k, ldk, n, scale, p, ldp); break;
    }
}

/* p[0..n) = exp(p - max p), padded to whole blocks with zeros; returns their sum. */
static float softmax_unnormalized(float *p, int n)
{
    int npad = (n + KB - 1) / KB * KB;
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int b = 0; b < npad; b += KB)
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(p + b));
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    __m512 sum = _mm512_setzero_ps();
    for (int b = 0; b < npad; b += KB) {
        __mmask16 m = n - b >= KB ? (__mmask16)0xffff : (__mmask16)((1u << (n - b)) - 1);
        __m512 e = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_loadu_ps(p + b), mx)));
        _mm512_storeu_ps(p + b, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* out_g[c] = sum_j p_g[j] v_j[c] / sums[g] for NH heads and NC chunks of 16 columns: the
 * accumulators stay in registers while the value rows stream past. NH and NC are constants after
 * inlining. */
INLINE void values_tile(int NH, int NC, const float *p, long ldp, const float *v, long ldv, int n,
                        const float *sums, float *out, int hd)
{
    __m512 acc[MAXH][4];
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[g][c] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        __m512 vv[4];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            vv[c] = _mm512_loadu_ps(v + j * ldv + 16 * c);
#pragma GCC unroll 8
        for (int g = 0; g < NH; g++) {
            __m512 pj = _mm512_set1_ps(p[g * ldp + j]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[g][c] = _mm512_fmadd_ps(pj, vv[c], acc[g][c]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++) {
        __m512 sv = _mm512_set1_ps(sums[g]);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(out + g * hd + 16 * c, _mm512_div_ps(acc[g][c], sv));
    }
}

/* values_tile with its constants chosen: nh in 1..MAXH, nc in {1, 2, 4}. */
static void values_tile_n(int nh, int nc, const float *p, long ldp, const float *v, long ldv,
                          int n, const float *sums, float *out, int hd)
{
    switch (nh * 8 + nc) {
    case 8 + 1: values_tile(1, 1, p, ldp, v, ldv, n, sums, out, hd); break;
    case 8 + 2: values_tile(1, 2, p, ldp, v, ldv, n, sums, out, hd); break;
    case 8 + 4: values_tile(1, 4, p, ldp, v, ldv, n, sums, out, hd); break;
    case 16 + 1: values_tile(2, 1, p, ldp, v, ldv, n, sums, out, hd); break;
    case 16 + 2: values_tile(2, 2, p, ldp, v, ldv, n, sums, out, hd); break;
    case 16 + 4: values_tile(2, 4, p, ldp, v, ldv, n, sums, out, hd); break;
    case 24 + 1: values_tile(3, 1, p, ldp, v, ldv, n, sums, out, hd); break;
    case 24 + 2: values_tile(3, 2, p, ldp, v, ldv, n, sums, out, hd); break;
    case 24 + 4: values_tile(3, 4, p, ldp, v, ldv, n, sums, out, hd); break;
    case 32 + 1: values_tile(4, 1, p, ldp, v, ldv, n, sums, out, hd); break;
    case 32 + 2: values_tile(4, 2, p, ldp, v, ldv, n, sums, out, hd); break;
    default: values_tile(4, 4, p, ldp, v, ldv, n, sums, out, hd); break;
    }
}

/* Query heads h0 .. h0+nh-1 of row, all of one kv group. */
static void group_run(const struct kwk_attn_args *a, int row, int h0, int nh, float *scratch)
{
    int hd = a->head_dim, kvh = h0 / (a->n_heads / a->n_kv_heads);
    int first = a->first[row], n = a->last[row] - first + 1;
    const float *q = a->q + row * a->ldq + (long)h0 * hd;
    float *out = a->out + row * a->ldo + (long)h0 * hd;
    if (n <= 0) {
        memset(out, 0, sizeof(float) * (size_t)nh * (size_t)hd);
        return;
    }
    const float *k = a->k_rows[row] + (size_t)first * a->kv_dim + (size_t)kvh * hd;
    const float *v = a->v_rows[row] + (size_t)first * a->kv_dim + (size_t)kvh * hd;
    long ldp = (n + KB - 1) / KB * KB;
    float sums[MAXG];
    scores(q, nh, hd, k, a->kv_dim, n, a->scale, scratch, ldp);
    for (int g = 0; g < nh; g++)
        sums[g] = softmax_unnormalized(scratch + g * ldp, n);
    for (int c0 = 0; c0 < hd;) {
        int left = (hd - c0) / 16, nc = left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (int g0 = 0; g0 < nh; g0 += MAXH)
            values_tile_n(KWK_MIN(MAXH, nh - g0), nc, scratch + g0 * ldp, ldp, v + c0, a->kv_dim, n,
                          sums + g0, out + (long)g0 * hd + c0, hd);
        c0 += 16 * nc;
    }
}

static void avx512_items(const struct kwk_attn_args *a, long i0, long i1, float *scratch)
{
    if (a->head_dim % 16 != 0) {
        /* Head sizes off the vector width are rare: the reference, for every item alike. */
        kwk_attn_ref.items(a, i0, i1, scratch);
        return;
    }
    int group = a->n_heads / a->n_kv_heads;
    for (long i = i0; i < i1;) {
        int row = (int)(i / a->n_heads), h = (int)(i % a->n_heads);
        int end = (h / group + 1) * group; /* this kv group's last head + 1 */
        long nh = KWK_MIN((long)KWK_MIN(end - h, MAXG), i1 - i);
        group_run(a, row, h, (int)nh, scratch);
        i += nh;
    }
}

const struct kwk_attn_kernel kwk_attn_avx512 = {.name = "avx512", .items = avx512_items};
