/* openai.c - OpenAI request bodies to struct srv_req, and response / SSE chunk JSON, with no
 * HTTP in sight (the fuzz target drives it directly). Any thread; one request per call. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define INVALID "invalid_request_error"

void srv_err_set(struct srv_err *e, int http, const char *type, const char *param,
                 const char *code, const char *fmt, ...)
{
    va_list ap;
    e->http = http;
    e->type = type;
    e->param = param;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

/* ---- buffers --------------------------------------------------------------------------------- */

void srv_buf_add(struct srv_buf *b, const void *data, size_t n)
{
    if (b->err || n == 0)
        return;
    if (n > SIZE_MAX / 2 - b->len) {
        b->err = 1;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->err = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
}

void srv_buf_str(struct srv_buf *b, const char *s)
{
    srv_buf_add(b, s, strlen(s));
}

void srv_buf_free(struct srv_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- depth pre-scan -------------------------------------------------------------------------- */

int srv_json_depth_ok(const char *s, size_t len, int max_depth)
{
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++; /* the escaped byte cannot end the string */
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return 0;
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return 1;
}

/* ---- field readers: each returns 0 (absent or valid) or -1 with e set ------------------------ */

int srv_err_type(struct srv_err *e, const char *key, const char *want)
{
    srv_err_set(e, 400, INVALID, key, "invalid_type", "'%s' must be %s", key, want);
    return -1;
}

static int bad_value(struct srv_err *e, const char *key, const char *why)
{
    srv_err_set(e, 400, INVALID, key, "invalid_value", "'%s' %s", key, why);
    return -1;
}

/* A number in [lo, hi] (null = absent). *given says whether it was there. */
static int get_num(json_t *o, const char *key, double lo, double hi, double *out, int *given)
{
    json_t *v = json_object_get(o, key);
    if (given)
        *given = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return -2;
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return -3;
    *out = x;
    if (given)
        *given = 1;
    return 0;
}

static int num_field(json_t *o, const char *key, double lo, double hi, double *out, int *given,
                     struct srv_err *e)
{
    int rc = get_num(o, key, lo, hi, out, given);
    if (rc == -2)
        return srv_err_type(e, key, "a number");
    if (rc == -3) {
        srv_err_set(e, 400, INVALID, key, "invalid_value", "'%s' must be in [%g, %g]", key, lo,
                    hi);
        return -1;
    }
    return 0;
}

static int int_field(json_t *o, const char *key, json_int_t lo, json_int_t hi, json_int_t *out,
                     int *given, struct srv_err *e)
{
    json_t *v = json_object_get(o, key);
    *given = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return srv_err_type(e, key, "an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        srv_err_set(e, 400, INVALID, key, "invalid_value", "'%s' must be in [%lld, %lld]", key,
                    (long long)lo, (long long)hi);
        return -1;
    }
    *out = x;
    *given = 1;
    return 0;
}

static int bool_field(json_t *o, const char *key, int *out, struct srv_err *e)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return srv_err_type(e, key, "a boolean");
    *out = json_is_true(v);
    return 0;
}

char *srv_dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

int srv_err_oom(struct srv_err *e)
{
    srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* ---- chat messages --------------------------------------------------------------------------- */

/* content: a string, or an array of {"type": "text", "text": ...} parts joined; null allowed
 * for an assistant message (one that only calls tools), rendered as empty. */
static int message_content(json_t *c, const char *role, struct srv_buf *b, struct srv_err *e)
{
    if (!c || json_is_null(c)) {
        if (strcmp(role, "assistant"))
            return bad_value(e, "messages", "content is required except for assistant messages");
        return 0;
    }
    if (json_is_string(c)) {
        srv_buf_add(b, json_string_value(c), json_string_length(c));
        return 0;
    }
    if (!json_is_array(c))
        return srv_err_type(e, "messages", "a list of messages whose content is a string or a "
                                       "list of text parts");
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !type)
            return srv_err_type(e, "messages", "content parts that are objects with a 'type'");
        if (strcmp(type, "text"))
            return bad_value(e, "messages", "content parts other than 'text' are not supported");
        if (!json_is_string(text))
            return srv_err_type(e, "messages", "text parts with a string 'text'");
        srv_buf_add(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

static int is_role(const char *r)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(r, roles[i]))
            return 1;
    return 0;
}

/* An assistant message's earlier calls for the template: {"id", "type", "function": {"name",
 * "arguments"}} with the arguments as a JSON object where their text is one (templates write
 * them with tojson, as transformers' examples give them). */
static int tool_calls_in(json_t *calls, json_t *msg, struct srv_err *e)
{
    json_t *out = json_array(), *c;
    size_t i;
    if (!out)
        return srv_err_oom(e);
    if (json_object_set_new(msg, "tool_calls", out))
        return srv_err_oom(e);
    if (!json_is_array(calls) || json_array_size(calls) > SRV_MAX_TOOLS)
        return srv_err_type(e, "messages", "a list of messages whose 'tool_calls' is a list of at "
                                       "most 128 calls");
    json_array_foreach(calls, i, c)
    {
        json_t *fn = json_object_get(c, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        json_t *id = json_object_get(c, "id");
        if (!json_is_object(c) || !json_is_string(name) || (id && !json_is_string(id)) ||
            !(json_is_string(args) || json_is_object(args)))
            return srv_err_type(e, "messages", "a list of messages whose tool calls are {\"id\", "
                                           "\"type\": \"function\", \"function\": "
                                           "{\"name\", \"arguments\"}}");
        /* the arguments' text gets the body's nesting limit too (jansson's own is 2048) */
        json_t *a = json_is_string(args) && srv_json_depth_ok(json_string_value(args),
                                                              json_string_length(args),
                                                              SRV_MAX_DEPTH)
                        ? json_loadb(json_string_value(args), json_string_length(args), 0, NULL)
                        : NULL;
        if (a && !json_is_object(a)) {
            json_decref(a);
            a = NULL;
        }
        json_t *one = json_pack("{s:O?, s:s, s:{s:O, s:o}}", "id", id, "type", "function",
                                "function", "name", name, "arguments",
                                a ? a : json_incref(args));
        if (!one || json_array_append_new(out, one))
            return srv_err_oom(e);
    }
    return 0;
}

/* One message into {role, content} (plus an assistant's tool_calls, a tool result's
 * tool_call_id and name) for the template. "developer" (OpenAI's newer name for the system
 * role) is given to templates as "system", which is the role they know. */
static int add_message(json_t *out, json_t *m, struct srv_err *e)
{
    struct srv_buf b = {0};
    int rc = -1;
    if (!json_is_object(m))
        return srv_err_type(e, "messages", "a list of objects");
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role)
        return srv_err_type(e, "messages", "a list of messages each with a string 'role'");
    if (!is_role(role))
        return bad_value(e, "messages", "has a role that is not system, developer, user, "
                                        "assistant or tool");
    if (message_content(json_object_get(m, "content"), role, &b, e))
        goto out;
    srv_buf_add(&b, "", 1); /* never a NULL pointer for an empty content */
    if (b.err)
        goto out_oom;
    json_t *msg = json_pack("{s:s, s:s%}", "role", strcmp(role, "developer") ? role : "system",
                            "content", b.p, b.len - 1);
    if (!msg || json_array_append_new(out, msg))
        goto out_oom;
    json_t *calls = json_object_get(m, "tool_calls");
    if (calls && !json_is_null(calls)) {
        if (strcmp(role, "assistant")) {
            bad_value(e, "messages", "has 'tool_calls' outside an assistant message");
            goto out;
        }
        if (tool_calls_in(calls, msg, e))
            goto out;
    }
    static const char *const tool_keys[] = {"tool_call_id", "name"};
    for (size_t k = 0; k < 2; k++) {
        json_t *v = json_object_get(m, tool_keys[k]);
        if (!v || json_is_null(v))
            continue;
        if (!json_is_string(v)) {
            srv_err_type(e, "messages", "messages whose 'tool_call_id' and 'name' are strings");
            goto out;
        }
        if (json_object_set(msg, tool_keys[k], v))
            goto out_oom;
    }
    rc = 0;
    goto out;
out_oom:
    srv_err_oom(e);
out:
    srv_buf_free(&b);
    return rc;
}

/* The variables a request's own fields give the template: transformers' apply_chat_template
 * takes them as its parameters, so its **kwargs cannot name them (a TypeError there) */
static const char *const template_own_vars[] = {"messages", "tools", "documents",
                                                "add_generation_prompt", NULL};

int srv_template_kwargs_check(const json_t *kw, const char *param, struct srv_err *e)
{
    if (!json_is_object(kw))
        return srv_err_type(e, param, "an object of template variables");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)kw, key, v)
    {
        for (int i = 0; template_own_vars[i]; i++)
            if (!strcmp(key, template_own_vars[i])) {
                srv_err_set(e, 400, INVALID, param, "invalid_value",
                            "'%s' may not set '%s': the request's own '%s' does", param, key,
                            key);
                return -1;
            }
    }
    return 0;
}

/* chat_template_kwargs (vLLM's and llama.cpp's name): more variables for the template, as
 * apply_chat_template(**kwargs) passes them (Qwen3's enable_thinking, Llama 3.1's date_string);
 * null is none. */
static int parse_template_kwargs(struct srv_req *r, json_t *root, struct srv_err *e)
{
    json_t *kw = json_object_get(root, "chat_template_kwargs");
    if (!kw || json_is_null(kw))
        return 0;
    if (srv_template_kwargs_check(kw, "chat_template_kwargs", e))
        return -1;
    r->template_kwargs = json_incref(kw);
    return 0;
}

int srv_reasoning_format_parse(const char *name)
{
    if (!strcmp(name, "auto"))
        return SRV_REASONING_AUTO;
    if (!strcmp(name, "deepseek"))
        return SRV_REASONING_DEEPSEEK;
    if (!strcmp(name, "none"))
        return SRV_REASONING_NONE;
    return -1;
}

/* A chat request's reasoning_format (llama.cpp's, over the server's option) and include_reasoning
 * (vLLM's). */
static int parse_reasoning(struct srv_req *r, json_t *root, struct srv_err *e)
{
    r->reasoning_format = -1;
    r->include_reasoning = 1;
    json_t *f = json_object_get(root, "reasoning_format");
    if (f && !json_is_null(f)) {
        if (!json_is_string(f))
            return srv_err_type(e, "reasoning_format", "a string");
        if ((r->reasoning_format = srv_reasoning_format_parse(json_string_value(f))) < 0)
            return bad_value(e, "reasoning_format", "must be one of 'auto', 'deepseek', 'none'");
    }
    return bool_field(root, "include_reasoning", &r->include_reasoning, e);
}

static int parse_messages(struct srv_req *r, json_t *root, struct srv_err *e)
{
    if (parse_template_kwargs(r, root, e) ||
        bool_field(root, "add_generation_prompt", &r->add_generation_prompt, e) ||
        bool_field(root, "continue_final_message", &r->continue_final, e))
        return -1;
    /* transformers' and vLLM's refusal: a new assistant turn and the last one continued */
    if (r->continue_final && r->add_generation_prompt)
        return bad_value(e, "continue_final_message", "cannot be true while "
                         "'add_generation_prompt' is true (set it to false)");
    json_t *ms = json_object_get(root, "messages");
    if (!ms || json_is_null(ms)) {
        srv_err_set(e, 400, INVALID, "messages", "missing_required_parameter",
                    "'messages' is required");
        return -1;
    }
    if (!json_is_array(ms))
        return srv_err_type(e, "messages", "a list of messages");
    if (json_array_size(ms) == 0)
        return bad_value(e, "messages", "must not be empty");
    if (!(r->messages = json_array()))
        return srv_err_oom(e);
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m)
    {
        if (add_message(r->messages, m, e))
            return -1;
    }
    /* as given: the parsed message holds "" for a null content, which transformers refuses */
    json_t *last = json_object_get(json_array_get(ms, json_array_size(ms) - 1), "content");
    if (r->continue_final && (!last || json_is_null(last)))
        return bad_value(e, "continue_final_message", "is set but the final message has no "
                         "content to continue");
    return 0;
}

/* Python's str.isspace for the code point ending at text[end] (UTF-8): its byte length, or 0. */
static size_t py_space_before(const char *text, size_t end)
{
    const unsigned char *t = (const unsigned char *)text;
    if (end == 0)
        return 0;
    unsigned char c = t[end - 1];
    if (c < 0x80)
        return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) ? 1 : 0;
    size_t k = 1; /* back to the lead byte */
    while (k < 4 && k < end && (t[end - k] & 0xc0) == 0x80)
        k++;
    uint32_t u = 0;
    const unsigned char *p = t + end - k;
    if (k == 2 && (p[0] & 0xe0) == 0xc0)
        u = (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
    else if (k == 3 && (p[0] & 0xf0) == 0xe0)
        u = (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 | (p[2] & 0x3f);
    else
        return 0;
    int space = u == 0x85 || u == 0xa0 || u == 0x1680 || (u >= 0x2000 && u <= 0x200a) ||
                u == 0x2028 || u == 0x2029 || u == 0x202f || u == 0x205f || u == 0x3000;
    return space ? k : 0;
}

/* Python's str.isspace for the code point starting at text[i]: its byte length, or 0. */
static size_t py_space_at(const char *text, size_t len, size_t i)
{
    size_t k = 1;
    while (i + k < len && k < 4 && ((unsigned char)text[i + k] & 0xc0) == 0x80)
        k++;
    return py_space_before(text, i + k) == k ? k : 0;
}

static const char *find_last(const char *hay, size_t n, const char *needle, size_t m)
{
    for (size_t i = n >= m ? n - m + 1 : 0; i-- > 0;)
        if (!memcmp(hay + i, needle, m))
            return hay + i;
    return NULL;
}

long srv_continue_cut(const char *text, size_t len, const char *final, size_t final_len)
{
    /* final.strip() must be in the text, and the tag (stripped) after it */
    size_t a = 0, b = final_len, k;
    while (a < b && (k = py_space_at(final, final_len, a)))
        a += k;
    while (b > a && (k = py_space_before(final, b)))
        b -= k;
    static const char tag[] = SRV_CONTINUE_TAG;
    size_t tn = sizeof tag - 1;
    if ((b > a && !memmem(text, len, final + a, b - a)) || !(find_last(text, len, tag, tn - 1)))
        return -1;
    size_t at = (size_t)(find_last(text, len, tag, tn - 1) - text);
    if (at + tn <= len && !memcmp(text + at, tag, tn))
        return (long)at; /* the template kept the message's spacing */
    while (at > 0 && (k = py_space_before(text, at))) /* it trimmed it: so do we */
        at -= k;
    return (long)at;
}

/* ---- completions prompt ---------------------------------------------------------------------- */

static int prompt_ids(struct srv_req *r, json_t *a, const struct srv_limits *lim,
                      struct srv_err *e)
{
    size_t n = json_array_size(a);
    if (n == 0)
        return bad_value(e, "prompt", "must not be empty");
    if (n > (size_t)lim->max_cache_len)
        goto too_long;
    if (!(r->prompt_ids = malloc(sizeof(int32_t) * n)))
        return srv_err_oom(e);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v))
            return srv_err_type(e, "prompt", "a string, a list of token ids, or a list of one of "
                                         "those");
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= lim->n_vocab)
            return bad_value(e, "prompt", "has a token id outside the vocabulary");
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = (int)n;
    return 0;
too_long:
    srv_err_set(e, 400, INVALID, "prompt", "context_length_exceeded",
                "This model's maximum context length is %d tokens; the prompt has %zu",
                lim->max_cache_len, n);
    return -1;
}

/* prompt: a string, a list of token ids, or a list holding one of those (one choice: n = 1). */
static int parse_prompt(struct srv_req *r, json_t *root, const struct srv_limits *lim,
                        struct srv_err *e)
{
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p)) {
        srv_err_set(e, 400, INVALID, "prompt", "missing_required_parameter",
                    "'prompt' is required");
        return -1;
    }
    if (json_is_array(p) && json_array_size(p) >= 1 && !json_is_integer(json_array_get(p, 0))) {
        if (json_array_size(p) > 1)
            return bad_value(e, "prompt", "may hold one prompt only (one choice per request)");
        p = json_array_get(p, 0);
    }
    if (json_is_string(p)) {
        r->prompt_len = json_string_length(p);
        if (!(r->prompt = srv_dup_n(json_string_value(p), r->prompt_len)))
            return srv_err_oom(e);
        return 0;
    }
    if (json_is_array(p))
        return prompt_ids(r, p, lim, e);
    return srv_err_type(e, "prompt", "a string, a list of token ids, or a list of one of those");
}

/* ---- sampling and the rest ------------------------------------------------------------------- */

static int parse_stop(struct srv_req *r, json_t *root, struct srv_err *e)
{
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s))
        return 0;
    if (json_is_string(s)) {
        if (json_string_length(s) == 0)
            return 0;
        if (!(r->stop[0] = srv_dup_n(json_string_value(s), json_string_length(s))))
            return srv_err_oom(e);
        r->n_stop = 1;
        return 0;
    }
    if (!json_is_array(s))
        return srv_err_type(e, "stop", "a string or a list of strings");
    if (json_array_size(s) > SRV_MAX_STOP)
        return bad_value(e, "stop", "may hold at most 4 strings");
    size_t i;
    json_t *v;
    json_array_foreach(s, i, v)
    {
        if (!json_is_string(v))
            return srv_err_type(e, "stop", "a string or a list of strings");
        if (json_string_length(v) == 0 || memchr(json_string_value(v), 0, json_string_length(v)))
            continue;
        if (!(r->stop[r->n_stop] = srv_dup_n(json_string_value(v), json_string_length(v))))
            return srv_err_oom(e);
        r->n_stop++;
    }
    return 0;
}

/* vLLM's stopping fields: stop_token_ids, min_tokens, ignore_eos; include_stop_str_in_output
 * only at its default (the reply's text never holds what stopped it). After parse_max_tokens. */
static int parse_vllm_stops(struct srv_req *r, json_t *root, const struct srv_limits *lim,
                            struct srv_err *e)
{
    json_int_t v = 0;
    int given = 0, include = 0;
    if (int_field(root, "min_tokens", 0, lim->max_cache_len, &v, &given, e) ||
        bool_field(root, "ignore_eos", &r->ignore_eos, e) ||
        bool_field(root, "include_stop_str_in_output", &include, e))
        return -1;
    r->min_tokens = (int)v;
    if (r->max_tokens >= 0 && r->min_tokens > r->max_tokens)
        return bad_value(e, "min_tokens", "must be at most max_tokens");
    if (include)
        return bad_value(e, "include_stop_str_in_output", "is not supported");
    json_t *ids = json_object_get(root, "stop_token_ids");
    if (!ids || json_is_null(ids))
        return 0;
    if (!json_is_array(ids))
        return srv_err_type(e, "stop_token_ids", "a list of token ids");
    if (json_array_size(ids) > SRV_MAX_STOP_IDS)
        return bad_value(e, "stop_token_ids", "may hold at most 64 ids");
    size_t i;
    json_t *id;
    json_array_foreach(ids, i, id)
    {
        if (!json_is_integer(id))
            return srv_err_type(e, "stop_token_ids", "a list of token ids");
        if (json_integer_value(id) < 0 || json_integer_value(id) >= lim->n_vocab)
            return bad_value(e, "stop_token_ids", "has a token id outside the vocabulary");
        r->stop_ids[r->n_stop_ids++] = (int32_t)json_integer_value(id);
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100]} */
static int parse_bias(struct srv_req *r, json_t *root, const struct srv_limits *lim,
                      struct srv_err *e)
{
    json_t *b = json_object_get(root, "logit_bias");
    if (!b || json_is_null(b))
        return 0;
    if (!json_is_object(b))
        return srv_err_type(e, "logit_bias", "an object mapping token ids to numbers");
    size_t n = json_object_size(b);
    if (n == 0)
        return 0;
    if (n > 1024)
        return bad_value(e, "logit_bias", "may hold at most 1024 tokens");
    r->bias_ids = malloc(sizeof(int32_t) * n);
    r->bias = malloc(sizeof(float) * n);
    if (!r->bias_ids || !r->bias)
        return srv_err_oom(e);
    const char *key;
    json_t *v;
    json_object_foreach(b, key, v)
    {
        char *end;
        errno = 0;
        long id = strtol(key, &end, 10);
        if (end == key || *end || errno || id < 0 || id >= lim->n_vocab)
            return bad_value(e, "logit_bias", "keys must be token ids in the vocabulary");
        if (!json_is_number(v))
            return srv_err_type(e, "logit_bias", "an object mapping token ids to numbers");
        double x = json_number_value(v);
        if (!isfinite(x) || x < -100 || x > 100)
            return bad_value(e, "logit_bias", "values must be in [-100, 100]");
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias[r->n_bias++] = (float)x;
    }
    return 0;
}

/* OpenAI samples by default (temperature 1); temperature 0 is greedy, as is top_p 0. */
static int parse_sampling(struct srv_req *r, json_t *root, struct srv_err *e)
{
    json_int_t k = 0, seed = 0;
    int given;
    r->temperature = 1.0;
    r->top_p = 1.0;
    r->repetition_penalty = 1.0; /* off */
    if (num_field(root, "temperature", 0, 2, &r->temperature, NULL, e) ||
        num_field(root, "top_p", 0, 1, &r->top_p, NULL, e) ||
        num_field(root, "min_p", 0, 1, &r->min_p, NULL, e) ||
        num_field(root, "presence_penalty", -2, 2, &r->presence_penalty, NULL, e) ||
        num_field(root, "frequency_penalty", -2, 2, &r->frequency_penalty, NULL, e) ||
        num_field(root, "repetition_penalty", 0, 1e6, &r->repetition_penalty, NULL, e) ||
        int_field(root, "top_k", -1, INT32_MAX, &k, &given, e))
        return -1;
    if (!(r->repetition_penalty > 0)) /* vLLM's and transformers' check: it divides logits */
        return bad_value(e, "repetition_penalty", "must be greater than 0");
    r->top_k = k > 0 ? (int)k : 0; /* vLLM's -1 and 0 both mean off */
    if (int_field(root, "seed", INT64_MIN, INT64_MAX, &seed, &given, e))
        return -1;
    r->seed_given = given;
    r->seed = (uint64_t)seed;
    r->sample = r->temperature > 0 && r->top_p > 0;
    if (!r->sample) {
        r->temperature = 1.0;
        r->top_p = 1.0;
    }
    return 0;
}

static int parse_max_tokens(struct srv_req *r, json_t *root, const struct srv_limits *lim,
                            struct srv_err *e)
{
    json_int_t v = 0;
    int given = 0;
    const char *key = r->kind == SRV_CHAT && json_object_get(root, "max_completion_tokens")
                          ? "max_completion_tokens"
                          : "max_tokens";
    r->max_tokens = -1;
    /* completions' echo: the prompt scored alone (max_tokens 0), as evaluation harnesses ask */
    if ((r->kind == SRV_COMPLETION && bool_field(root, "echo", &r->echo, e)) ||
        int_field(root, key, r->echo ? 0 : 1, lim->max_cache_len, &v, &given, e))
        return -1;
    if (given)
        r->max_tokens = (int)v;
    return 0;
}

static int parse_logprobs(struct srv_req *r, json_t *root, struct srv_err *e)
{
    json_int_t v = 0;
    int given = 0;
    if (r->kind == SRV_COMPLETION) {
        /* completions: logprobs is the number of alternatives (0 = the chosen token only) */
        if (int_field(root, "logprobs", 0, SRV_MAX_TOP, &v, &given, e))
            return -1;
        r->logprobs = given;
        r->top_logprobs = (int)v;
        return 0;
    }
    if (bool_field(root, "logprobs", &r->logprobs, e) ||
        int_field(root, "top_logprobs", 0, SRV_MAX_TOP, &v, &given, e))
        return -1;
    if (given && v > 0 && !r->logprobs)
        return bad_value(e, "top_logprobs", "needs 'logprobs' set to true");
    r->top_logprobs = (int)v;
    return 0;
}

/* Refused here, on the connection's thread, rather than by every submit (serve.h). */
int srv_grammar_check_start(struct srv_req *r, const char *param, struct srv_err *e)
{
    int rc = kwk_grammar_match(r->grammar, "", 0, NULL);
    if (rc >= 0)
        return 0;
    kwk_grammar_free(r->grammar);
    r->grammar = NULL;
    if (rc == -ENOMEM)
        return srv_err_oom(e);
    srv_err_set(e, 400, INVALID, param, "invalid_value", "'%s': the grammar is too ambiguous "
                "at its start for the matcher (%s)", param, kwk_status_str(rc));
    return -1;
}

/* Compile a JSON Schema given as a JSON value (object or boolean) for param; NULL: any JSON
 * object (OpenAI's json_object, or a json_schema without its schema). */
static int compile_schema(struct srv_req *r, const json_t *schema, const char *param,
                          struct srv_err *e)
{
    static const char any_object[] = "{\"type\":\"object\"}";
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (schema && !text)
        return srv_err_oom(e);
    struct kwk_err err = {0};
    r->grammar = kwk_grammar_from_json_schema(text ? text : any_object,
                                              text ? strlen(text) : sizeof any_object - 1, &err);
    free(text);
    if (r->grammar)
        return srv_grammar_check_start(r, param, e);
    if (err.code == -ENOMEM)
        return srv_err_oom(e);
    srv_err_set(e, 400, INVALID, param, err.code == KWK_EUNSUPPORTED ? "unsupported_parameter"
                                                                     : "invalid_value",
                "'%s': %s", param, err.msg);
    return -1;
}

/* Constrained decoding: OpenAI's response_format (json_object: any JSON object; json_schema:
 * {"name", "schema", "strict"}) or llama.cpp's "json_schema" (a schema) and "grammar" (GBNF
 * text); at most one of them. Compiled here, on the connection's thread, so that a schema the
 * converter refuses is a 400 naming the keyword and where it is, before the engine sees it. */
static int parse_constraint(struct srv_req *r, json_t *root, struct srv_err *e)
{
    json_t *rf = json_object_get(root, "response_format");
    json_t *js = json_object_get(root, "json_schema");
    json_t *gr = json_object_get(root, "grammar");
    int n = 0;
    const char *kind = NULL;
    if (rf && !json_is_null(rf)) {
        json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(type))
            return srv_err_type(e, "response_format", "an object with a string 'type'");
        kind = json_string_value(type);
        if (strcmp(kind, "text") && strcmp(kind, "json_object") && strcmp(kind, "json_schema")) {
            srv_err_set(e, 400, INVALID, "response_format", "invalid_value",
                        "response_format type '%.64s' is not one of 'text', 'json_object', "
                        "'json_schema'", kind);
            return -1;
        }
        n += strcmp(kind, "text") != 0;
    }
    n += js && !json_is_null(js);
    n += gr && !json_is_null(gr);
    if (n > 1) {
        srv_err_set(e, 400, INVALID, NULL, "invalid_value", "give one of 'response_format' "
                    "(json_object or json_schema), 'json_schema' and 'grammar', not several");
        return -1;
    }
    if (js && !json_is_null(js)) {
        if (!json_is_object(js) && !json_is_boolean(js))
            return srv_err_type(e, "json_schema", "a JSON Schema (an object)");
        return compile_schema(r, js, "json_schema", e);
    }
    if (gr && !json_is_null(gr)) {
        if (!json_is_string(gr))
            return srv_err_type(e, "grammar", "a string of GBNF");
        struct kwk_err err = {0};
        r->grammar = kwk_grammar_new(json_string_value(gr), json_string_length(gr), &err);
        r->grammar_gbnf = 1;
        if (r->grammar)
            return srv_grammar_check_start(r, "grammar", e);
        if (err.code == -ENOMEM)
            return srv_err_oom(e);
        srv_err_set(e, 400, INVALID, "grammar", "invalid_value", "'grammar': %s", err.msg);
        return -1;
    }
    if (!kind || !strcmp(kind, "text"))
        return 0;
    if (!strcmp(kind, "json_object")) {
        /* llama.cpp's extension: a "schema" beside the type */
        json_t *sc = json_object_get(rf, "schema");
        return compile_schema(r, json_is_null(sc) ? NULL : sc, "response_format.schema", e);
    }
    json_t *spec = json_object_get(rf, "json_schema");
    if (!json_is_object(spec))
        return srv_err_type(e, "response_format.json_schema", "an object with the 'schema'");
    json_t *name = json_object_get(spec, "name");
    if (name && !json_is_null(name) && !json_is_string(name))
        return srv_err_type(e, "response_format.json_schema.name", "a string");
    json_t *sc = json_object_get(spec, "schema");
    if (!sc || json_is_null(sc)) /* OpenAI: optional; then any JSON object */
        sc = NULL;
    if (sc && !json_is_object(sc) && !json_is_boolean(sc))
        return srv_err_type(e, "response_format.json_schema.schema", "a JSON Schema (an object)");
    return compile_schema(r, sc, "response_format.json_schema.schema", e);
}

/* Fields we accept only at their default value (they ask for things not implemented). */
static int parse_unsupported(json_t *root, int kind, struct srv_err *e)
{
    if (kind == SRV_COMPLETION) {
        json_t *suffix = json_object_get(root, "suffix");
        if (suffix && !json_is_null(suffix))
            return bad_value(e, "suffix", "is not supported");
    }
    json_t *user = json_object_get(root, "user");
    if (user && !json_is_null(user) && !json_is_string(user))
        return srv_err_type(e, "user", "a string");
    /* The deprecated form of "tools" (no call ids): refused by name rather than ignored, so a
     * client that relies on it learns it at once instead of getting free text. */
    json_t *f = json_object_get(root, "functions");
    if (f && !json_is_null(f) && !(json_is_array(f) && json_array_size(f) == 0)) {
        srv_err_set(e, 400, INVALID, "functions", "unsupported_parameter",
                    "'functions' is not supported: use 'tools'");
        return -1;
    }
    return 0;
}

/* "n" choices, and the completions' "best_of" candidates they are the best of (by mean token
 * logprob, OpenAI's rule), after parse_stream: candidates that are not all returned cannot be
 * streamed. */
static int parse_choices(struct srv_req *r, json_t *root, struct srv_err *e)
{
    json_int_t n = 1, best = 0;
    int given;
    if (int_field(root, "n", 1, SRV_MAX_CHOICES, &n, &given, e))
        return -1;
    r->n = (int)n;
    r->best_of = r->n;
    if (r->kind != SRV_COMPLETION)
        return 0;
    if (int_field(root, "best_of", 1, SRV_MAX_BEST_OF, &best, &given, e))
        return -1;
    if (!given)
        return 0;
    if (best < n) {
        srv_err_set(e, 400, INVALID, "best_of", "invalid_value",
                    "'best_of' (%lld) must be at least 'n' (%lld)", (long long)best, (long long)n);
        return -1;
    }
    if (best > n && r->stream)
        return bad_value(e, "best_of", "larger than 'n' cannot be streamed");
    r->best_of = (int)best;
    return 0;
}

static int parse_stream(struct srv_req *r, json_t *root, struct srv_err *e)
{
    if (bool_field(root, "stream", &r->stream, e))
        return -1;
    json_t *so = json_object_get(root, "stream_options");
    if (!so || json_is_null(so))
        return 0;
    if (!json_is_object(so))
        return srv_err_type(e, "stream_options", "an object");
    if (!r->stream)
        return bad_value(e, "stream_options", "is only allowed when 'stream' is true");
    return bool_field(so, "include_usage", &r->include_usage, e);
}

static int parse_model(struct srv_req *r, json_t *root, struct srv_err *e)
{
    json_t *m = json_object_get(root, "model");
    if (!m || json_is_null(m)) {
        srv_err_set(e, 400, INVALID, "model", "missing_required_parameter",
                    "'model' is required");
        return -1;
    }
    if (!json_is_string(m))
        return srv_err_type(e, "model", "a string");
    if (!(r->model = srv_dup_n(json_string_value(m), json_string_length(m))))
        return srv_err_oom(e);
    return 0;
}

/* /tokenize: {"prompt": text} (or llama.cpp's "content") or {"messages": [...],
 * "add_generation_prompt"}, "add_special_tokens" defaulting as vLLM does (text true, messages
 * false: the template writes them); /detokenize: {"tokens": [ids]}. "model" is optional. The
 * body limit bounds both; no context limit applies. */
static int parse_tokenize(struct srv_req *r, json_t *root, const struct srv_limits *lim,
                          struct srv_err *e)
{
    json_t *m = json_object_get(root, "model");
    if (m && !json_is_null(m) && parse_model(r, root, e))
        return -1;
    if (r->kind == SRV_DETOKENIZE) {
        json_t *a = json_object_get(root, "tokens");
        if (!json_is_array(a))
            return srv_err_type(e, "tokens", "a list of token ids");
        size_t n = json_array_size(a);
        if (!(r->prompt_ids = malloc(sizeof(int32_t) * (n ? n : 1))))
            return srv_err_oom(e);
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(a, i);
            if (!json_is_integer(v))
                return srv_err_type(e, "tokens", "a list of token ids");
            if (json_integer_value(v) < 0 || json_integer_value(v) >= lim->n_vocab)
                return bad_value(e, "tokens", "has a token id outside the vocabulary");
            r->prompt_ids[i] = (int32_t)json_integer_value(v);
        }
        r->n_prompt_ids = (int)n;
        return 0;
    }
    json_t *msgs = json_object_get(root, "messages");
    int chat = msgs && !json_is_null(msgs);
    r->add_special_tokens = !chat;
    r->add_generation_prompt = 1;
    if (bool_field(root, "add_special_tokens", &r->add_special_tokens, e) ||
        bool_field(root, "return_token_strs", &r->return_token_strs, e))
        return -1;
    /* the tools too: the prompt a chat request with them would get */
    if (chat)
        return parse_messages(r, root, e) || srv_tools_parse(r, root, lim->tool_format, e) ? -1
                                                                                        : 0;
    json_t *p = json_object_get(root, "prompt");
    const char *key = "prompt";
    if (!p || json_is_null(p)) {
        p = json_object_get(root, "content");
        key = "content";
    }
    if (!p || json_is_null(p)) {
        srv_err_set(e, 400, INVALID, "prompt", "missing_required_parameter",
                    "'prompt' or 'messages' is required");
        return -1;
    }
    if (!json_is_string(p))
        return srv_err_type(e, key, "a string");
    r->prompt_len = json_string_length(p);
    if (!(r->prompt = srv_dup_n(json_string_value(p), r->prompt_len)))
        return srv_err_oom(e);
    return 0;
}

static int parse_root(struct srv_req *r, json_t *root, const struct srv_limits *lim,
                      struct srv_err *e)
{
    if (r->kind == SRV_TOKENIZE || r->kind == SRV_DETOKENIZE)
        return parse_tokenize(r, root, lim, e);
    /* a text prompt gets the tokenizer's own BOS etc., as tokenizer(prompt) in transformers;
     * chat text comes from the template, which writes them */
    r->add_special_tokens = r->kind == SRV_COMPLETION;
    r->add_generation_prompt = 1;
    if (parse_model(r, root, e))
        return -1;
    if (r->kind == SRV_CHAT ? parse_messages(r, root, e) || parse_reasoning(r, root, e)
                            : parse_prompt(r, root, lim, e))
        return -1;
    if (parse_max_tokens(r, root, lim, e) || parse_sampling(r, root, e) ||
        parse_stop(r, root, e) || parse_vllm_stops(r, root, lim, e) ||
        parse_bias(r, root, lim, e) || parse_logprobs(r, root, e) ||
        parse_unsupported(root, r->kind, e) || parse_constraint(r, root, e) ||
        srv_tools_parse(r, root, lim->tool_format, e) || parse_stream(r, root, e) ||
        parse_choices(r, root, e))
        return -1;
    return 0;
}

json_t *srv_json_body(const char *body, size_t len, struct srv_err *e)
{
    json_error_t jerr;
    if (!srv_json_depth_ok(body, len, SRV_MAX_DEPTH)) {
        srv_err_set(e, 400, INVALID, NULL, "invalid_json", "JSON nested deeper than %d levels",
                    SRV_MAX_DEPTH);
        return NULL;
    }
    /* JSON_REJECT_DUPLICATES: two "model" keys would be read as either one by other parsers */
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        srv_err_set(e, 400, INVALID, NULL, "invalid_json",
                    "We could not parse the JSON body of your request: %s (at byte %d)",
                    jerr.text, jerr.position);
        return NULL;
    }
    if (!json_is_object(root)) {
        srv_err_set(e, 400, INVALID, NULL, "invalid_json", "the body must be a JSON object");
        json_decref(root);
        return NULL;
    }
    return root;
}

int srv_req_parse(struct srv_req *r, int kind, const char *body, size_t len,
                  const struct srv_limits *lim, struct srv_err *e)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    json_t *root = srv_json_body(body, len, e);
    if (!root)
        return -1;
    int rc = parse_root(r, root, lim, e);
    json_decref(root);
    if (rc)
        srv_req_free(r);
    return rc;
}

void srv_req_free(struct srv_req *r)
{
    free(r->model);
    json_decref(r->messages);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->bias_ids);
    free(r->bias);
    kwk_grammar_free(r->grammar);
    json_decref(r->tools);
    free(r->tool_name);
    json_decref(r->template_kwargs);
    memset(r, 0, sizeof *r);
}

/* ---- responses ------------------------------------------------------------------------------- */

const char *srv_finish_name(int finish)
{
    return finish == KWK_FINISH_LENGTH ? "length" : "stop";
}

/* A JSON string of bytes that may not be valid UTF-8 (one token of a multi-byte character):
 * invalid sequences become U+FFFD, as OpenAI shows such tokens. */
static json_t *json_text(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    struct srv_buf b = {0};
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        json_t *t = k && i + k <= n && c ? json_stringn(s + i, k) : NULL;
        if (t) {
            srv_buf_add(&b, s + i, k);
            json_decref(t);
            i += k;
        } else {
            srv_buf_add(&b, "\xef\xbf\xbd", 3);
            i++;
        }
    }
    j = b.err ? NULL : json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return j;
}

json_t *srv_json_text(const char *s, size_t n)
{
    return json_text(s, n);
}

/* A token's text (its own decode; may be part of a character) into buf. */
static size_t token_text(const kwk_tokenizer *tok, int32_t id, char *buf, size_t cap)
{
    size_t len = 0;
    if (!tok || kwk_tokenizer_decode(tok, &id, 1, 0, buf, cap, &len) < 0)
        return (size_t)snprintf(buf, cap, "token_id:%d", (int)id);
    return len;
}

static json_t *bytes_array(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* Chat: {"token", "logprob", "bytes", "top_logprobs": [...]} for one token. */
static json_t *chat_lp_entry(const struct srv_ctx *c, int32_t id, float lp, int with_top,
                             const struct srv_lp *l)
{
    char buf[256];
    size_t n = token_text(c->tok, id, buf, sizeof buf);
    if (n >= sizeof buf)
        n = sizeof buf - 1;
    json_t *o = json_object();
    json_object_set_new(o, "token", json_text(buf, n));
    json_object_set_new(o, "logprob", json_real(lp));
    json_object_set_new(o, "bytes", bytes_array(buf, n));
    if (with_top) {
        json_t *tops = json_array();
        for (int k = 0; k < l->n_top && k < c->top_logprobs; k++)
            json_array_append_new(tops, chat_lp_entry(c, l->top_ids[k], l->top_lps[k], 0, NULL));
        json_object_set_new(o, "top_logprobs", tops);
    }
    return o;
}

static json_t *chat_logprobs(const struct srv_ctx *c, const struct srv_lp *lps, int n)
{
    json_t *content = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(content,
                              chat_lp_entry(c, lps[i].token, lps[i].logprob, 1, &lps[i]));
    return json_pack("{s:o, s:n}", "content", content, "refusal");
}

/* Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. */
static json_t *completion_logprobs(struct srv_ctx *c, const struct srv_lp *lps, int n)
{
    json_t *toks = json_array(), *tlps = json_array(), *tops = json_array(),
           *offs = json_array();
    char buf[256];
    for (int i = 0; i < n; i++) {
        size_t len = token_text(c->tok, lps[i].token, buf, sizeof buf);
        if (len >= sizeof buf)
            len = sizeof buf - 1;
        json_array_append_new(toks, json_text(buf, len));
        /* an echoed prompt's first token has no logprob: null, as OpenAI answers (and a
         * non-finite one, which JSON cannot hold) */
        int none = !isfinite(lps[i].logprob);
        json_array_append_new(tlps, none ? json_null() : json_real(lps[i].logprob));
        json_array_append_new(offs, json_integer((json_int_t)c->text_offset));
        c->text_offset += len;
        if (c->top_logprobs > 0 && !none) {
            json_t *t = json_object();
            for (int k = 0; k < lps[i].n_top && k < c->top_logprobs; k++) {
                size_t l2 = token_text(c->tok, lps[i].top_ids[k], buf, sizeof buf);
                json_t *key = json_text(buf, l2 < sizeof buf ? l2 : sizeof buf - 1);
                if (key)
                    json_object_set_new(t, json_string_value(key), json_real(lps[i].top_lps[k]));
                json_decref(key);
            }
            json_array_append_new(tops, t);
        } else {
            json_array_append_new(tops, json_null());
        }
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", tlps,
                     "top_logprobs", tops, "text_offset", offs);
}

static json_t *logprobs_json(struct srv_ctx *c, const struct srv_lp *lps, int n)
{
    if (!c->logprobs)
        return json_null();
    return c->kind == SRV_CHAT ? chat_logprobs(c, lps, n) : completion_logprobs(c, lps, n);
}

static json_t *usage_json(int n_prompt, int n_completion)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", n_prompt, "completion_tokens",
                     n_completion, "total_tokens", n_prompt + n_completion);
}

/* The fields every response and chunk starts with. */
static json_t *envelope(const struct srv_ctx *c, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", c->id, "object", object, "created",
                     (json_int_t)c->created, "model", c->model, "system_fingerprint", "kwker");
}

static void dump_into(struct srv_buf *out, json_t *j, const char *prefix, const char *suffix)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (!s) {
        out->err = 1;
    } else {
        srv_buf_str(out, prefix);
        srv_buf_str(out, s);
        srv_buf_str(out, suffix);
    }
    free(s);
    json_decref(j);
}

/* One choice of a whole response; c->text_offset is the choice's own (completions logprobs). */
static json_t *choice_json(struct srv_ctx *c, int index, const struct srv_choice *ch)
{
    int chat = c->kind == SRV_CHAT;
    const struct srv_tool_reply *tr = chat ? ch->tools : NULL;
    const char *text = ch->text;
    size_t len = ch->len;
    c->text_offset = 0;
    /* OpenAI's finish_reason is "tool_calls" when the reply calls tools */
    json_t *choice = json_pack("{s:i, s:o, s:s}", "index", index, "logprobs",
                               logprobs_json(c, ch->lps, ch->n_lps), "finish_reason",
                               tr && tr->calls && !tr->named ? "tool_calls"
                                                             : srv_finish_name(ch->finish));
    if (tr) {
        text = tr->content;
        len = tr->content_len;
    }
    json_t *t = tr && tr->null_content ? json_null() : json_text(text ? text : "", text ? len : 0);
    if (chat) {
        json_t *msg = json_pack("{s:s, s:o, s:n}", "role", "assistant", "content", t, "refusal");
        if (msg && tr && tr->calls)
            json_object_set(msg, "tool_calls", tr->calls);
        if (msg && tr && tr->reasoning) /* DeepSeek's name, as llama.cpp's and vLLM's answer */
            json_object_set_new(msg, "reasoning_content",
                                json_text(tr->reasoning, tr->reasoning_len));
        json_object_set_new(choice, "message", msg);
    } else
        json_object_set_new(choice, "text", t);
    return choice;
}

void srv_json_response(struct srv_buf *out, struct srv_ctx *c, const struct srv_choice *ch,
                       int n, int n_prompt, int n_completion)
{
    json_t *r = envelope(c, c->kind == SRV_CHAT ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (int i = 0; i < n; i++)
        if (json_array_append_new(choices, choice_json(c, i, &ch[i])))
            out->err = 1;
    json_object_set_new(r, "choices", choices);
    json_object_set_new(r, "usage", usage_json(n_prompt, n_completion));
    dump_into(out, r, "", "");
}

void srv_tokens_response(struct srv_buf *out, const int32_t *ids, size_t n, int max_model_len,
                         const kwk_tokenizer *tok)
{
    json_t *a = json_array(), *strs = tok ? json_array() : NULL;
    int ok = a && (!tok || strs);
    for (size_t i = 0; ok && i < n; i++) {
        ok = !json_array_append_new(a, json_integer(ids[i]));
        if (ok && strs) {
            size_t len = 0;
            const char *piece = kwk_tokenizer_id_to_piece(tok, ids[i], &len);
            ok = !json_array_append_new(strs, piece ? json_text(piece, len) : json_null());
        }
    }
    json_t *r = ok ? json_pack("{s:I, s:i, s:O}", "count", (json_int_t)n, "max_model_len",
                               max_model_len, "tokens", a)
                   : NULL;
    if (r && strs && json_object_set(r, "token_strs", strs)) {
        json_decref(r);
        r = NULL;
    }
    json_decref(a);
    json_decref(strs);
    dump_into(out, r, "", "");
}

void srv_text_response(struct srv_buf *out, const char *text, size_t len)
{
    json_t *t = json_text(text ? text : "", text ? len : 0);
    dump_into(out, t ? json_pack("{s:o}", "prompt", t) : NULL, "", "");
}

/* A chunk with one choice: delta (chat) or text (completions). */
static void chunk(struct srv_buf *out, const struct srv_ctx *c, json_t *delta_or_text,
                  json_t *logprobs, const char *finish)
{
    int chat = c->kind == SRV_CHAT;
    json_t *r = envelope(c, chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = json_pack("{s:i, s:o, s:o}", "index", c->index, chat ? "delta" : "text",
                               delta_or_text, "logprobs", logprobs);
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(r, "choices", json_pack("[o]", choice));
    if (c->include_usage)
        json_object_set_new(r, "usage", json_null());
    dump_into(out, r, "data: ", "\n\n");
}

void srv_sse_role(struct srv_buf *out, const struct srv_ctx *c)
{
    chunk(out, c, json_pack("{s:s, s:s, s:n}", "role", "assistant", "content", "", "refusal"),
          json_null(), NULL);
}

void srv_sse_content(struct srv_buf *out, struct srv_ctx *c, const char *text, size_t len,
                     const struct srv_lp *lps, int n_lps)
{
    json_t *t = json_text(text ? text : "", text ? len : 0);
    json_t *lp = logprobs_json(c, lps, n_lps);
    chunk(out, c, c->kind == SRV_CHAT ? json_pack("{s:o}", "content", t) : t, lp, NULL);
}

void srv_sse_reasoning(struct srv_buf *out, struct srv_ctx *c, const char *text, size_t len,
                       const struct srv_lp *lps, int n_lps)
{
    /* DeepSeek's field name, as llama.cpp's and vLLM's servers stream it */
    chunk(out, c, json_pack("{s:o}", "reasoning_content", json_text(text ? text : "", len)),
          lps ? logprobs_json(c, lps, n_lps) : json_null(), NULL);
}

void srv_sse_finish(struct srv_buf *out, const struct srv_ctx *c, int finish)
{
    const struct srv_tool_reply *tr = c->tools;
    const char *why = tr && tr->calls && !tr->named ? "tool_calls" : srv_finish_name(finish);
    chunk(out, c, c->kind == SRV_CHAT ? json_object() : json_string(""), json_null(), why);
}

void srv_sse_tool_calls(struct srv_buf *out, const struct srv_ctx *c, const json_t *calls)
{
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call)
    {
        json_t *one = json_deep_copy(call);
        if (!one || json_object_set_new(one, "index", json_integer((json_int_t)i))) {
            json_decref(one);
            out->err = 1;
            return;
        }
        chunk(out, c, json_pack("{s:[o]}", "tool_calls", one), json_null(), NULL);
    }
}

void srv_sse_usage(struct srv_buf *out, const struct srv_ctx *c, int n_prompt,
                   int n_completion)
{
    json_t *r = envelope(c, c->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(r, "choices", json_array());
    json_object_set_new(r, "usage", usage_json(n_prompt, n_completion));
    dump_into(out, r, "data: ", "\n\n");
}

static json_t *error_json(const struct srv_err *e)
{
    json_t *m = json_text(e->msg, strlen(e->msg));
    json_t *in = json_pack("{s:o, s:s, s:o, s:o}", "message", m ? m : json_string(""), "type",
                           e->type ? e->type : "server_error", "param",
                           e->param ? json_string(e->param) : json_null(), "code",
                           e->code ? json_string(e->code) : json_null());
    return json_pack("{s:o}", "error", in);
}

void srv_sse_error(struct srv_buf *out, const struct srv_err *e)
{
    dump_into(out, error_json(e), "data: ", "\n\n");
}

void srv_sse_done(struct srv_buf *out)
{
    srv_buf_str(out, "data: [DONE]\n\n");
}

char *srv_json_error(const struct srv_err *e)
{
    json_t *j = error_json(e);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

int srv_auth_ok(const char *header, const char *key)
{
    static const char prefix[] = "Bearer ";
    if (!header)
        return 0;
    size_t hn = strlen(header), kn = strlen(key), pn = sizeof prefix - 1;
    /* every byte of the expected value is compared, whatever the presented one holds */
    unsigned diff = hn != pn + kn;
    for (size_t i = 0; i < pn + kn; i++) {
        unsigned char want = (unsigned char)(i < pn ? prefix[i] : key[i - pn]);
        unsigned char got = (unsigned char)(i < hn ? header[i] : 0);
        diff |= (unsigned)(want ^ got);
    }
    return diff == 0;
}
