/* toolcall_reply.c - a model's reply read back into content and OpenAI's "tool_calls" (after
 * its think block, split off by think.c), in each format toolcall.c reads off a template; and
 * how much of a reply still streaming is surely content. The model's text is untrusted:
 * anything that is not a whole call reply in its format is content. No HTTP; any thread. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toolcall.h"

#define WS " \t\r\n"

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && srv_is_space(*p))
        p++;
    return p;
}

/* Whether [p, end) starts with the NUL-terminated s. */
static int starts(const char *p, const char *end, const char *s)
{
    size_t n = strlen(s);
    return (size_t)(end - p) >= n && !memcmp(p, s, n);
}

/* "call_" and 24 letters or digits, from the request's seed and the call's index (splitmix64
 * words, 6 letters from each: 62^6 < 2^36). */
static json_t *call_id(uint64_t seed, size_t index)
{
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    char id[5 + 24 + 1] = "call_";
    uint64_t x = seed ^ ((uint64_t)index + 1) * 0xd1b54a32d192ed03ull, z = 0;
    for (int i = 0; i < 24; i++) {
        if (i % 6 == 0) {
            x += 0x9e3779b97f4a7c15ull;
            z = x;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            z ^= z >> 31;
        }
        id[5 + i] = alnum[z % 62];
        z /= 62;
    }
    id[29] = 0;
    return json_string(id);
}

static int mistral_id_ok(const json_t *id)
{
    const char *s = json_string_value(id);
    if (!s || json_string_length(id) != 9)
        return 0;
    for (int i = 0; i < 9; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
              (s[i] >= 'A' && s[i] <= 'Z')))
            return 0;
    return 1;
}

/* {"name", <args key>} into OpenAI's {"id", "type", "function": {"name", "arguments": text}};
 * the id is the model's own when model_id and it wrote one (Mistral), else made from seed and
 * index. NULL when obj is not a call. */
static json_t *make_call_id(json_t *obj, uint64_t seed, size_t index, int model_id)
{
    const char *name = json_string_value(json_object_get(obj, "name"));
    json_t *args = json_object_get(obj, "arguments");
    json_t *id = model_id ? json_object_get(obj, "id") : NULL;
    if (!args)
        args = json_object_get(obj, "parameters");
    if (!json_is_object(obj) || !name || !args || !(json_is_object(args) || json_is_string(args)))
        return NULL;
    if (json_is_string(args)) { /* clients parse "arguments": a string must be an object's text */
        json_t *parsed = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        int ok = json_is_object(parsed);
        json_decref(parsed);
        if (!ok)
            return NULL;
    }
    if (model_id && !mistral_id_ok(id)) /* the grammar's ^[a-zA-Z0-9]{9}$, which its template */
        return NULL;                    /* wants back in the history */
    /* arguments are a JSON text in OpenAI's replies; a model that wrote a string wrote one */
    char *text =
        json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, JSON_COMPACT);
    json_t *c = text ? json_pack("{s:o, s:s, s:{s:s, s:s}}", "id",
                                 id ? json_incref(id) : call_id(seed, index), "type", "function",
                                 "function", "name", name, "arguments", text)
                     : NULL;
    free(text);
    return c;
}

static json_t *make_call(json_t *obj, uint64_t seed, size_t index)
{
    return make_call_id(obj, seed, index, 0);
}

/* A call whose name the format writes outside its arguments' JSON. */
static json_t *named_call(const char *name, size_t name_len, json_t *args, uint64_t seed,
                          size_t index)
{
    json_t *obj = json_pack("{s:s%, s:O}", "name", name, name_len, "arguments", args);
    json_t *c = obj ? make_call(obj, seed, index) : NULL;
    json_decref(obj);
    return c;
}

/* One JSON value at p (not past end); *next is where it ends. NULL when there is none. */
static json_t *json_at(const char *p, const char *end, const char **next)
{
    json_error_t err;
    json_t *v = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &err);
    *next = v ? p + err.position : p;
    return v;
}

/* A JSON list of call objects into calls; NULL unless every item is one. */
static json_t *calls_of_list(json_t *list, uint64_t seed, int model_ids)
{
    json_t *calls = json_is_array(list) && json_array_size(list) ? json_array() : NULL, *c;
    size_t i;
    json_array_foreach(list, i, c)
    {
        json_t *call = calls ? make_call_id(c, seed, i, model_ids) : NULL;
        if (!call || json_array_append_new(calls, call)) {
            json_decref(calls);
            return NULL;
        }
    }
    return calls;
}

/* A list of calls at p that ends the text (but for whitespace). */
static json_t *final_list(const char *p, const char *end, uint64_t seed, int model_ids)
{
    const char *next;
    json_t *list = json_at(p, end, &next);
    json_t *calls = list && skip_ws(next, end) == end ? calls_of_list(list, seed, model_ids) : NULL;
    json_decref(list);
    return calls;
}

/* Hermes: content, then <tool_call>{json}</tool_call> blocks (the last may be unclosed at eos).
 * Every block must be a call, or none is one. */
static json_t *hermes_calls(const char *text, size_t len, uint64_t seed, size_t *content_len)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    const char *end = text + len, *p = text;
    json_t *calls = json_array();
    *content_len = len;
    while (calls && p < end) {
        const char *o = memmem(p, (size_t)(end - p), open, sizeof open - 1);
        if (!o)
            break;
        if (!json_array_size(calls))
            *content_len = (size_t)(o - text);
        const char *j = o + sizeof open - 1;
        const char *c = memmem(j, (size_t)(end - j), close, sizeof close - 1);
        const char *je = c ? c : end;
        json_t *obj = json_loadb(j, (size_t)(je - j), JSON_DECODE_ANY, NULL);
        json_t *call = obj ? make_call(obj, seed, json_array_size(calls)) : NULL;
        json_decref(obj);
        if (!call || json_array_append_new(calls, call)) {
            json_decref(calls);
            *content_len = len;
            return NULL;
        }
        p = c ? c + sizeof close - 1 : end;
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
            p++;
        if (p < end && (size_t)(end - p) >= sizeof open - 1 &&
            memcmp(p, open, sizeof open - 1)) /* text after a call: not a call reply */
            break;
    }
    if (calls && (!json_array_size(calls) || p < end)) {
        json_decref(calls);
        *content_len = len;
        return NULL;
    }
    return calls;
}

/* Llama 3.x: content, then one {"name", "parameters"} object (or several separated by ';'). */
static json_t *llama3_calls(const char *text, size_t len, uint64_t seed, size_t *content_len)
{
    static const char tag[] = "<|python_tag|>";
    const char *end = text + len, *p = text, *start = NULL;
    *content_len = len;
    for (const char *q = text; q < end && !start; q++) {
        if (*q != '{')
            continue;
        const char *k = q + 1;
        while (k < end && (*k == ' ' || *k == '\n'))
            k++;
        if ((size_t)(end - k) >= 6 && !memcmp(k, "\"name\"", 6))
            start = q;
    }
    if (!start)
        return NULL;
    const char *t = memmem(text, (size_t)(start - text), tag, sizeof tag - 1);
    size_t clen = (size_t)((t ? t : start) - text);
    json_t *calls = json_array();
    for (p = start; calls && p < end;) {
        json_error_t jerr;
        json_t *obj = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK, &jerr);
        json_t *call = obj ? make_call(obj, seed, json_array_size(calls)) : NULL;
        json_decref(obj);
        if (!call || json_array_append_new(calls, call)) {
            json_decref(calls);
            return NULL;
        }
        p += jerr.position;
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t' || *p == ';'))
            p++;
    }
    if (calls)
        *content_len = clen;
    return calls;
}

/* Mistral Nemo: content, then [TOOL_CALLS] and a list of {"name", "arguments", "id"}; the
 * ids the model wrote are the calls' ids (its template asks them back in the history). */
static json_t *mistral_calls(const char *text, size_t len, uint64_t seed, size_t *content_len)
{
    static const char tag[] = "[TOOL_CALLS]";
    const char *end = text + len, *t = memmem(text, len, tag, sizeof tag - 1);
    json_t *calls = t ? final_list(skip_ws(t + sizeof tag - 1, end), end, seed, 1) : NULL;
    if (calls)
        *content_len = (size_t)(t - text);
    return calls;
}

/* Firefunction v2: content, then " functools[...]"; a required call may start at "[". */
static json_t *firefunction_calls(const char *text, size_t len, uint64_t seed, size_t *content_len)
{
    static const char tag[] = " functools";
    const char *end = text + len, *t = memmem(text, len, " functools[", sizeof tag);
    const char *list = t ? t + sizeof tag - 1 : skip_ws(text, end);
    json_t *calls = list < end && *list == '[' ? final_list(list, end, seed, 0) : NULL;
    if (calls)
        *content_len = t ? (size_t)(t - text) : 0;
    return calls;
}

/* Functionary's <function=NAME> with its arguments' object at p; *next after </function>. */
static json_t *functionary_one(const char *p, const char *end, uint64_t seed, size_t index,
                               const char **next)
{
    const char *name = p + strlen("<function="), *q = name;
    while (q < end && q - name <= SRV_TOOL_NAME_MAX && *q != '>')
        q++;
    if (q >= end || *q != '>' || q == name)
        return NULL;
    json_t *args = json_at(q + 1, end, next);
    json_t *call =
        json_is_object(args) ? named_call(name, (size_t)(q - name), args, seed, index) : NULL;
    json_decref(args);
    const char *close = skip_ws(*next, end); /* the arguments' grammar ends with a space */
    if (call && starts(close, end, "</function>"))
        *next = close + strlen("</function>");
    return call;
}

/* Functionary v3.1: content, then <function=NAME>{...}</function> calls, or <|python_tag|>
 * and code to its end: a call of "python" with {"code"} (as llama.cpp reads it). */
static json_t *functionary_calls(const char *text, size_t len, uint64_t seed, size_t *content_len)
{
    const char *end = text + len;
    const char *f = memmem(text, len, "<function=", 10);
    const char *py = memmem(text, len, PYTHON_TAG, strlen(PYTHON_TAG));
    const char *p = f && (!py || f < py) ? f : py;
    json_t *calls = p ? json_array() : NULL;
    size_t clen = p ? (size_t)(p - text) : len;
    while (calls && p < end) {
        const char *next = end;
        json_t *call = NULL;
        if (starts(p, end, "<function=")) {
            call = functionary_one(p, end, seed, json_array_size(calls), &next);
        } else if (starts(p, end, PYTHON_TAG)) {
            const char *code = p + strlen(PYTHON_TAG);
            json_t *args = json_pack("{s:s%}", "code", code, (size_t)(end - code));
            call = args ? named_call("python", 6, args, seed, json_array_size(calls)) : NULL;
            json_decref(args);
        }
        if (!call || json_array_append_new(calls, call)) {
            json_decref(calls);
            return NULL;
        }
        p = skip_ws(next, end);
    }
    if (calls)
        *content_len = clen;
    return calls;
}

/* One R1 call at p: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
 * <｜tool▁call▁end｜>; *next after it. */
static json_t *r1_one(const char *p, const char *end, uint64_t seed, size_t index,
                      const char **next)
{
    static const char head[] = R1_CALL_BEGIN "function" R1_SEP;
    if (!starts(p, end, head))
        return NULL;
    const char *name = p + sizeof head - 1, *q = name;
    while (q < end && q - name <= SRV_TOOL_NAME_MAX && *q != '\n')
        q++;
    if (q == name || !starts(q, end, "\n```json"))
        return NULL;
    json_t *args = json_at(q + strlen("\n```json"), end, next);
    const char *after = skip_ws(*next, end);
    json_t *call = NULL;
    if (json_is_object(args) && starts(after, end, "```") &&
        starts(skip_ws(after + 3, end), end, R1_CALL_END)) {
        call = named_call(name, (size_t)(q - name), args, seed, index);
        *next = skip_ws(after + 3, end) + strlen(R1_CALL_END);
    }
    json_decref(args);
    return call;
}

/* DeepSeek R1 (after its think block): content, then <｜tool▁calls▁begin｜>, calls, and
 * <｜tool▁calls▁end｜> (which an end of text may stand for). */
static json_t *r1_calls(const char *text, size_t len, uint64_t seed, size_t *content_len)
{
    const char *end = text + len;
    const char *b = memmem(text, len, R1_CALLS_BEGIN, strlen(R1_CALLS_BEGIN));
    const char *p = b ? skip_ws(b + strlen(R1_CALLS_BEGIN), end) : end;
    json_t *calls = b ? json_array() : NULL;
    while (calls && p < end && !starts(p, end, R1_CALLS_END)) {
        const char *next;
        json_t *call = r1_one(p, end, seed, json_array_size(calls), &next);
        if (!call || json_array_append_new(calls, call)) {
            json_decref(calls);
            return NULL;
        }
        p = skip_ws(next, end);
    }
    if (calls && starts(p, end, R1_CALLS_END))
        p = skip_ws(p + strlen(R1_CALLS_END), end);
    if (calls && (p < end || !json_array_size(calls))) {
        json_decref(calls);
        return NULL;
    }
    if (calls)
        *content_len = (size_t)(b - text);
    return calls;
}

/* Generic: the whole reply is {"tool_calls": [...]} or {"response": "..."}. */
static json_t *generic_calls(const char *text, size_t len, uint64_t seed, char **content,
                             size_t *content_len)
{
    json_t *obj = json_loadb(text, len, 0, NULL), *calls;
    json_t *resp = json_object_get(obj, "response");
    if (json_is_string(resp) &&
        (*content = strndup(json_string_value(resp), json_string_length(resp))))
        *content_len = json_string_length(resp);
    calls = calls_of_list(json_object_get(obj, "tool_calls"), seed, 0);
    json_decref(obj);
    return calls;
}

static json_t *format_calls(int format, const char *text, size_t len, uint64_t seed,
                            struct srv_tool_reply *out)
{
    switch (format) {
    case SRV_TOOLS_HERMES:
        return hermes_calls(text, len, seed, &out->content_len);
    case SRV_TOOLS_LLAMA3:
        return llama3_calls(text, len, seed, &out->content_len);
    case SRV_TOOLS_MISTRAL:
        return mistral_calls(text, len, seed, &out->content_len);
    case SRV_TOOLS_FUNCTIONARY:
        return functionary_calls(text, len, seed, &out->content_len);
    case SRV_TOOLS_DEEPSEEK_R1:
        return r1_calls(text, len, seed, &out->content_len);
    case SRV_TOOLS_FIREFUNCTION:
        return firefunction_calls(text, len, seed, &out->content_len);
    default:
        return generic_calls(text, len, seed, &out->own, &out->content_len);
    }
}

/* Whether every call names one of the request's tools (NULL: any name). */
static int names_known(const json_t *calls, const json_t *tools)
{
    const json_t *c, *t;
    size_t i, k;
    if (!tools)
        return 1;
    json_array_foreach(calls, i, c)
    {
        const char *name =
            json_string_value(json_object_get(json_object_get((json_t *)c, "function"), "name"));
        int found = 0;
        json_array_foreach(tools, k, t)
        {
            const char *tn = json_string_value(
                json_object_get(json_object_get((json_t *)t, "function"), "name"));
            found |= name && tn && !strcmp(name, tn);
        }
        if (!found)
            return 0;
    }
    return 1;
}

int srv_tools_extract(const struct srv_req *q, const char *text, size_t len, uint64_t seed,
                      struct srv_tool_reply *out)
{
    int format = q->tool_format;
    memset(out, 0, sizeof *out);
    out->named = q->tool_choice == SRV_TOOL_NAMED;
    /* a thinking model's calls come after its think block: one drafted inside it is
     * reasoning, never a call (R1's; Qwen3's Hermes calls alike) */
    srv_think_reply(q, text, len, out);
    const char *body = out->content;
    size_t body_len = out->content_len;
    out->calls = format_calls(format, body, body_len, seed, out);
    /* a call of a tool the request did not give is not a call (a Llama 3 reply's object that
     * opened as "{ \"name\"" never met the grammar, whose trigger is "{\"name\"") */
    if (out->calls && !names_known(out->calls, q->tools)) {
        json_decref(out->calls);
        out->calls = NULL;
        free(out->own);
        out->own = NULL;
        out->content_len = body_len;
    }
    if (out->own)
        out->content = out->own;
    else if (srv_tool_format_generic(format))
        out->content_len =
            out->calls ? 0 : body_len; /* not the format's JSON: the text as it came */
    /* a call with nothing but whitespace before it has no content (null) */
    size_t k = 0;
    while (k < out->content_len && out->content[k] && strchr(WS, out->content[k]))
        k++;
    out->null_content = out->calls && k == out->content_len;
    return 0;
}

void srv_tool_reply_free(struct srv_tool_reply *r)
{
    json_decref(r->calls);
    free(r->own);
    memset(r, 0, sizeof *r);
}

/* Where text may begin the NUL-terminated opener t: at its first whole occurrence, or at a tail
 * that could be its beginning; len when nowhere. */
static size_t opener_at(const char *text, size_t len, const char *t)
{
    size_t n = strlen(t);
    const char *hit = memmem(text, len, t, n);
    if (hit)
        return (size_t)(hit - text);
    return len - srv_marker_tail(text, len, t);
}

/* Content that is only whitespace so far is held: a call may follow, and the reply's content is
 * then null (srv_tools_extract), so not even the whitespace may have been sent. */
static size_t held_if_blank(const char *text, size_t upto)
{
    return skip_ws(text, text + upto) == text + upto ? 0 : upto;
}

size_t srv_tools_sendable(int format, const char *text, size_t len)
{
    const char *const *op = srv_tool_format_openers(format);
    /* generic: the whole reply is JSON, its content known only at the end (a think block
     * before the text is the caller's: srv_reply_stream_next) */
    if (!op[0])
        return 0;
    if (format == SRV_TOOLS_LLAMA3) { /* a call may open as "{ \"name\"" or "{\n": from '{' */
        const char *brace = memchr(text, '{', len);
        /* or after the python tag (a special token the reply keeps), which is not content */
        size_t tag = opener_at(text, len, PYTHON_TAG), at = brace ? (size_t)(brace - text) : len;
        return held_if_blank(text, tag < at ? tag : at);
    }
    size_t upto = len;
    for (; *op; op++) {
        size_t at = opener_at(text, len, *op);
        upto = at < upto ? at : upto;
    }
    if (format == SRV_TOOLS_FIREFUNCTION) { /* a required call may start at "[" */
        /* spaces alone, or spaces then "[": a call's list may follow, and the reply's content
         * is then null, so not even the spaces may have been sent */
        const char *p = skip_ws(text, text + len);
        if (p == text + len || *p == '[')
            upto = 0;
    }
    return held_if_blank(text, upto);
}
