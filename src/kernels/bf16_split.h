/* bf16_split.h - what preserve's AMX kernels (amx_bf16.c, amx_bf16t.c) share: a float's three
 * bf16 parts (bf16t.h defines them) and lane masks, in AVX-512. Include only from files compiled
 * with AVX-512. */
#ifndef KWK_BF16_SPLIT_H
#define KWK_BF16_SPLIT_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define BF16_SPLIT_INLINE static inline __attribute__((always_inline))

/* The word index of each element's high half in a pair of vectors: permuting by it gathers 32
 * floats' bf16 (their high halves) into one vector, in order. */
static const _Alignas(64) uint16_t HIGH_HALVES[32] = {
    1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
    33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

BF16_SPLIT_INLINE __mmask16 lanes16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

BF16_SPLIT_INLINE __mmask32 lanes32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xffffffffu : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1u);
}

/* v rounded to bf16 (nearest even), as a float whose low 16 bits are zero. Integer arithmetic,
 * so no AVX512_BF16 instruction is needed here; NaN is the caller's. */
BF16_SPLIT_INLINE __m512 bf16_round(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
}

/* v = p1 + p2 + p3, each a bf16 value (a float with low 16 bits zero). NaN stays NaN in p1 (a
 * rounding could carry its payload into -0); an infinite p1 (v infinite, or beyond bf16's
 * largest finite 3.39e38) gets zero parts, so that an infinite product is not made NaN by an
 * inf - inf. */
BF16_SPLIT_INLINE void split3(__m512 v, __m512 *p1, __m512 *p2, __m512 *p3)
{
    __m512 a = bf16_round(v);
    a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_ps(NAN));
    __mmask16 fin = _mm512_cmp_ps_mask(_mm512_abs_ps(a), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
    __m512 r = _mm512_maskz_sub_ps(fin, v, a);
    __m512 b = bf16_round(r);
    *p1 = a;
    *p2 = b;
    *p3 = _mm512_sub_ps(r, b);
}

/* The bf16 of 32 floats with low halves zero (lo: elements 0-15, hi: 16-31) as 16 pairs. */
BF16_SPLIT_INLINE __m512i pairs(__m512 lo, __m512 hi, __m512i idx)
{
    return _mm512_permutex2var_epi16(_mm512_castps_si512(lo), idx, _mm512_castps_si512(hi));
}

#endif
