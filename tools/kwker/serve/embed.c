/* embed.c - OpenAI's /v1/embeddings: request bodies to struct srv_embed_req, their inputs to
 * token ids in kwk_encoder_embed's layout, and the reply's JSON. No HTTP and no threads (the
 * fuzz target and tests/c/test_embed.c drive it directly); any thread, one request per call.
 * Static names carry an emb_ prefix: the fuzz target includes this file with openai.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define EMB_INVALID "invalid_request_error"
#define EMB_INPUT_TYPES "a string, a list of strings, a list of token ids or a list of lists " \
                        "of token ids"

/* ---- parsing --------------------------------------------------------------------------------- */

/* A text input; idx names it in messages (-1: the body's one string). */
static int emb_text(struct srv_embed_input *in, json_t *v, int idx, struct srv_err *e)
{
    size_t n = json_string_length(v);
    if (n == 0) {
        /* OpenAI refuses it too: an empty text has no meaning to embed */
        if (idx < 0)
            srv_err_set(e, 400, EMB_INVALID, "input", "invalid_value", "'input' is an empty "
                        "string");
        else
            srv_err_set(e, 400, EMB_INVALID, "input", "invalid_value", "'input[%d]' is an "
                        "empty string", idx);
        return -1;
    }
    if (!(in->text = srv_dup_n(json_string_value(v), n)))
        return srv_err_oom(e);
    in->text_len = n;
    return 0;
}

/* Token ids a: idx names the input in messages (-1: the body's one list of ids). */
static int emb_ids(struct srv_embed_input *in, json_t *a, int idx,
                   const struct srv_embed_limits *lim, struct srv_err *e)
{
    size_t n = json_array_size(a);
    char name[32];
    if (idx < 0)
        snprintf(name, sizeof name, "input");
    else
        snprintf(name, sizeof name, "input[%d]", idx);
    if (n == 0) {
        srv_err_set(e, 400, EMB_INVALID, "input", "invalid_value", "'%s' is an empty list of "
                    "token ids", name);
        return -1;
    }
    /* the body limit bounds n; the length limit is srv_embed_pack's, one place for both kinds */
    if (n > INT32_MAX / 2 || !(in->ids = malloc(sizeof(int32_t) * n)))
        return srv_err_oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) {
            srv_err_set(e, 400, EMB_INVALID, "input", "invalid_type", "'%s[%zu]' is not a token "
                        "id: 'input' must be " EMB_INPUT_TYPES, name, i);
            return -1;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= lim->n_vocab) {
            srv_err_set(e, 400, EMB_INVALID, "input", "invalid_value", "'%s[%zu]' is %lld, not "
                        "a token id of this model (0 to %d)", name, i, (long long)id,
                        lim->n_vocab - 1);
            return -1;
        }
        in->ids[i] = (int32_t)id;
    }
    in->n_ids = (int)n;
    return 0;
}

/* A list: of strings, of lists of ids (one input each), or of ids (one input); never mixed. */
static int emb_list(struct srv_embed_req *r, json_t *a, const struct srv_embed_limits *lim,
                    struct srv_err *e)
{
    size_t n = json_array_size(a);
    json_t *first = json_array_get(a, 0);
    if (n == 0) {
        srv_err_set(e, 400, EMB_INVALID, "input", "invalid_value", "'input' is an empty list");
        return -1;
    }
    int ids_only = json_is_integer(first);
    size_t n_in = ids_only ? 1 : n;
    if (n_in > SRV_EMBED_MAX_INPUTS) {
        srv_err_set(e, 400, EMB_INVALID, "input", "invalid_value", "'input' may hold at most %d "
                    "inputs; it has %zu", SRV_EMBED_MAX_INPUTS, n);
        return -1;
    }
    if (!(r->in = calloc(n_in, sizeof *r->in)))
        return srv_err_oom(e);
    r->n_in = (int)n_in;
    if (ids_only)
        return emb_ids(&r->in[0], a, -1, lim, e);
    int strings = json_is_string(first);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        int rc = strings && json_is_string(v)   ? emb_text(&r->in[i], v, (int)i, e)
                 : !strings && json_is_array(v) ? emb_ids(&r->in[i], v, (int)i, lim, e)
                                                : 1;
        if (rc == 1) {
            srv_err_set(e, 400, EMB_INVALID, "input", "invalid_type", "'input[%zu]' is not %s "
                        "as 'input[0]' is: 'input' must be " EMB_INPUT_TYPES, i,
                        strings ? "a string" : "a list of token ids");
            return -1;
        }
        if (rc)
            return -1;
    }
    return 0;
}

int srv_embed_input_parse(struct srv_embed_req *r, json_t *root,
                          const struct srv_embed_limits *lim, struct srv_err *e)
{
    json_t *v = json_object_get(root, "input");
    if (!v || json_is_null(v)) {
        srv_err_set(e, 400, EMB_INVALID, "input", "missing_required_parameter",
                    "'input' is required");
        return -1;
    }
    if (json_is_array(v))
        return emb_list(r, v, lim, e);
    if (!json_is_string(v))
        return srv_err_type(e, "input", EMB_INPUT_TYPES);
    if (!(r->in = calloc(1, sizeof *r->in)))
        return srv_err_oom(e);
    r->n_in = 1;
    return emb_text(&r->in[0], v, -1, e);
}

/* model (required, as the other routes), encoding_format, dimensions and user. */
static int emb_fields(struct srv_embed_req *r, json_t *root, const struct srv_embed_limits *lim,
                      struct srv_err *e)
{
    json_t *m = json_object_get(root, "model");
    if (!m || json_is_null(m)) {
        srv_err_set(e, 400, EMB_INVALID, "model", "missing_required_parameter",
                    "'model' is required");
        return -1;
    }
    if (!json_is_string(m))
        return srv_err_type(e, "model", "a string");
    if (!(r->model = srv_dup_n(json_string_value(m), json_string_length(m))))
        return srv_err_oom(e);
    json_t *f = json_object_get(root, "encoding_format");
    if (f && !json_is_null(f)) {
        const char *s = json_string_value(f);
        if (!s || (strcmp(s, "float") && strcmp(s, "base64"))) {
            srv_err_set(e, 400, EMB_INVALID, "encoding_format", "invalid_value",
                        "'encoding_format' must be 'float' or 'base64'");
            return -1;
        }
        r->base64 = !strcmp(s, "base64");
    }
    json_t *d = json_object_get(root, "dimensions");
    if (d && !json_is_null(d)) {
        if (!json_is_integer(d))
            return srv_err_type(e, "dimensions", "an integer");
        /* no Matryoshka training here: a shortened embedding would be a wrong one */
        if (json_integer_value(d) != lim->dim) {
            srv_err_set(e, 400, EMB_INVALID, "dimensions", "invalid_value", "'dimensions' must "
                        "be %d, this model's embedding size: it cannot shorten its embeddings",
                        lim->dim);
            return -1;
        }
    }
    json_t *u = json_object_get(root, "user");
    if (u && !json_is_null(u) && !json_is_string(u))
        return srv_err_type(e, "user", "a string");
    return 0;
}

int srv_embed_parse(struct srv_embed_req *r, const char *body, size_t len,
                    const struct srv_embed_limits *lim, struct srv_err *e)
{
    memset(r, 0, sizeof *r);
    json_t *root = srv_json_body(body, len, e);
    if (!root)
        return -1;
    int rc = emb_fields(r, root, lim, e) || srv_embed_input_parse(r, root, lim, e) ? -1 : 0;
    json_decref(root);
    if (rc)
        srv_embed_req_free(r);
    return rc;
}

/* ---- token ids ------------------------------------------------------------------------------- */

static int emb_too_long(struct srv_err *e, const struct srv_embed_limits *lim, size_t n, int i)
{
    srv_err_set(e, 400, EMB_INVALID, "input", "context_length_exceeded",
                "This model's maximum context length is %d tokens, however you requested %zu "
                "tokens (input %d). Please reduce the length of the input.",
                lim->max_tokens, n, i);
    return -1;
}

/* Room for one more input of up to max_tokens ids after the first used. */
static int emb_reserve(struct srv_embed_req *r, size_t used, size_t *cap, size_t max_tokens)
{
    if (used + max_tokens <= *cap)
        return 0;
    size_t want = *cap * 2 > used + max_tokens ? *cap * 2 : used + max_tokens;
    int32_t *p = want < (size_t)INT32_MAX ? realloc(r->ids, sizeof(int32_t) * want) : NULL;
    if (!p)
        return -1;
    r->ids = p;
    *cap = want;
    return 0;
}

/* Input i's tokens at r->ids + *used. */
static int emb_pack_one(struct srv_embed_req *r, int i, size_t *used, size_t *cap,
                        srv_encode_fn encode, void *user, const struct srv_embed_limits *lim,
                        struct srv_err *e)
{
    size_t max = lim->max_tokens > 0 ? (size_t)lim->max_tokens : 0;
    struct srv_embed_input *in = &r->in[i];
    size_t n = (size_t)in->n_ids;
    if (emb_reserve(r, *used, cap, max))
        return srv_err_oom(e);
    if (in->text) {
        int st = encode(user, in->text, in->text_len, r->ids + *used, max, &n);
        if (st == KWK_ELIMIT)
            return emb_too_long(e, lim, n, i);
        if (st < 0) {
            srv_err_set(e, 500, "server_error", NULL, NULL, "tokenizing input %d: %s", i,
                        kwk_status_str(st));
            return -1;
        }
    } else if (n <= max) {
        memcpy(r->ids + *used, in->ids, sizeof(int32_t) * n);
    }
    if (n > max)
        return emb_too_long(e, lim, n, i);
    if (n == 0) { /* a tokenizer without special tokens may give none */
        srv_err_set(e, 400, EMB_INVALID, "input", "invalid_value", "'input[%d]' has no "
                    "tokens", i);
        return -1;
    }
    *used += n;
    r->offs[i + 1] = (int32_t)*used;
    return 0;
}

int srv_embed_pack(struct srv_embed_req *r, srv_encode_fn encode, void *user,
                   const struct srv_embed_limits *lim, struct srv_err *e)
{
    size_t used = 0, cap = 0;
    r->failed = -1;
    if (!(r->offs = calloc((size_t)r->n_in + 1, sizeof(int32_t))))
        return srv_err_oom(e);
    for (int i = 0; i < r->n_in; i++) {
        if (emb_pack_one(r, i, &used, &cap, encode, user, lim, e)) {
            r->failed = i;
            return -1;
        }
    }
    return 0;
}

void srv_embed_req_free(struct srv_embed_req *r)
{
    free(r->model);
    for (int i = 0; r->in && i < r->n_in; i++) {
        free(r->in[i].text);
        free(r->in[i].ids);
    }
    free(r->in);
    free(r->ids);
    free(r->offs);
    memset(r, 0, sizeof *r);
}

/* ---- the reply ------------------------------------------------------------------------------- */

/* %.9g: nine significant digits read back as the same float32 (FLT_DECIMAL_DIG). JSON has no
 * NaN or infinity: such a number is null, which a client sees rather than a broken body. */
static void emb_floats(struct srv_buf *out, const float *v, int dim)
{
    char num[32];
    srv_buf_add(out, "[", 1);
    for (int k = 0; k < dim; k++) {
        int n = isfinite(v[k]) ? snprintf(num, sizeof num, "%.9g", (double)v[k])
                               : snprintf(num, sizeof num, "null");
        if (k)
            srv_buf_add(out, ",", 1);
        srv_buf_add(out, num, (size_t)n);
    }
    srv_buf_add(out, "]", 1);
}

/* OpenAI's base64: the float32 values' little-endian bytes, whatever this host's order. */
static void emb_base64(struct srv_buf *out, const float *v, int dim)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char b[3];
    char q[4];
    size_t nb = (size_t)dim * 4, held = 0;
    srv_buf_add(out, "\"", 1);
    for (size_t i = 0; i < nb; i++) {
        uint32_t u;
        memcpy(&u, &v[i / 4], 4);
        b[held++] = (unsigned char)(u >> (8 * (i % 4)));
        if (held < 3 && i + 1 < nb)
            continue;
        uint32_t w = (uint32_t)b[0] << 16 | (held > 1 ? (uint32_t)b[1] << 8 : 0) |
                     (held > 2 ? b[2] : 0);
        for (int k = 0; k < 4; k++)
            q[k] = k <= (int)held ? abc[w >> (18 - 6 * k) & 63] : '=';
        srv_buf_add(out, q, 4);
        held = 0;
    }
    srv_buf_add(out, "\"", 1);
}

void srv_embed_response(struct srv_buf *out, const char *model, const float *vec, int n,
                        int dim, int base64, int n_tokens)
{
    char head[96];
    srv_buf_str(out, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < n; i++) {
        snprintf(head, sizeof head, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":",
                 i ? "," : "", i);
        srv_buf_str(out, head);
        if (base64)
            emb_base64(out, vec + (size_t)i * (size_t)dim, dim);
        else
            emb_floats(out, vec + (size_t)i * (size_t)dim, dim);
        srv_buf_add(out, "}", 1);
    }
    /* the served id is a file name: jansson escapes it (NULL when it is not UTF-8) */
    json_t *m = json_string(model);
    char *mj = m ? json_dumps(m, JSON_ENCODE_ANY) : NULL;
    srv_buf_str(out, "],\"model\":");
    srv_buf_str(out, mj ? mj : "null");
    snprintf(head, sizeof head, ",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}",
             n_tokens, n_tokens);
    srv_buf_str(out, head);
    free(mj);
    json_decref(m);
}
