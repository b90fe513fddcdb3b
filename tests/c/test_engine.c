/* test_engine.c - the serving engine on an in-memory random model: every request gets exactly the
 * tokens kwk_generate gives it alone (greedy and seeded sampling, more requests than slots,
 * prompts sharing a prefix), requests submitted from several threads while the engine's own
 * thread steps, cancellation, freeing an engine with requests in flight, bad submissions, and
 * requests in flight sharing a prompt (read once, copied to the others: the n choices of one
 * prompt), act_bits (8-bit activations on balanced / int4: the same tokens alone and batched; bad values
 * refused), and bf16 weights under preserve (on AMX-BF16 too: ctest test_engine_amx_preserve).
 * Main thread plus the submitter threads it starts. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test.h"

#define N_LAYERS 2
#define D_MODEL 64
#define N_HEADS 4
#define N_KV 2
#define HEAD_DIM 16
#define D_FF 96
#define N_VOCAB 97
#define MAX_NEW 12
#define N_REQ 10

struct tmodel {
    struct kwk_model m;
    struct kwk_layer layers[N_LAYERS];
    float *bufs[64];
    int n_bufs;
};

static uint64_t rng_state;
static float rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 24)) - 0.5f;
}

static float *buf(struct tmodel *t, size_t n, float base, float scale)
{
    float *w = malloc(sizeof(float) * n);
    for (size_t k = 0; k < n; k++)
        w[k] = base + scale * rnd();
    t->bufs[t->n_bufs++] = w;
    return w;
}

static int bf16_mats; /* mat() makes bf16 matrices, as a bf16 checkpoint holds */

static struct kwk_mat mat(struct tmodel *t, int64_t rows, int64_t cols)
{
    float *w = buf(t, (size_t)(rows * cols), 0, 0.5f);
    if (bf16_mats) { /* the floats' high halves, in place */
        uint16_t *h = (uint16_t *)(void *)w;
        for (int64_t i = 0; i < rows * cols; i++) {
            uint32_t u;
            memcpy(&u, &w[i], 4);
            h[i] = (uint16_t)(u >> 16);
        }
    }
    return (struct kwk_mat){
        .wtype = bf16_mats ? KWK_W_BF16 : KWK_W_F32, .rows = rows, .cols = cols, .data = w};
}

static void model_init(struct tmodel *t)
{
    memset(t, 0, sizeof *t);
    rng_state = 42;
    struct kwk_config *c = &t->m.cfg;
    c->n_vocab = N_VOCAB;
    c->n_layers = N_LAYERS;
    c->d_model = D_MODEL;
    c->n_heads = N_HEADS;
    c->n_kv_heads = N_KV;
    c->head_dim = HEAD_DIM;
    c->d_ff = D_FF;
    c->max_position = 256;
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->bos_id = -1;
    t->m.layers = t->layers;
    for (int L = 0; L < N_LAYERS; L++) {
        struct kwk_layer *l = &t->layers[L];
        l->attn_norm = buf(t, D_MODEL, 1, 0.1f);
        l->ffn_norm = buf(t, D_MODEL, 1, 0.1f);
        l->wq = mat(t, N_HEADS * HEAD_DIM, D_MODEL);
        l->wk = mat(t, N_KV * HEAD_DIM, D_MODEL);
        l->wv = mat(t, N_KV * HEAD_DIM, D_MODEL);
        l->wo = mat(t, D_MODEL, N_HEADS * HEAD_DIM);
        l->w_gate = mat(t, D_FF, D_MODEL);
        l->w_up = mat(t, D_FF, D_MODEL);
        l->w_down = mat(t, D_MODEL, D_FF);
    }
    t->m.tok_emb = mat(t, N_VOCAB, D_MODEL);
    t->m.lm_head = mat(t, N_VOCAB, D_MODEL);
    t->m.out_norm = buf(t, D_MODEL, 1, 0.1f);
}

static void model_free(struct tmodel *t)
{
    for (int i = 0; i < t->n_bufs; i++)
        free(t->bufs[i]);
}

/* ---- what each request received ------------------------------------------------------------ */

struct got {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[N_REQ][MAX_NEW + 8];
    int n[N_REQ];
    int done[N_REQ];
    int finish[N_REQ];
    int status[N_REQ];
    int reused[N_REQ];
    int n_done;
    int events_after_done;
};

struct tag {
    struct got *g;
    int i;
};

static void on_event(void *user, const struct kwk_event *ev)
{
    struct tag *t = user;
    struct got *g = t->g;
    pthread_mutex_lock(&g->mu);
    if (g->done[t->i])
        g->events_after_done++;
    if (ev->type == KWK_EVENT_TOKEN && g->n[t->i] < MAX_NEW + 8) {
        g->tokens[t->i][g->n[t->i]++] = ev->token;
    } else if (ev->type == KWK_EVENT_DONE) {
        g->done[t->i] = 1;
        g->finish[t->i] = ev->finish_reason;
        g->status[t->i] = ev->status;
        g->reused[t->i] = ev->prompt_reused;
        g->n_done++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

static void got_init(struct got *g)
{
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static void got_wait(struct got *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->n_done < n)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* ---- the requests --------------------------------------------------------------------------- */

static int32_t prompts[N_REQ][40];
static int prompt_len[N_REQ];
static int32_t alone[N_REQ][MAX_NEW];
static int alone_n[N_REQ];

static void make_prompts(void)
{
    uint64_t s = 7;
    for (int i = 0; i < N_REQ; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt_len[i] = 3 + (int)((s >> 33) % 30);
        for (int j = 0; j < prompt_len[i]; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            prompts[i][j] = (int32_t)((s >> 33) % N_VOCAB);
        }
    }
    /* requests 6..9 share request 5's first 20 tokens (a "system prompt") */
    prompt_len[5] = 24;
    for (int i = 6; i < N_REQ; i++) {
        memcpy(prompts[i], prompts[5], sizeof(int32_t) * 20);
        prompt_len[i] = 20 + i - 4;
    }
    /* request 0 repeats itself, so lookup finds candidates */
    for (int j = 10; j < 30; j++)
        prompts[0][j] = prompts[0][j - 10];
    prompt_len[0] = 30;
}

static void gen_params(struct kwk_gen_params *p, int i, int sample)
{
    kwk_gen_params_init(p);
    p->max_new_tokens = MAX_NEW;
    if (sample) {
        p->sampling.do_sample = 1;
        p->sampling.temperature = 1.5;
        p->sampling.top_k = 20;
        p->sampling.seed = 1000 + (uint64_t)i;
    }
}

/* The reference: each request alone on a fresh single-sequence decoder of that precision and
 * act_bits. */
static void run_alone(const kwk_model *m, int sample, int precision, int act_bits)
{
    struct kwk_decoder_params dp;
    kwk_decoder_params_init(&dp);
    dp.precision = precision;
    dp.act_bits = act_bits;
    for (int i = 0; i < N_REQ; i++) {
        kwk_decoder *d = kwk_decoder_new(m, &dp, NULL);
        T_EQ(d != NULL, 1);
        if (!d)
            return;
        struct kwk_gen_params p;
        gen_params(&p, i, sample);
        struct kwk_gen_output o = {.tokens = alone[i], .cap = MAX_NEW};
        T_EQ(kwk_generate(d, prompts[i], prompt_len[i], &p, &o, NULL), 0);
        alone_n[i] = o.n_tokens;
        kwk_decoder_free(d);
    }
}

static void expect_alone(struct got *g, const char *what)
{
    for (int i = 0; i < N_REQ; i++) {
        T_EQ(g->done[i], 1);
        T_EQ(g->status[i], 0);
        T_EQ(g->finish[i], KWK_FINISH_LENGTH);
        T_EQ(g->n[i], alone_n[i]);
        int same = g->n[i] == alone_n[i] &&
                   memcmp(g->tokens[i], alone[i], sizeof(int32_t) * (size_t)alone_n[i]) == 0;
        if (!same)
            fprintf(stderr, "  %s: request %d differs from its run alone\n", what, i);
        T_EQ(same, 1);
    }
    T_EQ(g->events_after_done, 0);
}

/* Stepped on this thread, 3 slots for 10 requests: queueing, chunked prompts, prefix reuse.
 * The engine's decoder gets precision and act_bits from its parameters (8-bit activations keep
 * batch invariance: each token's are scaled on their own). */
static void test_stepped(const kwk_model *m, int sample, int precision, int act_bits)
{
    run_alone(m, sample, precision, act_bits);
    struct kwk_engine_params ep;
    kwk_engine_params_init(&ep);
    ep.precision = precision;
    ep.act_bits = act_bits;
    ep.max_batch = 3;
    ep.prefill_chunk = 16; /* prompts take several steps, interleaved with decoding */
    ep.max_cache_len = 128;
    struct kwk_err err = {0};
    kwk_engine *e = kwk_engine_new(m, &ep, &err);
    T_EQ(e != NULL, 1);
    if (!e)
        return;
    static struct got g;
    got_init(&g);
    struct tag tags[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        struct kwk_gen_params p;
        gen_params(&p, i, sample);
        tags[i] = (struct tag){&g, i};
        T_EQ(kwk_engine_submit(e, prompts[i], prompt_len[i], &p, on_event, &tags[i], &err) > 0,
             1);
    }
    int guard = 0;
    while (kwk_engine_step(e) > 0 && guard < 10000)
        guard++;
    expect_alone(&g, sample ? "stepped, sampled" : "stepped, greedy");
    /* requests 6..9 were admitted while 5 (same first 20 tokens) was in a slot or had been */
    int reused = 0;
    for (int i = 6; i < N_REQ; i++)
        reused += g.reused[i] >= 19;
    T_EQ(reused >= 3, 1);
    /* prompt_cache = 0: the same prompt again is read in full */
    struct kwk_gen_params p;
    gen_params(&p, 5, sample);
    p.prompt_cache = 0;
    g.done[5] = 0;
    g.n[5] = 0;
    T_EQ(kwk_engine_submit(e, prompts[5], prompt_len[5], &p, on_event, &tags[5], &err) > 0, 1);
    while (kwk_engine_step(e) > 0)
        ;
    T_EQ(g.done[5], 1);
    T_EQ(g.reused[5], 0);
    T_EQ(g.n[5], alone_n[5]);
    T_EQ(memcmp(g.tokens[5], alone[5], sizeof(int32_t) * (size_t)alone_n[5]), 0);
    struct kwk_engine_stats st;
    kwk_engine_get_stats(e, &st);
    T_EQ((int)st.completed, N_REQ + 1);
    T_EQ(st.running + st.queued, 0);
    T_EQ((int)st.generated_tokens, (N_REQ + 1) * MAX_NEW);
    kwk_engine_free(e);
}

/* Several threads submit while the engine's own thread steps. */
struct submitter {
    kwk_engine *e;
    struct got *g;
    struct tag tags[N_REQ];
    int first, step;
};

static void *submit_main(void *arg)
{
    struct submitter *s = arg;
    for (int i = s->first; i < N_REQ; i += s->step) {
        struct kwk_gen_params p;
        gen_params(&p, i, 1);
        s->tags[i] = (struct tag){s->g, i};
        if (kwk_engine_submit(s->e, prompts[i], prompt_len[i], &p, on_event, &s->tags[i], NULL) ==
            0)
            return (void *)1;
    }
    return NULL;
}

static void test_threads(const kwk_model *m)
{
    run_alone(m, 1, KWK_PRECISION_PRESERVE, 0);
    struct kwk_engine_params ep;
    kwk_engine_params_init(&ep);
    ep.max_batch = 4;
    ep.max_cache_len = 96;
    kwk_engine *e = kwk_engine_new(m, &ep, NULL);
    T_EQ(e != NULL, 1);
    if (!e)
        return;
    T_EQ(kwk_engine_start(e, NULL), 0);
    T_EQ(kwk_engine_start(e, NULL) < 0, 1); /* already running */
    static struct got g;
    got_init(&g);
    struct submitter subs[3];
    pthread_t th[3];
    for (int t = 0; t < 3; t++) {
        subs[t] = (struct submitter){.e = e, .g = &g, .first = t, .step = 3};
        pthread_create(&th[t], NULL, submit_main, &subs[t]);
    }
    for (int t = 0; t < 3; t++) {
        void *rv;
        pthread_join(th[t], &rv);
        T_EQ(rv == NULL, 1);
    }
    got_wait(&g, N_REQ);
    kwk_engine_stop(e);
    expect_alone(&g, "threads");
    kwk_engine_free(e);
}

/* Cancel one running and one queued request; free the engine with others in flight. */
static void test_cancel_and_free(const kwk_model *m)
{
    struct kwk_engine_params ep;
    kwk_engine_params_init(&ep);
    ep.max_batch = 1;
    ep.max_cache_len = 128;
    kwk_engine *e = kwk_engine_new(m, &ep, NULL);
    T_EQ(e != NULL, 1);
    if (!e)
        return;
    static struct got g;
    got_init(&g);
    struct tag tags[4];
    uint64_t ids[4];
    struct kwk_gen_params p;
    gen_params(&p, 0, 0);
    p.max_new_tokens = 60;
    for (int i = 0; i < 4; i++) {
        tags[i] = (struct tag){&g, i};
        ids[i] = kwk_engine_submit(e, prompts[i], prompt_len[i], &p, on_event, &tags[i], NULL);
        T_EQ(ids[i] > 0, 1);
    }
    for (int s = 0; s < 3; s++)
        kwk_engine_step(e); /* request 0 runs; 1..3 wait for the one slot */
    T_EQ(g.n[0] > 0, 1);
    T_EQ(kwk_engine_cancel(e, ids[0]), 0);
    T_EQ(kwk_engine_cancel(e, ids[2]), 0);
    T_EQ(kwk_engine_cancel(e, 999999), KWK_ENOTFOUND);
    T_EQ(kwk_engine_cancel(NULL, ids[0]), KWK_EARG);
    kwk_engine_step(e);
    T_EQ(g.done[0], 1);
    T_EQ(g.finish[0], KWK_FINISH_CANCELED);
    T_EQ(g.n[0] < 60, 1);
    T_EQ(g.done[2], 1);
    T_EQ(g.finish[2], KWK_FINISH_CANCELED);
    T_EQ(g.n[2], 0);
    T_EQ(kwk_engine_cancel(e, ids[0]), KWK_ENOTFOUND); /* already done */
    kwk_engine_step(e);
    T_EQ(g.n[1] > 0, 1); /* request 1 took the freed slot */
    kwk_engine_free(e); /* 1 running, 3 queued: both end CANCELED */
    T_EQ(g.done[1] && g.done[3], 1);
    T_EQ(g.finish[1], KWK_FINISH_CANCELED);
    T_EQ(g.finish[3], KWK_FINISH_CANCELED);
    T_EQ(g.n_done, 4);
    T_EQ(g.events_after_done, 0);
}

/* Requests in flight that share a prompt prefix: the later ones wait for the first to read it
 * and copy it (kv copy), so the prefix is read once. shared[i] has the length of prompt i; the
 * engine's one-step delay must not change a token. */
#define N_SHARE 6
static int32_t shared[40];
static const int share_len[N_SHARE] = {36, 36, 36, 20, 30, 36};

static uint64_t submit_shared(kwk_engine *e, struct tag *tags, struct got *g, int i)
{
    struct kwk_gen_params p;
    gen_params(&p, 100 + i, 1); /* each its own seed: the n choices of one prompt */
    tags[i] = (struct tag){g, i};
    return kwk_engine_submit(e, shared, share_len[i], &p, on_event, &tags[i], NULL);
}

static void expect_shared_alone(const kwk_model *m, struct got *g, int i, const char *what)
{
    kwk_decoder *d = kwk_decoder_new(m, NULL, NULL);
    T_EQ(d != NULL, 1);
    if (!d)
        return;
    int32_t want[MAX_NEW];
    struct kwk_gen_params p;
    gen_params(&p, 100 + i, 1);
    struct kwk_gen_output o = {.tokens = want, .cap = MAX_NEW};
    T_EQ(kwk_generate(d, shared, share_len[i], &p, &o, NULL), 0);
    kwk_decoder_free(d);
    T_EQ(g->done[i], 1);
    T_EQ(g->status[i], 0);
    int same = g->n[i] == o.n_tokens &&
               !memcmp(g->tokens[i], want, sizeof(int32_t) * (size_t)o.n_tokens);
    if (!same)
        fprintf(stderr, "  %s: request %d differs from its run alone\n", what, i);
    T_EQ(same, 1);
}

/* A fresh engine running requests [first, last) of the shared prompts to the end; its stats. */
static void run_shared(const kwk_model *m, const struct kwk_engine_params *ep, struct got *g,
                       struct tag *tags, int first, int last, struct kwk_engine_stats *st)
{
    kwk_engine *e = kwk_engine_new(m, ep, NULL);
    T_EQ(e != NULL, 1);
    if (!e)
        return;
    got_init(g);
    for (int i = first; i < last; i++)
        T_EQ(submit_shared(e, tags, g, i) > 0, 1);
    while (kwk_engine_step(e) > 0)
        ;
    kwk_engine_get_stats(e, st);
    kwk_engine_free(e);
}

static void test_shared_prompt(const kwk_model *m)
{
    for (int j = 0; j < 40; j++)
        shared[j] = (int32_t)((j * 37 + 11) % N_VOCAB);
    struct kwk_engine_params ep;
    kwk_engine_params_init(&ep);
    ep.max_batch = 6;
    ep.prefill_chunk = 16; /* the 36-token prompt takes three steps */
    ep.max_cache_len = 96;
    static struct got g;
    struct tag tags[N_SHARE];
    struct kwk_engine_stats st = {0};
    /* three choices of one prompt: read once, copied twice */
    run_shared(m, &ep, &g, tags, 0, 3, &st);
    T_EQ((int)st.prompt_tokens, 36 + 1 + 1); /* each copy reads the last token again */
    T_EQ(g.reused[0], 0);
    T_EQ(g.reused[1], 35);
    T_EQ(g.reused[2], 35);
    for (int i = 0; i < 3; i++)
        expect_shared_alone(m, &g, i, "shared prompt");

    /* a chain: 4 reads 20 tokens, 5 waits on it for 20 of its 30, 6 waits on 5 for 30 of 36 */
    run_shared(m, &ep, &g, tags, 3, 6, &st);
    T_EQ((int)st.prompt_tokens, 20 + 10 + 6);
    T_EQ(g.reused[4], 20);
    T_EQ(g.reused[5], 30);
    for (int i = 3; i < 6; i++)
        expect_shared_alone(m, &g, i, "chained shared prompt");

    /* the reader canceled after its first chunk: the waiting request copies those 16 positions
     * and reads the rest itself */
    kwk_engine *e = kwk_engine_new(m, &ep, NULL);
    T_EQ(e != NULL, 1);
    if (!e)
        return;
    got_init(&g);
    uint64_t first = submit_shared(e, tags, &g, 0);
    T_EQ(first > 0 && submit_shared(e, tags, &g, 1) > 0, 1);
    kwk_engine_step(e);
    T_EQ(kwk_engine_cancel(e, first), 0);
    while (kwk_engine_step(e) > 0)
        ;
    T_EQ(g.finish[0], KWK_FINISH_CANCELED);
    T_EQ(g.reused[1], 16);
    kwk_engine_get_stats(e, &st);
    T_EQ((int)st.prompt_tokens, 16 + 20);
    expect_shared_alone(m, &g, 1, "shared prompt, reader canceled");
    kwk_engine_free(e);

    /* a request that reuses nothing (prompt_cache 0) takes the least recently used slot, not
     * the one holding a prefix of its prompt, which stays for the next request that reuses */
    ep.max_batch = 2;
    e = kwk_engine_new(m, &ep, NULL);
    T_EQ(e != NULL, 1);
    if (!e)
        return;
    got_init(&g);
    T_EQ(submit_shared(e, tags, &g, 0) > 0, 1); /* 36 tokens into one slot */
    while (kwk_engine_step(e) > 0)
        ;
    struct kwk_gen_params p;
    gen_params(&p, 0, 0);
    p.prompt_cache = 0;
    int32_t other[36];
    memcpy(other, shared, sizeof other);
    other[20] = (other[20] + 1) % N_VOCAB; /* the same first 20 tokens, then its own */
    tags[1] = (struct tag){&g, 1};
    T_EQ(kwk_engine_submit(e, other, 36, &p, on_event, &tags[1], NULL) > 0, 1);
    while (kwk_engine_step(e) > 0)
        ;
    T_EQ(g.reused[1], 0);
    g.done[0] = 0, g.n[0] = 0;
    T_EQ(submit_shared(e, tags, &g, 0) > 0, 1);
    while (kwk_engine_step(e) > 0)
        ;
    T_EQ(g.reused[0], 35); /* the first slot still held all of it */
    kwk_engine_free(e);
}

/* act_bits reaches the engine's decoder: only 0, 8 and 16, and 8 only for quantized weights. */
static void test_bad_act_bits(const kwk_model *m)
{
    static const int bad[] = {1, 4, 7, 12, 32, -8};
    struct kwk_engine_params ep;
    struct kwk_err err = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kwk_engine_params_init(&ep);
        ep.precision = KWK_PRECISION_INT4;
        ep.act_bits = bad[i];
        memset(&err, 0, sizeof err);
        kwk_engine *e = kwk_engine_new(m, &ep, &err);
        T_EQ(e == NULL, 1);
        kwk_engine_free(e);
        T_EQ(err.code, KWK_EARG);
        char want[32];
        snprintf(want, sizeof want, "act_bits %d", bad[i]);
        T_CONTAINS(err.msg, want);
    }
    kwk_engine_params_init(&ep);
    ep.act_bits = 8; /* preserve */
    memset(&err, 0, sizeof err);
    kwk_engine *e = kwk_engine_new(m, &ep, &err);
    T_EQ(e == NULL, 1);
    kwk_engine_free(e);
    T_EQ(err.code, KWK_EARG);
    T_CONTAINS(err.msg, "act_bits 8 applies to balanced and int4");
    ep.act_bits = 16; /* preserve's float32 math, spelled as the default */
    e = kwk_engine_new(m, &ep, &err);
    T_EQ(e != NULL, 1);
    kwk_engine_free(e);
}

static void test_bad_submissions(const kwk_model *m)
{
    struct kwk_engine_params ep;
    kwk_engine_params_init(&ep);
    ep.max_batch = 2;
    ep.max_cache_len = 32;
    ep.max_queue = 2;
    struct kwk_err err = {0};
    kwk_engine *e = kwk_engine_new(m, &ep, &err);
    T_EQ(e != NULL, 1);
    if (!e)
        return;
    static struct got g;
    got_init(&g);
    struct tag tag = {&g, 0};
    struct kwk_gen_params p;
    gen_params(&p, 0, 0);
    int32_t ids[40] = {0};
    p.max_new_tokens = 8;
    T_EQ(kwk_engine_submit(e, ids, 30, &p, on_event, &tag, &err), 0); /* 30 + 8 > 32 */
    T_EQ(err.code, KWK_ELIMIT);
    ids[3] = N_VOCAB;
    T_EQ(kwk_engine_submit(e, ids, 5, &p, on_event, &tag, &err), 0);
    T_EQ(err.code, KWK_ERANGE);
    ids[3] = 1;
    T_EQ(kwk_engine_submit(e, ids, 0, &p, on_event, &tag, &err), 0);
    T_EQ(err.code, KWK_EARG);
    p.sampling.top_p = 2.0;
    T_EQ(kwk_engine_submit(e, ids, 5, &p, on_event, &tag, &err), 0);
    T_EQ(err.code, KWK_EARG);
    p.sampling.top_p = 1.0;
    p.draft = (kwk_decoder *)&tag; /* never dereferenced: refused first */
    T_EQ(kwk_engine_submit(e, ids, 5, &p, on_event, &tag, &err), 0);
    T_EQ(err.code, KWK_EARG);
    p.draft = NULL;
    /* prompt logprobs are the engine's: kwk_generate says so */
    kwk_decoder *d = kwk_decoder_new(m, NULL, NULL);
    int32_t out_ids[8];
    struct kwk_gen_output o = {.tokens = out_ids, .cap = 8};
    p.prompt_logprobs = 1;
    T_EQ(kwk_generate(d, ids, 5, &p, &o, &err), KWK_EUNSUPPORTED);
    T_CONTAINS(err.msg, "serving engine");
    p.prompt_logprobs = 0;
    kwk_decoder_free(d);
    T_EQ(kwk_engine_submit(e, ids, 5, &p, on_event, &tag, &err) > 0, 1);
    T_EQ(kwk_engine_submit(e, ids, 5, &p, on_event, &tag, &err) > 0, 1);
    T_EQ(kwk_engine_submit(e, ids, 5, &p, on_event, &tag, &err), 0); /* queue of 2 is full */
    T_EQ(err.code, KWK_ELIMIT);
    /* max_new_tokens 0: done after the prompt, no token */
    kwk_engine_free(e);
    e = kwk_engine_new(m, &ep, &err);
    got_init(&g);
    p.max_new_tokens = 0;
    T_EQ(kwk_engine_submit(e, ids, 5, &p, on_event, &tag, &err) > 0, 1);
    while (kwk_engine_step(e) > 0)
        ;
    T_EQ(g.done[0], 1);
    T_EQ(g.finish[0], KWK_FINISH_LENGTH);
    T_EQ(g.n[0], 0);
    kwk_engine_free(e);
}

int main(void)
{
    static struct tmodel t;
    model_init(&t);
    make_prompts();
    test_stepped(&t.m, 0, KWK_PRECISION_PRESERVE, 0);
    test_stepped(&t.m, 1, KWK_PRECISION_PRESERVE, 0);
    test_stepped(&t.m, 0, KWK_PRECISION_BALANCED, 8);
    test_stepped(&t.m, 1, KWK_PRECISION_INT4, 8);
    test_bad_act_bits(&t.m);
    test_threads(&t.m);
    test_cancel_and_free(&t.m);
    test_shared_prompt(&t.m);
    test_bad_submissions(&t.m);
    model_free(&t);
    /* bf16 weights, multiplied where they lie by preserve: on AMX-BF16 with KWKER_AMX_PRESERVE=on
     * (ctest test_engine_amx_preserve) a one-token step takes the vector engine and a batched
     * step the tiles, which must give the same bits, hence the same tokens */
    static struct tmodel tb;
    bf16_mats = 1;
    model_init(&tb);
    test_stepped(&tb.m, 0, KWK_PRECISION_PRESERVE, 0);
    test_stepped(&tb.m, 1, KWK_PRECISION_PRESERVE, 0);
    model_free(&tb);
    return t_report("engine");
}
