/* test_quantfit.c - GPTQ packing and AWQ scales (runtime/quantfit.c): GPTQ equals plain packing
 * when H is diagonal (from x or given as a Gram matrix), lowers the output error on correlated
 * inputs (int8, int4, int6; odd shapes; with and without scales); AWQ lowers it on inputs with
 * outlier channels and keeps s = 1 when nothing is gained; results equal for 1 and 2 pool
 * threads; bad arguments and failed allocations give errors. */
#include <errno.h>
#include <stdlib.h>

#include "base/base.h"
#include "base/pool.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "runtime/quantfit.h"
#include "test.h"


/* Roughly normal: the sum of four uniforms, unit variance. */
static float grand(void)
{
    float s = 0.0f;
    for (int i = 0; i < 4; i++)
        s += t_frand(-1.0f, 1.0f);
    return s * 0.8660254f;
}

/* The quantized formats, in the order the tests visit them. */
static const int wtypes_all[] = {KWK_W_Q8, KWK_W_Q4, KWK_W_Q6};

static const char *wname(int wt)
{
    return wt == KWK_W_Q8 ? "q8" : wt == KWK_W_Q6 ? "q6" : "q4";
}

static float *fvec(size_t n)
{
    return calloc(n ? n : 1, sizeof(float));
}

/* An allocated destination for a rows x cols matrix in wt. */
static struct kwk_mat new_dst(int wt, int64_t rows, int64_t cols)
{
    size_t bytes = 0;
    kwk_quant_bytes(wt, rows, cols, &bytes);
    void *data = kwk_malloc_aligned(bytes ? bytes : 64);
    memset(data, 0xa5, bytes); /* every byte must be written */
    return (struct kwk_mat){.wtype = wt, .rows = rows, .cols = cols, .data = data};
}

static size_t dst_bytes(const struct kwk_mat *m)
{
    size_t bytes = 0;
    kwk_quant_bytes(m->wtype, m->rows, m->cols, &bytes);
    return bytes;
}

/* sum over the rows t of x of ||(x_t / s) Q^T - x_t (rs W)^T||^2: the output error of the packed
 * q (which holds rs W diag(s)) against the float matrix w (rows x cols); s, rs NULL = 1. */
static double out_err(const struct kwk_mat *q, const float *w, const float *x, int n,
                      const float *s, const float *rs)
{
    int64_t rows = q->rows, cols = q->cols;
    float *row = fvec((size_t)cols);
    double e = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        kwk_kernels()->mat_row(q, r, row);
        for (int t = 0; t < n; t++) {
            double yq = 0.0, yf = 0.0;
            for (int64_t k = 0; k < cols; k++) {
                double xk = x[(size_t)t * cols + k];
                yq += xk / (s ? s[k] : 1.0f) * row[k];
                yf += xk * (rs ? rs[r] : 1.0f) * w[r * cols + k];
            }
            e += (yq - yf) * (yq - yf);
        }
    }
    free(row);
    return e;
}

static struct kwk_calib_input calib(const float *x, float *absmean, int64_t n, int64_t dim)
{
    for (int64_t k = 0; k < dim; k++) {
        double a = 0.0;
        for (int64_t t = 0; t < n; t++)
            a += fabsf(x[t * dim + k]);
        absmean[k] = n ? (float)(a / (double)n) : 0.0f;
    }
    return (struct kwk_calib_input){dim, n, x, absmean};
}

/* X^T X of x ([n][dim]), summed in double. */
static float *gram_of(const float *x, int64_t n, int64_t dim)
{
    float *g = fvec((size_t)(dim * dim));
    for (int64_t j = 0; j < dim; j++)
        for (int64_t k = 0; k < dim; k++) {
            double s = 0.0;
            for (int64_t t = 0; t < n; t++)
                s += (double)x[t * dim + j] * x[t * dim + k];
            g[j * dim + k] = (float)s;
        }
    return g;
}

/* With one nonzero activation per row X^T X is exactly diagonal: U is diagonal, no error moves,
 * and GPTQ must choose every code and parameter plain packing does (one column never active:
 * a dead input). */
static void test_gptq_diagonal(void)
{
    const int64_t shapes[][2] = {{40, 100}, {16, 64}, {33, 70}, {1, 5}};
    for (size_t si = 0; si < KWK_ARRAY_LEN(shapes); si++)
        for (size_t wi = 0; wi < KWK_ARRAY_LEN(wtypes_all); wi++)
            for (int scaled = 0; scaled < 2; scaled++) {
                int wt = wtypes_all[wi];
                int64_t rows = shapes[si][0], cols = shapes[si][1], n = 2 * cols + 3;
                float *w = fvec((size_t)(rows * cols)), *x = fvec((size_t)(n * cols));
                float *am = fvec((size_t)cols), *cs = fvec((size_t)cols), *rs = fvec((size_t)rows);
                for (int64_t i = 0; i < rows * cols; i++)
                    w[i] = grand();
                for (int64_t t = 0; t < n; t++)
                    if (t % cols != 3 % cols || cols < 4)
                        x[t * cols + t % cols] = t_frand(0.5f, 2.0f);
                for (int64_t k = 0; k < cols; k++)
                    cs[k] = t_frand(0.5f, 2.0f);
                for (int64_t r = 0; r < rows; r++)
                    rs[r] = t_frand(0.5f, 2.0f);
                struct kwk_calib_input in = calib(x, am, n, cols);
                struct kwk_mat src = {.wtype = KWK_W_F32, .rows = rows, .cols = cols, .data = w};
                struct kwk_mat a = new_dst(wt, rows, cols), b = new_dst(wt, rows, cols);
                const float *c = scaled ? cs : NULL, *r = scaled ? rs : NULL;
                T_EQ(kwk_gptq_pack(&src, c, r, &in, 0.01f, &a, NULL, NULL), 0);
                T_EQ(kwk_scaled_pack(&src, c, r, &b, NULL, NULL), 0);
                int same = memcmp(a.data, b.data, dst_bytes(&a)) == 0;
                T_CHECK(same, "%s %lldx%lld scaled=%d: GPTQ with diagonal H = plain packing",
                        wname(wt), (long long)rows, (long long)cols, scaled);
                float *gram = gram_of(x, n, cols);
                memset((void *)a.data, 0xa5, dst_bytes(&a));
                T_EQ(kwk_gptq_pack_gram(&src, c, r, gram, cols, 0.01f, &a, NULL, NULL), 0);
                same = memcmp(a.data, b.data, dst_bytes(&a)) == 0;
                T_CHECK(same, "%s %lldx%lld scaled=%d: GPTQ from a diagonal Gram = plain",
                        wname(wt), (long long)rows, (long long)cols, scaled);
                free(gram);
                kwk_free_aligned((void *)a.data);
                kwk_free_aligned((void *)b.data);
                free(w), free(x), free(am), free(cs), free(rs);
            }
}

/* x = z A (A random): correlated inputs, where GPTQ's error feedback pays. The error is measured
 * on the calibration rows themselves, as GPTQ minimises it. */
static float *correlated_x(int64_t n, int64_t dim)
{
    float *z = fvec((size_t)(n * dim)), *a = fvec((size_t)(dim * dim));
    float *x = fvec((size_t)(n * dim));
    for (int64_t i = 0; i < n * dim; i++)
        z[i] = grand();
    for (int64_t i = 0; i < dim * dim; i++)
        a[i] = grand() / sqrtf((float)dim) + (i % (dim + 1) == 0 ? 0.3f : 0.0f);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < dim; j++) {
            double s = 0.0;
            for (int64_t k = 0; k < dim; k++)
                s += z[t * dim + k] * a[k * dim + j];
            x[t * dim + j] = (float)s;
        }
    free(z), free(a);
    return x;
}

static void test_gptq_correlated(void)
{
    const int64_t shapes[][2] = {{40, 100}, {33, 70}, {64, 256}};
    for (size_t si = 0; si < KWK_ARRAY_LEN(shapes); si++)
        for (size_t wi = 0; wi < KWK_ARRAY_LEN(wtypes_all); wi++)
            for (int scaled = 0; scaled < 2; scaled++) {
                int wt = wtypes_all[wi];
                int64_t rows = shapes[si][0], cols = shapes[si][1], n = 3 * cols;
                float *w = fvec((size_t)(rows * cols)), *x = correlated_x(n, cols);
                float *am = fvec((size_t)cols), *cs = fvec((size_t)cols), *rs = fvec((size_t)rows);
                for (int64_t i = 0; i < rows * cols; i++)
                    w[i] = grand();
                for (int64_t k = 0; k < cols; k++)
                    cs[k] = t_frand(0.5f, 2.0f);
                for (int64_t r = 0; r < rows; r++)
                    rs[r] = t_frand(0.5f, 2.0f);
                const float *c = scaled ? cs : NULL, *r = scaled ? rs : NULL;
                struct kwk_calib_input in = calib(x, am, n, cols);
                struct kwk_mat src = {.wtype = KWK_W_F32, .rows = rows, .cols = cols, .data = w};
                struct kwk_mat g = new_dst(wt, rows, cols), p = new_dst(wt, rows, cols);
                T_EQ(kwk_gptq_pack(&src, c, r, &in, 0.01f, &g, NULL, NULL), 0);
                T_EQ(kwk_scaled_pack(&src, c, r, &p, NULL, NULL), 0);
                double eg = out_err(&g, w, x, (int)n, c, r), ep = out_err(&p, w, x, (int)n, c, r);
                printf("gptq %s %lldx%lld scaled=%d: output error %.4g vs plain %.4g "
                       "(ratio %.3f)\n", wname(wt), (long long)rows, (long long)cols, scaled, eg,
                       ep, eg / ep);
                T_CHECK(eg < 0.8 * ep, "gptq %s %lldx%lld: %g vs plain %g", wname(wt),
                        (long long)rows, (long long)cols, eg, ep);
                /* the same H given as a Gram matrix: the same fit up to H's rounding */
                float *gram = gram_of(x, n, cols);
                T_EQ(kwk_gptq_pack_gram(&src, c, r, gram, cols, 0.01f, &g, NULL, NULL), 0);
                double eh = out_err(&g, w, x, (int)n, c, r);
                T_CHECK(eh < 0.8 * ep && fabs(eh - eg) < 0.05 * eg, "gram %s %lldx%lld: %g vs "
                        "%g from x", wname(wt), (long long)rows, (long long)cols, eh, eg);
                free(gram);
                kwk_free_aligned((void *)g.data);
                kwk_free_aligned((void *)p.data);
                free(w), free(x), free(am), free(cs), free(rs);
            }
}

/* Activations with a few large channels (by 30x) and weights of similar size everywhere: the
 * case AWQ is for. Two matrices share the input (one with a row count not a multiple of 16);
 * more rows than KWK_AWQ_MAX_ROWS so the subsample is used. */
static void test_awq_outliers(void)
{
    const int64_t dim = 96, n = 400, rows[2] = {48, 21};
    const int wts[2] = {KWK_W_Q4, KWK_W_Q4};
    float *x = fvec((size_t)(n * dim)), *am = fvec((size_t)dim), *s = fvec((size_t)dim);
    for (int64_t t = 0; t < n; t++)
        for (int64_t k = 0; k < dim; k++)
            x[t * dim + k] = grand() * (k % 29 == 5 ? 30.0f : 1.0f);
    struct kwk_calib_input in = calib(x, am, n, dim);
    float *w[2];
    struct kwk_mat m[2];
    const struct kwk_mat *mp[2] = {&m[0], &m[1]};
    for (int i = 0; i < 2; i++) {
        w[i] = fvec((size_t)(rows[i] * dim));
        for (int64_t j = 0; j < rows[i] * dim; j++)
            w[i][j] = grand();
        m[i] = (struct kwk_mat){.wtype = KWK_W_F32, .rows = rows[i], .cols = dim, .data = w[i]};
    }
    float alpha = -1.0f;
    T_EQ(kwk_awq_scales(mp, wts, 2, &in, s, &alpha, NULL, NULL), 0);
    double ea = 0.0, ep = 0.0;
    for (int i = 0; i < 2; i++) {
        struct kwk_mat a = new_dst(wts[i], rows[i], dim), p = new_dst(wts[i], rows[i], dim);
        T_EQ(kwk_scaled_pack(&m[i], s, NULL, &a, NULL, NULL), 0);
        T_EQ(kwk_scaled_pack(&m[i], NULL, NULL, &p, NULL, NULL), 0);
        ea += out_err(&a, w[i], x, (int)n, s, NULL);
        ep += out_err(&p, w[i], x, (int)n, NULL, NULL);
        kwk_free_aligned((void *)a.data);
        kwk_free_aligned((void *)p.data);
    }
    printf("awq q4 outliers: alpha %.2f, output error %.4g vs plain %.4g (ratio %.3f)\n", alpha,
           ea, ep, ea / ep);
    T_TRUE(alpha > 0.0f);
    T_CHECK(ea < 0.9 * ep, "awq %g vs plain %g", ea, ep);
    /* the normalisation: sqrt(max * min) = 1 */
    float mx = s[0], mn = s[0];
    for (int64_t k = 1; k < dim; k++)
        mx = s[k] > mx ? s[k] : mx, mn = s[k] < mn ? s[k] : mn;
    T_NEAR(sqrt((double)mx * mn), 1.0, 1e-5);
    T_TRUE(mx > mn);

    /* GPTQ on top of the AWQ scales still lowers the error */
    struct kwk_mat g = new_dst(KWK_W_Q4, rows[0], dim), a = new_dst(KWK_W_Q4, rows[0], dim);
    T_EQ(kwk_gptq_pack(&m[0], s, NULL, &in, 0.01f, &g, NULL, NULL), 0);
    T_EQ(kwk_scaled_pack(&m[0], s, NULL, &a, NULL, NULL), 0);
    double eg = out_err(&g, w[0], x, (int)n, s, NULL), e1 = out_err(&a, w[0], x, (int)n, s, NULL);
    printf("awq+gptq q4: output error %.4g vs awq alone %.4g (ratio %.3f)\n", eg, e1, eg / e1);
    T_TRUE(eg < e1);
    kwk_free_aligned((void *)g.data);
    kwk_free_aligned((void *)a.data);
    free(w[0]), free(w[1]), free(x), free(am), free(s);
}

/* Every channel alike (or no rows at all): no alpha can gain, so alpha = 0 and s = 1 exactly. */
static void test_awq_uniform(void)
{
    const int64_t dim = 70, rows = 20;
    for (int n = 0; n <= 50; n += 50) {
        float *x = fvec((size_t)(n * dim)), *am = fvec((size_t)dim), *s = fvec((size_t)dim);
        float *w = fvec((size_t)(rows * dim));
        for (int64_t i = 0; i < n * dim; i++)
            x[i] = grand();
        for (int64_t i = 0; i < rows * dim; i++)
            w[i] = grand();
        for (int64_t k = 0; k < dim; k++)
            am[k] = 0.75f;
        struct kwk_calib_input in = {dim, n, x, am};
        struct kwk_mat m = {.wtype = KWK_W_F32, .rows = rows, .cols = dim, .data = w};
        const struct kwk_mat *mp = &m;
        int wt = KWK_W_Q4;
        float alpha = -1.0f;
        T_EQ(kwk_awq_scales(&mp, &wt, 1, &in, s, &alpha, NULL, NULL), 0);
        T_EQ(alpha, 0);
        long not_one = 0;
        for (int64_t k = 0; k < dim; k++)
            not_one += s[k] != 1.0f;
        T_EQ(not_one, 0);
        free(x), free(am), free(s), free(w);
    }
}

/* 1 and 2 pool threads: the same bytes and the same scales. */
static void test_threads(void)
{
    struct kwk_pool *pool = kwk_pool_new(2);
    T_TRUE(pool != NULL);
    if (!pool)
        return;
    const int64_t rows = 37, cols = 90, n = 200;
    float *w = fvec((size_t)(rows * cols)), *x = correlated_x(n, cols), *am = fvec((size_t)cols);
    float *s1 = fvec((size_t)cols), *s2 = fvec((size_t)cols);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = grand();
    for (int64_t t = 0; t < n; t++)
        for (int k = 3; k < cols; k += 17)
            x[t * cols + k] *= 20.0f;
    struct kwk_calib_input in = calib(x, am, n, cols);
    struct kwk_mat src = {.wtype = KWK_W_F32, .rows = rows, .cols = cols, .data = w};
    const struct kwk_mat *mp[2] = {&src, &src};
    int wts[2] = {KWK_W_Q4, KWK_W_Q8};
    float a1 = -1.0f, a2 = -2.0f;
    T_EQ(kwk_awq_scales(mp, wts, 2, &in, s1, &a1, NULL, NULL), 0);
    T_EQ(kwk_awq_scales(mp, wts, 2, &in, s2, &a2, pool, NULL), 0);
    T_TRUE(a1 == a2);
    T_TRUE(memcmp(s1, s2, sizeof(float) * (size_t)cols) == 0);
    for (size_t wi = 0; wi < KWK_ARRAY_LEN(wtypes_all); wi++) {
        int wt = wtypes_all[wi];
        struct kwk_mat g1 = new_dst(wt, rows, cols), g2 = new_dst(wt, rows, cols);
        struct kwk_mat p1 = new_dst(wt, rows, cols), p2 = new_dst(wt, rows, cols);
        T_EQ(kwk_gptq_pack(&src, s1, NULL, &in, 0.01f, &g1, NULL, NULL), 0);
        T_EQ(kwk_gptq_pack(&src, s1, NULL, &in, 0.01f, &g2, pool, NULL), 0);
        T_EQ(kwk_scaled_pack(&src, s1, NULL, &p1, NULL, NULL), 0);
        T_EQ(kwk_scaled_pack(&src, s1, NULL, &p2, pool, NULL), 0);
        T_CHECK(memcmp(g1.data, g2.data, dst_bytes(&g1)) == 0, "%s gptq 1 vs 2 threads",
                wname(wt));
        float *gram = gram_of(x, n, cols);
        T_EQ(kwk_gptq_pack_gram(&src, s1, NULL, gram, cols, 0.01f, &g1, NULL, NULL), 0);
        T_EQ(kwk_gptq_pack_gram(&src, s1, NULL, gram, cols, 0.01f, &g2, pool, NULL), 0);
        T_CHECK(memcmp(g1.data, g2.data, dst_bytes(&g1)) == 0, "%s gram gptq 1 vs 2 threads",
                wname(wt));
        free(gram);
        T_CHECK(memcmp(p1.data, p2.data, dst_bytes(&p1)) == 0, "%s scaled 1 vs 2 threads",
                wname(wt));
        kwk_free_aligned((void *)g1.data), kwk_free_aligned((void *)g2.data);
        kwk_free_aligned((void *)p1.data), kwk_free_aligned((void *)p2.data);
    }
    kwk_pool_free(pool);
    free(w), free(x), free(am), free(s1), free(s2);
}

/* A plain f16 source reads through mat_row like any other. */
static void test_f16_source(void)
{
    const int64_t rows = 20, cols = 40, n = 120;
    uint16_t *h = calloc((size_t)(rows * cols), sizeof *h);
    float *w = fvec((size_t)(rows * cols)), *x = correlated_x(n, cols), *am = fvec((size_t)cols);
    for (int64_t i = 0; i < rows * cols; i++) {
        h[i] = kwk_f32_to_f16(grand());
        w[i] = kwk_f16_to_f32(h[i]);
    }
    struct kwk_calib_input in = calib(x, am, n, cols);
    struct kwk_mat s16 = {.wtype = KWK_W_F16, .rows = rows, .cols = cols, .data = h},
                   s32 = {.wtype = KWK_W_F32, .rows = rows, .cols = cols, .data = w};
    struct kwk_mat a = new_dst(KWK_W_Q4, rows, cols), b = new_dst(KWK_W_Q4, rows, cols);
    T_EQ(kwk_gptq_pack(&s16, NULL, NULL, &in, 0.01f, &a, NULL, NULL), 0);
    T_EQ(kwk_gptq_pack(&s32, NULL, NULL, &in, 0.01f, &b, NULL, NULL), 0);
    T_TRUE(memcmp(a.data, b.data, dst_bytes(&a)) == 0);
    kwk_free_aligned((void *)a.data), kwk_free_aligned((void *)b.data);
    free(h), free(w), free(x), free(am);
}

static void test_errors(void)
{
    const int64_t rows = 20, cols = 40, n = 30;
    float *w = fvec((size_t)(rows * cols)), *x = fvec((size_t)(n * cols)), *am = fvec((size_t)cols);
    float *s = fvec((size_t)cols);
    for (int64_t i = 0; i < rows * cols; i++)
        w[i] = grand();
    for (int64_t i = 0; i < n * cols; i++)
        x[i] = grand();
    for (int64_t k = 0; k < cols; k++)
        s[k] = 1.0f; /* kept when kwk_awq_scales fails below */
    struct kwk_calib_input in = calib(x, am, n, cols);
    struct kwk_mat src = {.wtype = KWK_W_F32, .rows = rows, .cols = cols, .data = w},
                   dst = new_dst(KWK_W_Q4, rows, cols);
    struct kwk_err err = {0};
    /* shapes that disagree */
    struct kwk_calib_input bad = in;
    bad.dim = cols + 1;
    T_EQ(kwk_gptq_pack(&src, NULL, NULL, &bad, 0.01f, &dst, NULL, &err), KWK_EARG);
    T_TRUE(err.msg[0] != '\0');
    struct kwk_mat d2 = dst;
    d2.rows = rows + 1;
    T_EQ(kwk_gptq_pack(&src, NULL, NULL, &in, 0.01f, &d2, NULL, NULL), KWK_EARG);
    T_EQ(kwk_scaled_pack(&src, NULL, NULL, &d2, NULL, NULL), KWK_EARG);
    d2 = dst;
    d2.wtype = KWK_W_F32;
    T_EQ(kwk_gptq_pack(&src, NULL, NULL, &in, 0.01f, &d2, NULL, NULL), KWK_EARG);
    T_EQ(kwk_gptq_pack(&src, NULL, NULL, &in, -1.0f, &dst, NULL, NULL), KWK_EARG);
    float *gram = gram_of(x, n, cols);
    T_EQ(kwk_gptq_pack_gram(&src, NULL, NULL, gram, cols - 1, 0.01f, &dst, NULL, NULL),
         KWK_EARG);
    T_EQ(kwk_gptq_pack_gram(&src, NULL, NULL, NULL, cols, 0.01f, &dst, NULL, NULL), KWK_EARG);
    T_EQ(kwk_gptq_pack_gram(&src, NULL, NULL, gram, cols, INFINITY, &dst, NULL, NULL),
         KWK_EARG);
    /* scales that would divide by zero or carry a NaN */
    s[7] = 0.0f;
    T_EQ(kwk_gptq_pack(&src, s, NULL, &in, 0.01f, &dst, NULL, NULL), KWK_EARG);
    T_EQ(kwk_gptq_pack_gram(&src, s, NULL, gram, cols, 0.01f, &dst, NULL, NULL), KWK_EARG);
    T_EQ(kwk_scaled_pack(&src, s, NULL, &dst, NULL, NULL), KWK_EARG);
    s[7] = 1.0f;
    float rs_bad[20];
    for (int r = 0; r < 20; r++)
        rs_bad[r] = r == 19 ? NAN : 1.0f;
    T_EQ(kwk_scaled_pack(&src, NULL, rs_bad, &dst, NULL, NULL), KWK_EARG);
    T_EQ(kwk_gptq_pack(&src, NULL, NULL, &in, NAN, &dst, NULL, NULL), KWK_EARG);
    bad = in;
    bad.n_rows = -1;
    T_EQ(kwk_gptq_pack(&src, NULL, NULL, &bad, 0.01f, &dst, NULL, NULL), KWK_EARG);
    /* a matrix too wide for H */
    struct kwk_mat wide = {.wtype = KWK_W_F32, .rows = 16, .cols = (int64_t)1 << 40, .data = w};
    struct kwk_mat wdst = {
        .wtype = KWK_W_Q4, .rows = 16, .cols = (int64_t)1 << 40, .data = dst.data};
    struct kwk_calib_input win = {(int64_t)1 << 40, 0, NULL, am};
    T_EQ(kwk_gptq_pack(&wide, NULL, NULL, &win, 0.01f, &wdst, NULL, NULL), KWK_ELIMIT);
    const struct kwk_mat *wp = &wide;
    int wt = KWK_W_Q4;
    T_EQ(kwk_awq_scales(&wp, &wt, 1, &win, s, NULL, NULL, NULL), KWK_ELIMIT);
    /* AWQ arguments */
    const struct kwk_mat *mp = &src;
    T_EQ(kwk_awq_scales(&mp, &wt, 0, &in, s, NULL, NULL, NULL), KWK_EARG);
    int f32 = KWK_W_F32;
    T_EQ(kwk_awq_scales(&mp, &f32, 1, &in, s, NULL, NULL, NULL), KWK_EARG);
    bad = in;
    bad.dim = cols - 1;
    T_EQ(kwk_awq_scales(&mp, &wt, 1, &bad, s, NULL, NULL, NULL), KWK_EARG);
    /* non-finite activations: H cannot be factorised */
    x[5] = NAN;
    T_EQ(kwk_gptq_pack(&src, NULL, NULL, &in, 0.01f, &dst, NULL, &err), KWK_ERUNTIME);
    x[5] = 0.5f;
    /* every allocation failing in turn: an error, never a crash or a leak (ASan) */
    int ok_at = -1;
    for (int i = 1; i < 40 && ok_at < 0; i++) {
        kwk_alloc_fail_after(i);
        int rg = kwk_gptq_pack(&src, NULL, NULL, &in, 0.01f, &dst, NULL, NULL);
        kwk_alloc_fail_after(i);
        int ra = kwk_awq_scales(&mp, &wt, 1, &in, s, NULL, NULL, NULL);
        kwk_alloc_fail_after(i);
        int rs = kwk_scaled_pack(&src, s, NULL, &dst, NULL, NULL);
        kwk_alloc_fail_after(i);
        int rh = kwk_gptq_pack_gram(&src, s, NULL, gram, cols, 0.01f, &dst, NULL, NULL);
        kwk_alloc_fail_after(0);
        T_CHECK(rh == 0 || rh == -ENOMEM, "gram at %d: %d", i, rh);
        T_TRUE(rg == 0 || rg == -ENOMEM);
        T_TRUE(ra == 0 || ra == -ENOMEM);
        T_TRUE(rs == 0 || rs == -ENOMEM);
        if (rg == 0 && ra == 0 && rs == 0 && rh == 0)
            ok_at = i;
    }
    T_TRUE(ok_at > 1);
    kwk_free_aligned((void *)dst.data);
    free(w), free(x), free(am), free(s), free(gram);
}

int main(void)
{
    test_gptq_diagonal();
    test_gptq_correlated();
    test_awq_outliers();
    test_awq_uniform();
    test_threads();
    test_f16_source();
    test_errors();
    return t_report("test_quantfit");
}
