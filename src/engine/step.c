/* step.c - one scheduling step of the serving engine: admit queued requests into KV slots, build
 * one batch of rows (a decode token per running request, lookup candidates when few run, prompt
 * chunks in the budget left), run it through the model, and turn the logits into tokens and
 * events. Stepping thread only. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "engine/engine.h"

/* Longest prefix of the slot's cache that a prompt can reuse: at most n - 1 tokens, so the last
 * prompt token is read again and yields the logits of the first new token. */
static int common_prefix(const struct kwk_slot *s, const int32_t *ids, int n)
{
    int keep = 0, limit = KWK_MIN(s->len, n - 1);
    while (keep < limit && s->tokens[keep] == ids[keep])
        keep++;
    return keep;
}

/* The free slot for prompt ids[n]: the longest reusable prefix, else the least recently used.
 * A request that reuses nothing (reuse 0: prompt_cache off) takes the least recently used, so
 * that the prefix another slot holds stays for the requests that will reuse it. */
static int pick_slot(const struct kwk_engine *e, const int32_t *ids, int n, int reuse, int *keep)
{
    int best = -1, best_keep = -1;
    for (int i = 0; i < e->prm.max_batch; i++) {
        const struct kwk_slot *s = &e->slots[i];
        if (s->req)
            continue;
        int k = reuse ? common_prefix(s, ids, n) : 0;
        if (k > best_keep || (k == best_keep && s->last_used < e->slots[best].last_used)) {
            best = i;
            best_keep = k;
        }
    }
    *keep = best_keep;
    return best;
}

/* Positions request q's prompt shares with prompt ids[n] (at most n - 1, as common_prefix) when
 * q has yet to read them all, else 0. */
static int shared_ahead(const struct kwk_req *q, const int32_t *ids, int n)
{
    int k = 0, limit = KWK_MIN(q->n_prompt, n - 1);
    while (k < limit && q->prompt[k] == ids[k])
        k++;
    return k > q->n_read ? k : 0;
}

/* Called by the sequence for each token it records: the TOKEN event. Non-zero cancels. */
static int on_token(void *user, int32_t tok, const char *text, size_t len)
{
    struct kwk_req *r = user;
    int i = r->out.n_tokens - 1, nt = r->p.top_logprobs;
    struct kwk_event ev = {
        .type = KWK_EVENT_TOKEN,
        .id = r->id,
        .token = tok,
        .logprob = r->out.logprobs[i],
        .n_top = nt,
        .top_ids = nt ? r->out.top_ids + (size_t)i * nt : NULL,
        .top_lps = nt ? r->out.top_lps + (size_t)i * nt : NULL,
        .text = text,
        .len = len,
    };
    r->e->step_tokens++;
    r->fn(r->user, &ev);
    return atomic_load(&r->cancel);
}

/* Output arrays and the sequence state of a request entering its slot. */
static int req_start(struct kwk_engine *e, struct kwk_req *r, struct kwk_err *err)
{
    size_t cap = (size_t)KWK_MAX(r->p.max_new_tokens, 1), nt = (size_t)r->p.top_logprobs;
    r->out.tokens = kwk_malloc(cap * sizeof(int32_t));
    r->out.logprobs = kwk_malloc(cap * sizeof(float));
    if (nt) {
        r->out.top_ids = kwk_malloc(cap * nt * sizeof(int32_t));
        r->out.top_lps = kwk_malloc(cap * nt * sizeof(float));
    }
    if (!r->out.tokens || !r->out.logprobs || (nt && (!r->out.top_ids || !r->out.top_lps)))
        return kwk_err_set(err, -ENOMEM, "out of memory for a request's output");
    if (r->p.prompt_logprobs) {
        size_t np = (size_t)r->n_prompt;
        r->plp = kwk_malloc(np * sizeof(float));
        r->ptop_ids = kwk_malloc(np * KWK_MAX(nt, 1) * sizeof(int32_t));
        r->ptop_lps = kwk_malloc(np * KWK_MAX(nt, 1) * sizeof(float));
        if (!r->plp || !r->ptop_ids || !r->ptop_lps)
            return kwk_err_set(err, -ENOMEM, "out of memory for a request's prompt logprobs");
        r->plp[0] = NAN; /* the first token has no context */
        for (size_t k = 0; k < nt; k++) {
            r->ptop_ids[k] = -1;
            r->ptop_lps[k] = NAN;
        }
    }
    r->out.cap = (int)cap;
    r->p.on_token = on_token;
    r->p.user = r;
    r->seq_ready = 1;
    return kwk_gen_seq_init(&r->g, e->n_vocab, r->prompt, r->n_prompt, &r->p, &r->out, err);
}

/* Move queued requests into free slots (first come, first served); end the canceled ones. */
static void admit(struct kwk_engine *e, double now)
{
    struct kwk_req *admitted = NULL, *canceled = NULL, **admitted_tail = &admitted;
    pthread_mutex_lock(&e->mu);
    struct kwk_req **link = &e->q_head, *prev = NULL;
    int full = 0;
    while (*link) {
        struct kwk_req *r = *link;
        int keep = 0, slot = -1;
        int cancel = atomic_load(&r->cancel);
        /* no free slot: this request and every later one wait (canceled ones still leave) */
        if (!cancel && (full || (slot = pick_slot(e, r->prompt, r->n_prompt, r->p.prompt_cache,
                                                  &keep)) < 0)) {
            full = 1;
            prev = r;
            link = &r->next;
            continue;
        }
        *link = r->next;
        if (e->q_tail == r)
            e->q_tail = prev;
        e->n_queued--;
        if (cancel) {
            r->next = canceled;
            canceled = r;
            continue;
        }
        /* A longer prefix held by another slot (running or free) is copied rather than read
         * again: a shared system prompt costs a memcpy per request instead of a forward pass. */
        if (!r->p.prompt_cache)
            keep = 0; /* the caller asked for a full read of its prompt */
        int src = -1, src_keep = keep;
        for (int i = 0; i < e->prm.max_batch && r->p.prompt_cache; i++) {
            int k = i == slot ? 0 : common_prefix(&e->slots[i], r->prompt, r->n_prompt);
            if (k > src_keep)
                src = i, src_keep = k;
        }
        /* A request in flight that is still to read a longer prefix of this prompt (the n
         * choices of one prompt, a burst of requests with one system prompt): wait for it and
         * copy then. Prompts are read first come first served, so it reads its own before this
         * one would start on it anyway: waiting costs the step in which the copy is made. */
        int wait = -1, wait_len = src_keep;
        for (int i = 0; i < e->prm.max_batch && r->p.prompt_cache; i++) {
            struct kwk_req *q = e->slots[i].req;
            if (!q || i == slot || (q->state != REQ_PREFILL && q->state != REQ_SHARE))
                continue;
            int k = shared_ahead(q, r->prompt, r->n_prompt);
            if (k > wait_len)
                wait = i, wait_len = k;
        }
        r->state = REQ_PREFILL;
        r->wait_slot = wait;
        if (wait >= 0) {
            r->state = REQ_SHARE;
            r->wait_id = e->slots[wait].req->id;
            r->wait_len = wait_len;
            src = -1; /* the whole prefix is copied from the reader once it is read */
        }
        r->copy_src = src;
        if (src >= 0) {
            keep = src_keep;
            memcpy(e->slots[slot].tokens, e->slots[src].tokens, sizeof(int32_t) * (size_t)keep);
        }
        r->slot = slot;
        r->n_read = keep;
        r->t_admit = now;
        e->slots[slot].req = r;
        e->slots[slot].len = keep;
        e->n_running++;
        /* in admission order: a request may copy from a slot admitted just before it, whose
         * own copy must then come first */
        r->next = NULL;
        *admitted_tail = r;
        admitted_tail = &r->next;
    }
    pthread_mutex_unlock(&e->mu);
    while (canceled) {
        struct kwk_req *r = canceled;
        canceled = r->next;
        kwk_engine_finish(e, r, 0, NULL);
    }
    while (admitted) {
        struct kwk_req *r = admitted;
        admitted = r->next;
        /* outside the lock: slots' caches belong to this thread, and submitters need not wait
         * for a copy of many megabytes */
        if (r->copy_src >= 0)
            kwk_kv_copy(e->d, r->slot, r->copy_src, r->n_read);
        struct kwk_err err = {0};
        if (req_start(e, r, &err) < 0) {
            kwk_engine_finish(e, r, err.code, err.msg);
            continue;
        }
        r->out.prompt_reused = r->n_read;
        pthread_mutex_lock(&e->mu);
        e->st.prompt_reused += (uint64_t)r->n_read;
        pthread_mutex_unlock(&e->mu);
    }
}

/* Whether request r, waiting for a shared prefix, can stop: its reader has read the prefix,
 * or left the slot (ended, or canceled), whose cache then holds what it holds. */
static int share_ready(const struct kwk_engine *e, const struct kwk_req *r)
{
    const struct kwk_req *q = e->slots[r->wait_slot].req;
    return !q || q->id != r->wait_id || (q->state != REQ_PREFILL && q->state != REQ_SHARE) ||
           q->n_read >= r->wait_len;
}

/* Waiting requests whose prefix is read copy it from the reader's slot and go on to read the
 * rest of their prompt. In admission order, so that a request waiting on one that waited
 * itself is copied in the same step. */
static void share_prefixes(struct kwk_engine *e)
{
    for (;;) {
        struct kwk_req *r = NULL;
        for (int i = 0; i < e->prm.max_batch; i++) {
            struct kwk_req *q = e->slots[i].req;
            if (q && q->state == REQ_SHARE && share_ready(e, q) && (!r || q->id < r->id))
                r = q;
        }
        if (!r)
            return;
        /* the slot holding most of the prompt: the reader's, or another one when the reader
         * was canceled early */
        int from = -1, k = r->n_read;
        for (int i = 0; i < e->prm.max_batch; i++) {
            int ki = i == r->slot ? 0 : common_prefix(&e->slots[i], r->prompt, r->n_prompt);
            if (ki > k)
                from = i, k = ki;
        }
        if (from >= 0) {
            kwk_kv_copy(e->d, r->slot, from, k);
            memcpy(e->slots[r->slot].tokens, e->slots[from].tokens, sizeof(int32_t) * (size_t)k);
            pthread_mutex_lock(&e->mu);
            e->st.prompt_reused += (uint64_t)(k - r->n_read);
            pthread_mutex_unlock(&e->mu);
            r->n_read = k;
            e->slots[r->slot].len = k;
            r->out.prompt_reused = k;
        }
        r->state = REQ_PREFILL;
    }
}

/* Request r's prompt rows of this step (plan pl): each gives the logprob of the prompt token
 * after it. Their logits are computed in slices into the logits buffer's rows from n_used on
 * (those before hold this step's other logits until consume), so a prompt chunk is as long as
 * any other: decode rows (8 at most in all) and finished prompts' rows (one each) leave at least
 * one row of the max_batch * 9. When the prompt is read, the KWK_EVENT_PROMPT event. */
static void prompt_logprobs(struct kwk_engine *e, struct kwk_req *r, const struct kwk_plan *pl,
                            int n_used)
{
    size_t nv = (size_t)e->n_vocab, nt = (size_t)r->p.top_logprobs;
    int n = KWK_MIN(pl->n_prompt, r->n_prompt - 1 - pl->prompt_start); /* tokens after them */
    int room = e->spec_cap - n_used, *rows = e->logit_rows + n_used;
    float *buf = e->logits + (size_t)n_used * nv;
    for (int j0 = 0; room > 0 && j0 < n; j0 += room) {
        int k = KWK_MIN(room, n - j0);
        for (int j = 0; j < k; j++)
            rows[j] = pl->prompt_row + j0 + j;
        kwk_logits_rows(e->d, rows, k, buf);
        for (int j = 0; j < k; j++) {
            int next = pl->prompt_start + j0 + j + 1;
            kwk_sampler_raw_logprobs(r->g.sampler, buf + (size_t)j * nv, r->prompt[next],
                                     &r->plp[next], r->ptop_ids + next * nt,
                                     r->ptop_lps + next * nt, (int)nt);
        }
    }
    if (r->n_read < r->n_prompt)
        return;
    struct kwk_event ev = {
        .type = KWK_EVENT_PROMPT,
        .id = r->id,
        .n_prompt = r->n_prompt,
        .n_top = (int)nt,
        .top_ids = nt ? r->ptop_ids : NULL,
        .top_lps = nt ? r->ptop_lps : NULL,
        .prompt_lps = r->plp,
    };
    r->fn(r->user, &ev);
}

/* A row of the batch: token id at (slot, position). */
static void add_row(struct kwk_engine *e, int *n, int slot, int pos, int32_t id)
{
    e->row_ids[*n] = id;
    e->row_req[*n] = slot;
    e->d->row_slot[*n] = slot;
    e->d->row_pos[*n] = pos;
    (*n)++;
}

/* Lookup candidates a running request may add: they cost compute in every row, so only while
 * few requests decode, where the step is bound by reading the weights rather than by math. */
static int spec_allowance(const struct kwk_engine *e, const struct kwk_req *r, int n_decode)
{
    int per = 8 / KWK_MAX(n_decode, 1) - 1;
    int room = e->d->max_len - e->slots[r->slot].len - 1;
    int left = r->p.max_new_tokens - r->out.n_tokens - 1;
    return KWK_MAX(0, KWK_MIN(KWK_MIN(per, r->p.lookup), KWK_MIN(room, left)));
}

/* Turn one request's logits into tokens; end it when it is done. */
static void consume(struct kwk_engine *e, struct kwk_req *r, const struct kwk_plan *pl, double now)
{
    struct kwk_slot *s = &e->slots[r->slot];
    struct kwk_err err = {0};
    size_t nv = (size_t)e->n_vocab;
    const float *row = e->logits + (size_t)pl->first_logit * nv;
    if (r->state == REQ_PREFILL) {
        r->state = REQ_DECODE;
        if (r->p.max_new_tokens == 0) {
            r->out.finish_reason = KWK_FINISH_LENGTH;
            kwk_engine_finish(e, r, 0, NULL);
            return;
        }
        if (kwk_gen_seq_next(&r->g, row, &r->pending, &err) < 0)
            goto failed;
        r->t_first = now;
    } else {
        int base = s->len, kept = 0;
        s->tokens[base] = r->pending;
        for (int j = 0; j <= pl->n_cand && !r->g.done; j++) {
            int32_t tok;
            if (kwk_gen_seq_next(&r->g, row + (size_t)j * nv, &tok, &err) < 0)
                goto failed;
            r->pending = tok;
            if (j < pl->n_cand && tok == pl->cand[j]) {
                s->tokens[base + 1 + j] = tok;
                kept++;
                continue;
            }
            break;
        }
        s->len = base + 1 + kept;
        r->out.n_steps++;
        r->out.n_proposed += pl->n_cand;
        r->out.n_accepted += kept;
    }
    if (!r->g.done && s->len >= e->d->max_len)
        r->out.finish_reason = KWK_FINISH_LENGTH, r->g.done = 1;
    if (r->g.done)
        kwk_engine_finish(e, r, 0, NULL);
    return;
failed:
    kwk_engine_finish(e, r, err.code ? err.code : KWK_ERUNTIME, err.msg);
}

int kwk_engine_run_step(struct kwk_engine *e)
{
    double t0 = kwk_engine_now();
    int nb = e->prm.max_batch;
    e->step_tokens = 0;
    admit(e, t0);
    for (int i = 0; i < nb; i++) {
        struct kwk_req *r = e->slots[i].req;
        if (r && atomic_load(&r->cancel)) {
            r->out.finish_reason = KWK_FINISH_CANCELED;
            kwk_engine_finish(e, r, 0, NULL);
        }
    }
    share_prefixes(e);

    /* Decode rows first (one per running request, plus candidates), then prompt chunks in
     * first-come order within the budget. */
    struct kwk_plan *plans = e->plans;
    int n_rows = 0, n_logits = 0, n_decode = 0, n_prompt_rows = 0;
    for (int i = 0; i < nb; i++)
        n_decode += e->slots[i].req && e->slots[i].req->state == REQ_DECODE;
    for (int i = 0; i < nb; i++) {
        struct kwk_req *r = e->slots[i].req;
        plans[i].first_logit = plans[i].prompt_row = -1;
        plans[i].n_cand = plans[i].n_prompt = 0;
        if (!r || r->state != REQ_DECODE)
            continue;
        struct kwk_slot *s = &e->slots[i];
        int allow = spec_allowance(e, r, n_decode);
        if (allow > 0)
            plans[i].n_cand = kwk_gen_seq_lookup(&r->g, plans[i].cand, allow);
        plans[i].first_logit = n_logits;
        add_row(e, &n_rows, i, s->len, r->pending);
        e->logit_rows[n_logits++] = n_rows - 1;
        for (int j = 0; j < plans[i].n_cand; j++) {
            add_row(e, &n_rows, i, s->len + 1 + j, plans[i].cand[j]);
            e->logit_rows[n_logits++] = n_rows - 1;
        }
    }
    for (;;) {
        /* the prefilling request submitted first that still has prompt left this step */
        struct kwk_req *next = NULL;
        for (int i = 0; i < nb; i++) {
            struct kwk_req *r = e->slots[i].req;
            if (r && r->state == REQ_PREFILL && plans[i].n_prompt == 0 &&
                (!next || r->id < next->id))
                next = r;
        }
        int budget = e->prm.prefill_chunk - n_prompt_rows;
        if (!next || budget <= 0)
            break;
        struct kwk_slot *s = &e->slots[next->slot];
        struct kwk_plan *pl = &plans[next->slot];
        int k = KWK_MIN(budget, next->n_prompt - next->n_read);
        pl->prompt_start = next->n_read;
        if (next->p.prompt_logprobs) /* every row's logits, after the forward pass */
            pl->prompt_row = n_rows;
        for (int j = 0; j < k; j++) {
            int pos = next->n_read + j;
            s->tokens[pos] = next->prompt[pos];
            add_row(e, &n_rows, next->slot, pos, next->prompt[pos]);
        }
        pl->n_prompt = k;
        n_prompt_rows += k;
        next->n_read += k;
        s->len = next->n_read;
        if (next->n_read == next->n_prompt) {
            plans[next->slot].first_logit = n_logits;
            e->logit_rows[n_logits++] = n_rows - 1;
        }
    }

    if (n_rows > 0) {
        kwk_forward_rows(e->d, e->row_ids, n_rows);
        if (n_logits > 0)
            kwk_logits_rows(e->d, e->logit_rows, n_logits, e->logits);
        double now = kwk_engine_now();
        for (int i = 0; i < nb; i++) {
            struct kwk_req *r = e->slots[i].req;
            if (r && plans[i].prompt_row >= 0)
                prompt_logprobs(e, r, &plans[i], n_logits);
            if (r && plans[i].first_logit >= 0)
                consume(e, r, &plans[i], now);
        }
    }

    double t1 = kwk_engine_now();
    pthread_mutex_lock(&e->mu);
    if (n_rows > 0) {
        e->st.steps++;
        e->st.batch_rows += (uint64_t)n_rows;
        e->st.busy_s += t1 - t0;
    }
    e->st.prompt_tokens += (uint64_t)n_prompt_rows;
    e->st.generated_tokens += e->step_tokens;
    int left = e->n_queued + e->n_running;
    pthread_mutex_unlock(&e->mu);
    return left;
}
