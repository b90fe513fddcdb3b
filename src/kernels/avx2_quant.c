/* avx2_quant.c - the int8, int4 and int6 matmul with AVX2 (maddubs + madd): each 16-row block as
 * two registers of 8 rows, activations quantized on the fly to 16 bits as two int8 halves (or to
 * 8 bits, one pass, when kwk_mat.act8 says so), its body in avx2_tiles.h (shared with the
 * AVX-VNNI instance, avxvnni_quant.c); and packing's scale search, 8 rows at once. Pure
 * functions; any thread. Computes the integers of quant_ref.c exactly; float sums agree to
 * rounding (fused multiply-adds); packing gives quant_ref.c's bytes exactly. */
#define AVX2_TILES_VNNI 0
#include "kernels/avx2_tiles.h"

/* ---- packing: the scale search of 8 rows at once -----------------------------------------------
 * The AVX2 twin of avx512_quant.c's packer: one row per lane, the scalar functions' float
 * operations in their order, so every byte is the same (see there). */

typedef __m256 vf;

INLINE vf sel(vf a, vf b, vf mask) /* mask ? b : a */
{
    return _mm256_blendv_ps(a, b, mask);
}

/* round_clamp of quant_ref.c: NaN to 0, clamp to [-lim, lim], round to nearest even. */
INLINE vf round_clamp8(vf x, vf lim, vf nlim)
{
    vf ord = _mm256_cmp_ps(x, x, _CMP_ORD_Q);
    vf c = _mm256_min_ps(_mm256_max_ps(x, nlim), lim);
    return _mm256_and_ps(_mm256_round_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), ord);
}

/* kwk_f16_to_f32(kwk_f32_to_f16(f)) lane by lane: the hardware's nearest-even conversion, with
 * kwk_f32_to_f16's saturation to +-65504 and its NaN (sign | 0x7e00, as a float). */
INLINE vf half8(vf f)
{
    const vf sgn = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
    vf s = _mm256_and_ps(f, sgn), a = _mm256_andnot_ps(sgn, f);
    vf r = _mm256_cvtph_ps(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    r = sel(r, _mm256_or_ps(s, _mm256_set1_ps(65504.0f)),
            _mm256_cmp_ps(a, _mm256_set1_ps(65504.0f), _CMP_GT_OQ));
    vf qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    return sel(r, _mm256_or_ps(s, qnan), _mm256_cmp_ps(f, f, _CMP_UNORD_Q));
}

INLINE vf ldw8(const float *w, int k)
{
    return _mm256_loadu_ps(w + KWK_QROWS * k);
}

/* sym_err of quant_ref.c: int8 (lim 127) or the int6 code (lim 32, then <= 31). */
INLINE vf sym_err8(const float *w, int n, vf d, int q6)
{
    const vf zero = _mm256_setzero_ps(), top = _mm256_set1_ps(31.0f);
    const vf lim = _mm256_set1_ps(q6 ? 32.0f : 127.0f), nlim = _mm256_sub_ps(zero, lim);
    vf nz = q6 ? _mm256_cmp_ps(d, zero, _CMP_NEQ_UQ) : _mm256_cmp_ps(d, zero, _CMP_GT_OQ);
    vf id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), nz), e = zero;
    for (int k = 0; k < n; k++) {
        vf q = round_clamp8(_mm256_mul_ps(ldw8(w, k), id), lim, nlim);
        if (q6)
            q = _mm256_min_ps(q, top);
        vf r = _mm256_sub_ps(_mm256_mul_ps(d, q), ldw8(w, k));
        e = _mm256_add_ps(e, _mm256_mul_ps(r, r));
    }
    return e;
}

/* fit_q8 (q6 = 0) and fit_q6 (q6 = 1) of quant_ref.c. */
static vf fit_sym8(const float *w, int n, int q6)
{
    const vf zero = _mm256_setzero_ps(), top = _mm256_set1_ps(31.0f);
    const vf lim = _mm256_set1_ps(q6 ? 32.0f : 127.0f), nlim = _mm256_sub_ps(zero, lim);
    const vf sgn = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
    vf amax = zero, wmax = zero, sww = zero;
    for (int k = 0; k < n; k++) {
        vf x = ldw8(w, k), a = _mm256_andnot_ps(sgn, x);
        vf gt = _mm256_cmp_ps(a, amax, _CMP_GT_OQ);
        amax = sel(amax, a, gt);
        wmax = sel(wmax, x, gt);
        sww = _mm256_add_ps(sww, _mm256_mul_ps(x, x));
    }
    /* int8: amax / 127; int6: -wmax / 32 (-0 for 0) */
    vf d0 = q6 ? _mm256_div_ps(_mm256_xor_ps(wmax, sgn), _mm256_set1_ps(32.0f))
               : _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
    vf bd = half8(d0), best = sym_err8(w, n, bd, q6);
    vf live = _mm256_cmp_ps(amax, zero, _CMP_GT_OQ);
    for (int s = -8; s <= 24 && _mm256_movemask_ps(live) && n > 1; s++) {
        if (s == 0)
            continue;
        vf id = q6 ? _mm256_div_ps(_mm256_set1_ps(-(32.0f + 0.125f * (float)s)), wmax)
                   : _mm256_div_ps(_mm256_set1_ps(127.0f + 0.25f * (float)s), amax);
        vf sqq = zero, sqw = zero;
        for (int k = 0; k < n; k++) {
            vf x = ldw8(w, k), fq = round_clamp8(_mm256_mul_ps(x, id), lim, nlim);
            if (q6)
                fq = _mm256_min_ps(fq, top);
            sqq = _mm256_add_ps(sqq, _mm256_mul_ps(fq, fq));
            sqw = _mm256_add_ps(sqw, _mm256_mul_ps(fq, x));
        }
        vf ok = _mm256_and_ps(live, _mm256_cmp_ps(sqq, zero, _CMP_GT_OQ));
        ok = _mm256_and_ps(ok, q6 ? _mm256_cmp_ps(sqw, zero, _CMP_NEQ_UQ)
                                  : _mm256_cmp_ps(sqw, zero, _CMP_GT_OQ));
        vf d = half8(_mm256_div_ps(sqw, sqq));
        /* sww - 2 d sqw + d d sqq, in the scalar expression's order */
        vf e = _mm256_sub_ps(sww, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f), d), sqw));
        e = _mm256_add_ps(e, _mm256_mul_ps(_mm256_mul_ps(d, d), sqq));
        vf up = _mm256_and_ps(ok, _mm256_cmp_ps(e, best, _CMP_LT_OQ));
        best = sel(best, e, up);
        bd = sel(bd, d, up);
    }
    return bd;
}

/* q4_err of quant_ref.c. */
INLINE vf q4_err8(const float *w, int n, vf d, vf m)
{
    const vf zero = _mm256_setzero_ps(), lim = _mm256_set1_ps(15.0f);
    const vf nlim = _mm256_set1_ps(-15.0f);
    vf pos = _mm256_cmp_ps(d, zero, _CMP_GT_OQ);
    vf id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), pos), e = zero;
    for (int k = 0; k < n; k++) {
        vf x = ldw8(w, k);
        vf q = round_clamp8(_mm256_mul_ps(_mm256_sub_ps(x, m), id), lim, nlim);
        q = _mm256_max_ps(q, zero); /* -0 and 0 give the same float products */
        vf r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(d, q), m), x);
        e = _mm256_add_ps(e, _mm256_mul_ps(r, r));
    }
    return e;
}

/* fit_q4 of quant_ref.c. */
static void fit_q4_8(const float *w, int n, vf *d_out, vf *m_out)
{
    const vf zero = _mm256_setzero_ps(), lim = _mm256_set1_ps(15.0f);
    const vf nlim = _mm256_set1_ps(-15.0f), fn = _mm256_set1_ps((float)n);
    vf mn = n > 0 ? ldw8(w, 0) : zero, mx = mn;
    for (int k = 1; k < n; k++) {
        mn = _mm256_min_ps(ldw8(w, k), mn); /* w < mn ? w : mn */
        mx = _mm256_max_ps(ldw8(w, k), mx);
    }
    vf range = _mm256_sub_ps(mx, mn);
    vf bd = half8(_mm256_div_ps(range, _mm256_set1_ps(15.0f))), bm = half8(mn);
    vf best = q4_err8(w, n, bd, bm);
    vf live = _mm256_cmp_ps(mx, mn, _CMP_GT_OQ);
    for (int s = -4; s <= 4 && _mm256_movemask_ps(live) && n > 1; s++) {
        if (s == 0)
            continue;
        vf id = _mm256_div_ps(_mm256_set1_ps(15.0f + 0.1f * (float)s), range);
        vf sq = zero, sqq = zero, sw = zero, sqw = zero;
        for (int k = 0; k < n; k++) {
            vf x = ldw8(w, k);
            vf fq = round_clamp8(_mm256_mul_ps(_mm256_sub_ps(x, mn), id), lim, nlim);
            fq = _mm256_max_ps(fq, zero);
            sq = _mm256_add_ps(sq, fq);
            sqq = _mm256_add_ps(sqq, _mm256_mul_ps(fq, fq));
            sw = _mm256_add_ps(sw, x);
            sqw = _mm256_add_ps(sqw, _mm256_mul_ps(fq, x));
        }
        vf det = _mm256_sub_ps(_mm256_mul_ps(fn, sqq), _mm256_mul_ps(sq, sq));
        vf d = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(fn, sqw), _mm256_mul_ps(sq, sw)), det);
        vf m = _mm256_div_ps(_mm256_sub_ps(sw, _mm256_mul_ps(d, sq)), fn);
        vf ok = _mm256_and_ps(live, _mm256_cmp_ps(det, zero, _CMP_NLE_UQ));
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(d, zero, _CMP_GT_OQ));
        if (!_mm256_movemask_ps(ok))
            continue;
        vf hd = half8(d), hm = half8(m);
        vf e = q4_err8(w, n, hd, hm);
        vf up = _mm256_and_ps(ok, _mm256_cmp_ps(e, best, _CMP_LT_OQ));
        best = sel(best, e, up);
        bd = sel(bd, hd, up);
        bm = sel(bm, hm, up);
    }
    *d_out = bd;
    *m_out = bm;
}

/* Rows h*8 .. h*8+7 of the group (w, q at stride 16). */
static void fit_rows8(int wtype, const float *w, int n, float *d, float *m, int8_t *q)
{
    const vf zero = _mm256_setzero_ps();
    vf dv, mv = zero;
    if (wtype == KWK_W_Q4)
        fit_q4_8(w, n, &dv, &mv);
    else
        dv = fit_sym8(w, n, wtype == KWK_W_Q6);
    _mm256_storeu_ps(d, dv);
    _mm256_storeu_ps(m, mv);
    /* kwk_quant_code */
    float lim = wtype == KWK_W_Q8 ? 127.0f : wtype == KWK_W_Q6 ? 32.0f : 15.0f;
    const vf vl = _mm256_set1_ps(lim), nvl = _mm256_set1_ps(-lim);
    vf nz = wtype == KWK_W_Q6 ? _mm256_cmp_ps(dv, zero, _CMP_NEQ_UQ)
                              : _mm256_cmp_ps(dv, zero, _CMP_GT_OQ);
    vf id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), dv), nz);
    for (int k = 0; k < n; k++) {
        vf x = wtype == KWK_W_Q4 ? _mm256_sub_ps(ldw8(w, k), mv) : ldw8(w, k);
        vf c = round_clamp8(_mm256_mul_ps(x, id), vl, nvl);
        if (wtype == KWK_W_Q4)
            c = _mm256_max_ps(c, zero);
        if (wtype == KWK_W_Q6)
            c = _mm256_min_ps(c, _mm256_set1_ps(31.0f));
        int32_t v[8];
        _mm256_storeu_si256((__m256i *)v, _mm256_cvtps_epi32(c));
        for (int i = 0; i < 8; i++)
            q[KWK_QROWS * k + i] = (int8_t)v[i];
    }
}

void kwk_quant_fit_rows_avx2(int wtype, const float *w, int n, float *d, float *m, int8_t *q)
{
    fit_rows8(wtype, w, n, d, m, q);
    fit_rows8(wtype, w + 8, n, d + 8, m + 8, q + 8);
}
