/* test_quant.c - the int8 / int4 / int6 formats: half conversion, packing round trips and their
 * error bound, fit + code + pack_codes against packing, the AVX-512 packer against the scalar one
 * and the packer as it was, and every kernel table's quantized matmul against the scalar
 * reference (exactly on data whose float parts are exact, to rounding on random data), on odd
 * shapes, row ranges and 1-4 pool threads, with 16-bit and with 8-bit activations (kwk_mat.act8:
 * the reference against quant.h's specification, act8 against 16 bits on int8-grid activations,
 * batch invariance, error against the float product), and the two-step matmul_q (activations
 * quantized once) against matmul; the AVX2 kernels' AVX-VNNI instance against their maddubs one;
 * kwk_mat_rows_span against where packing writes each block of rows, and kwk_mat_decode_spans
 * (where each table's one-token product starts reading). */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/pool.h"
#include "kernels/bf16t.h"
#include "kernels/kernels.h"
#include "kernels/panel.h"
#include "kernels/quant.h"
#define T_RNG_SEED 0x9e3779b97f4a7c15ull
#include "test.h"


static const char *wname(int wt)
{
    return wt == KWK_W_Q8 ? "q8" : wt == KWK_W_Q6 ? "q6" : "q4";
}

/* Pack rows x cols floats into a new aligned buffer; data->cols == cols. */
static struct kwk_mat pack(int wt, const float *src, int64_t rows, int64_t cols)
{
    size_t bytes;
    struct kwk_mat m = {.wtype = wt, .rows = rows, .cols = cols, .data = NULL};
    if (kwk_quant_bytes(wt, rows, cols, &bytes))
        return m;
    void *data = kwk_malloc_aligned(bytes ? bytes : 64);
    for (int64_t rb = 0; rb * KWK_QROWS < rows; rb++)
        kwk_quant_pack_rows(wt, data, rows, cols, rb, src + rb * KWK_QROWS * cols, (long)cols);
    m.data = data;
    return m;
}

static void test_f16(void)
{
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u)
            continue; /* inf and NaN: scales never are */
        if (kwk_f32_to_f16(kwk_f16_to_f32((uint16_t)h)) != h)
            bad++;
    }
    T_EQ(bad, 0);
    /* ties to even between two halves, and rounding up into the next binade */
    T_EQ(kwk_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);
    T_EQ(kwk_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);
    T_EQ(kwk_f32_to_f16(2.0f - 1.0f / 4096.0f), 0x4000);
    T_EQ(kwk_f32_to_f16(1e9f), 0x7bff);
}

/* Every format: every dequantized weight is within one step of the original (int8: amax / 127;
 * int6: two of amax / 31; int4: (max - min) / 15; plus the half rounding of scale and offset):
 * the least-squares fits may clip an extreme value by up to a step. int4's squared error over
 * the matrix is below that of plain rounding to the [min, max] grid (step^2 / 12 a weight). */
static void test_round_trip(int wt, int64_t rows, int64_t cols)
{
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = t_frand(-1.0f, 1.0f) * (i % 7 == 0 ? 3.0f : 1.0f);
    struct kwk_mat m = pack(wt, w, rows, cols);
    float *out = malloc(sizeof(float) * (size_t)cols);
    int G = kwk_quant_group(wt);
    long bad = 0;
    double worst = 0.0, se = 0.0, se_grid = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        kwk_quant_mat_row_ref(&m, r, out);
        for (int64_t k0 = 0; k0 < cols; k0 += G) {
            int64_t k1 = KWK_MIN(cols, k0 + G);
            float mn = w[r * cols + k0], mx = mn, amax = 0.0f;
            for (int64_t k = k0; k < k1; k++) {
                float v = w[r * cols + k];
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
                amax = fabsf(v) > amax ? fabsf(v) : amax;
            }
            double step = wt == KWK_W_Q8   ? amax / 127.0
                          : wt == KWK_W_Q6 ? amax / 31.0
                                           : (mx - mn) / 15.0;
            /* int6's range is one code shorter on one side, which may clip by one step more */
            double bound = step * (wt == KWK_W_Q6 ? 2.0 : 1.0) * (1 + 1e-5) + 1e-7;
            if (wt == KWK_W_Q4)
                bound += (fabs(mn) + 15 * step) / 1024.0; /* half rounding of d and m */
            else
                bound += amax / 1024.0; /* half rounding of d */
            for (int64_t k = k0; k < k1; k++) {
                double e = fabs((double)out[k] - w[r * cols + k]);
                worst = e / step > worst ? e / step : worst;
                bad += e > bound;
                se += e * e;
                se_grid += step * step / 12.0;
            }
        }
    }
    T_CHECK(bad == 0, "%s %lldx%lld: %ld weights beyond the error bound (worst %.3f steps)",
            wname(wt), (long long)rows, (long long)cols, bad, worst);
    T_CHECK(wt != KWK_W_Q4 || se < se_grid,
            "%s %lldx%lld: squared error %.4g not below plain rounding's %.4g",
            wname(wt), (long long)rows, (long long)cols, se, se_grid);
    if (rows * cols > 10000)
        printf("  %s %lldx%lld: RMS error / RMS of plain rounding %.3f\n", wname(wt),
               (long long)rows, (long long)cols, sqrt(se / se_grid));
    kwk_free_aligned((void *)m.data);
    free(out);
    free(w);
}

/* The activation quantizer: exact for values already on the int8 grid (h = x, l = 0), sums of v,
 * padding and zero groups; on random data v = 254 h + l with h the int8 rounding, |l| <= 127,
 * and v * d within half a step of x. */
static void test_act(void)
{
    float x[130];
    int8_t q[192], l[192];
    float d[3];
    int32_t s[3];
    for (int i = 0; i < 130; i++)
        x[i] = (float)((i * 37) % 255 - 127);
    x[5] = 127.0f;
    x[64] = -127.0f;
    x[128] = 127.0f;
    kwk_quant_act(x, 130, 64, q, l, d, s);
    long bad = 0, sum0 = 0;
    for (int i = 0; i < 128; i++)
        bad += q[i] != (int8_t)x[i] || l[i] != 0;
    for (int i = 0; i < 64; i++)
        sum0 += 254 * q[i];
    T_EQ(bad, 0);
    T_EQ(s[0], sum0);
    T_NEAR(d[0], 127.0f / 32258.0f, 0.0f);
    T_NEAR(d[2], 127.0f / 32258.0f, 0.0f);
    bad += q[128] != 127 || q[129] != (int8_t)x[129];
    for (int i = 130; i < 192; i++)
        bad += q[i] != 0 || l[i] != 0; /* padding past n */
    T_EQ(bad, 0);
    float r[96];
    for (int i = 0; i < 96; i++)
        r[i] = t_frand(-3.0f, 3.0f) * (i % 17 == 0 ? 10.0f : 1.0f);
    kwk_quant_act(r, 96, 32, q, l, d, s);
    long off = 0;
    double worst = 0.0;
    for (int g = 0; g < 3; g++) {
        float amax = 0.0f;
        int32_t sum = 0;
        for (int i = 32 * g; i < 32 * g + 32; i++)
            amax = fabsf(r[i]) > amax ? fabsf(r[i]) : amax;
        for (int i = 32 * g; i < 32 * g + 32; i++) {
            int v = 254 * q[i] + l[i];
            sum += v;
            off += q[i] != (int)nearbyintf(r[i] * (127.0f / amax)) || l[i] == -128;
            double e = fabs((double)v * d[g] - r[i]) / d[g];
            worst = e > worst ? e : worst;
        }
        off += sum != s[g];
        T_NEAR(d[g], amax / 32258.0f, 0.0f);
    }
    T_EQ(off, 0);
    T_CHECK(worst <= 0.5 + 1e-3, "activation error %.4f steps of v (<= 0.5)", worst);
    float z[40] = {0};
    kwk_quant_act(z, 40, 32, q, l, d, s);
    T_NEAR(d[0], 0.0f, 0.0f);
    T_EQ(s[1], 0);
}

/* Weights and activations on their integer grids (each group holds its extreme values, so every
 * scale is a power of two): every float product of every kernel is exact and the sums run in
 * the same order, so the tables must give the reference's numbers bit for bit. That checks the
 * integer dot products exactly. With 8-bit activations (act8) the SIMD kernels fold the 254 of
 * v = 254 h into the scale, exact only while |254 * isum_h| <= 2^24 (quant.h): the weights
 * other than the two extremes are kept small enough for that (int8 |q| <= 8: (254 + 30 * 8) *
 * 127 * 254 < 2^24; int6 |q| <= 12; int4 any: 32 * 15 * 127 * 254 < 2^24). */
static void fill_exact(int wt, float *w, int64_t rows, int64_t cols, float *x, int n_tok,
                       int act8)
{
    int G = kwk_quant_group(wt);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++) {
            int64_t kg = k % G;
            float v = wt == KWK_W_Q8   ? (float)((int)(t_rnd() % 255) - 127)
                      : wt == KWK_W_Q6 ? (float)((int)(t_rnd() % 64) - 32)
                                       : (float)((int)(t_rnd() % 16) - 8);
            if (act8 && wt == KWK_W_Q8)
                v = (float)((int)(t_rnd() % 17) - 8);
            if (act8 && wt == KWK_W_Q6)
                v = (float)((int)(t_rnd() % 25) - 12);
            if (kg == 0)
                v = wt == KWK_W_Q8 ? 127.0f : wt == KWK_W_Q6 ? -32.0f : -8.0f;
            if (kg == 1)
                v = wt == KWK_W_Q8 ? -127.0f : wt == KWK_W_Q6 ? 31.0f : 7.0f;
            w[r * cols + k] = v;
        }
    /* activations: v / 256 for integers |v| <= KWK_QX_SCALE, each group holding the largest,
     * quantize back to exactly v with the scale 1 / 256 */
    for (int t = 0; t < n_tok; t++)
        for (int64_t k = 0; k < cols; k++) {
            int v = (int)(t_rnd() % (2 * KWK_QX_SCALE + 1)) - KWK_QX_SCALE;
            v = k % G == 0 ? KWK_QX_SCALE : v;
            x[t * cols + k] = (float)v / 256.0f;
        }
}

static void fill_random(float *w, int64_t rows, int64_t cols, float *x, int n_tok)
{
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = t_frand(-0.1f, 0.1f) + (i % 13 == 0 ? 0.2f : 0.0f);
    for (int64_t i = 0; i < (int64_t)n_tok * cols; i++)
        x[i] = t_frand(-2.0f, 2.0f) * (i % 29 == 0 ? 8.0f : 1.0f);
}

static const char *mode_name(int exact)
{
    return exact ? "exact" : "random";
}

/* One kernel table against the reference on one shape and row range, in the activation mode
 * act8 (kwk_mat.act8). */
static void check_table(const struct kwk_kernels *k, int wt, int64_t rows, int64_t cols,
                        int n_tok, int64_t r0, int64_t r1, int exact, int act8)
{
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
    if (exact)
        fill_exact(wt, w, rows, cols, x, n_tok, act8);
    else
        fill_random(w, rows, cols, x, n_tok);
    struct kwk_mat m = pack(wt, w, rows, cols);
    m.act8 = act8;
    long ldy = (long)rows + 3;
    size_t ny = (size_t)n_tok * (size_t)ldy;
    float *yr = malloc(sizeof(float) * ny), *yk = malloc(sizeof(float) * ny);
    for (size_t i = 0; i < ny; i++)
        yr[i] = yk[i] = -7.0f; /* sentinel: outside [r0, r1) stays */
    kwk_kernels_ref.matmul(&m, x, n_tok, yr, ldy, r0, r1);
    k->matmul(&m, x, n_tok, yk, ldy, r0, r1);
    /* tolerance: float rounding of sums of |w x| over the row */
    float *row = malloc(sizeof(float) * (size_t)cols);
    long bad = 0, outside = 0;
    double worst = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        kwk_quant_mat_row_ref(&m, r, row);
        for (int t = 0; t < n_tok; t++) {
            size_t i = (size_t)t * (size_t)ldy + (size_t)r;
            if (r < r0 || r >= r1) {
                outside += yk[i] != -7.0f || yr[i] != -7.0f;
                continue;
            }
            double mag = 0.0;
            for (int64_t c = 0; c < cols; c++)
                mag += fabs((double)row[c] * x[(size_t)t * (size_t)cols + (size_t)c]);
            double e = fabs((double)yk[i] - yr[i]);
            double tol = exact ? 0.0 : 1e-5 * mag + 1e-6;
            worst = mag > 0 && e / mag > worst ? e / mag : worst;
            bad += !(e <= tol);
        }
    }
    T_CHECK(bad == 0 && outside == 0,
            "%s %s %s act%d rows=%lld cols=%lld n_tok=%d [%lld,%lld): %ld differ (worst rel %.3g), "
            "%ld written outside the range",
            k->name, wname(wt), mode_name(exact), act8 ? 8 : 16, (long long)rows,
            (long long)cols, n_tok,
            (long long)r0, (long long)r1, bad, worst, outside);
    kwk_free_aligned((void *)m.data);
    free(w);
    free(x);
    free(yr);
    free(yk);
    free(row);
}

/* Tables of the CPU's instruction sets (lower ones when KWKER_ISA says so). */
static int tables(const struct kwk_kernels **out)
{
    int n = 0;
    out[n++] = &kwk_kernels_ref;
    if (kwk_isa() >= KWK_ISA_AVX2)
        out[n++] = &kwk_kernels_avx2;
    if (kwk_isa() >= KWK_ISA_AVX512)
        out[n++] = &kwk_kernels_avx512;
    return n;
}

static void test_kernels_vs_ref(int act8)
{
    static const int64_t rows_list[] = {1, 15, 16, 17, 37, 70};
    static const int64_t cols_list[] = {32, 64, 96, 200, 576};
    static const int toks_list[] = {1, 2, 5, 6, 7, 13, 33};
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    const struct kwk_kernels *tabs[3];
    int nt = tables(tabs);
    for (int ti = 0; ti < nt; ti++)
        for (int wi = 0; wi < 3; wi++)
            for (int exact = 0; exact < 2; exact++) {
                for (size_t a = 0; a < KWK_ARRAY_LEN(rows_list); a++)
                    for (size_t b = 0; b < KWK_ARRAY_LEN(cols_list); b++)
                        for (size_t c = 0; c < KWK_ARRAY_LEN(toks_list); c++) {
                            int64_t rows = rows_list[a], cols = cols_list[b];
                            if (exact && cols % kwk_quant_group(wts[wi]))
                                continue; /* partial groups cannot hold both extremes */
                            check_table(tabs[ti], wts[wi], rows, cols, toks_list[c], 0, rows,
                                        exact, act8);
                            if (rows > 2)
                                check_table(tabs[ti], wts[wi], rows, cols, toks_list[c], 1,
                                            rows - 1, exact, act8);
                            if (rows >= 37)
                                check_table(tabs[ti], wts[wi], rows, cols, toks_list[c], 17,
                                            33, exact, act8);
                        }
                /* several column passes, token blocks past KWK_QX_TOKS, tokens 1..33 */
                check_table(tabs[ti], wts[wi], 33, 4160, 3, 0, 33, exact, act8);
                check_table(tabs[ti], wts[wi], 21, 2112, 30, 5, 21, exact, act8);
                for (int n = 1; n <= 33; n++)
                    check_table(tabs[ti], wts[wi], 19, 128, n, 0, 19, exact, act8);
            }
}

/* Two instances of one table's entries (matmul, matmul_q over rows quantized by quant_rows) give
 * the same bits: every format, both activation modes, the given token counts, a partial row range
 * and several column passes. */
typedef void (*matmul_fn)(const struct kwk_mat *, const float *, int, float *, long, int64_t,
                          int64_t);
typedef void (*matmul_q_fn)(const struct kwk_mat *, const struct kwk_qact *, int, float *, long,
                            int64_t, int64_t);
typedef void (*quant_rows_fn)(const float *, const struct kwk_qact *, int, int);
static void same_bits(const char *what, matmul_fn mm_a, matmul_fn mm_b, matmul_q_fn mq_a,
                      matmul_q_fn mq_b, quant_rows_fn quant_rows, const int *toks, int n_toks)
{
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    static const int64_t shapes[][2] = {{16, 32}, {70, 200}, {139, 576}, {53, 4160}};
    for (int act8 = 0; act8 < 2; act8++)
        for (int wi = 0; wi < 3; wi++)
            for (size_t si = 0; si < KWK_ARRAY_LEN(shapes); si++)
                for (int ti = 0; ti < n_toks; ti++) {
                    int64_t rows = shapes[si][0], cols = shapes[si][1];
                    int n = toks[ti];
                    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
                    float *x = malloc(sizeof(float) * (size_t)(n * cols));
                    fill_random(w, rows, cols, x, n);
                    struct kwk_mat m = pack(wts[wi], w, rows, cols);
                    m.act8 = act8;
                    size_t ny = (size_t)n * (size_t)rows;
                    float *ya = calloc(ny, sizeof(float)), *yb = calloc(ny, sizeof(float));
                    float *qa_ya = calloc(ny, sizeof(float)), *qa_yb = calloc(ny, sizeof(float));
                    int64_t r0 = rows > 20 ? 16 : 0, r1 = rows > 20 ? rows - 3 : rows;
                    mm_a(&m, x, n, ya, (long)rows, r0, r1);
                    mm_b(&m, x, n, yb, (long)rows, r0, r1);
                    struct kwk_qact qa;
                    void *mem = kwk_malloc_aligned(kwk_qact_bytes(cols, n));
                    kwk_qact_init(&qa, mem, cols, n, act8);
                    quant_rows(x, &qa, 0, n);
                    mq_a(&m, &qa, n, qa_ya, (long)rows, r0, r1);
                    mq_b(&m, &qa, n, qa_yb, (long)rows, r0, r1);
                    T_CHECK(memcmp(ya, yb, sizeof(float) * ny) == 0 &&
                                memcmp(qa_ya, qa_yb, sizeof(float) * ny) == 0,
                            "%s act%d %lldx%lld n_tok=%d: %s sums differ", wname(wts[wi]),
                            act8 ? 8 : 16, (long long)rows, (long long)cols, n, what);
                    kwk_free_aligned(mem);
                    kwk_free_aligned((void *)m.data);
                    free(w);
                    free(x);
                    free(ya);
                    free(yb);
                    free(qa_ya);
                    free(qa_yb);
                }
}

/* The AVX2 kernels' AVX-VNNI instance (avxvnni_quant.c) against the maddubs one: the same bits,
 * decode and prompt tiles. The AVX2 entries run maddubs only under KWKER_AVXVNNI=off (ctest runs
 * this binary so too); otherwise both sides are the VNNI tiles and this only checks that the
 * entries agree. Skipped, and said, on a CPU without AVX-VNNI. */
static void test_avxvnni_same_bits(void)
{
    if (kwk_isa() < KWK_ISA_AVX2 || !t_cpu_avxvnni()) {
        printf("test_quant: no AVX-VNNI here (or KWKER_ISA below avx2): VNNI tiles not compared\n");
        return;
    }
    printf("test_quant: AVX-VNNI tiles against the AVX2 entry (%s)\n",
           kwk_cpu_avxvnni() ? "itself VNNI: KWKER_AVXVNNI=off compares maddubs" : "maddubs");
    static const int toks[] = {1, 2, 5, 7, 13, 30};
    same_bits("AVX-VNNI and AVX2", kwk_quant_matmul_avx2, kwk_quant_matmul_avxvnni,
              kwk_quant_matmul_q_avx2, kwk_quant_matmul_q_avxvnni, kwk_quant_rows_avx2, toks,
              (int)KWK_ARRAY_LEN(toks));
}

/* The AVX-512 entries with and without AMX. */
static void mm_amx(const struct kwk_mat *w, const float *x, int n, float *y, long ldy, int64_t r0,
                   int64_t r1)
{
    kwk_quant_matmul_avx512_amx(w, x, n, y, ldy, r0, r1, 1);
}
static void mm_vnni(const struct kwk_mat *w, const float *x, int n, float *y, long ldy, int64_t r0,
                    int64_t r1)
{
    kwk_quant_matmul_avx512_amx(w, x, n, y, ldy, r0, r1, 0);
}
static void mq_amx(const struct kwk_mat *w, const struct kwk_qact *qa, int n, float *y, long ldy,
                   int64_t r0, int64_t r1)
{
    kwk_quant_matmul_q_avx512_amx(w, qa, n, y, ldy, r0, r1, 1);
}
static void mq_vnni(const struct kwk_mat *w, const struct kwk_qact *qa, int n, float *y, long ldy,
                    int64_t r0, int64_t r1)
{
    kwk_quant_matmul_q_avx512_amx(w, qa, n, y, ldy, r0, r1, 0);
}

/* The AMX prompt tiles (amx_quant.c) against the AVX-512 VNNI ones: the same bits, token counts
 * on and off the 16-token tiles (the rest runs on VNNI) and token blocks past 128. Skipped, and
 * said, where kwk_cpu_amx() is 0 (no AMX, KWKER_AMX=off or KWKER_ISA below avx512). */
static void test_amx_same_bits(void)
{
    if (!kwk_cpu_amx()) {
        printf("test_quant: AMX not in use here (%s): AMX tiles not compared\n",
               t_cpu_amx() ? "KWKER_AMX=off, KWKER_ISA below avx512 or the OS refused it"
                           : "the CPU has no AMX-INT8");
        return;
    }
    printf("test_quant: AMX tiles against AVX-512 VNNI\n");
    static const int toks[] = {16, 17, 31, 32, 47, 130, 161};
    same_bits("AMX and VNNI", mm_amx, mm_vnni, mq_amx, mq_vnni, kwk_quant_rows_avx512, toks,
              (int)KWK_ARRAY_LEN(toks));
}

/* Token t's outputs are bitwise the same alone, in a batch, and over any row split (how
 * threads divide the rows). */
static void test_batch_invariance(int act8)
{
    const struct kwk_kernels *tabs[3];
    int nt = tables(tabs);
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    /* 53 rows: 4 row blocks, one decode tile; 139: 9 blocks, two tiles and a rest of 1 */
    static const int64_t row_counts[] = {53, 139};
    for (int ti = 0; ti < nt; ti++)
        for (int wi = 0; wi < 6; wi++) {
            int64_t rows = row_counts[wi / 3], cols = 4160;
            int n_tok = 29;
            float *w = malloc(sizeof(float) * (size_t)(rows * cols));
            float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
            fill_random(w, rows, cols, x, n_tok);
            struct kwk_mat m = pack(wts[wi % 3], w, rows, cols);
            m.act8 = act8;
            float *yb = malloc(sizeof(float) * (size_t)(n_tok * rows));
            float *y1 = malloc(sizeof(float) * (size_t)rows);
            tabs[ti]->matmul(&m, x, n_tok, yb, (long)rows, 0, rows);
            long diff = 0;
            for (int t = 0; t < n_tok; t++) {
                const float *xt = x + (size_t)t * (size_t)cols;
                tabs[ti]->matmul(&m, xt, 1, y1, (long)rows, 0, 16);
                tabs[ti]->matmul(&m, xt, 1, y1, (long)rows, 16, 21);
                tabs[ti]->matmul(&m, xt, 1, y1, (long)rows, 21, rows);
                diff += memcmp(y1, yb + (size_t)t * (size_t)rows,
                               sizeof(float) * (size_t)rows) != 0;
            }
            T_CHECK(diff == 0, "%s %s act%d %lld rows: %ld tokens differ alone vs in a batch",
                    tabs[ti]->name, wname(wts[wi % 3]), act8 ? 8 : 16, (long long)rows, diff);
            /* all row blocks at once: both decodes take them as tiles of 4 adjacent ones, the rest
             * one at a time (AVX2) */
            diff = 0;
            for (int t = 0; t < n_tok; t++) {
                tabs[ti]->matmul(&m, x + (size_t)t * (size_t)cols, 1, y1, (long)rows, 0, rows);
                diff += memcmp(y1, yb + (size_t)t * (size_t)rows,
                               sizeof(float) * (size_t)rows) != 0;
            }
            T_CHECK(diff == 0, "%s %s act%d %lld rows: %ld tokens differ alone (all rows) vs in "
                    "a batch", tabs[ti]->name, wname(wts[wi % 3]), act8 ? 8 : 16,
                    (long long)rows, diff);
            /* the same tokens at other positions of a smaller batch, other row splits */
            float *y2 = malloc(sizeof(float) * (size_t)(n_tok * rows));
            tabs[ti]->matmul(&m, x + 3 * cols, n_tok - 3, y2, (long)rows, 0, 37);
            tabs[ti]->matmul(&m, x + 3 * cols, n_tok - 3, y2, (long)rows, 37, rows);
            T_CHECK(memcmp(y2, yb + 3 * rows, sizeof(float) * (size_t)((n_tok - 3) * rows)) == 0,
                    "%s %s act%d %lld rows: tokens 3.. differ in a batch starting at token 3",
                    tabs[ti]->name, wname(wts[wi % 3]), act8 ? 8 : 16, (long long)rows);
            free(y2);
            kwk_free_aligned((void *)m.data);
            free(w);
            free(x);
            free(yb);
            free(y1);
        }
}

/* Threads of a pool split the rows in 16-row blocks, as the runtime does; every thread count
 * gives the one-call numbers bit for bit. */
struct mt_job {
    const struct kwk_kernels *k;
    const struct kwk_mat *m;
    const float *x;
    int n_tok;
    float *y;
};

static void mt_run(void *ctx, int ith, int nth)
{
    const struct mt_job *j = ctx;
    int64_t nb = (j->m->rows + KWK_QROWS - 1) / KWK_QROWS;
    int64_t b0 = nb * ith / nth, b1 = nb * (ith + 1) / nth;
    int64_t r0 = b0 * KWK_QROWS, r1 = KWK_MIN(j->m->rows, b1 * KWK_QROWS);
    if (r1 > r0)
        j->k->matmul(j->m, j->x, j->n_tok, j->y, (long)j->m->rows, r0, r1);
}

static void test_threads(int act8)
{
    const struct kwk_kernels *tabs[3];
    int nt = tables(tabs);
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    int64_t rows = 83, cols = 2080;
    int n_tok = 7;
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
    float *y1 = malloc(sizeof(float) * (size_t)(n_tok * rows));
    float *yn = malloc(sizeof(float) * (size_t)(n_tok * rows));
    fill_random(w, rows, cols, x, n_tok);
    for (int ti = 0; ti < nt; ti++)
        for (int wi = 0; wi < 3; wi++) {
            struct kwk_mat m = pack(wts[wi], w, rows, cols);
            m.act8 = act8;
            tabs[ti]->matmul(&m, x, n_tok, y1, (long)rows, 0, rows);
            for (int n_threads = 1; n_threads <= 4; n_threads++) {
                struct kwk_pool *pool = kwk_pool_new(n_threads);
                struct mt_job j = {tabs[ti], &m, x, n_tok, yn};
                memset(yn, 0, sizeof(float) * (size_t)(n_tok * rows));
                kwk_pool_run(pool, mt_run, &j);
                kwk_pool_free(pool);
                T_CHECK(memcmp(y1, yn, sizeof(float) * (size_t)(n_tok * rows)) == 0,
                        "%s %s act%d: %d threads differ from one call", tabs[ti]->name,
                        wname(wts[wi]), act8 ? 8 : 16, n_threads);
            }
            kwk_free_aligned((void *)m.data);
        }
    free(w);
    free(x);
    free(y1);
    free(yn);
}

/* Activations quantized once (quant_rows, in two pieces as two threads would) and read by
 * matmul_q give matmul's numbers bit for bit, for every format from the one quantization, over
 * several column passes, token blocks, partial groups and row ranges; the AVX2 and AVX-512
 * tables keep the same numbers (either matmul_q may read the other's). */
static void test_matmul_q(int act8)
{
    static const int64_t shapes[][3] = {{53, 4160, 29}, {37, 200, 5},   {16, 95, 1},
                                        {70, 576, 33},  {19, 2048, 24}, {5, 31, 2}};
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    const struct kwk_kernels *tabs[3];
    int nt = tables(tabs);
    for (size_t si = 0; si < KWK_ARRAY_LEN(shapes); si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1];
        int n_tok = (int)shapes[si][2];
        float *w = malloc(sizeof(float) * (size_t)(rows * cols));
        float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
        float *y0 = malloc(sizeof(float) * (size_t)(n_tok * rows));
        float *y1 = malloc(sizeof(float) * (size_t)(n_tok * rows));
        size_t qbytes = kwk_qact_bytes(cols, n_tok);
        void *mem[3] = {0};
        struct kwk_qact qa[3];
        fill_random(w, rows, cols, x, n_tok);
        for (int ti = 0; ti < nt; ti++) {
            mem[ti] = kwk_malloc_aligned(qbytes);
            memset(mem[ti], 0x5a, qbytes); /* padding must be written, not found */
            kwk_qact_init(&qa[ti], mem[ti], cols, n_tok, act8);
            int half = n_tok / 2;
            tabs[ti]->quant_rows(x, &qa[ti], half, n_tok);
            tabs[ti]->quant_rows(x, &qa[ti], 0, half);
            for (int wi = 0; wi < 3; wi++) {
                struct kwk_mat m = pack(wts[wi], w, rows, cols);
                m.act8 = act8;
                tabs[ti]->matmul(&m, x, n_tok, y0, (long)rows, 0, rows);
                memset(y1, 0, sizeof(float) * (size_t)(n_tok * rows));
                int64_t cut = rows > 16 ? 16 : rows;
                tabs[ti]->matmul_q(&m, &qa[ti], n_tok, y1, (long)rows, 0, cut);
                tabs[ti]->matmul_q(&m, &qa[ti], n_tok, y1, (long)rows, cut, rows);
                T_CHECK(memcmp(y0, y1, sizeof(float) * (size_t)(n_tok * rows)) == 0,
                        "%s %s act%d %lldx%lld, %d tokens: matmul_q differs from matmul",
                        tabs[ti]->name, wname(wts[wi]), act8 ? 8 : 16, (long long)rows,
                        (long long)cols, n_tok);
                kwk_free_aligned((void *)m.data);
            }
        }
        /* AVX2 and AVX-512 (tables 1 and 2) keep the same numbers */
        for (int ti = 2; ti < nt; ti++) {
            int same = 1;
            for (int t = 0; t < n_tok; t++) {
                long oh = (long)t * qa[1].ldh, og = (long)t * qa[1].ldg;
                same &= memcmp(qa[1].h + oh, qa[ti].h + oh, (size_t)qa[1].ldh) == 0;
                if (!act8)
                    same &= memcmp(qa[1].l + oh, qa[ti].l + oh, (size_t)qa[1].ldh) == 0;
                same &= memcmp(qa[1].d + og, qa[ti].d + og, 4 * (size_t)qa[1].ldg) == 0;
                same &= memcmp(qa[1].s + og, qa[ti].s + og, 4 * (size_t)qa[1].ldg) == 0;
                if (act8)
                    same &= memcmp(qa[1].m + og, qa[ti].m + og, 4 * (size_t)qa[1].ldg) == 0;
            }
            T_CHECK(same, "%s vs avx2 act%d %lldx%lld: quant_rows keep different numbers",
                    tabs[ti]->name, act8 ? 8 : 16, (long long)rows, (long long)cols);
        }
        for (int ti = 0; ti < nt; ti++)
            kwk_free_aligned(mem[ti]);
        free(w);
        free(x);
        free(y0);
        free(y1);
    }
}

/* ---- 8-bit activations ---------------------------------------------------------------------- */

/* Code k of group g of row r, read from the blocks as quant.h lays them out. */
static int code_at(const struct kwk_mat *m, int64_t r, int64_t g, int k, float *d, float *mn)
{
    int64_t ng = kwk_quant_n_groups(m->wtype, m->cols), idx = (r / KWK_QROWS) * ng + g;
    int i = (int)(r % KWK_QROWS), j = k % 4;
    *mn = 0.0f;
    if (m->wtype == KWK_W_Q8) {
        const struct kwk_q8_block *b = (const struct kwk_q8_block *)m->data + idx;
        *d = kwk_f16_to_f32(b->d[i]);
        return (int)b->q[k / 4][i][j] - 128;
    }
    if (m->wtype == KWK_W_Q4) {
        const struct kwk_q4_block *b = (const struct kwk_q4_block *)m->data + idx;
        *d = kwk_f16_to_f32(b->d[i]);
        *mn = kwk_f16_to_f32(b->m[i]);
        return b->q[k / 8][i][j] >> (k % 8 >= 4 ? 4 : 0) & 15;
    }
    const struct kwk_q6_block *b = (const struct kwk_q6_block *)m->data + idx;
    int sl = k / 4;
    *d = kwk_f16_to_f32(b->d[i]);
    int lo = b->ql[sl / 2][i][j] >> 4 * (sl % 2) & 15, hi = b->qh[sl / 4][i][j] >> 2 * (sl % 4) & 3;
    return (lo | hi << 4) - 32;
}

/* The act8 specification of quant.h, stated apart from quant_ref.c: the 16-bit quantization of
 * each column pass with the low halves taken as zero (v = 254 h, xs = 254 sum(h)), then
 * quant.h's group formulas, groups summed in order within a pass and passes added in order. */
static float spec_act8(const struct kwk_mat *m, int64_t r, const float *xt)
{
    int G = kwk_quant_group(m->wtype);
    int64_t ng = kwk_quant_n_groups(m->wtype, m->cols), gc = KWK_QX_COLS / G;
    static int8_t xh[KWK_QX_COLS], xl[KWK_QX_COLS];
    float xd[KWK_QX_COLS / 32], y = 0.0f;
    int32_t xs[KWK_QX_COLS / 32];
    for (int64_t g0 = 0; g0 < ng; g0 += gc) {
        int64_t g1 = KWK_MIN(ng, g0 + gc);
        kwk_quant_act(xt + g0 * G, KWK_MIN(m->cols, g1 * G) - g0 * G, G, xh, xl, xd, xs);
        float s = 0.0f;
        for (int64_t g = g0; g < g1; g++) {
            int64_t j = g - g0;
            int32_t isum = 0, hs = 0;
            float d = 0.0f, mn = 0.0f;
            for (int k = 0; k < G; k++) {
                int h = xh[j * G + k];
                hs += h;
                isum += code_at(m, r, g, k, &d, &mn) * 254 * h;
            }
            s += (float)isum * (d * xd[j]);
            if (m->wtype == KWK_W_Q4)
                s += mn * (xd[j] * (float)(254 * hs));
        }
        y += s;
    }
    return y;
}

/* The reference's act8 matmul is the specification bit for bit (odd shapes, several column
 * passes, a row range); the SIMD tables' agreement with it is check_table's. */
static void test_act8_spec(void)
{
    static const int64_t shapes[][2] = {{1, 32}, {17, 33}, {35, 200}, {21, 2112}, {18, 4160}};
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    for (size_t si = 0; si < KWK_ARRAY_LEN(shapes); si++)
        for (int wi = 0; wi < 3; wi++) {
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            int n_tok = 3;
            float *w = malloc(sizeof(float) * (size_t)(rows * cols));
            float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
            float *y = malloc(sizeof(float) * (size_t)(n_tok * rows));
            fill_random(w, rows, cols, x, n_tok);
            struct kwk_mat m = pack(wts[wi], w, rows, cols);
            m.act8 = 1;
            int64_t r0 = rows > 2 ? 1 : 0;
            kwk_kernels_ref.matmul(&m, x, n_tok, y, (long)rows, r0, rows);
            long bad = 0;
            for (int t = 0; t < n_tok; t++)
                for (int64_t r = r0; r < rows; r++) {
                    float e = spec_act8(&m, r, x + t * cols);
                    bad += memcmp(&e, &y[t * rows + r], sizeof e) != 0;
                }
            T_CHECK(bad == 0, "%s %lldx%lld: %ld act8 outputs of the reference differ from the "
                    "specification", wname(wts[wi]), (long long)rows, (long long)cols, bad);
            kwk_free_aligned((void *)m.data);
            free(w);
            free(x);
            free(y);
        }
}

/* Activations already on the int8 grid (integers, each group holding +-127) have no low halves:
 * 8-bit and 16-bit activations then give the same numbers, bit for bit in the reference and to
 * float rounding in the SIMD tables (which fold the 254 into the scale in act8). */
static void test_act8_grid(void)
{
    const struct kwk_kernels *tabs[3];
    int nt = tables(tabs);
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    int64_t rows = 37, cols = 2144;
    int n_tok = 9;
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
    float *y16 = malloc(sizeof(float) * (size_t)(n_tok * rows));
    float *y8 = malloc(sizeof(float) * (size_t)(n_tok * rows));
    fill_random(w, rows, cols, x, n_tok);
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = i % 32 == 0 ? 127.0f : (float)((int)(t_rnd() % 255) - 127);
    for (int ti = 0; ti < nt; ti++)
        for (int wi = 0; wi < 3; wi++) {
            struct kwk_mat m = pack(wts[wi], w, rows, cols);
            tabs[ti]->matmul(&m, x, n_tok, y16, (long)rows, 0, rows);
            m.act8 = 1;
            tabs[ti]->matmul(&m, x, n_tok, y8, (long)rows, 0, rows);
            long bad = 0;
            double mag = 0.0;
            for (int64_t i = 0; i < n_tok * rows; i++)
                mag = fabs((double)y16[i]) > mag ? fabs((double)y16[i]) : mag;
            for (int64_t i = 0; i < n_tok * rows; i++) {
                double e = fabs((double)y8[i] - y16[i]);
                bad += ti == 0 ? e != 0.0 : !(e <= 1e-5 * mag);
            }
            T_CHECK(bad == 0, "%s %s: %ld outputs differ between act8 and 16 bits on int8-grid "
                    "activations", tabs[ti]->name, wname(wts[wi]), bad);
            kwk_free_aligned((void *)m.data);
        }
    free(w);
    free(x);
    free(y16);
    free(y8);
}

/* The quantized product stays close to the float product of the original weights: relative RMS
 * error over outputs well under the format's step (int8 about 0.5%, int4 several %). 8-bit
 * activations add their own rounding (a step of amax / 127 a value, about 0.4% RMS on these
 * uniform activations): act8's error stays under the same limits plus 1%, and act8 differs from
 * the 16-bit result by less than 1% RMS, on every table. */
static void test_accuracy(void)
{
    int64_t rows = 64, cols = 576;
    int n_tok = 4;
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    float *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = t_frand(-1.0f, 1.0f) * t_frand(0.0f, 1.0f);
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = t_frand(-1.0f, 1.0f);
    double *ref = malloc(sizeof(double) * (size_t)(n_tok * rows));
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < rows; r++) {
            double v = 0.0;
            for (int64_t k = 0; k < cols; k++)
                v += (double)w[r * cols + k] * x[t * cols + k];
            ref[t * rows + r] = v;
        }
    const struct kwk_kernels *tabs[3];
    int nt = tables(tabs);
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    static const double limits[] = {0.01, 0.1, 0.03};
    float *y[2];
    y[0] = malloc(sizeof(float) * (size_t)(n_tok * rows));
    y[1] = malloc(sizeof(float) * (size_t)(n_tok * rows));
    for (int ti = 0; ti < nt; ti++)
        for (int wi = 0; wi < 3; wi++) {
            struct kwk_mat m = pack(wts[wi], w, rows, cols);
            double rel[2], se01 = 0.0, ss = 0.0;
            for (int a8 = 0; a8 < 2; a8++) {
                m.act8 = a8;
                tabs[ti]->matmul(&m, x, n_tok, y[a8], (long)rows, 0, rows);
                double se = 0.0;
                ss = 0.0;
                for (int64_t i = 0; i < n_tok * rows; i++) {
                    se += (y[a8][i] - ref[i]) * (y[a8][i] - ref[i]);
                    ss += ref[i] * ref[i];
                }
                rel[a8] = sqrt(se / ss);
            }
            for (int64_t i = 0; i < n_tok * rows; i++)
                se01 += ((double)y[1][i] - y[0][i]) * ((double)y[1][i] - y[0][i]);
            double d01 = sqrt(se01 / ss);
            printf("  %s %s: relative RMS error of the product %.4f (16-bit activations), %.4f "
                   "(8-bit); act8 vs 16-bit %.4f\n",
                   tabs[ti]->name, wname(wts[wi]), rel[0], rel[1], d01);
            T_CHECK(rel[0] < limits[wi], "%s %s relative RMS error %.4f < %.3f", tabs[ti]->name,
                    wname(wts[wi]), rel[0], limits[wi]);
            T_CHECK(rel[1] < limits[wi] + 0.01, "%s %s act8 relative RMS error %.4f < %.3f",
                    tabs[ti]->name, wname(wts[wi]), rel[1], limits[wi] + 0.01);
            T_CHECK(d01 > 1e-4 && d01 < 0.01, "%s %s act8 vs 16-bit: relative RMS %.4f in "
                    "(1e-4, 0.01)", tabs[ti]->name, wname(wts[wi]), d01);
            kwk_free_aligned((void *)m.data);
        }
    free(y[0]);
    free(y[1]);
    free(ref);
    free(w);
    free(x);
}

/* kwk_quant_pack_rows is fit + code + pack_codes, byte for byte (GPTQ relies on it), on odd
 * shapes with codes at a stride wider than the row; every dequantized weight is d * code + m
 * exactly, with d and m as kwk_quant_fit returns them. */
static void test_fit_code_pack(int wt, int64_t rows, int64_t cols)
{
    int G = kwk_quant_group(wt);
    int64_t ng = kwk_quant_n_groups(wt, cols);
    long ldq = (long)cols + 5;
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = t_frand(-1.0f, 1.0f) * (i % 11 == 0 ? 4.0f : 1.0f) + (i % 3 == 0 ? 0.3f : 0.0f);
    for (int64_t k = 0; k < cols && rows > 2; k++)
        w[2 * cols + k] = 0.0f; /* an all-zero row */
    struct kwk_mat a = pack(wt, w, rows, cols);
    size_t bytes;
    kwk_quant_bytes(wt, rows, cols, &bytes);
    void *b = kwk_malloc_aligned(bytes ? bytes : 64);
    memset(b, 0x5a, bytes);
    int8_t *q = malloc((size_t)KWK_QROWS * (size_t)ldq);
    float *d = malloc(sizeof(float) * KWK_QROWS * (size_t)ng);
    float *m = malloc(sizeof(float) * KWK_QROWS * (size_t)ng);
    float *row = malloc(sizeof(float) * (size_t)cols);
    long off = 0;
    for (int64_t rb = 0; rb * KWK_QROWS < rows; rb++) {
        int n_rows = (int)KWK_MIN((int64_t)KWK_QROWS, rows - rb * KWK_QROWS);
        for (int i = 0; i < n_rows; i++) {
            const float *wr = w + (rb * KWK_QROWS + i) * cols;
            for (int64_t g = 0; g < ng; g++) {
                int n = (int)KWK_MIN((int64_t)G, cols - g * G);
                float *dp = d + i * ng + g, *mp = m + i * ng + g;
                kwk_quant_fit(wt, wr + g * G, n, dp, mp);
                for (int k = 0; k < n; k++)
                    q[i * ldq + g * G + k] = (int8_t)kwk_quant_code(wt, wr[g * G + k], *dp, *mp);
            }
        }
        kwk_quant_pack_codes(wt, b, rows, cols, rb, q, ldq, d, m);
        for (int i = 0; i < n_rows; i++) {
            kwk_quant_mat_row_ref(&a, rb * KWK_QROWS + i, row);
            for (int64_t k = 0; k < cols; k++) {
                int64_t p = i * ng + k / G;
                off += row[k] != d[p] * (float)q[i * ldq + k] + m[p];
            }
        }
    }
    T_CHECK(memcmp(a.data, b, bytes) == 0, "%s %lldx%lld: pack_rows != fit + code + pack_codes",
            wname(wt), (long long)rows, (long long)cols);
    T_CHECK(off == 0, "%s %lldx%lld: %ld weights are not d * code + m", wname(wt),
            (long long)rows, (long long)cols, off);
    kwk_free_aligned((void *)a.data);
    kwk_free_aligned(b);
    free(w);
    free(q);
    free(d);
    free(m);
    free(row);
}

/* Dequantization error of each format on Gaussian rows (groups of 32), relative to the RMS of
 * the weights: each added bit should about halve it (int8 and int6 symmetric, int4 with an
 * offset). The figures are printed for the record. */
static void test_gauss_error(void)
{
    int64_t rows = 128, cols = 1024;
    float *w = malloc(sizeof(float) * (size_t)(rows * cols));
    float *out = malloc(sizeof(float) * (size_t)cols);
    double ss = 0.0;
    for (int64_t i = 0; i < rows * cols; i++) {
        float u1 = t_frand(1e-7f, 1.0f), u2 = t_frand(0.0f, 1.0f);
        w[i] = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
        ss += (double)w[i] * w[i];
    }
    static const int wts[] = {KWK_W_Q8, KWK_W_Q6, KWK_W_Q4};
    double rel[3];
    for (int wi = 0; wi < 3; wi++) {
        struct kwk_mat m = pack(wts[wi], w, rows, cols);
        double se = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            kwk_quant_mat_row_ref(&m, r, out);
            for (int64_t k = 0; k < cols; k++)
                se += ((double)out[k] - w[r * cols + k]) * ((double)out[k] - w[r * cols + k]);
        }
        rel[wi] = sqrt(se / ss);
        printf("  gaussian rows, %s: RMS error / RMS weight %.5f\n", wname(wts[wi]), rel[wi]);
        kwk_free_aligned((void *)m.data);
    }
    T_CHECK(rel[0] * 3.0 < rel[1] && rel[1] * 3.0 < rel[2],
            "errors q8 %.5f, q6 %.5f, q4 %.5f: each two bits at least 3x less", rel[0], rel[1],
            rel[2]);
    free(w);
    free(out);
}

/* ---- packing speed-ups keep every byte ----------------------------------------------------------
 * The packer before its AVX-512 scale search (pack_q8_row / pack_q4_row as they were), kept here
 * as the reference: kwk_quant_pack_rows must give its bytes exactly on any data. */

static int old_round_clamp(float x, float lim)
{
    if (!(x == x))
        return 0;
    x = x > lim ? lim : x < -lim ? -lim : x;
    const float big = 12582912.0f;
    return (int)((x + big) - big);
}

static float old_q8_err(const float *w, int64_t n, float d, int8_t *q)
{
    float id = d > 0.0f ? 1.0f / d : 0.0f, e = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        q[k] = (int8_t)old_round_clamp(w[k] * id, 127.0f);
        float r = d * (float)q[k] - w[k];
        e += r * r;
    }
    return e;
}

static void old_pack_q8_row(struct kwk_q8_block *b, int i, const float *w, int64_t n)
{
    float amax = 0.0f, sww = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        amax = fabsf(w[k]) > amax ? fabsf(w[k]) : amax;
        sww += w[k] * w[k];
    }
    int8_t q[KWK_Q8_GROUP] = {0};
    uint16_t bd = kwk_f32_to_f16(amax / 127.0f);
    float best = old_q8_err(w, n, kwk_f16_to_f32(bd), q);
    for (int s = -8; s <= 24 && amax > 0.0f && n > 1; s++) {
        if (s == 0)
            continue;
        float id = (127.0f + 0.25f * (float)s) / amax;
        float sqq = 0.0f, sqw = 0.0f;
        for (int64_t k = 0; k < n; k++) {
            float fq = (float)old_round_clamp(w[k] * id, 127.0f);
            sqq += fq * fq;
            sqw += fq * w[k];
        }
        if (!(sqq > 0.0f) || !(sqw > 0.0f))
            continue;
        uint16_t hd = kwk_f32_to_f16(sqw / sqq);
        float d = kwk_f16_to_f32(hd), e = sww - 2.0f * d * sqw + d * d * sqq;
        if (e < best) {
            best = e;
            bd = hd;
        }
    }
    b->d[i] = bd;
    old_q8_err(w, n, kwk_f16_to_f32(bd), q);
    for (int k = 0; k < KWK_Q8_GROUP; k++)
        b->q[k / 4][i][k % 4] = (uint8_t)((k < n ? q[k] : 0) + 128);
}

static float old_q4_err(const float *w, int64_t n, float d, float m, uint8_t *q)
{
    float id = d > 0.0f ? 1.0f / d : 0.0f, e = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        int v = old_round_clamp((w[k] - m) * id, 15.0f);
        q[k] = (uint8_t)(v < 0 ? 0 : v);
        float r = d * (float)q[k] + m - w[k];
        e += r * r;
    }
    return e;
}

static void old_pack_q4_row(struct kwk_q4_block *b, int i, const float *w, int64_t n)
{
    float mn = n > 0 ? w[0] : 0.0f, mx = mn;
    for (int64_t k = 1; k < n; k++) {
        mn = w[k] < mn ? w[k] : mn;
        mx = w[k] > mx ? w[k] : mx;
    }
    uint8_t q[KWK_Q4_GROUP];
    uint16_t bd = kwk_f32_to_f16((mx - mn) / 15.0f), bm = kwk_f32_to_f16(mn);
    float best = old_q4_err(w, n, kwk_f16_to_f32(bd), kwk_f16_to_f32(bm), q);
    for (int s = -4; s <= 4 && mx > mn && n > 1; s++) {
        if (s == 0)
            continue;
        float id = (15.0f + 0.1f * (float)s) / (mx - mn);
        float sq = 0.0f, sqq = 0.0f, sw = 0.0f, sqw = 0.0f;
        for (int64_t k = 0; k < n; k++) {
            int v = old_round_clamp((w[k] - mn) * id, 15.0f);
            float fq = (float)(v < 0 ? 0 : v);
            sq += fq;
            sqq += fq * fq;
            sw += w[k];
            sqw += fq * w[k];
        }
        float det = (float)n * sqq - sq * sq;
        if (det <= 0.0f)
            continue;
        float d = ((float)n * sqw - sq * sw) / det, m = (sw - d * sq) / (float)n;
        if (!(d > 0.0f))
            continue;
        uint16_t hd = kwk_f32_to_f16(d), hm = kwk_f32_to_f16(m);
        float e = old_q4_err(w, n, kwk_f16_to_f32(hd), kwk_f16_to_f32(hm), q);
        if (e < best) {
            best = e;
            bd = hd;
            bm = hm;
        }
    }
    b->d[i] = bd;
    b->m[i] = bm;
    old_q4_err(w, n, kwk_f16_to_f32(bd), kwk_f16_to_f32(bm), q);
    for (int64_t k = n; k < KWK_Q4_GROUP; k++)
        q[k] = 0;
    for (int c = 0; c < KWK_Q4_GROUP / 8; c++)
        for (int j = 0; j < 4; j++)
            b->q[c][i][j] = (uint8_t)(q[8 * c + j] | q[8 * c + 4 + j] << 4);
}

static void old_pack_rows(int wtype, void *data, int64_t rows, int64_t cols, int64_t rb,
                          const float *src, long ld)
{
    int G = kwk_quant_group(wtype);
    int64_t ng = kwk_quant_n_groups(wtype, cols);
    int n_rows = (int)KWK_MIN((int64_t)KWK_QROWS, rows - rb * KWK_QROWS);
    for (int64_t g = 0; g < ng; g++) {
        int64_t k0 = g * G, n = KWK_MIN((int64_t)G, cols - k0);
        for (int i = 0; i < KWK_QROWS; i++) {
            const float *w = i < n_rows ? src + (size_t)i * (size_t)ld + k0 : NULL;
            if (wtype == KWK_W_Q8)
                old_pack_q8_row((struct kwk_q8_block *)data + rb * ng + g, i, w, w ? n : 0);
            else
                old_pack_q4_row((struct kwk_q4_block *)data + rb * ng + g, i, w, w ? n : 0);
        }
    }
}

/* Data that reaches every branch of the scale searches: Gaussian-like rows, outliers, constant
 * and zero groups, signed zeros, NaN and infinities, values whose scales are subnormal halves
 * or saturate the half range, and integers (ties between trials). */
static float odd_value(int kind, int64_t i, int64_t cols)
{
    float v = t_frand(-1.0f, 1.0f) + t_frand(-1.0f, 1.0f) + t_frand(-1.0f, 1.0f);
    switch (kind) {
    case 1: return v * 1e-6f;
    case 2: return i % 5 == 0 ? 0.0f : v * 100.0f;
    case 3: return (float)(int)(v * 3.0f);
    case 4: return (i / cols) % 3 == 0 ? 0.0f : v;
    case 5: return t_rnd() % 100 == 0 ? v * 50.0f : v;
    case 6: return t_rnd() % 50 == 0 ? NAN : v;
    case 7: return t_rnd() % 50 == 0 ? (t_rnd() & 1 ? INFINITY : -INFINITY) : v;
    case 8: return v * 1e30f;
    case 9: return v * 1e-40f;
    case 10: return 1.5f;
    case 11: return v * 127.0f * 65504.0f * t_frand(0.0f, 2.0f);
    case 12: return v * 1e-5f * t_frand(0.0f, 1.0f);
    case 13: return i % 2 ? -0.0f : 0.0f;
    default: return v;
    }
}

#define N_ODD_KINDS 14

static void test_pack_unchanged(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {5, 31}, {16, 32}, {17, 33}, {40, 100}, {33, 64}};
    long diff = 0, n = 0;
    for (int kind = 0; kind < N_ODD_KINDS; kind++)
        for (size_t si = 0; si < KWK_ARRAY_LEN(shapes); si++)
            for (int wi = 0; wi < 2; wi++) {
                int wt = wi ? KWK_W_Q4 : KWK_W_Q8;
                int64_t rows = shapes[si][0], cols = shapes[si][1];
                float *w = malloc(sizeof(float) * (size_t)(rows * cols));
                for (int64_t i = 0; i < rows * cols; i++)
                    w[i] = odd_value(kind, i, cols);
                size_t bytes;
                kwk_quant_bytes(wt, rows, cols, &bytes);
                uint8_t *a = malloc(bytes), *b = malloc(bytes);
                memset(a, 0x11, bytes);
                memset(b, 0x22, bytes);
                for (int64_t rb = 0; rb * KWK_QROWS < rows; rb++) {
                    const float *src = w + rb * KWK_QROWS * cols;
                    kwk_quant_pack_rows(wt, a, rows, cols, rb, src, (long)cols);
                    old_pack_rows(wt, b, rows, cols, rb, src, (long)cols);
                }
                diff += memcmp(a, b, bytes) != 0;
                n++;
                free(a);
                free(b);
                free(w);
            }
    T_CHECK(diff == 0, "%ld of %ld matrices packed differently from the old packer", diff, n);
}

/* The SIMD fit and code of 16 rows against kwk_quant_fit / kwk_quant_code, all three formats
 * (int6 has no older packer to compare with), on the same odd data. */
typedef void (*fit_rows_fn)(int wtype, const float *w, int n, float *d, float *m, int8_t *q);

static void test_fit_rows_simd(int isa, fit_rows_fn fit_rows)
{
    if (kwk_isa() < isa) {
        printf("  %s packer not checked: %s only\n", kwk_isa_name(isa), kwk_isa_name(kwk_isa()));
        return;
    }
    static const int wts[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    long diff = 0, n_cases = 0;
    for (int kind = 0; kind < N_ODD_KINDS; kind++)
        for (int wi = 0; wi < 3; wi++)
            for (int rep = 0; rep < 8; rep++) {
                int n = rep == 0 ? 1 : rep == 1 ? 2 : rep == 2 ? 31 : 32;
                float w[32 * KWK_QROWS], d[KWK_QROWS], m[KWK_QROWS];
                int8_t q[32 * KWK_QROWS];
                for (int i = 0; i < 32 * KWK_QROWS; i++)
                    w[i] = odd_value(kind, i / KWK_QROWS + (i % KWK_QROWS) * 32, 32);
                fit_rows(wts[wi], w, n, d, m, q);
                for (int i = 0; i < KWK_QROWS; i++) {
                    float row[32], rd, rm;
                    for (int k = 0; k < n; k++)
                        row[k] = w[k * KWK_QROWS + i];
                    kwk_quant_fit(wts[wi], row, n, &rd, &rm);
                    long bad = memcmp(&rd, &d[i], sizeof rd) != 0 || memcmp(&rm, &m[i], sizeof rm);
                    for (int k = 0; k < n; k++)
                        bad += q[k * KWK_QROWS + i] != kwk_quant_code(wts[wi], row[k], rd, rm);
                    diff += bad != 0;
                    n_cases++;
                }
            }
    T_CHECK(diff == 0, "%ld of %ld rows fitted differently by the %s search", diff, n_cases,
            kwk_isa_name(isa));
}

/* Where packing wrote a block of rows: the bytes that differ between buf (packed from zeros) and
 * the same with panel / row block b packed from random rows, as [*lo, *hi) offsets. */
static void written_range(const unsigned char *a, const unsigned char *b, size_t n, size_t *lo,
                          size_t *hi)
{
    *lo = n;
    *hi = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            *lo = KWK_MIN(*lo, i);
            *hi = i + 1;
        }
}

/* kwk_mat_rows_span against the layouts packing writes: the span of rows 16b .. 16b+15 (and of
 * the last, short block) covers every byte packing wrote for them and starts and ends on their
 * block; wider ranges are those blocks end to end; plain types are rows * cols elements; ranges
 * that cut a block or leave the matrix are refused. */
static void test_rows_span(void)
{
    static const int types[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6, KWK_W_BF16P, KWK_W_BF16T};
    const int64_t rows = 45, cols = 70; /* 3 row blocks, the last one short; groups padded */
    float *src = malloc(sizeof(float) * 16 * (size_t)cols), *zero = calloc(16 * (size_t)cols, 4);
    for (int i = 0; i < 16 * cols; i++)
        src[i] = t_frand(-1.0f, 1.0f);
    for (size_t t = 0; t < KWK_ARRAY_LEN(types); t++) {
        int wt = types[t];
        size_t bytes;
        T_EQ(wt == KWK_W_BF16P   ? kwk_panel_bytes(rows, cols, &bytes)
             : wt == KWK_W_BF16T ? kwk_bf16t_bytes(rows, cols, &bytes)
                                 : kwk_quant_bytes(wt, rows, cols, &bytes),
             0);
        unsigned char *a = kwk_malloc_aligned(bytes), *b = kwk_malloc_aligned(bytes);
        for (int64_t blk = 0; blk * 16 < rows; blk++) {
            if (wt == KWK_W_BF16P)
                kwk_panel_pack_rows(a, rows, cols, blk, zero, (long)cols);
            else if (wt == KWK_W_BF16T)
                kwk_bf16t_pack_rows(a, rows, cols, blk, zero, (long)cols);
            else
                kwk_quant_pack_rows(wt, a, rows, cols, blk, zero, (long)cols);
        }
        struct kwk_mat m = {.wtype = wt, .rows = rows, .cols = cols, .data = b};
        for (int64_t blk = 0; blk * 16 < rows; blk++) {
            memcpy(b, a, bytes);
            if (wt == KWK_W_BF16P)
                kwk_panel_pack_rows(b, rows, cols, blk, src, (long)cols);
            else if (wt == KWK_W_BF16T)
                kwk_bf16t_pack_rows(b, rows, cols, blk, src, (long)cols);
            else
                kwk_quant_pack_rows(wt, b, rows, cols, blk, src, (long)cols);
            size_t lo, hi, blk_bytes = bytes / 3;
            written_range(a, b, bytes, &lo, &hi);
            const void *p;
            size_t n;
            T_EQ(kwk_mat_rows_span(&m, blk * 16, KWK_MIN(rows, blk * 16 + 16), &p, &n), 0);
            size_t at = (size_t)((const unsigned char *)p - b);
            T_TRUE(at <= lo && hi <= at + n);
            T_EQ(at, (size_t)blk * blk_bytes);
            T_EQ(n, blk_bytes);
        }
        const void *p;
        size_t n;
        T_EQ(kwk_mat_rows_span(&m, 16, rows, &p, &n), 0);
        T_TRUE(p == b + bytes / 3);
        T_EQ(n, 2 * bytes / 3);
        T_EQ(kwk_mat_rows_span(&m, 0, 0, &p, &n), 0);
        T_EQ(n, 0);
        T_EQ(kwk_mat_rows_span(&m, 8, 32, &p, &n), -1);  /* starts inside a block */
        T_EQ(kwk_mat_rows_span(&m, 0, 20, &p, &n), -1);  /* ends inside one */
        T_EQ(kwk_mat_rows_span(&m, 0, 46, &p, &n), -1);  /* past the last row */
        T_TRUE(p == NULL && n == 0);
        kwk_free_aligned(a);
        kwk_free_aligned(b);
    }
    static const int plain[][2] = {{KWK_W_F32, 4}, {KWK_W_F16, 2}, {KWK_W_BF16, 2}};
    for (size_t t = 0; t < KWK_ARRAY_LEN(plain); t++) {
        struct kwk_mat m = {.wtype = plain[t][0], .rows = rows, .cols = cols, .data = src};
        const void *p;
        size_t n;
        T_EQ(kwk_mat_rows_span(&m, 3, 10, &p, &n), 0);
        T_TRUE(p == (const char *)src + 3 * cols * plain[t][1]);
        T_EQ(n, (size_t)(7 * cols * plain[t][1]));
        T_EQ(kwk_mat_rows_span(&m, 10, 3, &p, &n), -1);
    }
    struct kwk_mat bad = {.wtype = 99, .rows = rows, .cols = cols, .data = src};
    const void *p;
    size_t n;
    T_EQ(kwk_mat_rows_span(&bad, 0, 16, &p, &n), -1);
    free(src);
    free(zero);
}

/* kwk_mat_decode_spans: where each table's one-token product starts reading a range of rows. */
static void test_decode_spans(void)
{
    const int64_t rows = 200, cols = 70;
    const struct kwk_kernels *tables[] = {&kwk_kernels_ref, &kwk_kernels_avx2, &kwk_kernels_avx512};
    const void *p[4];
    size_t n[4];
    char *mem = malloc((size_t)rows * (size_t)cols * 4); /* the largest layout: float rows */
    for (size_t t = 0; t < KWK_ARRAY_LEN(tables); t++) {
        const struct kwk_kernels *k = tables[t];
        T_TRUE(k->dec_runs >= 1);
        /* float rows: dec_runs runs of floor(rows / runs) rows, each span the run's first
         * budget / runs bytes */
        struct kwk_mat f = {.wtype = KWK_W_F32, .rows = rows, .cols = cols, .data = mem};
        int64_t r0 = 16, r1 = 160, run = (r1 - r0) / k->dec_runs;
        size_t row = (size_t)cols * 4;
        int got = kwk_mat_decode_spans(k, &f, r0, r1, 4096, p, n, 4);
        T_EQ(got, k->dec_runs);
        for (int i = 0; i < got; i++) {
            T_TRUE(p[i] == (const char *)f.data + (size_t)(r0 + i * run) * row);
            T_EQ(n[i], KWK_MIN(4096 / (size_t)got, (size_t)run * row));
        }
        /* a budget larger than the runs: whole runs */
        got = kwk_mat_decode_spans(k, &f, r0, r1, (size_t)1 << 30, p, n, 4);
        T_EQ(n[got - 1], (size_t)run * row);
        /* fewer rows than runs: read in order, one span */
        T_EQ(kwk_mat_decode_spans(k, &f, 5, 7, 4096, p, n, 4), 1);
        T_TRUE(p[0] == (const char *)f.data + 5 * row && n[0] == 2 * row);
        /* max caps the count */
        T_EQ(kwk_mat_decode_spans(k, &f, r0, r1, 4096, p, n, 1), 1);
        /* panels: runs of whole 16-row panels */
        struct kwk_mat b = {.wtype = KWK_W_BF16P, .rows = rows, .cols = cols, .data = mem};
        got = kwk_mat_decode_spans(k, &b, 32, 200, (size_t)1 << 30, p, n, 4);
        T_EQ(got, k->dec_runs);
        size_t panel = (size_t)cols * 16 * 2;
        int64_t pruns = (13 - 2) / got; /* panels 2 .. 12, the last one short */
        for (int i = 0; i < got; i++) {
            T_TRUE(p[i] == (const char *)b.data + (size_t)(2 + i * pruns) * panel);
            T_EQ(n[i], (size_t)pruns * panel);
        }
        /* tile order: in order on AMX tiles, else KWK_BF16T_DEC_RUNS runs of whole blocks */
        struct kwk_mat tb = {.wtype = KWK_W_BF16T, .rows = rows, .cols = cols, .data = mem};
        got = kwk_mat_decode_spans(k, &tb, 32, 200, (size_t)1 << 30, p, n, 4);
        T_EQ(got, kwk_mat_amx(k, &tb) ? 1 : KWK_BF16T_DEC_RUNS);
        size_t tblock = (size_t)kwk_bf16t_chunks(cols) * KWK_BF16T_TILE_BYTES;
        int64_t truns = (13 - 2) / got;
        for (int i = 0; i < got; i++) {
            T_TRUE(p[i] == (const char *)tb.data + (size_t)(2 + i * truns) * tblock);
            T_EQ(n[i], (size_t)truns * tblock);
        }
        /* quantized: one span from r0, whatever the table */
        struct kwk_mat q = {.wtype = KWK_W_Q8, .rows = rows, .cols = cols, .data = mem};
        size_t rb;
        kwk_quant_bytes(KWK_W_Q8, 16, cols, &rb);
        T_EQ(kwk_mat_decode_spans(k, &q, 32, 96, 1000, p, n, 4), 1);
        T_TRUE(p[0] == (const char *)q.data + 2 * rb && n[0] == 1000);
        T_EQ(kwk_mat_decode_spans(k, &q, 8, 96, 1000, p, n, 4), 0); /* cuts a block */
        T_EQ(kwk_mat_decode_spans(k, &q, 32, 96, 1000, p, n, 0), 0);
        T_EQ(kwk_mat_decode_spans(k, &q, 32, 32, 1000, p, n, 4), 0);
    }
    free(mem);
}

/* kwk_mat_amx: the AVX-512 table on AMX tiles, quantized matrices where kwk_cpu_amx(),
 * row-major bf16 where kwk_cpu_amx_preserve() and bf16 in tile order where kwk_cpu_amx_bf16();
 * no other table or type. And decode_spans reads a
 * bf16 matrix in order exactly where it says AMX. */
static void test_mat_amx(void)
{
    const struct kwk_kernels *tables[] = {&kwk_kernels_ref, &kwk_kernels_avx2, &kwk_kernels_avx512};
    const int types[] = {KWK_W_F32, KWK_W_F16, KWK_W_BF16, KWK_W_BF16P,
                         KWK_W_BF16T, KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};
    char *mem = calloc(64 * 64, 4);
    for (size_t t = 0; t < KWK_ARRAY_LEN(tables); t++)
        for (size_t i = 0; i < KWK_ARRAY_LEN(types); i++) {
            struct kwk_mat w = {.wtype = types[i], .rows = 64, .cols = 64, .data = mem};
            int want = 0;
            if (tables[t] == &kwk_kernels_avx512)
                want = types[i] == KWK_W_BF16    ? kwk_cpu_amx_preserve()
                       : types[i] == KWK_W_BF16T ? kwk_cpu_amx_bf16()
                       : kwk_quant_group(types[i]) ? kwk_cpu_amx()
                                                   : 0;
            T_CHECK(kwk_mat_amx(tables[t], &w) == want, "table %zu type %d: %d", t, types[i],
                    kwk_mat_amx(tables[t], &w));
            if (types[i] == KWK_W_BF16 || types[i] == KWK_W_BF16T) {
                const void *p[4];
                size_t n[4];
                int runs = kwk_mat_decode_spans(tables[t], &w, 0, 64, 1 << 20, p, n, 4);
                T_EQ(runs, want                         ? 1
                           : types[i] == KWK_W_BF16T ? KWK_BF16T_DEC_RUNS
                                                     : tables[t]->dec_runs);
            }
        }
    free(mem);
}

static void test_sizes(void)
{
    size_t n;
    T_EQ(kwk_quant_bytes(KWK_W_Q8, 17, 65, &n), 0);
    T_EQ(n, 2 * 3 * sizeof(struct kwk_q8_block));
    T_EQ(kwk_quant_bytes(KWK_W_Q4, 16, 64, &n), 0);
    T_EQ(n, 2 * sizeof(struct kwk_q4_block));
    T_EQ(kwk_quant_bytes(KWK_W_Q6, 33, 33, &n), 0);
    T_EQ(n, 3 * 2 * sizeof(struct kwk_q6_block));
    T_EQ(kwk_quant_group(KWK_W_Q6), 32);
    T_EQ(kwk_quant_bytes(KWK_W_Q4, INT64_MAX / 2, INT64_MAX / 2, &n), -1);
    T_EQ(kwk_quant_bytes(KWK_W_F32, 16, 64, &n), -1);
}

int main(void)
{
    printf("isa: %s\n", kwk_isa_name(kwk_isa()));
    test_f16();
    test_sizes();
    test_rows_span();
    test_decode_spans();
    test_mat_amx();
    test_act();
    static const int64_t shapes[][2] = {{1, 64}, {17, 200}, {37, 576}, {16, 31}};
    for (size_t i = 0; i < KWK_ARRAY_LEN(shapes); i++) {
        test_round_trip(KWK_W_Q8, shapes[i][0], shapes[i][1]);
        test_round_trip(KWK_W_Q4, shapes[i][0], shapes[i][1]);
        test_round_trip(KWK_W_Q6, shapes[i][0], shapes[i][1]);
    }
    static const int64_t odd[][2] = {{1, 1}, {3, 33}, {17, 95}, {35, 200}, {16, 64}, {47, 7}};
    for (size_t i = 0; i < KWK_ARRAY_LEN(odd); i++) {
        test_fit_code_pack(KWK_W_Q8, odd[i][0], odd[i][1]);
        test_fit_code_pack(KWK_W_Q4, odd[i][0], odd[i][1]);
        test_fit_code_pack(KWK_W_Q6, odd[i][0], odd[i][1]);
    }
    test_gauss_error();
    test_pack_unchanged();
    test_fit_rows_simd(KWK_ISA_AVX2, kwk_quant_fit_rows_avx2);
    test_fit_rows_simd(KWK_ISA_AVX512, kwk_quant_fit_rows_avx512);
    for (int act8 = 0; act8 < 2; act8++) {
        test_kernels_vs_ref(act8);
        test_batch_invariance(act8);
        test_threads(act8);
        test_matmul_q(act8);
    }
    test_avxvnni_same_bits();
    test_amx_same_bits();
    test_act8_spec();
    test_act8_grid();
    test_accuracy();
    return t_report("test_quant");
}
