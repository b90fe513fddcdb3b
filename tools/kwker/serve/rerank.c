/* rerank.c - /v1/rerank (Jina's, Cohere's, vLLM's and llama.cpp's rerank API): request bodies to
 * struct srv_rerank_req, each (query, document) pair to token ids in kwk_encoder_classify's
 * layout, scores from the head's logits, and the reply's JSON. No HTTP and no threads (the fuzz
 * target and tests/c/test_rerank.c drive it directly); any thread, one request per call.
 * Static names carry an rr_ prefix: the fuzz target includes this file with openai.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define RR_INVALID "invalid_request_error"
#define RR_DOC_TYPES "a list of strings or of objects with a string 'text'"

/* ---- parsing --------------------------------------------------------------------------------- */

/* Document i: a string, or an object whose "text" is one (its other fields are not read). */
static int rr_doc(struct srv_rerank_doc *d, json_t *v, size_t i, struct srv_err *e)
{
    json_t *s = v;
    if (json_is_object(v)) {
        s = json_object_get(v, "text");
        if (!json_is_string(s)) {
            srv_err_set(e, 400, RR_INVALID, "documents", "invalid_type",
                        "'documents[%zu].text' must be a string", i);
            return -1;
        }
    } else if (!json_is_string(v)) {
        srv_err_set(e, 400, RR_INVALID, "documents", "invalid_type",
                    "'documents[%zu]' is not a string: 'documents' must be " RR_DOC_TYPES, i);
        return -1;
    }
    d->len = json_string_length(s);
    if (!(d->text = srv_dup_n(json_string_value(s), d->len)))
        return srv_err_oom(e);
    return 0;
}

/* The pairs' bytes, the query counted with each document, within SRV_RERANK_MAX_TEXT. */
static int rr_text_ok(const struct srv_rerank_req *r, struct srv_err *e)
{
    size_t total = 0;
    for (int i = 0; i < r->n_docs; i++) {
        total += r->query_len + r->docs[i].len;
        if (total > SRV_RERANK_MAX_TEXT) {
            srv_err_set(e, 400, RR_INVALID, "documents", "invalid_value",
                        "the query and documents hold more than %zu bytes to tokenize (the query "
                        "counts once per document): send fewer or shorter documents",
                        SRV_RERANK_MAX_TEXT);
            return -1;
        }
    }
    return 0;
}

static int rr_docs(struct srv_rerank_req *r, json_t *root, struct srv_err *e)
{
    json_t *a = json_object_get(root, "documents");
    if (!a || json_is_null(a)) {
        srv_err_set(e, 400, RR_INVALID, "documents", "missing_required_parameter",
                    "'documents' is required");
        return -1;
    }
    if (!json_is_array(a))
        return srv_err_type(e, "documents", RR_DOC_TYPES);
    size_t n = json_array_size(a);
    if (n == 0) {
        srv_err_set(e, 400, RR_INVALID, "documents", "invalid_value",
                    "'documents' is an empty list");
        return -1;
    }
    if (n > SRV_RERANK_MAX_DOCS) {
        srv_err_set(e, 400, RR_INVALID, "documents", "invalid_value",
                    "'documents' may hold at most %d documents; it has %zu", SRV_RERANK_MAX_DOCS,
                    n);
        return -1;
    }
    if (!(r->docs = calloc(n, sizeof *r->docs)))
        return srv_err_oom(e);
    r->n_docs = (int)n;
    for (size_t i = 0; i < n; i++)
        if (rr_doc(&r->docs[i], json_array_get(a, i), i, e))
            return -1;
    return rr_text_ok(r, e);
}

/* query (required; empty is scored as vLLM and llama.cpp score it) and model (optional). */
static int rr_query(struct srv_rerank_req *r, json_t *root, struct srv_err *e)
{
    json_t *q = json_object_get(root, "query");
    if (!q || json_is_null(q)) {
        srv_err_set(e, 400, RR_INVALID, "query", "missing_required_parameter",
                    "'query' is required");
        return -1;
    }
    if (!json_is_string(q))
        return srv_err_type(e, "query", "a string");
    r->query_len = json_string_length(q);
    if (!(r->query = srv_dup_n(json_string_value(q), r->query_len)))
        return srv_err_oom(e);
    json_t *m = json_object_get(root, "model");
    if (!m || json_is_null(m))
        return 0;
    if (!json_is_string(m))
        return srv_err_type(e, "model", "a string");
    if (!(r->model = srv_dup_n(json_string_value(m), json_string_length(m))))
        return srv_err_oom(e);
    return 0;
}

/* top_n (absent, null or 0: all, as vLLM's 0; past the documents: all) and return_documents. */
static int rr_options(struct srv_rerank_req *r, json_t *root, struct srv_err *e)
{
    json_t *t = json_object_get(root, "top_n");
    r->top_n = r->n_docs;
    if (t && !json_is_null(t)) {
        if (!json_is_integer(t))
            return srv_err_type(e, "top_n", "an integer");
        json_int_t v = json_integer_value(t);
        if (v < 0) {
            srv_err_set(e, 400, RR_INVALID, "top_n", "invalid_value",
                        "'top_n' must be at least 1 (0: all the documents); it is %lld",
                        (long long)v);
            return -1;
        }
        if (v > 0 && v < r->n_docs)
            r->top_n = (int)v;
    }
    r->return_documents = 1;
    json_t *d = json_object_get(root, "return_documents");
    if (d && !json_is_null(d)) {
        if (!json_is_boolean(d))
            return srv_err_type(e, "return_documents", "a boolean");
        r->return_documents = json_is_true(d);
    }
    return 0;
}

int srv_rerank_parse(struct srv_rerank_req *r, const char *body, size_t len, struct srv_err *e)
{
    memset(r, 0, sizeof *r);
    json_t *root = srv_json_body(body, len, e);
    if (!root)
        return -1;
    int rc = rr_query(r, root, e) || rr_docs(r, root, e) || rr_options(r, root, e) ? -1 : 0;
    json_decref(root);
    if (rc)
        srv_rerank_req_free(r);
    return rc;
}

int srv_rerank_init(struct srv_rerank_req *r, const char *query, size_t query_len,
                    const char *const *docs, const size_t *doc_lens, int n_docs, int top_n)
{
    memset(r, 0, sizeof *r);
    r->return_documents = 1;
    r->top_n = top_n > 0 && top_n < n_docs ? top_n : n_docs;
    if (n_docs < 0 || !(r->query = srv_dup_n(query, query_len)) ||
        !(r->docs = calloc(n_docs ? (size_t)n_docs : 1, sizeof *r->docs)))
        goto out_free;
    r->query_len = query_len;
    for (int i = 0; i < n_docs; i++, r->n_docs++) {
        if (!(r->docs[i].text = srv_dup_n(docs[i], doc_lens[i])))
            goto out_free;
        r->docs[i].len = doc_lens[i];
    }
    return 0;
out_free:
    srv_rerank_req_free(r);
    return -1;
}

void srv_rerank_req_free(struct srv_rerank_req *r)
{
    free(r->model);
    free(r->query);
    for (int i = 0; r->docs && i < r->n_docs; i++)
        free(r->docs[i].text);
    free(r->docs);
    free(r->ids);
    free(r->types);
    free(r->offs);
    memset(r, 0, sizeof *r);
}

/* ---- token ids ------------------------------------------------------------------------------- */

/* Room for one more pair of up to max ids after the first used. */
static int rr_reserve(struct srv_packed *p, size_t used, size_t *cap, size_t max)
{
    if (used + max <= *cap)
        return 0;
    size_t want = *cap * 2 > used + max ? *cap * 2 : used + max;
    if (want >= (size_t)INT32_MAX)
        return -1;
    int32_t *ids = realloc(p->ids, sizeof(int32_t) * want);
    if (ids)
        p->ids = ids;
    int32_t *types = ids ? realloc(p->types, sizeof(int32_t) * want) : NULL;
    if (!types)
        return -1;
    p->types = types;
    *cap = want;
    return 0;
}

/* Why pair i could not be tokenized: a 400 when a limit the request set (or one it would
 * pass) is at fault, else a 500. */
static int rr_pair_failed(const struct srv_pairs *pl, int i, int st, struct srv_err *e)
{
    if (st == KWK_ELIMIT && pl->strict)
        srv_err_set(e, 400, RR_INVALID, pl->param, "context_length_exceeded",
                    "This model's maximum context length is %d tokens, however %s %d holds "
                    "more. Please reduce the length of the input, or set "
                    "'truncate_prompt_tokens'.", pl->limit, pl->what, i);
    else if (st == KWK_ELIMIT && pl->limit_param)
        srv_err_set(e, 400, RR_INVALID, pl->limit_param, "invalid_value",
                    "'%s' is %d: too few tokens for %s %d and its special tokens",
                    pl->limit_param, pl->limit, pl->what, i);
    else
        srv_err_set(e, 500, "server_error", NULL, NULL, "tokenizing %s %d: %s", pl->what, i,
                    kwk_status_str(st));
    return -1;
}

int srv_pairs_pack(struct srv_packed *p, const struct srv_pairs *pl, srv_pair_fn encode,
                   void *user, struct srv_err *e)
{
    /* strict: one token past the limit shows a pair is too long, without tokenizing it whole */
    size_t used = 0, cap = 0, lim = pl->limit > 0 ? (size_t)pl->limit : 0;
    size_t max = lim + (pl->strict ? 1 : 0);
    if (!(p->offs = calloc((size_t)pl->n + 1, sizeof(int32_t))))
        return srv_err_oom(e);
    for (int i = 0; i < pl->n; i++) {
        const struct srv_rerank_doc *a = &pl->a[(size_t)i * (size_t)pl->a_step], *b = &pl->b[i];
        size_t n = 0;
        if (rr_reserve(p, used, &cap, max))
            return srv_err_oom(e);
        int st = encode(user, a->text, a->len, b->text, b->len, p->ids + used, p->types + used,
                        max, &n);
        if (st >= 0 && n == 0) {
            /* a tokenizer whose pair form adds no tokens, both texts empty */
            srv_err_set(e, 400, RR_INVALID, pl->param, NULL,
                        "%s %d: both texts of the pair are empty: nothing to score", pl->what, i);
            return -1;
        }
        if (st >= 0 && n > lim) /* past max would break encode's contract */
            st = KWK_ELIMIT;
        if (st < 0)
            return rr_pair_failed(pl, i, st, e);
        used += n;
        p->offs[i + 1] = (int32_t)used;
    }
    return 0;
}

int srv_rerank_pack(struct srv_rerank_req *r, srv_pair_fn encode, void *user, int max_tokens,
                    struct srv_err *e)
{
    struct srv_rerank_doc q = {.text = r->query, .len = r->query_len};
    struct srv_pairs pl = {.a = &q, .b = r->docs, .a_step = 0, .n = r->n_docs,
                           .limit = max_tokens, .param = "documents", .what = "document"};
    struct srv_packed p = {0};
    int rc = srv_pairs_pack(&p, &pl, encode, user, e);
    r->ids = p.ids;
    r->types = p.types;
    r->offs = p.offs;
    return rc;
}

/* ---- scores and the reply -------------------------------------------------------------------- */

void srv_rerank_scores(float *logits, int n, int act)
{
    for (int i = 0; act == KWK_SCORE_SIGMOID && i < n; i++)
        logits[i] = (float)(1.0 / (1.0 + exp(-(double)logits[i])));
}

/* idx[n] ordered by score s, the highest first: a merge sort, stable, so equal scores keep the
 * indices' order (qsort is not stable, and its comparator could not see s without a global);
 * NaN after every number. tmp has room for n. */
static void rr_order(int *idx, int *tmp, int n, const float *s)
{
    if (n < 2)
        return;
    int h = n / 2;
    rr_order(idx, tmp, h, s);
    rr_order(idx + h, tmp, n - h, s);
    int i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int a = idx[i], b = idx[j];
        int an = isnan(s[a]), bn = isnan(s[b]);
        int b_first = an != bn ? an : !an && s[b] > s[a];
        tmp[k++] = b_first ? idx[j++] : idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, sizeof(int) * (size_t)n);
}

void srv_buf_json_text(struct srv_buf *out, const char *s, size_t n)
{
    json_t *j = srv_json_text(s, n);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    if (t)
        srv_buf_str(out, t);
    else
        out->err = 1;
    free(t);
    json_decref(j);
}

/* One result: %.9g reads back as the same float32; JSON has no NaN or infinity: null. */
static void rr_result(struct srv_buf *out, const struct srv_rerank_req *r, int i, float score,
                      int first)
{
    char num[96];
    if (isfinite(score))
        snprintf(num, sizeof num, "%s{\"index\":%d,\"relevance_score\":%.9g", first ? "" : ",", i,
                 (double)score);
    else
        snprintf(num, sizeof num, "%s{\"index\":%d,\"relevance_score\":null", first ? "" : ",", i);
    srv_buf_str(out, num);
    if (r->return_documents) {
        srv_buf_str(out, ",\"document\":{\"text\":");
        srv_buf_json_text(out, r->docs[i].text, r->docs[i].len);
        srv_buf_add(out, "}", 1);
    }
    srv_buf_add(out, "}", 1);
}

void srv_rerank_response(struct srv_buf *out, const char *id, const char *model,
                         const struct srv_rerank_req *r, const float *scores)
{
    char tail[128];
    int n = r->n_docs, *idx = malloc(sizeof(int) * (size_t)(n > 0 ? 2 * n : 1));
    if (!idx) {
        out->err = 1;
        return;
    }
    for (int i = 0; i < n; i++)
        idx[i] = i;
    rr_order(idx, idx + n, n, scores);
    srv_buf_str(out, "{");
    if (id) {
        srv_buf_str(out, "\"id\":");
        srv_buf_json_text(out, id, strlen(id));
        srv_buf_add(out, ",", 1);
    }
    srv_buf_str(out, "\"object\":\"list\",\"model\":");
    srv_buf_json_text(out, model, strlen(model));
    srv_buf_str(out, ",\"results\":[");
    for (int k = 0; k < r->top_n && k < n; k++)
        rr_result(out, r, idx[k], scores[idx[k]], k == 0);
    int tokens = r->offs ? r->offs[n] : 0;
    snprintf(tail, sizeof tail, "],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", tokens,
             tokens);
    srv_buf_str(out, tail);
    free(idx);
}
