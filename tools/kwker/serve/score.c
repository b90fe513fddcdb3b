/* score.c - vLLM's Score API (/score, /v1/score) and Classification API (/classify,
 * /v1/classify): request bodies to struct srv_score_req / srv_classify_req, their texts to token
 * ids (a cross-encoder's pairs through srv_pairs_pack, an embedding model's distinct texts and
 * /classify's inputs through srv_embed_pack), truncate_prompt_tokens as vLLM reads it, cosine
 * similarities, probabilities and label names (config.json), and the replies' JSON. No HTTP and
 * no threads (the fuzz target drives it directly); any thread, one request per call.
 * srv_encode_truncated alone reads a tokenizer. Static names carry an sc_ prefix: the fuzz
 * target includes this file with openai.c, embed.c and rerank.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define SC_INVALID "invalid_request_error"

/* ---- the fields both bodies share -------------------------------------------------------- */

/* A text over a limit the request set (truncation cannot go below the special tokens): the
 * field at fault is truncate_prompt_tokens. */
static int sc_trunc_failed(const struct srv_trunc *t, struct srv_err *e)
{
    if (!t->strict && e->code && !strcmp(e->code, "context_length_exceeded"))
        srv_err_set(e, 400, SC_INVALID, "truncate_prompt_tokens", "invalid_value",
                    "'truncate_prompt_tokens' is %d: too few tokens for a text's special tokens",
                    t->limit);
    return -1;
}

int srv_trunc_resolve(int truncate, int max_tokens, struct srv_trunc *t, struct srv_err *e)
{
    t->limit = truncate > 0 ? truncate : max_tokens;
    t->strict = truncate == SRV_TRUNC_NONE;
    if (truncate > max_tokens) {
        srv_err_set(e, 400, SC_INVALID, "truncate_prompt_tokens", "invalid_value",
                    "'truncate_prompt_tokens' is %d, more than this model's maximum context "
                    "length of %d tokens. Please request a smaller truncation size.",
                    truncate, max_tokens);
        return -1;
    }
    return 0;
}

/* model (optional, as vLLM's), truncate_prompt_tokens, truncation_side (only "right", newer
 * vLLM's default for pooling models: "left" is refused rather than silently not honoured),
 * use_activation and user. */
static int sc_common(json_t *root, char **model, int *truncate, int *use_act, struct srv_err *e)
{
    json_t *m = json_object_get(root, "model"), *u = json_object_get(root, "user");
    json_t *t = json_object_get(root, "truncate_prompt_tokens");
    json_t *side = json_object_get(root, "truncation_side");
    if (side && !json_is_null(side)) {
        if (!json_is_string(side))
            return srv_err_type(e, "truncation_side", "a string");
        if (strcmp(json_string_value(side), "right")) {
            srv_err_set(e, 400, SC_INVALID, "truncation_side", "invalid_value",
                        "'truncation_side' may only be 'right' (each text keeps its first "
                        "tokens)");
            return -1;
        }
    }
    json_t *a = json_object_get(root, "use_activation");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m))
            return srv_err_type(e, "model", "a string");
        if (!(*model = srv_dup_n(json_string_value(m), json_string_length(m))))
            return srv_err_oom(e);
    }
    *truncate = SRV_TRUNC_NONE;
    if (t && !json_is_null(t)) {
        if (!json_is_integer(t))
            return srv_err_type(e, "truncate_prompt_tokens", "an integer");
        json_int_t v = json_integer_value(t);
        if (v == 0 || v < -1 || v > INT32_MAX) {
            srv_err_set(e, 400, SC_INVALID, "truncate_prompt_tokens", "invalid_value",
                        "'truncate_prompt_tokens' must be -1 (the model's maximum length) or a "
                        "positive number of tokens; it is %lld", (long long)v);
            return -1;
        }
        *truncate = (int)v;
    }
    *use_act = 1;
    if (a && !json_is_null(a)) {
        if (!json_is_boolean(a))
            return srv_err_type(e, "use_activation", "a boolean");
        *use_act = json_is_true(a);
    }
    if (u && !json_is_null(u) && !json_is_string(u))
        return srv_err_type(e, "user", "a string");
    return 0;
}

/* ---- /score bodies ------------------------------------------------------------------------ */

/* One side: a string, or a non-empty list of strings (vLLM's multimodal objects are not read). */
static int sc_side(struct srv_rerank_doc **out, int *n_out, json_t *v, const char *name,
                   struct srv_err *e)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_string(v))
        return srv_err_type(e, name, "a string or a list of strings");
    if (n == 0) {
        srv_err_set(e, 400, SC_INVALID, name, "invalid_value",
                    "'%s' is an empty list: at least one text must be given", name);
        return -1;
    }
    if (n > SRV_SCORE_MAX_TEXTS) {
        srv_err_set(e, 400, SC_INVALID, name, "invalid_value",
                    "'%s' may hold at most %d texts; it has %zu", name, SRV_SCORE_MAX_TEXTS, n);
        return -1;
    }
    if (!(*out = calloc(n, sizeof **out)))
        return srv_err_oom(e);
    *n_out = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(s)) {
            srv_err_set(e, 400, SC_INVALID, name, "invalid_type",
                        "'%s[%zu]' is not a string: '%s' must be a string or a list of strings",
                        name, i, name);
            return -1;
        }
        (*out)[i].len = json_string_length(s);
        if (!((*out)[i].text = srv_dup_n(json_string_value(s), (*out)[i].len)))
            return srv_err_oom(e);
    }
    return 0;
}

/* The sides under the first of vLLM's names whose first key the body has (vLLM's order). */
static int sc_sides(struct srv_score_req *r, json_t *root, struct srv_err *e)
{
    static const char *const names[][2] = {{"queries", "documents"}, {"queries", "items"},
                                           {"data_1", "data_2"}, {"text_1", "text_2"}};
    const size_t n_names = sizeof names / sizeof names[0];
    const char *const *nm = NULL;
    for (size_t i = 0; i < n_names && !nm; i++)
        if (json_object_get(root, names[i][0]) && json_object_get(root, names[i][1]))
            nm = names[i];
    for (size_t i = 0; i < n_names && !nm; i++) /* one side given: name the other */
        if (json_object_get(root, names[i][0]) || json_object_get(root, names[i][1]))
            nm = names[i];
    if (!nm)
        nm = names[n_names - 1];
    r->name_a = nm[0];
    r->name_b = nm[1];
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(root, nm[k]);
        if (!v || json_is_null(v)) {
            srv_err_set(e, 400, SC_INVALID, nm[k], "missing_required_parameter",
                        "'%s' is required (with '%s')", nm[k], nm[1 - k]);
            return -1;
        }
    }
    return sc_side(&r->a, &r->n_a, json_object_get(root, nm[0]), nm[0], e) ||
                   sc_side(&r->b, &r->n_b, json_object_get(root, nm[1]), nm[1], e)
               ? -1
               : 0;
}

/* 1:1, 1:N or N:N, and the pairs' bytes (a first text counted with each pair it is in). */
static int sc_shape(const struct srv_score_req *r, struct srv_err *e)
{
    size_t total = 0;
    if (r->n_a > 1 && r->n_a != r->n_b) {
        srv_err_set(e, 400, SC_INVALID, r->name_b, "invalid_value",
                    "Input lengths must be either 1:1, 1:N or N:N: '%s' has %d texts and '%s' "
                    "%d", r->name_a, r->n_a, r->name_b, r->n_b);
        return -1;
    }
    for (int i = 0; i < r->n_b; i++) {
        total += r->a[r->n_a > 1 ? i : 0].len + r->b[i].len;
        if (total > SRV_RERANK_MAX_TEXT) {
            srv_err_set(e, 400, SC_INVALID, r->name_b, "invalid_value",
                        "the pairs hold more than %zu bytes to tokenize (a lone '%s' counts once "
                        "per pair): send fewer or shorter texts", SRV_RERANK_MAX_TEXT, r->name_a);
            return -1;
        }
    }
    return 0;
}

/* encoding_format: scores are numbers; "float" is the only form (vLLM's default). */
static int sc_format(json_t *root, struct srv_err *e)
{
    json_t *f = json_object_get(root, "encoding_format");
    if (!f || json_is_null(f) || (json_is_string(f) && !strcmp(json_string_value(f), "float")))
        return 0;
    srv_err_set(e, 400, SC_INVALID, "encoding_format", "invalid_value",
                "'encoding_format' must be 'float': scores are numbers");
    return -1;
}

int srv_score_parse(struct srv_score_req *r, const char *body, size_t len, struct srv_err *e)
{
    memset(r, 0, sizeof *r);
    json_t *root = srv_json_body(body, len, e);
    if (!root)
        return -1;
    int rc = sc_sides(r, root, e) || sc_shape(r, e) ||
                     sc_common(root, &r->model, &r->truncate, &r->use_activation, e) ||
                     sc_format(root, e)
                 ? -1
                 : 0;
    json_decref(root);
    if (rc)
        srv_score_req_free(r);
    return rc;
}

void srv_score_req_free(struct srv_score_req *r)
{
    free(r->model);
    for (int i = 0; r->a && i < r->n_a; i++)
        free(r->a[i].text);
    for (int i = 0; r->b && i < r->n_b; i++)
        free(r->b[i].text);
    free(r->a);
    free(r->b);
    free(r->pairs.ids);
    free(r->pairs.types);
    free(r->pairs.offs);
    srv_embed_req_free(&r->uniq);
    free(r->a_of);
    free(r->b_of);
    memset(r, 0, sizeof *r);
}

/* ---- /score token ids ------------------------------------------------------------------- */

int srv_score_pack_pairs(struct srv_score_req *r, srv_pair_fn encode, void *user,
                         const struct srv_trunc *t, struct srv_err *e)
{
    struct srv_pairs pl = {.a = r->a, .b = r->b, .a_step = r->n_a > 1, .n = r->n_b,
                           .limit = t->limit, .strict = t->strict, .param = r->name_b,
                           .what = "pair",
                           .limit_param = t->strict ? NULL : "truncate_prompt_tokens"};
    return srv_pairs_pack(&r->pairs, &pl, encode, user, e);
}

/* A text of either side: slot i < n_a is a[i], else b[i - n_a]. */
struct sc_slot {
    const struct srv_rerank_doc *d;
    int slot;
};

static int sc_slot_cmp(const void *x, const void *y)
{
    const struct sc_slot *p = x, *q = y;
    if (p->d->len != q->d->len)
        return p->d->len < q->d->len ? -1 : 1;
    int c = p->d->len ? memcmp(p->d->text, q->d->text, p->d->len) : 0;
    return c ? c : (p->slot > q->slot) - (p->slot < q->slot);
}

/* r->uniq's inputs: each distinct text once (equal texts side by side after sorting), and
 * a_of / b_of pointing into them. */
static int sc_dedup(struct srv_score_req *r, struct srv_err *e)
{
    int n = r->n_a + r->n_b, rc = -1;
    struct sc_slot *s = malloc(sizeof *s * (size_t)n);
    r->a_of = malloc(sizeof(int) * (size_t)r->n_a);
    r->b_of = malloc(sizeof(int) * (size_t)r->n_b);
    r->uniq.in = calloc((size_t)n, sizeof *r->uniq.in);
    if (!s || !r->a_of || !r->b_of || !r->uniq.in)
        goto out;
    for (int i = 0; i < n; i++)
        s[i] = (struct sc_slot){.d = i < r->n_a ? &r->a[i] : &r->b[i - r->n_a], .slot = i};
    qsort(s, (size_t)n, sizeof *s, sc_slot_cmp);
    for (int i = 0; i < n; i++) {
        if (i == 0 || s[i].d->len != s[i - 1].d->len ||
            (s[i].d->len && memcmp(s[i].d->text, s[i - 1].d->text, s[i].d->len))) {
            struct srv_embed_input *in = &r->uniq.in[r->uniq.n_in++];
            if (!(in->text = srv_dup_n(s[i].d->text, s[i].d->len)))
                goto out;
            in->text_len = s[i].d->len;
        }
        int k = s[i].slot, u = r->uniq.n_in - 1;
        *(k < r->n_a ? &r->a_of[k] : &r->b_of[k - r->n_a]) = u;
    }
    rc = 0;
out:
    free(s);
    return rc ? srv_err_oom(e) : 0;
}

/* The side and index of the first text that is uniq input u. */
static void sc_origin(const struct srv_score_req *r, int u, const char **name, int *idx)
{
    for (int i = 0; i < r->n_a; i++)
        if (r->a_of[i] == u) {
            *name = r->name_a, *idx = i;
            return;
        }
    for (int i = 0; i < r->n_b; i++)
        if (r->b_of[i] == u) {
            *name = r->name_b, *idx = i;
            return;
        }
    *name = r->name_b, *idx = 0;
}

int srv_score_pack_texts(struct srv_score_req *r, srv_encode_fn encode, void *user,
                         const struct srv_trunc *t, struct srv_err *e)
{
    struct srv_embed_limits lim = {.max_tokens = t->limit};
    if (sc_dedup(r, e))
        return -1;
    if (!srv_embed_pack(&r->uniq, encode, user, &lim, e))
        return 0;
    if (!t->strict)
        return sc_trunc_failed(t, e);
    if (e->http == 400 && r->uniq.failed >= 0) { /* name the text as the body has it */
        const char *name;
        int idx;
        sc_origin(r, r->uniq.failed, &name, &idx);
        if (!strcmp(e->code ? e->code : "", "context_length_exceeded"))
            srv_err_set(e, 400, SC_INVALID, name, "context_length_exceeded",
                        "This model's maximum context length is %d tokens, however '%s[%d]' "
                        "holds more. Please reduce the length of the input, or set "
                        "'truncate_prompt_tokens'.", t->limit, name, idx);
        else
            srv_err_set(e, 400, SC_INVALID, name, "invalid_value", "'%s[%d]' has no tokens",
                        name, idx);
    }
    return -1;
}

void srv_score_cosines(const struct srv_score_req *r, const float *vec, int dim, float *scores)
{
    for (int i = 0; i < r->n_b; i++) {
        const float *x = vec + (size_t)r->a_of[r->n_a > 1 ? i : 0] * (size_t)dim;
        const float *y = vec + (size_t)r->b_of[i] * (size_t)dim;
        double xy = 0, xx = 0, yy = 0;
        for (int k = 0; k < dim; k++) {
            xy += (double)x[k] * y[k];
            xx += (double)x[k] * x[k];
            yy += (double)y[k] * y[k];
        }
        scores[i] = xx > 0 && yy > 0 ? (float)(xy / (sqrt(xx) * sqrt(yy))) : 0.0f;
    }
}

/* ---- /classify bodies and token ids --------------------------------------------------------- */

int srv_classify_parse(struct srv_classify_req *r, const char *body, size_t len,
                       const struct srv_embed_limits *lim, struct srv_err *e)
{
    memset(r, 0, sizeof *r);
    json_t *root = srv_json_body(body, len, e);
    if (!root)
        return -1;
    int rc = srv_embed_input_parse(&r->in, root, lim, e) ||
                     sc_common(root, &r->in.model, &r->truncate, &r->use_activation, e)
                 ? -1
                 : 0;
    json_decref(root);
    if (rc)
        srv_classify_req_free(r);
    return rc;
}

int srv_classify_pack(struct srv_classify_req *r, srv_encode_fn encode, void *user,
                      const struct srv_trunc *t, struct srv_err *e)
{
    struct srv_embed_limits lim = {.max_tokens = t->limit};
    /* token ids keep their first tokens, as texts do (truncation_side "right", newer vLLM's
     * default for pooling models; its older renderer kept the last of a list of ids) */
    for (int i = 0; !t->strict && i < r->in.n_in; i++)
        if (!r->in.in[i].text && r->in.in[i].n_ids > t->limit)
            r->in.in[i].n_ids = t->limit;
    return srv_embed_pack(&r->in, encode, user, &lim, e) ? sc_trunc_failed(t, e) : 0;
}

void srv_classify_req_free(struct srv_classify_req *r)
{
    srv_embed_req_free(&r->in);
    memset(r, 0, sizeof *r);
}

/* ---- labels (config.json) ------------------------------------------------------------------ */

/* id2label's names when its keys are exactly "0" .. n-1 (no list is sized by the file). */
static int sc_names(struct srv_labels *l, json_t *map, int n)
{
    const char *key;
    json_t *v;
    if (!json_is_object(map) || json_object_size(map) != (size_t)n)
        return 0;
    char **names = calloc((size_t)n, sizeof *names);
    if (!names)
        return -1;
    json_object_foreach(map, key, v) {
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id >= n || names[id] || !json_is_string(v))
            goto out_free;
        if (!(names[id] = srv_dup_n(json_string_value(v), json_string_length(v))))
            goto out_free;
    }
    l->names = names;
    return 0;
out_free:
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return 0;
}

int srv_labels_parse(struct srv_labels *l, const char *json, size_t len, int n_labels)
{
    memset(l, 0, sizeof *l);
    l->n = n_labels > 0 ? n_labels : 0;
    if (!srv_json_depth_ok(json, len, SRV_MAX_DEPTH))
        return 0;
    json_t *root = json_loadb(json, len, 0, NULL);
    const char *pt = json_string_value(json_object_get(root, "problem_type"));
    if (pt && !strcmp(pt, "regression"))
        l->act = SRV_CLS_IDENTITY;
    else if (pt && !strcmp(pt, "multi_label_classification"))
        l->act = SRV_CLS_SIGMOID;
    int rc = l->n ? sc_names(l, json_object_get(root, "id2label"), l->n) : 0;
    json_decref(root);
    return rc;
}

void srv_labels_free(struct srv_labels *l)
{
    for (int i = 0; l->names && i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

/* ---- replies ----------------------------------------------------------------------------- */

/* %.9g reads back as the same float32; JSON has no NaN or infinity: null. */
static void sc_num(struct srv_buf *out, float v)
{
    char num[32];
    if (isfinite(v))
        snprintf(num, sizeof num, "%.9g", (double)v);
    else
        snprintf(num, sizeof num, "null");
    srv_buf_str(out, num);
}

/* "id", "object", "created" and "model", then "data":[ */
static void sc_head(struct srv_buf *out, const char *id, int64_t created, const char *model)
{
    char num[48];
    srv_buf_str(out, "{\"id\":");
    srv_buf_json_text(out, id, strlen(id));
    snprintf(num, sizeof num, ",\"object\":\"list\",\"created\":%lld,\"model\":",
             (long long)created);
    srv_buf_str(out, num);
    srv_buf_json_text(out, model, strlen(model));
    srv_buf_str(out, ",\"data\":[");
}

static void sc_tail(struct srv_buf *out, int n_tokens)
{
    char tail[96];
    snprintf(tail, sizeof tail, "],\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}",
             n_tokens, n_tokens);
    srv_buf_str(out, tail);
}

void srv_score_response(struct srv_buf *out, const char *id, int64_t created, const char *model,
                        const float *scores, int n, int n_tokens)
{
    char head[64];
    sc_head(out, id, created, model);
    for (int i = 0; i < n; i++) {
        snprintf(head, sizeof head, "%s{\"index\":%d,\"object\":\"score\",\"score\":",
                 i ? "," : "", i);
        srv_buf_str(out, head);
        sc_num(out, scores[i]);
        srv_buf_add(out, "}", 1);
    }
    sc_tail(out, n_tokens);
}

/* One sequence's logits x[n] into probs, in double: softmax less its max, so no exp overflows. */
static void sc_probs(float *x, int n, int act)
{
    if (act == SRV_CLS_IDENTITY)
        return;
    if (act == SRV_CLS_SIGMOID || n == 1) {
        for (int k = 0; k < n; k++)
            x[k] = (float)(1.0 / (1.0 + exp(-(double)x[k])));
        return;
    }
    double max = -INFINITY, sum = 0;
    for (int k = 0; k < n; k++)
        max = x[k] > max ? x[k] : max;
    for (int k = 0; k < n; k++)
        sum += exp((double)x[k] - max);
    for (int k = 0; k < n; k++)
        x[k] = (float)(exp((double)x[k] - max) / sum);
}

/* The first highest of p[n] (NaN never wins; all NaN: 0). */
static int sc_argmax(const float *p, int n)
{
    int best = 0;
    for (int k = 1; k < n; k++)
        if (p[k] > p[best] || (isnan(p[best]) && !isnan(p[k])))
            best = k;
    return best;
}

static void sc_label(struct srv_buf *out, const struct srv_labels *l, int k)
{
    char def[32];
    if (l->names) {
        srv_buf_json_text(out, l->names[k], strlen(l->names[k]));
        return;
    }
    snprintf(def, sizeof def, "\"LABEL_%d\"", k);
    srv_buf_str(out, def);
}

void srv_classify_response(struct srv_buf *out, const char *id, int64_t created,
                           const char *model, const struct srv_labels *l, float *logits, int n,
                           int use_activation, int n_tokens)
{
    char head[64];
    int nl = l->n;
    sc_head(out, id, created, model);
    for (int i = 0; i < n && nl > 0; i++) {
        float *p = logits + (size_t)i * (size_t)nl;
        if (use_activation)
            sc_probs(p, nl, l->act);
        snprintf(head, sizeof head, "%s{\"index\":%d,\"label\":", i ? "," : "", i);
        srv_buf_str(out, head);
        sc_label(out, l, sc_argmax(p, nl));
        srv_buf_str(out, ",\"probs\":[");
        for (int k = 0; k < nl; k++) {
            if (k)
                srv_buf_add(out, ",", 1);
            sc_num(out, p[k]);
        }
        snprintf(head, sizeof head, "],\"num_classes\":%d}", nl);
        srv_buf_str(out, head);
    }
    sc_tail(out, n_tokens);
}

/* ---- truncating a text as Hugging Face does --------------------------------------------- */

/* Where the text's own tokens plain[np] sit in full[nf] (its encoding with special tokens), or
 * -1: a post-processor that only adds tokens around the text keeps them whole. */
static long sc_find(const int32_t *full, size_t nf, const int32_t *plain, size_t np)
{
    for (size_t p = 0; p + np <= nf; p++)
        if (!np || !memcmp(full + p, plain, sizeof(int32_t) * np))
            return (long)p;
    return -1;
}

int srv_encode_truncated(void *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                         size_t *n)
{
    int32_t *full = NULL, *plain = NULL;
    size_t nf = 0, np = 0;
    int st = kwk_tokenizer_encode(tok, text, len, 1, ids, cap, n);
    if (st != KWK_ELIMIT)
        return st;
    /* longer than cap: tokenizers cut the text's tokens before the post-processor adds its
     * own, so the result is the specials around the first cap - specials tokens */
    if ((st = kwk_tokenizer_encode_alloc(tok, text, len, 1, &full, &nf)) ||
        (st = kwk_tokenizer_encode_alloc(tok, text, len, 0, &plain, &np)))
        goto out;
    long at = nf >= np ? sc_find(full, nf, plain, np) : -1;
    size_t added = nf - np;
    if (at < 0 || cap < added) {
        st = at < 0 ? KWK_EUNSUPPORTED : KWK_ELIMIT;
        *n = nf;
        goto out;
    }
    size_t keep = cap - added, pre = (size_t)at, post = nf - pre - np;
    memcpy(ids, full, sizeof(int32_t) * pre);
    memcpy(ids + pre, plain, sizeof(int32_t) * keep);
    memcpy(ids + pre + keep, full + pre + np, sizeof(int32_t) * post);
    *n = cap;
out:
    kwk_tokenizer_mem_free(full);
    kwk_tokenizer_mem_free(plain);
    return st;
}
