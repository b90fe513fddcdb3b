/* avx512_attn.c - attention with AVX-512 F (compiled with those flags only; chosen at run time by
 * kwk_attn_kernel). Pure functions; any thread. Agrees with attn_ref.c to float rounding.
 *
 * Items are done in tiles: the query heads of one kv group in up to 16 / heads neighbouring rows
 * that read the same keys (a prompt chunk's rows of one slot). Each block of 16 keys is read from
 * memory once per tile; with 10 or more queries their scores come out with the queries in vector
 * lanes (pure FMAs and adds, then one 16 x 16 transpose), else key by key through a transposed
 * reduction; value rows are loaded once into registers for up to 6 queries, over key ranges that
 * stay in L1. Batch invariance: both score paths give bitwise the same numbers (the same partial
 * chains added in the same tree), and every other operation on an item's numbers, and its order,
 * depends only on the item (its q, its keys and values, head_dim, its position count), never on
 * which rows or heads share its loads. The AMX table's tiles live here too, their products in
 * amx_attn.c. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "kernels/amx_attn.h"
#include "kernels/attn.h"
#include "kernels/avx512_exp.h"

#define INLINE static inline __attribute__((always_inline))

#define KB 16                      /* keys per score block: one zmm of scores */
#define MAXQ KWK_ATTN_TILE_QUERIES /* queries in a tile: one per lane of a zmm */
#define MAXH 6                     /* queries per value pass (accumulators stay in registers) */
#define LANES_MIN 10               /* queries from which a tile's scores put queries in lanes */
#define RUN_BLOCKS 16              /* key blocks a call of kwk_attn_amx_scores_run (16 KiB) */

/* 16 cache elements from element i of base, widened to float when H (a half cache); H is a
 * constant after inlining, so each path has its own loops. */
INLINE __m512 ld_kv(int H, const void *base, long i)
{
    if (H)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)));
    return _mm512_loadu_ps((const float *)base + i);
}

/* Lane-wise partial dot products of q and the key at element k of the cache: lane l sums
 * elements l, l+16, ... in order. */
INLINE __m512 key_partial(int H, const float *q, const void *kc, long k, int hd)
{
    __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), ld_kv(H, kc, k));
#pragma GCC unroll 8
    for (int e = 16; e < hd; e += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + e), ld_kv(H, kc, k + e), acc);
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

/* Four fold4 results (keys 4t .. 4t+3 in quad[t]) to one vector of 16 keys' sums, in key order:
 * the last two levels of the transposed reduction. */
INLINE __m512 fold_quads(const __m512 *quad)
{
    __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[0], quad[1], 0x88),
                              _mm512_shuffle_f32x4(quad[0], quad[1], 0xdd));
    __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(quad[2], quad[3], 0x88),
                              _mm512_shuffle_f32x4(quad[2], quad[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

/* Lane l of key_partial over bf16 numbers: the chain over pairs l, l + 16, ... of query q and
 * key k (both bf16, hd elements). */
INLINE __m512 key_partial_bf(const uint16_t *q, const uint16_t *k, int hd)
{
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int e = 0; e < hd; e += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(q + e),
                               (__m512bh)_mm512_loadu_si512(k + e));
    return acc;
}

/* The dot products of q with the keys at elements k, k + ldk, ... of the cache (nk of them,
 * 1..16; the rest read as zero), in key order. Every key's sum has the same tree whatever nk is:
 * lanes never mix keys. BF: q and the keys (kc) are bf16 rows already rounded (the bf16 table's
 * key blocks), H unused. */
INLINE __m512 score_block(int BF, int H, const void *q, const void *kc, long k, long ldk, int hd,
                          int nk)
{
    __m512 quad[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        __m512 a[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            int j = 4 * t + u;
            a[u] = j >= nk ? _mm512_setzero_ps()
                   : BF    ? key_partial_bf(q, (const uint16_t *)kc + k + j * ldk, hd)
                           : key_partial(H, q, kc, k + j * ldk, hd);
        }
        quad[t] = fold4(a[0], a[1], a[2], a[3]);
    }
    return fold_quads(quad);
}

/* ---- scores with queries in lanes ------------------------------------------------------------
 * The same numbers as score_block, computed the other way round for many queries at once: lane x
 * of a vector holds query x (qt = the queries transposed, qt[e * 16 + x] = q_x[e]) and one key's
 * elements are broadcast. Each of the 16 partial chains P_l (elements l, l + 16, ...) runs in its
 * own register in the same order as lane l of key_partial, and the chains are added in the tree
 * of fold4 and score_block: ((P0+P2)+(P1+P3)) + ((P4+P6)+(P5+P7)) for the first half, and so
 * on. Additions commute exactly, so every query's score of every key is bitwise the one
 * score_block gives, and a row may take either path. */

/* acc + vdpbf16ps(a, the pair at m broadcast), the broadcast folded into the instruction
 * (GCC 12 keeps a separate vpbroadcastd: one instruction more per product of the score loops). */
INLINE __m512 dp_bcast(__m512 acc, __m512bh a, const uint16_t *m)
{
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*(const uint32_t *)m));
    return acc;
}

/* Chain P_l of KP keys k[u]: acc[u] lane x = sum over c of q_x[16c + l] * k_u[16c + l]. qt: the
 * queries transposed, n their elements. */
INLINE void lane_chain_f(int KP, const float *qt, const void *const *k, int n, int l, __m512 *acc)
{
    __m512 qv = _mm512_loadu_ps(qt + l * 16);
#pragma GCC unroll 4
    for (int u = 0; u < KP; u++)
        acc[u] = _mm512_mul_ps(_mm512_set1_ps(((const float *)k[u])[l]), qv);
#pragma GCC unroll 8
    for (int e = 16 + l; e < n; e += 16) {
        qv = _mm512_loadu_ps(qt + e * 16);
#pragma GCC unroll 4
        for (int u = 0; u < KP; u++)
            acc[u] = _mm512_fmadd_ps(_mm512_set1_ps(((const float *)k[u])[e]), qv, acc[u]);
    }
}

/* The bf16 table's chain P_l: the units are pairs of bfloat16 elements, qt[p * 16 + x] holds
 * query x's pair p, k[u] the key's elements, and the chain is vdpbf16ps over pairs l, l + 16, ...
 * from zero, as key_partial_bf's lane l. n: pairs. */
INLINE void lane_chain_bf(int KP, const uint32_t *qt, const void *const *k, int n, int l,
                          __m512 *acc)
{
#pragma GCC unroll 4
    for (int u = 0; u < KP; u++)
        acc[u] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int e = l; e < n; e += 16) {
        __m512bh qv = (__m512bh)_mm512_loadu_si512(qt + e * 16);
#pragma GCC unroll 4
        for (int u = 0; u < KP; u++)
            acc[u] = dp_bcast(acc[u], qv, (const uint16_t *)k[u] + 2 * e);
    }
}

INLINE void lane_chain(int BF, int KP, const void *qt, const void *const *k, int n, int l,
                       __m512 *acc)
{
    if (BF)
        lane_chain_bf(KP, qt, k, n, l, acc);
    else
        lane_chain_f(KP, qt, k, n, l, acc);
}

/* (P_l + P_l+2) + (P_l+1 + P_l+3) of KP keys, l = 4m: fold4's sum of quarter m. */
INLINE void lane_quarter(int BF, int KP, const void *qt, const void *const *k, int n, int m,
                         __m512 *s)
{
    __m512 a[4], b[4], t[4];
    lane_chain(BF, KP, qt, k, n, 4 * m, a);
    lane_chain(BF, KP, qt, k, n, 4 * m + 2, b);
#pragma GCC unroll 4
    for (int u = 0; u < KP; u++)
        t[u] = _mm512_add_ps(a[u], b[u]);
    lane_chain(BF, KP, qt, k, n, 4 * m + 1, a);
    lane_chain(BF, KP, qt, k, n, 4 * m + 3, b);
#pragma GCC unroll 4
    for (int u = 0; u < KP; u++)
        s[u] = _mm512_add_ps(t[u], _mm512_add_ps(a[u], b[u]));
}

/* Scaled scores of the KP keys k[u] for the 16 queries of qt: (S0 + S1) + (S2 + S3). */
INLINE void lane_keys(int BF, int KP, const void *qt, const void *const *k, int n, __m512 sv,
                      __m512 *out)
{
    __m512 s0[4], s1[4], h01[4];
    lane_quarter(BF, KP, qt, k, n, 0, s0);
    lane_quarter(BF, KP, qt, k, n, 1, s1);
#pragma GCC unroll 4
    for (int u = 0; u < KP; u++)
        h01[u] = _mm512_add_ps(s0[u], s1[u]);
    lane_quarter(BF, KP, qt, k, n, 2, s0);
    lane_quarter(BF, KP, qt, k, n, 3, s1);
#pragma GCC unroll 4
    for (int u = 0; u < KP; u++)
        out[u] = _mm512_mul_ps(_mm512_add_ps(h01[u], _mm512_add_ps(s0[u], s1[u])), sv);
}

/* r[i] lane j <- r[j] lane i. */
INLINE void transpose16(__m512 *r)
{
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    /* r[4i + w], quarter m: column 4m + w of rows 4i .. 4i+3; the quarters change places next. */
#pragma GCC unroll 4
    for (int w = 0; w < 4; w++) {
        t[w] = _mm512_shuffle_f32x4(r[w], r[4 + w], 0x88);
        t[4 + w] = _mm512_shuffle_f32x4(r[w], r[4 + w], 0xdd);
        t[8 + w] = _mm512_shuffle_f32x4(r[8 + w], r[12 + w], 0x88);
        t[12 + w] = _mm512_shuffle_f32x4(r[8 + w], r[12 + w], 0xdd);
    }
#pragma GCC unroll 4
    for (int w = 0; w < 4; w++) {
        r[w] = _mm512_shuffle_f32x4(t[w], t[8 + w], 0x88);
        r[8 + w] = _mm512_shuffle_f32x4(t[w], t[8 + w], 0xdd);
        r[4 + w] = _mm512_shuffle_f32x4(t[4 + w], t[12 + w], 0x88);
        r[12 + w] = _mm512_shuffle_f32x4(t[4 + w], t[12 + w], 0xdd);
    }
}

/* A tile: the query heads of one kv group in nr rows that read the same keys (one slot, one first
 * position), query x = r * nh + g. Each key block is read from memory once for all of them and
 * then from L1; each value row loaded into registers feeds up to MAXH queries. Every query's
 * numbers are those it would get alone: sharing changes the loop order, never a sum's order. */
struct tile {
    int nq, hd;
    long ldk, ldp; /* stride of cache rows; of score rows in scratch */
    float scale;
    int half;          /* the cache holds halves (uint16_t), else floats */
    int staged;        /* bf16 table: values bf16 pairs (kwk_attn_args.kv_bf16) */
    int kbf;           /* bf16 table: keys bf16 as they are (kv_bf16 or k_bf16) */
    int vbf;           /* bf16 table: values bf16 rows as they are (v_bf16, not staged) */
    const void *k, *v; /* position first, this kv head */
    const float *q[MAXQ];
    float *out[MAXQ];
    int n[MAXQ]; /* positions attended, >= 1, non-decreasing with x */
    float sums[MAXQ];
};

/* Block [b, b + 16)'s scaled scores s (lane u: key b + u) into query x's row of p; the lanes past
 * the query's n get -inf, and a block wholly past it is not stored. */
INLINE void store_scores(const struct tile *t, int x, int b, __m512 s, float *p)
{
    int left = t->n[x] - b;
    float *px = p + x * t->ldp + b;
    if (left >= KB)
        _mm512_storeu_ps(px, s);
    else if (left > 0)
        _mm512_storeu_ps(
            px, _mm512_mask_blend_ps((__mmask16)((1u << left) - 1), _mm512_set1_ps(-INFINITY), s));
}

/* Scores key by key for each query (score_block), block by block so that the block stays in L1
 * across the queries. H and hd are constants after inlining. */
INLINE void scores_hd(int H, const struct tile *t, int hd, float *p)
{
    __m512 sv = _mm512_set1_ps(t->scale);
    int nmax = t->n[t->nq - 1];
    for (int b = 0; b < nmax; b += KB) {
        long kb = b * t->ldk;
        for (int x = 0; x < t->nq; x++) {
            int nk = KWK_MIN(KB, t->n[x] - b);
            if (nk > 0)
                store_scores(t, x, b,
                             _mm512_mul_ps(score_block(0, H, t->q[x], t->k, kb, t->ldk, hd, nk), sv),
                             p);
        }
    }
}

/* Keys [b, b + nk) of a half cache widened into kf[nk][hd] (exactly), for the paths that read a
 * key's elements one at a time. */
static void widen_keys(const struct tile *t, int b, int nk, float *kf)
{
    for (int u = 0; u < nk; u++)
        for (int e = 0; e < t->hd; e += 16)
            _mm512_storeu_ps(kf + (long)u * t->hd + e, ld_kv(1, t->k, (b + u) * t->ldk + e));
}

/* The same scores with the queries in lanes (lane_keys): qt takes 16 * hd floats, then kf
 * 16 * hd for a block of keys widened from a half cache. Keys past the tile's last are not read
 * (their lanes repeat its last key and are dropped). */
INLINE void lane_scores_hd(const struct tile *t, int hd, float *qt, float *p)
{
    float *kf = qt + MAXQ * hd;
    for (int e = 0; e < hd; e++)
        for (int x = 0; x < MAXQ; x++)
            qt[e * MAXQ + x] = x < t->nq ? t->q[x][e] : 0.0f;
    __m512 sv = _mm512_set1_ps(t->scale);
    int nmax = t->n[t->nq - 1];
    for (int b = 0; b < nmax; b += KB) {
        __m512 r[KB];
        int nk = KWK_MIN(KB, nmax - b);
        if (t->half)
            widen_keys(t, b, nk, kf);
        for (int u0 = 0; u0 < KB; u0 += 4) {
            /* Hides that qt is the same for every 4 keys: else GCC loads all of it once into
             * stack slots (hd registers' worth) instead of each row where it is used. */
            __asm__("" : "+r"(qt));
            const void *k[4];
            for (int u = 0; u < 4; u++) {
                int j = KWK_MIN(u0 + u, nk - 1);
                k[u] = t->half ? kf + (long)j * hd : (const float *)t->k + (b + j) * t->ldk;
            }
            lane_keys(0, 4, qt, k, hd, sv, r + u0);
        }
        transpose16(r);
        for (int x = 0; x < t->nq; x++)
            store_scores(t, x, b, r[x], p);
    }
}

/* Scores of every query into p + x * ldp, by either path (the same numbers), the hd common
 * sizes unrolled; scratch (32 * hd floats) for the queries in lanes. */
static void scores(const struct tile *t, float *p, float *scratch)
{
    if (t->nq >= LANES_MIN) {
        switch (t->hd) {
        case 64:
            lane_scores_hd(t, 64, scratch, p);
            break;
        case 128:
            lane_scores_hd(t, 128, scratch, p);
            break;
        default:
            lane_scores_hd(t, t->hd, scratch, p);
            break;
        }
        return;
    }
    switch (t->hd * 2 + t->half) {
    case 128:
        scores_hd(0, t, 64, p);
        break;
    case 129:
        scores_hd(1, t, 64, p);
        break;
    case 256:
        scores_hd(0, t, 128, p);
        break;
    case 257:
        scores_hd(1, t, 128, p);
        break;
    default:
        if (t->half)
            scores_hd(1, t, t->hd, p);
        else
            scores_hd(0, t, t->hd, p);
        break;
    }
}

/* The largest score of a row of n (its blocks' lanes past n hold -inf), broadcast. */
INLINE __m512 row_max(const float *p, int n)
{
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int b = 0; b < n; b += KB)
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(p + b));
    return _mm512_set1_ps(_mm512_reduce_max_ps(mv));
}

/* exp(p[b + l] - mx) for the 16 lanes of block b (b < n), zero past n. */
INLINE __m512 weights16(const float *p, int b, int n, __m512 mx)
{
    __mmask16 m = n - b >= KB ? (__mmask16)0xffff : (__mmask16)((1u << (n - b)) - 1);
    return _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_loadu_ps(p + b), mx)));
}

/* p[0..n) = exp(p - max p), padded to whole blocks with zeros; returns their sum. */
static float softmax_unnormalized(float *p, int n)
{
    __m512 mx = row_max(p, n), sum = _mm512_setzero_ps();
    for (int b = 0; b < n; b += KB) {
        __m512 e = weights16(p, b, n, mx);
        _mm512_storeu_ps(p + b, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* Keys [j0, j1) of out_x[c0 + c] = sum_j p_x[j] v_j[c0 + c] / sums[x] for NH queries from x0 and
 * NC chunks of 16 columns: the accumulators stay in registers while the value rows stream past,
 * each chain in key order; between key ranges they wait in out (unscaled), and the last range
 * (j1 = the largest n) divides. Past its own n a query takes no key. NH, NC and H (a half
 * cache) are constants after inlining. */
INLINE void values_tile(int NH, int NC, int H, const struct tile *t, int x0, const float *p, int c0,
                        int j0, int j1)
{
    __m512 acc[MAXH][4];
    const void *v = t->v;
    long ldv = t->ldk, ldp = t->ldp;
    int nmin = KWK_MIN(t->n[x0], j1), nmax = t->n[x0 + NH - 1];
    p += x0 * ldp;
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[g][c] =
                j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(t->out[x0 + g] + c0 + 16 * c);
    int j = j0;
    for (; j < nmin; j++) {
        __m512 vv[4];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            vv[c] = ld_kv(H, v, c0 + j * ldv + 16 * c);
#pragma GCC unroll 8
        for (int g = 0; g < NH; g++) {
            __m512 pj = _mm512_set1_ps(p[g * ldp + j]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[g][c] = _mm512_fmadd_ps(pj, vv[c], acc[g][c]);
        }
    }
    for (; j < KWK_MIN(j1, nmax); j++) {
#pragma GCC unroll 8
        for (int g = 0; g < NH; g++) {
            if (j >= t->n[x0 + g])
                continue;
            __m512 pj = _mm512_set1_ps(p[g * ldp + j]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[g][c] = _mm512_fmadd_ps(pj, ld_kv(H, v, c0 + j * ldv + 16 * c), acc[g][c]);
        }
    }
    int last = j1 >= nmax;
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++) {
        __m512 sv = _mm512_set1_ps(t->sums[x0 + g]);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(t->out[x0 + g] + c0 + 16 * c,
                             last ? _mm512_div_ps(acc[g][c], sv) : acc[g][c]);
    }
}

/* values_tile with its constants chosen: nh in 1..MAXH, nc in {1, 2, 4}, the cache's type. */
/* The (queries, 16-column chunks) shapes a values tile is compiled for; 6 x 4 serves the rest. */
#define VALUE_SHAPES(X)                                                                            \
    X(1, 1) X(1, 2) X(1, 4) X(2, 1) X(2, 2) X(2, 4) X(3, 1) X(3, 2) X(3, 4) X(4, 1) X(4, 2)        \
        X(4, 4) X(5, 1) X(5, 2) X(5, 4) X(6, 1) X(6, 2)

static void values_tile_n(int nh, int nc, const struct tile *t, int x0, const float *p, int c0,
                          int j0, int j1)
{
#define VT(NH, NC)                                                                                 \
    case (NH) * 8 + (NC):                                                                          \
        if (t->half)                                                                               \
            values_tile(NH, NC, 1, t, x0, p, c0, j0, j1);                                          \
        else                                                                                       \
            values_tile(NH, NC, 0, t, x0, p, c0, j0, j1);                                          \
        return;
    switch (nh * 8 + nc) {
        VALUE_SHAPES(VT)
    default:
        break;
    }
#undef VT
    if (t->half)
        values_tile(6, 4, 1, t, x0, p, c0, j0, j1);
    else
        values_tile(6, 4, 0, t, x0, p, c0, j0, j1);
}

/* ---- bf16 products: the table of decoders with 8-bit activations ----------------------------
 * kwk_attn_avx512_bf16 rounds queries, keys, the softmax's weights and values to bfloat16 (to
 * nearest even) and sums their products in float with vdpbf16ps: 32 products an instruction
 * where an FMA does 16 (Zen 4, one core: 117 against 58 GMAC/s), the same number of
 * instructions for half the work. Decoders whose matrices read 8-bit activations use it (their
 * activations already round to 8 bits; perplexity in docs/benchmarks.md). Invariance as in the
 * float paths: lane l of a key's partial chain takes pairs l, l + 16, ... of (2p, 2p + 1)
 * elements from zero, then score_block's tree; both score paths run the same instruction on the
 * same operands in every lane. An output element's chain runs over key pairs (j, j + 1) in
 * order. head_dim a multiple of 32 (else the float tiles). */

/* 32 cache elements from element i, widened and rounded to bf16, in order. */
INLINE __m512bh ld_bf(int H, const void *base, long i)
{
    return _mm512_cvtne2ps_pbh(ld_kv(H, base, i + 16), ld_kv(H, base, i));
}

/* Pair p (elements 2p, 2p + 1) of bf16 row r, broadcast: vdpbf16ps's second operand. */
INLINE __m512bh pair_bcast(const uint16_t *r, int p)
{
    uint32_t v;
    memcpy(&v, r + 2 * p, sizeof v);
    return (__m512bh)_mm512_set1_epi32((int)v);
}

/* 32 floats rounded to bf16, in order. */
INLINE __m512i round_bf(const float *x)
{
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}

/* Keys [b, b + nk) rounded into kb[nk][hd]. */
static void keys_bf(const struct tile *t, int b, int nk, uint16_t *kb)
{
    for (int u = 0; u < nk; u++)
        for (int e = 0; e < t->hd; e += 32)
            _mm512_storeu_si512(kb + (long)u * t->hd + e,
                                (__m512i)(t->half ? ld_bf(1, t->k, (b + u) * t->ldk + e)
                                                  : ld_bf(0, t->k, (b + u) * t->ldk + e)));
}

/* ---- AMX-BF16 products: the table kwk_attn_amx_bf16 --------------------------------------
 * The bf16 table's numbers (queries, keys, the softmax's weights and values rounded alike, the
 * same softmax) with the products on AMX (amx_attn.c): a key block's scores of all 16 query
 * slots in one chain of tile multiplies, a 16-key block's weighted values of 16 queries in
 * another (even and odd elements apart, the values read as they lie). Its sums run in AMX's
 * order, so it agrees with the bf16 table to float rounding, not bitwise: a table of its own,
 * used for every item (decode steps too, whose tiles hold a few queries), and batch invariant as
 * the others: a tile multiply's element depends only on its query, its key or value element and
 * the blocks before it; a block's keys past a query's last have weight zero, which adds nothing
 * (a +0 can only turn an exactly -0 sum into +0). head_dim a multiple of 32, else the float
 * tiles. */

/* Blocks b, b + 16, ... (nb of them) of a few queries' scores from the tile multiplies' output s
 * (16 x 16 floats a block, query x in column x): each query's column gathered, scaled and
 * stored. Returns the position after them. */
INLINE int store_gathered(const struct tile *t, const float *s, int nb, int b, __m512 sv, float *p)
{
    const __m512i col = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64,
                                         48, 32, 16, 0); /* u * MAXQ */
    for (int i = 0; i < nb; i++, b += KB)
        for (int x = 0; x < t->nq; x++)
            store_scores(t, x, b,
                         _mm512_mul_ps(_mm512_i32gather_ps(col, s + i * KB * MAXQ + x, 4), sv), p);
    return b;
}

/* Every query's scores into its row of p (store_scores): a decode step's few queries over whole
 * blocks of bf16 keys in runs of RUN_BLOCKS blocks (kwk_attn_amx_scores_run; head dims of 32 or
 * 64); otherwise up to 4 blocks of keys a call where they can be read as they lie (whole blocks
 * of bf16 keys), else a block at a time rounded or copied into kb, 16 rows, the missing ones
 * zero. qt: the queries as pairs (scores_bf_hd). */
static void scores_amx(const struct tile *t, const uint32_t *qt, uint16_t *kb, __m512 sv, float *p)
{
    int hd = t->hd, nmax = t->n[t->nq - 1], b = 0;
    if (t->kbf && t->nq <= 4 && (hd == 32 || hd == 64)) {
        /* a decode step's whole blocks, RUN_BLOCKS a call (kwk_attn_amx_scores_run), then each
         * query's columns gathered. With the values' tiles cut to the queries' rows (amx_spans):
         * 1-2.7% less time a generated token of SmolLM2-135M int4 at 512-640 positions, 0.7-1.4%
         * of 360M, token by token (session 38) */
        _Alignas(64) float sr[RUN_BLOCKS * KB * MAXQ];
        for (int whole = nmax / KB * KB; b < whole;) {
            int nb = KWK_MIN(RUN_BLOCKS, (whole - b) / KB);
            kwk_attn_amx_scores_run(qt, (const uint16_t *)t->k + (long)b * t->ldk, t->ldk, hd, nb,
                                    sr);
            b = store_gathered(t, sr, nb, b, sv, p);
        }
    }
    _Alignas(64) float s[4 * KB * MAXQ];
    while (b < nmax) {
        int nk = nmax - b, nb = 1;
        const uint16_t *kr = kb;
        long ldr = hd;
        if (t->kbf && nk >= KB) {
            nb = KWK_MIN(4, nk / KB);
            kr = (const uint16_t *)t->k + (long)b * t->ldk, ldr = t->ldk;
        } else {
            nk = KWK_MIN(nk, KB);
            if (t->kbf)
                for (int u = 0; u < nk; u++)
                    memcpy(kb + (long)u * hd, (const uint16_t *)t->k + (long)(b + u) * t->ldk,
                           (size_t)hd * sizeof *kb);
            else
                keys_bf(t, b, nk, kb);
            memset(kb + (long)nk * hd, 0, (size_t)(KB - nk) * (size_t)hd * sizeof *kb);
        }
        kwk_attn_amx_scores(qt, kr, ldr, hd, nb, s);
        if (t->nq <= 4) { /* a decode step's few queries: each one's column gathered */
            b = store_gathered(t, s, nb, b, sv, p);
            continue;
        }
        for (int i = 0; i < nb; i++, b += KB) {
            __m512 r[KB];
            for (int u = 0; u < KB; u++)
                r[u] = _mm512_load_ps(s + (i * KB + u) * MAXQ);
            transpose16(r); /* r[x] lane u: key b + u's score of query x */
            for (int x = 0; x < t->nq; x++)
                store_scores(t, x, b, _mm512_mul_ps(r[x], sv), p);
        }
    }
}

/* Every query's scores into p + x * ldp. scratch: the rounded queries (or their pairs
 * transposed: 8 * hd floats' room), then a rounded key block (8 * hd). */
INLINE void scores_bf_hd(int AMX, const struct tile *t, int hd, float *p, float *scratch)
{
    uint16_t *qb = (uint16_t *)scratch, *kb = (uint16_t *)(scratch + MAXQ * hd);
    __m512 sv = _mm512_set1_ps(t->scale);
    int nmax = t->n[t->nq - 1], lanes = AMX || t->nq >= LANES_MIN;
    uint32_t *qt = (uint32_t *)scratch;
    if (lanes) { /* qt[p * 16 + x]: pair p of query x, 16 pairs (32 elements) at a time */
        for (int e = 0; e < hd; e += 32) {
            __m512 r[MAXQ];
            for (int x = 0; x < MAXQ; x++)
                r[x] = _mm512_castsi512_ps(x < t->nq ? round_bf(t->q[x] + e)
                                                     : _mm512_setzero_si512());
            transpose16(r); /* r[p] lane x: pair e / 2 + p of query x */
            for (int pr = 0; pr < 16; pr++)
                _mm512_storeu_ps((float *)(qt + (e / 2 + pr) * MAXQ), r[pr]);
        }
    } else {
        for (int x = 0; x < t->nq; x++)
            for (int e = 0; e < hd; e += 32)
                _mm512_storeu_si512(qb + x * hd + e, round_bf(t->q[x] + e));
    }
    if (AMX) {
        scores_amx(t, qt, kb, sv, p);
        return;
    }
    for (int b = 0; b < nmax; b += KB) {
        int nk = KWK_MIN(KB, nmax - b);
        /* the block's rounded keys: staged ones where they are, else rounded into kb */
        const uint16_t *kr = kb;
        long ldr = hd;
        if (t->kbf) {
            kr = (const uint16_t *)t->k + (long)b * t->ldk, ldr = t->ldk;
            /* read where they lie, the keys' loads wait on the products: ask for the block
             * after next meanwhile (keys_bf's plain copy kept many loads in flight itself) */
            if (b + 2 * KB < nmax)
                for (int u = 0; u < KWK_MIN(KB, nmax - b - 2 * KB); u++)
                    for (int e = 0; e < hd; e += 32)
                        _mm_prefetch((const char *)(kr + (long)(2 * KB + u) * ldr + e),
                                     _MM_HINT_T0);
        } else
            keys_bf(t, b, nk, kb);
        if (!lanes) {
            for (int x = 0; x < t->nq; x++) {
                int nkx = KWK_MIN(KB, t->n[x] - b);
                if (nkx > 0)
                    store_scores(
                        t, x, b,
                        _mm512_mul_ps(score_block(1, 0, qb + x * hd, kr, 0, ldr, hd, nkx), sv),
                        p);
            }
            continue;
        }
        __m512 r[KB];
        for (int u0 = 0; u0 < KB; u0 += 4) {
            __asm__("" : "+r"(qt)); /* as lane_scores_hd */
            const void *k[4];
            for (int u = 0; u < 4; u++)
                k[u] = kr + (long)KWK_MIN(u0 + u, nk - 1) * ldr;
            lane_keys(1, 4, qt, k, hd / 2, sv, r + u0);
        }
        transpose16(r);
        for (int x = 0; x < t->nq; x++)
            store_scores(t, x, b, r[x], p);
    }
}

static void scores_bf(int amx, const struct tile *t, float *p, float *scratch)
{
    if (amx) /* the tile unit's loops take hd as it comes */
        scores_bf_hd(1, t, t->hd, p, scratch);
    else if (t->hd == 64)
        scores_bf_hd(0, t, 64, p, scratch);
    else if (t->hd == 128)
        scores_bf_hd(0, t, 128, p, scratch);
    else
        scores_bf_hd(0, t, t->hd, p, scratch);
}

/* softmax_unnormalized's weights rounded to bf16 in place, in one pass: the row's first bytes
 * then hold them as uint16_t, zero-padded to a multiple of 32. Returns the sum of the rounded
 * weights, the divisor that matches them. Each 64-byte store lands on floats already read. */
/* Weights [b, b + 32) of a row of n (zero from n) rounded to bf16: returns the 32 in order, *w0
 * and *w1 the first and last 16 as floats (bf16 in the high half), and adds those to *sum (the
 * divisor that matches the rounded weights, in one order for both tables that use it). */
INLINE __m512i weights_bf(const float *p, int b, int n, __m512 mx, __m512i *w0, __m512i *w1,
                          __m512 *sum)
{
    __m512 e0 = b < n ? weights16(p, b, n, mx) : _mm512_setzero_ps();
    __m512 e1 = b + KB < n ? weights16(p, b + KB, n, mx) : _mm512_setzero_ps();
    __m512i r = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
    *w0 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(r)), 16);
    *w1 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(r, 1)), 16);
    *sum = _mm512_add_ps(*sum, _mm512_add_ps(_mm512_castsi512_ps(*w0), _mm512_castsi512_ps(*w1)));
    return r;
}

static float softmax_bf(float *p, int n)
{
    __m512 mx = row_max(p, n), sum = _mm512_setzero_ps();
    uint16_t *pb = (uint16_t *)p;
    for (int b = 0; b < n; b += 32) {
        __m512i w0, w1;
        _mm512_storeu_si512(pb + b, weights_bf(p, b, n, mx, &w0, &w1, &sum));
    }
    return _mm512_reduce_add_ps(sum);
}

/* Elements c .. c + 15 of value rows i and i + ld (zero when !two) as one vector of bf16 pairs:
 * (v_i[c], v_{i+ld}[c]), (v_i[c+1], ...), the operand order vdpbf16ps sums. H: rows of floats
 * (0), halves (1) or bf16 already (3: half_to_bf16's, the same values). */
INLINE __m512bh pair_rows(int H, const void *v, long i, long ld, int two)
{
    const __m512i ilv = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    if (H == 3) {
        const uint16_t *b = (const uint16_t *)v;
        __m256i lo = _mm256_loadu_si256((const __m256i *)(b + i));
        __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(b + i + ld))
                         : _mm256_setzero_si256();
        return (__m512bh)_mm512_permutexvar_epi16(
            ilv, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    __m512 lo = ld_kv(H, v, i), hi = two ? ld_kv(H, v, i + ld) : _mm512_setzero_ps();
    return (__m512bh)_mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* The same vector from staged pairs (kwk_attn_args.kv_bf16): pair block j (even) of the run at
 * vp, elements c .. c + 15; the second key's halves zeroed when !two. */
INLINE __m512bh pair_staged(const uint16_t *vp, long j, long ld, int c, int two)
{
    __m512i x = _mm512_loadu_si512(vp + j * ld + 2 * c);
    return (__m512bh)(two ? x : _mm512_maskz_mov_epi16(0x55555555u, x));
}

/* values_tile with bf16 products: key pairs (j, j + 1), the value rows of a pair interleaved
 * element by element (vdpbf16ps's pairs) and each query's weight pair broadcast. pb: rounded
 * weights, row x at pb + x * ldpb. A pair's second key past the tile's last reads as zero (its
 * weights are zero there too, and the cache may hold anything). H: the cache's floats (0),
 * halves (1) or bf16 rows (3), or staged pairs (2; vi then points at the range's first pair). */
INLINE void values_tile_bf(int NH, int NC, int H, const struct tile *t, int x0,
                           const uint16_t *pb, long ldpb, const uint16_t *vi, int c0, int j0,
                           int j1)
{
    __m512 acc[MAXH][4];
    const void *v = t->v;
    long ldv = t->ldk;
    int nmin = KWK_MIN(t->n[x0], j1), nmax = t->n[x0 + NH - 1], ntile = t->n[t->nq - 1];
    const uint16_t *w[MAXH];
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++) {
        w[g] = pb + (x0 + g) * ldpb;
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[g][c] =
                j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(t->out[x0 + g] + c0 + 16 * c);
    }
    int jend = KWK_MIN(j1, nmax), j = j0;
    /* Pairs every query takes whole: branch-free, from the interleaved copy when there is one. */
    if (vi) {
        const uint16_t *vr = vi + 2 * c0;
        for (; j < nmin && j + 1 < ntile; j += 2, vr += 2 * t->hd) {
            __m512bh vv[4];
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                vv[c] = (__m512bh)_mm512_loadu_si512(vr + 32 * c);
#pragma GCC unroll 8
            for (int g = 0; g < NH; g++) {
                __m512bh pj = pair_bcast(w[g], j / 2);
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++)
                    acc[g][c] = _mm512_dpbf16_ps(acc[g][c], vv[c], pj);
            }
        }
    } else {
        for (; j < nmin && j + 1 < ntile; j += 2) {
            __m512bh vv[4];
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                vv[c] = pair_rows(H, v, c0 + j * ldv + 16 * c, ldv, 1);
#pragma GCC unroll 8
            for (int g = 0; g < NH; g++) {
                __m512bh pj = pair_bcast(w[g], j / 2);
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++)
                    acc[g][c] = _mm512_dpbf16_ps(acc[g][c], vv[c], pj);
            }
        }
    }
    /* The rest: queries past their own n take nothing, a second key past the tile's is zero. */
    for (; j < jend; j += 2) {
        __m512bh vv[4];
        int two = j + 1 < ntile;
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            vv[c] = H == 2 ? pair_staged(v, j, ldv, c0 + 16 * c, two)
                           : pair_rows(H, v, c0 + j * ldv + 16 * c, ldv, two);
#pragma GCC unroll 8
        for (int g = 0; g < NH; g++) {
            if (j >= t->n[x0 + g])
                continue;
            __m512bh pj = pair_bcast(w[g], j / 2);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[g][c] = _mm512_dpbf16_ps(acc[g][c], vv[c], pj);
        }
    }
    int last = j1 >= nmax;
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++) {
        __m512 sv = _mm512_set1_ps(t->sums[x0 + g]);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(t->out[x0 + g] + c0 + 16 * c,
                             last ? _mm512_div_ps(acc[g][c], sv) : acc[g][c]);
    }
}

/* Values [j0, j1) of the tile as values_tile_bf reads them, pair by pair: vi[(j - j0) * hd +
 * 2c + i] = v_{j+i}[c] rounded, for even j - j0 (a second key past the tile's last is zero).
 * Done once when several passes read the same key range. */
static void values_interleave(const struct tile *t, int j0, int j1, uint16_t *vi)
{
    int ntile = t->n[t->nq - 1];
    for (int j = j0; j < j1; j += 2)
        for (int c = 0; c < t->hd; c += 16) {
            long i = c + j * t->ldk;
            int two = j + 1 < ntile;
            _mm512_storeu_si512(vi + (long)(j - j0) * t->hd + 2 * c,
                                (__m512i)(t->vbf    ? pair_rows(3, t->v, i, t->ldk, two)
                                          : t->half ? pair_rows(1, t->v, i, t->ldk, two)
                                                    : pair_rows(0, t->v, i, t->ldk, two)));
        }
}

/* softmax_bf's weights for the AMX values, both forms kwk_attn_amx_values reads: p[j] the
 * rounded weight as a float (its bf16 in the high half), pe[j] its bits >> 16, zero from n to nz
 * (a multiple of 16). Returns softmax_bf's sum; *max: the largest score, which it subtracts. */
static float softmax_amx(float *p, float *pe, int n, int nz, float *max)
{
    __m512 mx = row_max(p, n), sum = _mm512_setzero_ps();
    *max = _mm512_cvtss_f32(mx);
    for (int b = 0; b < nz; b += 32) {
        __m512i w0, w1;
        weights_bf(p, b, n, mx, &w0, &w1, &sum);
        _mm512_storeu_si512(p + b, w0);
        _mm512_storeu_si512(pe + b, _mm512_srli_epi32(w0, 16));
        if (b + KB < nz) {
            _mm512_storeu_si512(p + b + KB, w1);
            _mm512_storeu_si512(pe + b + KB, _mm512_srli_epi32(w1, 16));
        }
    }
    return _mm512_reduce_add_ps(sum);
}

/* Value rows [b, b + nk) of the tile rounded to bf16 into vb[16][hd], the rows past nk zero: a
 * block the tile multiplies cannot read where it lies (rows past the tile's last, or a cache not
 * in bf16). */
static void values_block_bf(const struct tile *t, int b, int nk, uint16_t *vb)
{
    for (int u = 0; u < nk; u++)
        for (int e = 0; e < t->hd; e += 32)
            _mm512_storeu_si512(vb + (long)u * t->hd + e,
                                (__m512i)(t->vbf    ? _mm512_loadu_si512((const uint16_t *)t->v +
                                                                         (b + u) * t->ldk + e)
                                          : t->half ? (__m512i)ld_bf(1, t->v, (b + u) * t->ldk + e)
                                                    : (__m512i)ld_bf(0, t->v, (b + u) * t->ldk + e)));
    memset(vb + (long)nk * t->hd, 0, (size_t)(KB - nk) * (size_t)t->hd * sizeof *vb);
}

/* The AMX table's values: dst[x * lddst + e] = the weights of query x (wo, we: softmax_amx's
 * forms, rows ldw apart) times the values' element e, undivided; 64 elements of every query a
 * pass. vb: a block's room (16 * hd bf16). */
static void values_amx(const struct tile *t, const float *wo, const float *we, long ldw,
                       uint16_t *vb, float *dst, long lddst)
{
    int hd = t->hd, ntile = t->n[t->nq - 1], whole = t->vbf ? ntile & ~(KB - 1) : 0;
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    for (int c0 = 0; c0 < hd; c0 += 64) {
        int nch = KWK_MIN(2, (hd - c0) / 32);
        _Alignas(64) float acc[4][256];
        if (whole) /* bf16 rows where they lie */
            kwk_attn_amx_values(wo, we, ldw, (const uint16_t *)t->v + c0, t->ldk, nch, whole, 1,
                                acc);
        for (int b = whole; b < ntile; b += KB) {
            values_block_bf(t, b, KWK_MIN(KB, ntile - b), vb);
            kwk_attn_amx_values(wo + b, we + b, ldw, vb + c0, hd, nch, KB, b == 0, acc);
        }
        for (int x = 0; x < t->nq; x++)
            for (int c = 0; c < nch; c++) {
                __m512 ev = _mm512_load_ps(acc[2 * c] + x * 16);
                __m512 od = _mm512_load_ps(acc[2 * c + 1] + x * 16);
                float *o = dst + x * lddst + c0 + 32 * c;
                _mm512_storeu_ps(o, _mm512_permutex2var_ps(ev, lo, od));
                _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(ev, hi, od));
            }
    }
}

static void values_tile_bf_n(int nh, int nc, const struct tile *t, int x0, const uint16_t *pb,
                             long ldpb, const uint16_t *vi, int c0, int j0, int j1)
{
#define VT(NH, NC)                                                                                 \
    case (NH) * 8 + (NC):                                                                          \
        if (t->staged)                                                                             \
            values_tile_bf(NH, NC, 2, t, x0, pb, ldpb, vi, c0, j0, j1);                            \
        else if (t->vbf)                                                                           \
            values_tile_bf(NH, NC, 3, t, x0, pb, ldpb, vi, c0, j0, j1);                            \
        else if (t->half)                                                                          \
            values_tile_bf(NH, NC, 1, t, x0, pb, ldpb, vi, c0, j0, j1);                            \
        else                                                                                       \
            values_tile_bf(NH, NC, 0, t, x0, pb, ldpb, vi, c0, j0, j1);                            \
        return;
    switch (nh * 8 + nc) {
        VALUE_SHAPES(VT)
    default:
        break;
    }
#undef VT
    if (t->staged)
        values_tile_bf(6, 4, 2, t, x0, pb, ldpb, vi, c0, j0, j1);
    else if (t->vbf)
        values_tile_bf(6, 4, 3, t, x0, pb, ldpb, vi, c0, j0, j1);
    else if (t->half)
        values_tile_bf(6, 4, 1, t, x0, pb, ldpb, vi, c0, j0, j1);
    else
        values_tile_bf(6, 4, 0, t, x0, pb, ldpb, vi, c0, j0, j1);
}

/* Tile of query heads h0 .. h0+nh-1 of one kv group over rows row0 .. row0+nr-1 (tile_go). */
INLINE void tile_init(int BF, const struct kwk_attn_args *a, int row0, int nr, int h0, int nh,
                      struct tile *tp)
{
    int hd = a->head_dim, first = a->first[row0];
    size_t kv_off = (size_t)first * (size_t)a->ld_pos +
                    (size_t)(h0 / (a->n_heads / a->n_kv_heads)) * (size_t)a->ld_head;
    struct tile t = {.nq = nr * nh,
                     .hd = hd,
                     .ldk = a->ld_pos,
                     .scale = a->scale,
                     .half = a->kv_half,
                     .staged = BF && a->kv_bf16,
                     .kbf = BF && (a->kv_bf16 || a->k_bf16),
                     .vbf = BF && a->v_bf16 && !a->kv_bf16};
    size_t esize = a->kv_half || t.staged ? sizeof(uint16_t) : sizeof(float);
    t.k = (const char *)a->k_rows[row0] + kv_off * esize;
    t.v = (const char *)a->v_rows[row0] + kv_off * esize;
    for (int r = 0; r < nr; r++)
        for (int g = 0; g < nh; g++) {
            int x = r * nh + g, row = row0 + r;
            t.q[x] = a->q + row * a->ldq + (long)(h0 + g) * hd;
            t.out[x] = a->out + row * a->ldo + (long)(h0 + g) * hd;
            t.n[x] = a->last[row] - first + 1;
        }
    t.ldp = (t.n[t.nq - 1] + KB - 1) / KB * KB;
    *tp = t;
}

/* ---- the AMX table's spans ------------------------------------------------------------------
 * A row's positions, from its first, go in spans of AMX_SPAN: each span's weights are exp(score -
 * the span's own max) rounded to bf16, with their sum and weighted values, and the spans merge in
 * order, each scaled by exp(its max - the row's max) (span_scale; the sums and values folded by
 * span_sum and span_fold, then divided). So a long decode row's spans can go to different threads
 * (span_part, then span_merge: kwk_attn_kernel) and give the bits its tile gives: a score depends
 * only on its key and query, and the merge runs the same operations in the same order. */
#define AMX_SPAN 512

static float span_scale(float max, float row_max)
{
    return expf(max - row_max);
}

static float span_sum(float sum, float part, float scale)
{
    return fmaf(part, scale, sum);
}

/* tot += acc * scale, one rounding an element; hd a multiple of 32. */
static void span_fold(float *tot, const float *acc, float scale, int hd)
{
    __m512 sv = _mm512_set1_ps(scale);
    for (int e = 0; e < hd; e += 16)
        _mm512_storeu_ps(tot + e, _mm512_fmadd_ps(_mm512_loadu_ps(acc + e), sv,
                                                  _mm512_loadu_ps(tot + e)));
}

static void span_divide(float *out, float sum, int hd)
{
    __m512 sv = _mm512_set1_ps(sum);
    for (int e = 0; e < hd; e += 16)
        _mm512_storeu_ps(out + e, _mm512_div_ps(_mm512_loadu_ps(out + e), sv));
}

/* Tile t's positions [b0, b0 + AMX_SPAN) as a tile of their own: its keys and values from b0,
 * each query's count of them (0 for a query that ends before b0). */
static struct tile span_tile(const struct tile *t, int b0)
{
    struct tile u = *t;
    size_t at = (size_t)b0 * (size_t)t->ldk * (t->half ? sizeof(uint16_t) : sizeof(float));
    u.k = (const char *)t->k + at;
    u.v = (const char *)t->v + at;
    for (int x = 0; x < t->nq; x++)
        u.n[x] = KWK_MAX(0, KWK_MIN(t->n[x] - b0, AMX_SPAN));
    u.ldp = (u.n[u.nq - 1] + KB - 1) / KB * KB;
    return u;
}

/* The AMX table after its scores (p, rows t->ldp apart, every position of the tile): span by
 * span, the weights in both forms (the second after all 16 query slots' rows of p: the
 * multiplies read 16 rows), the weighted values into a room after them, folded into t->out; a
 * value block's room where the keys' was. */
static void amx_spans(const struct tile *t, float *p, float *scratch)
{
    int hd = t->hd, nmax = t->n[t->nq - 1];
    float *pe = p + (size_t)MAXQ * t->ldp, *acc = pe + (size_t)MAXQ * t->ldp;
    uint16_t *vb = (uint16_t *)(scratch + (size_t)MAXQ * hd);
    float rmax[MAXQ], sums[MAXQ], scale[MAXQ];
    for (int x = 0; x < t->nq; x++) {
        rmax[x] = -INFINITY;
        for (int b0 = 0; b0 < t->n[x]; b0 += AMX_SPAN)
            rmax[x] = fmaxf(rmax[x], _mm512_cvtss_f32(row_max(p + x * t->ldp + b0,
                                                               KWK_MIN(t->n[x] - b0, AMX_SPAN))));
        sums[x] = 0.0f;
        memset(t->out[x], 0, (size_t)hd * sizeof(float));
    }
    int cut = t->nq < MAXQ; /* the values' tiles cut to the queries' rows */
    if (cut)
        kwk_attn_amx_values_rows(t->nq);
    for (int b0 = 0; b0 < nmax; b0 += AMX_SPAN) {
        struct tile u = span_tile(t, b0);
        for (int x = 0; x < t->nq; x++)
            if (u.n[x] > 0) {
                float m, part = softmax_amx(p + x * t->ldp + b0, pe + x * t->ldp + b0, u.n[x],
                                            (int)u.ldp, &m);
                scale[x] = span_scale(m, rmax[x]);
                sums[x] = span_sum(sums[x], part, scale[x]);
            }
        values_amx(&u, p + b0, pe + b0, t->ldp, vb, acc, hd);
        for (int x = 0; x < t->nq; x++)
            if (u.n[x] > 0)
                span_fold(t->out[x], acc + (size_t)x * hd, scale[x], hd);
    }
    for (int x = 0; x < t->nq; x++)
        span_divide(t->out[x], sums[x], hd);
    if (cut)
        kwk_attn_amx_begin(); /* the full tiles again, for the next tile's scores */
}

/* Where, in a row's parts, span s of group g of a row with n positions keeps its query x's: the
 * span's max, its sum, then hd weighted values (kwk_attn_parts_floats). */
static size_t span_part_at(const struct kwk_attn_args *a, int n, int g, int s, int x)
{
    int gs = a->n_heads / a->n_kv_heads, ns = (n + AMX_SPAN - 1) / AMX_SPAN;
    return (((size_t)g * (size_t)ns + (size_t)s) * (size_t)gs + (size_t)x) *
           (size_t)(a->head_dim + 2);
}

/* kwk_attn_kernel.span_part: the tile of row's kv group g over span s alone (amx_spans' steps
 * for that span), its parts stored instead of folded (the group's queries' parts lie hd + 2
 * floats apart, so the values go straight to theirs). */
static void amx_span_part(const struct kwk_attn_args *a, int row, int g, int s, float *parts,
                          float *scratch)
{
    int hd = a->head_dim, gs = a->n_heads / a->n_kv_heads;
    struct tile t;
    tile_init(2, a, row, 1, g * gs, gs, &t);
    struct tile u = span_tile(&t, s * AMX_SPAN);
    if (u.n[0] <= 0)
        return;
    float *p = scratch + (size_t)(MAXQ + 16) * hd, *pe = p + (size_t)MAXQ * u.ldp;
    float *at = parts + span_part_at(a, t.n[0], g, s, 0);
    kwk_attn_amx_begin();
    scores_bf(1, &u, p, scratch);
    for (int x = 0; x < gs; x++) {
        float *ax = at + (size_t)x * (size_t)(hd + 2);
        ax[1] = softmax_amx(p + x * u.ldp, pe + x * u.ldp, u.n[x], (int)u.ldp, &ax[0]);
    }
    if (u.nq < MAXQ)
        kwk_attn_amx_values_rows(u.nq);
    values_amx(&u, p, pe, u.ldp, (uint16_t *)(scratch + (size_t)MAXQ * hd), at + 2, hd + 2);
    kwk_attn_amx_end();
}

/* kwk_attn_kernel.span_merge: amx_spans' fold over the parts, head by head. */
static void amx_span_merge(const struct kwk_attn_args *a, int row, int h0, int h1,
                           const float *parts)
{
    int hd = a->head_dim, gs = a->n_heads / a->n_kv_heads;
    int n = a->last[row] - a->first[row] + 1, ns = (n + AMX_SPAN - 1) / AMX_SPAN;
    for (int h = h0; h < h1; h++) {
        float *out = a->out + row * a->ldo + (long)h * hd, rmax = -INFINITY, sum = 0.0f;
        memset(out, 0, (size_t)hd * sizeof(float));
        if (n <= 0)
            continue;
        for (int s = 0; s < ns; s++)
            rmax = fmaxf(rmax, parts[span_part_at(a, n, h / gs, s, h % gs)]);
        for (int s = 0; s < ns; s++) {
            const float *at = parts + span_part_at(a, n, h / gs, s, h % gs);
            float scale = span_scale(at[0], rmax);
            sum = span_sum(sum, at[1], scale);
            span_fold(out, at + 2, scale, hd);
        }
        span_divide(out, sum, hd);
    }
}

/* One tile (kwk_attn_tile_fn, attn.h): query heads h0 .. h0+nh-1 of one kv group over rows
 * row0 .. row0+nr-1, which read the same keys; BF: the bf16 table's products (1), on AMX (2). */
INLINE void tile_go(int BF, const struct kwk_attn_args *a, int row0, int nr, int h0, int nh,
                    float *scratch)
{
    int hd = a->head_dim;
    struct tile t;
    tile_init(BF, a, row0, nr, h0, nh, &t);
    float *p = scratch + (size_t)(MAXQ + 16) * hd; /* after the transposed queries, the keys */
    if (BF)
        scores_bf(BF == 2, &t, p, scratch);
    else
        scores(&t, p, scratch);
    if (BF == 2) {
        amx_spans(&t, p, scratch);
        return;
    }
    for (int x = 0; x < t.nq; x++)
        t.sums[x] = BF ? softmax_bf(p + x * t.ldp, t.n[x])
                       : softmax_unnormalized(p + x * t.ldp, t.n[x]);
    /* Passes of equal size (a small last pass costs nearly as much as a full one), over key
     * ranges of about 32 KB of values, which stay in L1 for all the passes; even (BF: pairs). */
    int passes = (t.nq + MAXH - 1) / MAXH, per = (t.nq + passes - 1) / passes;
    int jb = passes > 1 ? KWK_MAX(16, 8192 / hd) & ~1 : t.n[t.nq - 1];
    /* BF with several passes: the range's values interleaved once, after the scores' scratch
     * (staged values are pairs already) */
    uint16_t *vi = BF && passes > 1 && !t.staged ? (uint16_t *)(p + (size_t)t.nq * t.ldp) : NULL;
    for (int j0 = 0; j0 < t.n[t.nq - 1]; j0 += jb) {
        int j1 = KWK_MIN(j0 + jb, t.n[t.nq - 1]);
        const uint16_t *pairs = t.staged ? (const uint16_t *)t.v + (long)j0 * t.ldk : vi;
        if (vi)
            values_interleave(&t, j0, j1, vi);
        for (int c0 = 0; c0 < hd;) {
            int left = (hd - c0) / 16, nc = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            for (int x0 = 0; x0 < t.nq; x0 += per)
                if (t.n[x0 + KWK_MIN(per, t.nq - x0) - 1] > j0) { /* else done and divided */
                    int nhx = KWK_MIN(per, t.nq - x0);
                    if (BF)
                        values_tile_bf_n(nhx, nc, &t, x0, (const uint16_t *)p, 2 * t.ldp, pairs,
                                         c0, j0, j1);
                    else
                        values_tile_n(nhx, nc, &t, x0, p, c0, j0, j1);
                }
            c0 += 16 * nc;
        }
    }
}

static void tile_run(const struct kwk_attn_args *a, int row0, int nr, int h0, int nh,
                     float *scratch)
{
    tile_go(0, a, row0, nr, h0, nh, scratch);
}

static void tile_run_bf(const struct kwk_attn_args *a, int row0, int nr, int h0, int nh,
                        float *scratch)
{
    tile_go(1, a, row0, nr, h0, nh, scratch);
}

static void tile_run_amx(const struct kwk_attn_args *a, int row0, int nr, int h0, int nh,
                         float *scratch)
{
    tile_go(2, a, row0, nr, h0, nh, scratch);
}

static void avx512_items(const struct kwk_attn_args *a, long i0, long i1, float *scratch)
{
    if (a->head_dim % 16 != 0) {
        /* Head sizes off the vector width are rare: the reference, for every item alike. */
        kwk_attn_ref.items(a, i0, i1, scratch);
        return;
    }
    kwk_attn_tiles(a, i0, i1, tile_run, scratch);
}

const struct kwk_attn_kernel kwk_attn_avx512 = {.name = "avx512", .items = avx512_items};

static void avx512_bf16_items(const struct kwk_attn_args *a, long i0, long i1, float *scratch)
{
    if (a->head_dim % 32 != 0) {
        avx512_items(a, i0, i1, scratch); /* the float tiles (or the reference), every item */
        return;
    }
    kwk_attn_tiles(a, i0, i1, tile_run_bf, scratch);
}

/* kwk_attn_kernel.stage_bf16: the rounding keys_bf and pair_rows do in each tile, done once
 * (half 2: values bf16 already, paired only; no keys). */
static void stage_bf16(int half, const void *k, const void *v, uint16_t *kb, uint16_t *vp, long p0,
                       long p1, int hd)
{
    for (long p = p0; p < p1; p += 2) {
        int two = p + 1 < p1;
        for (int u = 0; kb && u < 1 + two; u++)
            for (int e = 0; e < hd; e += 32)
                _mm512_storeu_si512(kb + (p + u) * hd + e,
                                    (__m512i)(half ? ld_bf(1, k, (p + u) * hd + e)
                                                   : ld_bf(0, k, (p + u) * hd + e)));
        for (int c = 0; c < hd; c += 16)
            _mm512_storeu_si512(vp + p * hd + 2 * c,
                                (__m512i)(half == 2 ? pair_rows(3, v, p * hd + c, hd, two)
                                          : half    ? pair_rows(1, v, p * hd + c, hd, two)
                                                    : pair_rows(0, v, p * hd + c, hd, two)));
    }
}

/* kwk_attn_kernel.half_to_bf16: ld_bf's (and pair_rows') rounding of a half cache's elements,
 * stored. */
static void half_to_bf16(uint16_t *dst, const uint16_t *src, long n)
{
    long i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            (__m256i)_mm512_cvtneps_pbh(ld_kv(1, src, i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i));
        _mm256_mask_storeu_epi16(dst + i, m, (__m256i)_mm512_cvtneps_pbh(x));
    }
}

/* Decode steps by whole kv groups where the weights are larger than the last-level cache: on an
 * AMD Zen 4 host (32 MiB L3), token by token, SmolLM2-135M int4 / balanced and 360M int4 at
 * 128-640 positions took 0.983-0.996 of the time a token with SmolLM2-135M's three groups as
 * 2 + 1 rather than 5 + 4 heads (1024-1152 positions: within noise). Where the model sits in the
 * cache (the Intel host's 300 MiB L3) the same split was 2-4% slower (docs/benchmarks.md,
 * sessions 36 and 39). Engaged by the cache's size as sysfs gives it (session 40), the split
 * took 1.6-3.7% off a 135M int4 token there; 360M within noise. */
const struct kwk_attn_kernel kwk_attn_avx512_bf16 = {.name = "avx512-bf16",
                                                     .items = avx512_bf16_items,
                                                     .stage_bf16 = stage_bf16,
                                                     .half_to_bf16 = half_to_bf16,
                                                     .whole_groups_past_llc = 32};

static void amx_bf16_items(const struct kwk_attn_args *a, long i0, long i1, float *scratch)
{
    if (a->head_dim % 32 != 0) {
        avx512_items(a, i0, i1, scratch); /* the float tiles (or the reference), every item */
        return;
    }
    kwk_attn_amx_begin();
    kwk_attn_tiles(a, i0, i1, tile_run_amx, scratch);
    kwk_attn_amx_end();
}

/* No stage_bf16: its tiles read bf16 caches (half_to_bf16) where they lie, values too, and
 * round a half cache's blocks as they go. Decode steps are shared by whole kv groups:
 * SmolLM2-135M's three groups on two threads as 2 + 1 groups rather than 5 + 4 heads (four
 * tiles, one group's keys and values read by both threads), which took 1-5% off a generated
 * token of SmolLM2-135M and 360M int4 (token by token; on the vector tables the same split was
 * 2-4% slower on that host, whose L3 holds these models: docs/benchmarks.md, session 36; past
 * the L3 the bf16 table asks for it too, above). On many threads the step still takes one
 * tile's time, on fewer threads (a group's tile costs what one head's does). Head sizes off 32
 * take the float tiles, whose cost follows their queries: single heads there (whole_groups 32). */
const struct kwk_attn_kernel kwk_attn_amx_bf16 = {.name = "amx-bf16",
                                                  .items = amx_bf16_items,
                                                  .half_to_bf16 = half_to_bf16,
                                                  .whole_groups = 32,
                                                  .span = AMX_SPAN,
                                                  .span_part = amx_span_part,
                                                  .span_merge = amx_span_merge};
