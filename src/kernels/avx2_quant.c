/* avx2_quant.c - the int8, int4 and int6 matmul with AVX2 (maddubs + madd): each 16-row block as two
 * registers of 8 rows, activations quantized on the fly to 16 bits as two int8 halves. Pure
 * functions; any thread. Computes the integers of quant_ref.c exactly; float sums agree to
 * rounding (fused multiply-adds). */
#include <immintrin.h>
#include <string.h>

#include "base/base.h"
#include "kernels/quant.h"

#define INLINE static inline __attribute__((always_inline))

/* Tokens per register tile: 2 halves x TT tokens of int and float accumulators, plus weights,
 * fit the 16 ymm registers. */
#define TT 2
#define QG_MAX (KWK_QX_COLS / KWK_Q4_GROUP)

struct qx {
    int8_t q[KWK_QX_TOKS][KWK_QX_COLS]; /* high halves h of v = 254 h + l */
    int8_t l[KWK_QX_TOKS][KWK_QX_COLS]; /* low halves */
    float d[KWK_QX_TOKS][QG_MAX];
    int32_t s[KWK_QX_TOKS][QG_MAX];
};

INLINE __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Store (first pass) or add the 16 row sums of block rb for one token, rows [r0, r1) only. */
INLINE void put(float *yt, int64_t rb, int64_t r0, int64_t r1, __m256 lo, __m256 hi, int first)
{
    float v[KWK_QROWS];
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + 8, hi);
    int64_t base = rb * KWK_QROWS;
    int i0 = (int)KWK_MAX((int64_t)0, r0 - base), i1 = (int)KWK_MIN((int64_t)KWK_QROWS, r1 - base);
    for (int i = i0; i < i1; i++)
        yt[base + i] = first ? v[i] : yt[base + i] + v[i];
}

struct tile_args {
    const void *blk; /* the row block's block of group g0 */
    const struct qx *qx;
    int t;
    int ng;
    float *y;
    long ldy;
    int64_t rb, r0, r1;
    int first;
};

/* int8: the stored w + 128 flipped back to signed w; maddubs needs an unsigned operand, so it
 * multiplies |w| by x carrying w's sign: pairs stay within 2 * 127 * 127, no saturation. The
 * high halves' pair sums are widened by madd with 254 instead of 1, so one int32 accumulator
 * takes 254 * isum_h + isum_l exactly (|pair| * 2 * 254 < 2^24). */
INLINE void tile_q8(const struct tile_args *a, int T)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const __m256i c254 = _mm256_set1_epi16(254);
    const struct kwk_q8_block *b = a->blk;
    __m256 facc[2][TT];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < T; j++)
            facc[h][j] = _mm256_setzero_ps();
    for (int g = 0; g < a->ng; g++) {
        __m256i acc[2][TT];
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < T; j++)
                acc[h][j] = _mm256_setzero_si256();
        for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++) {
            for (int h = 0; h < 2; h++) {
                __m256i wv = _mm256_xor_si256(
                    _mm256_loadu_si256((const __m256i *)b[g].q[k4][8 * h]), flip);
                __m256i aw = _mm256_abs_epi8(wv);
                for (int j = 0; j < T; j++) {
                    int64_t k = g * KWK_Q8_GROUP + k4 * 4;
                    __m256i xh = bcast4(a->qx->q[a->t + j] + k);
                    __m256i xl = bcast4(a->qx->l[a->t + j] + k);
                    __m256i ph = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xh, wv));
                    __m256i pl = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xl, wv));
                    __m256i s = _mm256_add_epi32(_mm256_madd_epi16(ph, c254),
                                                 _mm256_madd_epi16(pl, ones));
                    acc[h][j] = _mm256_add_epi32(acc[h][j], s);
                }
            }
        }
        for (int j = 0; j < T; j++) {
            __m256 dx = _mm256_set1_ps(a->qx->d[a->t + j][g]);
            for (int h = 0; h < 2; h++) {
                __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].d + 8 * h)));
                __m256 dd = _mm256_mul_ps(dw, dx);
                facc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h][j]), dd, facc[h][j]);
            }
        }
    }
    for (int j = 0; j < T; j++)
        put(a->y + (int64_t)j * a->ldy, a->rb, a->r0, a->r1, facc[0][j], facc[1][j], a->first);
}

/* int4: nibbles are unsigned already; the two maddubs of a byte vector (low and high nibbles)
 * add in 16 bits without overflow (2 * 2 * 15 * 127 < 32767); halves combine as in tile_q8. */
INLINE void tile_q4(const struct tile_args *a, int T)
{
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i c254 = _mm256_set1_epi16(254);
    const struct kwk_q4_block *b = a->blk;
    __m256 facc[2][TT];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < T; j++)
            facc[h][j] = _mm256_setzero_ps();
    for (int g = 0; g < a->ng; g++) {
        __m256i acc[2][TT];
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < T; j++)
                acc[h][j] = _mm256_setzero_si256();
        for (int c = 0; c < KWK_Q4_GROUP / 8; c++) {
            for (int h = 0; h < 2; h++) {
                __m256i p = _mm256_loadu_si256((const __m256i *)b[g].q[c][8 * h]);
                __m256i lo = _mm256_and_si256(p, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4);
                for (int j = 0; j < T; j++) {
                    int64_t k = g * KWK_Q4_GROUP + 8 * c;
                    const int8_t *xh = a->qx->q[a->t + j] + k, *xl = a->qx->l[a->t + j] + k;
                    __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xh)),
                                                  _mm256_maddubs_epi16(hi, bcast4(xh + 4)));
                    __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xl)),
                                                  _mm256_maddubs_epi16(hi, bcast4(xl + 4)));
                    __m256i s = _mm256_add_epi32(_mm256_madd_epi16(sh, c254),
                                                 _mm256_madd_epi16(sl, ones));
                    acc[h][j] = _mm256_add_epi32(acc[h][j], s);
                }
            }
        }
        for (int j = 0; j < T; j++) {
            float xd = a->qx->d[a->t + j][g];
            __m256 dx = _mm256_set1_ps(xd);
            __m256 dsx = _mm256_set1_ps(xd * (float)a->qx->s[a->t + j][g]);
            for (int h = 0; h < 2; h++) {
                __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].d + 8 * h)));
                __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].m + 8 * h)));
                __m256 s = _mm256_cvtepi32_ps(acc[h][j]);
                facc[h][j] = _mm256_fmadd_ps(s, _mm256_mul_ps(d, dx), facc[h][j]);
                facc[h][j] = _mm256_fmadd_ps(m, dsx, facc[h][j]);
            }
        }
    }
    for (int j = 0; j < T; j++)
        put(a->y + (int64_t)j * a->ldy, a->rb, a->r0, a->r1, facc[0][j], facc[1][j], a->first);
}

/* The high bits of slice 4h + t of a qh vector at bits 4-5 of each byte (quant.h). */
INLINE __m256i q6_high(__m256i qh, int t, __m256i m30)
{
    __m256i v = t == 0 ? _mm256_slli_epi16(qh, 4)
                : t == 1 ? _mm256_slli_epi16(qh, 2)
                : t == 2 ? qh
                         : _mm256_srli_epi16(qh, 2);
    return _mm256_and_si256(v, m30);
}

/* int6: tile_q4's loop on u = q + 32 (the nibble with the high bits or'ed on): the two maddubs
 * of a byte vector add in 16 bits without overflow (2 * 2 * 63 * 127 < 32767); 32 * sum(v)
 * comes back out at the end of the group. */
INLINE void tile_q6(const struct tile_args *a, int T)
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const __m256i ones = _mm256_set1_epi16(1), c254 = _mm256_set1_epi16(254);
    const struct kwk_q6_block *b = a->blk;
    __m256 facc[2][TT];
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < T; j++)
            facc[h][j] = _mm256_setzero_ps();
    for (int g = 0; g < a->ng; g++) {
        __m256i acc[2][TT];
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < T; j++)
                acc[h][j] = _mm256_setzero_si256();
        for (int c = 0; c < KWK_Q6_GROUP / 8; c++) {
            for (int h = 0; h < 2; h++) {
                __m256i p = _mm256_loadu_si256((const __m256i *)b[g].ql[c][8 * h]);
                __m256i qh = _mm256_loadu_si256((const __m256i *)b[g].qh[c / 2][8 * h]);
                __m256i lo = _mm256_or_si256(_mm256_and_si256(p, m4),
                                             q6_high(qh, 2 * (c % 2), m30));
                __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p, 4), m4),
                                             q6_high(qh, 2 * (c % 2) + 1, m30));
                for (int j = 0; j < T; j++) {
                    int64_t k = g * KWK_Q6_GROUP + 8 * c;
                    const int8_t *xh = a->qx->q[a->t + j] + k, *xl = a->qx->l[a->t + j] + k;
                    __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xh)),
                                                  _mm256_maddubs_epi16(hi, bcast4(xh + 4)));
                    __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xl)),
                                                  _mm256_maddubs_epi16(hi, bcast4(xl + 4)));
                    __m256i s = _mm256_add_epi32(_mm256_madd_epi16(sh, c254),
                                                 _mm256_madd_epi16(sl, ones));
                    acc[h][j] = _mm256_add_epi32(acc[h][j], s);
                }
            }
        }
        for (int j = 0; j < T; j++) {
            __m256i corr = _mm256_set1_epi32(32 * a->qx->s[a->t + j][g]);
            __m256 dx = _mm256_set1_ps(a->qx->d[a->t + j][g]);
            for (int h = 0; h < 2; h++) {
                __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].d + 8 * h)));
                __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[h][j], corr));
                facc[h][j] = _mm256_fmadd_ps(s, _mm256_mul_ps(d, dx), facc[h][j]);
            }
        }
    }
    for (int j = 0; j < T; j++)
        put(a->y + (int64_t)j * a->ldy, a->rb, a->r0, a->r1, facc[0][j], facc[1][j], a->first);
}

typedef void (*tile_fn)(const struct tile_args *);
static void tile_q8_1(const struct tile_args *a) { tile_q8(a, 1); }
static void tile_q8_2(const struct tile_args *a) { tile_q8(a, 2); }
static void tile_q4_1(const struct tile_args *a) { tile_q4(a, 1); }
static void tile_q4_2(const struct tile_args *a) { tile_q4(a, 2); }
static void tile_q6_1(const struct tile_args *a) { tile_q6(a, 1); }
static void tile_q6_2(const struct tile_args *a) { tile_q6(a, 2); }
static const tile_fn tiles_q8[TT + 1] = {NULL, tile_q8_1, tile_q8_2};
static const tile_fn tiles_q6[TT + 1] = {NULL, tile_q6_1, tile_q6_2};
static const tile_fn tiles_q4[TT + 1] = {NULL, tile_q4_1, tile_q4_2};

void kwk_quant_matmul_avx2(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                           int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
    struct qx qx;
    int G = kwk_quant_group(w->wtype);
    const tile_fn *tiles = w->wtype == KWK_W_Q8   ? tiles_q8
                           : w->wtype == KWK_W_Q6 ? tiles_q6
                                                  : tiles_q4;
    size_t bsz = w->wtype == KWK_W_Q8   ? sizeof(struct kwk_q8_block)
                 : w->wtype == KWK_W_Q6 ? sizeof(struct kwk_q6_block)
                                        : sizeof(struct kwk_q4_block);
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), gc = KWK_QX_COLS / G;
    int64_t rb0 = r0 / KWK_QROWS, rb1 = (r1 + KWK_QROWS - 1) / KWK_QROWS;
    for (int tb = 0; tb < n_tok; tb += KWK_QX_TOKS) {
        int nt = KWK_MIN(KWK_QX_TOKS, n_tok - tb);
        for (int64_t g0 = 0; g0 < ng; g0 += gc) {
            int64_t g1 = KWK_MIN(ng, g0 + gc);
            int64_t k0 = g0 * G, nk = KWK_MIN(w->cols, g1 * G) - k0;
            for (int j = 0; j < nt; j++)
                kwk_quant_act(x + (int64_t)(tb + j) * w->cols + k0, nk, G, qx.q[j], qx.l[j],
                              qx.d[j], qx.s[j]);
            struct tile_args a = {.qx = &qx, .ng = (int)(g1 - g0), .ldy = ldy, .r0 = r0,
                                  .r1 = r1, .first = g0 == 0};
            for (int64_t rb = rb0; rb < rb1; rb++) {
                a.blk = (const uint8_t *)w->data + (rb * ng + g0) * bsz;
                a.rb = rb;
                for (int t = 0; t < nt; t += TT) {
                    a.t = t;
                    a.y = y + (int64_t)(tb + t) * ldy;
                    tiles[KWK_MIN(TT, nt - t)](&a);
                }
            }
        }
    }
}
