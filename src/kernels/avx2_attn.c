/* avx2_attn.c - attention with AVX2 + FMA (compiled with those flags only; chosen at run time by
 * kwk_attn_kernel). Pure functions; any thread. Agrees with attn_ref.c to float rounding.
 *
 * The same plan as avx512_attn.c with 8-lane vectors: the query heads of one kv group in one row
 * are done together (each key block read once from memory, each value row loaded once for up to
 * MAXH heads), scores of 8 keys come out of one transposed reduction. Batch invariance: an item's
 * operations and their order depend only on the item, never on which heads share its loads. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "kernels/attn.h"
#include "kernels/avx2_exp.h"

#define INLINE static inline __attribute__((always_inline))

#define KB 8    /* keys per score block: one ymm of scores */
#define MAXG 8  /* query heads done together at most (sums[] on the stack) */
#define MAXH 3  /* query heads per value pass: their accumulators fit the 16 registers (3 heads x 4
                   chunks, or 1 head x 8 chunks) */


INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* All ones in the lanes below nk (0..8). */
INLINE __m256 lanes_below(int nk)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nk), idx));
}

/* Lane-wise partial dot products of q and one key: lane l sums elements l, l+8, ... in order. */
INLINE __m256 key_partial(const float *q, const float *k, int hd)
{
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
#pragma GCC unroll 8
    for (int e = 8; e < hd; e += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), _mm256_loadu_ps(k + e), acc);
    return acc;
}

/* Four keys' partials folded to one vector: lane 4m + u of each 128-bit half holds a partial sum
 * of key u. */
INLINE __m256 fold4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 s01 = _mm256_add_ps(_mm256_unpacklo_ps(a0, a1), _mm256_unpackhi_ps(a0, a1));
    __m256 s23 = _mm256_add_ps(_mm256_unpacklo_ps(a2, a3), _mm256_unpackhi_ps(a2, a3));
    return _mm256_add_ps(_mm256_shuffle_ps(s01, s23, 0x44), _mm256_shuffle_ps(s01, s23, 0xee));
}

/* The dot products of q with keys k, k + ldk, ... (nk of them, 1..8; the rest read as zero), in
 * key order. Every key's sum has the same tree whatever nk is: lanes never mix keys. */
INLINE __m256 score_block(const float *q, const float *k, long ldk, int hd, int nk)
{
    /* Four keys at a time, folded at once: few partials live, so q's chunks can stay in
     * registers (hd 64) and each key chunk is one load per FMA. */
    __m256 half[2];
#pragma GCC unroll 2
    for (int t = 0; t < 2; t++) {
        __m256 a[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            int j = 4 * t + u;
            a[u] = j < nk ? key_partial(q, k + j * ldk, hd) : _mm256_setzero_ps();
        }
        half[t] = fold4(a[0], a[1], a[2], a[3]);
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(half[0], half[1], 0x20),
                         _mm256_permute2f128_ps(half[0], half[1], 0x31));
}

/* Scaled scores of nh heads (queries q + g*hd) over n keys into p + g*ldp; the lanes past n in
 * the last block get -inf. hd is a constant after inlining where scores() makes it one. */
INLINE void scores_hd(const float *q, int nh, int hd, const float *k, long ldk, int n, float scale,
                   float *p, long ldp)
{
    __m256 sv = _mm256_set1_ps(scale);
    int b = 0;
    for (; b + KB <= n; b += KB)
        for (int g = 0; g < nh; g++) {
            __m256 s = score_block(q + g * hd, k + b * ldk, ldk, hd, KB);
            _mm256_storeu_ps(p + g * ldp + b, _mm256_mul_ps(s, sv));
        }
    if (b < n) {
        __m256 m = lanes_below(n - b);
        for (int g = 0; g < nh; g++) {
            __m256 s = _mm256_mul_ps(score_block(q + g * hd, k + b * ldk, ldk, hd, n - b), sv);
            _mm256_storeu_ps(p + g * ldp + b, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, m));
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
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (int b = 0; b < npad; b += KB)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(p + b));
    __m256 mx = _mm256_set1_ps(hmax(mv));
    __m256 sum = _mm256_setzero_ps();
    for (int b = 0; b < npad; b += KB) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + b), mx));
        if (n - b < KB)
            e = _mm256_and_ps(e, lanes_below(n - b));
        _mm256_storeu_ps(p + b, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum(sum);
}

/* out_g[c] = sum_j p_g[j] v_j[c] / sums[g] for NH heads and NC chunks of 8 columns, the
 * accumulators in registers while the value rows stream past. NH, NC: constants after inlining. */
INLINE void values_tile(int NH, int NC, const float *p, long ldp, const float *v, long ldv, int n,
                        const float *sums, float *out, int hd)
{
    __m256 acc[MAXH][8];
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[g][c] = _mm256_setzero_ps();
    /* One weight live at a time and the value chunks as memory operands (from L1 after the
     * first head): 3 x 4 accumulators then fit the 16 registers. */
    for (int j = 0; j < n; j++) {
#pragma GCC unroll 8
        for (int g = 0; g < NH; g++) {
            __m256 pj = _mm256_broadcast_ss(p + g * ldp + j);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[g][c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * ldv + 8 * c), acc[g][c]);
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++) {
        __m256 sv = _mm256_set1_ps(sums[g]);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            _mm256_storeu_ps(out + g * hd + 8 * c, _mm256_div_ps(acc[g][c], sv));
    }
}

/* values_tile with its constants chosen: nh in 1..MAXH, nc in {1, 2, 4}, or 8 for one head. */
static void values_tile_n(int nh, int nc, const float *p, long ldp, const float *v, long ldv,
                          int n, const float *sums, float *out, int hd)
{
    switch (nh * 16 + nc) {
    case 16 + 1: values_tile(1, 1, p, ldp, v, ldv, n, sums, out, hd); break;
    case 16 + 2: values_tile(1, 2, p, ldp, v, ldv, n, sums, out, hd); break;
    case 16 + 4: values_tile(1, 4, p, ldp, v, ldv, n, sums, out, hd); break;
    case 16 + 8: values_tile(1, 8, p, ldp, v, ldv, n, sums, out, hd); break;
    case 32 + 1: values_tile(2, 1, p, ldp, v, ldv, n, sums, out, hd); break;
    case 32 + 2: values_tile(2, 2, p, ldp, v, ldv, n, sums, out, hd); break;
    case 32 + 4: values_tile(2, 4, p, ldp, v, ldv, n, sums, out, hd); break;
    case 48 + 1: values_tile(3, 1, p, ldp, v, ldv, n, sums, out, hd); break;
    case 48 + 2: values_tile(3, 2, p, ldp, v, ldv, n, sums, out, hd); break;
    default: values_tile(3, 4, p, ldp, v, ldv, n, sums, out, hd); break;
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
    long ldp = (n + 15) / 16 * 16; /* as kwk_attn_scratch_floats pads */
    float sums[MAXG];
    scores(q, nh, hd, k, a->kv_dim, n, a->scale, scratch, ldp);
    for (int g = 0; g < nh; g++)
        sums[g] = softmax_unnormalized(scratch + g * ldp, n);
    /* Tiles change which loads are shared, not any output's sum: each is its own chain. */
    for (int g0 = 0; g0 < nh; g0 += MAXH) {
        int nhb = KWK_MIN(MAXH, nh - g0);
        for (int c0 = 0; c0 < hd;) {
            int left = (hd - c0) / 8;
            int nc = left >= 8 && nhb == 1 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
            values_tile_n(nhb, nc, scratch + g0 * ldp, ldp, v + c0, a->kv_dim, n, sums + g0,
                          out + (long)g0 * hd + c0, hd);
            c0 += 8 * nc;
        }
    }
}

static void avx2_items(const struct kwk_attn_args *a, long i0, long i1, float *scratch)
{
    if (a->head_dim % 8 != 0) {
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

const struct kwk_attn_kernel kwk_attn_avx2 = {.name = "avx2", .items = avx2_items};
