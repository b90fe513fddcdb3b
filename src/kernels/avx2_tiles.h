/* avx2_tiles.h - the body of the AVX2 quantized matmul (kernels/quant.h), compiled twice: by
 * avx2_quant.c with maddubs + madd (AVX2_TILES_VNNI 0: kwk_quant_matmul_avx2 and friends) and
 * by avxvnni_quant.c with AVX-VNNI's vpdpbusd on ymm registers (AVX2_TILES_VNNI 1:
 * kwk_quant_matmul_avxvnni, kwk_quant_matmul_q_avxvnni), which Intel cores since Alder Lake and
 * Sierra Forest, and AMD's since Zen 5, have without AVX-512 or beside it. The tiles, passes and
 * epilogues are one code; only the integer dot products differ, and both give the same integers
 * (the VNNI tiles take the unsigned stored weights as they are and subtract 128 * sum(x) or
 * 32 * sum(x), as avx512_quant.c does), so the two instances agree to the bit. The AVX2
 * instance hands its products to the VNNI one when kwk_cpu_avxvnni() says so.
 * Pure functions; any thread. Include once, after defining AVX2_TILES_VNNI. */
#include <immintrin.h>
#include <string.h>

#include "base/base.h"
#include "kernels/quant.h"

#ifndef AVX2_TILES_VNNI
#error "define AVX2_TILES_VNNI (0 or 1) before including avx2_tiles.h"
#endif
#if AVX2_TILES_VNNI
#define TILES_ENTRY(name) name##_avxvnni
#else
#define TILES_ENTRY(name) name##_avx2
#endif

#define INLINE static inline __attribute__((always_inline))

/* An integer accumulator pinned in its register at this point of the loop. The tiles' loops are
 * unrolled whole, and GCC 12 reassociates their integer sums (exact, so allowed): it computed
 * every product of a group first, spilled them to the stack and summed them after, 65 spilled
 * vectors in the 4-token int4 tile. Pinned after each add, the sums stay in order in registers:
 * KWKER_ISA=avx2 on Zen 3, one thread (bench_kernels quant 512 1 avx2): act8 tiles int4 +22%,
 * int6 +9%, int8 the same. The 16-bit int8 and int6 tiles, whose 2 x 2 accumulators spill
 * either way, ran the same or 3% slower pinned and are left to GCC. */
#define KEEP(v) __asm__("" : "+x"(v))

/* Step c of an int4 block, both 8-row halves: the low nibbles (columns 8c .. 8c + 3) and the high
 * ones (8c + 4 .. 8c + 7) as bytes. */
INLINE void nib_halves(const struct kwk_q4_block *bg, int c, __m256i m4, __m256i lo[2],
                       __m256i hi[2])
{
    for (int h = 0; h < 2; h++) {
        __m256i p = _mm256_loadu_si256((const __m256i *)bg->q[c][8 * h]);
        lo[h] = _mm256_and_si256(p, m4);
        hi[h] = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4);
    }
}

/* An int4 step into a group's sum: the low nibbles times activations x0 (columns 8c .. 8c + 3),
 * the high ones times x1 (8c + 4 .. 8c + 7). maddubs: into 16 bits (bounds at tile_q4 and
 * tile8_q4), which nib_sum widens once a group; VNNI: into 32 bits directly. */
INLINE void nib_dot(__m256i *acc, __m256i lo, __m256i hi, __m256i x0, __m256i x1)
{
#if AVX2_TILES_VNNI
    *acc = _mm256_dpbusd_avx_epi32(*acc, lo, x0);
    *acc = _mm256_dpbusd_avx_epi32(*acc, hi, x1);
#else
    *acc = _mm256_add_epi16(*acc, _mm256_maddubs_epi16(lo, x0));
    *acc = _mm256_add_epi16(*acc, _mm256_maddubs_epi16(hi, x1));
#endif
    KEEP(*acc);
}

/* A group's nib_dot sums as 32-bit integers. */
INLINE __m256i nib_sum(__m256i acc)
{
#if AVX2_TILES_VNNI
    return acc;
#else
    return _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
#endif
}

/* Tokens per register tile: 2 halves x TT tokens of int and float accumulators, plus weights,
 * fit the 16 ymm registers. */
#define TT 2

_Static_assert(KWK_Q8_GROUP == 32 && KWK_Q4_GROUP == 32 && KWK_Q6_GROUP == 32, "groups of 32");

INLINE __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Store (first pass) or add 8 sums at y. A block inside the row range takes this path: as a
 * scalar loop over a stored copy, GCC turned the first pass into a memcpy call (and a vzeroupper)
 * for every 8 rows of every token (2.9% of SmolLM2-135M's balanced act8 prompt). */
INLINE void put8_full(float *y, __m256 v, int first)
{
    _mm256_storeu_ps(y, first ? v : _mm256_add_ps(_mm256_loadu_ps(y), v));
}

/* Store (first pass) or add the 16 row sums of block rb for one token, rows [r0, r1) only. */
INLINE void put(float *yt, int64_t rb, int64_t r0, int64_t r1, __m256 lo, __m256 hi, int first)
{
    if (rb * KWK_QROWS >= r0 && (rb + 1) * KWK_QROWS <= r1) {
        put8_full(yt + rb * KWK_QROWS, lo, first);
        put8_full(yt + rb * KWK_QROWS + 8, hi, first);
        return;
    }
    float v[KWK_QROWS];
    _mm256_storeu_ps(v, lo);
    _mm256_storeu_ps(v + 8, hi);
    int64_t base = rb * KWK_QROWS;
    int i0 = (int)KWK_MAX((int64_t)0, r0 - base), i1 = (int)KWK_MIN((int64_t)KWK_QROWS, r1 - base);
    for (int i = i0; i < i1; i++)
        yt[base + i] = first ? v[i] : yt[base + i] + v[i];
}

/* A tile's float sums of NB blocks x 2 halves x T tokens to zero (facc, flat, W tokens a row).
 * Only the sums in use: zeroing the whole array made GCC call rep stos for 1 KiB on every decode
 * tile (1.3% of SmolLM2-360M's balanced generation) where 8 vectors are used. */
INLINE void zero_sums(__m256 *f, int NB, int T, int W)
{
    for (int i = 0; i < NB * 2; i++)
        for (int j = 0; j < T; j++)
            f[i * W + j] = _mm256_setzero_ps();
}

/* Row blocks a decode tile takes in lockstep (run_pass says why). */
#define DEC_BLOCKS 4

struct tile_args {
    const void *blk[DEC_BLOCKS]; /* each row block's block of group g0 (one unless decode) */
    int64_t rb[DEC_BLOCKS];      /* and its index */
    struct kwk_qact x; /* the token block's activations, from the pass's first column (group) */
    int t;
    int ng;
    float *y;
    long ldy;
    int64_t r0, r1;
    int first;
    size_t stride;            /* bytes from a row block's block to the next row block's */
    size_t next;              /* decode: bytes from a block to its stream's in the next tile (0:
                               * no next tile) */
    int pf;                   /* decode: prefetch at all (kwk_cpu_prefetch_int8 for int8) */
    int pf_l2;                /* decode: prefetch into L2 rather than L1 (kwk_prefetch) */
};

/* The sums of a tile's NB blocks (block ib's token j in facc[ib][0][j] and facc[ib][1][j]) into
 * y. */
INLINE void put_blocks(const struct tile_args *a, int NB, int T, __m256 facc[][2][TT])
{
    for (int ib = 0; ib < NB; ib++)
        for (int j = 0; j < T; j++)
            put(a->y + (int64_t)j * a->ldy, a->rb[ib], a->r0, a->r1, facc[ib][0][j],
                facc[ib][1][j], a->first);
}

/* A decode stream asks for its block's group PF_GROUPS ahead of the one it computes and, group
 * by group, for the same group of its block in the next tile (run_pass says why). Prompt tiles
 * are bound by arithmetic. */
#define PF_GROUPS 2

INLINE void prefetch_ahead(const struct tile_args *a, int s, int g, size_t block)
{
    if (!a->pf)
        return;
    const char *b = a->blk[s];
    if (a->next)
        kwk_prefetch_bytes(b + a->next + (size_t)g * block, block, a->pf_l2);
    if (g + PF_GROUPS < a->ng)
        kwk_prefetch_bytes(b + (size_t)(g + PF_GROUPS) * block, block, a->pf_l2);
}

/* Token t + j of a tile: its high and low halves from the pass's first column, and its numbers of
 * group g of the pass. */
#define XH(a, j) ((a)->x.h + (long)((a)->t + (j)) * (a)->x.ldh)
#define XL(a, j) ((a)->x.l + (long)((a)->t + (j)) * (a)->x.ldh)
#define XD(a, j, g) ((a)->x.d[(long)((a)->t + (j)) * (a)->x.ldg + (g)])
#define XS(a, j, g) ((a)->x.s[(long)((a)->t + (j)) * (a)->x.ldg + (g)])
#define XM(a, j, g) ((a)->x.m[(long)((a)->t + (j)) * (a)->x.ldg + (g)])

/* int8: the stored w + 128 flipped back to signed w; maddubs needs an unsigned operand, so it
 * multiplies |w| by x carrying w's sign: pairs stay within 2 * 127 * 127, no saturation. The
 * high halves' pair sums are widened by madd with 254 instead of 1, so one int32 accumulator
 * takes 254 * isum_h + isum_l exactly (|pair| * 2 * 254 < 2^24). */
INLINE void tile_q8(const struct tile_args *a, int T, int NB)
{
#if AVX2_TILES_VNNI
    const __m256i c254w = _mm256_set1_epi32(254);
#else
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const __m256i c254 = _mm256_set1_epi16(254);
#endif
    __m256 facc[DEC_BLOCKS][2][TT];
    zero_sums((__m256 *)facc, NB, T, TT);
    for (int g = 0; g < a->ng; g++)
        for (int ib = 0; ib < NB; ib++) {
            const struct kwk_q8_block *b = a->blk[ib];
            __m256i acc[2][TT];
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < T; j++)
                    acc[h][j] = _mm256_setzero_si256();
            if (T == 1)
                prefetch_ahead(a, ib, g, sizeof(struct kwk_q8_block));
#if AVX2_TILES_VNNI
            /* the stored w + 128 as it is: the low sums start at -128 * sum(v) to take it back
             * out (tile_q8 of avx512_quant.c), and 254 * isum_h + isum_l is the same integer */
            __m256i al[2][TT];
            for (int j = 0; j < T; j++)
                for (int h = 0; h < 2; h++)
                    al[h][j] = _mm256_set1_epi32(-128 * XS(a, j, g));
            for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++)
                for (int h = 0; h < 2; h++) {
                    __m256i u = _mm256_loadu_si256((const __m256i *)b[g].q[k4][8 * h]);
                    for (int j = 0; j < T; j++) {
                        int64_t k = g * KWK_Q8_GROUP + k4 * 4;
                        acc[h][j] = _mm256_dpbusd_avx_epi32(acc[h][j], u, bcast4(XH(a, j) + k));
                        al[h][j] = _mm256_dpbusd_avx_epi32(al[h][j], u, bcast4(XL(a, j) + k));
                    }
                }
            for (int j = 0; j < T; j++)
                for (int h = 0; h < 2; h++)
                    acc[h][j] = _mm256_add_epi32(_mm256_mullo_epi32(acc[h][j], c254w), al[h][j]);
#else
            for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++) {
                for (int h = 0; h < 2; h++) {
                    __m256i wv = _mm256_xor_si256(
                        _mm256_loadu_si256((const __m256i *)b[g].q[k4][8 * h]), flip);
                    __m256i aw = _mm256_abs_epi8(wv);
                    for (int j = 0; j < T; j++) {
                        int64_t k = g * KWK_Q8_GROUP + k4 * 4;
                        __m256i xh = bcast4(XH(a, j) + k);
                        __m256i xl = bcast4(XL(a, j) + k);
                        __m256i ph = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xh, wv));
                        __m256i pl = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xl, wv));
                        __m256i s = _mm256_add_epi32(_mm256_madd_epi16(ph, c254),
                                                     _mm256_madd_epi16(pl, ones));
                        acc[h][j] = _mm256_add_epi32(acc[h][j], s);
                    }
                }
            }
#endif
            for (int j = 0; j < T; j++) {
                __m256 dx = _mm256_set1_ps(XD(a, j, g));
                for (int h = 0; h < 2; h++) {
                    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].d + 8 * h)));
                    __m256 dd = _mm256_mul_ps(dw, dx);
                    __m256 v = _mm256_cvtepi32_ps(acc[h][j]);
                    facc[ib][h][j] = _mm256_fmadd_ps(v, dd, facc[ib][h][j]);
                }
            }
        }
    put_blocks(a, NB, T, facc);
}

/* int4: nibbles are unsigned already, so each activation half meets them directly: a maddubs pair
 * is at most 2 * 15 * 127 = 3810 and a group's 8 maddubs of one half add up in 16 bits (30480 <
 * 32767), as in tile8_q4; one madd each a group (254 for h, 1 for l) widens them into the exact
 * 254 * isum_h + isum_l. Each broadcast feeds both 8-row halves; the 2 x 2 x 2 sums and the
 * nibble vectors fill the registers, the float sums wait on the stack. Against summing h and l
 * per step through two madds (Zen 3, one thread, SmolLM2-135M's shapes): 49-80 -> 53-93 GOP/s
 * (576 x 576: 69.5 -> 79.3); the same integers. */
INLINE void tile_q4(const struct tile_args *a, int T, int NB)
{
    const __m256i m4 = _mm256_set1_epi8(15);
#if AVX2_TILES_VNNI
    const __m256i c254w = _mm256_set1_epi32(254);
#else
    const __m256i ones = _mm256_set1_epi16(1), c254 = _mm256_set1_epi16(254);
#endif
    __m256 facc[DEC_BLOCKS][2][TT];
    zero_sums((__m256 *)facc, NB, T, TT);
    for (int g = 0; g < a->ng; g++)
        for (int ib = 0; ib < NB; ib++) {
            const struct kwk_q4_block *b = a->blk[ib];
            __m256i ah[2][TT], al[2][TT]; /* the group's sums of the high and low halves: 16-bit
                                            * (maddubs) or 32-bit (VNNI) */
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < T; j++)
                    ah[h][j] = al[h][j] = _mm256_setzero_si256();
            if (T == 1)
                prefetch_ahead(a, ib, g, sizeof(struct kwk_q4_block));
            for (int c = 0; c < KWK_Q4_GROUP / 8; c++) {
                __m256i lo[2], hi[2];
                nib_halves(&b[g], c, m4, lo, hi);
                for (int j = 0; j < T; j++) {
                    int64_t k = g * KWK_Q4_GROUP + 8 * c;
                    const int8_t *xh = XH(a, j) + k, *xl = XL(a, j) + k;
                    __m256i x0 = bcast4(xh), x1 = bcast4(xh + 4);
                    for (int h = 0; h < 2; h++)
                        nib_dot(&ah[h][j], lo[h], hi[h], x0, x1);
                    x0 = bcast4(xl);
                    x1 = bcast4(xl + 4);
                    for (int h = 0; h < 2; h++)
                        nib_dot(&al[h][j], lo[h], hi[h], x0, x1);
                }
            }
            for (int j = 0; j < T; j++) {
                float xd = XD(a, j, g);
                __m256 dx = _mm256_set1_ps(xd);
                __m256 dsx = _mm256_set1_ps(xd * (float)XS(a, j, g));
                for (int h = 0; h < 2; h++) {
                    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].d + 8 * h)));
                    __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].m + 8 * h)));
#if AVX2_TILES_VNNI
                    __m256i acc = _mm256_add_epi32(_mm256_mullo_epi32(ah[h][j], c254w), al[h][j]);
#else
                    __m256i acc = _mm256_add_epi32(_mm256_madd_epi16(ah[h][j], c254),
                                                   _mm256_madd_epi16(al[h][j], ones));
#endif
                    __m256 s = _mm256_cvtepi32_ps(acc);
                    facc[ib][h][j] = _mm256_fmadd_ps(s, _mm256_mul_ps(d, dx), facc[ib][h][j]);
                    facc[ib][h][j] = _mm256_fmadd_ps(m, dsx, facc[ib][h][j]);
                }
            }
        }
    put_blocks(a, NB, T, facc);
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
INLINE void tile_q6(const struct tile_args *a, int T, int NB)
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
#if AVX2_TILES_VNNI
    const __m256i c254w = _mm256_set1_epi32(254);
#else
    const __m256i ones = _mm256_set1_epi16(1), c254 = _mm256_set1_epi16(254);
#endif
    __m256 facc[DEC_BLOCKS][2][TT];
    zero_sums((__m256 *)facc, NB, T, TT);
    for (int g = 0; g < a->ng; g++)
        for (int ib = 0; ib < NB; ib++) {
            const struct kwk_q6_block *b = a->blk[ib];
            __m256i acc[2][TT];
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < T; j++)
                    acc[h][j] = _mm256_setzero_si256();
#if AVX2_TILES_VNNI
            __m256i al[2][TT]; /* the low halves' sums (the high ones' in acc) */
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < T; j++)
                    al[h][j] = _mm256_setzero_si256();
#endif
            if (T == 1)
                prefetch_ahead(a, ib, g, sizeof(struct kwk_q6_block));
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
                        const int8_t *xh = XH(a, j) + k, *xl = XL(a, j) + k;
#if AVX2_TILES_VNNI
                        acc[h][j] = _mm256_dpbusd_avx_epi32(acc[h][j], lo, bcast4(xh));
                        acc[h][j] = _mm256_dpbusd_avx_epi32(acc[h][j], hi, bcast4(xh + 4));
                        al[h][j] = _mm256_dpbusd_avx_epi32(al[h][j], lo, bcast4(xl));
                        al[h][j] = _mm256_dpbusd_avx_epi32(al[h][j], hi, bcast4(xl + 4));
#else
                        __m256i sh = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xh)),
                                                      _mm256_maddubs_epi16(hi, bcast4(xh + 4)));
                        __m256i sl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xl)),
                                                      _mm256_maddubs_epi16(hi, bcast4(xl + 4)));
                        __m256i s = _mm256_add_epi32(_mm256_madd_epi16(sh, c254),
                                                     _mm256_madd_epi16(sl, ones));
                        acc[h][j] = _mm256_add_epi32(acc[h][j], s);
#endif
                    }
                }
            }
#if AVX2_TILES_VNNI
            for (int j = 0; j < T; j++)
                for (int h = 0; h < 2; h++)
                    acc[h][j] = _mm256_add_epi32(_mm256_mullo_epi32(acc[h][j], c254w), al[h][j]);
#endif
            for (int j = 0; j < T; j++) {
                __m256i corr = _mm256_set1_epi32(32 * XS(a, j, g));
                __m256 dx = _mm256_set1_ps(XD(a, j, g));
                for (int h = 0; h < 2; h++) {
                    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b[g].d + 8 * h)));
                    __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[h][j], corr));
                    facc[ib][h][j] = _mm256_fmadd_ps(s, _mm256_mul_ps(d, dx), facc[ib][h][j]);
                }
            }
        }
    put_blocks(a, NB, T, facc);
}

/* ---- 8-bit activations: one pass ---------------------------------------------------------------
 * The tiles above without the low halves, both 8-row halves of a block for up to TT8 tokens
 * (with VNNI, one vpdpbusd a weight vector and token, into 32 bits: no bounds to keep):
 *   int8: one sign + maddubs + madd a weight vector and token instead of two; pairs stay within
 *         2 * 127 * 127 = 32258 (|w| times h carrying w's sign; h in [-127, 127]).
 *   int4: the unsigned nibbles meet h directly: a maddubs pair is at most 2 * 15 * 127 = 3810,
 *         so the 8 maddubs of a group add up in 16 bits (8 * 3810 = 30480 < 32767) and one madd
 *         a group widens them.
 *   int6: u = q + 32 <= 63: a pair is at most 2 * 63 * 127 = 16002, two add in 16 bits (32004)
 *         before a madd; 32 * sum(h) comes back out at the end of the group.
 * The epilogue is (float)isum_h * (d_w * 254 d_x): the integers are the h pass's, exactly. */
/* A tile takes both 8-row halves of its block for 1 to TT8 tokens, so that each broadcast of a
 * token's 4 activations feeds a maddubs of each half (2 x 4 int accumulators and the 2 halves'
 * weight vectors fill the 16 registers; the float sums wait on the stack, touched once a group),
 * and for decode each 64-byte line of a block is read once, whole. Against one half at a time
 * (Zen 3, one thread, bench_kernels quant 512 1 avx2): int4 149-159 -> 174-188 GOP/s, int8
 * 100-105 -> 101-116, int6 the same; 3 tokens measured 3-4% slower than 4. Each half's sums are
 * the same either way. The VNNI tiles need no sign, constant or 16-bit temporaries, so 2 x 6
 * accumulators fit beside the weights: against 4 tokens (Zen 5, KWKER_ISA=avx2, one thread,
 * bench_kernels quant 512 1 avx2, 2 rounds) int6 241-281 -> 275-316 GOP/s, int8 and int4 within
 * the noise. Its 16-bit tiles stay at TT: 3 tokens measured slower (int8 136-163 against
 * 157-189 GOP/s, one noisy round). */
#if AVX2_TILES_VNNI
#define TT8 6
#else
#define TT8 4
#endif
/* Store (first pass) or add the 8 row sums of half h of block rb for one token. */
INLINE void put8(float *yt, int64_t rb, int h, int64_t r0, int64_t r1, __m256 v, int first)
{
    int64_t base = rb * KWK_QROWS + 8 * h;
    if (base >= r0 && base + 8 <= r1) {
        put8_full(yt + base, v, first);
        return;
    }
    float o[8];
    _mm256_storeu_ps(o, v);
    int i0 = (int)KWK_MAX((int64_t)0, r0 - base), i1 = (int)KWK_MIN((int64_t)8, r1 - base);
    for (int i = i0; i < i1; i++)
        yt[base + i] = first ? o[i] : yt[base + i] + o[i];
}

/* Block s of a tile: its sums of both halves (token j's in facc[h][j]) into y. */
INLINE void put_halves(const struct tile_args *a, int s, int T, __m256 facc[2][TT8])
{
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < T; j++)
            put8(a->y + (int64_t)j * a->ldy, a->rb[s], h, a->r0, a->r1, facc[h][j], a->first);
}

INLINE __m256 ld_half(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

INLINE void tile8_q8(const struct tile_args *a, int T, int NB)
{
#if !AVX2_TILES_VNNI
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
#endif
    __m256 facc[DEC_BLOCKS][2][TT8];
    zero_sums((__m256 *)facc, NB, T, TT8);
    for (int g = 0; g < a->ng; g++)
        for (int ib = 0; ib < NB; ib++) {
            const struct kwk_q8_block *b = a->blk[ib];
            __m256i acc[2][TT8];
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < T; j++)
                    /* VNNI: the stored w + 128 as it is, taken back out by starting at
                     * -128 * sum(h) (|acc| <= 32 * 255 * 127) */
                    acc[h][j] = AVX2_TILES_VNNI ? _mm256_set1_epi32(-128 * XS(a, j, g))
                                                : _mm256_setzero_si256();
            if (T == 1)
                prefetch_ahead(a, ib, g, sizeof(struct kwk_q8_block));
#if AVX2_TILES_VNNI
            for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++) {
                __m256i u[2];
                for (int h = 0; h < 2; h++)
                    u[h] = _mm256_loadu_si256((const __m256i *)b[g].q[k4][8 * h]);
                for (int j = 0; j < T; j++) {
                    __m256i xb = bcast4(XH(a, j) + g * KWK_Q8_GROUP + k4 * 4);
                    for (int h = 0; h < 2; h++) {
                        acc[h][j] = _mm256_dpbusd_avx_epi32(acc[h][j], u[h], xb);
                        KEEP(acc[h][j]);
                    }
                }
            }
#else
            for (int k4 = 0; k4 < KWK_Q8_GROUP / 4; k4++) {
                __m256i wv[2], aw[2];
                for (int h = 0; h < 2; h++) {
                    wv[h] = _mm256_xor_si256(
                        _mm256_loadu_si256((const __m256i *)b[g].q[k4][8 * h]), flip);
                    aw[h] = _mm256_abs_epi8(wv[h]);
                }
                for (int j = 0; j < T; j++) {
                    __m256i xb = bcast4(XH(a, j) + g * KWK_Q8_GROUP + k4 * 4);
                    for (int h = 0; h < 2; h++) {
                        __m256i p = _mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(xb, wv[h]));
                        acc[h][j] = _mm256_add_epi32(acc[h][j], _mm256_madd_epi16(p, ones));
                        KEEP(acc[h][j]);
                    }
                }
            }
#endif
            for (int h = 0; h < 2; h++) {
                __m256 dw = ld_half(b[g].d + 8 * h);
                for (int j = 0; j < T; j++) {
                    __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(XD(a, j, g)));
                    __m256 v = _mm256_cvtepi32_ps(acc[h][j]);
                    facc[ib][h][j] = _mm256_fmadd_ps(v, dd, facc[ib][h][j]);
                }
            }
        }
    for (int ib = 0; ib < NB; ib++)
        put_halves(a, ib, T, facc[ib]);
}

INLINE void tile8_q4(const struct tile_args *a, int T, int NB)
{
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 facc[DEC_BLOCKS][2][TT8];
    zero_sums((__m256 *)facc, NB, T, TT8);
    for (int g = 0; g < a->ng; g++)
        for (int ib = 0; ib < NB; ib++) {
            const struct kwk_q4_block *b = a->blk[ib];
            __m256i acc[2][TT8]; /* the group's sums: 16-bit (maddubs, bound above) or 32 */
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < T; j++)
                    acc[h][j] = _mm256_setzero_si256();
            if (T == 1)
                prefetch_ahead(a, ib, g, sizeof(struct kwk_q4_block));
            for (int c = 0; c < KWK_Q4_GROUP / 8; c++) {
                __m256i lo[2], hi[2];
                nib_halves(&b[g], c, m4, lo, hi);
                for (int j = 0; j < T; j++) {
                    const int8_t *xh = XH(a, j) + g * KWK_Q4_GROUP + 8 * c;
                    __m256i x0 = bcast4(xh), x1 = bcast4(xh + 4);
                    for (int h = 0; h < 2; h++)
                        nib_dot(&acc[h][j], lo[h], hi[h], x0, x1);
                }
            }
            for (int h = 0; h < 2; h++) {
                __m256 d = ld_half(b[g].d + 8 * h), m = ld_half(b[g].m + 8 * h);
                for (int j = 0; j < T; j++) {
                    __m256 s = _mm256_cvtepi32_ps(nib_sum(acc[h][j]));
                    __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(XD(a, j, g)));
                    facc[ib][h][j] = _mm256_fmadd_ps(s, dd, facc[ib][h][j]);
                    __m256 xm = _mm256_set1_ps(XM(a, j, g));
                    facc[ib][h][j] = _mm256_fmadd_ps(m, xm, facc[ib][h][j]);
                }
            }
        }
    for (int ib = 0; ib < NB; ib++)
        put_halves(a, ib, T, facc[ib]);
}

INLINE void tile8_q6(const struct tile_args *a, int T, int NB)
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
#if !AVX2_TILES_VNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    __m256 facc[DEC_BLOCKS][2][TT8];
    zero_sums((__m256 *)facc, NB, T, TT8);
    for (int g = 0; g < a->ng; g++)
        for (int ib = 0; ib < NB; ib++) {
            const struct kwk_q6_block *b = a->blk[ib];
            __m256i acc[2][TT8];
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < T; j++)
                    acc[h][j] = _mm256_setzero_si256();
            if (T == 1)
                prefetch_ahead(a, ib, g, sizeof(struct kwk_q6_block));
            for (int c = 0; c < KWK_Q6_GROUP / 8; c++) {
                __m256i lo[2], hi[2];
                for (int h = 0; h < 2; h++) {
                    __m256i p = _mm256_loadu_si256((const __m256i *)b[g].ql[c][8 * h]);
                    __m256i qh = _mm256_loadu_si256((const __m256i *)b[g].qh[c / 2][8 * h]);
                    lo[h] = _mm256_or_si256(_mm256_and_si256(p, m4),
                                             q6_high(qh, 2 * (c % 2), m30));
                    hi[h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p, 4), m4),
                                             q6_high(qh, 2 * (c % 2) + 1, m30));
                }
                for (int j = 0; j < T; j++) {
                    const int8_t *xh = XH(a, j) + g * KWK_Q6_GROUP + 8 * c;
                    __m256i x0 = bcast4(xh), x1 = bcast4(xh + 4);
                    for (int h = 0; h < 2; h++) {
#if AVX2_TILES_VNNI
                        acc[h][j] = _mm256_dpbusd_avx_epi32(acc[h][j], lo[h], x0);
                        acc[h][j] = _mm256_dpbusd_avx_epi32(acc[h][j], hi[h], x1);
#else
                        __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x0),
                                                     _mm256_maddubs_epi16(hi[h], x1));
                        acc[h][j] = _mm256_add_epi32(acc[h][j], _mm256_madd_epi16(s, ones));
#endif
                        KEEP(acc[h][j]);
                    }
                }
            }
            for (int h = 0; h < 2; h++) {
                __m256 dw = ld_half(b[g].d + 8 * h);
                for (int j = 0; j < T; j++) {
                    __m256i corr = _mm256_set1_epi32(32 * XS(a, j, g));
                    __m256 s = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[h][j], corr));
                    __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(XD(a, j, g)));
                    facc[ib][h][j] = _mm256_fmadd_ps(s, dd, facc[ib][h][j]);
                }
            }
        }
    for (int ib = 0; ib < NB; ib++)
        put_halves(a, ib, T, facc[ib]);
}

/* kwk_quant_act with 8-bit activations, vectorized with its arithmetic (127 / amax, x * id
 * rounded to nearest even by cvtps2dq; |f| <= 127 keeps the clamp idle): h only, and the
 * numbers of the epilogue, as avx512_quant.c's quant_act8: xd254 = 254 * d_x, xs = sum(h),
 * xm = d_x * (float)(254 * sum(h)). */
static void quant_act8(const float *x, int64_t n, int G, int8_t *xh, float *xd254, int32_t *xs,
                       float *xm)
{
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int64_t ng = (n + G - 1) / G;
    for (int64_t g = 0; g < ng; g++) {
        int64_t k0 = g * G;
        float pad[KWK_Q4_GROUP] = {0}; /* both groups are 32 */
        const float *xg = x + k0;
        if (n - k0 < G) {
            memcpy(pad, xg, sizeof(float) * (size_t)(n - k0));
            xg = pad;
        }
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int p = 0; p < 4; p++) {
            v[p] = _mm256_loadu_ps(xg + 8 * p);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sgn, v[p]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i h[4], sum = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            h[p] = _mm256_cvtps_epi32(_mm256_mul_ps(v[p], id));
            sum = _mm256_add_epi32(sum, h[p]);
        }
        __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(h[0], h[1]),
                                       _mm256_packs_epi32(h[2], h[3]));
        _mm256_storeu_si256((__m256i *)(xh + k0), _mm256_permutevar8x32_epi32(q, perm));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        int32_t hs = _mm_cvtsi128_si32(s4);
        float d = amax / (float)KWK_QX_SCALE;
        xd254[g] = 254.0f * d;
        xs[g] = hs;
        xm[g] = d * (float)(254 * hs);
    }
}

typedef void (*tile_fn)(const struct tile_args *);
/* tiles_F[T]: a row block for T tokens; dec_F: DEC_BLOCKS row blocks for one token. */
#define TILE(F, T)                                                                               \
    static void F##_##T(const struct tile_args *a) { F(a, T, 1); }
#define DEC(F)                                                                                   \
    static void dec_##F(const struct tile_args *a) { F(a, 1, DEC_BLOCKS); }
#define TILES(F)                                                                                 \
    TILE(F, 1) TILE(F, 2) DEC(F) static const tile_fn tiles_##F[TT + 1] = {NULL, F##_1, F##_2};
#if TT8 == 6
#define TILES8(F)                                                                                \
    TILE(F, 1) TILE(F, 2) TILE(F, 3) TILE(F, 4) TILE(F, 5) TILE(F, 6) DEC(F)                     \
    static const tile_fn tiles_##F[TT8 + 1] = {NULL, F##_1, F##_2, F##_3, F##_4, F##_5, F##_6};
#else
#define TILES8(F)                                                                                \
    TILE(F, 1) TILE(F, 2) TILE(F, 3) TILE(F, 4) DEC(F)                                           \
    static const tile_fn tiles_##F[TT8 + 1] = {NULL, F##_1, F##_2, F##_3, F##_4};
#endif
TILES(tile_q8)
TILES(tile_q4)
TILES(tile_q6)
TILES8(tile8_q8)
TILES8(tile8_q4)
TILES8(tile8_q6)

/* The weights' side of a product: tile functions, tile width and block size of w's format. */
struct fmt {
    const tile_fn *tiles;
    tile_fn dec;
    int tt;
    size_t bsz;
};

static struct fmt fmt_of(const struct kwk_mat *w)
{
    int a8 = w->act8 != 0;
    struct fmt f = {.tt = a8 ? TT8 : TT};
    f.tiles = w->wtype == KWK_W_Q8   ? (a8 ? tiles_tile8_q8 : tiles_tile_q8)
              : w->wtype == KWK_W_Q6 ? (a8 ? tiles_tile8_q6 : tiles_tile_q6)
                                     : (a8 ? tiles_tile8_q4 : tiles_tile_q4);
    f.dec = w->wtype == KWK_W_Q8   ? (a8 ? dec_tile8_q8 : dec_tile_q8)
            : w->wtype == KWK_W_Q6 ? (a8 ? dec_tile8_q6 : dec_tile_q6)
                                   : (a8 ? dec_tile8_q4 : dec_tile_q4);
    f.bsz = w->wtype == KWK_W_Q8   ? sizeof(struct kwk_q8_block)
            : w->wtype == KWK_W_Q6 ? sizeof(struct kwk_q6_block)
                                   : sizeof(struct kwk_q4_block);
    return f;
}

/* Decode (one token) is memory-bound. A decode tile takes DEC_BLOCKS adjacent row blocks group by
 * group (DEC_BLOCKS streams through one contiguous stretch of the matrix, as avx512_quant.c
 * reads), each stream asking for its block PF_GROUPS groups ahead and for the next tile's block
 * alongside. Session 15 (Zen 3) had cut a thread's row blocks into DEC_BLOCKS runs far apart
 * instead (17.6-17.9 -> 22.3-24.3 GB/s against one block at a time, bench_kernels quant 1 1
 * avx2); on Zen 5 the adjacent tiles with the next tile's prefetch measured, token by token
 * (KWKER_ISA=avx2 with AVX-VNNI, act8 unless noted, 2 rounds), 0.87-0.91 of the runs' time a
 * token on SmolLM2-360M balanced, 0.73-0.83 on 360M int4 (act16 0.81-0.84), 0.94-0.98 on 135M
 * balanced; with maddubs alike (docs/benchmarks.md, session 21). Zen 3 was not measured again.
 * Each block's sums are the same whichever tile computes it. */

/* Column pass [g0, g1) of nt tokens whose quantized activations x starts at (the view's row 0
 * is the block's first token, its column 0 the pass's first): every row block of [r0, r1); y is
 * the first token's output row. */
static void run_pass(const struct kwk_mat *w, const struct fmt *f, const struct kwk_qact *x, int nt,
                     int64_t g0, int64_t g1, float *y, long ldy, int64_t r0, int64_t r1)
{
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols);
    int64_t rb0 = r0 / KWK_QROWS, rb1 = (r1 + KWK_QROWS - 1) / KWK_QROWS;
    struct tile_args a = {
        .x = *x, .ng = (int)(g1 - g0), .ldy = ldy, .r0 = r0, .r1 = r1, .first = g0 == 0};
    const uint8_t *pass = (const uint8_t *)w->data + g0 * (int64_t)f->bsz;
    a.stride = (size_t)ng * f->bsz;
    a.pf = nt == 1 && (w->wtype != KWK_W_Q8 || kwk_cpu_prefetch_int8(KWK_ISA_AVX2));
    a.pf_l2 = nt == 1 && kwk_mat_prefetch_l2(w);
    if (nt == 1) {
        int64_t n_tiles = (rb1 - rb0) / DEC_BLOCKS;
        a.t = 0;
        a.y = y;
        for (int64_t i = 0; i < n_tiles; i++) {
            for (int s = 0; s < DEC_BLOCKS; s++) {
                a.rb[s] = rb0 + DEC_BLOCKS * i + s;
                a.blk[s] = pass + a.rb[s] * (int64_t)a.stride;
            }
            a.next = i + 1 < n_tiles ? DEC_BLOCKS * a.stride : 0;
            f->dec(&a);
        }
        for (int64_t rb = rb0 + DEC_BLOCKS * n_tiles; rb < rb1; rb++) { /* the rest, one stream */
            a.rb[0] = rb;
            a.blk[0] = pass + rb * (int64_t)a.stride;
            a.next = rb + 1 < rb1 ? a.stride : 0;
            f->tiles[1](&a);
        }
        return;
    }
    for (int64_t rb = rb0; rb < rb1; rb++) {
        a.blk[0] = pass + rb * (int64_t)a.stride;
        a.rb[0] = rb;
        for (int t = 0; t < nt; t += f->tt) {
            a.t = t;
            a.y = y + (int64_t)t * ldy;
            f->tiles[KWK_MIN(f->tt, nt - t)](&a);
        }
    }
}

void TILES_ENTRY(kwk_quant_matmul)(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                                   long ldy, int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
#if !AVX2_TILES_VNNI
    if (kwk_cpu_avxvnni()) {
        kwk_quant_matmul_avxvnni(w, x, n_tok, y, ldy, r0, r1);
        return;
    }
#endif
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
                    kwk_quant_act(xt, nk, G, qx.q[j], qx.l[j], qx.d[j], qx.s[j]);
            }
            run_pass(w, &f, &view, nt, g0, g1, y + (int64_t)tb * ldy, ldy, r0, r1);
        }
    }
}

#if !AVX2_TILES_VNNI
/* One quantization for both instances: the activations' numbers do not depend on the tiles. */
void kwk_quant_rows_avx2(const float *x, const struct kwk_qact *qa, int t0, int t1)
{
    for (int t = t0; t < t1; t++) {
        const float *xt = x + (int64_t)t * qa->cols;
        long oh = (long)t * qa->ldh, og = (long)t * qa->ldg;
        if (qa->act8)
            quant_act8(xt, qa->cols, KWK_QACT_GROUP, qa->h + oh, qa->d + og, qa->s + og,
                       qa->m + og);
        else
            kwk_quant_act(xt, qa->cols, KWK_QACT_GROUP, qa->h + oh, qa->l + oh, qa->d + og,
                          qa->s + og);
    }
}

#endif

void TILES_ENTRY(kwk_quant_matmul_q)(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok,
                                     float *y, long ldy, int64_t r0, int64_t r1)
{
    if (r1 <= r0 || n_tok <= 0)
        return;
#if !AVX2_TILES_VNNI
    if (kwk_cpu_avxvnni()) {
        kwk_quant_matmul_q_avxvnni(w, qa, n_tok, y, ldy, r0, r1);
        return;
    }
#endif
    struct fmt f = fmt_of(w);
    int G = kwk_quant_group(w->wtype);
    int64_t ng = kwk_quant_n_groups(w->wtype, w->cols), gc = KWK_QX_COLS / G;
    for (int tb = 0; tb < n_tok; tb += KWK_QX_TOKS) {
        int nt = KWK_MIN(KWK_QX_TOKS, n_tok - tb);
        for (int64_t g0 = 0; g0 < ng; g0 += gc) {
            int64_t g1 = KWK_MIN(ng, g0 + gc);
            struct kwk_qact view = kwk_qact_at(qa, tb, g0);
            run_pass(w, &f, &view, nt, g0, g1, y + (int64_t)tb * ldy, ldy, r0, r1);
        }
    }
}
