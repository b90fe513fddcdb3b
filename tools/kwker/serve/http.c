/* http.c - `kwker serve`'s HTTP side over libmicrohttpd: one epoll event-loop thread owns every
 * connection; requests go to the engine (kwk_engine_submit) and come back as events on the
 * engine's thread, which only copies them into the request and resumes its connection. srv_run
 * runs on the main thread; on_request / stream_read / on_completed on the event-loop thread;
 * on_event on the engine's thread. An encoder (embedding or reranking) model has no engine: its
 * requests (/v1/embeddings, /v1/rerank, /v1/score, /v1/classify) are parsed on the event loop
 * and go to the encoder worker (embedq.c), whose thread tokenizes their texts (the routes'
 * *_prepare: megabytes of text would hold every connection for seconds), runs the model and
 * calls embed_done as the engine's calls on_event.
 *
 * Lifetimes: a request (struct rq) is reference-counted under its mutex. References: the
 * connection (dropped in on_completed, whichever way the request ends), the engine (taken before
 * kwk_engine_submit, dropped at the request's DONE event, which the engine always sends), and a
 * streaming response (dropped in its free callback). Whoever drops the last one frees it, so an
 * event for a request whose client is gone finds valid memory until DONE. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "model/model.h"
#include "serve.h"

struct srv {
    const struct srv_opts *o;
    kwk_model *m;
    kwk_tokenizer *tok;
    kwk_template *tpl;       /* NULL when the model has no chat template */
    json_t *tpl_kwargs;      /* --chat-template-kwargs (an object), or NULL */
    kwk_grammar_vocab *gvocab; /* tok's token bytes for constrained requests, built at start */
    kwk_engine *e;           /* a decoder's; NULL when an encoder is served */
    kwk_encoder *enc;        /* an encoder's; NULL when a decoder is served */
    struct srv_embedq *eq;   /* the encoder's worker thread */
    struct srv_embed_limits elim;
    int n_labels;            /* an encoder's classification head: 1 for a reranker, 0 none */
    int pair_ok;             /* its tokenizer joins pairs (kwk_tokenizer_join_pair) */
    int score_act;           /* enum kwk_score_act: scores of its logits */
    struct srv_labels labels; /* its head's label names and /classify's activation */
    int32_t eos[8];
    int n_eos;
    int32_t preserved[SRV_MAX_PRESERVED]; /* the tool format's markers that are special tokens */
    int n_preserved;
    int tpl_thinks;          /* the chat template thinks (names <think> / </think>, or R1's) */
    int think;               /* chat replies' think blocks are split off (--reasoning-format;
                              * a request's reasoning_format overrides it) */
    int32_t think_ids[2];    /* <think>, </think> where special tokens: kept in split replies */
    int n_think_ids;
    int32_t preserved_all[SRV_MAX_PRESERVED + 2]; /* preserved, then think_ids not among them */
    int n_preserved_all;
    struct srv_limits lim;
    char model_id[256];
    const char *model_path;  /* --model as given, or the default's path: also a valid name */
    int64_t created;
    struct MHD_Daemon *d;
    pthread_mutex_t mu;      /* guards closing against the engine being freed */
    int closing;
    _Atomic uint64_t next_id;
    uint64_t id_salt;
    struct srv_metrics met;
};

enum rq_state { RQ_NEW, RQ_BODY, RQ_WAIT, RQ_STREAM, RQ_ANSWERED };
enum rq_route {
    R_OTHER, R_CHAT, R_COMPLETION, R_TOKENIZE, R_DETOKENIZE, R_EMBED, R_RERANK, R_SCORE,
    R_CLASSIFY
};

struct rq;

/* One choice of a chat or completion request ("n", "best_of"): one engine request. */
struct rq_choice {
    struct rq *r;
    int index;
    uint64_t eid;             /* the engine's id, 0 until submitted */
    /* event-loop thread only */
    struct srv_ctx ctx;       /* the request's, with this choice's index, text offset, calls */
    struct srv_buf reply;     /* with tools or a think block, streaming: all the reply's text
                               * so far */
    struct srv_reply_stream sent; /* how much of it went out as each field */
    struct srv_tool_reply tools; /* with tools or a think block: the reply read whole (calls,
                                  * content, reasoning), once DONE */
    int role_sent, end_sent, echo_sent;
    /* shared with the engine thread, under the request's mu */
    int done;
    struct srv_buf text;      /* settled text not yet sent (stream) or all of it */
    struct srv_lp *lps;
    int n_lps, cap_lps;
    int n_tokens, finish, estatus;
    double lp_sum;            /* the tokens' logprobs: best_of's rank */
    char err_msg[256];
};

struct rq {
    struct srv *s;
    pthread_mutex_t mu;
    int refs;
    struct MHD_Connection *conn;
    /* event-loop thread only */
    int state, route, status, is_post;
    char method[8], path[96];
    double t0, t_submit;
    struct srv_buf body;
    int too_large;
    struct srv_req req;
    struct srv_embed_req ereq; /* R_EMBED: the body, then its token ids */
    struct srv_rerank_req rreq; /* R_RERANK: the body, then its pairs' token ids */
    struct srv_score_req sreq; /* R_SCORE: the body, then its pairs' or texts' token ids */
    struct srv_classify_req creq; /* R_CLASSIFY: the body, then its inputs' token ids */
    struct srv_trunc trunc;    /* R_SCORE, R_CLASSIFY: truncate_prompt_tokens resolved */
    struct srv_embed_job job;  /* R_EMBED, R_RERANK, R_SCORE, R_CLASSIFY: what the encoder
                                * worker tokenizes (the route's *_prepare) and runs; from
                                * submit to embed_done the worker's alone, with ereq .. creq,
                                * vec and n_prompt */
    float *vec;                /* written by the worker: R_EMBED [n_in][dim], R_RERANK
                                * [n_docs] logits, then scores; R_SCORE [pairs] logits or
                                * [distinct texts][dim]; R_CLASSIFY [n_in][n_labels];
                                * allocated by the worker (job_out) */
    struct srv_ctx ctx;
    char id[48];
    struct srv_buf out;       /* stream bytes formatted, not yet handed to MHD */
    size_t out_off;
    uint64_t call_seed;       /* the calls' ids */
    int end_sent;
    struct rq_choice *ch;     /* [n_ch]: chat and completions (req.best_of of them) */
    char *echo_text;          /* completions' echo: the prompt's text, leading every choice */
    size_t echo_len;
    int32_t *echo_ids;        /* and its ids (set before submit) */
    int n_echo_ids;
    struct srv_lp *plps;      /* echo with logprobs: the prompt's tokens' [n_plps] (under mu:
                               * set by choice 0's KWK_EVENT_PROMPT, then never changed) */
    int n_plps;
    /* shared with the engine thread, under mu */
    int n_ch, n_done;         /* choices submitted, and ended */
    int suspended, conn_gone, done; /* done: every choice (or the encoder's job) ended */
    int counted;              /* in s->met.in_flight (event-loop thread only) */
    int n_tokens, n_prompt, estatus; /* n_tokens: all choices'; estatus: the encoder's job */
    double t_first;
    char err_msg[256];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct rq *rq_new(struct srv *s, struct MHD_Connection *c, const char *method,
                         const char *url)
{
    struct rq *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    if (pthread_mutex_init(&r->mu, NULL)) {
        free(r);
        return NULL;
    }
    r->s = s;
    r->conn = c;
    r->refs = 1;
    r->t0 = now_s();
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->path, sizeof r->path, "%s", url);
    return r;
}

static void rq_free(struct rq *r)
{
    srv_buf_free(&r->body);
    srv_buf_free(&r->out);
    for (int i = 0; r->ch && i < r->req.best_of; i++) {
        struct rq_choice *ch = &r->ch[i];
        srv_buf_free(&ch->text);
        srv_buf_free(&ch->reply);
        srv_tool_reply_free(&ch->tools);
        free(ch->lps);
    }
    free(r->ch);
    free(r->echo_text);
    free(r->echo_ids);
    free(r->plps);
    srv_req_free(&r->req);
    srv_embed_req_free(&r->ereq);
    srv_rerank_req_free(&r->rreq);
    srv_score_req_free(&r->sreq);
    srv_classify_req_free(&r->creq);
    free(r->vec);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* Drop one reference; frees on the last. */
static void rq_unref(struct rq *r)
{
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        rq_free(r);
}

/* ---- plain responses ------------------------------------------------------------------------- */

static enum MHD_Result respond(struct rq *r, int status, const char *type, const char *body,
                               size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    r->status = status;
    r->state = RQ_ANSWERED;
    return rc;
}

static enum MHD_Result respond_json(struct rq *r, int status, struct srv_buf *b)
{
    if (b->err) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        return respond(r, 500, "application/json", oom, sizeof oom - 1);
    }
    return respond(r, status, "application/json", b->p ? b->p : "", b->len);
}

static enum MHD_Result respond_err(struct rq *r, const struct srv_err *e)
{
    char *body = srv_json_error(e);
    struct srv_buf b = {.p = body, .len = body ? strlen(body) : 0, .err = !body};
    enum MHD_Result rc = respond_json(r, e->http, &b);
    free(body);
    return rc;
}

static enum MHD_Result fail(struct rq *r, int http, const char *type, const char *param,
                            const char *code, const char *msg)
{
    struct srv_err e;
    srv_err_set(&e, http, type, param, code, "%s", msg);
    return respond_err(r, &e);
}

/* ---- GET routes ------------------------------------------------------------------------------ */

static json_t *model_obj(const struct srv *s)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->model_id, "object", "model",
                     "created", (json_int_t)s->created, "owned_by", "kwker", "max_model_len",
                     s->lim.max_cache_len);
}

static enum MHD_Result send_json_obj(struct rq *r, json_t *j)
{
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    struct srv_buf b = {.p = txt, .len = txt ? strlen(txt) : 0, .err = !txt};
    enum MHD_Result rc = respond_json(r, 200, &b);
    free(txt);
    json_decref(j);
    return rc;
}

static int engine_stats(struct srv *s, struct kwk_engine_stats *st)
{
    int ok = 0;
    memset(st, 0, sizeof *st);
    pthread_mutex_lock(&s->mu);
    if (!s->closing && s->e) {
        kwk_engine_get_stats(s->e, st);
        ok = 1;
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static enum MHD_Result get_route(struct rq *r)
{
    struct srv *s = r->s;
    if (!strcmp(r->path, "/health")) {
        /* draining: a load balancer's check on a kept-alive connection takes it out */
        static const char ok[] = "{\"status\":\"ok\"}", drain[] = "{\"status\":\"draining\"}";
        return atomic_load(&s->met.draining)
                   ? respond(r, 503, "application/json", drain, sizeof drain - 1)
                   : respond(r, 200, "application/json", ok, sizeof ok - 1);
    }
    if (!strcmp(r->path, "/metrics")) {
        struct kwk_engine_stats st;
        struct srv_buf b = {0};
        /* the daemon from the connection: s->d may not be stored yet for the first requests */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_DAEMON);
        const union MHD_DaemonInfo *di =
            ci ? MHD_get_daemon_info(ci->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
        engine_stats(s, &st);
        srv_metrics_render(&b, &s->met, s->enc ? NULL : &st, di ? di->num_connections : 0);
        if (s->enc) {
            uint64_t batches = 0, seqs = 0;
            pthread_mutex_lock(&s->mu);
            if (!s->closing)
                srv_embedq_stats(s->eq, &batches, &seqs);
            pthread_mutex_unlock(&s->mu);
            srv_metrics_render_embed(&b, batches, seqs);
        }
        enum MHD_Result rc =
            b.err ? fail(r, 500, "server_error", NULL, NULL, "out of memory")
                  : respond(r, 200, "text/plain; version=0.0.4", b.p ? b.p : "", b.len);
        srv_buf_free(&b);
        return rc;
    }
    if (!strcmp(r->path, "/v1/models"))
        return send_json_obj(r, json_pack("{s:s, s:[o]}", "object", "list", "data",
                                          model_obj(s)));
    if (!strncmp(r->path, "/v1/models/", 11) && !strcmp(r->path + 11, s->model_id))
        return send_json_obj(r, model_obj(s));
    if (!strncmp(r->path, "/v1/models/", 11))
        return fail(r, 404, "invalid_request_error", "model", "model_not_found",
                    "The model does not exist");
    return fail(r, 404, "not_found_error", NULL, "not_found", "Not found");
}

/* ---- the engine's events (engine thread) ----------------------------------------------------- */

static void add_lp(struct rq_choice *ch, const struct kwk_event *ev)
{
    if (ch->n_lps == ch->cap_lps) {
        int cap = ch->cap_lps ? ch->cap_lps * 2 : 16;
        struct srv_lp *l = realloc(ch->lps, sizeof *l * (size_t)cap);
        if (!l)
            return; /* logprobs of this token are lost; the text is not */
        ch->lps = l;
        ch->cap_lps = cap;
    }
    struct srv_lp *l = &ch->lps[ch->n_lps++];
    l->token = ev->token;
    l->logprob = ev->logprob;
    l->n_top = ev->n_top < SRV_MAX_TOP ? ev->n_top : SRV_MAX_TOP;
    if (l->n_top > 0 && ev->top_ids && ev->top_lps) {
        memcpy(l->top_ids, ev->top_ids, sizeof(int32_t) * (size_t)l->n_top);
        memcpy(l->top_lps, ev->top_lps, sizeof(float) * (size_t)l->n_top);
    } else {
        l->n_top = 0;
    }
}

/* The prompt's logprobs (echo with logprobs) as the completion's logprobs read them: the first
 * token's NaN becomes null. A failed allocation loses them (the reply then has none). */
static void on_prompt(struct rq *r, const struct kwk_event *ev)
{
    struct srv_lp *l = calloc((size_t)ev->n_prompt, sizeof *l);
    if (!l)
        return;
    int nt = ev->n_top < SRV_MAX_TOP ? ev->n_top : SRV_MAX_TOP;
    for (int i = 0; i < ev->n_prompt; i++) {
        l[i].token = i < r->n_echo_ids ? r->echo_ids[i] : 0;
        l[i].logprob = ev->prompt_lps[i];
        l[i].n_top = i ? nt : 0;
        for (int k = 0; k < l[i].n_top; k++) {
            l[i].top_ids[k] = ev->top_ids[(size_t)i * (size_t)ev->n_top + (size_t)k];
            l[i].top_lps[k] = ev->top_lps[(size_t)i * (size_t)ev->n_top + (size_t)k];
        }
    }
    r->plps = l;
    r->n_plps = ev->n_prompt;
}

/* A choice ended. The prompt counts once a request (at its first choice to end), the time to
 * its first token once (at its last), generated tokens for every choice. */
static void on_done(struct rq *r, struct rq_choice *ch, const struct kwk_event *ev)
{
    struct srv_metrics *m = &r->s->met;
    ch->done = 1;
    ch->finish = ev->finish_reason;
    ch->estatus = ev->status;
    ch->n_tokens = ev->n_tokens;
    if (ev->status && ev->err_msg)
        snprintf(ch->err_msg, sizeof ch->err_msg, "%s", ev->err_msg);
    r->n_prompt = ev->n_prompt;
    r->done = ++r->n_done == r->n_ch;
    atomic_fetch_add_explicit(&m->completion_tokens, (uint64_t)ev->n_tokens,
                              memory_order_relaxed);
    if (r->n_done == 1)
        atomic_fetch_add_explicit(&m->prompt_tokens, (uint64_t)ev->n_prompt,
                                  memory_order_relaxed);
    if (r->done && r->t_first > 0) {
        atomic_fetch_add_explicit(&m->ttft_us_sum, (uint64_t)((r->t_first - r->t_submit) * 1e6),
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&m->ttft_count, 1, memory_order_relaxed);
    }
}

/* Called with r->mu held, which it releases: wakes r's suspended connection when `ready` (and
 * the client is still there), then frees r when `last` (the last reference was dropped).
 * MHD_resume_connection runs outside our mutex: MHD takes its own lock, which its thread holds
 * when it calls us. */
static void rq_wake_unlock(struct rq *r, int ready, int last)
{
    struct MHD_Connection *wake = NULL;
    if (ready && r->suspended && !r->conn_gone) {
        r->suspended = 0;
        wake = r->conn;
    }
    pthread_mutex_unlock(&r->mu);
    if (wake)
        MHD_resume_connection(wake);
    if (last)
        rq_free(r);
}

/* Copy and return: the engine's step waits for this. user is the choice. */
static void on_event(void *user, const struct kwk_event *ev)
{
    struct rq_choice *ch = user;
    struct rq *r = ch->r;
    int last = 0;
    pthread_mutex_lock(&r->mu);
    if (ev->type == KWK_EVENT_TOKEN) {
        if (r->t_first == 0)
            r->t_first = now_s();
        r->n_tokens++;
        ch->lp_sum += ev->logprob;
        if (!r->conn_gone) {
            srv_buf_add(&ch->text, ev->text, ev->len);
            if (r->req.logprobs)
                add_lp(ch, ev);
        }
    } else if (ev->type == KWK_EVENT_PROMPT && !r->plps && !r->conn_gone) {
        on_prompt(r, ev);
    } else if (ev->type == KWK_EVENT_DONE) {
        on_done(r, ch, ev);
        last = --r->refs == 0;
    }
    /* a non-streaming request waits for every DONE only: no wake-up per token */
    int ready = r->done || (r->req.stream && (ch->text.len || ch->n_lps || ch->done || r->plps));
    rq_wake_unlock(r, ready, last);
}

/* ---- streaming (event-loop thread) ----------------------------------------------------------- */

/* Choice i's calls' ids (choice 0's as a request of one choice gets). */
static uint64_t call_seed(const struct rq *r, int i)
{
    return r->call_seed ^ (uint64_t)i * 0x94d049bb133111ebull;
}

/* With tools or a think block, the text that arrived is added to the whole reply, and what of
 * it is settled goes out (srv_reply_stream_next): reasoning as it comes (but a "</think>" that
 * may be arriving), content that is surely not a call, and at DONE the rest of both as the
 * reply is read whole (its calls follow as their own chunks). */
static void stream_reply(struct rq *r, struct rq_choice *ch, struct srv_buf *text,
                         struct srv_delta *d, int done)
{
    struct srv_buf *all = &ch->reply;
    srv_buf_add(all, text->p, text->len);
    text->len = 0;
    memset(d, 0, sizeof *d);
    if (all->err) {
        r->out.err = 1;
        return;
    }
    const char *t = all->p ? all->p : "";
    if (done && ch->estatus) /* a failed reply: its text is not read */
        return;
    if (done && r->req.tools)
        srv_tools_extract(&r->req, t, all->len, call_seed(r, ch->index), &ch->tools);
    else if (done)
        srv_think_reply(&r->req, t, all->len, &ch->tools);
    if (done)
        ch->ctx.tools = &ch->tools;
    srv_reply_stream_next(&ch->sent, &r->req, t, all->len, done ? &ch->tools : NULL, d);
}

/* What arrived for one choice since the last call, taken under the request's lock. */
struct rq_take {
    struct srv_buf text;
    struct srv_lp *lps;
    int n_lps, done, n_tokens;
    int plps_ready;           /* echo: the prompt's logprobs arrived (r->plps) */
    int held;                 /* echo with logprobs that have not come: nothing taken yet */
};

/* Whether choice ch's stream waits for the prompt's logprobs (echo with logprobs: its echo chunk
 * goes first, and they have not come). Under r->mu. */
static int echo_held(const struct rq *r, const struct rq_choice *ch)
{
    return r->req.echo && r->req.logprobs && !ch->echo_sent && !r->plps && !ch->done;
}

/* One choice's chunks for what t holds into r->out; at its end its finish chunk (or the
 * stream's error event: then the stream ends, and the other choices are canceled when the
 * connection closes). */
static void stream_choice(struct rq *r, struct rq_choice *ch, struct rq_take *t)
{
    struct srv_ctx *c = &ch->ctx;
    if (!ch->role_sent && c->kind == SRV_CHAT)
        srv_sse_role(&r->out, c);
    ch->role_sent = 1;
    /* completions' echo: the prompt's chunk first (with logprobs, once they came: before any
     * token of the choice, which the engine reads after the prompt) */
    if (r->req.echo && !ch->echo_sent) {
        int lp = r->req.logprobs && t->plps_ready;
        srv_sse_content(&r->out, c, r->echo_text, r->echo_len, lp ? r->plps : NULL,
                        lp ? r->n_plps : 0);
        ch->echo_sent = 1;
    }
    const char *content = t->text.p;
    size_t content_len = t->text.len;
    int n_lps = t->n_lps;
    if (r->req.tools || r->req.think) {
        struct srv_delta d;
        stream_reply(r, ch, &t->text, &d, t->done);
        content = d.content;
        content_len = d.content_len;
        /* the logprobs go with the content, if any came; vLLM's include_reasoning false
         * drops the reasoning, and with it the logprobs that came with nothing else */
        if (d.reasoning_len && r->req.include_reasoning)
            srv_sse_reasoning(&r->out, c, d.reasoning, d.reasoning_len,
                              content_len ? NULL : t->lps, content_len ? 0 : n_lps);
        if (d.reasoning_len && !content_len)
            n_lps = 0;
    }
    if (content_len || n_lps)
        srv_sse_content(&r->out, c, content, content_len, t->lps, n_lps);
    if (t->done && ch->tools.calls)
        srv_sse_tool_calls(&r->out, c, ch->tools.calls);
    if (!t->done)
        return;
    ch->end_sent = 1;
    if (ch->estatus) {
        struct srv_err e;
        srv_err_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                    ch->err_msg[0] ? ch->err_msg : kwk_status_str(ch->estatus));
        srv_sse_error(&r->out, &e);
        r->end_sent = 1;
    } else {
        srv_sse_finish(&r->out, c, ch->finish);
    }
}

/* Format what arrived since the last call into r->out. Returns 1 when something was added, 0
 * when the request has nothing new (then the connection is suspended under the same lock the
 * engine thread checks, so a wake-up cannot be missed). */
static int stream_fill(struct rq *r)
{
    int n = r->req.n, fresh = 0;
    struct rq_take take[SRV_MAX_CHOICES];
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < n; i++) {
        const struct rq_choice *ch = &r->ch[i];
        fresh |= !ch->end_sent && !echo_held(r, ch) &&
                 (ch->text.len || ch->n_lps || ch->done || !ch->role_sent ||
                  (r->req.echo && !ch->echo_sent));
    }
    if (!fresh) {
        r->suspended = 1;
        MHD_suspend_connection(r->conn);
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        struct rq_choice *ch = &r->ch[i];
        if ((take[i].held = echo_held(r, ch)))
            continue;
        take[i] = (struct rq_take){ch->text, ch->lps, ch->n_lps, ch->done, ch->n_tokens,
                                   r->plps != NULL, 0};
        memset(&ch->text, 0, sizeof ch->text);
        ch->lps = NULL;
        ch->n_lps = ch->cap_lps = 0;
    }
    pthread_mutex_unlock(&r->mu);

    r->out.len = 0;
    r->out_off = 0;
    int ended = 0, n_tokens = 0;
    for (int i = 0; i < n; i++) {
        struct rq_choice *ch = &r->ch[i];
        if (take[i].held)
            continue;
        if (!ch->end_sent && !r->end_sent)
            stream_choice(r, ch, &take[i]);
        ended += ch->end_sent;
        n_tokens += take[i].n_tokens;
        srv_buf_free(&take[i].text);
        free(take[i].lps);
    }
    if (ended == n && !r->end_sent) {
        if (r->ctx.include_usage)
            srv_sse_usage(&r->out, &r->ctx, r->n_prompt, n_tokens);
        r->end_sent = 1;
    }
    if (r->end_sent)
        srv_sse_done(&r->out);
    return 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct rq *r = cls;
    (void)pos;
    while (r->out_off == r->out.len) {
        if (r->end_sent)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_fill(r))
            return 0; /* suspended until the engine has more */
        if (r->out.err)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = r->out.len - r->out_off;
    if (n > max)
        n = max;
    memcpy(buf, r->out.p + r->out_off, n);
    r->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    rq_unref(cls);
}

static enum MHD_Result start_stream(struct rq *r)
{
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, r, stream_free);
    if (!resp) {
        rq_unref(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    r->status = 200;
    r->state = RQ_STREAM;
    atomic_fetch_add_explicit(&r->s->met.streams, 1, memory_order_relaxed);
    return rc;
}

/* ---- a non-streaming answer once DONE came (event-loop thread) ------------------------------- */

static enum MHD_Result embed_reply(struct rq *r);
static enum MHD_Result rerank_reply(struct rq *r);
static enum MHD_Result score_reply(struct rq *r);
static enum MHD_Result classify_reply(struct rq *r);

/* Completions' echo, once the choice is done: the prompt's text ahead of the choice's, and with
 * logprobs its tokens' ahead of the choice's. -1 when out of memory. */
static int echo_join(struct rq *r, struct rq_choice *ch)
{
    struct srv_buf t = {0};
    srv_buf_add(&t, r->echo_text, r->echo_len);
    srv_buf_add(&t, ch->text.p, ch->text.len);
    if (t.err) {
        srv_buf_free(&t);
        return -1;
    }
    srv_buf_free(&ch->text);
    ch->text = t;
    if (!r->req.logprobs || !r->plps)
        return 0;
    struct srv_lp *l = malloc(sizeof *l * (size_t)(r->n_plps + ch->n_lps));
    if (!l)
        return -1;
    memcpy(l, r->plps, sizeof *l * (size_t)r->n_plps);
    if (ch->n_lps)
        memcpy(l + r->n_plps, ch->lps, sizeof *l * (size_t)ch->n_lps);
    free(ch->lps);
    ch->lps = l;
    ch->n_lps += r->n_plps;
    ch->cap_lps = ch->n_lps;
    return 0;
}

/* A best_of candidate's rank: its mean token logprob. */
static double choice_rank(const struct rq_choice *ch)
{
    return ch->n_tokens ? ch->lp_sum / ch->n_tokens : 0;
}

static enum MHD_Result answer(struct rq *r)
{
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        r->suspended = 1;
        MHD_suspend_connection(r->conn);
        pthread_mutex_unlock(&r->mu);
        return MHD_YES;
    }
    pthread_mutex_unlock(&r->mu);
    if (r->route == R_EMBED)
        return embed_reply(r);
    if (r->route == R_RERANK)
        return rerank_reply(r);
    if (r->route == R_SCORE)
        return score_reply(r);
    if (r->route == R_CLASSIFY)
        return classify_reply(r);
    /* after every DONE the engine no longer touches r: the fields below are final */
    int n = r->req.best_of, n_tokens = 0;
    for (int i = 0; i < n; i++)
        if (r->ch[i].estatus) {
            struct srv_err e;
            srv_err_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s",
                        r->ch[i].err_msg[0] ? r->ch[i].err_msg
                                            : kwk_status_str(r->ch[i].estatus));
            return respond_err(r, &e);
        }
    struct srv_choice out[SRV_MAX_CHOICES];
    int order[SRV_MAX_CHOICES];
    for (int i = 0; i < n; i++) {
        struct rq_choice *ch = &r->ch[i];
        if (r->req.echo && echo_join(r, ch))
            return fail(r, 500, "server_error", NULL, NULL, "out of memory");
        const char *text = ch->text.p ? ch->text.p : "";
        if (r->req.tools)
            srv_tools_extract(&r->req, text, ch->text.len, call_seed(r, i), &ch->tools);
        else if (r->req.think)
            srv_think_reply(&r->req, text, ch->text.len, &ch->tools);
        if (!r->req.include_reasoning)
            ch->tools.reasoning = NULL;
        out[i] = (struct srv_choice){text, ch->text.len, ch->lps, ch->n_lps, ch->finish,
                                     r->req.tools || r->req.think ? &ch->tools : NULL};
        n_tokens += ch->n_tokens;
        order[i] = i;
    }
    /* best_of: the n with the highest logprob per token, best first (OpenAI's rule), each
     * billed; an insertion sort, stable, so equal candidates keep their order */
    for (int i = 1; i < n && n > r->req.n; i++)
        for (int j = i; j > 0 && choice_rank(&r->ch[order[j]]) >
                                     choice_rank(&r->ch[order[j - 1]]); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    struct srv_choice best[SRV_MAX_CHOICES];
    for (int i = 0; i < r->req.n; i++)
        best[i] = out[order[i]];
    struct srv_buf b = {0};
    srv_json_response(&b, &r->ctx, n > r->req.n ? best : out, r->req.n, r->n_prompt, n_tokens);
    enum MHD_Result rc = respond_json(r, 200, &b);
    srv_buf_free(&b);
    return rc;
}

/* ---- prompts --------------------------------------------------------------------------------- */

/* A copy of messages whose final content ends with SRV_CONTINUE_TAG (continue_final_message:
 * the parser checked it is a string), or NULL when out of memory. */
static json_t *continue_messages(const json_t *messages)
{
    json_t *copy = json_deep_copy(messages);
    json_t *last = json_array_get(copy, json_array_size(copy) - 1);
    json_t *c = json_object_get(last, "content");
    size_t n = json_string_length(c), tn = sizeof SRV_CONTINUE_TAG - 1;
    char *t = c ? malloc(n + tn) : NULL;
    if (t) {
        memcpy(t, json_string_value(c), n);
        memcpy(t + n, SRV_CONTINUE_TAG, tn);
    }
    if (!t || json_object_set_new(last, "content", json_stringn_nocheck(t, n + tn))) {
        json_decref(copy);
        copy = NULL;
    }
    free(t);
    return copy;
}

/* The chat messages through the model's template, then encoded without added special tokens
 * (the template writes them), as apply_chat_template(tokenize=True). */
static int chat_ids(struct srv *s, struct srv_req *q, int32_t **ids, size_t *n,
                    struct srv_err *e)
{
    struct kwk_err err = {0};
    char *ctx_text = NULL, *text = NULL;
    size_t len = 0;
    int rc = -1;
    if (!s->tpl) {
        srv_err_set(e, 400, "invalid_request_error", "messages", "no_chat_template",
                    s->enc ? "the model is an embedding model and has no chat template: "
                             "tokenize a prompt instead of messages"
                           : "the model has no chat template: use /v1/completions");
        return -1;
    }
    /* the tools as the format wants them (srv_tools_context): none for the generic format,
     * which describes them in its own system message; Firefunction's "functions" */
    json_t *msgs = q->continue_final ? continue_messages(q->messages) : json_incref(q->messages);
    json_t *ctx = msgs ? json_pack("{s:o, s:n, s:b}", "messages", msgs, "documents",
                                   "add_generation_prompt", q->add_generation_prompt)
                       : NULL;
    if (ctx && srv_tools_context(q, s->lim.tool_format, ctx)) {
        json_decref(ctx);
        ctx = NULL;
    }
    const char *bos = kwk_tokenizer_bos_token(s->tok), *eos = kwk_tokenizer_eos_token(s->tok);
    if (ctx && bos)
        json_object_set_new(ctx, "bos_token", json_string(bos));
    if (ctx && eos)
        json_object_set_new(ctx, "eos_token", json_string(eos));
    /* the server's variables, then the request's over them (vLLM's order); both checked not
     * to set the conversation's own, so they may override bos_token as transformers' do */
    if (ctx && ((s->tpl_kwargs && json_object_update(ctx, s->tpl_kwargs)) ||
                (q->template_kwargs && json_object_update(ctx, q->template_kwargs)))) {
        json_decref(ctx);
        ctx = NULL;
    }
    if (!ctx || !(ctx_text = json_dumps(ctx, JSON_COMPACT))) {
        srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (kwk_template_render(s->tpl, ctx_text, strlen(ctx_text), NULL, &text, &len, &err)) {
        srv_err_set(e, 400, "invalid_request_error", "messages", "chat_template_error",
                    "the chat template refused the messages: %s", err.msg);
        goto out;
    }
    if (q->continue_final) {
        json_t *c = json_object_get(json_array_get(q->messages, json_array_size(q->messages) - 1),
                                    "content");
        long cut = srv_continue_cut(text, len, json_string_value(c), json_string_length(c));
        if (cut < 0) {
            srv_err_set(e, 400, "invalid_request_error", "continue_final_message",
                        "chat_template_error", "continue_final_message is set but the final "
                        "message does not appear in the chat after applying the chat template");
            goto out;
        }
        len = (size_t)cut;
    }
    int st = kwk_tokenizer_encode_alloc(s->tok, text, len, q->add_special_tokens, ids, n);
    if (st < 0) {
        srv_err_set(e, 500, "server_error", NULL, NULL, "tokenizing: %s", kwk_status_str(st));
        goto out;
    }
    /* whether the reply starts inside the think block is the prompt's to say, per request
     * (Qwen3's enable_thinking=false closes it; R1's opens it) */
    int split = q->reasoning_format < 0 ? s->think
                                        : s->tpl_thinks && q->reasoning_format != SRV_REASONING_NONE;
    if (split && q->kind == SRV_CHAT) {
        /* but a reply held to a JSON schema or a tool call from its first byte writes no
         * thinking (a GBNF grammar may: it is the client's to say) */
        int held = q->grammar && !q->grammar_trigger && !q->grammar_gbnf;
        q->think = srv_think_prompt_open(text, len) && !held ? SRV_THINK_OPEN : SRV_THINK_ON;
    }
    rc = 0;
out:
    kwk_string_free(text);
    free(ctx_text);
    json_decref(ctx);
    return rc;
}

/* The prompt ids of a request into *ids (library-allocated unless the request carried ids). */
static int prompt_ids(struct srv *s, struct srv_req *q, int32_t **ids, size_t *n, int *own,
                      struct srv_err *e)
{
    *own = 1;
    if (q->messages)
        return chat_ids(s, q, ids, n, e);
    if (q->prompt_ids) {
        *ids = q->prompt_ids;
        *n = (size_t)q->n_prompt_ids;
        *own = 0;
        return 0;
    }
    int st = kwk_tokenizer_encode_alloc(s->tok, q->prompt, q->prompt_len, q->add_special_tokens,
                                        ids, n);
    if (st < 0) {
        srv_err_set(e, 500, "server_error", NULL, NULL, "tokenizing: %s", kwk_status_str(st));
        return -1;
    }
    return 0;
}

static int check_length(struct srv *s, struct srv_req *q, size_t n, int *max_new,
                        struct srv_err *e)
{
    size_t ctx = (size_t)s->lim.max_cache_len;
    if (n == 0) {
        srv_err_set(e, 400, "invalid_request_error", q->kind == SRV_CHAT ? "messages" : "prompt",
                    "invalid_value", "the prompt is empty");
        return -1;
    }
    if (n >= ctx || (q->max_tokens > 0 && n + (size_t)q->max_tokens > ctx)) {
        srv_err_set(e, 400, "invalid_request_error", q->kind == SRV_CHAT ? "messages" : "prompt",
                    "context_length_exceeded",
                    "This model's maximum context length is %zu tokens. However, you requested "
                    "%zu tokens (%zu in the prompt, %d for the completion).",
                    ctx, n + (size_t)(q->max_tokens > 0 ? q->max_tokens : 1), n,
                    q->max_tokens > 0 ? q->max_tokens : 1);
        return -1;
    }
    *max_new = q->max_tokens >= 0 ? q->max_tokens : (int)(ctx - n); /* 0: echo alone */
    return 0;
}

static uint64_t random_seed(void)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return seed;
}

/* pres: room for the request's preserved ids (SRV_MAX_PRESERVED + 2), eos for its eos ids
 * (the model's 8 and SRV_MAX_STOP_IDS), which p points into. */
static void gen_params(struct srv *s, const struct srv_req *q, int max_new,
                       struct kwk_gen_params *p, int32_t *pres, int32_t *eos)
{
    kwk_gen_params_init(p);
    p->max_new_tokens = max_new;
    struct kwk_sampler_params *sp = &p->sampling;
    kwk_sampler_params_init(sp);
    sp->do_sample = q->sample;
    sp->temperature = q->temperature;
    sp->top_k = q->top_k; /* OpenAI has no top-k: off unless asked */
    sp->top_p = q->top_p;
    sp->min_p = q->min_p;
    sp->presence_penalty = q->presence_penalty;
    sp->frequency_penalty = q->frequency_penalty;
    sp->repetition_penalty = q->repetition_penalty;
    sp->min_new_tokens = q->min_tokens; /* holds back every eos id below: stop_token_ids too */
    sp->seed = q->seed_given ? q->seed : random_seed();
    p->logit_bias_ids = q->bias_ids;
    p->logit_bias = q->bias;
    p->n_logit_bias = q->n_bias;
    /* the model's eos ids (unless ignore_eos), then stop_token_ids */
    int n_eos = q->ignore_eos ? 0 : s->n_eos;
    memcpy(eos, s->eos, sizeof(int32_t) * (size_t)n_eos);
    memcpy(eos + n_eos, q->stop_ids, sizeof(int32_t) * (size_t)q->n_stop_ids);
    p->eos_ids = eos;
    p->n_eos = n_eos + q->n_stop_ids;
    p->stop = (const char *const *)q->stop;
    p->n_stop = q->n_stop;
    p->tok = s->tok;
    p->prompt_cache = 1;
    p->top_logprobs = q->logprobs ? q->top_logprobs : 0;
    p->grammar = q->grammar;
    p->grammar_vocab = s->gvocab;
    p->grammar_trigger = q->grammar_trigger;
    /* a reply split at its think block: a call drafted inside the block is thinking, so the
     * calls' trigger is looked for after it (the block the prompt opened, or one the reply
     * opens); the tags add their bytes, being preserved below where special */
    if (q->grammar_trigger && q->think) {
        p->think_open = q->think == SRV_THINK_OPEN ? NULL : "<think>";
        p->think_close = "</think>";
    }
    /* a reply read for calls keeps its format's markers, special tokens or not; one split at
     * its think block keeps the block's tags */
    int tools = q->tools && q->tool_format == s->lim.tool_format;
    if (tools) {
        p->n_preserved = srv_tool_preserved_req(q, s->tok, q->think ? s->preserved_all
                                                                    : s->preserved,
                                                q->think ? s->n_preserved_all : s->n_preserved,
                                                pres);
        p->preserved_ids = pres;
    } else if (q->think) {
        p->preserved_ids = s->think_ids;
        p->n_preserved = s->n_think_ids;
    }
}

/* Completions' echo: the prompt's text (as given, or its ids decoded) and its ids, kept for the
 * reply. 0, or -1 with e. */
static int echo_prompt(struct rq *r, const int32_t *ids, size_t n, struct srv_err *e)
{
    const struct srv_req *q = &r->req;
    if (!(r->echo_ids = malloc(sizeof(int32_t) * n)))
        return srv_err_oom(e);
    memcpy(r->echo_ids, ids, sizeof(int32_t) * n);
    r->n_echo_ids = (int)n;
    if (q->prompt) {
        r->echo_text = srv_dup_n(q->prompt, q->prompt_len);
        r->echo_len = q->prompt_len;
        return r->echo_text ? 0 : srv_err_oom(e);
    }
    /* ids given: their text, special tokens included (the prompt is what was read) */
    char *text = NULL;
    size_t len = 0;
    int st = kwk_tokenizer_decode_alloc(r->s->tok, ids, n, 0, &text, &len);
    if (st < 0) {
        srv_err_set(e, 500, "server_error", NULL, NULL, "decoding the prompt: %s",
                    kwk_status_str(st));
        return -1;
    }
    r->echo_text = srv_dup_n(text, len);
    r->echo_len = len;
    kwk_tokenizer_mem_free(text);
    return r->echo_text ? 0 : srv_err_oom(e);
}

/* Choice i's seed: choice 0 has the request's own (or a random one), so that one choice is
 * sampled as before; the others one mixed from it (splitmix64), so that a seeded request's
 * choices differ from each other and repeat from call to call. */
static uint64_t choice_seed(uint64_t seed, int i)
{
    if (i == 0)
        return seed;
    uint64_t z = seed + (uint64_t)i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One engine request per choice (req.best_of of them), all of the same prompt: the engine reads
 * it once and copies it to the others. When one is refused the request fails; those already
 * submitted are canceled when the connection closes after the error. */
static int submit(struct rq *r, const int32_t *ids, size_t n, int max_new, struct srv_err *e)
{
    struct srv *s = r->s;
    struct kwk_gen_params p;
    struct kwk_err err = {0};
    int32_t pres[SRV_MAX_PRESERVED + 2]; /* the engine copies them at submit */
    int32_t eos[8 + SRV_MAX_STOP_IDS];
    int n_ch = r->req.best_of, i = 0;
    int room = s->o->engine.max_queue > 0 ? s->o->engine.max_queue : 4096; /* the engine's */
    if (n_ch > room) { /* the choices are queued together: they never fit, busy or not */
        const char *key = r->req.best_of > r->req.n ? "best_of" : "n";
        srv_err_set(e, 400, "invalid_request_error", key, "invalid_value",
                    "'%s' (%d) is more than this server queues at once (--max-queue %d)", key,
                    n_ch, room);
        return -1;
    }
    if (!(r->ch = calloc((size_t)n_ch, sizeof *r->ch)))
        return srv_err_oom(e);
    gen_params(s, &r->req, max_new, &p, pres, eos);
    uint64_t seed = p.sampling.seed;
    pthread_mutex_lock(&r->mu);
    r->refs += n_ch; /* the engine's, one dropped at each DONE */
    r->n_ch = n_ch;
    pthread_mutex_unlock(&r->mu);
    r->t_submit = now_s();
    pthread_mutex_lock(&s->mu);
    for (; i < n_ch; i++) {
        struct rq_choice *ch = &r->ch[i];
        ch->r = r;
        ch->index = i;
        p.sampling.seed = choice_seed(seed, i);
        /* echo with logprobs: choice 0 reads the prompt whole for its tokens' logprobs, the
         * others copy it from its slot */
        p.prompt_logprobs = i == 0 && r->req.echo && r->req.logprobs;
        if (s->closing || atomic_load(&s->met.draining)) {
            err.code = KWK_ECANCELED;
            break;
        }
        if (!(ch->eid = kwk_engine_submit(s->e, ids, (int)n, &p, on_event, ch, &err)))
            break;
    }
    pthread_mutex_unlock(&s->mu);
    if (i > 0) {
        r->counted = 1;
        atomic_fetch_add(&s->met.in_flight, 1);
    }
    if (i == n_ch)
        return 0;
    /* no event will come for choices i..: the connection still holds r */
    pthread_mutex_lock(&r->mu);
    r->refs -= n_ch - i;
    r->n_ch = i;
    r->done = r->n_done == i;
    pthread_mutex_unlock(&r->mu);
    if (err.code == KWK_EARG || err.code == KWK_ERANGE)
        srv_err_set(e, 400, "invalid_request_error", NULL, "invalid_value", "%s", err.msg);
    else if (err.code == KWK_ELIMIT || err.code == KWK_ECANCELED)
        srv_err_set(e, 503, "server_error", NULL, "server_busy",
                    "the server is busy or shutting down: %s",
                    err.msg[0] ? err.msg : kwk_status_str(err.code));
    else
        srv_err_set(e, 500, "server_error", NULL, NULL, "%s",
                    err.msg[0] ? err.msg : kwk_status_str(err.code));
    return -1;
}

/* ---- POST routes ----------------------------------------------------------------------------- */

static void init_ctx(struct rq *r)
{
    struct srv *s = r->s;
    uint64_t n = atomic_fetch_add_explicit(&s->next_id, 1, memory_order_relaxed);
    snprintf(r->id, sizeof r->id, "%s-%016llx", r->route == R_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)((n * 0x9e3779b97f4a7c15ull) ^ s->id_salt));
    r->ctx.kind = r->req.kind;
    r->ctx.id = r->id;
    r->ctx.created = (int64_t)time(NULL);
    r->ctx.model = s->model_id;
    r->ctx.tok = s->tok;
    r->ctx.logprobs = r->req.logprobs;
    r->ctx.top_logprobs = r->req.top_logprobs;
    r->ctx.include_usage = r->req.include_usage;
    r->call_seed = (n * 0xbf58476d1ce4e5b9ull) ^ s->id_salt;
    for (int i = 0; r->ch && i < r->req.best_of; i++) {
        r->ch[i].ctx = r->ctx;
        r->ch[i].ctx.index = i;
    }
}

/* /tokenize and /detokenize: answered here, on the event-loop thread, as a completion's prompt
 * is tokenized; nothing reaches the engine. */
static enum MHD_Result tokenize_answer(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_err e;
    struct srv_buf b = {0};
    enum MHD_Result rc;
    if (r->route == R_DETOKENIZE) {
        char *text = NULL;
        size_t len = 0;
        int st = kwk_tokenizer_decode_alloc(s->tok, r->req.prompt_ids,
                                            (size_t)r->req.n_prompt_ids, 0, &text, &len);
        /* the model's vocabulary may be padded past the tokenizer's */
        if (st == KWK_ERANGE)
            return fail(r, 400, "invalid_request_error", "tokens", "invalid_value",
                        "'tokens' has an id the tokenizer does not have");
        if (st < 0)
            return fail(r, 500, "server_error", NULL, NULL, kwk_status_str(st));
        srv_text_response(&b, text, len);
        kwk_tokenizer_mem_free(text);
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        int own = 0;
        if (prompt_ids(s, &r->req, &ids, &n, &own, &e))
            return respond_err(r, &e);
        srv_tokens_response(&b, ids, n, s->lim.max_cache_len,
                            r->req.return_token_strs ? s->tok : NULL);
        if (own)
            kwk_tokenizer_mem_free(ids);
    }
    rc = respond_json(r, 200, &b);
    srv_buf_free(&b);
    return rc;
}

/* ---- /v1/embeddings (event-loop thread; embed_prepare and embed_done on the encoder
 * worker's) ---------------------------------------------------------------------------------- */

/* The worker ended r's job: as on_event's DONE, copy and wake. */
static void embed_done(struct srv_embed_job *j, int status, const char *msg)
{
    struct rq *r = j->user;
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    r->estatus = status;
    if (status && msg)
        snprintf(r->err_msg, sizeof r->err_msg, "%s", msg);
    rq_wake_unlock(r, 1, --r->refs == 0);
}

static int encode_text(void *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                       size_t *n)
{
    return kwk_tokenizer_encode(tok, text, len, 1, ids, cap, n);
}

/* Worker's thread, in a prepare hook once r->job's ids, offs, n_seqs (and types) are filled:
 * its output into r->vec of width floats a sequence, and the tokens counted. 0, or -1 with
 * r->job.err. */
static int job_out(struct rq *r, size_t width)
{
    size_t n = (size_t)r->job.n_seqs * width;
    if (!(r->vec = malloc(sizeof(float) * (n ? n : 1))))
        return srv_err_oom(&r->job.err);
    r->job.out = r->vec;
    r->n_prompt = r->job.offs[r->job.n_seqs];
    return 0;
}

/* Hand r's request to the worker, r->job = {.prepare, .classify} (prepare tokenizes there);
 * 0, or -1 with e (503 when the queue is full or the server is stopping). */
static int job_submit(struct rq *r, struct srv_err *e)
{
    struct srv *s = r->s;
    r->job.done = embed_done;
    r->job.user = r;
    pthread_mutex_lock(&r->mu);
    r->refs++; /* the worker's, dropped in embed_done */
    pthread_mutex_unlock(&r->mu);
    int st = KWK_ECANCELED;
    pthread_mutex_lock(&s->mu);
    if (!s->closing && !atomic_load(&s->met.draining))
        st = srv_embedq_submit(s->eq, &r->job);
    pthread_mutex_unlock(&s->mu);
    if (st == 0) {
        r->counted = 1;
        atomic_fetch_add(&s->met.in_flight, 1);
        return 0;
    }
    r->job.done = NULL;
    rq_unref(r); /* the worker never saw it: the connection still holds r */
    srv_err_set(e, 503, "server_error", NULL, "server_busy", "%s",
                st == KWK_ELIMIT ? "the server is busy: too many requests are waiting for the "
                                   "encoder (--max-queue)"
                                 : "the server is shutting down");
    return -1;
}

/* Worker's thread: r's inputs to token ids (the errors srv_embed_pack gives). */
static int embed_prepare(struct srv_embed_job *j)
{
    struct rq *r = j->user;
    struct srv *s = r->s;
    struct srv_embed_req *q = &r->ereq;
    if (srv_embed_pack(q, encode_text, s->tok, &s->elim, &j->err))
        return -1;
    j->ids = q->ids;
    j->offs = q->offs;
    j->n_seqs = q->n_in;
    return job_out(r, (size_t)s->elim.dim);
}

/* The model named by a request (NULL: none, as /v1/rerank allows) is the one served: else a
 * 404 into e. */
static int model_ok(const struct srv *s, const char *model, struct srv_err *e)
{
    if (!model || !strcmp(model, s->model_id) || !strcmp(model, s->model_path))
        return 1;
    srv_err_set(e, 404, "invalid_request_error", "model", "model_not_found",
                "The model '%.128s' does not exist; this server serves '%.128s'", model,
                s->model_id);
    return 0;
}

static enum MHD_Result embed_route(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_err e;
    if (!s->enc) /* vLLM answers a generative model's embeddings request so too */
        return fail(r, 400, "invalid_request_error", "model", "model_not_supported",
                    "This model does not make embeddings: it is a generative model; use "
                    "/v1/chat/completions or /v1/completions");
    if (srv_embed_parse(&r->ereq, r->body.p ? r->body.p : "", r->body.len, &s->elim, &e))
        return respond_err(r, &e);
    srv_buf_free(&r->body);
    if (!model_ok(s, r->ereq.model, &e))
        return respond_err(r, &e);
    r->job = (struct srv_embed_job){.prepare = embed_prepare};
    if (job_submit(r, &e))
        return respond_err(r, &e);
    r->state = RQ_WAIT;
    return answer(r);
}

/* The answer to an encoder job the worker ended with an error: its prepare's (the request's
 * texts refused), 503 when it was cancelled (shutdown), else 500 naming what failed. */
static enum MHD_Result encoder_job_failed(struct rq *r, const char *what)
{
    struct srv_err e;
    if (r->job.err.http)
        return respond_err(r, &r->job.err);
    if (r->estatus == KWK_ECANCELED)
        srv_err_set(&e, 503, "server_error", NULL, "server_busy", "%s", r->err_msg);
    else
        srv_err_set(&e, 500, "server_error", NULL, NULL, "%s failed: %s", what,
                    r->err_msg[0] ? r->err_msg : kwk_status_str(r->estatus));
    return respond_err(r, &e);
}

/* The worker has ended the job: after embed_done it no longer touches r. */
static enum MHD_Result embed_reply(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_metrics *m = &s->met;
    if (r->estatus)
        return encoder_job_failed(r, "embedding");
    struct srv_buf b = {0};
    srv_embed_response(&b, s->model_id, r->vec, r->ereq.n_in, s->elim.dim, r->ereq.base64,
                       r->n_prompt);
    atomic_fetch_add_explicit(&m->prompt_tokens, (uint64_t)r->n_prompt, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->embed_requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->embed_inputs, (uint64_t)r->ereq.n_in, memory_order_relaxed);
    enum MHD_Result rc = respond_json(r, 200, &b);
    srv_buf_free(&b);
    return rc;
}

/* ---- /v1/rerank (event-loop thread; the pairs are tokenized and run on the encoder worker's) - */

int srv_encode_pair(void *pair_enc, const char *a, size_t na, const char *b, size_t nb,
                    int32_t *ids, int32_t *types, size_t cap, size_t *n)
{
    struct srv_pair_enc *pe = pair_enc;
    int32_t *ib = NULL, *pi = NULL, *pt = NULL;
    size_t lb = 0;
    int st = 0;
    *n = 0;
    if (!pe->ia || pe->a != a || pe->na != na) {
        srv_pair_enc_free(pe);
        if ((st = kwk_tokenizer_encode_alloc(pe->tok, a, na, 0, &pe->ia, &pe->la)))
            return st;
        pe->a = a;
        pe->na = na;
    }
    if (!(st = kwk_tokenizer_encode_alloc(pe->tok, b, nb, 0, &ib, &lb)))
        st = kwk_tokenizer_join_pair(pe->tok, pe->ia, pe->la, ib, lb, cap, &pi, &pt, n);
    if (st == 0 && *n <= cap) {
        memcpy(ids, pi, sizeof(int32_t) * *n);
        memcpy(types, pt, sizeof(int32_t) * *n);
    }
    kwk_tokenizer_mem_free(ib);
    kwk_tokenizer_mem_free(pi);
    kwk_tokenizer_mem_free(pt);
    return st;
}

void srv_pair_enc_free(struct srv_pair_enc *pe)
{
    kwk_tokenizer_mem_free(pe->ia);
    pe->ia = NULL;
    pe->a = NULL;
    pe->na = pe->la = 0;
}

/* Why this server cannot rerank, or NULL when it can (an encoder with one label). */
static const char *rerank_refusal(const struct srv *s)
{
    if (!s->enc) /* as /v1/embeddings answers a generative model */
        return "This model does not rerank: it is a generative model; use /v1/chat/completions "
               "or /v1/completions";
    if (s->n_labels == 0)
        return "This model cannot rerank: it is an embedding model without a classification "
               "head (a reranker is a cross-encoder, e.g. a *ForSequenceClassification "
               "checkpoint with one label); use /v1/embeddings";
    if (s->n_labels > 1)
        return "This model cannot rerank: its classification head has more than one label (a "
               "reranker's has one relevance logit)";
    if (!s->pair_ok)
        return "This model cannot rerank: its tokenizer has no pair form to join a query and a "
               "document (a TemplateProcessing without \"pair\", or two post-processors that "
               "add tokens)";
    return NULL;
}

/* Worker's thread: the (query, document) pairs to token ids. */
static int rerank_prepare(struct srv_embed_job *j)
{
    struct rq *r = j->user;
    struct srv *s = r->s;
    struct srv_rerank_req *q = &r->rreq;
    struct srv_pair_enc pe = {.tok = s->tok};
    int packed = srv_rerank_pack(q, srv_encode_pair, &pe, s->elim.max_tokens, &j->err);
    srv_pair_enc_free(&pe);
    if (packed)
        return -1;
    j->ids = q->ids;
    j->types = q->types;
    j->offs = q->offs;
    j->n_seqs = q->n_docs;
    return job_out(r, 1);
}

static enum MHD_Result rerank_route(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_rerank_req *q = &r->rreq;
    struct srv_err e;
    const char *no = rerank_refusal(s);
    if (no)
        return fail(r, 400, "invalid_request_error", "model", "model_not_supported", no);
    if (srv_rerank_parse(q, r->body.p ? r->body.p : "", r->body.len, &e))
        return respond_err(r, &e);
    srv_buf_free(&r->body);
    if (!model_ok(s, q->model, &e))
        return respond_err(r, &e);
    r->job = (struct srv_embed_job){.prepare = rerank_prepare, .classify = 1};
    if (job_submit(r, &e))
        return respond_err(r, &e);
    r->state = RQ_WAIT;
    return answer(r);
}

/* r->id: prefix and a number no other reply of this server has. */
static void reply_id(struct rq *r, const char *prefix)
{
    struct srv *s = r->s;
    uint64_t n = atomic_fetch_add_explicit(&s->next_id, 1, memory_order_relaxed);
    snprintf(r->id, sizeof r->id, "%s-%016llx", prefix,
             (unsigned long long)((n * 0x9e3779b97f4a7c15ull) ^ s->id_salt));
}

/* The worker has ended the job: after embed_done it no longer touches r. */
static enum MHD_Result rerank_reply(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_metrics *m = &s->met;
    if (r->estatus)
        return encoder_job_failed(r, "reranking");
    reply_id(r, "rerank");
    srv_rerank_scores(r->vec, r->rreq.n_docs, s->score_act);
    struct srv_buf b = {0};
    srv_rerank_response(&b, r->id, s->model_id, &r->rreq, r->vec);
    atomic_fetch_add_explicit(&m->prompt_tokens, (uint64_t)r->n_prompt, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->rerank_requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->rerank_documents, (uint64_t)r->rreq.n_docs,
                              memory_order_relaxed);
    enum MHD_Result rc = respond_json(r, 200, &b);
    srv_buf_free(&b);
    return rc;
}

/* ---- /v1/score and /v1/classify (event-loop thread; tokenizing and the model on the encoder
 * worker's) --------------------------------------------------------------------------------- */

/* Why this server cannot answer /score, or NULL: a cross-encoder of one label scores each pair
 * with its head, an embedding model by the cosine of the two texts' embeddings (vLLM's). */
static const char *score_refusal(const struct srv *s)
{
    if (!s->enc)
        return "This model does not score: it is a generative model; use /v1/chat/completions "
               "or /v1/completions";
    if (s->n_labels > 1)
        return "This model cannot score pairs: its classification head has more than one "
               "label (a cross-encoder's has one relevance logit); use /v1/classify";
    if (s->n_labels == 1 && !s->pair_ok)
        return "This model cannot score pairs: its tokenizer has no pair form to join two texts";
    return NULL;
}

/* Worker's thread: the request's token ids into r->job, a cross-encoder's pairs or an
 * embedding model's distinct texts, truncated as r->trunc says. */
static int score_prepare(struct srv_embed_job *j)
{
    struct rq *r = j->user;
    struct srv *s = r->s;
    struct srv_score_req *q = &r->sreq;
    const struct srv_trunc *t = &r->trunc;
    if (!s->n_labels) {
        if (srv_score_pack_texts(q, t->strict ? encode_text : srv_encode_truncated, s->tok, t,
                                 &j->err))
            return -1;
        j->ids = q->uniq.ids;
        j->offs = q->uniq.offs;
        j->n_seqs = q->uniq.n_in;
        return job_out(r, (size_t)s->elim.dim);
    }
    struct srv_pair_enc pe = {.tok = s->tok};
    int rc = srv_score_pack_pairs(q, srv_encode_pair, &pe, t, &j->err);
    srv_pair_enc_free(&pe);
    if (rc)
        return -1;
    j->ids = q->pairs.ids;
    j->types = q->pairs.types;
    j->offs = q->pairs.offs;
    j->n_seqs = q->n_b;
    return job_out(r, 1);
}

static enum MHD_Result score_route(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_score_req *q = &r->sreq;
    struct srv_err e;
    const char *no = score_refusal(s);
    if (no)
        return fail(r, 400, "invalid_request_error", "model", "model_not_supported", no);
    if (srv_score_parse(q, r->body.p ? r->body.p : "", r->body.len, &e))
        return respond_err(r, &e);
    srv_buf_free(&r->body);
    if (!model_ok(s, q->model, &e) ||
        srv_trunc_resolve(q->truncate, s->elim.max_tokens, &r->trunc, &e))
        return respond_err(r, &e);
    r->job = (struct srv_embed_job){.prepare = score_prepare, .classify = s->n_labels > 0};
    if (job_submit(r, &e))
        return respond_err(r, &e);
    r->state = RQ_WAIT;
    return answer(r);
}

/* The worker has ended the job: after embed_done it no longer touches r. */
static enum MHD_Result score_reply(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_score_req *q = &r->sreq;
    float *scores = r->vec, *cos = NULL;
    if (r->estatus)
        return encoder_job_failed(r, "scoring");
    if (s->n_labels)
        srv_rerank_scores(r->vec, q->n_b, q->use_activation ? s->score_act : KWK_SCORE_IDENTITY);
    else if ((scores = cos = malloc(sizeof(float) * (size_t)q->n_b)))
        srv_score_cosines(q, r->vec, s->elim.dim, cos);
    if (!scores)
        return fail(r, 500, "server_error", NULL, NULL, "out of memory");
    reply_id(r, "score");
    struct srv_buf b = {0};
    srv_score_response(&b, r->id, (int64_t)time(NULL), s->model_id, scores, q->n_b,
                       r->n_prompt);
    atomic_fetch_add_explicit(&s->met.prompt_tokens, (uint64_t)r->n_prompt,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->met.score_requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->met.score_pairs, (uint64_t)q->n_b, memory_order_relaxed);
    enum MHD_Result rc = respond_json(r, 200, &b);
    srv_buf_free(&b);
    free(cos);
    return rc;
}

/* Worker's thread: the inputs to token ids, truncated as r->trunc says. */
static int classify_prepare(struct srv_embed_job *j)
{
    struct rq *r = j->user;
    struct srv *s = r->s;
    struct srv_classify_req *q = &r->creq;
    const struct srv_trunc *t = &r->trunc;
    if (srv_classify_pack(q, t->strict ? encode_text : srv_encode_truncated, s->tok, t,
                          &j->err))
        return -1;
    j->ids = q->in.ids;
    j->offs = q->in.offs;
    j->n_seqs = q->in.n_in;
    return job_out(r, (size_t)s->n_labels);
}

static enum MHD_Result classify_route(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_classify_req *q = &r->creq;
    struct srv_err e;
    if (!s->enc) /* as /v1/embeddings answers a generative model */
        return fail(r, 400, "invalid_request_error", "model", "model_not_supported",
                    "This model does not classify: it is a generative model; use "
                    "/v1/chat/completions or /v1/completions");
    if (!s->n_labels)
        return fail(r, 400, "invalid_request_error", "model", "model_not_supported",
                    "This model cannot classify: it is an embedding model without a "
                    "classification head (a *ForSequenceClassification checkpoint); use "
                    "/v1/embeddings");
    if (srv_classify_parse(q, r->body.p ? r->body.p : "", r->body.len, &s->elim, &e))
        return respond_err(r, &e);
    srv_buf_free(&r->body);
    if (!model_ok(s, q->in.model, &e) ||
        srv_trunc_resolve(q->truncate, s->elim.max_tokens, &r->trunc, &e))
        return respond_err(r, &e);
    r->job = (struct srv_embed_job){.prepare = classify_prepare, .classify = 1};
    if (job_submit(r, &e))
        return respond_err(r, &e);
    r->state = RQ_WAIT;
    return answer(r);
}

/* The worker has ended the job: after embed_done it no longer touches r. */
static enum MHD_Result classify_reply(struct rq *r)
{
    struct srv *s = r->s;
    if (r->estatus)
        return encoder_job_failed(r, "classifying");
    reply_id(r, "classify");
    struct srv_buf b = {0};
    srv_classify_response(&b, r->id, (int64_t)time(NULL), s->model_id, &s->labels, r->vec,
                          r->creq.in.n_in, r->creq.use_activation, r->n_prompt);
    atomic_fetch_add_explicit(&s->met.prompt_tokens, (uint64_t)r->n_prompt,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&s->met.classify_requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->met.classify_inputs, (uint64_t)r->creq.in.n_in,
                              memory_order_relaxed);
    enum MHD_Result rc = respond_json(r, 200, &b);
    srv_buf_free(&b);
    return rc;
}

static enum MHD_Result body_done(struct rq *r)
{
    struct srv *s = r->s;
    struct srv_err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int own = 0, max_new = 0;
    enum MHD_Result rc;
    if (r->too_large) {
        srv_err_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                    "the request body is larger than %zu bytes", s->o->max_body);
        return respond_err(r, &e);
    }
    if (r->route == R_EMBED)
        return embed_route(r);
    if (r->route == R_RERANK)
        return rerank_route(r);
    if (r->route == R_SCORE)
        return score_route(r);
    if (r->route == R_CLASSIFY)
        return classify_route(r);
    if (s->enc && (r->route == R_CHAT || r->route == R_COMPLETION)) {
        srv_err_set(&e, 400, "invalid_request_error", "model", "model_not_supported",
                    "The model '%.128s' is an embedding model: it does not generate text; use "
                    "%s", s->model_id,
                    s->n_labels == 1 ? "/v1/rerank, /v1/score or /v1/embeddings"
                    : s->n_labels    ? "/v1/classify or /v1/embeddings"
                                     : "/v1/embeddings or /v1/score");
        return respond_err(r, &e);
    }
    static const int kinds[] = {[R_CHAT] = SRV_CHAT, [R_COMPLETION] = SRV_COMPLETION,
                                [R_TOKENIZE] = SRV_TOKENIZE, [R_DETOKENIZE] = SRV_DETOKENIZE};
    if (srv_req_parse(&r->req, kinds[r->route], r->body.p ? r->body.p : "", r->body.len,
                      &s->lim, &e))
        return respond_err(r, &e);
    srv_buf_free(&r->body);
    if (r->req.model && strcmp(r->req.model, s->model_id) &&
        strcmp(r->req.model, s->model_path)) {
        srv_err_set(&e, 404, "invalid_request_error", "model", "model_not_found",
                    "The model '%.128s' does not exist; this server serves '%.128s'",
                    r->req.model, s->model_id);
        return respond_err(r, &e);
    }
    if (r->route == R_TOKENIZE || r->route == R_DETOKENIZE)
        return tokenize_answer(r);
    if (prompt_ids(s, &r->req, &ids, &n, &own, &e) || check_length(s, &r->req, n, &max_new, &e) ||
        (r->req.echo && echo_prompt(r, ids, n, &e)) || submit(r, ids, n, max_new, &e)) {
        rc = respond_err(r, &e);
        goto out;
    }
    init_ctx(r);
    if (r->req.stream) {
        rc = start_stream(r);
    } else {
        r->state = RQ_WAIT;
        rc = answer(r);
    }
out:
    if (own)
        kwk_tokenizer_mem_free(ids);
    return rc;
}

static int post_route(const char *path)
{
    if (!strcmp(path, "/v1/chat/completions"))
        return R_CHAT;
    if (!strcmp(path, "/v1/completions"))
        return R_COMPLETION;
    if (!strcmp(path, "/tokenize"))
        return R_TOKENIZE;
    if (!strcmp(path, "/detokenize"))
        return R_DETOKENIZE;
    if (!strcmp(path, "/v1/embeddings"))
        return R_EMBED;
    /* vLLM's and Jina's, Cohere's v2, and llama.cpp's names */
    static const char *const rerank[] = {"/v1/rerank", "/rerank", "/v2/rerank", "/v1/reranking",
                                         "/reranking"};
    for (size_t i = 0; i < sizeof rerank / sizeof rerank[0]; i++)
        if (!strcmp(path, rerank[i]))
            return R_RERANK;
    /* vLLM's names */
    if (!strcmp(path, "/score") || !strcmp(path, "/v1/score"))
        return R_SCORE;
    if (!strcmp(path, "/classify") || !strcmp(path, "/v1/classify"))
        return R_CLASSIFY;
    return R_OTHER;
}

/* Headers are in. MHD keeps a connection alive only when the answer is queued after the whole
 * request was read (an answer queued now discards the body and closes), so every answer waits
 * for the final call but one: a declared body over the limit, refused without reading it. */
static enum MHD_Result first_call(struct rq *r, const char *method)
{
    struct srv *s = r->s;
    r->is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
    r->route = r->is_post ? post_route(r->path) : R_OTHER;
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (r->route != R_OTHER && cl && strtoull(cl, NULL, 10) > s->o->max_body) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes", s->o->max_body);
        return fail(r, 413, "invalid_request_error", NULL, "request_too_large", msg);
    }
    r->state = RQ_BODY;
    return MHD_YES;
}

/* The whole request is read: answer it or hand it to the engine. */
static enum MHD_Result dispatch(struct rq *r)
{
    struct srv *s = r->s;
    int guarded = !strncmp(r->path, "/v1/", 4) || r->route == R_TOKENIZE ||
                  r->route == R_DETOKENIZE || r->route == R_RERANK || r->route == R_SCORE ||
                  r->route == R_CLASSIFY;
    if (guarded && s->o->api_key && s->o->api_key[0]) {
        const char *auth = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                       MHD_HTTP_HEADER_AUTHORIZATION);
        if (!srv_auth_ok(auth, s->o->api_key))
            return fail(r, 401, "authentication_error", NULL, "invalid_api_key",
                        auth ? "Incorrect API key provided"
                             : "You didn't provide an API key: send 'Authorization: Bearer KEY'");
    }
    if (!strcmp(r->method, MHD_HTTP_METHOD_GET) || !strcmp(r->method, MHD_HTTP_METHOD_HEAD))
        return get_route(r);
    if (!r->is_post)
        return fail(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                    "method not allowed");
    if (r->route == R_OTHER)
        return fail(r, 404, "not_found_error", NULL, "not_found", "Not found");
    return body_done(r);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *data,
                                  size_t *size, void **con_cls)
{
    struct srv *s = cls;
    struct rq *r = *con_cls;
    (void)version;
    if (!r) {
        if (!(r = rq_new(s, c, method, url)))
            return MHD_NO;
        *con_cls = r;
        return first_call(r, method);
    }
    switch (r->state) {
    case RQ_BODY:
        if (*size) {
            /* bodies of other routes are read and dropped; over the limit: read on, 413 */
            if (r->body.len + *size > s->o->max_body)
                r->too_large = 1;
            else if (r->route != R_OTHER)
                srv_buf_add(&r->body, data, *size);
            if (r->body.err)
                return MHD_NO;
            *size = 0;
            return MHD_YES;
        }
        return dispatch(r);
    case RQ_WAIT:
        return answer(r);
    default:
        *size = 0;
        return MHD_YES;
    }
}

static void log_request(struct rq *r, enum MHD_RequestTerminationCode toe)
{
    static const char *const why[] = {"", " (error)", " (timeout)", " (shutdown)",
                                      " (read error)", " (client gone)"};
    fprintf(stderr, "%s %s %d tokens=%d ms=%.1f%s\n", r->method, r->path, r->status,
            r->n_tokens, (now_s() - r->t0) * 1e3, (unsigned)toe < 6 ? why[toe] : "");
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct srv *s = cls;
    struct rq *r = *con_cls;
    (void)c;
    if (!r)
        return;
    *con_cls = NULL;
    srv_metrics_status(&s->met, r->status);
    if (r->counted)
        atomic_fetch_sub(&s->met.in_flight, 1);
    pthread_mutex_lock(&r->mu);
    if (s->o->log_requests)
        log_request(r, toe);
    r->conn_gone = 1;
    /* the choices still running (r->ch[i].eid is the event-loop thread's, as this is) */
    uint64_t cancel[SRV_MAX_CHOICES];
    int n_cancel = 0;
    for (int i = 0; i < r->n_ch; i++)
        if (!r->ch[i].done && r->ch[i].eid)
            cancel[n_cancel++] = r->ch[i].eid;
    int drop_job = !r->done && r->job.done; /* an embedding job the worker has not ended */
    if (drop_job) /* under r->mu: the worker's reference keeps r alive until it ends the job */
        atomic_store_explicit(&r->job.canceled, 1, memory_order_relaxed);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (drop_job)
        atomic_fetch_add_explicit(&s->met.client_aborts, 1, memory_order_relaxed);
    if (n_cancel) {
        /* not when the server ended the reply (a failed choice, a refused one at submit) */
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            atomic_fetch_add_explicit(&s->met.client_aborts, 1, memory_order_relaxed);
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < n_cancel && !s->closing; i++)
            kwk_engine_cancel(s->e, cancel[i]);
        pthread_mutex_unlock(&s->mu);
    }
    if (last)
        rq_free(r);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fprintf(stderr, "kwker serve: http: ");
    vfprintf(stderr, fmt, ap);
}

/* ---- start and stop (main thread) ------------------------------------------------------------ */

/* 10,000 idle keep-alive connections need as many descriptors: take the hard limit. */
static rlim_t raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur;
}

/* The bundled default model: models/ under the working directory, else beside the build tree
 * or the installed package that holds this executable. */
static const char *default_model(char *buf, size_t cap)
{
    static const char rel[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(rel, R_OK) == 0)
        return rel;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return rel;
    exe[n] = 0;
    for (int up = 1; up <= 3; up++) {
        char *slash = strrchr(exe, '/');
        if (!slash)
            break;
        *slash = 0;
        snprintf(buf, cap, "%s/%s", exe, rel);
        if (access(buf, R_OK) == 0)
            return buf;
    }
    return rel;
}

void srv_model_id(char *buf, size_t cap, const char *path)
{
    const char *base = strrchr(path, '/');
    base = base && base[1] ? base + 1 : path;
    snprintf(buf, cap, "%.200s", base);
    size_t n = strlen(buf);
    if (n > 5 && !strcmp(buf + n - 5, ".gguf"))
        buf[n - 5] = 0;
}

static void model_name(struct srv *s, const char *path)
{
    if (s->o->model_name)
        snprintf(s->model_id, sizeof s->model_id, "%.200s", s->o->model_name);
    else
        srv_model_id(s->model_id, sizeof s->model_id, path);
}

/* Decoder-only options given for an encoder, or the other way round: refused rather than
 * ignored, so that a command line never means something other than what it says. */
static int check_opts(const struct srv *s, const char *path, int encoder)
{
    const struct srv_opts *o = s->o;
    const char *bad = NULL;
    if (encoder && (o->quant.calib_file || o->quant.gptq || o->quant.mix_bits))
        bad = "--calib, --gptq and --mix-bits";
    else if (encoder && o->quant.kv_bits)
        bad = "--kv-bits";
    else if (encoder && o->engine.max_cache_len)
        bad = "--max-cache-len";
    else if (encoder && o->chat_template_file)
        bad = "--chat-template-file";
    else if (encoder && o->chat_template_kwargs)
        bad = "--chat-template-kwargs";
    else if (!encoder && (o->pooling >= 0 || o->normalize >= 0))
        bad = "--pooling and --normalize";
    if (!bad)
        return 0;
    fprintf(stderr, "kwker serve: %s: %s %s\n", path, bad,
            encoder ? "apply to generative models only; this is an embedding model"
                    : "apply to embedding models only; this is a generative model");
    return -1;
}

/* A classifier's label names and /classify's activation, from config.json beside the weights
 * (a GGUF, or a folder without the file: transformers' defaults LABEL_i). Only out of memory
 * fails. */
/* A GGUF's label names (<arch>.classifier.output_labels, as llama.cpp's converter writes
 * them) as the config.json text {"id2label": {"0": ..., ...}} that srv_labels_parse reads, so
 * both kinds of file pass the same checks; NULL without them (or with any not UTF-8). */
static char *gguf_labels_json(const char *path, int n_labels)
{
    struct kwk_gguf g;
    struct kwk_err err = {0};
    const char *arch = NULL;
    size_t arch_n = 0;
    char key[128], *text = NULL;
    if (kwk_gguf_open(&g, path, &err))
        return NULL;
    const struct kwk_gguf_kv *kv = NULL;
    if (!kwk_gguf_get_str(&g, "general.architecture", &arch, &arch_n) && arch_n < 64) {
        snprintf(key, sizeof key, "%.*s.classifier.output_labels", (int)arch_n, arch);
        kv = kwk_gguf_find(&g, key);
    }
    const char **ptrs = NULL;
    size_t *lens = NULL;
    json_t *root = json_object(), *map = json_object();
    if (!kv || kv->type != KWK_GGUF_ARRAY || kv->arr_type != KWK_GGUF_STRING ||
        kv->arr_len != (uint64_t)n_labels || !root || !map)
        goto out;
    ptrs = malloc(sizeof *ptrs * (size_t)n_labels);
    lens = malloc(sizeof *lens * (size_t)n_labels);
    if (!ptrs || !lens || kwk_gguf_arr_strings(kv, ptrs, lens))
        goto out;
    for (int i = 0; i < n_labels; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", i);
        json_t *name = json_stringn(ptrs[i], lens[i]); /* NULL when not UTF-8 */
        if (!name || json_object_set_new(map, id, name))
            goto out;
    }
    if (!json_object_set(root, "id2label", map))
        text = json_dumps(root, JSON_COMPACT);
out:
    free(ptrs);
    free(lens);
    json_decref(map);
    json_decref(root);
    kwk_gguf_close(&g);
    return text;
}

static int load_labels(struct srv *s, const char *path)
{
    char dir[PATH_MAX], file[PATH_MAX + 16];
    char *text = NULL;
    size_t n = 0;
    struct kwk_err err = {0};
    s->labels.n = s->n_labels;
    if (s->n_labels < 1)
        return 0;
    size_t pl = strlen(path);
    if (pl > 5 && !strcmp(path + pl - 5, ".gguf")) {
        char *json = gguf_labels_json(path, s->n_labels);
        int rc = json ? srv_labels_parse(&s->labels, json, strlen(json), s->n_labels) : 0;
        free(json);
        if (rc)
            fprintf(stderr, "kwker serve: out of memory reading %s's labels\n", path);
        return rc;
    }
    if (kwk_hf_resolve(path, dir, sizeof dir, &err))
        return 0;
    snprintf(file, sizeof file, "%s/config.json", dir);
    if (!kwk_file_exists(file) || kwk_read_file(file, (size_t)16 << 20, &text, &n, &err))
        return 0;
    int rc = srv_labels_parse(&s->labels, text, n, s->n_labels);
    kwk_free(text);
    if (rc)
        fprintf(stderr, "kwker serve: out of memory reading %s\n", file);
    return rc;
}

/* An embedding model: the encoder and its worker thread instead of the engine. No chat
 * template, grammar vocabulary or eos ids: nothing here generates. */
static int load_encoder(struct srv *s, const char *path, const struct kwk_model_info *info)
{
    struct kwk_err err = {0};
    struct kwk_encoder_params p;
    if (check_opts(s, path, 1))
        return -1;
    kwk_encoder_params_init(&p);
    p.n_threads = s->o->engine.n_threads;
    p.precision = s->o->engine.precision;
    p.act_bits = s->o->quant.act_bits;
    p.pooling = s->o->pooling;
    p.normalize = s->o->normalize;
    p.batch_tokens = SRV_EMBED_BATCH_TOKENS;
    if (!(s->enc = kwk_encoder_new(s->m, &p, &err))) {
        fprintf(stderr, "kwker serve: %s: %s\n", path,
                err.msg[0] ? err.msg : kwk_status_str(err.code));
        return -1;
    }
    s->elim.n_vocab = info->n_vocab;
    s->elim.dim = kwk_encoder_dim(s->enc);
    s->elim.max_tokens = kwk_encoder_max_tokens(s->enc);
    s->n_labels = kwk_encoder_n_labels(s->enc);
    int32_t *probe = NULL;
    size_t n_probe = 0;
    s->pair_ok = kwk_tokenizer_join_pair(s->tok, NULL, 0, NULL, 0, 0, &probe, NULL, &n_probe) !=
                 KWK_EUNSUPPORTED;
    kwk_tokenizer_mem_free(probe);
    s->score_act = info->score_act;
    if (load_labels(s, path))
        return -1;
    s->lim.n_vocab = info->n_vocab;
    s->lim.max_cache_len = s->elim.max_tokens; /* /v1/models' and /tokenize's max_model_len */
    /* the encoder raises its batch to hold the longest sequence; so does the worker */
    int batch = s->elim.max_tokens > SRV_EMBED_BATCH_TOKENS ? s->elim.max_tokens
                                                             : SRV_EMBED_BATCH_TOKENS;
    if (!(s->eq = srv_embedq_new(s->enc, batch, s->o->engine.max_queue))) {
        fprintf(stderr, "kwker serve: cannot start the encoder's thread\n");
        return -1;
    }
    return 0;
}

/* The think tags' special tokens, and the tool markers' with them (a request with tools and a
 * think block keeps both; R1's markers hold the tags already). */
static void preserved_think(struct srv *s)
{
    s->n_think_ids = s->tpl_thinks ? srv_think_preserved(s->tok, s->think_ids, 2) : 0;
    memcpy(s->preserved_all, s->preserved, sizeof(int32_t) * (size_t)s->n_preserved);
    s->n_preserved_all = s->n_preserved;
    for (int i = 0; i < s->n_think_ids; i++) {
        int seen = 0;
        for (int k = 0; k < s->n_preserved; k++)
            seen |= s->preserved[k] == s->think_ids[i];
        if (!seen)
            s->preserved_all[s->n_preserved_all++] = s->think_ids[i];
    }
}

static int load(struct srv *s, const char *path)
{
    struct kwk_err err = {0};
    struct kwk_model_info info;
    if (!(s->tok = kwk_tokenizer_load(path, &err)) || !(s->m = kwk_model_load(path, &err)))
        goto fail;
    kwk_model_get_info(s->m, &info);
    if (info.is_encoder)
        return load_encoder(s, path, &info);
    if (check_opts(s, path, 0))
        return -1;
    s->n_eos = info.n_eos < 8 ? info.n_eos : 8;
    memcpy(s->eos, info.eos_ids, sizeof(int32_t) * (size_t)s->n_eos);
    if (s->n_eos == 0) {
        int n = kwk_tokenizer_eos_ids(s->tok, s->eos, 8);
        s->n_eos = n < 0 ? 0 : n > 8 ? 8 : n;
    }
    char *src = NULL;
    if (cli_chat_template(s->tok, s->o->chat_template_file, "serve", &s->tpl, &src))
        return -1;
    /* how the model writes tool calls, read off its template */
    s->lim.tool_format = s->o->tool_format >= 0 ? s->o->tool_format : srv_tool_format_detect(src);
    /* whether it thinks, read off it too (R1's tool format always does) */
    s->tpl_thinks = srv_think_template(src) || s->lim.tool_format == SRV_TOOLS_DEEPSEEK_R1;
    s->think = s->o->reasoning_format != SRV_REASONING_NONE && s->tpl_thinks;
    kwk_free(src);
    if (s->o->chat_template_kwargs &&
        cli_template_kwargs(s->o->chat_template_kwargs, "serve", &s->tpl_kwargs))
        return -1;
    s->n_preserved =
        srv_tool_preserved(s->lim.tool_format, s->tok, s->preserved, SRV_MAX_PRESERVED);
    preserved_think(s);
    /* built here (20-60 ms) rather than by the first constrained request, on the event loop */
    if (!(s->gvocab = kwk_grammar_vocab_new(s->tok, &err)))
        goto fail;
    if (!s->tpl)
        fprintf(stderr, "kwker serve: the model has no chat template: only /v1/completions "
                        "(--chat-template-file gives one)\n");
    s->lim.n_vocab = info.n_vocab;
    s->lim.max_cache_len = s->o->engine.max_cache_len;
    if (!s->lim.max_cache_len) /* the engine's default */
        s->lim.max_cache_len =
            info.max_position > 0 && info.max_position < 4096 ? info.max_position : 4096;
    struct kwk_engine_params ep = s->o->engine;
    ep.max_cache_len = s->lim.max_cache_len;
    struct cli_quant *q = (struct cli_quant *)&s->o->quant;
    if (cli_quant_load(q, path, "serve"))
        return -1;
    ep.mix_bits = q->mix_bits;
    ep.calib = q->ids;
    ep.n_calib = (int64_t)q->n_ids;
    ep.gptq = q->gptq;
    ep.act_bits = q->act_bits;
    ep.kv_bits = q->kv_bits;
    if (!(s->e = kwk_engine_new(s->m, &ep, &err)) || kwk_engine_start(s->e, &err))
        goto fail;
    return 0;
fail:
    fprintf(stderr, "kwker serve: %s: %s\n", path,
            err.msg[0] ? err.msg : kwk_status_str(err.code));
    return -1;
}

static struct MHD_Daemon *start_daemon(struct srv *s, unsigned max_conn)
{
    const struct srv_opts *o = s->o;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) {
        fprintf(stderr, "kwker serve: --host %s: %s\n", o->host, gai_strerror(gai));
        return NULL;
    }
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, s,
        /* the logger first, as MHD wants, so its messages all carry our prefix */
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, max_conn, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)o->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, o->max_header,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d)
        fprintf(stderr, "kwker serve: cannot listen on %s:%d (%s)\n", o->host, o->port,
                strerror(errno));
    return d;
}

/* After the first SIGINT / SIGTERM: close the listening socket (new connections are refused,
 * which proxies and load balancers retry elsewhere), answer new requests on open connections
 * with 503, and wait up to o->shutdown_timeout_s for the requests in flight (queued ones too)
 * to be answered in full. A second signal ends the wait. Rolling restarts lose no request that
 * finishes within the grace period. */
static void drain(struct srv *s, const sigset_t *set)
{
    int limit = s->o->shutdown_timeout_s;
    atomic_store(&s->met.draining, 1);
    MHD_socket ls = MHD_quiesce_daemon(s->d);
    if (ls != MHD_INVALID_SOCKET)
        close(ls);
    int n = atomic_load(&s->met.in_flight);
    if (!n)
        return;
    fprintf(stderr, "kwker serve: finishing %d request%s in flight (up to %d s; signal again to "
                    "stop now)\n", n, n == 1 ? "" : "s", limit);
    double deadline = now_s() + limit;
    const struct timespec tick = {0, 50 * 1000 * 1000};
    while ((n = atomic_load(&s->met.in_flight)) > 0) {
        if (now_s() >= deadline) {
            fprintf(stderr, "kwker serve: %d request%s still running after %d s: canceling\n",
                    n, n == 1 ? "" : "s", limit);
            return;
        }
        if (sigtimedwait(set, NULL, &tick) > 0) {
            fprintf(stderr, "kwker serve: second signal: canceling %d request%s\n", n,
                    n == 1 ? "" : "s");
            return;
        }
    }
}

/* Stop taking requests, end the ones in flight (their DONE events resume every suspended
 * connection, as MHD_stop_daemon requires), then close the connections. */
static void shutdown_all(struct srv *s)
{
    if (s->d)
        MHD_quiesce_daemon(s->d);
    pthread_mutex_lock(&s->mu);
    s->closing = 1;
    pthread_mutex_unlock(&s->mu);
    kwk_engine_free(s->e);
    s->e = NULL;
    srv_embedq_free(s->eq); /* queued jobs end CANCELED, resuming their connections */
    s->eq = NULL;
    if (s->d) {
        usleep(200 * 1000); /* let the loop write the final chunks it was woken for */
        MHD_stop_daemon(s->d);
    }
    kwk_encoder_free(s->enc);
    srv_labels_free(&s->labels);
    kwk_template_free(s->tpl);
    json_decref(s->tpl_kwargs);
    kwk_grammar_vocab_free(s->gvocab);
    kwk_tokenizer_free(s->tok);
    kwk_model_free(s->m);
}

int srv_run(const struct srv_opts *o)
{
    struct srv *s = calloc(1, sizeof *s);
    char buf[PATH_MAX + 64];
    int sig = 0, rc = 1;
    sigset_t set;
    if (!s)
        return 1;
    s->o = o;
    s->created = (int64_t)time(NULL);
    s->id_salt = random_seed();
    pthread_mutex_init(&s->mu, NULL);
    /* before any thread starts, so every thread inherits the mask and sigwait gets them */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    rlim_t nofile = raise_nofile();
    unsigned max_conn = o->max_connections > 0 ? (unsigned)o->max_connections
                        : nofile > 128 ? (unsigned)(nofile - 64 > 1000000 ? 1000000 : nofile - 64)
                                       : 64u;
    const char *path = o->model ? o->model : default_model(buf, sizeof buf);
    s->model_path = path;
    model_name(s, path);
    if (load(s, path))
        goto out;
    if (!(s->d = start_daemon(s, max_conn)))
        goto out;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    if (s->enc && s->n_labels == 1 && s->pair_ok)
        fprintf(stderr, "kwker serve: listening on http://%s:%u (reranker %s: /v1/rerank, "
                        "/v1/score and /v1/embeddings, up to %d tokens a pair or input, %u "
                        "connections)\n",
                o->host, di ? di->port : (unsigned)o->port, s->model_id, s->elim.max_tokens,
                max_conn);
    else if (s->enc && s->n_labels)
        fprintf(stderr, "kwker serve: listening on http://%s:%u (classifier %s of %d labels: "
                        "/v1/classify and /v1/embeddings, up to %d tokens an input, %u "
                        "connections)\n",
                o->host, di ? di->port : (unsigned)o->port, s->model_id, s->n_labels,
                s->elim.max_tokens, max_conn);
    else if (s->enc)
        fprintf(stderr, "kwker serve: listening on http://%s:%u (embedding model %s, %d floats, "
                        "up to %d tokens an input, %u connections)\n",
                o->host, di ? di->port : (unsigned)o->port, s->model_id, s->elim.dim,
                s->elim.max_tokens, max_conn);
    else
        fprintf(stderr, "kwker serve: listening on http://%s:%u (model %s, %d slots, %d positions "
                    "each, %u connections)\n",
            o->host, di ? di->port : (unsigned)o->port, s->model_id,
            o->engine.max_batch ? o->engine.max_batch : 8, s->lim.max_cache_len, max_conn);
    sigwait(&set, &sig);
    fprintf(stderr, "kwker serve: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
    if (o->shutdown_timeout_s > 0)
        drain(s, &set);
    rc = 0;
out:
    shutdown_all(s);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
}
