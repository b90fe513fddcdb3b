/* embedq.c - the encoder worker of `kwker serve`: one thread owns the kwk_encoder (used by one
 * thread at a time) and runs the queued requests' sequences together. Requests that arrive
 * while a batch runs wait in a FIFO; the next batch takes as many whole requests of the head's
 * kind (embeddings, or a reranker's pairs through the classification head) as fit in the
 * encoder's batch, so concurrent clients share passes instead of queueing one pass each. A
 * sequence's embedding or logits do not depend on what it is batched with (kwk_encoder_embed,
 * kwk_encoder_classify), so batching never changes an answer. A job's prepare hook (a request's
 * texts to token ids) runs here too, as the job is taken: tokenizing megabytes of text takes
 * seconds, which the submitter's event loop must not spend. srv_embedq_submit from any thread
 * (http.c: the event loop); each job's prepare and done callbacks on the worker's thread. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

struct srv_embedq {
    kwk_encoder *enc;
    int dim, n_labels;
    size_t batch_tokens;
    pthread_t th;
    pthread_mutex_t mu;          /* guards the queue and stopping */
    pthread_cond_t cv;
    struct srv_embed_job *head, *tail;
    int n_queued, max_queue;
    int stopping;
    _Atomic uint64_t batches, seqs;
    /* the worker's: a prepared job taken off the queue that did not fit in the last batch, the
     * first of the next */
    struct srv_embed_job *held;
    /* the worker's: several jobs' sequences joined for one call */
    int32_t *ids, *types, *offs;
    float *out;
    size_t cap_ids, cap_types, cap_seqs, cap_out;
};

static size_t job_tokens(const struct srv_embed_job *j)
{
    return (size_t)j->offs[j->n_seqs];
}

/* Floats of one sequence's output. */
static size_t job_width(const struct srv_embedq *q, const struct srv_embed_job *j)
{
    return (size_t)(j->classify ? q->n_labels : q->dim);
}

static void finish(struct srv_embedq *q, struct srv_embed_job *j, int status, const char *msg)
{
    if (!status)
        atomic_fetch_add_explicit(&q->seqs, (uint64_t)j->n_seqs, memory_order_relaxed);
    j->done(j, status, msg); /* may free j */
}

/* The queue's head off it. Under q->mu, with a head. */
static struct srv_embed_job *pop(struct srv_embedq *q)
{
    struct srv_embed_job *j = q->head;
    q->head = j->next;
    if (!q->head)
        q->tail = NULL;
    q->n_queued--;
    j->next = NULL;
    return j;
}

/* j's prepare, once, unless its client is gone; a job that cannot run ends here. 0 when it
 * can run. */
static int prepare(struct srv_embedq *q, struct srv_embed_job *j)
{
    int (*fn)(struct srv_embed_job *) = j->prepare;
    if (atomic_load_explicit(&j->canceled, memory_order_relaxed)) {
        finish(q, j, KWK_ECANCELED, "the client went away");
        return -1;
    }
    j->prepare = NULL;
    if (fn && fn(j)) {
        finish(q, j, KWK_EARG, j->err.msg);
        return -1;
    }
    return 0;
}

static int encode(struct srv_embedq *q, int classify, const int32_t *ids, const int32_t *types,
                  const int32_t *offs, int n_seqs, float *out, struct kwk_err *err)
{
    return classify ? kwk_encoder_classify(q->enc, ids, types, offs, n_seqs, out, err)
                    : kwk_encoder_embed(q->enc, ids, offs, n_seqs, out, err);
}

static void run_one(struct srv_embedq *q, struct srv_embed_job *j)
{
    struct kwk_err err = {0};
    int st = encode(q, j->classify, j->ids, j->types, j->offs, j->n_seqs, j->out, &err);
    atomic_fetch_add_explicit(&q->batches, 1, memory_order_relaxed);
    finish(q, j, st, err.msg);
}

static int grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return 0;
    void *n = want <= SIZE_MAX / elem ? realloc(*p, want * elem) : NULL;
    if (!n)
        return -1;
    *p = n;
    *cap = want;
    return 0;
}

/* The jobs' sequences (and, to classify, their type ids: 0 for a job without) joined into the
 * worker's buffers; -1 when they cannot be allocated. */
static int join(struct srv_embedq *q, struct srv_embed_job *jobs, size_t n_tok, size_t n_seq)
{
    int classify = jobs->classify;
    if (grow((void **)&q->ids, &q->cap_ids, n_tok, sizeof(int32_t)) ||
        (classify && grow((void **)&q->types, &q->cap_types, n_tok, sizeof(int32_t))) ||
        grow((void **)&q->offs, &q->cap_seqs, n_seq + 1, sizeof(int32_t)) ||
        grow((void **)&q->out, &q->cap_out, n_seq * job_width(q, jobs), sizeof(float)))
        return -1;
    size_t t = 0, s = 0;
    q->offs[0] = 0;
    for (struct srv_embed_job *j = jobs; j; j = j->next) {
        memcpy(q->ids + t, j->ids, sizeof(int32_t) * job_tokens(j));
        if (classify && j->types)
            memcpy(q->types + t, j->types, sizeof(int32_t) * job_tokens(j));
        else if (classify)
            memset(q->types + t, 0, sizeof(int32_t) * job_tokens(j));
        for (int i = 0; i < j->n_seqs; i++)
            q->offs[s + (size_t)i + 1] = (int32_t)(t + (size_t)j->offs[i + 1]);
        t += job_tokens(j);
        s += (size_t)j->n_seqs;
    }
    return 0;
}

/* One batch: cancelled jobs end at once; the rest run in one call and each gets its rows. If
 * the joined call fails, each job runs alone, so that a failure reaches only its own request. */
static void run(struct srv_embedq *q, struct srv_embed_job *jobs)
{
    struct srv_embed_job *live = NULL, **tail = &live, *next;
    size_t n_tok = 0, n_seq = 0, n_jobs = 0;
    for (struct srv_embed_job *j = jobs; j; j = next) {
        next = j->next;
        j->next = NULL;
        if (atomic_load_explicit(&j->canceled, memory_order_relaxed)) {
            finish(q, j, KWK_ECANCELED, "the client went away");
            continue;
        }
        *tail = j;
        tail = &j->next;
        n_tok += job_tokens(j);
        n_seq += (size_t)j->n_seqs;
        n_jobs++;
    }
    if (n_jobs == 1) {
        run_one(q, live);
        return;
    }
    struct kwk_err err = {0};
    int st = !live || n_seq > INT32_MAX / 2 || n_tok > INT32_MAX || join(q, live, n_tok, n_seq)
                 ? -1
                 : encode(q, live->classify, q->ids, q->types, q->offs, (int)n_seq, q->out, &err);
    if (live && st == 0)
        atomic_fetch_add_explicit(&q->batches, 1, memory_order_relaxed);
    size_t row = 0, width = live ? job_width(q, live) : 0;
    for (struct srv_embed_job *j = live; j; j = next) {
        next = j->next;
        if (st) {
            run_one(q, j);
            continue;
        }
        size_t n = (size_t)j->n_seqs * width;
        memcpy(j->out, q->out + row * width, sizeof(float) * n);
        row += (size_t)j->n_seqs;
        finish(q, j, 0, NULL);
    }
}

/* The first job of the next batch: the one held back from the last, else the queue's head
 * (waiting for one). NULL when stopping, after ending the held and the queued jobs. */
static struct srv_embed_job *next_first(struct srv_embedq *q)
{
    pthread_mutex_lock(&q->mu);
    while (!q->held && !q->head && !q->stopping)
        pthread_cond_wait(&q->cv, &q->mu);
    if (q->stopping) {
        struct srv_embed_job *j = q->head, *next;
        if (q->held) {
            q->held->next = j;
            j = q->held;
        }
        q->head = q->tail = q->held = NULL;
        pthread_mutex_unlock(&q->mu);
        for (; j; j = next) {
            next = j->next;
            finish(q, j, KWK_ECANCELED, "the server is shutting down");
        }
        return NULL;
    }
    struct srv_embed_job *j = q->held ? q->held : pop(q);
    q->held = NULL;
    pthread_mutex_unlock(&q->mu);
    return j;
}

/* The queue's head when it asks for what classify says and the worker is not stopping, else
 * NULL. */
static struct srv_embed_job *pop_same(struct srv_embedq *q, int classify)
{
    struct srv_embed_job *j = NULL;
    pthread_mutex_lock(&q->mu);
    if (!q->stopping && q->head && q->head->classify == classify)
        j = pop(q);
    pthread_mutex_unlock(&q->mu);
    return j;
}

/* Whole jobs, each prepared as it is taken, while their tokens fit and they ask for what the
 * first asks (the first always: one request larger than a batch runs alone, and the encoder
 * cuts it into passes); the first that does not fit is held for the next batch. */
static void *worker(void *arg)
{
    struct srv_embedq *q = arg;
    struct srv_embed_job *first, *last, *j;
    while ((first = next_first(q))) {
        if (prepare(q, first))
            continue;
        size_t tokens = job_tokens(first);
        last = first;
        while (tokens < q->batch_tokens && (j = pop_same(q, first->classify))) {
            if (prepare(q, j))
                continue;
            if (tokens + job_tokens(j) > q->batch_tokens) {
                q->held = j;
                break;
            }
            last->next = j;
            last = j;
            tokens += job_tokens(j);
        }
        run(q, first);
    }
    return NULL;
}

struct srv_embedq *srv_embedq_new(kwk_encoder *enc, int batch_tokens, int max_queue)
{
    struct srv_embedq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->enc = enc;
    q->dim = kwk_encoder_dim(enc);
    q->n_labels = kwk_encoder_n_labels(enc);
    q->batch_tokens = batch_tokens > 0 ? (size_t)batch_tokens : 1;
    q->max_queue = max_queue > 0 ? max_queue : 4096;
    if (pthread_mutex_init(&q->mu, NULL))
        goto out_free;
    if (pthread_cond_init(&q->cv, NULL))
        goto out_mutex;
    if (pthread_create(&q->th, NULL, worker, q))
        goto out_cond;
    return q;
out_cond:
    pthread_cond_destroy(&q->cv);
out_mutex:
    pthread_mutex_destroy(&q->mu);
out_free:
    free(q);
    return NULL;
}

int srv_embedq_submit(struct srv_embedq *q, struct srv_embed_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        return KWK_ECANCELED;
    }
    if (q->n_queued >= q->max_queue) {
        pthread_mutex_unlock(&q->mu);
        return KWK_ELIMIT;
    }
    q->n_queued++;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

void srv_embedq_free(struct srv_embedq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stopping = 1;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    free(q->ids);
    free(q->types);
    free(q->offs);
    free(q->out);
    free(q);
}

void srv_embedq_stats(struct srv_embedq *q, uint64_t *batches, uint64_t *seqs)
{
    *batches = atomic_load_explicit(&q->batches, memory_order_relaxed);
    *seqs = atomic_load_explicit(&q->seqs, memory_order_relaxed);
}
