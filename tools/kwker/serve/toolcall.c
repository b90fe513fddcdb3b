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
#include <time.h>

#include "toolcall.h"

#define INVALID "invalid_request_error"

/* ---- formats ------------------------------------------------------------------------------- */

static const char *const format_names[] = {[SRV_TOOLS_GENERIC] = "generic",
                                           [SRV_TOOLS_HERMES] = "hermes",
                                           [SRV_TOOLS_LLAMA3] = "llama3",
                                           [SRV_TOOLS_MISTRAL] = "mistral_nemo",
                                           [SRV_TOOLS_FUNCTIONARY] = "functionary",
                                           [SRV_TOOLS_DEEPSEEK_R1] = "deepseek_r1",
                                           [SRV_TOOLS_FIREFUNCTION] = "firefunction",
                                           [SRV_TOOLS_COMMAND_R] = "command_r_plus"};

/* What a format's call is introduced by: the first is the lazy grammar's trigger under
 * tool_choice "auto" (Functionary's python tag opens free code, which needs no grammar) */
static const char *const format_openers[][3] = {
    [SRV_TOOLS_GENERIC] = {NULL},
    [SRV_TOOLS_HERMES] = {"<tool_call>", NULL},
    [SRV_TOOLS_LLAMA3] = {"{\"name\"", NULL},
    [SRV_TOOLS_MISTRAL] = {"[TOOL_CALLS]", NULL},
    [SRV_TOOLS_FUNCTIONARY] = {"<function=", PYTHON_TAG, NULL},
    [SRV_TOOLS_DEEPSEEK_R1] = {R1_CALLS_BEGIN, NULL},
    [SRV_TOOLS_FIREFUNCTION] = {" functools[", NULL},
    [SRV_TOOLS_COMMAND_R] = {NULL}};

const char *const *srv_tool_format_openers(int format)
{
    return format_openers[format >= 0 && format < SRV_TOOLS_N ? format : SRV_TOOLS_GENERIC];
}

/* The texts of a format's replies that a vocabulary may hold as one special token, which the
 * reply must then keep (llama.cpp's preserved_tokens of each format: the markers its reader
 * reads, and the think block around R1's and Hermes / Qwen's calls). Not Llama 3's
 * <|python_tag|>: llama.cpp keeps it only for the built-in tools, which this server does not
 * offer; its calls are the JSON objects, read the same with the tag dropped, and a tag before
 * code that is no call would otherwise reach the content. */
static const char *const format_preserved[][8] = {
    [SRV_TOOLS_GENERIC] = {NULL},
    [SRV_TOOLS_HERMES] = {"<tool_call>", "</tool_call>", "<think>", "</think>", NULL},
    [SRV_TOOLS_LLAMA3] = {NULL},
    [SRV_TOOLS_MISTRAL] = {"[TOOL_CALLS]", NULL},
    [SRV_TOOLS_FUNCTIONARY] = {PYTHON_TAG, "<function=", "</function>", NULL},
    [SRV_TOOLS_DEEPSEEK_R1] = {"<think>", "</think>", R1_CALLS_BEGIN, R1_CALL_BEGIN, R1_SEP,
                               R1_CALL_END, R1_CALLS_END, NULL},
    [SRV_TOOLS_FIREFUNCTION] = {" functools[", NULL},
    [SRV_TOOLS_COMMAND_R] = {NULL}};

int srv_special_tokens(const kwk_tokenizer *tok, const char *const *texts, int32_t *ids, int cap)
{
    int n = 0;
    for (const char *const *t = texts; tok && *t && n < cap; t++) {
        int32_t one[2];
        size_t k = 0;
        /* as llama.cpp: a text the tokenizer reads as exactly one token (else it is ordinary
         * text, which the reply keeps anyway); only a special one needs keeping */
        if (kwk_tokenizer_encode(tok, *t, strlen(*t), 0, one, 2, &k) == 0 && k == 1 &&
            kwk_tokenizer_is_special(tok, one[0]) == 1)
            ids[n++] = one[0];
    }
    return n;
}

int srv_tool_preserved(int format, const kwk_tokenizer *tok, int32_t *ids, int cap)
{
    if (!tok || format < 0 || format >= SRV_TOOLS_N)
        return 0;
    return srv_special_tokens(tok, format_preserved[format], ids, cap);
}

/* Whether the request offers a tool of that name. */
static int offers_tool(const json_t *tools, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        json_t *fn = json_object_get(t, "function");
        const char *have = json_string_value(json_object_get(fn ? fn : t, "name"));
        if (have && !strcmp(have, name))
            return 1;
    }
    return 0;
}

int srv_tool_preserved_req(const struct srv_req *q, const kwk_tokenizer *tok, const int32_t *ids,
                           int n, int32_t *out)
{
    int32_t tag = -1;
    if (q->tools && q->tool_format == SRV_TOOLS_FUNCTIONARY &&
        !offers_tool(q->tools, "python") && !offers_tool(q->tools, "ipython")) {
        static const char *const py[] = {PYTHON_TAG, NULL};
        if (srv_special_tokens(tok, py, &tag, 1) != 1)
            tag = -1;
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] != tag)
            out[k++] = ids[i];
    return k;
}

/* The most specific marks first (llama.cpp's order), so that a template is read as before:
 * Functionary's has Llama 3.1's <|python_tag|> too. */
int srv_tool_format_detect(const char *template_src)
{
    const char *s = template_src;
    if (!s)
        return SRV_TOOLS_GENERIC;
    if (strstr(s, R1_CALLS_BEGIN))
        return SRV_TOOLS_DEEPSEEK_R1;
    if (strstr(s, " functools["))
        return SRV_TOOLS_FIREFUNCTION;
    if (strstr(s, "<|start_header_id|>") && strstr(s, "<function="))
        return SRV_TOOLS_FUNCTIONARY;
    if (strstr(s, "<tool_call>"))
        return SRV_TOOLS_HERMES;
    /* Llama 3.1-3.3: custom tools answer {"name": ..., "parameters": ...} (3.2's template has
     * only the ipython role that llama.cpp knows it by) */
    if (strstr(s, PYTHON_TAG) || (strstr(s, "<|eom_id|>") && strstr(s, "\"parameters\"")) ||
        strstr(s, "<|start_header_id|>ipython<|end_header_id|>"))
        return SRV_TOOLS_LLAMA3;
    if (strstr(s, "[TOOL_CALLS]"))
        return SRV_TOOLS_MISTRAL;
    /* Command R+'s tool_use template: its own "Action:" list, which llama.cpp does not read
     * (it answers in the generic format) */
    if (strstr(s, "<|CHATBOT_TOKEN|>") && strstr(s, "tool_name"))
        return SRV_TOOLS_COMMAND_R;
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

/* The tool's parameters as a schema of their own: an object (OpenAI's rule; a schema that does
 * not say gets "type": "object"). */
static json_t *params_schema(json_t *fn)
{
    json_t *params = json_object_get(fn, "parameters");
    json_t *args = json_is_object(params) ? json_deep_copy(params) : json_object();
    if (args && !json_object_get(args, "type") &&
        json_object_set_new(args, "type", json_string("object"))) {
        json_decref(args);
        return NULL;
    }
    return args;
}

/* The JSON Schema of one call at path base: {"name": const, <args key>: the tool's parameters}
 * and, for Mistral, "id": the 9 letters or digits its template asks of a call's id. */
static json_t *call_schema(json_t *fn, const char *args_key, int with_id, const char *base)
{
    json_t *args = params_schema(fn);
    char at[256];
    snprintf(at, sizeof at, "%s/properties/%s", base, args_key);
    if (!args || rebase_refs(args, at)) {
        json_decref(args);
        return NULL;
    }
    json_t *props =
        json_pack("{s:{s:O}, s:o}", "name", "const", json_object_get(fn, "name"), args_key, args);
    if (props && with_id &&
        json_object_set_new(
            props, "id",
            json_pack("{s:s, s:s}", "type", "string", "pattern", "^[a-zA-Z0-9]{9}$"))) {
        json_decref(props);
        return NULL;
    }
    /* Mistral's reply is read back only with its id (as llama.cpp's grammar requires it) */
    return !props ? NULL
           : with_id
               ? json_pack("{s:s, s:o, s:[s,s,s], s:b}", "type", "object", "properties", props,
                           "required", "name", args_key, "id", "additionalProperties", 0)
               : json_pack("{s:s, s:o, s:[s,s], s:b}", "type", "object", "properties", props,
                           "required", "name", args_key, "additionalProperties", 0);
}

/* Whether the request lets the model call the tool named name (the named one, or any). */
static int tool_allowed(const struct srv_req *r, json_t *tool)
{
    const char *name =
        json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
    return r->tool_choice != SRV_TOOL_NAMED || !strcmp(name, r->tool_name);
}

/* One call to any of the tools the request allows, at path base of the schema being built. */
static json_t *calls_schema(const struct srv_req *r, const char *args_key, int with_id,
                            const char *base)
{
    json_t *any = json_array(), *t;
    size_t i, n = 0;
    json_array_foreach(r->tools, i, t) n += tool_allowed(r, t);
    json_array_foreach(r->tools, i, t)
    {
        if (!tool_allowed(r, t))
            continue;
        char at[128];
        if (n == 1)
            snprintf(at, sizeof at, "%s", base);
        else
            snprintf(at, sizeof at, "%s/anyOf/%zu", base, json_array_size(any));
        json_t *one = call_schema(json_object_get(t, "function"), args_key, with_id, at);
        if (!any || json_array_append_new(any, one)) {
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

/* A list of calls at path base (one when parallel calls are off). */
static json_t *calls_list_schema(const struct srv_req *r, int with_id, const char *base)
{
    char at[128];
    snprintf(at, sizeof at, "%s/items", base);
    json_t *list = json_pack("{s:s, s:o, s:i}", "type", "array", "items",
                             calls_schema(r, "arguments", with_id, at), "minItems", 1);
    if (list && !r->parallel_tools && json_object_set_new(list, "maxItems", json_integer(1))) {
        json_decref(list);
        return NULL;
    }
    return list;
}

/* The generic format's whole reply: {"tool_calls": [calls]} or, under "auto", {"response"}. */
static json_t *generic_schema(const struct srv_req *r)
{
    /* under "auto" the calls' object is the first of two alternatives */
    const char *at = r->tool_choice == SRV_TOOL_AUTO ? "/anyOf/0/properties/tool_calls"
                                                     : "/properties/tool_calls";
    json_t *with_calls =
        json_pack("{s:s, s:{s:o}, s:[s], s:b}", "type", "object", "properties", "tool_calls",
                  calls_list_schema(r, 0, at), "required", "tool_calls", "additionalProperties", 0);
    if (r->tool_choice != SRV_TOOL_AUTO)
        return with_calls;
    return json_pack("{s:[o, {s:s, s:{s:{s:s}}, s:[s], s:b}]}", "anyOf", with_calls, "type",
                     "object", "properties", "response", "type", "string", "required", "response",
                     "additionalProperties", 0);
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* The rule names of a GBNF text, each prefixed, and `root` (when to is not NULL) renamed to
 * `to` instead (references included; literals, classes and comments untouched), so that the
 * converter's grammar becomes a part of a larger one. */
static int rewrite_names(const char *g, const char *to, const char *prefix, struct srv_buf *out)
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
        } else if (is_name_char(*p) && !(*p >= '0' && *p <= '9')) { /* not a count: {1,16} */
            const char *q = p;
            while (is_name_char(*q))
                q++;
            if (to && q - p == 4 && !memcmp(p, "root", 4)) {
                srv_buf_str(out, to);
            } else {
                srv_buf_str(out, prefix);
                srv_buf_add(out, p, (size_t)(q - p));
            }
            p = q;
        } else {
            srv_buf_add(out, p++, 1);
        }
    }
    return out->err ? -ENOMEM : 0;
}

/* schema (taken) as GBNF rules into out, named as rewrite_names names them. */
static int schema_rules(json_t *schema, const char *to, const char *prefix, struct srv_buf *out,
                        struct srv_err *e)
{
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL, *gbnf = NULL;
    struct kwk_err err = {0};
    size_t glen = 0;
    int rc = -1;
    json_decref(schema);
    if (!text) {
        tools_oom(e);
        goto out;
    }
    if (kwk_json_schema_to_gbnf(text, strlen(text), &gbnf, &glen, &err)) {
        if (err.code == -ENOMEM)
            tools_oom(e);
        else
            srv_err_set(e, 400, INVALID, "tools",
                        err.code == KWK_EUNSUPPORTED ? "unsupported_parameter" : "invalid_value",
                        "'tools': %s", err.msg);
        goto out;
    }
    if (rewrite_names(gbnf, to, prefix, out)) {
        tools_oom(e);
        goto out;
    }
    rc = 0;
out:
    free(text);
    kwk_string_free(gbnf);
    return rc;
}

/* The wrapper around the calls' JSON (rule tool-call-json) of the formats whose calls are one
 * JSON text; required / named calls start at the reply's first byte, "auto" ones at the
 * format's trigger. */
static const char *json_wrapper(int format, int parallel)
{
    switch (format) {
    case SRV_TOOLS_HERMES:
        return parallel ? "root ::= tool-call (\"\\n\" tool-call)*\n"
                          "tool-call ::= \"<tool_call>\" \"\\n\"? tool-call-json \"\\n\"? "
                          "\"</tool_call>\"\n"
                        : "root ::= \"<tool_call>\" \"\\n\"? tool-call-json \"\\n\"? "
                          "\"</tool_call>\"\n";
    case SRV_TOOLS_MISTRAL:
        return "root ::= \"[TOOL_CALLS]\" tool-call-json\n";
    case SRV_TOOLS_FIREFUNCTION: /* llama.cpp lets a required call drop the marker */
        return "root ::= \" functools\"? tool-call-json\n";
    default: /* llama3 (one call), generic (the whole reply) */
        return "root ::= tool-call-json\n";
    }
}

static json_t *json_format_schema(const struct srv_req *r, int format)
{
    switch (format) {
    case SRV_TOOLS_LLAMA3:
        return calls_schema(r, "parameters", 0, "");
    case SRV_TOOLS_HERMES:
        return calls_schema(r, "arguments", 0, "");
    case SRV_TOOLS_MISTRAL:
        return calls_list_schema(r, 1, "");
    case SRV_TOOLS_FIREFUNCTION:
        return calls_list_schema(r, 0, "");
    default:
        return generic_schema(r);
    }
}

/* The tool Functionary's python tag calls (toolcall_reply.c reads the tag's code as its) */
static int is_python(const char *name)
{
    return !strcmp(name, "python");
}

/* Functionary's and R1's calls name the tool outside the arguments' JSON: one rule a tool
 * (t<i>-call), each with its parameters' rules under its own prefix. */
static int per_tool_rules(const struct srv_req *r, int format, struct srv_buf *g, struct srv_err *e)
{
    int r1 = format == SRV_TOOLS_DEEPSEEK_R1;
    json_t *t;
    size_t i;
    if (r1)
        srv_buf_str(g, r->parallel_tools ? "root ::= \"" R1_CALLS_BEGIN "\" tool-call (\"\\n\"? "
                                           "tool-call)* \"" R1_CALLS_END "\"\n"
                                         : "root ::= \"" R1_CALLS_BEGIN
                                           "\" tool-call \"" R1_CALLS_END "\"\n");
    else
        srv_buf_str(g, r->parallel_tools ? "root ::= tool-call (\"\\n\"? tool-call)*\n"
                                         : "root ::= tool-call\n");
    srv_buf_str(g, "tool-call ::= ");
    const char *sep = "";
    json_array_foreach(r->tools, i, t)
    {
        if (!tool_allowed(r, t))
            continue;
        const char *name =
            json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        char line[64];
        snprintf(line, sizeof line, "%st%zu-call", sep, i);
        srv_buf_str(g, line);
        if (!r1 && is_python(name))
            srv_buf_str(g, " | python-call");
        sep = " | ";
    }
    srv_buf_str(g, "\npython-call ::= \"" PYTHON_TAG "\" [^\\x00]*\n");
    json_array_foreach(r->tools, i, t)
    {
        if (!tool_allowed(r, t))
            continue;
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        char head[512], prefix[32];
        snprintf(prefix, sizeof prefix, "t%zu-", i);
        if (r1)
            snprintf(head, sizeof head,
                     "t%zu-call ::= \"" R1_CALL_BEGIN "function" R1_SEP "%s\\n```json\\n\" "
                     "t%zu-root \"```" R1_CALL_END "\"\n",
                     i, name, i);
        else
            snprintf(head, sizeof head,
                     "t%zu-call ::= \"<function=%s>\" t%zu-root \"</function>\"\n", i, name, i);
        srv_buf_str(g, head);
        if (schema_rules(params_schema(fn), NULL, prefix, g, e))
            return -1;
    }
    return g->err ? tools_oom(e) : 0;
}

static int compile_tools(struct srv_req *r, int format, struct srv_err *e)
{
    struct srv_buf g = {0};
    struct kwk_err err = {0};
    int rc = -1;
    if (format == SRV_TOOLS_FUNCTIONARY || format == SRV_TOOLS_DEEPSEEK_R1) {
        if (per_tool_rules(r, format, &g, e))
            goto out;
    } else {
        srv_buf_str(&g, json_wrapper(format, r->parallel_tools));
        if (schema_rules(json_format_schema(r, format), "tool-call-json", "", &g, e))
            goto out;
    }
    if (g.err) {
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
        r->grammar_trigger = format_openers[format][0];
    rc = 0;
out:
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

/* The formats whose templates join a call's arguments to their text as a string (a JSON
 * object there fails, as in transformers): they get the arguments as the request wrote them. */
static int args_as_text(int format)
{
    return format == SRV_TOOLS_FUNCTIONARY || format == SRV_TOOLS_DEEPSEEK_R1 ||
           format == SRV_TOOLS_FIREFUNCTION;
}

/* One assistant turn's calls as transformers hands them to the template: the content null when
 * the request's was (R1's template tests "content is none"), the arguments as text for the
 * formats that want it (orig: the request's own message). */
static int native_turn(json_t *m, json_t *orig, int format)
{
    json_t *c = json_object_get(orig, "content"), *calls = json_object_get(m, "tool_calls");
    json_t *ocalls = json_object_get(orig, "tool_calls"), *call;
    size_t k;
    if ((!c || json_is_null(c)) && json_object_set_new(m, "content", json_null()))
        return -1;
    if (!args_as_text(format))
        return 0;
    json_array_foreach(calls, k, call)
    {
        json_t *args =
            json_object_get(json_object_get(json_array_get(ocalls, k), "function"), "arguments");
        if (json_is_string(args) &&
            json_object_set(json_object_get(call, "function"), "arguments", args))
            return -1;
    }
    return 0;
}

/* Earlier calls for a template that writes them itself (r->messages holds one message a
 * message of root's, in order: openai.c's add_message). */
static int native_history(struct srv_req *r, json_t *root, int format, struct srv_err *e)
{
    json_t *orig = json_object_get(root, "messages"), *m;
    size_t i;
    if (json_array_size(orig) != json_array_size(r->messages))
        return 0;
    json_array_foreach(r->messages, i, m)
    {
        if (json_array_size(json_object_get(m, "tool_calls")) &&
            native_turn(m, json_array_get(orig, i), format))
            return tools_oom(e);
    }
    return 0;
}

/* The clock of a prompt: $SOURCE_DATE_EPOCH (seconds since 1970, the reproducible-builds
 * convention) when set to a number, so a prompt can be rendered twice the same; else now. */
static time_t prompt_now(void)
{
    const char *e = getenv("SOURCE_DATE_EPOCH");
    char *end = NULL;
    long long v = e && *e ? strtoll(e, &end, 10) : -1;
    return v >= 0 && end && !*end ? (time_t)v : time(NULL);
}

/* Firefunction v2's "datetime": now, as llama.cpp formats it. */
static int firefunction_context(const struct srv_req *q, json_t *ctx)
{
    char when[64], *fns = q->tools ? json_dumps(q->tools, JSON_INDENT(2)) : strdup("");
    time_t now = prompt_now();
    struct tm tm;
    int rc = -ENOMEM;
    if (!gmtime_r(&now, &tm) || !strftime(when, sizeof when, "%b %d %Y %H:%M:%S GMT", &tm))
        snprintf(when, sizeof when, "Jan 01 1970 00:00:00 GMT");
    if (fns && !json_object_set_new(ctx, "functions", json_string(fns)) &&
        !json_object_set_new(ctx, "datetime", json_string(when)) &&
        !json_object_set_new(ctx, "tools", json_null()))
        rc = 0;
    free(fns);
    return rc;
}

int srv_tools_context(const struct srv_req *q, int server_format, json_t *ctx)
{
    /* Firefunction's template wants its context with tools or not (a request without them
     * reads as the generic format) */
    if (server_format == SRV_TOOLS_FIREFUNCTION || q->tool_format == SRV_TOOLS_FIREFUNCTION)
        return firefunction_context(q, ctx);
    if (q->tool_format == SRV_TOOLS_GENERIC) /* described by its own system message */
        return json_object_set_new(ctx, "tools", json_null()) ? -ENOMEM : 0;
    return json_object_set(ctx, "tools", q->tools ? q->tools : json_null()) ? -ENOMEM : 0;
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
    if (compile_tools(r, format, e) ||
        (srv_tool_format_generic(format) && add_generic_system(r, e)))
        goto out;
history: /* earlier calls and results reach the template whether or not tools are offered now */
    rc = format == SRV_TOOLS_GENERIC ? generic_history(r, e) : native_history(r, root, format, e);
out:
    json_decref(seen);
    return rc;
}
