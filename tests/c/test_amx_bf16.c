/* test_amx_bf16.c - preserve's products on AMX-BF16 (kernels/amx_bf16.c): exact products (sums
 * that float holds exactly come out exactly), the double-precision sum to float rounding on
 * random data, batch invariance (a token alone, in batches of any size, over any row range:
 * bitwise), the chunk-by-chunk path without a staging buffer (bitwise the same), tails of rows
 * and columns that never read a neighbouring row, matrices at every offset from a cache line
 * (chunks then start on the rows' 64-byte boundaries: the head chunk never reads before a row),
 * infinities and NaN carried through, a decode step's vector engine bitwise the tile engine
 * over the whole float range; and what KWKER_AMX_PRESERVE chooses (row-major matrices in place
 * when "on"; packs in tile order, bf16t.h, unless "off"). On a CPU without AMX-BF16 only the
 * choice is checked (and said so). The AVX-512 table on this path runs all of test_kernels too
 * (ctest test_kernels_amx_preserve). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "kernels/amx_bf16.h"
#include "kernels/kernels.h"
#include "test.h"

#define SENTINEL (-12345.0f)

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* callers pass exact bf16 values */
}

static double bf16_val(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define BF16_NAN 0x7fc0

/* Room for a rows x cols bf16 matrix that starts off elements (0-31) past a 64-byte boundary,
 * as checkpoints place their tensors (at any 8-byte offset); at least 64 bytes before and after
 * it hold NaN, which a read outside the matrix would carry into the sums. *base is what to
 * free. */
static uint16_t *placed(int64_t rows, int64_t cols, int off, void **base)
{
    size_t n = (size_t)(rows * cols) + 96; /* 32 before, off <= 31 of lead-in, 33+ after */
    uint16_t *b = aligned_alloc(64, (n * sizeof *b + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++)
        b[i] = BF16_NAN;
    *base = b;
    return b + 32 + off;
}

/* ... holding random weights in [-1, 1) */
static uint16_t *random_weights(int64_t rows, int64_t cols, int off, void **base)
{
    uint16_t *w = placed(rows, cols, off, base);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = bf16_of(t_frand(-1.0f, 1.0f)); /* truncated: a bf16 value */
    return w;
}

static float *random_x(int n_tok, int64_t cols)
{
    float *x = malloc((size_t)n_tok * (size_t)cols * sizeof *x);
    for (int64_t i = 0; i < n_tok * cols; i++)
        x[i] = t_frand(-2.0f, 2.0f);
    return x;
}

static void fill(float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = SENTINEL;
}

/* Products whose float sums are exact: weights in {-1, 0, 1}, activations k * 2^-16 with
 * |k| < 2^19 (up to 19 significant bits, so all three bf16 parts are used), at most 32 columns:
 * every partial sum is a multiple of 2^-16 below 2^8, which float holds exactly. So the result
 * must be the exact sum, bitwise (one bf16 part alone would lose the low bits). */
static void test_exact(void)
{
    /* with 64 columns at offsets: a head, an aligned chunk and a tail */
    static const int64_t cols_list[] = {1, 7, 31, 32, 32, 64, 64};
    static const int offs[] = {0, 0, 0, 0, 13, 1, 31};
    for (size_t a = 0; a < KWK_ARRAY_LEN(cols_list); a++) {
        int64_t rows = 37, cols = cols_list[a];
        int n_tok = 12;
        void *base;
        uint16_t *w = placed(rows, cols, offs[a], &base);
        float *x = malloc((size_t)(n_tok * cols) * sizeof *x);
        float *y = malloc((size_t)(n_tok * rows) * sizeof *y);
        for (int64_t i = 0; i < rows * cols; i++)
            w[i] = bf16_of((float)((int)(t_rnd() % 3) - 1));
        for (int64_t i = 0; i < n_tok * cols; i++)
            x[i] = ldexpf((float)((int32_t)(t_rnd() % (1u << 20)) - (1 << 19) + 1), -16);
        struct kwk_mat m = {.wtype = KWK_W_BF16, .rows = rows, .cols = cols, .data = w};
        kwk_bf16_matmul_amx(&m, x, n_tok, y, (long)rows, 0, rows);
        long wrong = 0;
        for (int t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < rows; r++) {
                double s = 0;
                for (int64_t k = 0; k < cols; k++)
                    s += bf16_val(w[r * cols + k]) * (double)x[t * cols + k];
                wrong += (double)y[t * rows + r] != s;
            }
        T_CHECK(wrong == 0, "exact sums, cols=%lld offset %d: %ld of %lld differ",
                (long long)cols, offs[a], wrong, (long long)(rows * n_tok));
        free(base);
        free(x);
        free(y);
    }
}

/* Against the double sum on random data, rows [r0, r1) only (the rest and ldy's gap untouched),
 * every token alone bitwise the batch's, every row sub-range bitwise the whole. */
static void check_case(int64_t rows, int64_t cols, int n_tok, int64_t r0, int64_t r1, int off)
{
    void *base;
    uint16_t *w = random_weights(rows, cols, off, &base);
    float *x = random_x(n_tok, cols);
    long ldy = (long)rows + 5;
    size_t ny = (size_t)n_tok * (size_t)ldy;
    float *y = malloc(ny * sizeof *y), *y1 = malloc((size_t)ldy * sizeof *y1);
    fill(y, ny);
    struct kwk_mat m = {.wtype = KWK_W_BF16, .rows = rows, .cols = cols, .data = w};
    kwk_bf16_matmul_amx(&m, x, n_tok, y, ldy, r0, r1);
    long bad = 0, touched = 0, variant = 0;
    double worst = 0;
    for (int t = 0; t < n_tok; t++) {
        for (int64_t r = 0; r < ldy; r++) {
            float got = y[(size_t)t * (size_t)ldy + (size_t)r];
            if (r < r0 || r >= r1) {
                touched += got != SENTINEL;
                continue;
            }
            double s = 0, mag = 0;
            for (int64_t k = 0; k < cols; k++) {
                double p = bf16_val(w[r * cols + k]) * (double)x[(size_t)t * (size_t)cols + k];
                s += p;
                mag += fabs(p);
            }
            double err = fabs((double)got - s);
            bad += !(err <= 1e-6 * mag + 1e-30); /* float sums of exact products */
            if (mag > 0 && err / mag > worst)
                worst = err / mag;
        }
        /* alone, over two halves of the range */
        fill(y1, (size_t)ldy);
        int64_t mid = r0 + (r1 - r0) / 2;
        kwk_bf16_matmul_amx(&m, x + (size_t)t * (size_t)cols, 1, y1, ldy, r0, mid);
        kwk_bf16_matmul_amx(&m, x + (size_t)t * (size_t)cols, 1, y1, ldy, mid, r1);
        variant += memcmp(y1 + r0, y + (size_t)t * (size_t)ldy + r0,
                          (size_t)(r1 - r0) * sizeof *y1) != 0;
    }
    T_CHECK(bad == 0 && touched == 0 && variant == 0,
            "rows=%lld cols=%lld n_tok=%d [%lld,%lld) offset %d: %ld wrong (worst %.3g of the "
            "magnitude), %ld touched outside, %ld tokens differ alone", (long long)rows,
            (long long)cols, n_tok, (long long)r0, (long long)r1, off, bad, worst, touched,
            variant);
    /* without the staging buffer: the same bits */
    float *y2 = malloc(ny * sizeof *y2);
    fill(y2, ny);
    kwk_bf16_amx_test_no_scratch(1);
    kwk_bf16_matmul_amx(&m, x, n_tok, y2, ldy, r0, r1);
    kwk_bf16_amx_test_no_scratch(0);
    T_CHECK(memcmp(y, y2, ny * sizeof *y) == 0,
            "rows=%lld cols=%lld n_tok=%d offset %d: chunk-by-chunk staging changed the numbers",
            (long long)rows, (long long)cols, n_tok, off);
    free(base);
    free(x);
    free(y);
    free(y1);
    free(y2);
}

static void test_random(void)
{
    /* columns: under one chunk, around 32, several chunks with a tail, more than 4096 (decode
     * groups of two row blocks); tokens: one decode tile (1-5), tile pairs and an odd tile, more
     * than a staging block (12 tiles) */
    static const int64_t cols_list[] = {1, 31, 32, 33, 77, 576, 4127};
    static const int toks_list[] = {1, 2, 5, 6, 11, 23, 64};
    for (size_t a = 0; a < KWK_ARRAY_LEN(cols_list); a++)
        for (size_t b = 0; b < KWK_ARRAY_LEN(toks_list); b++) {
            int64_t cols = cols_list[a];
            int n = toks_list[b];
            if (cols > 1000 && n > 11)
                continue; /* the double reference's time */
            int off = (int)(a + b) % 32; /* cols a multiple of 32: a head chunk from 1 */
            check_case(67, cols, n, 0, 67, off);   /* row blocks of 4, 2 and 1, partial */
            check_case(9, cols, n, 0, 9, 0);       /* fewer rows than a tile */
            check_case(150, cols, n, 3, 141, 31);  /* a range not on block edges */
        }
    /* token blocks of 12 tiles take rows in column blocks of 85 chunks (2720 columns; 1 MiB
     * staged), their C tiles spilled between: two and three column blocks, a partial token
     * block after; aligned, and with a head chunk (the column blocks then cut at other
     * columns) */
    check_case(40, 2900, 64, 5, 37, 0);
    check_case(20, 6000, 60, 0, 20, 0);
    check_case(40, 2912, 64, 5, 37, 4);
    check_case(20, 6016, 60, 0, 20, 16);
    check_case(33, 64, 23, 0, 33, 1);
}

/* A range's rows and columns are all that is read: the rows around [r0, r1) are NaN, and a
 * column tail that read on into the next row would meet them (times zero: NaN). */
static void no_read_case(int64_t rows, int64_t cols, int64_t r0, int64_t r1, int n_tok, int off)
{
    void *base;
    uint16_t *w = random_weights(rows, cols, off, &base);
    for (int64_t r = 0; r < rows; r++)
        if (r < r0 || r >= r1)
            for (int64_t k = 0; k < cols; k++)
                w[r * cols + k] = BF16_NAN;
    float *x = random_x(n_tok, cols), *y = malloc((size_t)(n_tok * rows) * sizeof *y);
    fill(y, (size_t)(n_tok * rows));
    struct kwk_mat m = {.wtype = KWK_W_BF16, .rows = rows, .cols = cols, .data = w};
    kwk_bf16_matmul_amx(&m, x, n_tok, y, (long)rows, r0, r1);
    long nonfinite = 0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = r0; r < r1; r++)
            nonfinite += !isfinite(y[t * rows + r]);
    T_CHECK(nonfinite == 0, "cols=%lld offset %d: rows outside [%lld,%lld) leaked into %ld outputs",
            (long long)cols, off, (long long)r0, (long long)r1, nonfinite);
    free(base);
    free(x);
    free(y);
}

/* Where the rows lie 64 bytes apart, chunk 1 starts on a cache line of every row (the point of
 * the head chunk: a tile load of lines straddling rows read 31% slower); elsewhere there is no
 * head. Checked for every 2-byte offset from a line. */
static long chunks_aligned(int64_t cols)
{
    long wrong = 0;
    for (int off = 0; off < 32; off++) {
        void *base;
        uint16_t *w = placed(3, cols, off, &base);
        struct kwk_mat m = {.wtype = KWK_W_BF16, .rows = 3, .cols = cols, .data = w};
        int64_t lead = kwk_bf16_amx_test_lead(&m);
        for (int64_t r = 0; r < 3; r++)
            wrong += lead < 0 || lead > 31 ||
                     (lead > 0 && (uintptr_t)(w + r * cols + 32 - lead) % 64 != 0) ||
                     (lead == 0 && (uintptr_t)(w + r * cols) % 64 != 0);
        m.cols = cols - 1; /* rows an odd number of halves apart: no common boundary, no head */
        wrong += kwk_bf16_amx_test_lead(&m) != 0;
        free(base);
    }
    return wrong;
}

static void test_chunks_aligned(void)
{
    /* by default from HEAD_MIN_COLS (2048) columns; shorter rows keep no head */
    kwk_bf16_amx_test_head_cols(0);
    long wrong = chunks_aligned(2048), short_heads = 0;
    for (int off = 1; off < 32; off++) {
        void *base;
        uint16_t *w = placed(3, 1024, off, &base);
        struct kwk_mat m = {.wtype = KWK_W_BF16, .rows = 3, .cols = 1024, .data = w};
        short_heads += kwk_bf16_amx_test_lead(&m) != 0;
        free(base);
    }
    kwk_bf16_amx_test_head_cols(32);
    wrong += chunks_aligned(64);
    T_CHECK(wrong == 0 && short_heads == 0,
            "chunk 1 off a 64-byte boundary (or a head without one): %ld; heads on 1024-column "
            "rows: %ld", wrong, short_heads);
}

static void test_no_read_outside(void)
{
    no_read_case(40, 45, 8, 27, 7, 0);
    /* every offset from a cache line, with a head chunk (the lanes before column 0 are the row
     * before's, or the NaN before the matrix) and the tail: decode steps and a prompt, the
     * range from the first row and to the last */
    for (int off = 0; off < 32; off++) {
        no_read_case(40, 96, 8, 27, 1, off);
        no_read_case(40, 96, 0, 40, 13, off);
    }
}

/* An infinite activation times positive weights gives +inf (not inf - inf's NaN from its
 * parts), a NaN gives NaN, and other tokens are not touched by either. */
static void test_inf_nan(void)
{
    int64_t rows = 16, cols = 64;
    int n_tok = 3;
    void *base;
    uint16_t *w = placed(rows, cols, 0, &base);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = bf16_of(0.5f);
    float *x = random_x(n_tok, cols), *y = malloc((size_t)(n_tok * rows) * sizeof *y);
    x[0 * cols + 40] = INFINITY;
    x[1 * cols + 3] = NAN;
    struct kwk_mat m = {.wtype = KWK_W_BF16, .rows = rows, .cols = cols, .data = w};
    kwk_bf16_matmul_amx(&m, x, n_tok, y, (long)rows, 0, rows);
    long wrong = 0;
    for (int64_t r = 0; r < rows; r++)
        wrong += !(isinf(y[r]) && y[r] > 0) + !isnan(y[rows + r]) + !isfinite(y[2 * rows + r]);
    T_CHECK(wrong == 0, "inf / NaN activations: %ld outputs wrong", wrong);
    free(base);
    free(x);
    free(y);
}

/* u with an exponent e + [-4, 4], kept in 0-254 (no infinity or NaN) */
static uint32_t near_exp(uint32_t u, int e)
{
    int f = e + rand() % 9 - 4;
    f = f < 0 ? 0 : f > 254 ? 254 : f;
    return (u & 0x807fffffu) | (uint32_t)f << 23;
}

/* Random bits over the whole range: every exponent from zero (denormals, which the tile unit
 * reads as zero) to overflow, both signs, some zeros, infinities and NaNs when specials. */
static uint32_t wide_bits(int specials)
{
    uint32_t u = (uint32_t)rand() << 16 ^ (uint32_t)rand();
    if (specials && rand() % 64 == 0) {
        static const uint32_t sp[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0, 0x80000000u};
        return sp[rand() % 5];
    }
    uint32_t e = (uint32_t)(rand() % 255); /* 0-254: no infinity or NaN */
    return (u & 0x807fffffu) | e << 23;
}

/* A decode step (one token) on the vector engine (AVX-512 FMAs computing the tile unit's sums)
 * against the tile engine on the same call, bitwise (NaN against NaN): weights and activations
 * over the whole float range, so that sums underflow (flushed as the tile unit flushes them),
 * denormal weights and activation parts are read as zero, and products overflow. */
static void engines_case(int64_t rows, int64_t cols, int off, int specials)
{
    const int n_tok = 1;
    void *base;
    uint16_t *w = placed(rows, cols, off, &base);
    float *x = malloc((size_t)(n_tok * cols) * sizeof *x);
    size_t ny = (size_t)(n_tok * rows);
    float *yv = malloc(ny * sizeof *yv), *yt = malloc(ny * sizeof *yt);
    /* a scale a row and a token, so that each sum stays in one region of the range */
    for (int64_t r = 0; r < rows; r++) {
        int e = 1 + rand() % 254;
        for (int64_t k = 0; k < cols; k++) {
            uint32_t u = wide_bits(specials);
            if (!specials || rand() % 16) /* near the row's exponent; with specials not all */
                u = near_exp(u, e);
            w[r * cols + k] = (uint16_t)(u >> 16);
        }
    }
    for (int t = 0; t < n_tok; t++) {
        int e = 1 + rand() % 60; /* small: sums of rows of small weights underflow */
        for (int64_t k = 0; k < cols; k++) {
            uint32_t u = wide_bits(specials);
            if (!specials || rand() % 16)
                u = near_exp(u, e);
            memcpy(&x[t * cols + k], &u, 4);
        }
    }
    struct kwk_mat m = {.wtype = KWK_W_BF16, .rows = rows, .cols = cols, .data = w};
    kwk_bf16_matmul_amx(&m, x, n_tok, yv, (long)rows, 0, rows);
    kwk_bf16_amx_test_engine(1);
    kwk_bf16_matmul_amx(&m, x, n_tok, yt, (long)rows, 0, rows);
    kwk_bf16_amx_test_engine(0);
    long differ = 0, zeros = 0, nans = 0;
    for (size_t i = 0; i < ny; i++) {
        uint32_t a, b;
        memcpy(&a, &yv[i], 4);
        memcpy(&b, &yt[i], 4);
        differ += a != b && !(isnan(yv[i]) && isnan(yt[i]));
        zeros += yt[i] == 0;
        nans += isnan(yt[i]) != 0;
    }
    T_CHECK(differ == 0,
            "rows=%lld cols=%lld offset %d%s: %ld of %zu outputs differ between the vector and "
            "the tile engine", (long long)rows, (long long)cols, off,
            specials ? " (infinities, NaN)" : "", differ, ny);
    /* the premise: these sums reach the edges (some underflow to zero; NaN with specials) */
    if (cols >= 64 && !specials)
        T_CHECK(zeros > 0, "rows=%lld cols=%lld: no sum underflowed", (long long)rows,
                (long long)cols);
    if (cols >= 64 && specials)
        T_CHECK(nans > 0, "rows=%lld cols=%lld: no NaN", (long long)rows, (long long)cols);
    free(base);
    free(x);
    free(yv);
    free(yt);
}

static void test_engines_agree(void)
{
    static const int64_t cols_list[] = {1, 31, 32, 33, 77, 576, 2112};
    for (size_t a = 0; a < KWK_ARRAY_LEN(cols_list); a++)
        for (int sp = 0; sp < 2; sp++) /* 67 rows: 16 streams of 4, and 3 more */
            engines_case(67, cols_list[a], (int)(a * 7 + (size_t)sp) % 32, sp);
}

/* kwk_cpu_amx_preserve() (pack: kwk_cpu_amx_preserve_pack()) in a child with
 * KWKER_AMX_PRESERVE (and KWKER_AMX) set: the library reads them once, so these run before this
 * process detects anything. */
static int choice_with_env(const char *value, const char *amx, int pack)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (value)
            setenv("KWKER_AMX_PRESERVE", value, 1);
        else
            unsetenv("KWKER_AMX_PRESERVE");
        if (amx)
            setenv("KWKER_AMX", amx, 1);
        else
            unsetenv("KWKER_AMX");
        _exit(pack ? kwk_cpu_amx_preserve_pack() : kwk_cpu_amx_preserve());
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return -1;
    return WEXITSTATUS(st);
}

static int preserve_with_env(const char *value, const char *amx)
{
    return choice_with_env(value, amx, 0);
}

/* has: whether "on" is taken with KWKER_AMX as amx leaves it. Row-major matrices in place take
 * AMX only when asked; packs in tile order (kernels/bf16t.h) by default, unless "off". */
static void test_choice(int has, const char *amx)
{
    T_EQ(preserve_with_env(NULL, amx), 0); /* not the default */
    T_EQ(preserve_with_env("off", amx), 0);
    T_EQ(preserve_with_env("yes", amx), 0);
    T_EQ(preserve_with_env("on", amx), has);
    T_EQ(preserve_with_env("on", "off"), 0);
    T_EQ(choice_with_env(NULL, amx, 1), has); /* the default */
    T_EQ(choice_with_env("on", amx, 1), has);
    T_EQ(choice_with_env("yes", amx, 1), has); /* not a word it takes: the default */
    T_EQ(choice_with_env("off", amx, 1), 0);
    T_EQ(choice_with_env(NULL, "off", 1), 0);
}

int main(void)
{
    /* whether AMX-BF16 is usable here (the CPU has it, the OS grants the tile state, the ISA is
     * AVX-512 and KWKER_AMX is not off), as this process's environment leaves it: KWKER_AMX as
     * it is, the choice asked for */
    const char *isa = getenv("KWKER_ISA"), *amx = getenv("KWKER_AMX");
    int has = preserve_with_env("on", amx);
    test_choice(has, amx);
    int expect = t_cpu_amx_bf16() && kwk_isa() == KWK_ISA_AVX512 && !(amx && !strcmp(amx, "off"));
    T_CHECK(has == expect && kwk_cpu_amx_bf16() == has,
            "KWKER_AMX_PRESERVE=on gives %d, kwk_cpu_amx_bf16() %d, the CPU flags say %d "
            "(KWKER_ISA=%s)", has, kwk_cpu_amx_bf16(), expect, isa ? isa : "");
    if (!has) {
        printf("test_amx_bf16: no AMX-BF16 in use here: only the choice was checked\n");
        return t_report("test_amx_bf16");
    }
    /* heads from 32 columns, so that the small matrices below take them (test_chunks_aligned
     * checks the default) */
    kwk_bf16_amx_test_head_cols(32);
    test_exact();
    test_random();
    test_chunks_aligned();
    test_no_read_outside();
    test_inf_nan();
    test_engines_agree();
    return t_report("test_amx_bf16");
}
