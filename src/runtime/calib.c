/* calib.c - the calibration capture: a float decoder runs the calibration tokens and, through
 * the forward pass's capture hook (runtime.h: kwk_capture_rows), every matrix input is folded
 * into per-channel |x| sums and a uniform sample of rows. Owner thread only: the hook is called
 * between pool tasks, never from a worker. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "runtime/calib.h"
#include "runtime/runtime.h"

struct capture_site {
    struct kwk_calib_input in; /* what quantfit reads: x and absmean point into this site */
    float *x;                  /* [n_keep][dim] */
    float *absmean;            /* [dim], valid after the run */
    double *abssum;            /* [dim] while running */
    float *gram;               /* [dim][dim] X^T X (upper triangle while running), or NULL */
    int64_t seen;              /* rows seen so far */
};

struct kwk_capture {
    int n_layers;
    int64_t n_tok;  /* rows every site sees in all */
    int64_t n_keep; /* rows every site keeps */
    struct capture_site *sites; /* [n_layers * KWK_SITE_COUNT + 1]: the last is the lm_head's */
};

static struct capture_site *site_of(const struct kwk_capture *c, int layer, int site)
{
    if (layer >= c->n_layers)
        return &c->sites[(size_t)c->n_layers * KWK_SITE_COUNT];
    return &c->sites[(size_t)layer * KWK_SITE_COUNT + (size_t)site];
}

/* Row t of N is kept when floor((t+1) K / N) steps: K rows spread evenly over the N. */
static int keeps(const struct kwk_capture *c, int64_t t)
{
    return (t + 1) * c->n_keep / c->n_tok > t * c->n_keep / c->n_tok;
}

/* gram += x^T x for n rows of x (upper triangle): four rows per sweep of the matrix, which is
 * larger than the caches for wide inputs. */
static void gram_add(float *gram, int64_t dim, const float *x, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *x0 = x + (size_t)i * (size_t)dim, *x1 = x0 + dim, *x2 = x1 + dim,
                    *x3 = x2 + dim;
        for (int64_t a = 0; a < dim; a++) {
            float *g = gram + (size_t)a * (size_t)dim;
            float a0 = x0[a], a1 = x1[a], a2 = x2[a], a3 = x3[a];
            for (int64_t b = a; b < dim; b++)
                g[b] += a0 * x0[b] + a1 * x1[b] + a2 * x2[b] + a3 * x3[b];
        }
    }
    for (; i < n; i++) {
        const float *x0 = x + (size_t)i * (size_t)dim;
        for (int64_t a = 0; a < dim; a++) {
            float *g = gram + (size_t)a * (size_t)dim;
            for (int64_t b = a; b < dim; b++)
                g[b] += x0[a] * x0[b];
        }
    }
}

void kwk_capture_rows(struct kwk_capture *c, int layer, int site, const float *x, int n)
{
    struct capture_site *s = site_of(c, layer, site);
    int64_t dim = s->in.dim;
    if (s->gram)
        gram_add(s->gram, dim, x, (int)KWK_MIN((int64_t)n, c->n_tok - s->seen));
    for (int i = 0; i < n && s->seen < c->n_tok; i++, s->seen++) {
        const float *row = x + (size_t)i * (size_t)dim;
        for (int64_t j = 0; j < dim; j++)
            s->abssum[j] += fabs((double)row[j]);
        if (keeps(c, s->seen)) {
            int64_t k = s->seen * c->n_keep / c->n_tok; /* the index this row keeps */
            memcpy(s->x + (size_t)k * (size_t)dim, row, (size_t)dim * sizeof(float));
        }
    }
}

void kwk_capture_free(struct kwk_capture *c)
{
    if (!c)
        return;
    for (int i = 0; c->sites && i <= c->n_layers * KWK_SITE_COUNT; i++) {
        kwk_free_aligned(c->sites[i].x);
        kwk_free_aligned(c->sites[i].gram);
        kwk_free(c->sites[i].absmean);
        kwk_free(c->sites[i].abssum);
    }
    kwk_free(c->sites);
    kwk_free(c);
}

const struct kwk_calib_input *kwk_capture_input(const struct kwk_capture *c, int layer, int site)
{
    return &site_of(c, layer, site)->in;
}

const float *kwk_capture_gram(const struct kwk_capture *c, int layer, int site)
{
    return site_of(c, layer, site)->gram;
}

static int64_t site_dim(const struct kwk_config *cfg, int site)
{
    switch (site) {
    case KWK_SITE_O: return (int64_t)cfg->n_heads * cfg->head_dim;
    case KWK_SITE_DOWN: return cfg->d_ff;
    default: return cfg->d_model;
    }
}

static struct kwk_capture *capture_new(const struct kwk_config *cfg, int64_t n_tok,
                                       int want_gram, struct kwk_err *err)
{
    struct kwk_capture *c = kwk_calloc(1, sizeof *c);
    if (!c)
        goto nomem;
    c->n_layers = cfg->n_layers;
    c->n_tok = n_tok;
    int n_sites = cfg->n_layers * KWK_SITE_COUNT + 1;
    int64_t row_bytes = 0, gram_bytes = 0;
    for (int i = 0; i < n_sites; i++) {
        int64_t dim = site_dim(cfg, i < n_sites - 1 ? i % KWK_SITE_COUNT : KWK_SITE_QKV);
        row_bytes += 4 * dim;
        gram_bytes += dim > (int64_t)1 << 20 ? KWK_CALIB_MAX_GRAM_BYTES : 4 * dim * dim;
    }
    if (want_gram && gram_bytes > KWK_CALIB_MAX_GRAM_BYTES) {
        kwk_log(KWK_LOG_INFO, "calibration: Gram matrices would take %.1f GB (limit %.1f): GPTQ "
                "uses the kept rows", (double)gram_bytes / 1e9,
                (double)KWK_CALIB_MAX_GRAM_BYTES / 1e9);
        want_gram = 0;
    }
    c->n_keep = KWK_MIN(n_tok, (int64_t)KWK_CALIB_MAX_ROWS);
    c->n_keep = KWK_MAX(1, KWK_MIN(c->n_keep, KWK_CALIB_MAX_BYTES / KWK_MAX(row_bytes, 1)));
    c->sites = kwk_calloc((size_t)n_sites, sizeof *c->sites);
    if (!c->sites)
        goto nomem;
    for (int i = 0; i < n_sites; i++) {
        struct capture_site *s = &c->sites[i];
        int64_t dim = site_dim(cfg, i < n_sites - 1 ? i % KWK_SITE_COUNT : KWK_SITE_QKV);
        s->x = kwk_malloc_aligned((size_t)c->n_keep * (size_t)dim * sizeof(float));
        s->absmean = kwk_calloc((size_t)dim, sizeof(float));
        s->abssum = kwk_calloc((size_t)dim, sizeof(double));
        if (!s->x || !s->absmean || !s->abssum)
            goto nomem;
        if (want_gram) {
            s->gram = kwk_malloc_aligned((size_t)dim * (size_t)dim * sizeof(float));
            if (!s->gram)
                goto nomem;
            memset(s->gram, 0, (size_t)dim * (size_t)dim * sizeof(float));
        }
        s->in = (struct kwk_calib_input){dim, c->n_keep, s->x, s->absmean};
    }
    return c;
nomem:
    kwk_capture_free(c);
    kwk_err_set(err, -ENOMEM, "out of memory for calibration activations (%lld tokens)",
                (long long)n_tok);
    return NULL;
}

int kwk_calib_capture(const struct kwk_model *m, const int32_t *ids, int64_t n, int n_threads,
                      int want_gram, struct kwk_capture **out, struct kwk_err *err)
{
    *out = NULL;
    const struct kwk_config *cfg = &m->cfg;
    if (n <= 0 || n > KWK_CALIB_MAX_TOKENS || !ids)
        return kwk_err_set(err, KWK_EARG, "calibration needs 1 to %d token ids, got %lld",
                           KWK_CALIB_MAX_TOKENS, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= cfg->n_vocab)
            return kwk_err_set(err, KWK_EARG, "calibration token %lld is id %d, outside the "
                               "vocabulary [0, %d)", (long long)i, ids[i], cfg->n_vocab);
    struct kwk_capture *c = capture_new(cfg, n, want_gram, err);
    if (!c)
        return err ? err->code : -ENOMEM;
    struct kwk_decoder_params p;
    kwk_decoder_params_init(&p);
    p.precision = KWK_PRECISION_PRESERVE;
    p.n_threads = n_threads;
    p.max_cache_len = (int)KWK_MIN(n, (int64_t)KWK_CALIB_SEQ);
    struct kwk_decoder *d = kwk_decoder_new(m, &p, err);
    float *hn = kwk_malloc_aligned((size_t)cfg->d_model * sizeof(float));
    if (!d || !hn) {
        kwk_free_aligned(hn);
        kwk_decoder_free(d);
        kwk_capture_free(c);
        if (!d)
            return err ? err->code : -ENOMEM;
        return kwk_err_set(err, -ENOMEM, "out of memory for calibration");
    }
    d->capture = c;
    kwk_log(KWK_LOG_INFO, "calibration: %lld tokens, %lld rows kept per matrix input",
            (long long)n, (long long)c->n_keep);
    for (int64_t at = 0; at < n;) {
        int64_t seq_end = KWK_MIN(n, at + KWK_CALIB_SEQ);
        kwk_decoder_truncate(d, 0);
        while (at < seq_end) {
            int nb = (int)KWK_MIN(seq_end - at, (int64_t)d->n_batch);
            kwk_forward_chunk(d, ids + at, nb);
            for (int i = 0; i < nb; i++) { /* the lm_head's input */
                d->k->rmsnorm(hn, d->x + (size_t)i * (size_t)cfg->d_model, m->out_norm,
                              cfg->d_model, cfg->rms_eps);
                kwk_capture_rows(c, cfg->n_layers, 0, hn, 1);
            }
            at += nb;
        }
    }
    d->capture = NULL;
    kwk_free_aligned(hn);
    kwk_decoder_free(d);
    for (int i = 0; i <= c->n_layers * KWK_SITE_COUNT; i++) {
        struct capture_site *s = &c->sites[i];
        for (int64_t j = 0; j < s->in.dim; j++)
            s->absmean[j] = (float)(s->abssum[j] / (double)n);
        for (int64_t a = 0; s->gram && a < s->in.dim; a++) /* mirror the upper triangle */
            for (int64_t b = 0; b < a; b++)
                s->gram[a * s->in.dim + b] = s->gram[b * s->in.dim + a];
        kwk_free(s->abssum);
        s->abssum = NULL;
    }
    *out = c;
    return 0;
}
