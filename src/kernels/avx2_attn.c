/* avx2_attn.c - attention with AVX2 + FMA (compiled with those flags only; chosen at run time by
 * kwk_attn_kernel). Pure functions; any thread. Agrees with attn_ref.c to float rounding.
 *
 * The same plan as avx512_attn.c with 8-lane vectors. Items are done in tiles: the query heads of
 * one kv group in up to 16 / heads neighbouring rows that read the same keys (a prompt chunk's
 * rows of one slot). Each block of 8 keys is read from memory once per tile; with 12 or more
 * queries their scores come out with the queries in vector lanes (FMAs and adds, then 8 x 8
 * transposes), else key by key through a transposed reduction; value rows are loaded once into
 * registers for up to 6 queries, over key ranges that stay in L1. Batch invariance: both score
 * paths give bitwise the same numbers (the same partial chains added in the same tree), and every
 * other operation on an item's numbers, and its order, depends only on the item (its q, its keys
 * and values, head_dim, its position count), never on which rows or heads share its loads. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "kernels/attn.h"
#include "kernels/avx2_exp.h"

#define INLINE static inline __attribute__((always_inline))

#define KB 8                       /* keys per score block: one ymm of scores */
#define MAXQ KWK_ATTN_TILE_QUERIES /* queries in a tile */
#define MAXH 6                     /* queries per value pass (accumulators stay in registers) */
#define LANES_MIN 12               /* queries from which a tile's scores put queries in lanes */

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

/* 8 cache elements from element i of base, widened to float when H (a half cache: F16C); H is
 * a constant after inlining, so each path has its own loops. */
INLINE __m256 ld_kv(int H, const void *base, long i)
{
    if (H)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)));
    return _mm256_loadu_ps((const float *)base + i);
}

/* Lane-wise partial dot products of q and the key at element k of the cache: lane l sums
 * elements l, l+8, ... in order. */
INLINE __m256 key_partial(int H, const float *q, const void *kc, long k, int hd)
{
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), ld_kv(H, kc, k));
#pragma GCC unroll 8
    for (int e = 8; e < hd; e += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), ld_kv(H, kc, k + e), acc);
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

/* The dot products of q with the keys at elements k, k + ldk, ... of the cache (nk of them,
 * 1..8; the rest read as zero), in key order. Every key's sum has the same tree whatever nk is:
 * lanes never mix keys. */
INLINE __m256 score_block(int H, const float *q, const void *kc, long k, long ldk, int hd, int nk)
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
            a[u] = j < nk ? key_partial(H, q, kc, k + j * ldk, hd) : _mm256_setzero_ps();
        }
        half[t] = fold4(a[0], a[1], a[2], a[3]);
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(half[0], half[1], 0x20),
                         _mm256_permute2f128_ps(half[0], half[1], 0x31));
}

/* ---- scores with queries in lanes ------------------------------------------------------------
 * The same numbers as score_block, computed the other way round for many queries at once: lane i
 * of a vector holds query 8g + i (qt = the queries transposed, qt[e * 16 + x] = q_x[e]) and one
 * key's elements are broadcast. Each of the 8 partial chains P_l (elements l, l + 8, ...) runs in
 * its own register in the same order as lane l of key_partial (a product, then FMAs), and the
 * chains are added in the tree of fold4 and score_block: ((P0 + P2) + (P1 + P3)) + ((P4 + P6) +
 * (P5 + P7)). Additions and products commute exactly, so every query's score of every key is
 * bitwise the one score_block gives, and a row may take either path. */

/* Chain P_l of 4 keys k[u] for 16 queries: acc[2u + g] lane i = sum over c of
 * q_{8g+i}[8c + l] * k_u[8c + l]. */
INLINE void lane_chain(const float *qt, const float *const *k, int hd, int l, __m256 *acc)
{
    __m256 q0 = _mm256_loadu_ps(qt + l * MAXQ), q1 = _mm256_loadu_ps(qt + l * MAXQ + 8);
#pragma GCC unroll 4
    for (int u = 0; u < 4; u++) {
        __m256 kv = _mm256_broadcast_ss(k[u] + l);
        acc[2 * u] = _mm256_mul_ps(kv, q0);
        acc[2 * u + 1] = _mm256_mul_ps(kv, q1);
    }
#pragma GCC unroll 16
    for (int e = l + 8; e < hd; e += 8) {
        q0 = _mm256_loadu_ps(qt + e * MAXQ);
        q1 = _mm256_loadu_ps(qt + e * MAXQ + 8);
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            __m256 kv = _mm256_broadcast_ss(k[u] + e);
            acc[2 * u] = _mm256_fmadd_ps(kv, q0, acc[2 * u]);
            acc[2 * u + 1] = _mm256_fmadd_ps(kv, q1, acc[2 * u + 1]);
        }
    }
}

/* Scaled scores of the 4 keys k[u] for the 16 queries of qt: out[2u + g] lane i = query 8g + i.
 * The chains wait in P (8 at a time fit the registers) until the tree adds them. */
INLINE void lane_keys4(const float *qt, const float *const *k, int hd, __m256 sv, __m256 *out)
{
    __m256 P[8][8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++) {
        /* Hides that qt is the same for every chain: else GCC loads all of it once into stack
         * slots instead of each row where it is used. */
        __asm__("" : "+r"(qt));
        lane_chain(qt, k, hd, l, P[l]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        __m256 s0 = _mm256_add_ps(_mm256_add_ps(P[0][i], P[2][i]), _mm256_add_ps(P[1][i], P[3][i]));
        __m256 s1 = _mm256_add_ps(_mm256_add_ps(P[4][i], P[6][i]), _mm256_add_ps(P[5][i], P[7][i]));
        out[i] = _mm256_mul_ps(_mm256_add_ps(s0, s1), sv);
    }
}

/* r[i] lane j <- r[j] lane i. */
INLINE void transpose8(__m256 *r)
{
    __m256 t[8], s[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
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
    const void *k, *v; /* position first, this kv head */
    const float *q[MAXQ];
    float *out[MAXQ];
    int n[MAXQ]; /* positions attended, >= 1, non-decreasing with x */
    float sums[MAXQ];
    __m256 mx[MAXQ]; /* lane-wise max of the query's stored scores, block by block in order */
};

/* Block [b, b + 8)'s scaled scores s (lane u: key b + u) into query x's row of p, and into its
 * max (so that the softmax need not read the row twice); the lanes past the query's n get -inf,
 * and a block wholly past it is not stored. */
INLINE void store_scores(struct tile *t, int x, int b, __m256 s, float *p)
{
    int left = t->n[x] - b;
    float *px = p + x * t->ldp + b;
    if (left <= 0)
        return;
    if (left < KB)
        s = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, lanes_below(left));
    _mm256_storeu_ps(px, s);
    t->mx[x] = _mm256_max_ps(t->mx[x], s);
}

/* Scores key by key for each query (score_block), block by block so that the block stays in L1
 * across the queries. H and hd are constants after inlining. */
INLINE void scores_hd(int H, struct tile *t, int hd, float *p)
{
    __m256 sv = _mm256_set1_ps(t->scale);
    int nmax = t->n[t->nq - 1];
    for (int b = 0; b < nmax; b += KB) {
        long kb = b * t->ldk;
        for (int x = 0; x < t->nq; x++) {
            int nk = KWK_MIN(KB, t->n[x] - b);
            if (nk > 0)
                store_scores(t, x, b,
                             _mm256_mul_ps(score_block(H, t->q[x], t->k, kb, t->ldk, hd, nk), sv),
                             p);
        }
    }
}

/* Keys [b, b + nk) of a half cache widened into kf[nk][hd] (exactly), for the paths that read a
 * key's elements one at a time. */
static void widen_keys(const struct tile *t, int b, int nk, float *kf)
{
    for (int u = 0; u < nk; u++)
        for (int e = 0; e < t->hd; e += 8)
            _mm256_storeu_ps(kf + (long)u * t->hd + e, ld_kv(1, t->k, (b + u) * t->ldk + e));
}

/* The same scores with the queries in lanes (lane_keys4): qt takes 16 * hd floats, then kf
 * 16 * hd for a block of keys widened from a half cache. Keys past the tile's last are not read
 * (their lanes repeat its last key and are dropped). */
INLINE void lane_scores_hd(struct tile *t, int hd, float *qt, float *p)
{
    float *kf = qt + MAXQ * hd;
    for (int e = 0; e < hd; e++)
        for (int x = 0; x < MAXQ; x++)
            qt[e * MAXQ + x] = x < t->nq ? t->q[x][e] : 0.0f;
    __m256 sv = _mm256_set1_ps(t->scale);
    int nmax = t->n[t->nq - 1];
    for (int b = 0; b < nmax; b += KB) {
        __m256 r[2 * KB], rg[KB];
        int nk = KWK_MIN(KB, nmax - b);
        if (t->half)
            widen_keys(t, b, nk, kf);
        for (int u0 = 0; u0 < KB; u0 += 4) {
            const float *k[4];
            for (int u = 0; u < 4; u++) {
                int j = KWK_MIN(u0 + u, nk - 1);
                k[u] = t->half ? kf + (long)j * hd : (const float *)t->k + (b + j) * t->ldk;
            }
            lane_keys4(qt, k, hd, sv, r + 2 * u0);
        }
        for (int g = 0; g < 2; g++) {
            for (int u = 0; u < KB; u++)
                rg[u] = r[2 * u + g];
            transpose8(rg);
            for (int i = 0; i < KB && 8 * g + i < t->nq; i++)
                store_scores(t, 8 * g + i, b, rg[i], p);
        }
    }
}

/* Scores of every query into p + x * ldp, by either path (the same numbers), the common head
 * sizes unrolled; scratch (32 * hd floats) for the queries in lanes. */
static void scores(struct tile *t, float *p, float *scratch)
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

/* p[0..n) = exp(p - max p) given mv (lane-wise maxima of p's blocks), padded to whole blocks
 * with zeros; returns their sum (block by block, in order). */
static float softmax_unnormalized(float *p, int n, __m256 mv)
{
    int npad = (n + KB - 1) / KB * KB;
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

/* Keys [j0, j1) of out_x[c0 + c] = sum_j p_x[j] v_j[c0 + c] / sums[x] for NH queries from x0 and
 * NC chunks of 8 columns: the accumulators stay in registers while the value rows stream past,
 * each chain in key order; between key ranges they wait in out (unscaled), and the last range
 * (j1 = the largest n) divides. Past its own n a query takes no key. NH and NC are constants
 * after inlining. */
INLINE void values_tile(int NH, int NC, int H, const struct tile *t, int x0, const float *p, int c0,
                        int j0, int j1)
{
    __m256 acc[MAXH][8];
    const void *v = t->v;
    long ldv = t->ldk, ldp = t->ldp;
    int nmin = KWK_MIN(t->n[x0], j1), nmax = t->n[x0 + NH - 1];
    p += x0 * ldp;
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            acc[g][c] =
                j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(t->out[x0 + g] + c0 + 8 * c);
    int j = j0;
    for (; j < nmin; j++) {
        __m256 vv[8];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            vv[c] = ld_kv(H, v, c0 + j * ldv + 8 * c);
#pragma GCC unroll 8
        for (int g = 0; g < NH; g++) {
            __m256 pj = _mm256_broadcast_ss(p + g * ldp + j);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[g][c] = _mm256_fmadd_ps(pj, vv[c], acc[g][c]);
        }
    }
    for (; j < KWK_MIN(j1, nmax); j++) {
#pragma GCC unroll 8
        for (int g = 0; g < NH; g++) {
            if (j >= t->n[x0 + g])
                continue;
            __m256 pj = _mm256_broadcast_ss(p + g * ldp + j);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[g][c] = _mm256_fmadd_ps(pj, ld_kv(H, v, c0 + j * ldv + 8 * c), acc[g][c]);
        }
    }
    int last = j1 >= nmax;
#pragma GCC unroll 8
    for (int g = 0; g < NH; g++) {
        __m256 sv = _mm256_set1_ps(t->sums[x0 + g]);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++)
            _mm256_storeu_ps(t->out[x0 + g] + c0 + 8 * c,
                             last ? _mm256_div_ps(acc[g][c], sv) : acc[g][c]);
    }
}

/* Chunks of 8 columns per value pass for nh queries with left chunks to go: at most 12
 * accumulators (the value chunks and a weight take the other registers). */
static int chunks_for(int nh, int left)
{
    int nc = nh == 1 ? 8 : nh <= 3 ? 4 : 2;
    while (nc > left)
        nc /= 2;
    return nc;
}

/* values_tile with its constants chosen: nh in 1..MAXH, nc = chunks_for(nh, ...), the cache's
 * type. */
static void values_tile_n(int nh, int nc, const struct tile *t, int x0, const float *p, int c0,
                          int j0, int j1)
{
#define VT(NH, NC)                                                                                 \
    case (NH) * 16 + (NC):                                                                         \
        if (t->half)                                                                               \
            values_tile(NH, NC, 1, t, x0, p, c0, j0, j1);                                          \
        else                                                                                       \
            values_tile(NH, NC, 0, t, x0, p, c0, j0, j1);                                          \
        return;
    switch (nh * 16 + nc) {
        /* clang-format off */
        VT(1, 1) VT(1, 2) VT(1, 4) VT(1, 8) VT(2, 1) VT(2, 2) VT(2, 4) VT(3, 1)
        VT(3, 2) VT(3, 4) VT(4, 1) VT(4, 2) VT(5, 1) VT(5, 2) VT(6, 1)
    default:
        break;
        /* clang-format on */
    }
#undef VT
    if (t->half)
        values_tile(6, 2, 1, t, x0, p, c0, j0, j1);
    else
        values_tile(6, 2, 0, t, x0, p, c0, j0, j1);
}

/* One tile (kwk_attn_tile_fn, attn.h): query heads h0 .. h0+nh-1 of one kv group over rows
 * row0 .. row0+nr-1, which read the same keys. */
static void tile_run(const struct kwk_attn_args *a, int row0, int nr, int h0, int nh,
                     float *scratch)
{
    int hd = a->head_dim, first = a->first[row0];
    size_t kv_off = (size_t)first * (size_t)a->ld_pos +
                    (size_t)(h0 / (a->n_heads / a->n_kv_heads)) * (size_t)a->ld_head;
    struct tile t = {
        .nq = nr * nh, .hd = hd, .ldk = a->ld_pos, .scale = a->scale, .half = a->kv_half};
    size_t esize = a->kv_half ? sizeof(uint16_t) : sizeof(float);
    t.k = (const char *)a->k_rows[row0] + kv_off * esize;
    t.v = (const char *)a->v_rows[row0] + kv_off * esize;
    for (int r = 0; r < nr; r++)
        for (int g = 0; g < nh; g++) {
            int x = r * nh + g, row = row0 + r;
            t.q[x] = a->q + row * a->ldq + (long)(h0 + g) * hd;
            t.out[x] = a->out + row * a->ldo + (long)(h0 + g) * hd;
            t.n[x] = a->last[row] - first + 1;
            t.mx[x] = _mm256_set1_ps(-INFINITY);
        }
    int nmax = t.n[t.nq - 1];
    t.ldp = (nmax + 15) / 16 * 16;          /* as kwk_attn_scratch_floats pads */
    float *p = scratch + (size_t)(MAXQ + 16) * hd; /* after the transposed queries, the keys */
    scores(&t, p, scratch);
    for (int x = 0; x < t.nq; x++)
        t.sums[x] = softmax_unnormalized(p + x * t.ldp, t.n[x], t.mx[x]);
    /* Passes of equal size (a small last pass costs nearly as much as a full one), over key
     * ranges of about 32 KB of values, which stay in L1 for all the passes and column chunks. */
    int passes = (t.nq + MAXH - 1) / MAXH, per = (t.nq + passes - 1) / passes;
    int jb = KWK_MAX(16, 8192 / hd);
    for (int j0 = 0; j0 < nmax; j0 += jb) {
        int j1 = KWK_MIN(j0 + jb, nmax);
        for (int c0 = 0; c0 < hd;) {
            int nc = chunks_for(per, (hd - c0) / 8);
            for (int x0 = 0; x0 < t.nq; x0 += per) {
                int nh = KWK_MIN(per, t.nq - x0);
                if (t.n[x0 + nh - 1] > j0) /* else done and divided */
                    values_tile_n(nh, nc, &t, x0, p, c0, j0, j1);
            }
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
    kwk_attn_tiles(a, i0, i1, tile_run, scratch);
}

const struct kwk_attn_kernel kwk_attn_avx2 = {.name = "avx2", .items = avx2_items};
