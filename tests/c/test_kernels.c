/* test_kernels.c - ref.c against naive double-precision math, and every SIMD table this CPU runs
 * against ref.c on odd sizes, all weight types, sub-ranges of rows and many token counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/base.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#define T_RNG_SEED 0x9e3779b97f4a7c15ull
#include "test.h"


/* Independent decoders for the double-precision check (not the library's own). */
static double f16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double bf16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
    double v = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
    return s ? -v : v;
}

/* Random weights of magnitude about 2^-6..2^4; f16 includes some subnormals. */
static void *make_weights(int wtype, size_t n)
{
    if (wtype == KWK_W_F32) {
        float *w = malloc(n * sizeof *w);
        for (size_t i = 0; i < n; i++)
            w[i] = t_frand(-2.0f, 2.0f);
        return w;
    }
    uint16_t *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) {
        uint32_t s = t_rnd() & 1, r = t_rnd();
        if (wtype == KWK_W_F16) {
            uint32_t e = r % 16 == 0 ? 0 : 9 + r % 10;
            w[i] = (uint16_t)(s << 15 | e << 10 | (t_rnd() & 0x3ff));
        } else {
            uint32_t e = 121 + r % 10;
            w[i] = (uint16_t)(s << 15 | e << 7 | (t_rnd() & 0x7f));
        }
    }
    return w;
}

static double weight_value(const struct kwk_mat *w, int64_t r, int64_t k)
{
    size_t i = (size_t)(r * w->cols + k);
    switch (w->wtype) {
    case KWK_W_F16: return f16_value(((const uint16_t *)w->data)[i]);
    case KWK_W_BF16: return bf16_value(((const uint16_t *)w->data)[i]);
    default: return ((const float *)w->data)[i];
    }
}

static float *make_floats(size_t n, float lo, float hi)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = t_frand(lo, hi);
    return x;
}

static const char *wname(int wt)
{
    return wt == KWK_W_F32 ? "f32" : wt == KWK_W_F16 ? "f16" : "bf16";
}

#define SENTINEL 12345.0f

/* One matmul case: the kernel table k against ref (or, with k == NULL, ref against double).
 * Rows outside [r0,r1) and the gap between rows and ldy must stay untouched. */
static void check_matmul(const struct kwk_kernels *k, int wt, int64_t rows, int64_t cols,
                         int n_tok, int64_t r0, int64_t r1)
{
    struct kwk_mat w = {
        .wtype = wt, .rows = rows, .cols = cols, .data = make_weights(wt, (size_t)(rows * cols))};
    float *x = make_floats((size_t)(n_tok * cols), -1.0f, 1.0f);
    long ldy = (long)rows + 3;
    size_t ny = (size_t)n_tok * (size_t)ldy;
    float *y = malloc(ny * sizeof *y), *yr = malloc(ny * sizeof *yr);
    for (size_t i = 0; i < ny; i++)
        y[i] = yr[i] = SENTINEL;
    if (k)
        k->matmul(&w, x, n_tok, y, ldy, r0, r1);
    kwk_kernels_ref.matmul(&w, x, n_tok, yr, ldy, r0, r1);
    long bad = 0, untouched = 0;
    double worst = 0.0;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < ldy; r++) {
            size_t i = (size_t)t * (size_t)ldy + (size_t)r;
            if (r < r0 || r >= r1) {
                untouched += y[i] != SENTINEL || yr[i] != SENTINEL;
                continue;
            }
            double exact = 0.0, mag = 0.0;
            for (int64_t c = 0; c < cols; c++) {
                double p = weight_value(&w, r, c) * (double)x[(size_t)(t * cols + c)];
                exact += p;
                mag += fabs(p);
            }
            /* Float32 sums in any order are within a few eps*sqrt(n) of the magnitude. */
            double tol = 1e-5 * mag + 1e-30;
            double want = k ? yr[i] : exact;
            double got = k ? y[i] : yr[i];
            double err = fabs(got - want);
            if (!(err <= tol))
                bad++;
            if (mag > 0 && err / mag > worst)
                worst = err / mag;
        }
    T_CHECK(bad == 0 && untouched == 0,
            "%s matmul %s rows=%lld cols=%lld n_tok=%d [%lld,%lld): %ld wrong (worst %.3g), "
            "%ld touched outside", k ? k->name : "ref-vs-double", wname(wt), (long long)rows,
            (long long)cols, n_tok, (long long)r0, (long long)r1, bad, worst, untouched);
    free((void *)w.data);
    free(x);
    free(y);
    free(yr);
}

static void test_matmul(const struct kwk_kernels *k)
{
    static const int64_t cols_list[] = {1, 7, 15, 16, 17, 63, 65, 80, 577};
    static const int64_t rows_list[] = {1, 3, 5, 17};
    static const int toks_list[] = {1, 2, 3, 5, 9, 33};
    for (int wt = 0; wt < KWK_W_COUNT; wt++)
        for (size_t a = 0; a < KWK_ARRAY_LEN(cols_list); a++)
            for (size_t b = 0; b < KWK_ARRAY_LEN(rows_list); b++)
                for (size_t c = 0; c < KWK_ARRAY_LEN(toks_list); c++) {
                    int64_t rows = rows_list[b];
                    check_matmul(k, wt, rows, cols_list[a], toks_list[c], 0, rows);
                    if (rows > 2)
                        check_matmul(k, wt, rows, cols_list[a], toks_list[c], 1, rows - 1);
                    if (rows == 17)
                        check_matmul(k, wt, rows, cols_list[a], toks_list[c], 6, 11);
                }
    /* Column passes and token blocks of the prompt path (more than 2048 columns, more than
     * 96 tokens), decode rows longer than any unrolled step, and decode over enough row blocks
     * for a tile of four and a next tile to prefetch (AVX-512: eight blocks of 16 rows). */
    for (int wt = 0; wt < KWK_W_COUNT; wt++) {
        check_matmul(k, wt, 9, 4500, 7, 0, 9);
        check_matmul(k, wt, 6, 2049, 101, 1, 6);
        check_matmul(k, wt, 13, 4099, 1, 2, 13);
        check_matmul(k, wt, 200, 333, 1, 3, 197);
    }
}

/* Batch invariance (kernels.h): token t's outputs are bitwise the same computed alone, in a
 * batch of n_tok, and over any row sub-range. */
static void check_batch_invariance(const struct kwk_kernels *k, int wt, int64_t rows,
                                   int64_t cols, int n_tok)
{
    struct kwk_mat w = {
        .wtype = wt, .rows = rows, .cols = cols, .data = make_weights(wt, (size_t)(rows * cols))};
    float *x = make_floats((size_t)(n_tok * cols), -1.0f, 1.0f);
    float *yb = malloc((size_t)(n_tok * rows) * sizeof *yb), *y1 = malloc((size_t)rows * sizeof *y1);
    k->matmul(&w, x, n_tok, yb, (long)rows, 0, rows);
    long diff = 0;
    for (int t = 0; t < n_tok; t++) {
        k->matmul(&w, x + (size_t)t * (size_t)cols, 1, y1, (long)rows, 0, rows / 2);
        k->matmul(&w, x + (size_t)t * (size_t)cols, 1, y1, (long)rows, rows / 2, rows);
        diff += memcmp(y1, yb + (size_t)t * (size_t)rows, (size_t)rows * sizeof *y1) != 0;
    }
    T_CHECK(diff == 0, "%s %s rows=%lld cols=%lld n_tok=%d: %ld tokens differ from alone",
            k->name, wname(wt), (long long)rows, (long long)cols, n_tok, diff);
    free((void *)w.data);
    free(x);
    free(yb);
    free(y1);
}

static void test_batch_invariance(const struct kwk_kernels *k)
{
    for (int wt = 0; wt < KWK_W_COUNT; wt++) {
        check_batch_invariance(k, wt, 37, 577, 9);
        check_batch_invariance(k, wt, 21, 4500, 7);
        check_batch_invariance(k, wt, 5, 80, 130);
        /* decode's runs of rows (float_rows.h): runs of 6 and 7 rows and a rest, two KC
         * passes */
        check_batch_invariance(k, wt, 54, 2056, 3);
    }
}

static int close_rel(double got, double want, double rel, double abs_tol)
{
    if (isnan(want))
        return isnan(got);
    if (isinf(want))
        return got == want;
    return fabs(got - want) <= rel * fabs(want) + abs_tol;
}

static const long vec_sizes[] = {1, 2, 7, 8, 15, 16, 17, 31, 33, 63, 65, 80, 577, 4099};

static void test_vector_ops(const struct kwk_kernels *k)
{
    for (size_t s = 0; s < KWK_ARRAY_LEN(vec_sizes); s++) {
        long n = vec_sizes[s];
        float *a = make_floats((size_t)n, -2.0f, 2.0f), *b = make_floats((size_t)n, -2.0f, 2.0f);
        float *w = make_floats((size_t)n, 0.5f, 1.5f);
        float *y1 = malloc((size_t)n * sizeof *y1), *y2 = malloc((size_t)n * sizeof *y2);
        long bad = 0;

        double mag = 0.0;
        for (long i = 0; i < n; i++)
            mag += fabs((double)a[i] * b[i]);
        float dk = k->dot(a, b, n), dr = kwk_kernels_ref.dot(a, b, n);
        T_CHECK(fabs(dk - dr) <= 1e-5 * mag, "%s dot n=%ld: %.9g vs %.9g", k->name, n, dk, dr);

        memcpy(y1, b, (size_t)n * sizeof *y1);
        memcpy(y2, b, (size_t)n * sizeof *y2);
        k->axpy(y1, 0.37f, a, n);
        kwk_kernels_ref.axpy(y2, 0.37f, a, n);
        for (long i = 0; i < n; i++)
            bad += !(fabs(y1[i] - y2[i]) <= 1e-6 * (fabs(b[i]) + fabs(0.37 * a[i])));
        T_CHECK(bad == 0, "%s axpy n=%ld: %ld wrong", k->name, n, bad);

        for (int with_w = 0; with_w < 2; with_w++) {
            bad = 0;
            k->rmsnorm(y1, a, with_w ? w : NULL, n, 1e-6f);
            kwk_kernels_ref.rmsnorm(y2, a, with_w ? w : NULL, n, 1e-6f);
            for (long i = 0; i < n; i++)
                bad += !close_rel(y1[i], y2[i], 1e-5, 1e-30);
            /* in place */
            memcpy(y1, a, (size_t)n * sizeof *y1);
            k->rmsnorm(y1, y1, with_w ? w : NULL, n, 1e-6f);
            for (long i = 0; i < n; i++)
                bad += !close_rel(y1[i], y2[i], 1e-5, 1e-30);
            T_CHECK(bad == 0, "%s rmsnorm n=%ld w=%d: %ld wrong", k->name, n, with_w, bad);
        }

        /* softmax over a wide range so that tiny and subnormal exps appear */
        float *sx = make_floats((size_t)n, -60.0f, 60.0f);
        memcpy(y1, sx, (size_t)n * sizeof *y1);
        memcpy(y2, sx, (size_t)n * sizeof *y2);
        k->softmax(y1, n);
        kwk_kernels_ref.softmax(y2, n);
        /* Against double precision from the same float32 differences x - max (their rounding
         * is part of the algorithm, as in PyTorch): exp to ~1e-7 plus the float32 sum, whose
         * rounding grows with n (ref.c's sequential sum included). */
        double mx = -INFINITY, sum = 0.0, tol = 1e-6 + 1e-7 * sqrt((double)n), worst = 0.0;
        for (long i = 0; i < n; i++)
            mx = fmax(mx, sx[i]);
        for (long i = 0; i < n; i++)
            sum += exp((double)(sx[i] - (float)mx));
        bad = 0;
        for (long i = 0; i < n; i++) {
            double want = exp((double)(sx[i] - (float)mx)) / sum;
            bad += !close_rel(y1[i], want, tol, 1e-40) + !close_rel(y2[i], want, tol, 1e-40);
            if (want > 1e-30)
                worst = fmax(worst, fabs(y1[i] - want) / want);
        }
        T_CHECK(bad == 0, "%s softmax n=%ld: %ld wrong (worst rel %.3g)", k->name, n, bad, worst);

        float *g = make_floats((size_t)n, -12.0f, 12.0f);
        /* the two gates: SiLU and GELU-tanh */
        void (*const gates[2])(float *, const float *, long) = {k->swiglu, k->geglu};
        void (*const refs[2])(float *, const float *, long) = {kwk_kernels_ref.swiglu,
                                                               kwk_kernels_ref.geglu};
        for (int v = 0; v < 2; v++) {
            memcpy(y1, g, (size_t)n * sizeof *y1);
            memcpy(y2, g, (size_t)n * sizeof *y2);
            gates[v](y1, b, n);
            refs[v](y2, b, n);
            bad = 0;
            for (long i = 0; i < n; i++)
                bad += !close_rel(y1[i], y2[i], 1e-6, 1e-37);
            T_CHECK(bad == 0, "%s %s n=%ld: %ld wrong", k->name, v ? "geglu" : "swiglu", n, bad);
        }

        free(a); free(b); free(w); free(y1); free(y2); free(sx); free(g);
    }
}

/* The vectorized exp across the whole float range, through swiglu with u = 1: relative error
 * against double-precision SiLU, plus the overflow / underflow / NaN edges. */
static void test_exp_range(const struct kwk_kernels *k)
{
    enum { N = 40000 };
    float *g = malloc(N * sizeof *g), *u = malloc(N * sizeof *u);
    for (int i = 0; i < N; i++) {
        g[i] = -100.0f + 200.0f * (float)i / N;
        u[i] = 1.0f;
    }
    float *orig = malloc(N * sizeof *orig), *gr = malloc(N * sizeof *gr);
    memcpy(orig, g, N * sizeof *g);
    memcpy(gr, g, N * sizeof *g);
    k->swiglu(g, u, N);
    kwk_kernels_ref.swiglu(gr, u, N);
    long bad = 0;
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double x = orig[i], want = x / (1.0 + exp(-x));
        double rel = want != 0 ? fabs(g[i] - want) / fabs(want) : fabs(g[i]);
        /* Below about -80 the result nears the subnormal range and, once exp(-x) overflows,
         * becomes -0 in float32 (as in PyTorch): there the reference is ref.c, to a few ulps. */
        if (x >= -80.0 && rel > 1e-6)
            bad++;
        if (!close_rel(g[i], gr[i], 1e-6, 3e-45))
            bad++;
        if (x >= -80.0 && rel > worst)
            worst = rel;
    }
    T_CHECK(bad == 0, "%s silu over [-100,100]: %ld wrong, worst rel %.3g", k->name, bad, worst);

    float edge[6] = {INFINITY, -INFINITY, NAN, 0.0f, 89.0f, -89.0f}, one[6] = {1, 1, 1, 1, 1, 1};
    k->swiglu(edge, one, 6);
    T_TRUE(edge[0] == INFINITY || isnan(edge[0])); /* inf/(1+0) = inf */
    T_TRUE(isnan(edge[2]));
    T_TRUE(edge[3] == 0.0f);
    T_NEAR(edge[4], 89.0, 1e-4);
    T_TRUE(fabsf(edge[5]) < 1e-30f);

    float sm[4] = {-INFINITY, 0.0f, 0.0f, -1000.0f};
    k->softmax(sm, 4);
    T_TRUE(sm[0] == 0.0f && sm[3] == 0.0f);
    T_NEAR(sm[1], 0.5, 1e-7);
    free(g); free(u); free(orig); free(gr);
}

/* ref.c's own vector kernels against double precision. */
static void test_ref_vs_double(void)
{
    const struct kwk_kernels *k = &kwk_kernels_ref;
    long n = 577;
    float *x = make_floats((size_t)n, -3.0f, 3.0f), *w = make_floats((size_t)n, 0.5f, 1.5f);
    float *y = malloc((size_t)n * sizeof *y);
    double ss = 0.0;
    for (long i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double scale = 1.0 / sqrt(ss / n + 1e-5);
    k->rmsnorm(y, x, w, n, 1e-5f);
    long bad = 0;
    for (long i = 0; i < n; i++)
        bad += !close_rel(y[i], x[i] * scale * w[i], 1e-5, 0);
    T_EQ(bad, 0);

    memcpy(y, x, (size_t)n * sizeof *y);
    k->softmax(y, n);
    double mx = -INFINITY, sum = 0.0;
    for (long i = 0; i < n; i++)
        mx = fmax(mx, x[i]);
    for (long i = 0; i < n; i++)
        sum += exp(x[i] - mx);
    bad = 0;
    for (long i = 0; i < n; i++)
        bad += !close_rel(y[i], exp(x[i] - mx) / sum, 1e-5, 0);
    T_EQ(bad, 0);

    memcpy(y, x, (size_t)n * sizeof *y);
    k->swiglu(y, w, n);
    bad = 0;
    for (long i = 0; i < n; i++)
        bad += !close_rel(y[i], x[i] / (1.0 + exp(-(double)x[i])) * w[i], 1e-5, 1e-30);
    T_EQ(bad, 0);

    /* geglu against PyTorch's own formula, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in
     * double: the identity x / (1 + exp(-2y)) changes only rounding */
    memcpy(y, x, (size_t)n * sizeof *y);
    k->geglu(y, w, n);
    bad = 0;
    for (long i = 0; i < n; i++) {
        double v = x[i], t = tanh(sqrt(2.0 / 3.14159265358979323846) * (v + 0.044715 * v * v * v));
        bad += !close_rel(y[i], 0.5 * v * (1.0 + t) * w[i], 1e-5, 1e-30);
    }
    T_EQ(bad, 0);

    double d = 0.0, mag = 0.0;
    for (long i = 0; i < n; i++) {
        d += (double)x[i] * w[i];
        mag += fabs((double)x[i] * w[i]);
    }
    T_NEAR(k->dot(x, w, n), d, 1e-5 * mag);
    free(x); free(w); free(y);
}

/* The exact GELU, x (1 + erf(x / sqrt2)) / 2, against double precision over the range where it
 * is neither x nor 0 in float and beyond, both polynomials of gelu_erf.h and the switch between
 * them at |x| = sqrt2, plus a masked or scalar tail (n not a multiple of the vector) and NaN. */
static void test_gelu(const struct kwk_kernels *k)
{
    enum { N = 60001 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    for (int i = 0; i < N; i++)
        x[i] = -30.0f + 60.0f * (float)i / (N - 1);
    x[N / 2] = 1.41421356f; /* the switch */
    x[N / 2 + 1] = nanf("");
    memcpy(y, x, N * sizeof *y);
    k->gelu(y, N);
    /* ref.c computes 1 + erff as PyTorch does, which cancels for negative x: within 3e-7 of
     * the value there; the polynomials take erfc directly and stay relative */
    double abs_tol = k == &kwk_kernels_ref ? 3e-7 : 1e-37;
    long bad = 0;
    double worst = 0.0, worst_x = 0.0;
    for (int i = 0; i < N; i++) {
        double v = x[i], want = 0.5 * v * erfc(-v / sqrt(2.0));
        bad += !close_rel(y[i], want, 2e-6, abs_tol);
        if (fabs(want) > 1e-30 && fabs(y[i] - want) / fabs(want) > worst) {
            worst = fabs(y[i] - want) / fabs(want);
            worst_x = v;
        }
    }
    T_CHECK(bad == 0, "%s gelu: %ld wrong (worst rel %.3g at x = %g)", k->name, bad, worst,
            worst_x);
    T_TRUE(isnan(y[N / 2 + 1]));
    float z = 0.0f;
    k->gelu(&z, 1);
    T_TRUE(z == 0.0f);
    /* huge and infinite inputs: x itself, or (nearly) nothing, as erfc makes them; never NaN */
    float big[5] = {3e38f, -3e38f, 2e19f, -2e19f, INFINITY};
    k->gelu(big, 5);
    T_CHECK(big[0] == 3e38f && big[2] == 2e19f && big[4] == INFINITY,
            "%s gelu of huge x: %g %g %g", k->name, big[0], big[2], big[4]);
    T_CHECK(fabsf(big[1]) <= 1e-30f && fabsf(big[3]) <= 1e-30f && big[1] <= 0.0f,
            "%s gelu of huge -x: %g %g", k->name, big[1], big[3]);
    free(x);
    free(y);
}

static void test_mat_row(const struct kwk_kernels *k)
{
    for (int wt = 0; wt < KWK_W_COUNT; wt++) {
        int64_t rows = 3, cols = 37;
        struct kwk_mat w = {.wtype = wt,
                            .rows = rows,
                            .cols = cols,
                            .data = make_weights(wt, (size_t)(rows * cols))};
        float a[37], b[37];
        long bad = 0;
        for (int64_t r = 0; r < rows; r++) {
            k->mat_row(&w, r, a);
            kwk_kernels_ref.mat_row(&w, r, b);
            for (int64_t c = 0; c < cols; c++)
                bad += a[c] != b[c] || (double)b[c] != weight_value(&w, r, c);
        }
        T_CHECK(bad == 0, "%s mat_row %s: %ld differ", k->name, wname(wt), bad);
        free((void *)w.data);
    }
}

/* Detection (kwk_isa() and the prefetch choices) runs once per process, so each value of an
 * environment variable is tried in a child process (unset when value is NULL), which reports
 * probe()'s result through its exit status; -1 if the child failed. */
static int in_child_with_env(const char *var, const char *value, int (*probe)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        if (value)
            setenv(var, value, 1);
        else
            unsetenv(var);
        _exit(probe());
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

/* The ISA chosen, plus 10 if the table does not match it. */
static int isa_probe(void)
{
    int isa = kwk_isa();
    int ok = kwk_kernels() == kwk_kernels_for(isa) &&
             kwk_kernels_for(KWK_ISA_AVX512) == kwk_kernels_for(isa) &&
             !strcmp(kwk_kernels()->name, kwk_isa_name(isa));
    return isa + (ok ? 0 : 10);
}

static int isa_with_env(const char *value)
{
    return in_child_with_env("KWKER_ISA", value, isa_probe);
}

static void test_isa_env(void)
{
    int best = isa_with_env(NULL);
    T_TRUE(best >= KWK_ISA_SCALAR && best <= KWK_ISA_AVX512);
    T_EQ(isa_with_env("scalar"), KWK_ISA_SCALAR);
    T_EQ(isa_with_env("bogus"), best); /* unknown: warned about and ignored */
    T_EQ(isa_with_env("avx512"), best); /* never raised above the CPU */
    T_EQ(isa_with_env("avx2"), best >= KWK_ISA_AVX2 ? KWK_ISA_AVX2 : best);
    T_STREQ(kwk_isa_name(KWK_ISA_AVX2), "avx2");
    T_STREQ(kwk_isa_name(99), "unknown");
}

/* 2 * whether AVX-512's int8 decode tiles prefetch + whether AVX2's do. */
static int prefetch_int8_probe(void)
{
    return 2 * kwk_cpu_prefetch_int8(KWK_ISA_AVX512) + kwk_cpu_prefetch_int8(KWK_ISA_AVX2);
}

static int prefetch_int8_with_env(const char *value)
{
    return in_child_with_env("KWKER_PREFETCH_INT8", value, prefetch_int8_probe);
}

/* on / off set both ISAs' choice; anything else keeps the CPU's, where AVX2's tiles always
 * prefetch (32-46% slower without, even on Zen 5). */
static void test_prefetch_int8_env(void)
{
    int dflt = prefetch_int8_with_env(NULL);
    T_TRUE(dflt == 1 || dflt == 3);
    T_EQ(prefetch_int8_with_env("on"), 3);
    T_EQ(prefetch_int8_with_env("off"), 0);
    T_EQ(prefetch_int8_with_env("of"), dflt); /* warned about and ignored */
    T_EQ(prefetch_int8_with_env(""), dflt);
}

/* The decode prefetch level for a model's bytes a token (kwk_cpu_prefetch_l2_for), as bits:
 * 1 the CPU's default, 2 for 1 KiB, 4 for half the last-level cache, 8 for twice it (or for
 * 1 PB where the size is unknown), 16 a matrix asking L1, 32 one asking L2, 64 one asking
 * nothing (the default). */
static int prefetch_for_probe(void)
{
    double llc = kwk_cpu_llc_bytes(); /* test_llc checks it */
    double big = llc > 0 ? 2.0 * llc : 1e15, half = llc > 0 ? 0.5 * llc : 1024;
    struct kwk_mat l1 = {.wtype = KWK_W_Q8, .prefetch = 1}, l2 = {.wtype = KWK_W_Q8, .prefetch = 2},
                   dflt = {.wtype = KWK_W_Q8};
    return kwk_cpu_prefetch_l2() | kwk_cpu_prefetch_l2_for(1024) << 1 |
           kwk_cpu_prefetch_l2_for(half) << 2 | kwk_cpu_prefetch_l2_for(big) << 3 |
           kwk_mat_prefetch_l2(&l1) << 4 | kwk_mat_prefetch_l2(&l2) << 5 |
           kwk_mat_prefetch_l2(&dflt) << 6;
}

/* kwk_cpu_past_llc as bits: 1 for no bytes, 2 for 1 KiB, 4 for the last-level cache's size, 8
 * for twice it (1 PB where the size is unknown). */
static int past_llc_probe(void)
{
    double llc = kwk_cpu_llc_bytes();
    double at = llc > 0 ? llc : 1e15, twice = llc > 0 ? 2.0 * llc : 1e15;
    return kwk_cpu_past_llc(0.0) | kwk_cpu_past_llc(1024.0) << 1 | kwk_cpu_past_llc(at) << 2 |
           kwk_cpu_past_llc(twice) << 3;
}

/* Whether the last-level cache's size is known, asked in a child: the parent must not detect the
 * CPU before the children that set KWKER_PREFETCH do. */
static int llc_known_probe(void)
{
    return kwk_cpu_llc_bytes() > 0;
}

/* The CPU's default where weights fit the last-level cache, L2 where they exceed it (when its
 * size is known); KWKER_PREFETCH=l1|l2 decides all; a matrix's own choice wins over the CPU's. */
static void test_prefetch_for_bytes(void)
{
    int known = in_child_with_env("KWKER_PREFETCH", NULL, llc_known_probe);
    T_TRUE(known == 0 || known == 1);
    int r = in_child_with_env("KWKER_PREFETCH", NULL, prefetch_for_probe);
    T_TRUE(r >= 0);
    int dflt = r & 1;
    T_EQ(r >> 1 & 1, dflt);
    T_EQ(r >> 2 & 1, dflt);
    T_EQ(r >> 3 & 1, known ? 1 : dflt);
    T_EQ(r >> 4 & 7, 2 | dflt << 2); /* L1 asked: 0; L2 asked: 1; none: the CPU's */
    T_EQ(in_child_with_env("KWKER_PREFETCH", "l1", prefetch_for_probe), 0 | 1 << 5);
    T_EQ(in_child_with_env("KWKER_PREFETCH", "l2", prefetch_for_probe), 0x0f | 1 << 5 | 1 << 6);
    /* past the last-level cache: only beyond its size, and never where the size is unknown;
     * KWKER_PREFETCH does not enter into it */
    int past = known == 1;
    T_EQ(in_child_with_env("KWKER_PREFETCH", NULL, past_llc_probe), past << 3);
    T_EQ(in_child_with_env("KWKER_PREFETCH", "l1", past_llc_probe), past << 3);
    T_EQ(in_child_with_env("KWKER_PREFETCH", "l2", past_llc_probe), past << 3);
}

/* Whether the AVX2 quantized kernels use AVX-VNNI: the CPU's answer unless KWKER_AVXVNNI=off;
 * "on" cannot add what the CPU lacks, and other values are warned about and ignored. */
static int avxvnni_with_env(const char *value)
{
    return in_child_with_env("KWKER_AVXVNNI", value, kwk_cpu_avxvnni);
}

static void test_avxvnni_env(void)
{
    int has = t_cpu_avxvnni();
    T_EQ(avxvnni_with_env(NULL), has);
    T_EQ(avxvnni_with_env("on"), has);
    T_EQ(avxvnni_with_env("off"), 0);
    T_EQ(avxvnni_with_env("yes"), has);
}

/* Whether the AVX-512 prompt tiles use AMX: where the CPU has it (and the OS grants its state,
 * which Linux since 5.16 does on request) unless KWKER_AMX=off; "on" cannot add what the CPU
 * lacks, other values are warned about and ignored. Under KWKER_ISA below avx512 (this
 * binary's ctest runs) never. */
static int amx_with_env(const char *value)
{
    return in_child_with_env("KWKER_AMX", value, kwk_cpu_amx);
}

/* The same for the attention's bf16 products (kwk_cpu_amx_bf16): AMX-BF16 as well. */
static int amx_bf16_with_env(const char *value)
{
    return in_child_with_env("KWKER_AMX", value, kwk_cpu_amx_bf16);
}

static void test_amx_env(void)
{
    /* each probe detects afresh in its child: this process's own detection comes after them */
    int dflt = amx_with_env(NULL), on = amx_with_env("on"), off = amx_with_env("off"),
        other = amx_with_env("yes");
    int bf_dflt = amx_bf16_with_env(NULL), bf_on = amx_bf16_with_env("on"),
        bf_off = amx_bf16_with_env("off");
    int has = t_cpu_amx() && kwk_isa() == KWK_ISA_AVX512;
    T_EQ(dflt, has);
    T_EQ(on, has);
    T_EQ(off, 0);
    T_EQ(other, has);
    int bf = has && t_cpu_amx_bf16();
    T_EQ(bf_dflt, bf);
    T_EQ(bf_on, bf);
    T_EQ(bf_off, 0);
}

/* to_half (the half KV cache's stores): bitwise kwk_f32_to_f16 over a sweep of float bit patterns
 * (every sign, exponent and rounding case, subnormals, the saturation edge, infinities, NaNs) at
 * lengths with every tail; and kwk_f32_to_f16 itself against the halves' own values: each finite
 * half comes back unchanged, and the midpoint between two neighbours rounds to the even one. */
static void test_to_half(const struct kwk_kernels *k)
{
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x);
    uint16_t *got = malloc(N * sizeof *got);
    for (uint32_t i = 0; i < N; i++) {
        union {
            uint32_t u;
            float f;
        } v = {(uint32_t)(i * 4099u) ^ (i << 22)};
        x[i] = v.f;
    }
    const float edge[] = {65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e9f,     INFINITY, -INFINITY,
                          NAN,      -NAN,      5.96e-8f, 2.98e-8f,  2.99e-8f, 6.1e-5f,  -0.0f};
    memcpy(x, edge, sizeof edge);
    long bad = 0;
    k->to_half(got, x, N);
    for (long i = 0; i < N; i++)
        bad += got[i] != kwk_f32_to_f16(x[i]);
    for (long n = 1; n <= 40; n++) { /* tails: nothing past n is written */
        memset(got, 0xab, 64 * sizeof *got);
        k->to_half(got, x + 3, n);
        for (long i = 0; i < n; i++)
            bad += got[i] != kwk_f32_to_f16(x[3 + i]);
        bad += got[n] != 0xabab;
    }
    T_CHECK(bad == 0, "%s to_half: %ld values differ from kwk_f32_to_f16", k->name, bad);
    /* from_half: every half, exactly kwk_f16_to_f32 (a NaN as a NaN: the hardware quiets
     * signalling ones), at lengths with every tail */
    uint16_t *h = malloc(0x10000 * sizeof *h);
    float *back = malloc(0x10001 * sizeof *back);
    for (uint32_t i = 0; i < 0x10000u; i++)
        h[i] = (uint16_t)(i * 40503u); /* a permutation of all halves */
    long wrong = 0;
    for (long n = 0x10000 - 40; n <= 0x10000; n++) {
        back[n] = -1.0f;
        k->from_half(back, h, n);
        for (long i = n - 40; i < n; i++) {
            float want = kwk_f16_to_f32(h[i]);
            wrong += isnan(want) ? !isnan(back[i]) : memcmp(&back[i], &want, sizeof want) != 0;
        }
        wrong += back[n] != -1.0f;
    }
    for (long i = 0; i < 0x10000; i++) {
        float want = kwk_f16_to_f32(h[i]);
        wrong += isnan(want) ? !isnan(back[i]) : memcmp(&back[i], &want, sizeof want) != 0;
    }
    T_CHECK(wrong == 0, "%s from_half: %ld values differ from kwk_f16_to_f32", k->name, wrong);
    free(h);
    free(back);
    if (k == &kwk_kernels_ref) {
        long wrong = 0;
        for (uint32_t h = 0; h < 0x10000u; h++) {
            if ((h & 0x7c00u) == 0x7c00u)
                continue; /* infinities saturate, NaNs are one pattern: the edges above */
            float f = kwk_f16_to_f32((uint16_t)h);
            wrong += (uint32_t)kwk_f32_to_f16(f) != h;
            if ((h & 0x7fffu) < 0x7bffu) { /* the midpoint to the next half away from zero */
                double mid = ((double)f + (double)kwk_f16_to_f32((uint16_t)(h + 1))) / 2.0;
                uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
                wrong += kwk_f32_to_f16((float)mid) != (uint32_t)even;
            }
        }
        T_CHECK(wrong == 0, "kwk_f32_to_f16: %ld halves do not round trip or tie to even", wrong);
        T_EQ(kwk_f32_to_f16(1e9f), 0x7bff);
        T_EQ(kwk_f32_to_f16(-INFINITY), 0xfbff);
        T_EQ(kwk_f32_to_f16(NAN) & 0x7fff, 0x7e00);
    }
    free(x);
    free(got);
}

int main(void)
{
    /* before this process calls kwk_isa(), so the children detect afresh */
    test_isa_env();
    test_prefetch_int8_env();
    test_prefetch_for_bytes();
    test_avxvnni_env();
    test_amx_env();
    int isa = kwk_isa();
    T_TRUE(kwk_kernels_for(KWK_ISA_SCALAR) == &kwk_kernels_ref);
    T_TRUE(kwk_kernels() == kwk_kernels_for(isa));
    T_STREQ(kwk_kernels()->name, kwk_isa_name(isa));

    test_ref_vs_double();
    for (int wt = 0; wt < KWK_W_COUNT; wt++) {
        check_matmul(NULL, wt, 5, 577, 3, 0, 5);
        check_matmul(NULL, wt, 3, 17, 2, 1, 3);
    }
    test_mat_row(&kwk_kernels_ref);
    test_batch_invariance(&kwk_kernels_ref);
    test_to_half(&kwk_kernels_ref);
    test_gelu(&kwk_kernels_ref);

    const struct kwk_kernels *tables[2];
    int n_tables = 0;
    if (isa >= KWK_ISA_AVX2)
        tables[n_tables++] = &kwk_kernels_avx2;
    if (isa >= KWK_ISA_AVX512)
        tables[n_tables++] = &kwk_kernels_avx512;
    printf("test_kernels: isa %s, %d SIMD table(s) checked\n", kwk_isa_name(isa), n_tables);
    for (int i = 0; i < n_tables; i++) {
        test_mat_row(tables[i]);
        test_matmul(tables[i]);
        test_batch_invariance(tables[i]);
        test_vector_ops(tables[i]);
        test_exp_range(tables[i]);
        test_to_half(tables[i]);
        test_gelu(tables[i]);
    }
    return t_report("test_kernels");
}
