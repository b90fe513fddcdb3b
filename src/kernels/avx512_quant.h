/* avx512_quant.h - what the AVX-512 VNNI tiles (avx512_quant.c) and the AMX ones (amx_quant.c)
 * share: unpacking the int4 and int6 blocks' weight vectors (quant.h's layouts), storing a row
 * block's sums, and the AMX pass the VNNI kernel hands its whole 16-token tiles to. Include only
 * from files compiled with AVX-512 F/BW. */
#ifndef KWK_AVX512_QUANT_H
#define KWK_AVX512_QUANT_H

#include <immintrin.h>

#include "kernels/quant.h"

#define KWK_INLINE static inline __attribute__((always_inline))

KWK_INLINE __mmask16 lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* Store (first pass) or add the 16 row sums of block rb for one token, rows [r0, r1) only. */
KWK_INLINE void put(float *yt, int64_t rb, int64_t r0, int64_t r1, __m512 v, int first)
{
    int64_t base = rb * KWK_QROWS;
    __mmask16 m = lanes(r1 - base) & (__mmask16)~lanes(r0 - base);
    if (!first)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, yt + base));
    _mm512_mask_storeu_ps(yt + base, m, v);
}

/* The high bits of slice 4h + t of a qh vector at bits 4-5 of each byte (quant.h): a 16-bit
 * shift moves bits 2t, 2t+1 there; what crosses a byte boundary falls outside 0x30. */
KWK_INLINE __m512i q6_high(__m512i qh, int t, __m512i m30)
{
    __m512i v = t == 0 ? _mm512_slli_epi16(qh, 4)
                : t == 1 ? _mm512_slli_epi16(qh, 2)
                : t == 2 ? qh
                         : _mm512_srli_epi16(qh, 2);
    return _mm512_and_si512(v, m30);
}

/* The two weight vectors of step c (columns 8c..8c+3 and 8c+4..8c+7) of group g of a nibble
 * format's row block: int4's nibbles, or int6's with the high bits or'ed on (q6). */
KWK_INLINE void nib_unpack(const void *blk, int q6, int g, int c, __m512i m4, __m512i m30,
                           __m512i *lo, __m512i *hi)
{
    if (!q6) {
        __m512i p = _mm512_loadu_si512(((const struct kwk_q4_block *)blk)[g].q[c]);
        *lo = _mm512_and_si512(p, m4);
        *hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), m4);
        return;
    }
    const struct kwk_q6_block *b = (const struct kwk_q6_block *)blk + g;
    __m512i p = _mm512_loadu_si512(b->ql[c]), h = _mm512_loadu_si512(b->qh[c / 2]);
    *lo = _mm512_or_si512(_mm512_and_si512(p, m4), q6_high(h, 2 * (c % 2), m30));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p, 4), m4),
                          q6_high(h, 2 * (c % 2) + 1, m30));
}

/* Tokens [0, nt) (nt a multiple of KWK_AMX_TOKS) of column pass [g0, g1) on AMX: rows [r0, r1)
 * of y (token 0's output row; the first pass (g0 = 0) stores, later ones add), x seen from the
 * first token and the pass's first column as in the VNNI tiles. The same integer sums as the
 * VNNI tiles and the same float epilogue in the same order: bit for bit their numbers. Only
 * where kwk_cpu_amx(). */
#define KWK_AMX_TOKS 16
void kwk_quant_pass_amx(const struct kwk_mat *w, const struct kwk_qact *x, int nt, int64_t g0,
                        int64_t g1, float *y, long ldy, int64_t r0, int64_t r1);

#endif
