/* quantfit.c - AWQ scales and GPTQ packing against calibration activations (quantfit.h). Pure
 * functions; any thread, each call driving its own pool (or running on the calling thread). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/quant.h"
#include "runtime/quantfit.h"

/* H is dim^2 doubles: beyond this it would not fit any machine Kwker runs on, and dims are
 * passed to the kernels as int token counts. */
#define MAX_DIM 65536

/* ---- shared helpers -------------------------------------------------------------------------- */

/* An aligned array of n1 * n2 elements of size `elem`; NULL with *rc = KWK_ELIMIT or -ENOMEM. */
static void *alloc_array(size_t n1, size_t n2, size_t elem, int *rc, struct kwk_err *err)
{
    size_t n, bytes;
    if (kwk_mul_size(n1, n2, &n) || kwk_mul_size(n, elem, &bytes)) {
        *rc = kwk_err_set(err, KWK_ELIMIT, "quantfit: a %zu x %zu buffer overflows", n1, n2);
        return NULL;
    }
    void *p = kwk_malloc_aligned(bytes ? bytes : 64);
    if (!p)
        *rc = kwk_err_set(err, -ENOMEM, "quantfit: out of memory for %zu bytes", bytes);
    return p;
}

static int pool_threads(struct kwk_pool *pool)
{
    return pool ? kwk_pool_size(pool) : 1;
}

static void run(struct kwk_pool *pool, kwk_task_fn fn, void *ctx)
{
    if (pool)
        kwk_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

/* Rows [r0, r0 + n) of src as float into out[i * cols + k], times row_scale[r] and
 * col_scale[k] (NULL = 1): the matrix W' every function here quantizes. */
static void load_rows(const struct kwk_mat *src, int64_t r0, int n, const float *col_scale,
                      const float *row_scale, float *out)
{
    const struct kwk_kernels *k = kwk_kernels();
    int64_t cols = src->cols;
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * (size_t)cols;
        k->mat_row(src, r0 + i, o);
        float rs = row_scale ? row_scale[r0 + i] : 1.0f;
        if (row_scale)
            for (int64_t c = 0; c < cols; c++)
                o[c] *= rs;
        if (col_scale)
            for (int64_t c = 0; c < cols; c++)
                o[c] *= col_scale[c];
    }
}

/* dst must be prepared as quantfit.h says; src a matrix mat_row reads. */
static int check_dst(const struct kwk_mat *src, const struct kwk_mat *dst, struct kwk_err *err)
{
    if (!src || !dst || !dst->data || !kwk_quant_group(dst->wtype))
        return kwk_err_set(err, KWK_EARG, "quantfit: no source, or a destination that is not "
                                          "an allocated quantized matrix");
    if (src->rows < 0 || src->cols <= 0 || dst->rows != src->rows || dst->cols != src->cols)
        return kwk_err_set(err, KWK_EARG, "quantfit: destination %lld x %lld for a %lld x %lld "
                           "source", (long long)dst->rows, (long long)dst->cols,
                           (long long)src->rows, (long long)src->cols);
    if (src->cols > MAX_DIM)
        return kwk_err_set(err, KWK_ELIMIT, "quantfit: %lld columns (limit %d)",
                           (long long)src->cols, MAX_DIM);
    return 0;
}

/* Column scales divide the activations: each must be positive and finite. */
static int check_scales(const float *col_scale, const float *row_scale, int64_t rows,
                        int64_t cols, struct kwk_err *err)
{
    for (int64_t k = 0; col_scale && k < cols; k++)
        if (!(col_scale[k] > 0.0f) || !isfinite(col_scale[k]))
            return kwk_err_set(err, KWK_EARG, "quantfit: column scale %lld is %g",
                               (long long)k, (double)col_scale[k]);
    for (int64_t r = 0; row_scale && r < rows; r++)
        if (!isfinite(row_scale[r]))
            return kwk_err_set(err, KWK_EARG, "quantfit: row scale %lld is %g", (long long)r,
                               (double)row_scale[r]);
    return 0;
}

static int check_calib(const struct kwk_calib_input *in, int64_t cols, struct kwk_err *err)
{
    if (!in || in->dim != cols || in->n_rows < 0 || (in->n_rows > 0 && !in->x))
        return kwk_err_set(err, KWK_EARG, "quantfit: calibration input of dim %lld for %lld "
                           "columns", in ? (long long)in->dim : -1LL, (long long)cols);
    if (in->n_rows > INT_MAX)
        return kwk_err_set(err, KWK_ELIMIT, "quantfit: %lld calibration rows",
                           (long long)in->n_rows);
    return 0;
}

static int64_t n_row_blocks(int64_t rows)
{
    return (rows + KWK_QROWS - 1) / KWK_QROWS;
}

/* ---- round-to-nearest packing of W' ---------------------------------------------------------- */

struct scaled_task {
    const struct kwk_mat *src;
    const float *col_scale, *row_scale;
    struct kwk_mat *dst;
    float *scratch;   /* [nth][16 * cols] */
    _Atomic long next; /* next row block (relaxed: blocks are independent) */
};

static void scaled_run(void *ctx, int ith, int nth)
{
    struct scaled_task *t = ctx;
    int64_t rows = t->src->rows, cols = t->src->cols, nrb = n_row_blocks(rows);
    float *buf = t->scratch + (size_t)ith * KWK_QROWS * (size_t)cols;
    for (;;) {
        long rb = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (rb >= nrb)
            break;
        int n = (int)KWK_MIN((int64_t)KWK_QROWS, rows - rb * KWK_QROWS);
        load_rows(t->src, rb * KWK_QROWS, n, t->col_scale, t->row_scale, buf);
        kwk_quant_pack_rows(t->dst->wtype, (void *)t->dst->data, rows, cols, rb, buf,
                            (long)cols);
    }
}

int kwk_scaled_pack(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                    struct kwk_mat *dst, struct kwk_pool *pool, struct kwk_err *err)
{
    int rc = check_dst(src, dst, err);
    if (!rc)
        rc = check_scales(col_scale, row_scale, src->rows, src->cols, err);
    if (rc)
        return rc;
    struct scaled_task t = {src, col_scale, row_scale, dst, NULL, 0};
    t.scratch = alloc_array((size_t)pool_threads(pool), (size_t)KWK_QROWS * (size_t)src->cols,
                            sizeof(float), &rc, err);
    if (!t.scratch)
        return rc;
    atomic_init(&t.next, 0);
    run(pool, scaled_run, &t);
    kwk_free_aligned(t.scratch);
    return 0;
}

/* ---- GPTQ: H, its factorisation, the column sweep -------------------------------------------- */

/* H = X'^T X' through the kernels' float matmul: with Xt = X'^T ([dim][n_rows]) as a matrix and
 * its rows as tokens, y[t][r] = sum_k Xt[r][k] Xt[t][k] = H[t][r]. Float sums, as GPTQ's own
 * (PyTorch, float32) H; the factorisation that follows is in double. Rows split by thread. */
struct gram_task {
    struct kwk_mat xt; /* [dim][n_rows] f32 */
    const float *x;    /* xt's data */
    float *h;          /* [dim][dim] */
};

static void gram_run(void *ctx, int ith, int nth)
{
    struct gram_task *t = ctx;
    long lo, hi;
    kwk_split_range((long)t->xt.rows, ith, nth, 16, &lo, &hi);
    if (hi > lo && t->xt.cols > 0)
        kwk_kernels()->matmul(&t->xt, t->x, (int)t->xt.rows, t->h, (long)t->xt.rows, lo, hi);
    else
        for (long r = lo; r < hi; r++)
            for (int64_t c = 0; c < t->xt.rows; c++)
                t->h[c * t->xt.rows + r] = 0.0f;
}

/* Upper Cholesky B = R^T R in place (upper triangle of b, [n][n] double), right-looking:
 * elimination step j subtracts (b_ji / b_jj) * row j from every later row i, a contiguous axpy
 * (vectorizes without -ffast-math). Steps go in panels of CHOL_NB: thread 0 applies a panel's
 * steps to the panel's own rows, then the threads share the later rows (i % nth), applying the
 * panel's steps to CHOL_KC columns at a time so each row chunk is read from memory once per
 * panel rather than once per step (unblocked, every step streams the whole trailing matrix:
 * memory-bound). Each element sees the same operations in the same order as unblocked, on any
 * thread count: n^3 / 6 multiply-adds. Row j is final after step j, so rows are divided by
 * their pivots at the end. */
#define CHOL_NB 32
#define CHOL_KC 512

struct chol_task {
    struct kwk_pool *pool;
    double *b;
    long n;
    long failed_at; /* first non-positive pivot, or -1 (written by thread 0 before a barrier) */
};

/* Steps j0..j1-1 on rows j0..j1-1; the first bad pivot, or -1. */
static long chol_panel(double *b, long n, long j0, long j1)
{
    for (long j = j0; j < j1; j++) {
        double piv = b[j * n + j];
        if (!(piv > 0.0) || !isfinite(piv))
            return j;
        const double *restrict bj = b + j * n;
        for (long i = j + 1; i < j1; i++) {
            double f = bj[i] / piv;
            double *restrict bi = b + i * n;
            for (long k = i; k < n; k++)
                bi[k] -= f * bj[k];
        }
    }
    return -1;
}

/* Steps j0..j1-1 on a later row i. */
static void chol_trail(double *b, long n, long j0, long j1, long i)
{
    double f[CHOL_NB];
    for (long j = j0; j < j1; j++)
        f[j - j0] = b[j * n + i] / b[j * n + j];
    double *restrict bi = b + i * n;
    for (long k0 = i; k0 < n; k0 += CHOL_KC) {
        long k1 = KWK_MIN(n, k0 + CHOL_KC), j = j0;
        /* four steps per pass over the chunk: the same subtractions in the same order, with
         * one load and store of bi per four (the loop was bound by them) */
        for (; j + 4 <= j1; j += 4) {
            const double *restrict b0 = b + j * n, *restrict b1 = b0 + n;
            const double *restrict b2 = b1 + n, *restrict b3 = b2 + n;
            double f0 = f[j - j0], f1 = f[j - j0 + 1], f2 = f[j - j0 + 2], f3 = f[j - j0 + 3];
            for (long k = k0; k < k1; k++)
                bi[k] = (((bi[k] - f0 * b0[k]) - f1 * b1[k]) - f2 * b2[k]) - f3 * b3[k];
        }
        for (; j < j1; j++) {
            const double *restrict bj = b + j * n;
            double fj = f[j - j0];
            for (long k = k0; k < k1; k++)
                bi[k] -= fj * bj[k];
        }
    }
}

static void chol_run(void *ctx, int ith, int nth)
{
    struct chol_task *t = ctx;
    long n = t->n;
    double *b = t->b;
    for (long j0 = 0; j0 < n; j0 += CHOL_NB) {
        long j1 = KWK_MIN(n, j0 + CHOL_NB);
        if (ith == 0)
            t->failed_at = chol_panel(b, n, j0, j1);
        if (nth > 1)
            kwk_pool_barrier(t->pool);
        if (t->failed_at >= 0)
            return; /* every thread sees it after the barrier: all leave, none waits */
        for (long i = j1; i < n; i++)
            if (i % nth == ith)
                chol_trail(b, n, j0, j1, i);
        if (nth > 1)
            kwk_pool_barrier(t->pool);
    }
    for (long i = ith; i < n; i += nth) {
        double d = sqrt(b[i * n + i]);
        double *bi = b + i * n;
        bi[i] = d;
        for (long k = i + 1; k < n; k++)
            bi[k] /= d;
    }
}

/* With B = J H J (J reverses the order) = R^T R: H = V V^T with V = J R^T J upper, so the upper
 * Cholesky factor of H^-1 is U = V^-1 = J Z^T J with Z = R^-1: U[n-1-c][n-1-i] = Z[i][c]. One
 * factorisation and one triangular inverse (n^3 / 6 each) rather than GPTQ's three steps.
 * Column c of Z is a back substitution, z_i = -(sum_{i<k<=c} R_ik z_k) / R_ii, written as row
 * n-1-c of U. Threads take INV_NC adjacent columns at a time from a counter (largest first) and
 * never share a row of U; the group's dot products run INV_KC columns of R's row at a time, so
 * the row comes from memory once per group rather than once per column (memory-bound). (Feeding
 * back w_j - q_j of the original weights through V directly would skip the inverse, but its
 * sums cancel: measured 3-6% more output error on ill-conditioned H in float.) */
#define INV_NC 8
#define INV_KC 512

struct inv_task {
    const double *r; /* [n][n] upper */
    float *u;        /* [n][n], upper triangle written */
    double *z;       /* [nth][INV_NC][n] */
    long n;
    _Atomic long next;
};

/* sum_k a[k] * b[k] in four interleaved partial sums: a fixed order (the same on any thread)
 * that gcc still vectorizes without reassociating. */
static double dot4(const double *restrict a, const double *restrict b, long n)
{
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    long k = 0;
    for (; k + 4 <= n; k += 4)
        for (int l = 0; l < 4; l++)
            s[l] += a[k + l] * b[k + l];
    for (; k < n; k++)
        s[0] += a[k] * b[k];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* Columns c0 .. c0+nc-1 of Z: column c0+l in z[l * n + i], i <= c0+l. */
static void inv_group(const double *r, long n, long c0, int nc, double *z)
{
    long c1 = c0 + nc;
    for (long i = c1 - 1; i >= 0; i--) {
        const double *ri = r + i * n;
        double s[INV_NC] = {0};
        for (long k0 = i + 1; k0 < c1; k0 += INV_KC)
            for (int l = 0; l < nc; l++) {
                long k1 = KWK_MIN(k0 + INV_KC, c0 + l + 1);
                if (k1 > k0)
                    s[l] += dot4(ri + k0, z + l * n + k0, k1 - k0);
            }
        for (int l = 0; l < nc; l++)
            if (i <= c0 + l)
                z[l * n + i] = i == c0 + l ? 1.0 / ri[i] : -s[l] / ri[i];
    }
}

static void inv_run(void *ctx, int ith, int nth)
{
    struct inv_task *t = ctx;
    long n = t->n;
    double *z = t->z + (size_t)ith * (size_t)n * INV_NC;
    for (;;) {
        long c1 = n - INV_NC * atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (c1 <= 0)
            break;
        long c0 = KWK_MAX(0, c1 - INV_NC);
        inv_group(t->r, n, c0, (int)(c1 - c0), z);
        for (long c = c0; c < c1; c++) {
            float *urow = t->u + (size_t)(n - 1 - c) * (size_t)n;
            const double *zc = z + (c - c0) * n;
            for (long i = 0; i <= c; i++)
                urow[n - 1 - i] = (float)zc[i];
        }
    }
}

/* B = J H J with dead inputs set to 1 and the damping added; 0, or the mean diagonal is not
 * finite (non-finite activations): -1. */
static int build_b(const float *h, double *b, long n, double damp)
{
    double mean = 0.0;
    for (long j = 0; j < n; j++) {
        double d = h[j * n + j];
        mean += d == 0.0 ? 1.0 : d;
    }
    mean /= (double)n;
    if (!isfinite(mean))
        return -1;
    for (long a = 0; a < n; a++)
        for (long c = a; c < n; c++) /* H's lower triangle: one consistent side of float H */
            b[a * n + c] = h[(n - 1 - a) * n + (n - 1 - c)];
    for (long a = 0; a < n; a++) {
        double *d = b + a * n + a;
        *d = (*d == 0.0 ? 1.0 : *d) + damp * mean;
    }
    return 0;
}

/* hu ([n][n] float) holds H on entry and, in its upper triangle, the upper Cholesky factor U of
 * (H damped)^-1 on return; b is [n][n] double scratch. A pivot that is not positive grows the
 * damping tenfold, 3 times. */
static int hinv_factor(float *hu, double *b, long n, double damp, struct kwk_pool *pool,
                       struct kwk_err *err)
{
    struct chol_task ct = {pool, b, n, -1};
    for (int attempt = 0;; attempt++) {
        if (build_b(hu, b, n, damp))
            return kwk_err_set(err, KWK_ERUNTIME, "gptq: calibration activations are not finite");
        ct.failed_at = -1;
        run(pool, chol_run, &ct);
        if (ct.failed_at < 0)
            break;
        if (attempt == 3)
            return kwk_err_set(err, KWK_ERUNTIME, "gptq: H is not positive definite (pivot "
                               "%ld of %ld) even damped by %g", ct.failed_at, n, damp);
        damp = damp > 0.0 ? damp * 10.0 : 0.01;
    }
    struct inv_task it = {b, hu, NULL, n, 0};
    int rc = 0;
    double *z = alloc_array((size_t)pool_threads(pool), (size_t)n * INV_NC, sizeof(double), &rc,
                            err);
    if (!z)
        return rc;
    it.z = z;
    atomic_init(&it.next, 0);
    run(pool, inv_run, &it);
    kwk_free_aligned(z);
    return 0;
}

/* The sweep over one 16-row block, rows updated in place: rows * cols^2 / 2 multiply-adds in
 * the feedback into later columns, four rows per pass so each load of U's row serves four
 * (written row-wise because gcc vectorizes a column-major 16-wide update across k, through
 * shuffles, at a third of the speed). */
struct sweep_task {
    const struct kwk_mat *src;
    const float *col_scale, *row_scale;
    const float *u;    /* [cols][cols] upper: U */
    struct kwk_mat *dst;
    float *scratch;    /* [nth][stride] */
    size_t stride;
    _Atomic long next;
};

struct sweep_buf {
    float *w;     /* [16][cols] the block's rows, updated as columns are quantized */
    int8_t *q;    /* [16][cols] codes */
    float *d, *m; /* [16][n_groups] */
};

static size_t sweep_stride(int64_t cols, int64_t ng)
{
    /* w + d + m + q (as floats, rounded up); every count < 2^40 by MAX_DIM */
    return (size_t)(KWK_QROWS * cols + 2 * KWK_QROWS * ng + (KWK_QROWS * cols + 3) / 4 + 16);
}

static struct sweep_buf sweep_buf(float *base, int64_t cols, int64_t ng)
{
    struct sweep_buf s;
    s.w = base;
    s.d = s.w + KWK_QROWS * cols;
    s.m = s.d + KWK_QROWS * ng;
    s.q = (int8_t *)(s.m + KWK_QROWS * ng);
    return s;
}

/* w_i[k] -= e_i * u[k] for k in [k0, k1), four rows at once. */
static void feed4(float *restrict w0, float *restrict w1, float *restrict w2,
                  float *restrict w3, const float *restrict u, const float *e, int64_t k0,
                  int64_t k1)
{
    float e0 = e[0], e1 = e[1], e2 = e[2], e3 = e[3];
    for (int64_t k = k0; k < k1; k++) {
        float uk = u[k];
        w0[k] -= e0 * uk;
        w1[k] -= e1 * uk;
        w2[k] -= e2 * uk;
        w3[k] -= e3 * uk;
    }
}

static void feed1(float *restrict w, const float *restrict u, float e, int64_t k0, int64_t k1)
{
    for (int64_t k = k0; k < k1; k++)
        w[k] -= e * u[k];
}

static void sweep_block(struct sweep_task *t, struct sweep_buf *s, int64_t rb)
{
    int wtype = t->dst->wtype, G = kwk_quant_group(wtype);
    int64_t rows = t->src->rows, cols = t->src->cols, ng = kwk_quant_n_groups(wtype, cols);
    int n = (int)KWK_MIN((int64_t)KWK_QROWS, rows - rb * KWK_QROWS);
    load_rows(t->src, rb * KWK_QROWS, n, t->col_scale, t->row_scale, s->w);
    for (int64_t j = 0; j < cols; j++) {
        int64_t g = j / G;
        for (int i = 0; i < n && j % G == 0; i++) /* fitted on the updated weights */
            kwk_quant_fit(wtype, s->w + i * cols + j, (int)KWK_MIN((int64_t)G, cols - j),
                          &s->d[i * ng + g], &s->m[i * ng + g]);
        const float *uj = t->u + j * cols;
        float e[KWK_QROWS];
        for (int i = 0; i < n; i++) {
            float wij = s->w[i * cols + j], d = s->d[i * ng + g], m = s->m[i * ng + g];
            int c = kwk_quant_code(wtype, wij, d, m);
            s->q[i * cols + j] = (int8_t)c;
            e[i] = (wij - (d * (float)c + m)) / uj[j];
        }
        int i = 0;
        for (; i + 4 <= n; i += 4)
            feed4(s->w + i * cols, s->w + (i + 1) * cols, s->w + (i + 2) * cols,
                  s->w + (i + 3) * cols, uj, e + i, j + 1, cols);
        for (; i < n; i++)
            feed1(s->w + i * cols, uj, e[i], j + 1, cols);
    }
    kwk_quant_pack_codes(wtype, (void *)t->dst->data, rows, cols, rb, s->q, (long)cols, s->d,
                         s->m);
}

static void sweep_run(void *ctx, int ith, int nth)
{
    struct sweep_task *t = ctx;
    int64_t cols = t->src->cols, ng = kwk_quant_n_groups(t->dst->wtype, cols);
    struct sweep_buf s = sweep_buf(t->scratch + (size_t)ith * t->stride, cols, ng);
    for (;;) {
        long rb = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (rb >= n_row_blocks(t->src->rows))
            break;
        sweep_block(t, &s, rb);
    }
}

/* Xt[k][r] = x[r][k] / col_scale[k]. */
static void transpose_scaled(const struct kwk_calib_input *in, const float *col_scale, float *xt)
{
    int64_t n = in->n_rows, dim = in->dim;
    for (int64_t r = 0; r < n; r++)
        for (int64_t k = 0; k < dim; k++)
            xt[k * n + r] = in->x[r * dim + k] / (col_scale ? col_scale[k] : 1.0f);
}

/* GPTQ from H' (hp, [n][n] float, consumed: it ends as U) into dst; checks done. */
static int gptq_from_h(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                       float *hp, float damp, struct kwk_mat *dst, struct kwk_pool *pool,
                       struct kwk_err *err)
{
    long n = (long)src->cols;
    int rc = 0;
    float *scratch = NULL;
    double *b = alloc_array((size_t)n, (size_t)n, sizeof(double), &rc, err);
    if (!b)
        return rc;
    rc = hinv_factor(hp, b, n, damp, pool, err);
    kwk_free_aligned(b);
    if (rc)
        return rc;
    int64_t ng = kwk_quant_n_groups(dst->wtype, src->cols);
    struct sweep_task st = {src, col_scale, row_scale, hp, dst, NULL, sweep_stride(n, ng), 0};
    if (!(scratch = alloc_array((size_t)pool_threads(pool), st.stride, sizeof(float), &rc, err)))
        return rc;
    st.scratch = scratch;
    atomic_init(&st.next, 0);
    run(pool, sweep_run, &st);
    kwk_free_aligned(scratch);
    return 0;
}

static int check_damp(float damp, struct kwk_err *err)
{
    if (!(damp >= 0.0f) || !isfinite(damp))
        return kwk_err_set(err, KWK_EARG, "gptq: damping %g", (double)damp);
    return 0;
}

int kwk_gptq_pack(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                  const struct kwk_calib_input *in, float damp, struct kwk_mat *dst,
                  struct kwk_pool *pool, struct kwk_err *err)
{
    int rc = check_dst(src, dst, err);
    if (!rc)
        rc = check_calib(in, src->cols, err);
    if (!rc)
        rc = check_scales(col_scale, row_scale, src->rows, src->cols, err);
    if (!rc)
        rc = check_damp(damp, err);
    if (rc || src->rows == 0)
        return rc;
    long n = (long)src->cols;
    float *hp = alloc_array((size_t)n, (size_t)n, sizeof(float), &rc, err); /* H, then U */
    if (!hp)
        return rc;
    float *xt = alloc_array((size_t)n, (size_t)in->n_rows, sizeof(float), &rc, err);
    if (!xt)
        goto out;
    transpose_scaled(in, col_scale, xt);
    struct gram_task gt = {{.wtype = KWK_W_F32, .rows = n, .cols = in->n_rows, .data = xt}, xt, hp};
    run(pool, gram_run, &gt);
    kwk_free_aligned(xt);
    rc = gptq_from_h(src, col_scale, row_scale, hp, damp, dst, pool, err);
out:
    kwk_free_aligned(hp);
    return rc;
}

int kwk_gptq_pack_gram(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                       const float *gram, int64_t dim, float damp, struct kwk_mat *dst,
                       struct kwk_pool *pool, struct kwk_err *err)
{
    int rc = check_dst(src, dst, err);
    if (!rc && (!gram || dim != src->cols))
        rc = kwk_err_set(err, KWK_EARG, "gptq: a %lld-channel Gram matrix for %lld columns",
                         (long long)dim, (long long)src->cols);
    if (!rc)
        rc = check_scales(col_scale, row_scale, src->rows, src->cols, err);
    if (!rc)
        rc = check_damp(damp, err);
    if (rc || src->rows == 0)
        return rc;
    size_t n = (size_t)dim;
    float *hp = alloc_array(n, n, sizeof(float), &rc, err); /* H' = diag(1/s) H diag(1/s), then U */
    if (!hp)
        return rc;
    for (size_t j = 0; j < n; j++)
        for (size_t k = 0; k < n; k++)
            hp[j * n + k] = col_scale ? gram[j * n + k] / (col_scale[j] * col_scale[k])
                                      : gram[j * n + k];
    rc = gptq_from_h(src, col_scale, row_scale, hp, damp, dst, pool, err);
    kwk_free_aligned(hp);
    return rc;
}

/* ---- AWQ ------------------------------------------------------------------------------------- */

/* s = absmean^alpha / sqrt(max^alpha * min^alpha), as exp(alpha * (ln a - mid)) so that equal
 * channels (and alpha = 0) give exactly 1. Channels with no activation take the smallest
 * positive mean (a zero would make every other scale infinite). */
void kwk_awq_scales_at(const float *absmean, long dim, double alpha, float *s)
{
    double mx = 0.0, mn = 0.0;
    for (long k = 0; k < dim; k++) {
        double a = absmean[k];
        if (a > 0.0 && isfinite(a)) {
            mx = mx == 0.0 || a > mx ? a : mx;
            mn = mn == 0.0 || a < mn ? a : mn;
        }
    }
    if (alpha == 0.0 || mx == 0.0) {
        for (long k = 0; k < dim; k++)
            s[k] = 1.0f;
        return;
    }
    double mid = 0.5 * (log(mx) + log(mn));
    for (long k = 0; k < dim; k++) {
        double a = absmean[k];
        a = a > 0.0 && isfinite(a) ? a : mn;
        s[k] = (float)exp(alpha * (log(a) - mid));
    }
}

/* One unit = one evaluated row block of one matrix: quantize its 16 rows of W' = W diag(s) the
 * way packing does, dequantize, and add ||(Xsub diag(1/s)) (Q(W') - W')^T||^2: the output error
 * on the evaluated rows, since x diag(1/s) Q(W')^T - x W^T = (x diag(1/s)) (Q(W') - W')^T.
 * Cost per alpha: n_sub * eval_rows * dim multiply-adds in the kernels' float matmul plus the
 * packing of eval_rows * dim weights (packing's parameter search is most of it). SmolLM2-135M,
 * 256 x 256 per matrix: 1792 rows a layer, 0.3 G multiply-adds and 1.2 M weights packed per
 * alpha, 10 alphas. Each unit's error lands in its own slot, summed in order after: the same
 * total for any thread count. */
struct awq_task {
    const struct kwk_mat *const *w;
    const int *wtypes;
    int n_w;
    const long *first_unit; /* [n_w + 1] units before each matrix */
    const float *s;         /* [dim] */
    const float *xs;        /* [n_sub][dim] evaluated rows times 1/s */
    int n_sub;
    long dim;
    double *unit_err;       /* [n_units] */
    float *scratch;         /* [nth][stride] */
    size_t stride, blocks_at; /* floats per thread; where a thread's block row starts */
    _Atomic long next;
};

/* Evaluated row blocks of a matrix: all, or KWK_AWQ_MAX_OUT / 16 spread evenly. */
static long awq_eval_blocks(int64_t rows)
{
    return (long)KWK_MIN(n_row_blocks(rows), (int64_t)(KWK_AWQ_MAX_OUT / KWK_QROWS));
}

/* Row block of the j-th of n evaluated blocks among nrb. */
static int64_t awq_block(long j, long n, int64_t nrb)
{
    return (int64_t)j * nrb / n;
}

static double awq_unit(struct awq_task *t, float *buf, int mi, long j)
{
    const struct kwk_kernels *kk = kwk_kernels();
    const struct kwk_mat *w = t->w[mi];
    int wtype = t->wtypes[mi];
    long dim = t->dim;
    int64_t rb = awq_block(j, t->first_unit[mi + 1] - t->first_unit[mi], n_row_blocks(w->rows));
    int n = (int)KWK_MIN((int64_t)KWK_QROWS, w->rows - rb * KWK_QROWS);
    float *rows = buf, *dw = rows + KWK_QROWS * dim, *y = dw + KWK_QROWS * dim;
    void *blocks = buf + t->blocks_at;
    load_rows(w, rb * KWK_QROWS, n, t->s, NULL, rows);
    kwk_quant_pack_rows(wtype, blocks, n, dim, 0, rows, dim);
    struct kwk_mat q = {.wtype = wtype, .rows = n, .cols = dim, .data = blocks};
    for (int i = 0; i < n; i++) {
        float *d = dw + (size_t)i * (size_t)dim;
        const float *ws = rows + (size_t)i * (size_t)dim;
        kk->mat_row(&q, i, d);
        for (long k = 0; k < dim; k++)
            d[k] -= ws[k];
    }
    struct kwk_mat dm = {.wtype = KWK_W_F32, .rows = n, .cols = dim, .data = dw};
    kk->matmul(&dm, t->xs, t->n_sub, y, KWK_QROWS, 0, n);
    double e = 0.0;
    for (int r = 0; r < t->n_sub; r++)
        for (int i = 0; i < n; i++) {
            double v = y[(size_t)r * KWK_QROWS + i];
            e += v * v;
        }
    return e;
}

static void awq_run(void *ctx, int ith, int nth)
{
    struct awq_task *t = ctx;
    float *buf = t->scratch + (size_t)ith * t->stride;
    int mi = 0;
    for (;;) {
        long u = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (u >= t->first_unit[t->n_w])
            break;
        while (t->first_unit[mi + 1] <= u)
            mi++; /* a thread's units only grow */
        t->unit_err[u] = awq_unit(t, buf, mi, u - t->first_unit[mi]);
    }
}

/* The output error for one alpha, each matrix's evaluated rows standing for all its rows. */
static double awq_error(struct awq_task *t, const struct kwk_calib_input *in, const float *xsub,
                        float *s, float *xs, int step, struct kwk_pool *pool)
{
    kwk_awq_scales_at(in->absmean, t->dim, (double)step / KWK_AWQ_STEPS, s);
    for (size_t r = 0; r < (size_t)t->n_sub; r++)
        for (long k = 0; k < t->dim; k++)
            xs[r * (size_t)t->dim + (size_t)k] = xsub[r * (size_t)t->dim + (size_t)k] / s[k];
    atomic_init(&t->next, 0);
    run(pool, awq_run, t);
    double total = 0.0;
    for (int i = 0; i < t->n_w; i++) {
        long u0 = t->first_unit[i], n = t->first_unit[i + 1] - u0;
        int64_t nrb = n_row_blocks(t->w[i]->rows), eval_rows = 0;
        double e = 0.0;
        for (long j = 0; j < n; j++) {
            int64_t rb = awq_block(j, n, nrb);
            eval_rows += KWK_MIN((int64_t)KWK_QROWS, t->w[i]->rows - rb * KWK_QROWS);
            e += t->unit_err[u0 + j];
        }
        total += eval_rows ? e * (double)t->w[i]->rows / (double)eval_rows : 0.0;
    }
    return total;
}

static int awq_check(const struct kwk_mat *const *w, const int *wtypes, int n_w,
                     const struct kwk_calib_input *in, const float *s, struct kwk_err *err)
{
    if (!w || !wtypes || n_w < 1 || !in || !s || !in->absmean)
        return kwk_err_set(err, KWK_EARG, "awq: no matrices, scales or absmean");
    if (in->dim <= 0)
        return kwk_err_set(err, KWK_EARG, "awq: input dim %lld", (long long)in->dim);
    if (in->dim > MAX_DIM)
        return kwk_err_set(err, KWK_ELIMIT, "awq: input dim %lld (limit %d)",
                           (long long)in->dim, MAX_DIM);
    for (int i = 0; i < n_w; i++) {
        if (!w[i] || w[i]->cols != in->dim || w[i]->rows < 0)
            return kwk_err_set(err, KWK_EARG, "awq: matrix %d does not take the input's %lld "
                               "channels", i, (long long)in->dim);
        if (!kwk_quant_group(wtypes[i]))
            return kwk_err_set(err, KWK_EARG, "awq: matrix %d's type %d does not quantize", i,
                               wtypes[i]);
    }
    return check_calib(in, in->dim, err);
}

/* The evaluated rows: every kept row, or a uniform subsample of KWK_AWQ_MAX_ROWS. */
static int awq_rows(const struct kwk_calib_input *in, float **xsub, int *n_sub,
                    struct kwk_err *err)
{
    int n = (int)KWK_MIN(in->n_rows, (int64_t)KWK_AWQ_MAX_ROWS);
    int rc = 0;
    *xsub = alloc_array((size_t)KWK_MAX(n, 1), (size_t)in->dim, sizeof(float), &rc, err);
    if (!*xsub)
        return rc;
    for (int i = 0; i < n; i++) {
        int64_t r = (int64_t)i * in->n_rows / n;
        memcpy(*xsub + (size_t)i * (size_t)in->dim, in->x + r * in->dim,
               sizeof(float) * (size_t)in->dim);
    }
    *n_sub = n;
    return 0;
}

static int awq_prepare(struct awq_task *t, long *first_unit, struct kwk_pool *pool,
                       struct kwk_err *err)
{
    size_t blk = 0;
    first_unit[0] = 0;
    for (int i = 0; i < t->n_w; i++) {
        size_t b;
        if (kwk_quant_bytes(t->wtypes[i], KWK_QROWS, t->dim, &b))
            return kwk_err_set(err, KWK_ELIMIT, "awq: block row of %ld columns", t->dim);
        blk = KWK_MAX(blk, b);
        first_unit[i + 1] = first_unit[i] + awq_eval_blocks(t->w[i]->rows);
    }
    /* rows + dW + y (floats) then one block row, each start 64-byte aligned; all bounded by
     * MAX_DIM and INT_MAX rows */
    size_t floats = (size_t)KWK_QROWS * (2 * (size_t)t->dim + (size_t)t->n_sub);
    t->blocks_at = (floats + 15) / 16 * 16;
    t->stride = (t->blocks_at + (blk + sizeof(float) - 1) / sizeof(float) + 15) / 16 * 16;
    int rc = 0;
    t->scratch = alloc_array((size_t)pool_threads(pool), t->stride, sizeof(float), &rc, err);
    if (t->scratch)
        t->unit_err = alloc_array((size_t)KWK_MAX(first_unit[t->n_w], 1), 1, sizeof(double),
                                  &rc, err);
    return rc;
}

/* Coarse to fine over alpha = step / KWK_AWQ_STEPS: every 4th step, then the neighbours 2 and
 * 1 steps either side of the best so far (10 evaluations for AWQ's 0.05 resolution, where the
 * error is smooth in alpha). Ties keep the smaller alpha: s = 1 when nothing is gained. */
static int awq_search(struct awq_task *t, const struct kwk_calib_input *in, const float *xsub,
                      float *cand, float *xs, struct kwk_pool *pool)
{
    double e[KWK_AWQ_STEPS + 1];
    for (int i = 0; i <= KWK_AWQ_STEPS; i++)
        e[i] = -1.0;
    int best = 0;
    for (int stride = 4; stride >= 1; stride /= 2)
        for (int i = 0; i <= KWK_AWQ_STEPS; i++) {
            if (stride == 4 ? i % 4 != 0 : (i != best - stride && i != best + stride))
                continue;
            if (e[i] < 0.0)
                e[i] = awq_error(t, in, xsub, cand, xs, i, pool);
            if (e[i] < e[best] || (e[i] == e[best] && i < best))
                best = i;
        }
    /* Scales must win clearly on the calibration rows to be kept: a small gain there does not
     * carry over to other text (SmolLM2-135M balanced, calibrated on War and Peace, scored on
     * wikitext-2: +0.155% perplexity with every gain taken, against +0.066% without scales). */
    if (best > 0 && !(e[best] < (1.0 - KWK_AWQ_MIN_GAIN) * e[0]))
        best = 0;
    return best;
}

int kwk_awq_scales(const struct kwk_mat *const *w, const int *wtypes, int n_w,
                   const struct kwk_calib_input *in, float *s, float *alpha_out,
                   struct kwk_pool *pool, struct kwk_err *err)
{
    int rc = awq_check(w, wtypes, n_w, in, s, err);
    if (rc)
        return rc;
    struct awq_task t = {.w = w, .wtypes = wtypes, .n_w = n_w, .dim = (long)in->dim};
    float *xsub = NULL, *xs = NULL, *cand = NULL;
    long *first_unit = kwk_malloc(sizeof(long) * ((size_t)n_w + 1));
    if (!first_unit)
        return kwk_err_set(err, -ENOMEM, "awq: out of memory");
    t.first_unit = first_unit;
    if ((rc = awq_rows(in, &xsub, &t.n_sub, err)) ||
        !(cand = alloc_array((size_t)in->dim, 1, sizeof(float), &rc, err)) ||
        !(xs = alloc_array((size_t)KWK_MAX(t.n_sub, 1), (size_t)in->dim, sizeof(float), &rc,
                           err)) ||
        (rc = awq_prepare(&t, first_unit, pool, err)))
        goto out;
    t.xs = xs;
    t.s = cand;
    int best = t.n_sub > 0 ? awq_search(&t, in, xsub, cand, xs, pool) : 0;
    kwk_awq_scales_at(in->absmean, t.dim, (double)best / KWK_AWQ_STEPS, s);
    if (alpha_out)
        *alpha_out = (float)best / KWK_AWQ_STEPS;
out:
    kwk_free_aligned(t.unit_err);
    kwk_free_aligned(t.scratch);
    kwk_free_aligned(cand);
    kwk_free_aligned(xs);
    kwk_free_aligned(xsub);
    kwk_free(first_unit);
    return rc;
}
