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
/* Largest group a format may have (fit_group's stack buffer). */
#define MAX_GROUP 256

/* ---- shared helpers ------------------------------------------------------------------------- */

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
    if (!src || !dst || !dst->data || !kwk_quant_group(dst->wtype) ||
        kwk_quant_group(dst->wtype) > MAX_GROUP)
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

/* ---- round-to-nearest packing of W' ----------------------------------------------------------- */

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

/* ---- GPTQ: H, its factorisation, the column sweep --------------------------------------------- */

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

/* Upper Cholesky B = R^T R in place (upper triangle of b, [n][n] double), right-looking so the
 * trailing update is a contiguous axpy per row (vectorizes without -ffast-math), rows of the
 * update shared among threads by index (i % nth) with one barrier per step: n^3 / 6
 * multiply-adds. Row j is final after step j, so rows are divided by their pivots at the end.
 * Every element sees the same operations whatever the thread count. */
struct chol_task {
    struct kwk_pool *pool;
    double *b;
    long n;
    long failed_at; /* first non-positive pivot, or -1 (written by thread 0 only) */
};

static void chol_run(void *ctx, int ith, int nth)
{
    struct chol_task *t = ctx;
    long n = t->n;
    double *b = t->b;
    for (long j = 0; j < n; j++) {
        double piv = b[j * n + j];
        if (!(piv > 0.0) || !isfinite(piv)) {
            if (ith == 0)
                t->failed_at = j;
            return; /* every thread read the same pivot: all leave here, none waits */
        }
        const double *restrict bj = b + j * n;
        for (long i = j + 1; i < n; i++) {
            if (i % nth != ith)
                continue;
            double f = bj[i] / piv;
            double *restrict bi = b + i * n;
            for (long k = i; k < n; k++)
                bi[k] -= f * bj[k];
        }
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
 * factorisation and one triangular inverse (n^3 / 6 each) rather than GPTQ's three steps. Each
 * column c of Z is a back substitution written as one row of U, so threads take columns from a
 * counter, largest first, and never share a row. (Feeding back w_j - q_j of the original
 * weights through V directly would skip the inverse, but its sums cancel: measured 3-6% more
 * output error on ill-conditioned H in float.) */
struct inv_task {
    const double *r; /* [n][n] upper */
    float *u;        /* [n][n], upper triangle written */
    double *z;       /* [nth][n] */
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

static void inv_run(void *ctx, int ith, int nth)
{
    struct inv_task *t = ctx;
    long n = t->n;
    double *z = t->z + (size_t)ith * (size_t)n;
    for (;;) {
        long c = n - 1 - atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (c < 0)
            break;
        z[c] = 1.0 / t->r[c * n + c];
        for (long i = c - 1; i >= 0; i--) {
            const double *ri = t->r + i * n;
            z[i] = -dot4(ri + i + 1, z + i + 1, c - i) / ri[i];
        }
        float *urow = t->u + (size_t)(n - 1 - c) * (size_t)n;
        for (long i = 0; i <= c; i++)
            urow[n - 1 - i] = (float)z[i];
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
    double *z = alloc_array((size_t)pool_threads(pool), (size_t)n, sizeof(double), &rc, err);
    if (!z)
        return rc;
    it.z = z;
    atomic_init(&it.next, 0);
    run(pool, inv_run, &it);
    kwk_free_aligned(z);
    return 0;
}

/* The sweep over one 16-row block, column-major (wt[k][i], k < cols, i < 16) so the feedback
 * into later columns is a 16-wide multiply-add per column: rows * cols^2 / 2 in all. */
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
    float *rows; /* [16][cols] */
    float *wt;   /* [cols][16] */
    int8_t *q;   /* [16][cols] */
    float *d, *m; /* [16][n_groups] */
};

static size_t sweep_stride(int64_t cols, int64_t ng)
{
    /* rows + wt + q (as floats, rounded up) + d + m; every count < 2^40 by MAX_DIM */
    return (size_t)(2 * KWK_QROWS * cols + (KWK_QROWS * cols + 3) / 4 + 2 * KWK_QROWS * ng + 16);
}

static struct sweep_buf sweep_buf(float *base, int64_t cols, int64_t ng)
{
    struct sweep_buf s;
    s.rows = base;
    s.wt = s.rows + KWK_QROWS * cols;
    s.d = s.wt + KWK_QROWS * cols;
    s.m = s.d + KWK_QROWS * ng;
    s.q = (int8_t *)(s.m + KWK_QROWS * ng);
    return s;
}

/* Fit group g of each of the block's n rows on the current (updated) weights. */
static void fit_group(int wtype, struct sweep_buf *s, int n, int64_t cols, int64_t ng, int64_t g)
{
    int G = kwk_quant_group(wtype);
    int len = (int)KWK_MIN((int64_t)G, cols - g * G);
    float w[MAX_GROUP];
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < len; k++)
            w[k] = s->wt[(g * G + k) * KWK_QROWS + i];
        kwk_quant_fit(wtype, w, len, &s->d[i * ng + g], &s->m[i * ng + g]);
    }
}

static void sweep_block(struct sweep_task *t, struct sweep_buf *s, int64_t rb)
{
    int wtype = t->dst->wtype, G = kwk_quant_group(wtype);
    int64_t rows = t->src->rows, cols = t->src->cols, ng = kwk_quant_n_groups(wtype, cols);
    int n = (int)KWK_MIN((int64_t)KWK_QROWS, rows - rb * KWK_QROWS);
    load_rows(t->src, rb * KWK_QROWS, n, t->col_scale, t->row_scale, s->rows);
    for (int64_t k = 0; k < cols; k++)
        for (int i = 0; i < KWK_QROWS; i++)
            s->wt[k * KWK_QROWS + i] = i < n ? s->rows[i * cols + k] : 0.0f;
    for (int64_t j = 0; j < cols; j++) {
        if (j % G == 0)
            fit_group(wtype, s, n, cols, ng, j / G);
        const float *uj = t->u + j * cols;
        float e[KWK_QROWS] = {0};
        const float *wj = s->wt + j * KWK_QROWS;
        for (int i = 0; i < n; i++) {
            float d = s->d[i * ng + j / G], m = s->m[i * ng + j / G];
            int c = kwk_quant_code(wtype, wj[i], d, m);
            s->q[i * cols + j] = (int8_t)c;
            e[i] = (wj[i] - (d * (float)c + m)) / uj[j];
        }
        for (int64_t k = j + 1; k < cols; k++) {
            float uk = uj[k];
            float *restrict wk = s->wt + k * KWK_QROWS;
            for (int i = 0; i < KWK_QROWS; i++)
                wk[i] -= e[i] * uk;
        }
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

int kwk_gptq_pack(const struct kwk_mat *src, const float *col_scale, const float *row_scale,
                  const struct kwk_calib_input *in, float damp, struct kwk_mat *dst,
                  struct kwk_pool *pool, struct kwk_err *err)
{
    int rc = check_dst(src, dst, err);
    if (!rc)
        rc = check_calib(in, src->cols, err);
    if (rc)
        return rc;
    if (!(damp >= 0.0f) || !isfinite(damp))
        return kwk_err_set(err, KWK_EARG, "gptq: damping %g", (double)damp);
    if (src->rows == 0)
        return 0;
    long n = (long)src->cols;
    float *xt = NULL, *hp = NULL, *scratch = NULL; /* hp: H, then U */
    double *b = NULL;
    if (!(hp = alloc_array((size_t)n, (size_t)n, sizeof(float), &rc, err)) ||
        !(b = alloc_array((size_t)n, (size_t)n, sizeof(double), &rc, err)) ||
        !(xt = alloc_array((size_t)n, (size_t)in->n_rows, sizeof(float), &rc, err)))
        goto out;
    transpose_scaled(in, col_scale, xt);
    struct gram_task gt = {{KWK_W_F32, n, in->n_rows, xt}, xt, hp};
    run(pool, gram_run, &gt);
    kwk_free_aligned(xt);
    xt = NULL;
    if ((rc = hinv_factor(hp, b, n, damp, pool, err)))
        goto out;
    kwk_free_aligned(b);
    b = NULL;
    int64_t ng = kwk_quant_n_groups(dst->wtype, src->cols);
    struct sweep_task st = {src, col_scale, row_scale, hp, dst, NULL, sweep_stride(n, ng), 0};
    if (!(scratch = alloc_array((size_t)pool_threads(pool), st.stride, sizeof(float), &rc, err)))
        goto out;
    st.scratch = scratch;
    atomic_init(&st.next, 0);
    run(pool, sweep_run, &st);
out:
    kwk_free_aligned(scratch);
    kwk_free_aligned(b);
    kwk_free_aligned(hp);
    kwk_free_aligned(xt);
    return rc;
}

/* ---- AWQ -------------------------------------------------------------------------------------- */

/* s = absmean^alpha / sqrt(max^alpha * min^alpha), as exp(alpha * (ln a - mid)) so that equal
 * channels (and alpha = 0) give exactly 1. Channels with no activation take the smallest
 * positive mean (a zero would make every other scale infinite). */
static void awq_scales(const float *absmean, long dim, double alpha, float *s)
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
    struct kwk_mat q = {wtype, n, dim, blocks};
    for (int i = 0; i < n; i++) {
        float *d = dw + (size_t)i * (size_t)dim;
        const float *ws = rows + (size_t)i * (size_t)dim;
        kk->mat_row(&q, i, d);
        for (long k = 0; k < dim; k++)
            d[k] -= ws[k];
    }
    struct kwk_mat dm = {KWK_W_F32, n, dim, dw};
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
    awq_scales(in->absmean, t->dim, (double)step / KWK_AWQ_STEPS, s);
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
    awq_scales(in->absmean, t.dim, (double)best / KWK_AWQ_STEPS, s);
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
