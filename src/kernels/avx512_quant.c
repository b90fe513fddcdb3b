/* avx512_quant.c - the int8, int4 and int6 matmul with AVX-512 VNNI (vpdpbusd): 16 interleaved
 * rows per register, activations quantized on the fly to 16 bits as two int8 halves, each with
 * its own accumulator (or to 8 bits, one pass, when kwk_mat.act8 says so); and packing's scale search, 16 rows at once. Pure functions; any thread.
 * Computes the integers of quant_ref.c exactly; float sums agree to rounding (fused
 * multiply-adds); packing gives quant_ref.c's bytes exactly. */
#include <immintrin.h>
#include <string.h>

#include "base/base.h"
#include "kernels/avx512_quant.h"
#include "kernels/quant.h"

#define INLINE static inline __attribute__((always_inline))

/* Row blocks x tokens of a register tile: prompt tiles are 2 x 4 (two int and one float
 * accumulator each: 24 registers, plus 2 weight registers, broadcasts folded into vpdpbusd's
 * memory operand), decode tiles 4 x 1 (eight independent vpdpbusd chains while the weights
 * stream; four with 8-bit activations). int4 and int6 hold two more weight registers, spilled
 * in part: 2 x 4 measured 6% (int4) and 5-9% (int6) faster than 2 x 3 (bench_kernels quant,
 * session 6); int8 2 x 5 and 2 x 6 slower than 2 x 4. */
#define TT 8 /* the most tokens a tile function is made for */
#define TT_Q8 4
#define TT_Q4 4
#define TT_Q6 4
/* 8-bit activations need no low-half accumulators: one int and one float accumulator a tile
 * entry. Measured on SmolLM2-135M's shapes (512 tokens, act8 / 16-bit time): int8 2 x 4, 2 x 6,
 * 2 x 7, 2 x 8 gave 1.8x, 1.9x, 2.0x, 2.1x; 2 x 8 holds 34 vectors, so the compiler keeps a few
 * float accumulators (touched once a group) in memory, which costs less than the shorter tile.
 * int4 2 x 3 .. 2 x 6 gave 1.7x .. 2.0x, and 2 x 8 4-5% more than 2 x 6 (bench_kernels quant,
 * session 6: the spilled float accumulators cost less than a fourth tile of a 24-token block);
 * int6, with two more constants, 2 x 8 7-10% more than 2 x 5. Those were an Intel host's
 * figures. On Zen 4 (session 10's AMD host) int8 4 x 4 measured 13-26% faster than 2 x 8 on
 * the same shapes (bench_kernels quant 512 1 avx512, 2 rounds: 323-334 against 259-284 GOP/s):
 * the same 32 accumulators, half the broadcasts a vpdpbusd; int4 4 x 4 measured alike (+2%)
 * and int6 4% slower, 4 x 3 and 4 x 6 slower for all three. int8 with 8-bit activations takes
 * 4 x 4 (not measured on the Intel host); the others keep 2 rows. */
#define TR8_Q8 4
#define TT8_Q8 4
#define TT8_Q4 8
#define TT8_Q6 8

/* The G (<= 32) values of x from k0 (zeros past n) into v, and their largest magnitude. */
INLINE float load_group(const float *x, int64_t n, int64_t k0, int G, __m512 *v)
{
    __m512 mx = _mm512_setzero_ps();
    for (int p = 0; p < G / 16; p++) {
        v[p] = _mm512_maskz_loadu_ps(lanes(n - k0 - 16 * p), x + k0 + 16 * p);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v[p]));
    }
    return _mm512_reduce_max_ps(mx);
}

/* kwk_quant_act, vectorized with the same arithmetic: |x| max, 127 / amax, f = x * id rounded
 * to nearest even by cvtps2dq, to h and (times 254) to v (|f| <= 127, so the scalar clamps
 * never change a value). */
/* 16 values f = x * 127 / amax to h and the low halves l of v = 254 h + l (stored), v added
 * to sum: kwk_quant_act's rounding (|f| <= 127, so its clamps never change a value). */
INLINE __m512i halves16(__m512 f, int8_t *xh, int8_t *xl, __m512i sum)
{
    __m512i h = _mm512_cvtps_epi32(f),
            q = _mm512_cvtps_epi32(_mm512_mul_ps(f, _mm512_set1_ps(254.0f)));
    __m512i l = _mm512_sub_epi32(q, _mm512_mullo_epi32(h, _mm512_set1_epi32(254)));
    _mm_storeu_si128((__m128i *)xh, _mm512_cvtsepi32_epi8(h));
    _mm_storeu_si128((__m128i *)xl, _mm512_cvtsepi32_epi8(l));
    return _mm512_add_epi32(sum, q);
}

static void quant_act_16(const float *x, int8_t *xh, int8_t *xl, float *xd, int32_t *xs);

static void quant_act(const float *x, int64_t n, int G, int8_t *xh, int8_t *xl, float *xd,
                      int32_t *xs)
{
    int64_t ng = (n + G - 1) / G, g = 0;
    if (G == 32)
        for (; (g + 16) * 32 <= n; g += 16)
            quant_act_16(x + g * 32, xh + g * 32, xl + g * 32, xd + g, xs + g);
    for (; g < ng; g++) {
        int64_t k0 = g * G;
        __m512 v[KWK_Q4_GROUP / 16]; /* both groups are 32 */
        float amax = load_group(x, n, k0, G, v);
        __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512i sum = _mm512_setzero_si512();
        for (int p = 0; p < G / 16; p++)
            sum = halves16(_mm512_mul_ps(v[p], id), xh + k0 + 16 * p, xl + k0 + 16 * p, sum);
        xd[g] = amax / (float)KWK_QX_SCALE;
        xs[g] = _mm512_reduce_add_epi32(sum);
    }
}

/* quant_act with 8-bit activations: h only, as kwk_quant_act rounds it (quant.h), and the
 * epilogue's per-group numbers: xd254 = 254 * d_x (the factor of v = 254 h folded into the
 * scale), xs = sum(h) (the tiles subtract the offset of unsigned weights times it: 128 for
 * int8, 32 for int6), xm = d_x * (float)(254 * sum(h)) (int4's offset term, rounded as
 * quant_ref.c rounds d_x * xs). */
/* One level of a transposed reduction of 2w vectors to w: a and b (vectors i and i + w) are
 * split into the halves (w = 8), quarters (4), pairs (2) or lanes (1) that lo and hi take, so
 * that op(lo, hi) holds a's partial results in some lanes and b's in the others. */
INLINE void split16(__m512 a, __m512 b, int w, __m512 *lo, __m512 *hi)
{
    if (w == 8) {
        *lo = _mm512_shuffle_f32x4(a, b, 0x44);
        *hi = _mm512_shuffle_f32x4(a, b, 0xee);
    } else if (w == 4) {
        *lo = _mm512_shuffle_f32x4(a, b, 0x88);
        *hi = _mm512_shuffle_f32x4(a, b, 0xdd);
    } else if (w == 2) {
        *lo = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
        *hi = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    } else {
        *lo = _mm512_shuffle_ps(a, b, 0x88);
        *hi = _mm512_shuffle_ps(a, b, 0xdd);
    }
}

/* The tree puts vector k's result in lane FOLD_LANE[k] (an involution): feeding group FOLD_LANE[k]
 * as vector k gives group g's result in lane g. */
static const int FOLD_LANE[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

/* Lane g: the largest lane of m[g] (max is exact in any order). 45 operations for 16 vectors
 * where one horizontal reduction each takes about 8. */
INLINE __m512 fold16_max(__m512 *m)
{
#pragma GCC unroll 4
    for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
        for (int i = 0; i < w; i++) {
            __m512 lo, hi;
            split16(m[i], m[i + w], w, &lo, &hi);
            m[i] = _mm512_max_ps(lo, hi);
        }
    return m[0];
}

/* The same with integer sums (exact in any order). */
INLINE __m512i fold16_add(__m512i *s)
{
#pragma GCC unroll 4
    for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
        for (int i = 0; i < w; i++) {
            __m512 lo, hi;
            split16(_mm512_castsi512_ps(s[i]), _mm512_castsi512_ps(s[i + w]), w, &lo, &hi);
            s[i] = _mm512_add_epi32(_mm512_castps_si512(lo), _mm512_castps_si512(hi));
        }
    return s[0];
}

/* The largest magnitude of each of 16 groups of 32 (lane g: group g) and 127 / it (0 for an
 * all-zero group) into id[g], as load_group and quant_act compute them. */
INLINE __m512 amax16(const float *x, float *id)
{
    __m512 m[16];
    for (int k = 0; k < 16; k++) {
        const float *xg = x + 32 * FOLD_LANE[k];
        m[k] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xg)),
                             _mm512_abs_ps(_mm512_loadu_ps(xg + 16)));
    }
    __m512 amax = fold16_max(m);
    __mmask16 pos = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ);
    _mm512_storeu_ps(id, _mm512_maskz_div_ps(pos, _mm512_set1_ps(127.0f), amax));
    return amax;
}

/* quant_act8 of 16 whole groups of 32 (512 values of x), the per-group reductions done 16 at a
 * time: the same numbers (max and integer sums are exact; 127 / amax, amax / KWK_QX_SCALE and
 * the epilogue's products are the same IEEE operations lane by lane). */
static void quant_act8_16(const float *x, int8_t *xh, float *xd254, int32_t *xs, float *xm)
{
    float id[16];
    __m512 amax = amax16(x, id);
    __m512i sums[16];
    for (int k = 0; k < 16; k++) {
        int g = FOLD_LANE[k];
        __m512 idv = _mm512_set1_ps(id[g]);
        __m512i h0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * g), idv));
        __m512i h1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * g + 16), idv));
        _mm_storeu_si128((__m128i *)(xh + 32 * g), _mm512_cvtsepi32_epi8(h0));
        _mm_storeu_si128((__m128i *)(xh + 32 * g + 16), _mm512_cvtsepi32_epi8(h1));
        sums[k] = _mm512_add_epi32(h0, h1);
    }
    __m512i hs = fold16_add(sums);
    __m512 d = _mm512_div_ps(amax, _mm512_set1_ps((float)KWK_QX_SCALE));
    _mm512_storeu_ps(xd254, _mm512_mul_ps(_mm512_set1_ps(254.0f), d));
    _mm512_storeu_si512(xs, hs);
    _mm512_storeu_ps(
        xm, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_mullo_epi32(_mm512_set1_epi32(254), hs))));
}

/* quant_act of 16 whole groups of 32, the reductions 16 at a time as quant_act8_16. */
static void quant_act_16(const float *x, int8_t *xh, int8_t *xl, float *xd, int32_t *xs)
{
    float id[16];
    __m512 amax = amax16(x, id);
    __m512i sums[16];
    for (int k = 0; k < 16; k++) {
        int g = FOLD_LANE[k];
        __m512 idv = _mm512_set1_ps(id[g]);
        __m512i sum = _mm512_setzero_si512();
        for (int p = 0; p < 2; p++)
            sum = halves16(_mm512_mul_ps(_mm512_loadu_ps(x + 32 * g + 16 * p), idv),
                           xh + 32 * g + 16 * p, xl + 32 * g + 16 * p, sum);
        sums[k] = sum;
    }
    _mm512_storeu_ps(xd, _mm512_div_ps(amax, _mm512_set1_ps((float)KWK_QX_SCALE)));
    _mm512_storeu_si512(xs, fold16_add(sums));
}

static void quant_act8(const float *x, int64_t n, int G, int8_t *xh, float *xd254, int32_t *xs,
                       float *xm)
{
    int64_t ng = (n + G - 1) / G, g = 0;
    if (G == 32)
        for (; (g + 16) * 32 <= n; g += 16)
            quant_act8_16(x + g * 32, xh + g * 32, xd254 + g, xs + g, xm + g);
    for (; g < ng; g++) {
        int64_t k0 = g * G;
        __m512 v[KWK_Q4_GROUP / 16]; /* both groups are 32 */
        float amax = load_group(x, n, k0, G, v);
        __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m512i sum = _mm512_setzero_si512();
        for (int p = 0; p < G / 16; p++) {
            __m512i h = _mm512_cvtps_epi32(_mm512_mul_ps(v[p], id));
            sum = _mm512_add_epi32(sum, h);
            _mm_storeu_si128((__m128i *)(xh + k0 + 16 * p), _mm512_cvtsepi32_epi8(h));
        }
        float d = amax / (float)KWK_QX_SCALE;
        int32_t hs = _mm512_reduce_add_epi32(sum);
        xd254[g] = 254.0f * d;
        xs[g] = hs;
        xm[g] = d * (float)(254 * hs);
    }
}

INLINE __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Arguments shared by the tiles: the row blocks' first blocks of the pass, the quantized
 * activations of tokens [t, t+T) of the block, and where the results go. */
struct tile_args {
    const void *blk[4]; /* per row block: its block of group g0 */
    struct kwk_qact x;  /* the token block's activations, from the pass's first column (group) */
    int t;              /* first token of the tile within the token block */
    int ng;             /* groups in the pass */
    float *y;           /* token t's output row */
    long ldy;
    int64_t rb, r0, r1;
    int first;
    size_t next; /* decode: bytes from a row block to the next tile's (0: no next tile) */
    int pf;      /* decode: prefetch at all (not int8 on Zen 5: kwk_cpu_prefetch_int8) */
    int pf_l2;   /* decode: prefetch into L2 rather than L1 (kwk_prefetch) */
};

/* Decode tiles (one token) are bound by memory, and read R row blocks side by side: R streams
 * that the hardware prefetcher does not run far enough ahead of (SmolLM2-1.7B int4 generation:
 * the tiles streamed at ~58% of bw_probe). So each tile asks for its blocks' group g +
 * PF_GROUPS (about 1.3-1.7 KB a stream ahead) while it computes group g: +15% tokens/s there
 * (2 to 6 groups ahead measured alike; an Intel Xeon host). Into L1 or L2 as the CPU wants
 * (kwk_cpu_prefetch_l2): on Zen 4 the same requests into L2 instead of L1 made generation
 * 30-38% faster, and 8 groups ahead measured as 4. On Zen 5 the int8 tile runs faster with
 * none at all (a->pf). Prompt tiles are bound by arithmetic and skip it. */
#define PF_GROUPS 4

INLINE void prefetch_ahead(const struct tile_args *a, int R, int g, size_t block)
{
    /* and group g of the next tile's blocks, a tile ahead (as avx2_quant.c, where one stream
     * a tile gained 28-45%): SmolLM2-135M, whose rows of 18 and 48 groups leave the 4 groups'
     * lead little room, +3-10% balanced and +10-16% int4 generation; 360M, Qwen2.5-0.5B and
     * 1.7B within noise (5 interleaved rounds each). That also covers the next tile's first
     * groups, which the lead reaches near the end of the row. */
    if (!a->pf)
        return;
    for (int i = 0; i < R; i++) {
        const char *b = (const char *)a->blk[i];
        if (a->next)
            kwk_prefetch_bytes(b + a->next + (size_t)g * block, block, a->pf_l2);
        if (g + PF_GROUPS < a->ng)
            kwk_prefetch_bytes(b + (size_t)(g + PF_GROUPS) * block, block, a->pf_l2);
    }
}

/* Token t + j of a tile: its high and low halves from the pass's first column, and its numbers of
 * group g of the pass. */
#define XH(a, j) ((a)->x.h + (long)((a)->t + (j)) * (a)->x.ldh)
#define XL(a, j) ((a)->x.l + (long)((a)->t + (j)) * (a)->x.ldh)
#define XD(a, j, g) ((a)->x.d[(long)((a)->t + (j)) * (a)->x.ldg + (g)])
#define XS(a, j, g) ((a)->x.s[(long)((a)->t + (j)) * (a)->x.ldg + (g)])
#define XM(a, j, g) ((a)->x.m[(long)((a)->t + (j)) * (a)->x.ldg + (g)])

INLINE void tile_q8(const struct tile_args *a, int R, int T)
{
    __m512 facc[4][TT];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < T; j++)
            facc[i][j] = _mm512_setzero_ps();
    const struct kwk_q8_block *b[4];
    for (int i = 0; i < R; i++)
        b[i] = a->blk[i];
    const __m512i c254 = _mm512_set1_epi32(254);
    for (int g = 0; g < a->ng; g++) {
        /* the weights were stored as w + 128: the low sums start at -128 * sum(v) to take it
         * back out, so v below needs no subtraction; |254 * acc| and 128 * |sum(v)| stay below
         * 2^31 (32 * 255 * 127 * 254, 128 * 32 * KWK_QX_SCALE) */
        __m512i acc[4][TT], accl[4][TT];
        for (int j = 0; j < T; j++) {
            __m512i corr = _mm512_set1_epi32(-128 * XS(a, j, g));
            for (int i = 0; i < R; i++) {
                acc[i][j] = _mm512_setzero_si512();
                accl[i][j] = corr;
            }
        }
        if (T == 1)
            prefetch_ahead(a, R, g, sizeof(struct kwk_q8_block));
        for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++) {
            __m512i wv[4];
            for (int i = 0; i < R; i++)
                wv[i] = _mm512_loadu_si512(b[i][g].q[k4]);
            for (int j = 0; j < T; j++) {
                int64_t k = g * KWK_Q8_GROUP + k4 * 4;
                __m512i xh = bcast4(XH(a, j) + k), xl = bcast4(XL(a, j) + k);
                for (int i = 0; i < R; i++) {
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[i], xh);
                    accl[i][j] = _mm512_dpbusd_epi32(accl[i][j], wv[i], xl);
                }
            }
        }
        for (int j = 0; j < T; j++) {
            __m512 dx = _mm512_set1_ps(XD(a, j, g));
            for (int i = 0; i < R; i++) {
                __m512i v = _mm512_add_epi32(_mm512_mullo_epi32(acc[i][j], c254), accl[i][j]);
                __m512 s = _mm512_cvtepi32_ps(v);
                __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b[i][g].d));
                __m512 dd = _mm512_mul_ps(dw, dx);
                facc[i][j] = _mm512_fmadd_ps(s, dd, facc[i][j]);
            }
        }
    }
    for (int j = 0; j < T; j++)
        for (int i = 0; i < R; i++)
            put(a->y + (int64_t)j * a->ldy, a->rb + i, a->r0, a->r1, facc[i][j], a->first);
}

/* int4 and int6 (q6) share the nibble loop. int4: w = d q + m, so y adds m * d_x * sum(v).
 * int6: the stored q + 32 are unsigned like int8's q + 128, and 32 * sum(v) comes back out
 * (|254 * acc| <= 32 * 63 * 127 * 254). */
INLINE void tile_nib(const struct tile_args *a, int q6, int R, int T)
{
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    __m512 facc[4][TT];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < T; j++)
            facc[i][j] = _mm512_setzero_ps();
    const __m512i c254 = _mm512_set1_epi32(254);
    for (int g = 0; g < a->ng; g++) {
        __m512i acc[4][TT], accl[4][TT];
        for (int i = 0; i < R; i++)
            for (int j = 0; j < T; j++)
                acc[i][j] = accl[i][j] = _mm512_setzero_si512();
        if (T == 1)
            prefetch_ahead(a, R, g, q6 ? sizeof(struct kwk_q6_block) : sizeof(struct kwk_q4_block));
        for (int c = 0; c < KWK_Q4_GROUP / 8; c++) {
            __m512i lo[4], hi[4];
            for (int i = 0; i < R; i++)
                nib_unpack(a->blk[i], q6, g, c, m4, m30, &lo[i], &hi[i]);
            for (int j = 0; j < T; j++) {
                int64_t k = g * KWK_Q4_GROUP + 8 * c;
                const int8_t *ph = XH(a, j) + k, *pl = XL(a, j) + k;
                __m512i h0 = bcast4(ph), h1 = bcast4(ph + 4), l0 = bcast4(pl), l1 = bcast4(pl + 4);
                for (int i = 0; i < R; i++) {
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], lo[i], h0);
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], hi[i], h1);
                    accl[i][j] = _mm512_dpbusd_epi32(accl[i][j], lo[i], l0);
                    accl[i][j] = _mm512_dpbusd_epi32(accl[i][j], hi[i], l1);
                }
            }
        }
        for (int j = 0; j < T; j++) {
            float xd = XD(a, j, g);
            __m512 dx = _mm512_set1_ps(xd);
            __m512 dsx = _mm512_set1_ps(xd * (float)XS(a, j, g));
            __m512i corr = _mm512_set1_epi32(32 * XS(a, j, g));
            for (int i = 0; i < R; i++) {
                const uint16_t *bd = q6 ? ((const struct kwk_q6_block *)a->blk[i])[g].d
                                        : ((const struct kwk_q4_block *)a->blk[i])[g].d;
                __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)bd));
                __m512i v = _mm512_add_epi32(_mm512_mullo_epi32(acc[i][j], c254), accl[i][j]);
                if (q6) {
                    __m512 s = _mm512_cvtepi32_ps(_mm512_sub_epi32(v, corr));
                    facc[i][j] = _mm512_fmadd_ps(s, _mm512_mul_ps(d, dx), facc[i][j]);
                } else {
                    const struct kwk_q4_block *b = (const struct kwk_q4_block *)a->blk[i] + g;
                    __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b->m));
                    __m512 s = _mm512_cvtepi32_ps(v);
                    facc[i][j] = _mm512_fmadd_ps(s, _mm512_mul_ps(d, dx), facc[i][j]);
                    facc[i][j] = _mm512_fmadd_ps(m, dsx, facc[i][j]);
                }
            }
        }
    }
    for (int j = 0; j < T; j++)
        for (int i = 0; i < R; i++)
            put(a->y + (int64_t)j * a->ldy, a->rb + i, a->r0, a->r1, facc[i][j], a->first);
}

INLINE void tile_q4(const struct tile_args *a, int R, int T) { tile_nib(a, 0, R, T); }
INLINE void tile_q6(const struct tile_args *a, int R, int T) { tile_nib(a, 1, R, T); }

/* ---- 8-bit activations: one pass ---------------------------------------------------------------
 * The tiles above without the low halves: one vpdpbusd per weight vector and token, and an
 * epilogue of (float)isum_h * (d_w * 254 d_x) with the weight scales converted once a group (not
 * once a token). The integers are those of the h pass above, exactly. Decode tiles (4 x 1) gain
 * less (1.1-1.4x measured on these shapes): one 64-byte weight load a vpdpbusd is their limit,
 * and splitting each sum over two accumulators for more independent chains measured no better. */

INLINE void tile8_q8(const struct tile_args *a, int R, int T)
{
    __m512 facc[4][TT];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < T; j++)
            facc[i][j] = _mm512_setzero_ps();
    const struct kwk_q8_block *b[4];
    for (int i = 0; i < R; i++)
        b[i] = a->blk[i];
    for (int g = 0; g < a->ng; g++) {
        /* weights stored as w + 128: the sums start at -128 * sum(h), which takes it back out
         * (|acc| <= 32 * 255 * 127) */
        __m512i acc[4][TT];
        for (int j = 0; j < T; j++) {
            __m512i corr = _mm512_set1_epi32(-128 * XS(a, j, g));
            for (int i = 0; i < R; i++)
                acc[i][j] = corr;
        }
        if (T == 1)
            prefetch_ahead(a, R, g, sizeof(struct kwk_q8_block));
        for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++) {
            __m512i wv[4];
            for (int i = 0; i < R; i++)
                wv[i] = _mm512_loadu_si512(b[i][g].q[k4]);
            for (int j = 0; j < T; j++) {
                __m512i xh = bcast4(XH(a, j) + g * KWK_Q8_GROUP + k4 * 4);
                for (int i = 0; i < R; i++)
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[i], xh);
            }
        }
        __m512 dw[4];
        for (int i = 0; i < R; i++)
            dw[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)b[i][g].d));
        for (int j = 0; j < T; j++) {
            __m512 dx = _mm512_set1_ps(XD(a, j, g));
            for (int i = 0; i < R; i++) {
                __m512 s = _mm512_cvtepi32_ps(acc[i][j]);
                facc[i][j] = _mm512_fmadd_ps(s, _mm512_mul_ps(dw[i], dx), facc[i][j]);
            }
        }
    }
    for (int j = 0; j < T; j++)
        for (int i = 0; i < R; i++)
            put(a->y + (int64_t)j * a->ldy, a->rb + i, a->r0, a->r1, facc[i][j], a->first);
}

/* int4 and int6 (q6) with 8-bit activations: the nibble loop of tile_nib, one pass. */
INLINE void tile8_nib(const struct tile_args *a, int q6, int R, int T)
{
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    __m512 facc[4][TT];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < T; j++)
            facc[i][j] = _mm512_setzero_ps();
    for (int g = 0; g < a->ng; g++) {
        /* int6: the sums start at -32 * sum(h) (see tile8_q8) */
        __m512i acc[4][TT];
        for (int j = 0; j < T; j++) {
            __m512i corr = _mm512_set1_epi32(q6 ? -32 * XS(a, j, g) : 0);
            for (int i = 0; i < R; i++)
                acc[i][j] = corr;
        }
        if (T == 1)
            prefetch_ahead(a, R, g, q6 ? sizeof(struct kwk_q6_block) : sizeof(struct kwk_q4_block));
        for (int c = 0; c < KWK_Q4_GROUP / 8; c++) {
            __m512i lo[4], hi[4];
            for (int i = 0; i < R; i++)
                nib_unpack(a->blk[i], q6, g, c, m4, m30, &lo[i], &hi[i]);
            for (int j = 0; j < T; j++) {
                const int8_t *ph = XH(a, j) + g * KWK_Q4_GROUP + 8 * c;
                __m512i h0 = bcast4(ph), h1 = bcast4(ph + 4);
                for (int i = 0; i < R; i++) {
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], lo[i], h0);
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], hi[i], h1);
                }
            }
        }
        __m512 d[4], m[4];
        for (int i = 0; i < R; i++) {
            const uint16_t *bd = q6 ? ((const struct kwk_q6_block *)a->blk[i])[g].d
                                    : ((const struct kwk_q4_block *)a->blk[i])[g].d;
            d[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)bd));
            if (!q6)
                m[i] = _mm512_cvtph_ps(_mm256_loadu_si256(
                    (const __m256i *)((const struct kwk_q4_block *)a->blk[i])[g].m));
        }
        for (int j = 0; j < T; j++) {
            __m512 dx = _mm512_set1_ps(XD(a, j, g));
            __m512 dsx = _mm512_set1_ps(XM(a, j, g));
            for (int i = 0; i < R; i++) {
                if (q6) {
                    __m512 s = _mm512_cvtepi32_ps(acc[i][j]);
                    facc[i][j] = _mm512_fmadd_ps(s, _mm512_mul_ps(d[i], dx), facc[i][j]);
                } else {
                    __m512 s = _mm512_cvtepi32_ps(acc[i][j]);
                    facc[i][j] = _mm512_fmadd_ps(s, _mm512_mul_ps(d[i], dx), facc[i][j]);
                    facc[i][j] = _mm512_fmadd_ps(m[i], dsx, facc[i][j]);
                }
            }
        }
    }
    for (int j = 0; j < T; j++)
        for (int i = 0; i < R; i++)
            put(a->y + (int64_t)j * a->ldy, a->rb + i, a->r0, a->r1, facc[i][j], a->first);
}

INLINE void tile8_q4(const struct tile_args *a, int R, int T) { tile8_nib(a, 0, R, T); }
INLINE void tile8_q6(const struct tile_args *a, int R, int T) { tile8_nib(a, 1, R, T); }

/* One function per (format, R, T) used, so every loop bound is a constant and the accumulators
 * stay in registers. */
typedef void (*tile_fn)(const struct tile_args *);
#define TILE(F, R, T)                                                                            \
    static void F##_##R##_##T(const struct tile_args *a) { F(a, R, T); }
#define TILES(F)                                                                                   \
    TILE(F, 4, 1)                                                                                  \
    TILE(F, 4, 2) TILE(F, 4, 3) TILE(F, 4, 4) TILE(F, 2, 1) TILE(F, 2, 2) TILE(F, 2, 3)            \
        TILE(F, 2, 4) TILE(F, 2, 5) TILE(F, 2, 6) TILE(F, 2, 7) TILE(F, 2, 8) TILE(F, 1, 1) TILE(  \
            F, 1, 2) TILE(F, 1, 3) TILE(F, 1, 4) TILE(F, 1, 5) TILE(F, 1, 6) TILE(F, 1, 7)         \
            TILE(F, 1, 8) static const tile_fn tiles_##F[3][TT + 1] = {                            \
                {NULL, F##_1_1, F##_1_2, F##_1_3, F##_1_4, F##_1_5, F##_1_6, F##_1_7, F##_1_8},    \
                {NULL, F##_2_1, F##_2_2, F##_2_3, F##_2_4, F##_2_5, F##_2_6, F##_2_7, F##_2_8},    \
                {NULL, F##_4_1, F##_4_2, F##_4_3, F##_4_4},                                        \
    };

TILES(tile_q8)
TILES(tile_q4)
TILES(tile_q6)
TILES(tile8_q8)
TILES(tile8_q4)
TILES(tile8_q6)

/* The weights' side of a product: tile functions, block size and tile width of w's format. */
struct fmt {
    const tile_fn (*tiles)[TT + 1];
    int tt; /* prompt tiles' tokens */
    size_t bsz;
    int tr; /* prompt tiles' row blocks: 2 or 4 */
};

static struct fmt fmt_of(const struct kwk_mat *w)
{
    int a8 = w->act8 != 0;
    if (w->wtype == KWK_W_Q8)
        return (struct fmt){a8 ? tiles_tile8_q8 : tiles_tile_q8, a8 ? TT8_Q8 : TT_Q8,
                            sizeof(struct kwk_q8_block), a8 ? TR8_Q8 : 2};
    if (w->wtype == KWK_W_Q6)
        return (struct fmt){a8 ? tiles_tile8_q6 : tiles_tile_q6, a8 ? TT8_Q6 : TT_Q6,
                            sizeof(struct kwk_q6_block), 2};
    /* int4 and int6 need two more registers a row block (both nibble halves): fewer tokens a
     * tile */
    return (struct fmt){a8 ? tiles_tile8_q4 : tiles_tile_q4, a8 ? TT8_Q4 : TT_Q4,
                        sizeof(struct kwk_q4_block), 2};
}

/* Column pass [g0, g1) of nt tokens whose quantized activations x starts at (the view's row 0
 * is the block's first token, its column 0 the pass's first): every row block of [r0, r1), in
 * tiles; y is the first token's output row. With amx, whole tiles of KWK_AMX_TOKS tokens go to
 * AMX (the same numbers) and the rest to the tiles below. */
static void run_pass(const struct kwk_mat *w, const struct fmt *f, const struct kwk_qact *x, int nt,
                     int64_t g0, int64_t g1, float *y, long ldy, int64_t r0, int64_t r1, int amx)
{
    int t0 = amx ? nt / KWK_AMX_TOKS * KWK_AMX_TOKS : 0;
    if (t0 > 0)
        kwk_quant_pass_amx(w, x, t0, g0, g1, y, ldy, r0, r1);
    if (t0 == nt)
        return;
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols);
    int64_t rb0 = r0 / KWK_QROWS, rb1 = (r1 + KWK_QROWS - 1) / KWK_QROWS;
    struct tile_args a = {
        .x = *x, .ng = (int)(g1 - g0), .ldy = ldy, .r0 = r0, .r1 = r1, .first = g0 == 0};
    a.pf = nt == 1 && (w->wtype != KWK_W_Q8 || kwk_cpu_prefetch_int8(KWK_ISA_AVX512));
    a.pf_l2 = nt == 1 && kwk_mat_prefetch_l2(w);
    for (int64_t rb = rb0; rb < rb1;) {
        int R = (nt == 1 || f->tr == 4) && rb + 4 <= rb1 ? 4 : rb + 2 <= rb1 ? 2 : 1;
        for (int i = 0; i < R; i++)
            a.blk[i] = (const uint8_t *)w->data + ((rb + i) * ng + g0) * f->bsz;
        a.rb = rb;
        a.next = nt == 1 && rb + 2 * R <= rb1 ? (size_t)(R * ng) * f->bsz : 0;
        for (int t = t0; t < nt; t += f->tt) {
            int T = KWK_MIN(f->tt, nt - t);
            a.t = t;
            a.y = y + (int64_t)t * ldy;
            f->tiles[R == 4 ? 2 : R - 1][T](&a);
        }
        rb += R;
    }
}

/* Token blocks of KWK_QX_TOKS, each quantized one column pass at a time into a stack buffer. */
static void matmul_vnni(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                        int64_t r0, int64_t r1, int amx)
{
    struct kwk_qx qx;
    struct fmt f = fmt_of(w);
    int G = kwk_quant_group(w->wtype), a8 = w->act8 != 0;
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), gc = KWK_QX_COLS / G;
    struct kwk_qact view = kwk_qx_view(&qx, w->cols, a8);
    for (int tb = 0; tb < n_tok; tb += KWK_QX_TOKS) {
        int nt = KWK_MIN(KWK_QX_TOKS, n_tok - tb);
        for (int64_t g0 = 0; g0 < ng; g0 += gc) {
            int64_t g1 = KWK_MIN(ng, g0 + gc);
            int64_t k0 = g0 * G, nk = KWK_MIN(w->cols, g1 * G) - k0;
            for (int j = 0; j < nt; j++) {
                const float *xt = x + (int64_t)(tb + j) * w->cols + k0;
                if (a8)
                    quant_act8(xt, nk, G, qx.q[j], qx.d[j], qx.s[j], qx.m[j]);
                else
                    quant_act(xt, nk, G, qx.q[j], qx.l[j], qx.d[j], qx.s[j]);
            }
            run_pass(w, &f, &view, nt, g0, g1, y + (int64_t)tb * ldy, ldy, r0, r1, amx);
        }
    }
}

/* Tokens a block of matmul_q_vnni when AMX takes the prompt tiles: each row block's weights are
 * staged once a pass for all of the block's 16-token tiles, and the block's activations (128
 * tokens x 2 KiB of a pass) stay in L2 while every row block reads them. */
#define AMX_BLOCK_TOKS 128

/* The same token blocks and passes over activations quantized beforehand. */
static void matmul_q_vnni(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok, float *y,
                          long ldy, int64_t r0, int64_t r1, int amx)
{
    struct fmt f = fmt_of(w);
    int G = kwk_quant_group(w->wtype);
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), gc = KWK_QX_COLS / G;
    int block = amx && n_tok >= KWK_AMX_TOKS ? AMX_BLOCK_TOKS : KWK_QX_TOKS;
    for (int tb = 0; tb < n_tok; tb += block) {
        int nt = KWK_MIN(block, n_tok - tb);
        for (int64_t g0 = 0; g0 < ng; g0 += gc) {
            int64_t g1 = KWK_MIN(ng, g0 + gc);
            struct kwk_qact view = kwk_qact_at(qa, tb, g0);
            run_pass(w, &f, &view, nt, g0, g1, y + (int64_t)tb * ldy, ldy, r0, r1, amx);
        }
    }
}

void kwk_quant_matmul_avx512_amx(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                                 long ldy, int64_t r0, int64_t r1, int amx)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
    /* vpdpbusd is AVX512_VNNI, which some AVX-512 CPUs (Skylake-X) lack */
    if (!__builtin_cpu_supports("avx512vnni")) {
        kwk_quant_matmul_avx2(w, x, n_tok, y, ldy, r0, r1);
        return;
    }
    matmul_vnni(w, x, n_tok, y, ldy, r0, r1, amx && kwk_cpu_amx());
}

void kwk_quant_matmul_avx512(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                             long ldy, int64_t r0, int64_t r1)
{
    kwk_quant_matmul_avx512_amx(w, x, n_tok, y, ldy, r0, r1, 1);
}

/* The rows' quantization is the AVX2 kernel's, number for number, so either matmul_q reads it. */
void kwk_quant_rows_avx512(const float *x, const struct kwk_qact *qa, int t0, int t1)
{
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (int64_t)t * qa->cols;
        long oh = (long)t * qa->ldh, og = (long)t * qa->ldg;
        if (qa->act8)
            quant_act8(xt, qa->cols, KWK_QACT_GROUP, qa->h + oh, qa->d + og, qa->s + og,
                       qa->m + og);
        else
            quant_act(xt, qa->cols, KWK_QACT_GROUP, qa->h + oh, qa->l + oh, qa->d + og, qa->s + og);
    }
}

void kwk_quant_matmul_q_avx512_amx(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok,
                                   float *y, long ldy, int64_t r0, int64_t r1, int amx)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
    if (!__builtin_cpu_supports("avx512vnni")) {
        kwk_quant_matmul_q_avx2(w, qa, n_tok, y, ldy, r0, r1);
        return;
    }
    matmul_q_vnni(w, qa, n_tok, y, ldy, r0, r1, amx && kwk_cpu_amx());
}

void kwk_quant_matmul_q_avx512(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok,
                               float *y, long ldy, int64_t r0, int64_t r1)
{
    kwk_quant_matmul_q_avx512_amx(w, qa, n_tok, y, ldy, r0, r1, 1);
}

/* ---- packing: the scale search of 16 rows at once ----------------------------------------------
 * kwk_quant_fit and kwk_quant_code run the same float operations on each row in the same order,
 * one row per lane, so every sum is rounded exactly as in quant_ref.c: lanes are rows, not
 * columns (summing a row's columns across lanes would change the order of its float sums).
 * Separate multiplies and adds, never fused: the build is ISO C11, where GCC does not contract
 * them (test_quant compares the bytes with the scalar packer's). */

/* round_clamp of quant_ref.c: NaN to 0, clamp to [-lim, lim], round to nearest even. */
INLINE __m512 round_clamp16(__m512 x, __m512 lim, __m512 nlim)
{
    __mmask16 ord = _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q);
    __m512 c = _mm512_min_ps(_mm512_max_ps(x, nlim), lim);
    return _mm512_maskz_roundscale_ps(ord, c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* kwk_f32_to_f16 then kwk_f16_to_f32, lane by lane: the hardware's nearest-even conversion,
 * with kwk_f32_to_f16's saturation above 65504 and its NaN. */
INLINE __m512 half16(__m512 f)
{
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(f), 16),
                                          _mm512_set1_epi32(0x8000));
    __m512 a = _mm512_abs_ps(f);
    __m512i v = _mm512_cvtepu16_epi32(
        _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    v = _mm512_mask_or_epi32(v, _mm512_cmp_ps_mask(a, _mm512_set1_ps(65504.0f), _CMP_GT_OQ), sign,
                             _mm512_set1_epi32(0x7bff));
    v = _mm512_mask_or_epi32(v, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), sign,
                             _mm512_set1_epi32(0x7e00));
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* sym_err of quant_ref.c with the int8 clamp (lim 127) or the int6 code (lim 32, then <= 31). */
INLINE __m512 sym_err16(const __m512 *w, int n, __m512 d, int q6)
{
    const __m512 zero = _mm512_setzero_ps(), top = _mm512_set1_ps(31.0f);
    const __m512 lim = _mm512_set1_ps(q6 ? 32.0f : 127.0f), nlim = _mm512_sub_ps(zero, lim);
    /* int8: 1 / d for d > 0; int6 (d of either sign): for d != 0 */
    __mmask16 nz = q6 ? _mm512_cmp_ps_mask(d, zero, _CMP_NEQ_UQ)
                      : _mm512_cmp_ps_mask(d, zero, _CMP_GT_OQ);
    __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d), e = zero;
    for (int k = 0; k < n; k++) {
        __m512 q = round_clamp16(_mm512_mul_ps(w[k], id), lim, nlim);
        if (q6)
            q = _mm512_min_ps(q, top);
        __m512 r = _mm512_sub_ps(_mm512_mul_ps(d, q), w[k]);
        e = _mm512_add_ps(e, _mm512_mul_ps(r, r));
    }
    return e;
}

/* Trials run NB at a time: each trial's sums still add in column order, but NB independent
 * chains hide the adds' latency, which one chain a trial would wait on at every column. */
#define NB 4

/* fit_q8 (q6 = 0) and fit_q6 (q6 = 1) of quant_ref.c: trial t of 32 is s = -8..24 without 0. */
static __m512 fit_sym16(const __m512 *w, int n, int q6)
{
    const __m512 zero = _mm512_setzero_ps();
    const __m512 lim = _mm512_set1_ps(q6 ? 32.0f : 127.0f), nlim = _mm512_sub_ps(zero, lim);
    const __m512 top = _mm512_set1_ps(31.0f);
    __m512 amax = zero, wmax = zero, sww = zero;
    for (int k = 0; k < n; k++) {
        __m512 a = _mm512_abs_ps(w[k]);
        __mmask16 gt = _mm512_cmp_ps_mask(a, amax, _CMP_GT_OQ);
        amax = _mm512_mask_mov_ps(amax, gt, a);
        wmax = _mm512_mask_mov_ps(wmax, gt, w[k]);
        sww = _mm512_add_ps(sww, _mm512_mul_ps(w[k], w[k]));
    }
    __m512 neg = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(wmax), _mm512_set1_epi32(INT32_MIN)));
    /* int8: amax / 127; int6: -wmax / 32 (-0 for 0) */
    __m512 d0 = q6 ? _mm512_div_ps(neg, _mm512_set1_ps(32.0f))
                   : _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    __m512 bd = half16(d0);
    __m512 best = sym_err16(w, n, bd, q6);
    __mmask16 live = _mm512_cmp_ps_mask(amax, zero, _CMP_GT_OQ);
    for (int t0 = 0; t0 < 32 && live && n > 1; t0 += NB) {
        __m512 id[NB], sqq[NB], sqw[NB];
        for (int b = 0; b < NB; b++) {
            int t = t0 + b, si = t < 8 ? t - 8 : t - 7;
            id[b] = q6 ? _mm512_div_ps(_mm512_set1_ps(-(32.0f + 0.125f * (float)si)), wmax)
                       : _mm512_div_ps(_mm512_set1_ps(127.0f + 0.25f * (float)si), amax);
            sqq[b] = sqw[b] = zero;
        }
        for (int k = 0; k < n; k++)
            for (int b = 0; b < NB; b++) {
                __m512 fq = round_clamp16(_mm512_mul_ps(w[k], id[b]), lim, nlim);
                if (q6)
                    fq = _mm512_min_ps(fq, top);
                sqq[b] = _mm512_add_ps(sqq[b], _mm512_mul_ps(fq, fq));
                sqw[b] = _mm512_add_ps(sqw[b], _mm512_mul_ps(fq, w[k]));
            }
        for (int b = 0; b < NB; b++) { /* in trial order: the first of equal errors wins */
            __mmask16 ok = live & _mm512_cmp_ps_mask(sqq[b], zero, _CMP_GT_OQ) &
                           (q6 ? _mm512_cmp_ps_mask(sqw[b], zero, _CMP_NEQ_UQ)
                               : _mm512_cmp_ps_mask(sqw[b], zero, _CMP_GT_OQ));
            __m512 d = half16(_mm512_div_ps(sqw[b], sqq[b]));
            /* sww - 2 d sqw + d d sqq, in the scalar expression's order */
            __m512 e = _mm512_sub_ps(
                sww, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), d), sqw[b]));
            e = _mm512_add_ps(e, _mm512_mul_ps(_mm512_mul_ps(d, d), sqq[b]));
            __mmask16 up = ok & _mm512_cmp_ps_mask(e, best, _CMP_LT_OQ);
            best = _mm512_mask_mov_ps(best, up, e);
            bd = _mm512_mask_mov_ps(bd, up, d);
        }
    }
    return bd;
}

/* q4_err of quant_ref.c for NB parameter pairs at once (e[b] for d[b], m[b]). */
INLINE void q4_err16(const __m512 *w, int n, const __m512 *d, const __m512 *m, __m512 *e, int nb)
{
    const __m512 zero = _mm512_setzero_ps(), lim = _mm512_set1_ps(15.0f);
    const __m512 nlim = _mm512_set1_ps(-15.0f);
    __m512 id[NB];
    for (int b = 0; b < nb; b++) {
        __mmask16 pos = _mm512_cmp_ps_mask(d[b], zero, _CMP_GT_OQ);
        id[b] = _mm512_maskz_div_ps(pos, _mm512_set1_ps(1.0f), d[b]);
        e[b] = zero;
    }
    for (int k = 0; k < n; k++)
        for (int b = 0; b < nb; b++) {
            __m512 q = round_clamp16(_mm512_mul_ps(_mm512_sub_ps(w[k], m[b]), id[b]), lim, nlim);
            q = _mm512_max_ps(q, zero); /* -0 and 0 give the same float products */
            __m512 r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(d[b], q), m[b]), w[k]);
            e[b] = _mm512_add_ps(e[b], _mm512_mul_ps(r, r));
        }
}

/* fit_q4 of quant_ref.c: trial t of 8 is s = -4..4 without 0. */
static void fit_q4_16(const __m512 *w, int n, __m512 *d_out, __m512 *m_out)
{
    const __m512 zero = _mm512_setzero_ps(), lim = _mm512_set1_ps(15.0f);
    const __m512 nlim = _mm512_set1_ps(-15.0f), fn = _mm512_set1_ps((float)n);
    __m512 mn = n > 0 ? w[0] : zero, mx = mn;
    for (int k = 1; k < n; k++) {
        mn = _mm512_min_ps(w[k], mn); /* w < mn ? w : mn */
        mx = _mm512_max_ps(w[k], mx);
    }
    __m512 range = _mm512_sub_ps(mx, mn);
    __m512 bd = half16(_mm512_div_ps(range, _mm512_set1_ps(15.0f))), bm = half16(mn);
    __m512 best;
    q4_err16(w, n, &bd, &bm, &best, 1);
    __mmask16 live = _mm512_cmp_ps_mask(mx, mn, _CMP_GT_OQ);
    for (int t0 = 0; t0 < 8 && live && n > 1; t0 += NB) {
        __m512 id[NB], sq[NB], sqq[NB], sw[NB], sqw[NB], hd[NB], hm[NB], e[NB];
        __mmask16 ok[NB];
        for (int b = 0; b < NB; b++) {
            int t = t0 + b, si = t < 4 ? t - 4 : t - 3;
            id[b] = _mm512_div_ps(_mm512_set1_ps(15.0f + 0.1f * (float)si), range);
            sq[b] = sqq[b] = sw[b] = sqw[b] = zero;
        }
        for (int k = 0; k < n; k++)
            for (int b = 0; b < NB; b++) {
                __m512 fq = round_clamp16(_mm512_mul_ps(_mm512_sub_ps(w[k], mn), id[b]), lim, nlim);
                fq = _mm512_max_ps(fq, zero);
                sq[b] = _mm512_add_ps(sq[b], fq);
                sqq[b] = _mm512_add_ps(sqq[b], _mm512_mul_ps(fq, fq));
                sw[b] = _mm512_add_ps(sw[b], w[k]);
                sqw[b] = _mm512_add_ps(sqw[b], _mm512_mul_ps(fq, w[k]));
            }
        for (int b = 0; b < NB; b++) {
            __m512 det = _mm512_sub_ps(_mm512_mul_ps(fn, sqq[b]), _mm512_mul_ps(sq[b], sq[b]));
            __m512 d = _mm512_div_ps(
                _mm512_sub_ps(_mm512_mul_ps(fn, sqw[b]), _mm512_mul_ps(sq[b], sw[b])), det);
            __m512 m = _mm512_div_ps(_mm512_sub_ps(sw[b], _mm512_mul_ps(d, sq[b])), fn);
            ok[b] = live & _mm512_cmp_ps_mask(det, zero, _CMP_NLE_UQ) &
                    _mm512_cmp_ps_mask(d, zero, _CMP_GT_OQ);
            hd[b] = half16(d);
            hm[b] = half16(m);
        }
        q4_err16(w, n, hd, hm, e, NB);
        for (int b = 0; b < NB; b++) { /* in trial order: the first of equal errors wins */
            __mmask16 up = ok[b] & _mm512_cmp_ps_mask(e[b], best, _CMP_LT_OQ);
            best = _mm512_mask_mov_ps(best, up, e[b]);
            bd = _mm512_mask_mov_ps(bd, up, hd[b]);
            bm = _mm512_mask_mov_ps(bm, up, hm[b]);
        }
    }
    *d_out = bd;
    *m_out = bm;
}

void kwk_quant_fit_rows_avx512(int wtype, const float *w, int n, float *d, float *m, int8_t *q)
{
    __m512 wv[32], dv, mv = _mm512_setzero_ps();
    for (int k = 0; k < n; k++)
        wv[k] = _mm512_loadu_ps(w + 16 * k);
    if (wtype == KWK_W_Q4)
        fit_q4_16(wv, n, &dv, &mv);
    else
        dv = fit_sym16(wv, n, wtype == KWK_W_Q6);
    _mm512_storeu_ps(d, dv);
    _mm512_storeu_ps(m, mv);
    /* kwk_quant_code */
    const __m512 zero = _mm512_setzero_ps();
    float lim = wtype == KWK_W_Q8 ? 127.0f : wtype == KWK_W_Q6 ? 32.0f : 15.0f;
    const __m512 vl = _mm512_set1_ps(lim), nvl = _mm512_set1_ps(-lim);
    __mmask16 nz = wtype == KWK_W_Q6 ? _mm512_cmp_ps_mask(dv, zero, _CMP_NEQ_UQ)
                                     : _mm512_cmp_ps_mask(dv, zero, _CMP_GT_OQ);
    __m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), dv);
    for (int k = 0; k < n; k++) {
        __m512 x = wtype == KWK_W_Q4 ? _mm512_sub_ps(wv[k], mv) : wv[k];
        __m512 c = round_clamp16(_mm512_mul_ps(x, id), vl, nvl);
        if (wtype == KWK_W_Q4)
            c = _mm512_max_ps(c, zero);
        if (wtype == KWK_W_Q6)
            c = _mm512_min_ps(c, _mm512_set1_ps(31.0f));
        _mm_storeu_si128((__m128i *)(q + 16 * k), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(c)));
    }
}
