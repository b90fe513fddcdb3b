/* engine.c - the serving engine's public API: creating the engine and its KV slots, taking
 * requests from any thread (deep copies into a locked queue), cancellation, statistics, the
 * engine's own stepping thread, and the end of a request (its DONE event). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"

#define DEFAULT_MAX_BATCH 8
#define DEFAULT_PREFILL_CHUNK 256
#define DEFAULT_MAX_QUEUE 4096

void kwk_engine_params_init(struct kwk_engine_params *p)
{
    memset(p, 0, sizeof *p);
    p->precision = KWK_PRECISION_PRESERVE;
}

double kwk_engine_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

kwk_engine *kwk_engine_new(const kwk_model *m, const struct kwk_engine_params *p,
                           struct kwk_err *err)
{
    struct kwk_engine_params prm;
    if (p)
        prm = *p;
    else
        kwk_engine_params_init(&prm);
    if (!m)
        return kwk_err_set(err, KWK_EARG, "no model"), NULL;
    if (prm.max_batch < 0 || prm.max_batch > 1024 || prm.prefill_chunk < 0 ||
        prm.prefill_chunk > 65536 || prm.max_queue < 0)
        return kwk_err_set(err, KWK_EARG, "max_batch %d, prefill_chunk %d or max_queue %d out "
                           "of range", prm.max_batch, prm.prefill_chunk, prm.max_queue), NULL;
    if (!prm.max_batch)
        prm.max_batch = DEFAULT_MAX_BATCH;
    if (!prm.prefill_chunk)
        prm.prefill_chunk = DEFAULT_PREFILL_CHUNK;
    if (!prm.max_queue)
        prm.max_queue = DEFAULT_MAX_QUEUE;

    struct kwk_engine *e = kwk_calloc(1, sizeof *e);
    if (!e)
        return kwk_err_set(err, -ENOMEM, "out of memory"), NULL;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->vocab_mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->next_id = 1;
    struct kwk_decoder_params dp;
    kwk_decoder_params_init(&dp);
    dp.max_cache_len = prm.max_cache_len;
    dp.n_threads = prm.n_threads;
    dp.precision = prm.precision;
    dp.cache_dir = prm.cache_dir;
    dp.mix_bits = prm.mix_bits;
    dp.calib = prm.calib;
    dp.n_calib = prm.n_calib;
    dp.gptq = prm.gptq;
    dp.act_bits = prm.act_bits;
    dp.kv_bits = prm.kv_bits;
    /* A step holds every running request's decode row and candidates, plus prompt chunks. */
    e->spec_cap = prm.max_batch * (1 + KWK_ENGINE_MAX_SPEC);
    int n_batch = prm.prefill_chunk + e->spec_cap;
    e->d = kwk_decoder_new_slots(m, &dp, prm.max_batch, n_batch, err);
    if (!e->d)
        goto fail;
    prm.max_cache_len = e->d->max_len;
    prm.cache_dir = NULL; /* borrowed for kwk_decoder_new only */
    prm.calib = NULL;
    prm.n_calib = 0;
    prm.prefill_chunk = KWK_MIN(prm.prefill_chunk, e->d->max_len);
    e->prm = prm;
    e->n_vocab = e->d->c->n_vocab;
    e->slots = kwk_calloc((size_t)prm.max_batch, sizeof *e->slots);
    e->row_ids = kwk_calloc((size_t)n_batch, sizeof(int32_t));
    e->row_req = kwk_calloc((size_t)n_batch, sizeof(int));
    e->logit_rows = kwk_calloc((size_t)e->spec_cap, sizeof(int));
    e->plans = kwk_calloc((size_t)prm.max_batch, sizeof *e->plans);
    size_t n_logits;
    if (kwk_mul_size((size_t)e->spec_cap, (size_t)e->n_vocab * sizeof(float), &n_logits))
        goto nomem;
    e->logits = kwk_malloc_aligned(n_logits);
    if (!e->slots || !e->row_ids || !e->row_req || !e->logit_rows || !e->plans || !e->logits)
        goto nomem;
    for (int i = 0; i < prm.max_batch; i++)
        if (!(e->slots[i].tokens = kwk_calloc((size_t)e->d->max_len, sizeof(int32_t))))
            goto nomem;
    e->st.max_batch = prm.max_batch;
    e->st.max_cache_len = prm.max_cache_len;
    return e;
nomem:
    kwk_err_set(err, -ENOMEM, "out of memory for an engine of %d slots", prm.max_batch);
fail:
    kwk_engine_free(e);
    return NULL;
}

static void req_free(struct kwk_req *r)
{
    if (!r)
        return;
    if (r->seq_ready)
        kwk_gen_seq_free(&r->g);
    kwk_gen_output_clear(&r->out);
    kwk_free(r->out.tokens);
    kwk_free(r->out.logprobs);
    kwk_free(r->out.top_ids);
    kwk_free(r->out.top_lps);
    kwk_free(r->prompt);
    kwk_free(r->plp);
    kwk_free(r->ptop_ids);
    kwk_free(r->ptop_lps);
    kwk_free(r->eos_ids);
    kwk_free(r->bias_ids);
    kwk_free(r->bias);
    kwk_free(r->trigger);
    kwk_free(r->think_open);
    kwk_free(r->think_close);
    kwk_free(r->preserved);
    if (r->stop)
        for (int i = 0; i < r->p.n_stop; i++)
            kwk_free(r->stop[i]);
    kwk_free(r->stop);
    kwk_free(r);
}

void kwk_engine_finish(struct kwk_engine *e, struct kwk_req *r, int status, const char *msg)
{
    double t = kwk_engine_now();
    struct kwk_event ev = {
        .type = KWK_EVENT_DONE,
        .id = r->id,
        .finish_reason = r->out.finish_reason,
        .status = status,
        .err_msg = status < 0 ? (msg ? msg : kwk_status_str(status)) : NULL,
        .n_prompt = r->n_prompt,
        .prompt_reused = r->out.prompt_reused,
        .n_tokens = r->out.n_tokens,
        .queue_s = r->t_admit > 0 ? r->t_admit - r->t_submit : t - r->t_submit,
        .ttft_s = r->t_first > 0 ? r->t_first - r->t_submit : 0,
        .total_s = t - r->t_submit,
    };
    if (status == 0 && ev.finish_reason == KWK_FINISH_NONE)
        ev.finish_reason = KWK_FINISH_CANCELED;
    r->fn(r->user, &ev);
    pthread_mutex_lock(&e->mu);
    if (r->state != REQ_QUEUED) {
        struct kwk_slot *s = &e->slots[r->slot];
        s->req = NULL;
        s->last_used = e->st.steps;
        e->n_running--;
    }
    if (status < 0)
        e->st.failed++;
    else if (ev.finish_reason == KWK_FINISH_CANCELED)
        e->st.canceled++;
    else
        e->st.completed++;
    if (r->t_first > 0) {
        e->st.ttft_sum_s += ev.ttft_s;
        e->st.ttft_count++;
    }
    pthread_mutex_unlock(&e->mu);
    req_free(r);
}

/* A request's own copy of s (in *own, freed with it) that the field of its params points to;
 * NULL stays NULL. */
static int req_strdup(const char *s, char **own, const char **field)
{
    if (s && !(*field = *own = kwk_strdup(s)))
        return -ENOMEM;
    return 0;
}

/* Copy what the caller gave into r, so that the caller may free it as soon as submit returns. */
static int req_copy(struct kwk_req *r, const int32_t *ids, int n, const struct kwk_gen_params *p)
{
    r->p = *p;
    r->p.draft = NULL;
    r->p.on_token = NULL;
    r->p.user = NULL;
    if (p->prompt_logprobs) /* a cached prefix's logits are gone: the prompt is read whole */
        r->p.prompt_cache = 0;
    r->prompt = kwk_malloc((size_t)n * sizeof(int32_t));
    if (!r->prompt)
        return -ENOMEM;
    memcpy(r->prompt, ids, (size_t)n * sizeof(int32_t));
    r->n_prompt = n;
    if (p->n_eos) {
        if (!(r->eos_ids = kwk_malloc((size_t)p->n_eos * sizeof(int32_t))))
            return -ENOMEM;
        memcpy(r->eos_ids, p->eos_ids, (size_t)p->n_eos * sizeof(int32_t));
        r->p.eos_ids = r->eos_ids;
    }
    if (p->n_logit_bias) {
        r->bias_ids = kwk_malloc((size_t)p->n_logit_bias * sizeof(int32_t));
        r->bias = kwk_malloc((size_t)p->n_logit_bias * sizeof(float));
        if (!r->bias_ids || !r->bias)
            return -ENOMEM;
        memcpy(r->bias_ids, p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof(int32_t));
        memcpy(r->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof(float));
        r->p.logit_bias_ids = r->bias_ids;
        r->p.logit_bias = r->bias;
    }
    if (p->n_stop) {
        r->stop = kwk_calloc((size_t)p->n_stop, sizeof(char *));
        if (!r->stop)
            return -ENOMEM;
        for (int i = 0; i < p->n_stop; i++)
            if (!(r->stop[i] = kwk_strdup(p->stop[i])))
                return -ENOMEM;
        r->p.stop = (const char *const *)r->stop;
    }
    if (req_strdup(p->grammar_trigger, &r->trigger, &r->p.grammar_trigger) ||
        req_strdup(p->think_open, &r->think_open, &r->p.think_open) ||
        req_strdup(p->think_close, &r->think_close, &r->p.think_close))
        return -ENOMEM;
    if (p->n_preserved > 0 && p->preserved_ids) {
        if (!(r->preserved = kwk_malloc((size_t)p->n_preserved * sizeof(int32_t))))
            return -ENOMEM;
        memcpy(r->preserved, p->preserved_ids, (size_t)p->n_preserved * sizeof(int32_t));
        r->p.preserved_ids = r->preserved;
    } else {
        r->p.preserved_ids = NULL; /* the caller's pointer may not outlive the call */
    }
    return 0;
}

/* The engine's grammar vocabulary for tok: built once, at the first grammar request. NULL with
 * err->code 0 when it was built for another tokenizer (that request builds its own). */
static const kwk_grammar_vocab *engine_vocab(struct kwk_engine *e, const kwk_tokenizer *tok,
                                             struct kwk_err *err)
{
    const kwk_grammar_vocab *v = NULL;
    if (err)
        err->code = 0;
    pthread_mutex_lock(&e->vocab_mu);
    if (!e->vocab) {
        e->vocab = kwk_grammar_vocab_new(tok, err);
        e->vocab_tok = e->vocab ? tok : NULL;
    }
    if (e->vocab_tok == tok)
        v = e->vocab;
    pthread_mutex_unlock(&e->vocab_mu);
    return v;
}

uint64_t kwk_engine_submit(kwk_engine *e, const int32_t *ids, int n,
                           const struct kwk_gen_params *p, kwk_event_fn fn, void *user,
                           struct kwk_err *err)
{
    if (!e || !p || !fn || !ids || n < 1)
        return kwk_err_set(err, KWK_EARG, "submit: no engine, prompt, parameters or callback"), 0;
    if (p->draft)
        return kwk_err_set(err, KWK_EARG, "the engine does not take a draft model"), 0;
    if (p->max_new_tokens < 0 || (int64_t)n + p->max_new_tokens > e->prm.max_cache_len)
        return kwk_err_set(err, KWK_ELIMIT, "a prompt of %d tokens plus %d new tokens does not "
                           "fit a context of %d", n, p->max_new_tokens, e->prm.max_cache_len), 0;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->n_vocab)
            return kwk_err_set(err, KWK_ERANGE, "prompt token %d (id %d) is outside the "
                               "vocabulary of %d", i, ids[i], e->n_vocab), 0;
    struct kwk_gen_params pv;
    if (p->grammar && !p->grammar_vocab && p->tok) {
        pv = *p;
        if (!(pv.grammar_vocab = engine_vocab(e, p->tok, err)) && err && err->code)
            return 0;
        p = &pv;
    }
    /* Check the parameters now, where the caller can still be told, by setting a sequence up. */
    struct kwk_gen_seq g;
    struct kwk_gen_output o = {0};
    int rc = kwk_gen_seq_init(&g, e->n_vocab, ids, n, p, &o, err);
    kwk_gen_seq_free(&g);
    if (rc < 0)
        return 0;

    struct kwk_req *r = kwk_calloc(1, sizeof *r);
    if (!r || req_copy(r, ids, n, p) < 0) {
        req_free(r);
        return kwk_err_set(err, -ENOMEM, "out of memory for a request"), 0;
    }
    r->fn = fn;
    r->user = user;
    r->e = e;
    r->state = REQ_QUEUED;
    r->t_submit = kwk_engine_now();
    pthread_mutex_lock(&e->mu);
    if (e->n_queued >= e->prm.max_queue) {
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return kwk_err_set(err, KWK_ELIMIT, "the queue is full (%d requests waiting)",
                           e->prm.max_queue), 0;
    }
    r->id = e->next_id++;
    if (e->q_tail)
        e->q_tail->next = r;
    else
        e->q_head = r;
    e->q_tail = r;
    e->n_queued++;
    e->st.submitted++;
    uint64_t id = r->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return id;
}

int kwk_engine_cancel(kwk_engine *e, uint64_t id)
{
    int rc = KWK_ENOTFOUND;
    if (!e)
        return KWK_EARG;
    pthread_mutex_lock(&e->mu);
    for (struct kwk_req *r = e->q_head; r && rc; r = r->next)
        if (r->id == id) {
            atomic_store(&r->cancel, 1);
            rc = 0;
        }
    for (int i = 0; i < e->prm.max_batch && rc; i++)
        if (e->slots[i].req && e->slots[i].req->id == id) {
            atomic_store(&e->slots[i].req->cancel, 1);
            rc = 0;
        }
    if (rc == 0)
        pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int kwk_engine_step(kwk_engine *e)
{
    return e ? kwk_engine_run_step(e) : KWK_EARG;
}

static void *engine_main(void *arg)
{
    struct kwk_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->thread_stop && e->n_queued == 0 && e->n_running == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        int stop = e->thread_stop;
        pthread_mutex_unlock(&e->mu);
        if (stop)
            break;
        kwk_engine_run_step(e);
    }
    return NULL;
}

int kwk_engine_start(kwk_engine *e, struct kwk_err *err)
{
    if (!e)
        return kwk_err_set(err, KWK_EARG, "no engine");
    pthread_mutex_lock(&e->mu);
    int on = e->thread_on;
    e->thread_stop = 0;
    pthread_mutex_unlock(&e->mu);
    if (on)
        return kwk_err_set(err, KWK_EARG, "the engine's thread is already running");
    int rc = pthread_create(&e->thread, NULL, engine_main, e);
    if (rc != 0)
        return kwk_err_set(err, -rc, "cannot start the engine's thread: %s", strerror(rc));
    pthread_mutex_lock(&e->mu);
    e->thread_on = 1;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void kwk_engine_stop(kwk_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    int on = e->thread_on;
    e->thread_stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (on)
        pthread_join(e->thread, NULL);
    pthread_mutex_lock(&e->mu);
    e->thread_on = 0;
    pthread_mutex_unlock(&e->mu);
}

void kwk_engine_get_stats(kwk_engine *e, struct kwk_engine_stats *s)
{
    if (!e || !s)
        return;
    pthread_mutex_lock(&e->mu);
    *s = e->st;
    s->queued = e->n_queued;
    s->running = e->n_running;
    pthread_mutex_unlock(&e->mu);
}

void kwk_engine_free(kwk_engine *e)
{
    if (!e)
        return;
    kwk_engine_stop(e);
    /* Every request still held ends with CANCELED, on this (now the only) thread. */
    struct kwk_req *r;
    while ((r = e->q_head) != NULL) {
        e->q_head = r->next;
        e->n_queued--;
        kwk_engine_finish(e, r, 0, NULL);
    }
    for (int i = 0; e->slots && i < e->prm.max_batch; i++) {
        if (e->slots[i].req)
            kwk_engine_finish(e, e->slots[i].req, 0, NULL);
        kwk_free(e->slots[i].tokens);
    }
    kwk_free(e->slots);
    kwk_free(e->row_ids);
    kwk_free(e->row_req);
    kwk_free(e->logit_rows);
    kwk_free(e->plans);
    kwk_free_aligned(e->logits);
    kwk_decoder_free(e->d);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->vocab_mu);
    kwk_grammar_vocab_free(e->vocab);
    kwk_free(e);
}
