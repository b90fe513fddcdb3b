/* toolcall.c - OpenAI tool calls: a request's "tools" into the template's context and a grammar
 * that keeps the model's calls to the tools' schemas, then the reply's text back into content
 * and "tool_calls". The model's own format is read off its chat template, as llama.cpp's server
 * does: Hermes / Qwen's <tool_call> blocks, Llama 3.x's bare {"name", "parameters"} object, or,
 * for a template that knows no tools, a generic JSON reply ({"tool_calls": [...]} or
 * {"response": "..."}) described in a system message. No HTTP; any thread. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define INVALID "invalid_request_error"

/* ---- formats ------------------------------------------------------------------------------- */

static const char *const format_names[] = {
    [SRV_TOOLS_GENERIC] = "generic", [SRV_TOOLS_HERMES] = "hermes", [SRV_TOOLS_LLAMA3] = "llama3"};

/* What a format's call is introduced by: the lazy grammar's trigger under tool_choice "auto" */
static const char *const format_trigger[] = {[SRV_TOOLS_GENERIC] = NULL,
                                             [SRV_TOOLS_HERMES] = "<tool_call>",
                                             [SRV_TOOLS_LLAMA3] = "{\"name\""};

int srv_tool_format_detect(const char *template_src)
{
    if (!template_src)
        return SRV_TOOLS_GENERIC;
    if (strstr(template_src, "<tool_call>"))
        return SRV_TOOLS_HERMES;
    /* Llama 3.1-3.3: custom tools answer {"name": ..., "parameters": ...} */
    if (strstr(template_src, "<|python_tag|>") ||
        (strstr(template_src, "<|eom_id|>") && strstr(template_src, "\"parameters\"")))
        return SRV_TOOLS_LLAMA3;
    return SRV_TOOLS_GENERIC;
}

int srv_tool_format_parse(const char *name)
{
    for (int i = 0; i < SRV_TOOLS_N; i++)
        if (!strcmp(name, format_names[i]))
            return i;
    return -1;
}

const char *srv_tool_format_name(int format)
{
    return format >= 0 && format < SRV_TOOLS_N ? format_names[format] : "?";
}

/* ---- request: tools, tool_choice, parallel_tool_calls ---------------------------------------- */

static int tools_bad(struct srv_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int tools_bad(struct srv_err *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    e->http = 400;
    e->type = INVALID;
    e->param = param;
    e->code = "invalid_value";
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static int tools_oom(struct srv_err *e)
{
    srv_err_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* OpenAI's function names: letters, digits, '_' and '-', at most 64 ('.' too, as vLLM takes) */
static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > SRV_TOOL_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-' || *s == '.'))
            return 0;
    return 1;
}

/* One {"type": "function", "function": {"name", "description", "parameters"}} checked. */
static int check_tool(json_t *t, json_t *seen, struct srv_err *e)
{
    json_t *fn = json_object_get(t, "function");
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(fn))
        return tools_bad(e, "tools",
                         "'tools' must be a list of {\"type\": \"function\", "
                         "\"function\": {...}}");
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name || !name_ok(name))
        return tools_bad(e, "tools",
                         "'tools': a function name must be 1 to 64 letters, digits, "
                         "'_', '-' or '.'");
    if (json_object_get(seen, name))
        return tools_bad(e, "tools", "'tools': the function '%s' is given twice", name);
    if (json_object_set_new(seen, name, json_true()))
        return tools_oom(e);
    json_t *d = json_object_get(fn, "description");
    if (d && !json_is_null(d) && !json_is_string(d))
        return tools_bad(e, "tools", "'tools': the description of '%s' must be a string", name);
    json_t *p = json_object_get(fn, "parameters");
    json_t *pt = json_object_get(p, "type");
    if ((p && !json_is_null(p) && !json_is_object(p)) ||
        (pt && !(json_is_string(pt) && !strcmp(json_string_value(pt), "object"))))
        return tools_bad(
            e, "tools", "'tools': the parameters of '%s' must be a JSON Schema of an object", name);
    return 0;
}

static int parse_choice(struct srv_req *r, json_t *root, json_t *seen, struct srv_err *e)
{
    json_t *tc = json_object_get(root, "tool_choice");
    r->tool_choice = SRV_TOOL_AUTO;
    if (!tc || json_is_null(tc))
        return 0;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (!strcmp(s, "none"))
            r->tool_choice = SRV_TOOL_NONE;
        else if (!strcmp(s, "required"))
            r->tool_choice = SRV_TOOL_REQUIRED;
        else if (strcmp(s, "auto"))
            return tools_bad(e, "tool_choice",
                             "'tool_choice' must be \"none\", \"auto\", "
                             "\"required\" or {\"type\": \"function\", \"function\": {\"name\"}}");
        return 0;
    }
    const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    if (!json_is_object(tc) || !name)
        return tools_bad(e, "tool_choice",
                         "'tool_choice' must be \"none\", \"auto\", \"required\" "
                         "or {\"type\": \"function\", \"function\": {\"name\"}}");
    if (!json_object_get(seen, name))
        return tools_bad(e, "tool_choice", "'tool_choice' names '%.64s', which is not in 'tools'",
                         name);
    r->tool_choice = SRV_TOOL_NAMED;
    if (!(r->tool_name = strdup(name)))
        return tools_oom(e);
    return 0;
}

/* ---- the calls' grammar ---------------------------------------------------------------------- */

/* Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference. */
static int data_keyword(const char *k)
{
    return !strcmp(k, "const") || !strcmp(k, "enum") || !strcmp(k, "default") ||
           !strcmp(k, "examples");
}

/* A tool's parameters are a document of their own, whose "#..." references mean their own root;
 * placed at base inside the calls' schema, each becomes "#<base>...". */
static int rebase_refs(json_t *v, const char *base)
{
    const char *k;
    json_t *x;
    size_t i;
    if (json_is_array(v)) {
        json_array_foreach(v, i, x)
        {
            if (rebase_refs(x, base))
                return -1;
        }
        return 0;
    }
    if (!json_is_object(v))
        return 0;
    json_object_foreach(v, k, x)
    {
        if (!strcmp(k, "$ref") && json_is_string(x) && json_string_value(x)[0] == '#') {
            char *ref = NULL;
            if (asprintf(&ref, "#%s%s", base, json_string_value(x) + 1) < 0 ||
                json_object_set_new(v, k, json_string(ref))) {
                free(ref);
                return -1;
            }
            free(ref);
        } else if (!data_keyword(k) && rebase_refs(x, base)) {
            return -1;
        }
    }
    return 0;
}

/* The JSON Schema of one call at path base: {"name": const, <args key>: the tool's parameters,
 * an object (OpenAI's rule; a schema that does not say gets "type": "object")}. */
static json_t *call_schema(json_t *fn, const char *args_key, const char *base)
{
    json_t *params = json_object_get(fn, "parameters");
    json_t *args = json_is_object(params) ? json_deep_copy(params) : json_object();
    char at[256];
    snprintf(at, sizeof at, "%s/properties/%s", base, args_key);
    if (!args ||
        (!json_object_get(args, "type") &&
         json_object_set_new(args, "type", json_string("object"))) ||
        rebase_refs(args, at)) {
        json_decref(args);
        return NULL;
    }
    json_t *props =
        json_pack("{s:{s:O}, s:o}", "name", "const", json_object_get(fn, "name"), args_key, args);
    return props ? json_pack("{s:s, s:o, s:[s,s], s:b}", "type", "object", "properties", props,
                             "required", "name", args_key, "additionalProperties", 0)
                 : NULL;
}

/* One call to any of the tools the request allows (the named one, or all of them), at path
 * base of the schema being built. */
static json_t *calls_schema(const struct srv_req *r, const char *args_key, const char *base)
{
    json_t *any = json_array(), *t;
    size_t i, n = 0;
    json_array_foreach(r->tools, i, t)
    {
        const char *name =
            json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        n += r->tool_choice != SRV_TOOL_NAMED || !strcmp(name, r->tool_name);
    }
    json_array_foreach(r->tools, i, t)
    {
        json_t *fn = json_object_get(t, "function");
        if (r->tool_choice == SRV_TOOL_NAMED &&
            strcmp(json_string_value(json_object_get(fn, "name")), r->tool_name))
            continue;
        char at[128];
        if (n == 1)
            snprintf(at, sizeof at, "%s", base);
        else
            snprintf(at, sizeof at, "%s/anyOf/%zu", base, json_array_size(any));
        if (!any || json_array_append_new(any, call_schema(fn, args_key, at))) {
            json_decref(any);
            return NULL;
        }
    }
    if (any && json_array_size(any) == 1) {
        json_t *one = json_incref(json_array_get(any, 0));
        json_decref(any);
        return one;
    }
    return any ? json_pack("{s:o}", "anyOf", any) : NULL;
}

/* The generic format's whole reply: {"tool_calls": [calls]} or, under "auto", {"response"}. */
static json_t *generic_schema(const struct srv_req *r)
{
    /* under "auto" the calls' object is the first of two alternatives */
    const char *at = r->tool_choice == SRV_TOOL_AUTO ? "/anyOf/0/properties/tool_calls/items"
                                                     : "/properties/tool_calls/items";
    json_t *calls = json_pack("{s:s, s:o, s:i}", "type", "array", "items",
                              calls_schema(r, "arguments", at), "minItems", 1);
    if (calls && !r->parallel_tools)
        json_object_set_new(calls, "maxItems", json_integer(1));
    json_t *with_calls =
        json_pack("{s:s, s:{s:o}, s:[s], s:b}", "type", "object", "properties", "tool_calls", calls,
                  "required", "tool_calls", "additionalProperties", 0);
    if (r->tool_choice != SRV_TOOL_AUTO)
        return with_calls;
    return json_pack("{s:[o, {s:s, s:{s:{s:s}}, s:[s], s:b}]}", "anyOf", with_calls, "type",
                     "object", "properties", "response", "type", "string", "required", "response",
                     "additionalProperties", 0);
}

/* Rename the rule `root` of a GBNF text to `to` (references included; literals, classes and
 * comments untouched), so that the converter's grammar becomes a part of a larger one. */
static int rename_root(const char *g, const char *to, struct srv_buf *out)
{
    for (const char *p = g; *p;) {
        if (*p == '"' || *p == '[') {
            char close = *p == '"' ? '"' : ']';
            const char *q = p + 1;
            while (*q && *q != close)
                q += q[0] == '\\' && q[1] ? 2 : 1;
            q += *q != 0;
            srv_buf_add(out, p, (size_t)(q - p));
            p = q;
        } else if (*p == '#') {
            const char *q = strchr(p, '\n');
            q = q ? q : p + strlen(p);
            srv_buf_add(out, p, (size_t)(q - p));
            p = q;
        } else if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                   (*p >= '0' && *p <= '9') || *p == '-' || *p == '_') {
            const char *q = p;
            while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
                   (*q >= '0' && *q <= '9') || *q == '-' || *q == '_')
                q++;
            if (q - p == 4 && !memcmp(p, "root", 4))
                srv_buf_str(out, to);
            else
                srv_buf_add(out, p, (size_t)(q - p));
            p = q;
        } else {
            srv_buf_add(out, p++, 1);
        }
    }
    return out->err ? -ENOMEM : 0;
}

/* The wrapper around the calls' JSON (rule tool-call-json), per format; required / named
 * calls start at the reply's first byte, "auto" ones at the format's trigger. */
static const char *wrapper(int format, int parallel)
{
    if (format == SRV_TOOLS_HERMES)
        return parallel ? "root ::= tool-call (\"\\n\" tool-call)*\n"
                          "tool-call ::= \"<tool_call>\" \"\\n\"? tool-call-json \"\\n\"? "
                          "\"</tool_call>\"\n"
                        : "root ::= \"<tool_call>\" \"\\n\"? tool-call-json \"\\n\"? "
                          "\"</tool_call>\"\n";
    return "root ::= tool-call-json\n"; /* llama3 (one call), generic (the whole reply) */
}

static int compile_tools(struct srv_req *r, int format, struct srv_err *e)
{
    json_t *schema =
        format == SRV_TOOLS_GENERIC
            ? generic_schema(r)
            : calls_schema(r, format == SRV_TOOLS_LLAMA3 ? "parameters" : "arguments", "");
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL, *gbnf = NULL;
    struct srv_buf g = {0};
    struct kwk_err err = {0};
    size_t glen = 0;
    int rc = -1;
    json_decref(schema);
    if (!text) {
        tools_oom(e);
        goto out;
    }
    if (kwk_json_schema_to_gbnf(text, strlen(text), &gbnf, &glen, &err)) {
        if (err.code == -ENOMEM) {
            tools_oom(e);
            goto out;
        }
        srv_err_set(e, 400, INVALID, "tools",
                    err.code == KWK_EUNSUPPORTED ? "unsupported_parameter" : "invalid_value",
                    "'tools': %s", err.msg);
        goto out;
    }
    srv_buf_str(&g, wrapper(format, r->parallel_tools));
    if (rename_root(gbnf, "tool-call-json", &g)) {
        tools_oom(e);
        goto out;
    }
    if (!(r->grammar = kwk_grammar_new(g.p, g.len, &err))) {
        if (err.code == -ENOMEM)
            tools_oom(e);
        else
            srv_err_set(e, 400, INVALID, "tools", "invalid_value", "'tools': %s", err.msg);
        goto out;
    }
    if (srv_grammar_check_start(r, "tools", e))
        goto out;
    if (r->tool_choice == SRV_TOOL_AUTO)
        r->grammar_trigger = format_trigger[format];
    rc = 0;
out:
    free(text);
    kwk_string_free(gbnf);
    srv_buf_free(&g);
    return rc;
}

/* ---- the generic format's prompt ------------------------------------------------------------- */

/* The instructions a template without tools gets in its system message. */
static int generic_system(const struct srv_req *r, struct srv_buf *b)
{
    json_t *t;
    size_t i;
    srv_buf_str(b, "You can call the following tools. Each is given as JSON: its name, what it "
                   "does, and the JSON Schema of its arguments.\n");
    json_array_foreach(r->tools, i, t)
    {
        char *s = json_dumps(json_object_get(t, "function"), JSON_COMPACT);
        if (!s)
            return -ENOMEM;
        srv_buf_str(b, s);
        srv_buf_str(b, "\n");
        free(s);
    }
    if (r->tool_choice == SRV_TOOL_NAMED) {
        srv_buf_str(b, "Call the tool ");
        srv_buf_str(b, r->tool_name);
        srv_buf_str(b, ". ");
    }
    srv_buf_str(b, "Answer with one JSON object: {\"tool_calls\": [{\"name\": <a tool's name>, "
                   "\"arguments\": <its arguments>}]} to call tools");
    if (r->tool_choice == SRV_TOOL_AUTO)
        srv_buf_str(b, ", or {\"response\": <your reply as a string>} to answer the user "
                       "directly");
    srv_buf_str(b, ".");
    return b->err ? -ENOMEM : 0;
}

static int add_generic_system(struct srv_req *r, struct srv_err *e)
{
    struct srv_buf b = {0};
    json_t *m0 = json_array_get(r->messages, 0);
    const char *role = json_string_value(json_object_get(m0, "role"));
    int rc = -1;
    if (role && !strcmp(role, "system")) {
        srv_buf_str(&b, json_string_value(json_object_get(m0, "content")));
        srv_buf_str(&b, "\n\n");
    }
    if (generic_system(r, &b) || b.err) {
        tools_oom(e);
        goto out;
    }
    json_t *msg = json_pack("{s:s, s:s%}", "role", "system", "content", b.p, b.len);
    if (!msg || (role && !strcmp(role, "system") ? json_array_set_new(r->messages, 0, msg)
                                                 : json_array_insert_new(r->messages, 0, msg))) {
        tools_oom(e);
        goto out;
    }
    rc = 0;
out:
    srv_buf_free(&b);
    return rc;
}

/* m's value as the one-line JSON text of {key: value} into m's content. */
static int content_as_json(json_t *m, const char *key, json_t *value)
{
    json_t *wrap = value ? json_pack("{s:o}", key, value) : NULL;
    char *s = wrap ? json_dumps(wrap, JSON_COMPACT) : NULL;
    int rc = !s || json_object_set_new(m, "content", json_string(s)) ? -1 : 0;
    json_decref(wrap);
    free(s);
    return rc;
}

/* A tool's result, for a template that knows no tools: a user turn holding
 * {"tool_response": {"tool_call_id", "name", "content"}} (llama.cpp's polyfill does the same;
 * many such templates know only system, user and assistant). */
static int generic_tool_result(json_t *m)
{
    static const char *const keys[] = {"tool_call_id", "name", "content"};
    json_t *res = json_object();
    for (size_t i = 0; res && i < sizeof keys / sizeof *keys; i++) {
        json_t *v = json_object_get(m, keys[i]);
        if (v && json_object_set(res, keys[i], v)) {
            json_decref(res);
            res = NULL;
        }
    }
    if (!res || content_as_json(m, "tool_response", res))
        return -1;
    json_object_del(m, "tool_call_id");
    json_object_del(m, "name");
    return json_object_set_new(m, "role", json_string("user"));
}

/* An earlier assistant turn's calls and the tools' results, for a template that knows no tools:
 * the JSON the generic format would have made the model write, and user turns. */
static int generic_history(struct srv_req *r, struct srv_err *e)
{
    json_t *m;
    size_t i;
    json_array_foreach(r->messages, i, m)
    {
        if (!strcmp(json_string_value(json_object_get(m, "role")), "tool")) {
            if (generic_tool_result(m))
                return tools_oom(e);
            continue;
        }
        json_t *calls = json_object_get(m, "tool_calls"), *c, *out = json_array();
        size_t k;
        if (!out)
            return tools_oom(e);
        json_array_foreach(calls, k, c)
        {
            json_t *fn = json_object_get(c, "function");
            json_t *one = json_pack("{s:O, s:O}", "name", json_object_get(fn, "name"), "arguments",
                                    json_object_get(fn, "arguments"));
            if (!one || json_array_append_new(out, one)) {
                json_decref(out);
                return tools_oom(e);
            }
        }
        if (!json_array_size(out)) {
            json_decref(out);
            continue;
        }
        /* the turn's own text, if any, is dropped: the format has no place for both */
        if (content_as_json(m, "tool_calls", out))
            return tools_oom(e);
        json_object_del(m, "tool_calls");
    }
    return 0;
}

int srv_tools_parse(struct srv_req *r, json_t *root, int format, struct srv_err *e)
{
    json_t *tools = json_object_get(root, "tools"), *t, *seen = json_object();
    size_t i;
    int rc = -1;
    if (!seen)
        return tools_oom(e);
    r->parallel_tools = 1;
    json_t *par = json_object_get(root, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par)) {
        tools_bad(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        goto out;
    }
    if (json_is_false(par))
        r->parallel_tools = 0;
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        tools_bad(e, "tools", "'tools' must be a list of functions");
        goto out;
    }
    if (json_array_size(tools) > SRV_MAX_TOOLS) {
        srv_err_set(e, 400, INVALID, "tools", "invalid_value", "'tools' has more than %d functions",
                    SRV_MAX_TOOLS);
        goto out;
    }
    json_array_foreach(tools, i, t)
    {
        if (check_tool(t, seen, e))
            goto out;
    }
    json_t *tc = json_object_get(root, "tool_choice");
    if (!json_array_size(tools)) {
        /* no tools: "none" and "auto" mean plain text; anything else names a missing tool */
        if (tc && !json_is_null(tc) &&
            !(json_is_string(tc) &&
              (!strcmp(json_string_value(tc), "none") || !strcmp(json_string_value(tc), "auto")))) {
            tools_bad(e, "tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty");
            goto out;
        }
        goto history;
    }
    if (r->kind == SRV_COMPLETION) {
        tools_bad(e, "tools", "'tools' is only for /v1/chat/completions");
        goto out;
    }
    if (parse_choice(r, root, seen, e))
        goto out;
    if (r->tool_choice == SRV_TOOL_NONE) /* the model is not told of them */
        goto history;
    if (r->grammar) {
        tools_bad(e, "tools", "'tools' and a response format or grammar cannot be used together");
        goto out;
    }
    if (!(r->tools = json_deep_copy(tools))) {
        tools_oom(e);
        goto out;
    }
    r->tool_format = format;
    if (compile_tools(r, format, e) || (format == SRV_TOOLS_GENERIC && add_generic_system(r, e)))
        goto out;
history: /* earlier calls and results reach the template whether or not tools are offered now */
    rc = format == SRV_TOOLS_GENERIC && generic_history(r, e) ? -1 : 0;
out:
    json_decref(seen);
    return rc;
}

/* ---- the reply: content and calls ------------------------------------------------------------ */

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

/* {"name", <args key>} into OpenAI's {"id", "type", "function": {"name", "arguments": text}};
 * NULL when obj is not a call. */
static json_t *make_call(json_t *obj, uint64_t seed, size_t index)
{
    const char *name = json_string_value(json_object_get(obj, "name"));
    json_t *args = json_object_get(obj, "arguments");
    if (!args)
        args = json_object_get(obj, "parameters");
    if (!json_is_object(obj) || !name || !args || !(json_is_object(args) || json_is_string(args)))
        return NULL;
    /* arguments are a JSON text in OpenAI's replies; a model that wrote a string wrote one */
    char *text =
        json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, JSON_COMPACT);
    json_t *c = text ? json_pack("{s:o, s:s, s:{s:s, s:s}}", "id", call_id(seed, index), "type",
                                 "function", "function", "name", name, "arguments", text)
                     : NULL;
    free(text);
    return c;
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

/* Generic: the whole reply is {"tool_calls": [...]} or {"response": "..."}. */
static json_t *generic_calls(const char *text, size_t len, uint64_t seed, char **content,
                             size_t *content_len)
{
    json_t *obj = json_loadb(text, len, 0, NULL), *calls = NULL, *c;
    json_t *resp = json_object_get(obj, "response");
    json_t *list = json_object_get(obj, "tool_calls");
    size_t i;
    if (json_is_string(resp) &&
        (*content = strndup(json_string_value(resp), json_string_length(resp))))
        *content_len = json_string_length(resp);
    if (json_is_array(list) && json_array_size(list) && (calls = json_array())) {
        json_array_foreach(list, i, c)
        {
            json_t *call = make_call(c, seed, i);
            if (!call || json_array_append_new(calls, call)) {
                json_decref(calls);
                calls = NULL;
                break;
            }
        }
    }
    json_decref(obj);
    return calls;
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
    const json_t *tools = q->tools;
    memset(out, 0, sizeof *out);
    out->named = q->tool_choice == SRV_TOOL_NAMED;
    out->content = text;
    out->content_len = len;
    if (format == SRV_TOOLS_GENERIC)
        out->calls = generic_calls(text, len, seed, &out->own, &out->content_len);
    else
        out->calls = format == SRV_TOOLS_HERMES ? hermes_calls(text, len, seed, &out->content_len)
                                                : llama3_calls(text, len, seed, &out->content_len);
    /* a call of a tool the request did not give is not a call (a Llama 3 reply's object that
     * opened as "{ \"name\"" never met the grammar, whose trigger is "{\"name\"") */
    if (out->calls && !names_known(out->calls, tools)) {
        json_decref(out->calls);
        out->calls = NULL;
        free(out->own);
        out->own = NULL;
        out->content_len = len;
    }
    if (out->own)
        out->content = out->own;
    else if (format == SRV_TOOLS_GENERIC)
        out->content_len = out->calls ? 0 : len; /* not the format's JSON: the text as it came */
    /* a call with nothing but whitespace before it has no content (null) */
    size_t k = 0;
    while (k < out->content_len && out->content[k] && strchr(" \t\r\n", out->content[k]))
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

size_t srv_tools_sendable(int format, const char *text, size_t len)
{
    const char *t = format >= 0 && format < SRV_TOOLS_N ? format_trigger[format] : NULL;
    if (!t)
        return 0; /* generic: the whole reply is JSON, its content known only at the end */
    if (format == SRV_TOOLS_LLAMA3) { /* a call may open as "{ \"name\"" or "{\n": from '{' */
        const char *brace = memchr(text, '{', len);
        return brace ? (size_t)(brace - text) : len;
    }
    size_t n = strlen(t);
    const char *hit = memmem(text, len, t, n);
    if (hit)
        return (size_t)(hit - text);
    /* hold back a tail that could be the trigger's beginning */
    for (size_t k = n - 1; k > 0; k--)
        if (len >= k && !memcmp(text + len - k, t, k))
            return len - k;
    return len;
}
