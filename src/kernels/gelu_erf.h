/* gelu_erf.h - the polynomials of the SIMD tables' exact GELU, x Phi(x) = x (1 + erf(x / sqrt2))
 * / 2 (BERT's "gelu"; ref.c calls erff). With z = x / sqrt2 and a = |z|: where a <= 1, erf(z) = z
 * P(z^2), P of degree 6 fitted on [0, 1]; beyond, erfc(a) = exp(-a^2) G(1/a - GELU_U0), G of
 * degree 10 fitted on a in [1, 10], and Phi = 1 - erfc(a) / 2 for z > 0, erfc(a) / 2 for z < 0
 * (so no 1 - erf cancels where x is negative). exp(-a^2) is taken from x, not from z rounded:
 * a^2 = x^2 / 2 = s + e exactly (e from an FMA), exp(-a^2) = exp(-s) (1 - e); through z it would
 * be off by 1e-5 of itself near a = 8. Past a = 10 (erfc below the float range) G's argument is
 * clamped. P and G evaluated in float32 by Horner's rule are within 1.5e-7 and 4e-7 of their
 * functions (a few ulp); test_kernels' test_gelu holds every table to 2e-6 of the exact GELU. */
#ifndef KWK_GELU_ERF_H
#define KWK_GELU_ERF_H

#define GELU_P_DEG 6
static const float gelu_p[GELU_P_DEG + 1] = {
    1.128379225730896f,    -0.3761262893676758f,    0.11283634603023529f,  -0.0268560703843832f,
    0.005192957818508148f, -0.0008053751080296934f, 8.006874122656882e-05f};

#define GELU_G_DEG 10
#define GELU_U0 0.55f
#define GELU_A_MAX 10.0f
static const float gelu_g[GELU_G_DEG + 1] = {
    0.27629438042640686f,   0.40883415937423706f,  -0.18123500049114227f, 0.03372581675648689f,
    0.044982682913541794f,  -0.06933865696191788f, 0.05674082785844803f,  -0.025435633957386017f,
    -0.017880160361528397f, 0.062361717224121094f, -0.05193132162094116f};

#endif
