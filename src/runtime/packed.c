/* packed.c - repacking a model's matrices into the int8 / int4 block formats of kernels/quant.h
 * (balanced, int4) or into bf16 panels (kernels/panel.h: preserve, where the kernels want them),
 * in parallel on the decoder's pool. Built on the decoder's owner thread; read-only after. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/bf16t.h"
#include "kernels/panel.h"
#include "kernels/quant.h"
#include "runtime/calib.h"
#include "runtime/packcache.h"
#include "runtime/packed.h"
#include "runtime/quantfit.h"
#include "runtime/runtime.h"

struct kwk_packed {
    struct kwk_layer *layers; /* [n_layers] the model's layers with matrices replaced */
    struct kwk_mat lm_head;   /* [n_vocab][d_model] packed */
    const float *out_norm;    /* [d_model] the model's, or calibration's (scales folded in) */
    void **bufs;              /* [n_bufs] block storage, one per matrix (aligned) */
    int n_bufs;
    int64_t n_weights;        /* weights of the packed matrices */
    size_t n_bytes;           /* bytes of their blocks */
    struct kwk_packcache *cache; /* the pack file the blocks are mapped from, or NULL */
};

/* Matrices of a layer, in the order of kwk_layer; names for KWKER_INT4_KEEP8. */
enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, M_HEAD, M_COUNT };
static const char *const mat_names[M_COUNT] = {"q", "k", "v", "o", "gate", "up", "down", "head"};

static struct kwk_mat *layer_mat(struct kwk_layer *l, int which)
{
    struct kwk_mat *const ms[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up,
                                  &l->w_down};
    return ms[which];
}

/* int4's mixed precision: which matrices stay wider (mix_bits: 8 or 6 bits). By default the
 * lm_head (its errors go straight into every logit) and the value and down projections (the
 * ones that move the logits most at 4 bits, as llama.cpp's Q4_K_M also finds) of the layers
 * more_bits_layer picks: 6.10 bits per weight on SmolLM2-135M at 8, under Q4_K_M's 6.17;
 * mix_bits 4 keeps none. KWKER_INT4_KEEP8 (a comma list of q,k,v,o,gate,up,down,head, or
 * "none") overrides it for measurements, in every layer (bit M_COUNT of the mask says "every
 * layer"); the mask is part of the pack cache's key. */
static unsigned keep8_mask(int mix_bits)
{
    unsigned mask = mix_bits == 4 ? 0 : 1u << M_HEAD | 1u << M_V | 1u << M_DOWN;
    const char *env = getenv("KWKER_INT4_KEEP8");
    if (!env)
        return mask;
    mask = 1u << M_COUNT;
    for (int i = 0; i < M_COUNT; i++) {
        size_t n = strlen(mat_names[i]);
        for (const char *p = env; (p = strstr(p, mat_names[i])) != NULL; p += n)
            if ((p == env || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
                mask |= 1u << i;
    }
    return mask;
}

/* The first and last eighth of the layers and every third one between: where 4-bit value and
 * down projections hurt most (the layers llama.cpp's Q4_K_M gives more bits). */
static int more_bits_layer(int L, int n_layers)
{
    return L < n_layers / 8 || L >= 7 * n_layers / 8 || (L - n_layers / 8) % 3 == 2;
}

static int keeps8(unsigned mask, int which, int L, int n_layers)
{
    if (!(mask >> which & 1))
        return 0;
    return which == M_HEAD || mask >> M_COUNT & 1 || more_bits_layer(L, n_layers);
}

/* The file's own widths. A K-quant GGUF ("Q4_K_M") mixes 4-bit matrices (Q4_K) with wider ones
 * (Q5_0, Q6_K, Q8_0) that llama.cpp's quantizer chose per matrix: int4 packs those wide too (in
 * mix_bits' wide type) rather than re-quantize them to 4 bits, and the file's 4-bit ones as the
 * keep8 mask says. Only a file that mixes: one quantized all at 8 (or 5, or 6) bits is one a user
 * asks int4 to make 4-bit, and float sources (safetensors, F16 GGUFs) have no widths to keep.
 * mix_bits 4 (all 4-bit, asked for) and KWKER_INT4_KEEP8 (exactly the matrices it names) leave
 * the file's widths aside. The packed types are part of the pack cache's key (its records). */
static int src_bits(const struct kwk_model *m, const struct kwk_mat *w)
{
    return kwk_dtype_bits(kwk_model_mat_dtype(m, w)); /* 0 when unknown */
}

static int quantized_wide(int bits)
{
    return bits > 4 && bits < 16;
}

static int keeps_file_widths(const struct kwk_model *m, int mix_bits, unsigned keep8)
{
    int n = 7 * m->cfg.n_layers, narrow = 0, wide = 0;
    if (mix_bits == 4 || keep8 >> M_COUNT & 1)
        return 0;
    for (int i = 0; i <= n; i++) {
        const struct kwk_mat *w = i < n ? layer_mat(&m->layers[i / 7], i % 7) : &m->lm_head;
        int bits = src_bits(m, w);
        narrow |= bits == 4;
        wide |= quantized_wide(bits);
    }
    return narrow && wide;
}

/* int4's type for src (matrix which of layer L): wide when the keep8 mask keeps it or, with
 * file_widths, when the file holds it wider than 4 bits; else 4-bit. */
static int int4_wtype(const struct kwk_model *m, const struct kwk_mat *src, int which, int L,
                      unsigned keep8, int file_widths, int wide)
{
    if (keeps8(keep8, which, L, m->cfg.n_layers) ||
        (file_widths && quantized_wide(src_bits(m, src))))
        return wide;
    return KWK_W_Q4;
}

/* ---- the parallel repack ------------------------------------------------------------------- */

/* Bytes of a packed wtype (blocks or panels): 0 on success. */
static int packed_bytes(int wtype, int64_t rows, int64_t cols, size_t *out)
{
    if (wtype == KWK_W_BF16P)
        return kwk_panel_bytes(rows, cols, out);
    if (wtype == KWK_W_BF16T)
        return kwk_bf16t_bytes(rows, cols, out);
    return kwk_quant_bytes(wtype, rows, cols, out);
}

/* Units of 16 rows: a row block of the quantized formats, a panel. */
_Static_assert(KWK_PANEL_ROWS == KWK_QROWS && KWK_BF16T_ROWS == KWK_QROWS,
               "panels, tile blocks and row blocks are all 16 rows");

struct pack_job {
    const struct kwk_mat *src;
    struct kwk_mat *dst;
    long first_unit; /* units (row blocks) before this job */
    /* int4 from a 4-bit file tensor (Q4_0, Q4_1, Q4_K): its codes and group parameters are
     * kept (set_grid), not fitted again to its dequantized floats; NULL otherwise */
    const struct kwk_tensor_ref *grid;
    int grid_n_head; /* > 0: llama.cpp's permuted q / k rows (kwk_model_file_row) */
};

static int int4_grid_on(void)
{
    return kwk_env_word("KWKER_INT4_GRID", (const char *const[]){"on", "off"}, 2) != 1;
}

/* Whether job j (int4, no calibration) packs from its file's own 4-bit grid. Every block of the
 * formats it comes from is groups of 32 with one scale and offset each, int4's own shape: the
 * file's codes kept with its scales rounded to halves move a weight by at most 2^-11 of its
 * group's range, where fitting the grid again to the floats could not find a Q4_K sub-block's
 * grid (its offset is a fitted minimum, not the values' own) and moved weights by up to half a
 * step (Gemma 3 270M's Q4_K_M: logits 0.127 from preserve's, relative RMS, before; 0.023 after,
 * docs/benchmarks.md). KWKER_INT4_GRID=off fits every matrix again. */
/* Returns 1 when j could keep a grid (whether or not `on` lets it), so that the switch counts
 * in the pack cache's key only where it changes blocks. */
static int set_grid(const struct kwk_model *m, struct pack_job *j, int on)
{
    j->grid = NULL;
    j->grid_n_head = 0;
    if (j->dst->wtype != KWK_W_Q4)
        return 0;
    int n_head;
    const struct kwk_tensor_ref *t = kwk_model_mat_tensor(m, j->src, &n_head);
    if (!t || (t->dtype != KWK_DT_Q4_0 && t->dtype != KWK_DT_Q4_1 && t->dtype != KWK_DT_Q4_K) ||
        j->src->cols % KWK_Q4_GROUP != 0)
        return 0;
    if (on) {
        j->grid = t;
        j->grid_n_head = n_head;
    }
    return 1;
}

/* Row block rb of job's matrix from its file's grid: codes and parameters row by row (in
 * Hugging Face's row order), the parameters rounded to halves as int4 stores them. buf holds
 * KWK_QROWS * cols floats. */
static void pack_grid_rows(const struct pack_job *job, int64_t rb, float *buf)
{
    const struct kwk_tensor_ref *t = job->grid;
    int64_t rows = job->src->rows, cols = job->src->cols, groups = cols / KWK_Q4_GROUP;
    size_t row_bytes = kwk_dtype_row_bytes(t->dtype, cols);
    uint8_t *codes = (uint8_t *)buf;                          /* [16][cols] */
    float *d = buf + (size_t)KWK_QROWS * (size_t)cols / 4;    /* [16][groups] */
    float *m = d + (size_t)KWK_QROWS * (size_t)groups;        /* [16][groups] */
    int64_t r1 = KWK_MIN(rows, (rb + 1) * KWK_QROWS);
    for (int64_t r = rb * KWK_QROWS; r < r1; r++) {
        int64_t i = r - rb * KWK_QROWS, fr = kwk_model_file_row(r, rows, job->grid_n_head);
        float *di = d + i * groups, *mi = m + i * groups;
        kwk_dequant_grid4(t->dtype, t->data + (size_t)fr * row_bytes, cols,
                          codes + i * cols, di, mi);
        for (int64_t g = 0; g < groups; g++) {
            di[g] = kwk_f16_to_f32(kwk_f32_to_f16(di[g]));
            mi[g] = kwk_f16_to_f32(kwk_f32_to_f16(mi[g]));
        }
    }
    kwk_quant_pack_codes(KWK_W_Q4, (void *)job->dst->data, rows, cols, rb,
                         (const int8_t *)codes, (long)cols, d, m);
}

struct pack_task {
    const struct kwk_kernels *k;
    struct pack_job *jobs;
    int n_jobs;
    long n_units;
    float *scratch;         /* [nth][KWK_QROWS * max_cols] */
    size_t scratch_stride;  /* floats per thread */
    _Atomic long next;      /* next unit to take (relaxed: units are independent) */
};

/* Threads take row blocks from a shared counter; each reads its 16 rows as float (any source
 * type, through the kernels' mat_row) and packs them. */
static void pack_run(void *ctx, int ith, int nth)
{
    struct pack_task *t = ctx;
    float *buf = t->scratch + (size_t)ith * t->scratch_stride;
    int j = 0;
    for (;;) {
        long u = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (u >= t->n_units)
            break;
        while (j + 1 < t->n_jobs && t->jobs[j + 1].first_unit <= u)
            j++; /* units only grow for a thread, so the job index only moves forward */
        const struct pack_job *job = &t->jobs[j];
        int64_t rb = u - job->first_unit, rows = job->src->rows, cols = job->src->cols;
        if (job->grid) {
            pack_grid_rows(job, rb, buf);
            continue;
        }
        int64_t r1 = KWK_MIN(rows, (rb + 1) * KWK_QROWS);
        for (int64_t r = rb * KWK_QROWS; r < r1; r++)
            t->k->mat_row(job->src, r, buf + (size_t)(r - rb * KWK_QROWS) * (size_t)cols);
        if (job->dst->wtype == KWK_W_BF16P)
            kwk_panel_pack_rows((void *)job->dst->data, rows, cols, rb, buf, (long)cols);
        else if (job->dst->wtype == KWK_W_BF16T)
            kwk_bf16t_pack_rows((void *)job->dst->data, rows, cols, rb, buf, (long)cols);
        else
            kwk_quant_pack_rows(job->dst->wtype, (void *)job->dst->data, rows, cols, rb, buf,
                                (long)cols);
    }
}

static int run_jobs(struct pack_job *jobs, int n_jobs, struct kwk_pool *pool,
                    struct kwk_err *err)
{
    int64_t max_cols = 1;
    long units = 0;
    for (int i = 0; i < n_jobs; i++) {
        jobs[i].first_unit = units;
        units += (long)((jobs[i].src->rows + KWK_QROWS - 1) / KWK_QROWS);
        max_cols = KWK_MAX(max_cols, jobs[i].src->cols);
    }
    int nth = pool ? kwk_pool_size(pool) : 1;
    struct pack_task t = {.k = kwk_kernels(), .jobs = jobs, .n_jobs = n_jobs, .n_units = units,
                          .scratch_stride = (size_t)KWK_QROWS * (size_t)max_cols};
    size_t n, bytes;
    if (kwk_mul_size(t.scratch_stride, (size_t)nth, &n) || kwk_mul_size(n, sizeof(float), &bytes))
        return kwk_err_set(err, KWK_ELIMIT, "packing scratch overflows");
    t.scratch = kwk_malloc_aligned(bytes);
    if (!t.scratch)
        return kwk_err_set(err, -ENOMEM, "out of memory for packing scratch");
    atomic_init(&t.next, 0);
    if (pool)
        kwk_pool_run(pool, pack_run, &t);
    else
        pack_run(&t, 0, 1);
    kwk_free_aligned(t.scratch);
    return 0;
}

/* Pack jobs[n] (one layer's matrices, n <= 7) from float sources made just for them when the
 * model makes its floats on demand, freed right after: packing holds one layer's floats, not
 * the whole checkpoint's float32 expansion. */
static int run_jobs_lazy(const struct kwk_model *m, const struct pack_job *jobs, int n,
                         struct kwk_pool *pool, struct kwk_err *err)
{
    struct kwk_mat src[7];
    struct pack_job mine[7];
    int got = 0, rc = 0;
    for (; got < n && got < 7; got++) {
        mine[got] = jobs[got];
        if (jobs[got].grid) /* read from the file's blocks: no floats needed */
            continue;
        if ((rc = kwk_model_mat_acquire(m, jobs[got].src, &src[got], err)))
            break;
        mine[got].src = &src[got];
    }
    if (!rc)
        rc = run_jobs(mine, got, pool, err);
    while (got-- > 0) {
        if (!jobs[got].grid)
            kwk_model_mat_release(m, jobs[got].src, &src[got]);
        else /* its blocks were read in place: their pages go as a float source's would */
            kwk_model_drop_pages(m, jobs[got].grid->data, jobs[got].grid->nbytes);
    }
    return rc;
}

/* The words of one file's part of sources_id: its id and each source's place in it (sources
 * s[at..] lie in it in order: pack_sources lists them file by file). */
static int id_words(const struct kwk_map *map, const struct kwk_pack_source *s, int at, int n,
                    uint64_t *w)
{
    const struct kwk_file_id *id = &map->id;
    uint64_t head[] = {id->dev, id->ino, id->size, (uint64_t)id->mtime_ns, (uint64_t)id->ctime_ns};
    memcpy(w, head, sizeof head);
    int k = (int)KWK_ARRAY_LEN(head);
    for (int i = at; i < at + n; i++) {
        w[k++] = (uint64_t)((const uint8_t *)s[i].data - map->data);
        w[k++] = s[i].n;
    }
    return k;
}

/* kwk_packcache_opts.source_id of sources s[n]: the ids of m's files and where in them each
 * source lies, hashed; 0 (hash the bytes) when a file's id is unknown or too recent to stand
 * for its bytes (kwk_file_id_settled). */
static uint64_t sources_id(const struct kwk_model *m, const struct kwk_pack_source *s, int n)
{
    int files = (m->gguf != NULL) + m->n_st;
    uint64_t *w = kwk_calloc((size_t)(5 * files + 2 * n + 1), sizeof *w);
    if (!w)
        return 0;
    int k = 0, at = 0, ok = 1;
    if (m->gguf) {
        ok &= kwk_file_id_settled(&m->gguf->map.id);
        k += id_words(&m->gguf->map, s, at, m->gguf->n_tensors, w + k);
        at += m->gguf->n_tensors;
    }
    for (int j = 0; j < m->n_st; j++) {
        ok &= kwk_file_id_settled(&m->st[j].map.id);
        k += id_words(&m->st[j].map, s, at, m->st[j].n_tensors, w + k);
        at += m->st[j].n_tensors;
    }
    w[k++] = (uint64_t)files;
    uint64_t id = ok ? kwk_hash64(w, (size_t)k * sizeof *w, 0x5ec1d) | 1 : 0; /* never 0 */
    kwk_free(w);
    return id;
}

/* The pack cache's key for m: the bytes of every tensor of its files (the matrices are made from
 * them; a GGUF's quantized tensors are far fewer bytes than their float32 expansion) and what
 * else turns those into the matrices. NULL sources (in-memory models) key on the matrices. */
static int pack_sources(const struct kwk_model *m, struct kwk_packcache_opts *o)
{
    int n = m->gguf ? m->gguf->n_tensors : 0;
    for (int i = 0; i < m->n_st; i++)
        n += m->st[i].n_tensors;
    if (n == 0)
        return 0;
    struct kwk_pack_source *s = kwk_calloc((size_t)n, sizeof *s);
    if (!s)
        return -1;
    int k = 0;
    for (int i = 0; m->gguf && i < m->gguf->n_tensors; i++)
        s[k++] = (struct kwk_pack_source){m->gguf->tensors[i].data, m->gguf->tensors[i].nbytes};
    for (int j = 0; j < m->n_st; j++)
        for (int i = 0; i < m->st[j].n_tensors; i++)
            s[k++] = (struct kwk_pack_source){m->st[j].tensors[i].data, m->st[j].tensors[i].nbytes};
    o->source_id = sources_id(m, s, n);
    const struct kwk_config *c = &m->cfg;
    const int64_t shape[] = {m->gguf != NULL, c->arch, c->n_vocab, c->n_layers, c->d_model,
                             c->n_heads, c->n_kv_heads, c->head_dim, c->d_ff,
                             c->tie_embeddings, c->qkv_bias, c->qk_norm};
    o->salt ^= kwk_hash64(shape, sizeof shape, 0x5eed);
    o->sources = s;
    o->n_sources = n;
    o->drop_sources = 1; /* kwk_map_file's mappings: PROT_READ, never written */
    return 0;
}

int kwk_packed_mat(const struct kwk_model *m, const struct kwk_mat *src, struct kwk_mat *dst,
                   struct kwk_pool *pool, struct kwk_err *err)
{
    struct pack_job job = {src, dst, 0, NULL, 0};
    set_grid(m, &job, int4_grid_on());
    return run_jobs_lazy(m, &job, 1, pool, err);
}

/* A pack file names its format version, but a change to packing that forgets to bump it would
 * go unseen: pack the smallest matrix of each target type again and compare (0.1% of packing
 * SmolLM2-135M). 1 = the mapped blocks are what this build packs. */
static int cached_blocks_match(const struct kwk_model *m, const struct pack_job *jobs, int n_jobs,
                               struct kwk_pool *pool)
{
    int ok = 1;
    for (int i = 0; i < n_jobs && ok; i++) {
        const struct kwk_mat *d = jobs[i].dst;
        int first = 1, best = i;
        for (int j = 0; j < n_jobs; j++) {
            const struct kwk_mat *o = jobs[j].dst;
            if (o->wtype == d->wtype && j < i)
                first = 0; /* this type was checked at its first matrix */
            const struct kwk_mat *cur = jobs[best].dst;
            if (o->wtype == d->wtype && o->rows * o->cols < cur->rows * cur->cols)
                best = j;
        }
        size_t bytes;
        const struct kwk_mat *b = jobs[best].dst;
        if (!first || packed_bytes(b->wtype, b->rows, b->cols, &bytes))
            continue;
        struct kwk_mat fresh = {.wtype = b->wtype,
                                .rows = b->rows,
                                .cols = b->cols,
                                .data = kwk_malloc_aligned(bytes ? bytes : 64)};
        struct kwk_mat src; /* the float source, made for this check when the model's are lazy */
        struct pack_job job = {&src, &fresh, 0, jobs[best].grid, jobs[best].grid_n_head};
        if (fresh.data && jobs[best].grid) {
            job.src = jobs[best].src;
            if (!run_jobs(&job, 1, pool, NULL))
                ok = !memcmp(fresh.data, b->data, bytes);
        } else if (fresh.data && !kwk_model_mat_acquire(m, jobs[best].src, &src, NULL)) {
            if (!run_jobs(&job, 1, pool, NULL))
                ok = !memcmp(fresh.data, b->data, bytes);
            kwk_model_mat_release(m, jobs[best].src, &src);
        }
        kwk_free_aligned((void *)fresh.data);
    }
    return ok;
}

/* ---- calibration: activation-aware scales and GPTQ ------------------------------------------ */

/* What calibration changes in one layer, besides its packed matrices: the scales s that
 * multiply the columns of the matrices reading a site are divided out of whatever writes that
 * site (AWQ): the attention and FFN norm weights, the value projection's rows (and bias) for
 * the o-projection's input, the up projection's rows for the down projection's input. */
struct layer_fit {
    float *s[KWK_SITE_COUNT]; /* [site dim] column scales of the site's readers (NULL: none) */
    float *v_row;             /* [kv_dim] 1 / s of the o-projection, per value row */
    float *up_row;            /* [d_ff] 1 / s of the down projection */
};

/* The o-projection's input channel h*hd+e comes from value row (h / group)*hd+e: one scale must
 * serve every query head of a KV group, so the scales come from the group's mean |x|. */
static void group_absmean(const struct kwk_config *c, const float *in, float *out)
{
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    for (int g = 0; g < c->n_kv_heads; g++)
        for (int e = 0; e < hd; e++) {
            float sum = 0.0f;
            for (int h = g * group; h < (g + 1) * group; h++)
                sum += in[h * hd + e];
            for (int h = g * group; h < (g + 1) * group; h++)
                out[h * hd + e] = sum / (float)group;
        }
}

/* KWKER_AWQ_ALPHA=a forces AWQ's exponent (tests: scales that are surely not 1, so that their
 * folding into norms, value and up rows is exercised; measurements). 1 when set. */
static int forced_alpha(float *alpha)
{
    const char *env = getenv("KWKER_AWQ_ALPHA");
    char *end;
    float a = env ? strtof(env, &end) : 0.0f;
    if (!env || end == env || !(a >= 0.0f && a <= 1.0f))
        return 0;
    *alpha = a;
    return 1;
}

/* AWQ alone is for low-bit weights: without GPTQ a site whose matrices are all 8-bit keeps
 * s = 1. Measured on SmolLM2-135M balanced: AWQ halved the q/k/v output error on the
 * calibration rows (War and Peace, or wikitext rows outside the scored ones alike) and still
 * moved perplexity from +0.066% to +0.16-0.17%. With GPTQ the scales are searched everywhere and
 * each site keeps AWQ + GPTQ or GPTQ alone by its calibration error (pack_site): balanced
 * +0.032% that way, +0.133% with GPTQ alone everywhere. */
static int low_bit(const int *wtypes, int n, int gptq)
{
    if (gptq)
        return 1;
    for (int i = 0; i < n; i++)
        if (wtypes[i] != KWK_W_Q8)
            return 1;
    return 0;
}

static int fit_layer(const struct kwk_model *m, const struct kwk_capture *cap, int L,
                     const struct kwk_layer *dst, struct layer_fit *f, int gptq,
                     struct kwk_pool *pool, struct kwk_err *err)
{
    const struct kwk_config *c = &m->cfg;
    const struct kwk_layer *l = &m->layers[L];
    const struct kwk_mat *qkv[3] = {&l->wq, &l->wk, &l->wv}, *gu[2] = {&l->w_gate, &l->w_up};
    const struct kwk_mat *o[1] = {&l->wo}, *down[1] = {&l->w_down};
    const int t_qkv[3] = {dst->wq.wtype, dst->wk.wtype, dst->wv.wtype};
    const int t_gu[2] = {dst->w_gate.wtype, dst->w_up.wtype};
    const int t_o[1] = {dst->wo.wtype}, t_down[1] = {dst->w_down.wtype};
    const struct kwk_mat *const *mats[KWK_SITE_COUNT] = {qkv, o, gu, down};
    const int *types[KWK_SITE_COUNT] = {t_qkv, t_o, t_gu, t_down};
    const int n_mats[KWK_SITE_COUNT] = {3, 1, 2, 1};
    for (int site = 0; site < KWK_SITE_COUNT; site++) {
        struct kwk_calib_input in = *kwk_capture_input(cap, L, site);
        float *grouped = NULL;
        if (site == KWK_SITE_O) {
            grouped = kwk_malloc((size_t)in.dim * sizeof(float));
            if (!grouped)
                return kwk_err_set(err, -ENOMEM, "out of memory for calibration scales");
            group_absmean(c, in.absmean, grouped);
            in.absmean = grouped;
        }
        float alpha = 0.0f;
        int rc = 0;
        if (low_bit(types[site], n_mats[site], gptq))
            rc = kwk_awq_scales(mats[site], types[site], n_mats[site], &in, f->s[site], &alpha,
                                pool, err);
        else
            kwk_awq_scales_at(in.absmean, (long)in.dim, 0.0f, f->s[site]);
        if (!rc && forced_alpha(&alpha))
            kwk_awq_scales_at(in.absmean, (long)in.dim, alpha, f->s[site]);
        kwk_free(grouped);
        if (rc)
            return rc;
        kwk_log(KWK_LOG_DEBUG, "calibration: layer %d %s: alpha %.2f", L,
                (const char *const[]){"qkv", "o", "gate/up", "down"}[site], (double)alpha);
    }
    return 0;
}

/* The value and up rows' scales from the o and down projections' (final) column scales. */
static void rows_of_scales(const struct kwk_config *c, struct layer_fit *f)
{
    /* value row g*hd+e feeds o's columns h*hd+e of the query heads h of group g, which share
     * one scale (group_absmean): take the group's first head's */
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    for (int g = 0; g < c->n_kv_heads; g++)
        for (int e = 0; e < hd; e++)
            f->v_row[g * hd + e] = 1.0f / f->s[KWK_SITE_O][g * group * hd + e];
    for (int r = 0; r < c->d_ff; r++)
        f->up_row[r] = 1.0f / f->s[KWK_SITE_DOWN][r];
}

/* GPTQ's dampening: this fraction of the mean diagonal is added to the Hessian's diagonal (the
 * paper's 0.01), which keeps it invertible when calibration is short. */
#define GPTQ_DAMP 0.01f

/* Pack one matrix with the calibration's scales (col over its columns, row over its rows; either
 * NULL) and, with gptq, GPTQ against its input. */
static int pack_fitted(const struct kwk_mat *src, struct kwk_mat *dst, const float *col,
                       const float *row, const struct kwk_calib_input *in, const float *gram,
                       int gptq, struct kwk_pool *pool, struct kwk_err *err)
{
    if (gptq && gram) /* H over every calibration token, not only the kept rows */
        return kwk_gptq_pack_gram(src, col, row, gram, in->dim, GPTQ_DAMP, dst, pool, err);
    if (gptq)
        return kwk_gptq_pack(src, col, row, in, GPTQ_DAMP, dst, pool, err);
    return kwk_scaled_pack(src, col, row, dst, pool, err);
}

/* ---- choosing between AWQ + GPTQ and GPTQ alone ------------------------------------------------ */

/* GPTQ already weighs each input channel by its activations; AWQ's scales on top help on some
 * matrices (outlier channels) and hurt on others (SmolLM2-135M's lm_head: +4.0% perplexity with
 * both, +2.1% with GPTQ alone). So with gptq each input site is packed both ways and keeps the
 * one whose outputs on (up to) EVAL_ROWS kept calibration rows are closer to the float ones. */
#define EVAL_ROWS 256

struct err_task {
    const struct kwk_kernels *k;
    const struct kwk_mat *src, *q; /* float source, its packed form */
    const float *col, *row;        /* the scales q was packed with (NULL = 1) */
    const struct kwk_calib_input *in;
    double *row_err;               /* [rows] */
    float *scratch;                /* [nth][2 * cols] */
    _Atomic long next;
};

static void err_run(void *ctx, int ith, int nth)
{
    struct err_task *t = ctx;
    int64_t cols = t->src->cols, n_rows = t->in->n_rows;
    int64_t n_eval = KWK_MIN(n_rows, (int64_t)EVAL_ROWS);
    float *w = t->scratch + (size_t)ith * 2 * (size_t)cols, *wq = w + cols;
    (void)nth;
    for (;;) {
        long r = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (r >= t->src->rows)
            break;
        t->k->mat_row(t->src, r, w);
        t->k->mat_row(t->q, r, wq);
        float rs = t->row ? t->row[r] : 1.0f;
        for (int64_t j = 0; j < cols; j++) /* the packed row as the float model sees it */
            wq[j] = (t->col ? wq[j] / t->col[j] : wq[j]) - w[j] * rs;
        double e = 0.0;
        for (int64_t i = 0; i < n_eval; i++) {
            const float *x = t->in->x + (size_t)(i * n_rows / n_eval) * (size_t)cols;
            double d = t->k->dot(x, wq, (long)cols);
            e += d * d;
        }
        t->row_err[r] = e;
    }
}

/* Squared output error of packed q against src on the kept rows of in; -1 when out of memory. */
static double output_error(const struct kwk_mat *src, const struct kwk_mat *q, const float *col,
                           const float *row, const struct kwk_calib_input *in,
                           struct kwk_pool *pool)
{
    int nth = pool ? kwk_pool_size(pool) : 1;
    struct err_task t = {.k = kwk_kernels(), .src = src, .q = q, .col = col, .row = row,
                         .in = in};
    atomic_init(&t.next, 0);
    t.row_err = kwk_malloc((size_t)src->rows * sizeof(double));
    t.scratch = kwk_malloc_aligned((size_t)nth * 2 * (size_t)src->cols * sizeof(float));
    double sum = -1.0;
    if (t.row_err && t.scratch) {
        if (pool)
            kwk_pool_run(pool, err_run, &t);
        else
            err_run(&t, 0, 1);
        sum = 0.0; /* rows in order: the same sum whatever the thread split */
        for (int64_t r = 0; r < src->rows; r++)
            sum += t.row_err[r];
    }
    kwk_free(t.row_err);
    kwk_free_aligned(t.scratch);
    return sum;
}

static int is_one(const float *s, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        if (s[j] != 1.0f)
            return 0;
    return 1;
}

/* Pack the n matrices src[i] -> dst[i] (row scales rows[i], NULL = none) that read one input
 * with column scales s; with gptq and scales that are not all 1, also without them, keeping
 * the closer variant (then s becomes all 1). */
static int pack_site(const struct kwk_mat *const *src, struct kwk_mat *const *dst,
                     const float *const *rows, int n, float *s,
                     const struct kwk_calib_input *in, const float *gram, int gptq,
                     struct kwk_pool *pool, struct kwk_err *err)
{
    int64_t dim = src[0]->cols;
    for (int i = 0; i < n; i++)
        if (pack_fitted(src[i], dst[i], s, rows[i], in, gram, gptq, pool, err))
            return err ? err->code : -1;
    if (!gptq || is_one(s, dim))
        return 0;
    struct kwk_mat alt[3];
    double e_awq = 0.0, e_alt = 0.0;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = 0;
        kwk_quant_bytes(dst[i]->wtype, dst[i]->rows, dst[i]->cols, &bytes);
        alt[i] = *dst[i];
        alt[i].data = kwk_malloc_aligned(bytes ? bytes : 64);
        if (!alt[i].data) {
            for (int j = 0; j < i; j++)
                kwk_free_aligned((void *)alt[j].data);
            return kwk_err_set(err, -ENOMEM, "out of memory fitting a %lld x %lld matrix",
                               (long long)dst[i]->rows, (long long)dst[i]->cols);
        }
    }
    for (int i = 0; i < n && !rc; i++) {
        rc = pack_fitted(src[i], &alt[i], NULL, rows[i], in, gram, 1, pool, err);
        double a = rc ? -1 : output_error(src[i], dst[i], s, rows[i], in, pool);
        double b = rc ? -1 : output_error(src[i], &alt[i], NULL, rows[i], in, pool);
        if (!rc && (a < 0 || b < 0))
            rc = kwk_err_set(err, -ENOMEM, "out of memory measuring a fit");
        e_awq += a;
        e_alt += b;
    }
    if (!rc && e_alt < e_awq) {
        for (int i = 0; i < n; i++) {
            size_t bytes = 0;
            kwk_quant_bytes(dst[i]->wtype, dst[i]->rows, dst[i]->cols, &bytes);
            memcpy((void *)dst[i]->data, alt[i].data, bytes);
        }
        for (int64_t j = 0; j < dim; j++)
            s[j] = 1.0f;
    }
    kwk_log(KWK_LOG_DEBUG, "calibration: gptq %s (output error %.4g vs %.4g without scales)",
            !rc && e_alt < e_awq ? "alone" : "with awq scales", e_awq, e_alt);
    for (int i = 0; i < n; i++)
        kwk_free_aligned((void *)alt[i].data);
    return rc;
}

/* The lm_head with AWQ scales (and GPTQ) against the output-normed states; the output norm's
 * weights divided by the scales into out_norm. s: scratch of d_model floats. */
static int fit_head(const struct kwk_model *m, const struct kwk_capture *cap,
                    const struct kwk_mat *src, struct kwk_mat *dst, float *s, float *out_norm,
                    int gptq, struct kwk_pool *pool, struct kwk_err *err)
{
    const struct kwk_calib_input *in = kwk_capture_input(cap, m->cfg.n_layers, 0);
    const struct kwk_mat *head[1] = {src};
    const int wt[1] = {dst->wtype};
    float alpha = 0.0f;
    int rc = low_bit(wt, 1, gptq) ? kwk_awq_scales(head, wt, 1, in, s, &alpha, pool, err) : 0;
    if (rc)
        return rc;
    if (!low_bit(wt, 1, gptq))
        kwk_awq_scales_at(in->absmean, (long)in->dim, 0.0f, s);
    if (forced_alpha(&alpha))
        kwk_awq_scales_at(in->absmean, (long)in->dim, alpha, s);
    kwk_log(KWK_LOG_DEBUG, "calibration: lm_head: alpha %.2f", (double)alpha);
    const float *no_rows[1] = {NULL};
    if ((rc = pack_site(head, &dst, no_rows, 1, s, in,
                        kwk_capture_gram(cap, m->cfg.n_layers, 0), gptq, pool, err)))
        return rc;
    for (int j = 0; j < m->cfg.d_model; j++)
        out_norm[j] = m->out_norm[j] / s[j];
    return 0;
}

/* ---- the pack ----------------------------------------------------------------------------------- */

/* The wider type int4 keeps some matrices in. */
static int mix_wtype(const struct kwk_model *m, int mix_bits)
{
    if (mix_bits == 0)
        mix_bits = m->n_params >= 1000000000 ? 6 : 8;
    return mix_bits == 8 ? KWK_W_Q8 : mix_bits == 6 ? KWK_W_Q6 : KWK_W_Q4;
}

int kwk_packed_panels_apply(const struct kwk_model *m)
{
    if (m->lm_head.wtype != KWK_W_BF16)
        return 0;
    for (int L = 0; L < m->cfg.n_layers; L++)
        for (int w = 0; w < 7; w++)
            if (layer_mat(&m->layers[L], w)->wtype != KWK_W_BF16)
                return 0;
    return 1;
}

/* Vectors calibration rewrites (norms, value bias), stored beside the blocks in the pack file
 * so that a cached pack needs no calibration run: a 1 x n float matrix each. */
enum { V_ATTN_NORM, V_FFN_NORM, V_BV, V_COUNT };

struct kwk_packed *kwk_packed_new(const struct kwk_model *m, int precision,
                                  const struct kwk_quant_opts *q,
                                  const struct kwk_packcache_opts *cache, struct kwk_pool *pool,
                                  struct kwk_err *err)
{
    struct kwk_quant_opts qo = {0};
    if (q)
        qo = *q;
    int panels = precision == KWK_PRECISION_PRESERVE;
    if (panels && (!kwk_packed_panels_apply(m) || qo.mix_bits || qo.n_calib || qo.gptq ||
                   qo.act8)) {
        kwk_err_set(err, KWK_EARG, "preserve packs panels of bf16 matrices only, as they are "
                    "(no mix_bits, calibration, gptq or act8)");
        return NULL;
    }
    if (panels && kwk_preserve_wtype(kwk_kernels()) == KWK_W_BF16) {
        kwk_err_set(err, KWK_EARG, "preserve has no packed form for the %s kernels (they read "
                    "the checkpoint's rows in place)", kwk_kernels()->name);
        return NULL;
    }
    if (!panels && precision != KWK_PRECISION_BALANCED && precision != KWK_PRECISION_INT4) {
        kwk_err_set(err, KWK_EARG, "precision %d has no packed form", precision);
        return NULL;
    }
    if (qo.mix_bits && (precision != KWK_PRECISION_INT4 ||
                        (qo.mix_bits != 4 && qo.mix_bits != 6 && qo.mix_bits != 8))) {
        kwk_err_set(err, KWK_EARG, "mix_bits %d: int4 takes 4, 6 or 8 (others take none)",
                    qo.mix_bits);
        return NULL;
    }
    if (qo.n_calib < 0 || (qo.n_calib > 0) != (qo.calib != NULL) ||
        qo.n_calib > KWK_CALIB_MAX_TOKENS) {
        kwk_err_set(err, KWK_EARG, "calibration: %lld token ids (at most %d)",
                    (long long)qo.n_calib, KWK_CALIB_MAX_TOKENS);
        return NULL;
    }
    if (qo.gptq && !qo.n_calib) {
        kwk_err_set(err, KWK_EARG, "gptq needs calibration token ids (calib)");
        return NULL;
    }
    if (qo.act8 != 0 && qo.act8 != 1) {
        kwk_err_set(err, KWK_EARG, "act8 %d: 0 or 1", qo.act8);
        return NULL;
    }
    double t0 = kwk_time_s();
    const char *label = panels ? "preserve" : precision == KWK_PRECISION_INT4 ? "int4" : "balanced";
    const struct kwk_config *c = &m->cfg;
    int n_layers = c->n_layers, n_mats = 7 * n_layers + 1;
    /* calibration's vectors: each layer's, then the output norm (at V_COUNT * n_layers) */
    int calib = qo.n_calib > 0, n_vecs = calib ? V_COUNT * n_layers + 1 : 0;
    int int4 = precision == KWK_PRECISION_INT4;
    unsigned keep8 = int4 ? keep8_mask(qo.mix_bits) : 0;
    int file_widths = int4 && keeps_file_widths(m, qo.mix_bits, keep8);
    int wide = panels                          ? kwk_preserve_wtype(kwk_kernels())
               : precision == KWK_PRECISION_INT4 ? mix_wtype(m, qo.mix_bits)
                                                 : KWK_W_Q8;
    struct pack_job *jobs = NULL;
    struct kwk_pack_entry *ents = NULL;
    struct kwk_mat *vec_src = NULL, *vec_dst = NULL;
    struct layer_fit fit;
    memset(&fit, 0, sizeof fit);
    float *fit_mem = NULL;
    int holds_floats = 0;
    struct kwk_capture *cap = NULL;
    struct kwk_packcache_opts opts = {0};
    struct kwk_packed *p = kwk_calloc(1, sizeof *p);
    if (!p)
        goto out_nomem;
    p->layers = kwk_calloc((size_t)n_layers, sizeof *p->layers);
    p->bufs = kwk_calloc((size_t)(n_mats + n_vecs), sizeof *p->bufs);
    jobs = kwk_calloc((size_t)n_mats, sizeof *jobs);
    ents = kwk_calloc((size_t)(n_mats + n_vecs), sizeof *ents);
    vec_src = kwk_calloc((size_t)n_vecs + 1, sizeof *vec_src);
    vec_dst = kwk_calloc((size_t)n_vecs + 1, sizeof *vec_dst);
    if (!p->layers || !p->bufs || !jobs || !ents || !vec_src || !vec_dst)
        goto out_nomem;
    /* First every matrix's target type and size, so the pack cache can key on exactly what is
     * packed; then storage: a mapped pack file, or blocks of our own. */
    int n_jobs = 0;
    for (int L = 0; L < n_layers; L++) {
        p->layers[L] = m->layers[L]; /* norms and biases: the model's, shared */
        for (int w = 0; w < 7; w++) {
            const struct kwk_mat *src = layer_mat(&m->layers[L], w);
            int wt = int4 ? int4_wtype(m, src, w, L, keep8, file_widths, wide) : wide;
            jobs[n_jobs++] = (struct pack_job){src, layer_mat(&p->layers[L], w), 0, NULL, 0};
            *jobs[n_jobs - 1].dst =
                (struct kwk_mat){.wtype = wt, .rows = 0, .cols = 0, .data = NULL};
        }
    }
    int wt_head = int4 ? int4_wtype(m, &m->lm_head, M_HEAD, 0, keep8, file_widths, wide) : wide;
    jobs[n_jobs++] = (struct pack_job){&m->lm_head, &p->lm_head, 0, NULL, 0};
    p->lm_head.wtype = wt_head;
    int grid_on = int4_grid_on(), gridded = 0;
    for (int i = 0; i < n_jobs && !calib; i++)
        gridded |= set_grid(m, &jobs[i], grid_on);
    for (int i = 0; i < n_jobs; i++) {
        struct kwk_mat *d = jobs[i].dst;
        d->rows = jobs[i].src->rows;
        d->cols = jobs[i].src->cols;
        if (packed_bytes(d->wtype, d->rows, d->cols, &ents[i].bytes)) {
            kwk_err_set(err, KWK_ELIMIT, "a %lld x %lld matrix is too large to pack",
                        (long long)d->rows, (long long)d->cols);
            goto out_err;
        }
        ents[i] = (struct kwk_pack_entry){jobs[i].src, d, ents[i].bytes};
    }
    int n_ents = n_jobs;
    for (int L = 0; L < n_layers && calib; L++) {
        const struct kwk_layer *l = &m->layers[L];
        const float *srcs[V_COUNT] = {l->attn_norm, l->ffn_norm, l->bv};
        const int64_t lens[V_COUNT] = {c->d_model, c->d_model, (int64_t)c->n_kv_heads * c->head_dim};
        for (int v = 0; v < V_COUNT; v++) {
            int i = L * V_COUNT + v;
            if (!srcs[v])
                continue; /* no value bias */
            vec_src[i] =
                (struct kwk_mat){.wtype = KWK_W_F32, .rows = 1, .cols = lens[v], .data = srcs[v]};
            vec_dst[i] =
                (struct kwk_mat){.wtype = KWK_W_F32, .rows = 1, .cols = lens[v], .data = NULL};
            ents[n_ents++] = (struct kwk_pack_entry){&vec_src[i], &vec_dst[i],
                                                     (size_t)lens[v] * sizeof(float)};
        }
    }
    if (calib) {
        int i = V_COUNT * n_layers;
        vec_src[i] = (struct kwk_mat){
            .wtype = KWK_W_F32, .rows = 1, .cols = c->d_model, .data = m->out_norm};
        vec_dst[i] =
            (struct kwk_mat){.wtype = KWK_W_F32, .rows = 1, .cols = c->d_model, .data = NULL};
        ents[n_ents++] = (struct kwk_pack_entry){&vec_src[i], &vec_dst[i],
                                                 (size_t)c->d_model * sizeof(float)};
    }
    if (cache)
        opts = *cache;
    opts.label = label;
    opts.sources = NULL; /* ours to make (and free) */
    opts.n_sources = 0;
    if (calib) {
        opts.salt ^= kwk_hash64(qo.calib, (size_t)qo.n_calib * sizeof(int32_t), 0xca11b);
        opts.salt ^= qo.gptq ? 0x6e7071ull : 0;
    }
    opts.salt ^= (uint64_t)keep8 * 0x9e3779b97f4a7c15ull; /* KWKER_INT4_KEEP8 changes types */
    opts.salt ^= gridded && !grid_on ? 0x67726964ull : 0; /* and KWKER_INT4_GRID blocks */
    if (opts.dir && opts.dir[0] && pack_sources(m, &opts))
        goto out_nomem;
    int cached = kwk_packcache_open(&opts, ents, n_ents, pool, &p->cache);
    /* a fitted pack cannot be checked by packing a matrix again without its calibration */
    for (int tries = 0; cached == KWK_PACKCACHE_HIT && !calib &&
                        !cached_blocks_match(m, jobs, n_jobs, pool); tries++) {
        kwk_log(KWK_LOG_WARN, "pack cache: %s: its blocks differ from what this build packs "
                "(a packing change without a KWK_PACK_FORMAT_VERSION bump?); packing again",
                kwk_packcache_path(p->cache));
        kwk_packcache_discard(p->cache);
        p->cache = NULL;
        cached = tries ? KWK_PACKCACHE_OFF
                       : kwk_packcache_open(&opts, ents, n_ents, pool, &p->cache);
    }
    for (int i = 0; i < n_ents; i++) {
        struct kwk_mat *d = ents[i].dst;
        if (cached == KWK_PACKCACHE_OFF) {
            void *data = kwk_malloc_aligned(ents[i].bytes ? ents[i].bytes : 64);
            if (!data)
                goto out_nomem;
            p->bufs[p->n_bufs++] = data;
            d->data = data;
        }
        if (i < n_jobs) {
            p->n_weights += d->rows * d->cols;
            p->n_bytes += ents[i].bytes;
        }
    }
    if (cached != KWK_PACKCACHE_HIT) {
        if (calib) {
            /* fitting reads every layer's float matrices beside its activations */
            if (kwk_model_floats_acquire(m, err))
                goto out_err;
            holds_floats = 1;
            if (kwk_calib_capture(m, qo.calib, qo.n_calib, qo.n_threads, qo.gptq, &cap, err))
                goto out_err;
            size_t per = (size_t)(2 * c->d_model + (int64_t)c->n_heads * c->head_dim +
                                  2 * (int64_t)c->d_ff + (int64_t)c->n_kv_heads * c->head_dim);
            fit_mem = kwk_malloc(per * sizeof(float));
            if (!fit_mem)
                goto out_nomem;
        }
        char what[64];
        snprintf(what, sizeof what, "%s%s %s", calib ? "fitting " : "packing ",
                 calib ? (qo.gptq ? "(awq + gptq)" : "(awq)") : "", label);
        struct kwk_progress bar;
        kwk_progress_init(&bar, what);
        for (int i = 0; i < n_jobs; i += 7) {
            int L = i / 7;
            if (!calib) {
                if (run_jobs_lazy(m, jobs + i, KWK_MIN(7, n_jobs - i), pool, err))
                    goto out_err;
            } else if (L == n_layers) {
                /* the lm_head: its scales fold into the output norm (the packed head is a
                 * copy: tied embeddings are still looked up unscaled in the model's table) */
                if (fit_head(m, cap, jobs[i].src, jobs[i].dst, fit_mem,
                             (float *)vec_dst[V_COUNT * n_layers].data, qo.gptq, pool, err))
                    goto out_err;
            } else {
                struct layer_fit *f = &fit;
                float *at = fit_mem; /* one layer's scales at a time */
                f->s[KWK_SITE_QKV] = at, at += c->d_model;
                f->s[KWK_SITE_O] = at, at += c->n_heads * c->head_dim;
                f->s[KWK_SITE_GU] = at, at += c->d_model;
                f->s[KWK_SITE_DOWN] = at, at += c->d_ff;
                f->v_row = at, at += c->n_kv_heads * c->head_dim;
                f->up_row = at;
                if (fit_layer(m, cap, L, &p->layers[L], f, qo.gptq, pool, err))
                    goto out_err;
                /* o and down first: their final scales set the value and up rows' */
                const struct pack_job *jb = jobs + i;
                const float *none[3] = {NULL, NULL, NULL};
                const struct kwk_mat *s_o[1] = {jb[M_O].src}, *s_dn[1] = {jb[M_DOWN].src};
                struct kwk_mat *d_o[1] = {jb[M_O].dst}, *d_dn[1] = {jb[M_DOWN].dst};
                if (pack_site(s_o, d_o, none, 1, f->s[KWK_SITE_O],
                              kwk_capture_input(cap, L, KWK_SITE_O),
                              kwk_capture_gram(cap, L, KWK_SITE_O), qo.gptq, pool, err) ||
                    pack_site(s_dn, d_dn, none, 1, f->s[KWK_SITE_DOWN],
                              kwk_capture_input(cap, L, KWK_SITE_DOWN),
                              kwk_capture_gram(cap, L, KWK_SITE_DOWN), qo.gptq, pool, err))
                    goto out_err;
                rows_of_scales(c, f);
                const struct kwk_mat *s_qkv[3] = {jb[M_Q].src, jb[M_K].src, jb[M_V].src};
                struct kwk_mat *d_qkv[3] = {jb[M_Q].dst, jb[M_K].dst, jb[M_V].dst};
                const float *r_qkv[3] = {NULL, NULL, f->v_row};
                const struct kwk_mat *s_gu[2] = {jb[M_GATE].src, jb[M_UP].src};
                struct kwk_mat *d_gu[2] = {jb[M_GATE].dst, jb[M_UP].dst};
                const float *r_gu[2] = {NULL, f->up_row};
                if (pack_site(s_qkv, d_qkv, r_qkv, 3, f->s[KWK_SITE_QKV],
                              kwk_capture_input(cap, L, KWK_SITE_QKV),
                              kwk_capture_gram(cap, L, KWK_SITE_QKV), qo.gptq, pool, err) ||
                    pack_site(s_gu, d_gu, r_gu, 2, f->s[KWK_SITE_GU],
                              kwk_capture_input(cap, L, KWK_SITE_GU),
                              kwk_capture_gram(cap, L, KWK_SITE_GU), qo.gptq, pool, err))
                    goto out_err;
                /* what wrote the scaled inputs now writes them divided by s */
                const struct kwk_layer *l = &m->layers[L];
                float *an = (float *)vec_dst[L * V_COUNT + V_ATTN_NORM].data;
                float *fn = (float *)vec_dst[L * V_COUNT + V_FFN_NORM].data;
                for (int j = 0; j < c->d_model; j++) {
                    an[j] = l->attn_norm[j] / f->s[KWK_SITE_QKV][j];
                    fn[j] = l->ffn_norm[j] / f->s[KWK_SITE_GU][j];
                }
                if (l->bv) {
                    float *bv = (float *)vec_dst[L * V_COUNT + V_BV].data;
                    for (int r = 0; r < c->n_kv_heads * c->head_dim; r++)
                        bv[r] = l->bv[r] * f->v_row[r];
                }
            }
            kwk_progress_update(&bar, KWK_MIN(i + 7, n_jobs), n_jobs);
        }
        kwk_progress_end(&bar);
        kwk_packcache_commit(p->cache, pool);
    }
    /* After packing or mapping: the activations' width is how the kernels read the blocks,
     * not what the blocks hold (nor what the fitting measured); and where a generated token's
     * prefetches go, from the bytes a token reads (kwk_cpu_prefetch_l2_for) */
    int prefetch = kwk_cpu_prefetch_l2_for((double)p->n_bytes) ? 2 : 1;
    for (int i = 0; i < n_jobs; i++) {
        jobs[i].dst->act8 = qo.act8;
        jobs[i].dst->prefetch = prefetch;
    }
    p->out_norm = calib ? (const float *)vec_dst[V_COUNT * n_layers].data : m->out_norm;
    for (int L = 0; L < n_layers && calib; L++) {
        p->layers[L].attn_norm = (float *)vec_dst[L * V_COUNT + V_ATTN_NORM].data;
        p->layers[L].ffn_norm = (float *)vec_dst[L * V_COUNT + V_FFN_NORM].data;
        if (m->layers[L].bv)
            p->layers[L].bv = (float *)vec_dst[L * V_COUNT + V_BV].data;
    }
    kwk_log(KWK_LOG_INFO,
            "%s %s: %lld weights in %.1f MB, %.3f bits per weight, %d-bit activations, "
            "decode prefetch to %s, %.2f s",
            cached == KWK_PACKCACHE_HIT ? "mapped packed" : "packed", label,
            (long long)p->n_weights, (double)p->n_bytes / 1e6,
            8.0 * (double)p->n_bytes / (double)p->n_weights, panels ? 32 : qo.act8 ? 8 : 16,
            prefetch == 2 ? "L2" : "L1", kwk_time_s() - t0);
    goto out;
out_nomem:
    kwk_err_set(err, -ENOMEM, "out of memory packing the model");
out_err:
    kwk_packed_free(p);
    p = NULL;
out:
    if (holds_floats)
        kwk_model_floats_release(m);
    kwk_capture_free(cap);
    kwk_free(fit_mem);
    kwk_free(vec_src);
    kwk_free(vec_dst);
    kwk_free(jobs);
    kwk_free(ents);
    kwk_free((void *)opts.sources);
    return p;
}

void kwk_packed_free(struct kwk_packed *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_bufs; i++)
        kwk_free_aligned(p->bufs[i]);
    kwk_packcache_free(p->cache);
    kwk_free(p->bufs);
    kwk_free(p->layers);
    kwk_free(p);
}

const struct kwk_layer *kwk_packed_layers(const struct kwk_packed *p)
{
    return p->layers;
}

double kwk_packed_bits_per_weight(const struct kwk_packed *p)
{
    return p->n_weights ? 8.0 * (double)p->n_bytes / (double)p->n_weights : 0.0;
}

size_t kwk_packed_bytes(const struct kwk_packed *p)
{
    return p->n_bytes;
}

const float *kwk_packed_out_norm(const struct kwk_packed *p)
{
    return p->out_norm;
}

const struct kwk_mat *kwk_packed_lm_head(const struct kwk_packed *p)
{
    return &p->lm_head;
}
