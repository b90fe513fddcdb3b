/* test_bf16t.c - bf16 weights packed in AMX tile order (kernels/bf16t.h): the layout (bytes,
 * packing, rows read back by every table, where a range of rows lies); the scalar
 * specification against the tile unit itself (the row-major AMX path on the same weights, bit
 * for bit, over the whole float range: underflow, denormals, overflow, infinities, NaN); the
 * AVX-512 kernels (vector engine and tiles) against the specification bit for bit; batch
 * invariance (a token alone, in batches, over any row range), no write outside the range,
 * exact sums, column blocks with spilled C tiles, the path without a staging buffer, and every
 * table agreeing. Where the CPU has no AMX-BF16, the tile parts say so and the rest runs on
 * the vector engine. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kernels/amx_bf16.h"
#include "kernels/bf16t.h"
#include "kernels/kernels.h"
#include "test.h"

#define SENTINEL (-12345.0f)

static int has_avx512, has_amx; /* the AVX-512 table is chosen; AMX-BF16 in use */

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* u with an exponent e + [-4, 4], kept in 0-254 (no infinity or NaN) */
static uint32_t near_exp(uint32_t u, int e)
{
    int f = e + (int)(t_rnd() % 9) - 4;
    f = f < 0 ? 0 : f > 254 ? 254 : f;
    return (u & 0x807fffffu) | (uint32_t)f << 23;
}

/* Random bits over the whole range (denormals to overflow, both signs); with specials some
 * zeros, infinities and NaNs. */
static uint32_t wide_bits(int specials)
{
    uint32_t u = t_rnd() << 16 ^ t_rnd();
    if (specials && t_rnd() % 64 == 0) {
        static const uint32_t sp[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0, 0x80000000u};
        return sp[t_rnd() % 5];
    }
    return (u & 0x807fffffu) | (t_rnd() % 255) << 23;
}

/* A rows x cols matrix: row-major bf16 (64-byte aligned, so the row-major AMX path reads it
 * with no head chunk) and the same values packed. wide: weights over the whole range (a scale a
 * row), else in [-1, 1). */
struct pair {
    uint16_t *rm;
    void *packed;
    struct kwk_mat m_rm, m_t;
};

static void pair_new(struct pair *p, int64_t rows, int64_t cols, int wide, int specials)
{
    size_t n = (size_t)(rows * cols), bytes;
    p->rm = aligned_alloc(64, (n * 2 + 63) / 64 * 64 + 64);
    float *f = malloc((n ? n : 1) * sizeof *f);
    for (int64_t r = 0; r < rows; r++) {
        int e = 1 + (int)(t_rnd() % 254);
        for (int64_t k = 0; k < cols; k++) {
            uint32_t u = f_bits(t_frand(-1.0f, 1.0f));
            if (wide) {
                u = wide_bits(specials);
                if (!specials || t_rnd() % 16)
                    u = near_exp(u, e);
            }
            u &= 0xffff0000u;
            p->rm[r * cols + k] = (uint16_t)(u >> 16);
            f[r * cols + k] = bits_f(u);
        }
    }
    kwk_bf16t_bytes(rows, cols, &bytes);
    p->packed = aligned_alloc(64, bytes ? bytes : 64);
    for (int64_t b = 0; b < (rows + 15) / 16; b++)
        kwk_bf16t_pack_rows(p->packed, rows, cols, b, f + b * 16 * cols, (long)cols);
    free(f);
    p->m_rm = (struct kwk_mat){.wtype = KWK_W_BF16, .rows = rows, .cols = cols, .data = p->rm};
    p->m_t = (struct kwk_mat){.wtype = KWK_W_BF16T, .rows = rows, .cols = cols, .data = p->packed};
}

static void pair_free(struct pair *p)
{
    free(p->rm);
    free(p->packed);
}

static float *x_new(int n_tok, int64_t cols, int wide, int specials)
{
    float *x = malloc((size_t)(n_tok * cols + 1) * sizeof *x);
    for (int t = 0; t < n_tok; t++) {
        int e = 1 + (int)(t_rnd() % 60); /* small: sums of small weights underflow */
        for (int64_t k = 0; k < cols; k++) {
            uint32_t u = f_bits(t_frand(-2.0f, 2.0f));
            if (wide) {
                u = wide_bits(specials);
                if (!specials || t_rnd() % 16)
                    u = near_exp(u, e);
            }
            x[t * cols + k] = bits_f(u);
        }
    }
    return x;
}

/* Outputs that differ bitwise (NaN against NaN counts as the same). */
static long differ(const float *a, const float *b, size_t n)
{
    long d = 0;
    for (size_t i = 0; i < n; i++)
        d += f_bits(a[i]) != f_bits(b[i]) && !(isnan(a[i]) && isnan(b[i]));
    return d;
}

static void fill(float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = SENTINEL;
}

/* ---- the layout */

static void test_layout(void)
{
    size_t bytes;
    T_EQ(kwk_bf16t_bytes(33, 70, &bytes), 0);
    T_EQ(bytes, 3 * 3 * 1024); /* 3 blocks x 3 chunks */
    T_EQ(kwk_bf16t_bytes(-1, 5, &bytes), -1);
    T_EQ(kwk_bf16t_bytes(INT64_MAX / 2, INT64_MAX / 2, &bytes), -1);
    T_EQ(bytes, 0);
    struct pair p;
    pair_new(&p, 37, 77, 0, 0);
    static const int isas[] = {KWK_ISA_SCALAR, KWK_ISA_AVX2, KWK_ISA_AVX512};
    float row[77];
    long wrong = 0;
    for (size_t i = 0; i < KWK_ARRAY_LEN(isas); i++)
        for (int64_t r = 0; r < 37; r++) {
            kwk_kernels_for(isas[i])->mat_row(&p.m_t, r, row);
            for (int k = 0; k < 77; k++)
                wrong += f_bits(row[k]) != (uint32_t)p.rm[r * 77 + k] << 16;
        }
    T_CHECK(wrong == 0, "mat_row: %ld values differ from the rows packed", wrong);
    /* padding: rows 37-47 and columns 77-95 of the pack are zero */
    const uint16_t *h = p.packed;
    long nonzero = 0;
    for (int64_t b = 0; b < 3; b++)
        for (int c = 0; c < 3; c++)
            for (int q = 0; q < 16; q++)
                for (int i = 0; i < 16; i++)
                    for (int s = 0; s < 2; s++) {
                        int64_t r = b * 16 + i, k = c * 32 + 2 * q + s;
                        if (r >= 37 || k >= 77)
                            nonzero += h[(((b * 3 + c) * 16 + q) * 16 + i) * 2 + s] != 0;
                    }
    T_EQ(nonzero, 0);
    const void *at;
    size_t n;
    T_EQ(kwk_mat_rows_span(&p.m_t, 16, 37, &at, &n), 0);
    T_TRUE(at == (const char *)p.packed + 3 * 1024 && n == 2 * 3 * 1024);
    T_EQ(kwk_mat_rows_span(&p.m_t, 8, 16, &at, &n), -1); /* a block cut */
    pair_free(&p);
}

/* The specification's split: three bf16 parts that sum to x exactly, as defined. */
static void test_split(void)
{
    long wrong = 0;
    for (int i = 0; i < 100000; i++) {
        float x = bits_f(wide_bits(0)), p[3];
        kwk_bf16t_split(x, p);
        for (int s = 0; s < 3; s++)
            wrong += (f_bits(p[s]) & 0xffffu) != 0;
        if (isfinite(p[0]) && fabsf(x) < 1e30f && fabsf(x) > 1e-30f)
            wrong += (double)p[0] + (double)p[1] + (double)p[2] != (double)x;
    }
    T_EQ(wrong, 0);
    float p[3];
    kwk_bf16t_split(INFINITY, p);
    T_TRUE(p[0] == INFINITY && p[1] == 0.0f && p[2] == 0.0f);
    kwk_bf16t_split(NAN, p);
    T_TRUE(isnan(p[0]) && p[1] == 0.0f && p[2] == 0.0f);
}

/* ---- the specification against the hardware and the AVX-512 kernels */

/* On weights and activations over the whole range: the scalar specification, the tile unit
 * (the row-major AMX path, aligned rows: the same chunks), the packed vector engine and the
 * packed tiles, every pair bitwise. */
static void spec_case(int64_t rows, int64_t cols, int n_tok, int specials)
{
    struct pair p;
    pair_new(&p, rows, cols, 1, specials);
    float *x = x_new(n_tok, cols, 1, specials);
    size_t ny = (size_t)(n_tok * rows);
    float *ys = malloc(ny * sizeof *ys), *yv = malloc(ny * sizeof *yv), *yt = malloc(ny * 4);
    float *yh = malloc(ny * sizeof *yh);
    kwk_bf16t_matmul_ref(&p.m_t, x, n_tok, ys, (long)rows, 0, rows);
    long zeros = 0, nans = 0;
    for (size_t i = 0; i < ny; i++) {
        zeros += ys[i] == 0.0f;
        nans += isnan(ys[i]) != 0;
    }
    if (has_avx512) {
        kwk_bf16t_test_vector(1);
        kwk_bf16t_matmul_avx512(&p.m_t, x, n_tok, yv, (long)rows, 0, rows);
        kwk_bf16t_test_vector(0);
        T_CHECK(differ(ys, yv, ny) == 0,
                "rows=%lld cols=%lld tokens %d%s: %ld of %zu differ, vector engine vs spec",
                (long long)rows, (long long)cols, n_tok, specials ? " (inf, NaN)" : "",
                differ(ys, yv, ny), ny);
    }
    if (has_amx) {
        kwk_bf16t_matmul_avx512(&p.m_t, x, n_tok, yt, (long)rows, 0, rows);
        kwk_bf16_amx_test_engine(1); /* the row-major path on tiles, decode steps too */
        kwk_bf16_matmul_amx(&p.m_rm, x, n_tok, yh, (long)rows, 0, rows);
        kwk_bf16_amx_test_engine(0);
        T_CHECK(differ(ys, yh, ny) == 0,
                "rows=%lld cols=%lld tokens %d%s: %ld of %zu differ, tile unit (row-major) vs "
                "spec", (long long)rows, (long long)cols, n_tok, specials ? " (inf, NaN)" : "",
                differ(ys, yh, ny), ny);
        T_CHECK(differ(ys, yt, ny) == 0,
                "rows=%lld cols=%lld tokens %d%s: %ld of %zu differ, packed tiles vs spec",
                (long long)rows, (long long)cols, n_tok, specials ? " (inf, NaN)" : "",
                differ(ys, yt, ny), ny);
    }
    /* the premise: these sums reach the edges */
    if (cols >= 64 && !specials)
        T_CHECK(zeros > 0, "cols=%lld: no sum underflowed", (long long)cols);
    if (cols >= 64 && specials)
        T_CHECK(nans > 0, "cols=%lld: no NaN", (long long)cols);
    pair_free(&p);
    free(x);
    free(ys);
    free(yv);
    free(yt);
    free(yh);
}

static void test_spec(void)
{
    static const int64_t cols_list[] = {1, 31, 32, 33, 77, 576};
    for (size_t a = 0; a < KWK_ARRAY_LEN(cols_list); a++)
        for (int sp = 0; sp < 2; sp++)
            spec_case(67, cols_list[a], a % 2 ? 7 : 1, sp);
    if (!has_amx)
        printf("test_bf16t: no AMX-BF16 in use here: the tile unit and the packed tiles not "
               "compared with the specification\n");
}

/* ---- batch invariance, ranges, exact sums, column blocks, no staging buffer */

/* kwk_bf16t_matmul_avx512 over rows [r0, r1) of a matrix of random weights (ldy = rows + 3):
 * the specification's numbers, nothing written outside the range, each token alone and the
 * range cut in two bitwise the batch's. */
static void range_case(int64_t rows, int64_t cols, int n_tok, int64_t r0, int64_t r1)
{
    struct pair p;
    pair_new(&p, rows, cols, 0, 0);
    float *x = x_new(n_tok, cols, 0, 0);
    long ldy = (long)rows + 3;
    size_t ny = (size_t)n_tok * (size_t)ldy;
    float *ys = malloc(ny * sizeof *ys), *y = malloc(ny * sizeof *y), *y1 = malloc(ny * 4);
    fill(ys, ny);
    fill(y, ny);
    fill(y1, ny);
    kwk_bf16t_matmul_ref(&p.m_t, x, n_tok, ys, ldy, r0, r1);
    kwk_bf16t_matmul_avx512(&p.m_t, x, n_tok, y, ldy, r0, r1);
    T_CHECK(differ(ys, y, ny) == 0, "rows=%lld cols=%lld tokens %d [%lld, %lld): %ld differ",
            (long long)rows, (long long)cols, n_tok, (long long)r0, (long long)r1,
            differ(ys, y, ny));
    long outside = 0;
    for (int t = 0; t < n_tok; t++)
        for (long r = 0; r < ldy; r++)
            outside += (r < r0 || r >= r1) && y[t * ldy + r] != SENTINEL;
    T_EQ(outside, 0);
    int64_t mid = r0 + (r1 - r0) / 2;
    for (int t = 0; t < n_tok; t++) { /* alone, over two halves of the range */
        kwk_bf16t_matmul_avx512(&p.m_t, x + t * cols, 1, y1 + t * ldy, ldy, r0, mid);
        kwk_bf16t_matmul_avx512(&p.m_t, x + t * cols, 1, y1 + t * ldy, ldy, mid, r1);
    }
    T_CHECK(differ(y, y1, ny) == 0, "rows=%lld cols=%lld tokens %d: %ld differ alone",
            (long long)rows, (long long)cols, n_tok, differ(y, y1, ny));
    pair_free(&p);
    free(x);
    free(ys);
    free(y);
    free(y1);
}

static void ranges(void)
{
    range_case(37, 77, 1, 0, 37);
    range_case(37, 77, 6, 0, 37);
    range_case(150, 33, 11, 3, 141); /* a range not on block edges */
    range_case(64, 576, 23, 16, 64);
    range_case(48, 96, 2, 0, 48);
    /* 13 token tiles: a token block of 12 and one of 1; 129 chunks: two column blocks of at
     * most 85 (1 MiB of staged tiles), C tiles spilled between */
    range_case(40, 4127, 64, 0, 40);
    /* rows past 1 MiB of staged tiles (1251 chunks) under one A tile: staged whole */
    range_case(20, 40000, 1, 0, 20);
    range_case(20, 40000, 3, 0, 20);
}

static void test_ranges(void)
{
    for (int v = 0; v < 2; v++) { /* the default engine (tiles where AMX), the vector one */
        kwk_bf16t_test_vector(v);
        ranges();
    }
    kwk_bf16t_test_vector(0);
}

/* Products whose float sums are exact (weights in {-1, 0, 1}, activations with up to 19
 * significant bits, at most 32 columns): the result is the exact sum, which one bf16 part
 * alone would not give. */
static void test_exact(void)
{
    int64_t rows = 37, cols = 32;
    int n_tok = 12;
    struct pair p;
    pair_new(&p, rows, cols, 0, 0);
    float *f = malloc((size_t)(rows * cols) * sizeof *f);
    for (int64_t i = 0; i < rows * cols; i++) {
        f[i] = (float)((int)(t_rnd() % 3) - 1);
        p.rm[i] = (uint16_t)(f_bits(f[i]) >> 16);
    }
    for (int64_t b = 0; b < 3; b++)
        kwk_bf16t_pack_rows(p.packed, rows, cols, b, f + b * 16 * cols, (long)cols);
    float *x = malloc((size_t)(n_tok * cols) * sizeof *x);
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = ldexpf((float)((int32_t)(t_rnd() % (1u << 20)) - (1 << 19) + 1), -16);
    float *y = malloc((size_t)(n_tok * rows) * sizeof *y);
    const struct kwk_kernels *k = kwk_kernels();
    k->matmul(&p.m_t, x, n_tok, y, (long)rows, 0, rows);
    long wrong = 0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < rows; r++) {
            double s = 0;
            for (int64_t c = 0; c < cols; c++)
                s += (double)f[r * cols + c] * (double)x[t * cols + c];
            wrong += (double)y[t * rows + r] != s;
        }
    T_CHECK(wrong == 0, "exact sums (%s table): %ld of %lld differ", k->name, wrong,
            (long long)(rows * n_tok));
    pair_free(&p);
    free(f);
    free(x);
    free(y);
}

/* Without a staging buffer (kwk_amx_stage refused) every call stages piece by piece: the same
 * numbers. */
static void no_scratch(void)
{
    int64_t rows = 70, cols = 200;
    int n_tok = 13;
    struct pair p;
    pair_new(&p, rows, cols, 0, 0);
    float *x = x_new(n_tok, cols, 0, 0);
    size_t ny = (size_t)(n_tok * rows);
    float *y = malloc(ny * sizeof *y), *y0 = malloc(ny * sizeof *y0);
    kwk_bf16t_matmul_avx512(&p.m_t, x, n_tok, y, (long)rows, 0, rows);
    kwk_bf16t_matmul_avx512(&p.m_t, x, 1, y + (n_tok - 1) * rows, (long)rows, 0, rows);
    kwk_bf16_amx_test_no_scratch(1);
    kwk_bf16t_matmul_avx512(&p.m_t, x, n_tok, y0, (long)rows, 0, rows);
    kwk_bf16t_matmul_avx512(&p.m_t, x, 1, y0 + (n_tok - 1) * rows, (long)rows, 0, rows);
    kwk_bf16_amx_test_no_scratch(0);
    T_CHECK(differ(y, y0, ny) == 0, "no staging buffer: %ld of %zu differ", differ(y, y0, ny),
            ny);
    pair_free(&p);
    free(x);
    free(y);
    free(y0);
}

static void test_no_scratch(void)
{
    for (int v = 0; v < 2; v++) { /* the default engine (tiles where AMX), the vector one */
        kwk_bf16t_test_vector(v);
        no_scratch();
    }
    kwk_bf16t_test_vector(0);
}

/* The scalar, AVX2 and AVX-512 tables' matmul on a packed matrix: the same bits. */
static void test_tables(void)
{
    int64_t rows = 45, cols = 100;
    int n_tok = 7;
    struct pair p;
    pair_new(&p, rows, cols, 0, 0);
    float *x = x_new(n_tok, cols, 0, 0);
    size_t ny = (size_t)(n_tok * rows);
    float *y[3];
    static const int isas[] = {KWK_ISA_SCALAR, KWK_ISA_AVX2, KWK_ISA_AVX512};
    for (int i = 0; i < 3; i++) {
        y[i] = malloc(ny * sizeof *y[i]);
        kwk_kernels_for(isas[i])->matmul(&p.m_t, x, n_tok, y[i], (long)rows, 0, rows);
    }
    T_EQ(differ(y[0], y[1], ny), 0);
    T_EQ(differ(y[0], y[2], ny), 0);
    for (int i = 0; i < 3; i++)
        free(y[i]);
    pair_free(&p);
    free(x);
}

int main(void)
{
    has_avx512 = kwk_kernels() == &kwk_kernels_avx512;
    has_amx = has_avx512 && kwk_cpu_amx_bf16();
    test_layout();
    test_split();
    test_spec();
    test_tables();
    test_exact();
    if (has_avx512) {
        test_ranges();
        test_no_scratch();
    } else {
        printf("test_bf16t: the AVX-512 table is not in use here (%s): its kernels not run\n",
               kwk_kernels()->name);
    }
    return t_report("test_bf16t");
}
