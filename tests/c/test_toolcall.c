/* test_toolcall.c - kwker serve's tool calls (tools/kwker/serve/toolcall.c, included whole with
 * openai.c as the fuzz target does: the server lives in the CLI): the format read off a
 * template, requests with tools into a grammar, a lazy trigger and the template's messages, and
 * replies read back into content and calls in each format, malformed ones included. The whole
 * path through a model is tests/python/test_tools.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/toolcall.c"

static const char *call_name(const struct srv_tool_reply *r, size_t i)
{
    return json_string_value(
        json_object_get(json_object_get(json_array_get(r->calls, i), "function"), "name"));
}

static const char *call_args(const struct srv_tool_reply *r, size_t i)
{
    return json_string_value(
        json_object_get(json_object_get(json_array_get(r->calls, i), "function"), "arguments"));
}

/* Read text as format; returns the number of calls (-1: not a call reply) and checks that the
 * content is want_content (NULL: null). */
static int extract(int format, const char *text, const char *want_content, struct srv_tool_reply *r)
{
    struct srv_req q = {.tool_format = format};
    srv_tools_extract(&q, text, strlen(text), 7, r);
    if (want_content) {
        T_TRUE(!r->null_content);
        T_EQ(r->content_len, strlen(want_content));
        T_TRUE(r->content_len == strlen(want_content) &&
               !memcmp(r->content, want_content, r->content_len));
    } else {
        T_TRUE(r->null_content);
    }
    return r->calls ? (int)json_array_size(r->calls) : -1;
}

/* Texts that are not a whole call reply in format: all of each is content. */
static void expect_content_only(int format, const char *const *texts, size_t n)
{
    struct srv_tool_reply r;
    for (size_t i = 0; i < n; i++) {
        T_EQ(extract(format, texts[i], texts[i], &r), -1);
        srv_tool_reply_free(&r);
    }
}

static void test_detect(void)
{
    T_EQ(srv_tool_format_detect(NULL), SRV_TOOLS_GENERIC);
    T_EQ(srv_tool_format_detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
         SRV_TOOLS_GENERIC);
    T_EQ(srv_tool_format_detect("{{- '<tool_call>\\n' }}"), SRV_TOOLS_HERMES);
    T_EQ(srv_tool_format_detect("{{- '<|python_tag|>' }}"), SRV_TOOLS_LLAMA3);
    T_EQ(srv_tool_format_parse("hermes"), SRV_TOOLS_HERMES);
    T_EQ(srv_tool_format_parse("llama3"), SRV_TOOLS_LLAMA3);
    T_EQ(srv_tool_format_parse("generic"), SRV_TOOLS_GENERIC);
    T_EQ(srv_tool_format_parse("mistral"), -1);
    T_STREQ(srv_tool_format_name(SRV_TOOLS_HERMES), "hermes");
}

static void test_hermes(void)
{
    struct srv_tool_reply r;
    T_EQ(extract(SRV_TOOLS_HERMES,
                 "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", NULL,
                 &r),
         1);
    T_STREQ(call_name(&r, 0), "f");
    T_STREQ(call_args(&r, 0), "{\"a\":1}");
    const char *id = json_string_value(json_object_get(json_array_get(r.calls, 0), "id"));
    T_TRUE(id && strlen(id) == 29 && !strncmp(id, "call_", 5));
    srv_tool_reply_free(&r);
    /* content, then two calls (the last unclosed at eos); ids differ */
    T_EQ(extract(SRV_TOOLS_HERMES,
                 "Sure.\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n"
                 "<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"x\\\": 2}\"}",
                 "Sure.\n", &r),
         2);
    T_STREQ(call_name(&r, 1), "g");
    T_STREQ(call_args(&r, 1), "{\"x\": 2}"); /* a string written by the model, kept as is */
    T_TRUE(strcmp(json_string_value(json_object_get(json_array_get(r.calls, 0), "id")),
                  json_string_value(json_object_get(json_array_get(r.calls, 1), "id"))));
    srv_tool_reply_free(&r);
    /* not call replies: all content */
    static const char *const not_calls[] = {
        "plain text",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": </tool_call>", /* bad JSON */
        "<tool_call>{\"name\": \"f\"}</tool_call>",                         /* no arguments */
        "<tool_call>{\"arguments\": {}}</tool_call>",                       /* no name */
        "<tool_call>[1]</tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> and then text",
        "<tool_call>{\"name\": \"f\", \"arguments\": 3}</tool_call>",
        "<tool_call>",
        "",
    };
    expect_content_only(SRV_TOOLS_HERMES, not_calls, sizeof not_calls / sizeof *not_calls);
}

static void test_llama3(void)
{
    struct srv_tool_reply r;
    T_EQ(extract(SRV_TOOLS_LLAMA3, "{\"name\": \"f\", \"parameters\": {\"x\": \"y\"}}", NULL, &r),
         1);
    T_STREQ(call_args(&r, 0), "{\"x\":\"y\"}");
    srv_tool_reply_free(&r);
    T_EQ(
        extract(SRV_TOOLS_LLAMA3, "<|python_tag|>{ \"name\": \"f\", \"parameters\": {}}", NULL, &r),
        1);
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_LLAMA3,
                 "{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {}}",
                 NULL, &r),
         2);
    T_STREQ(call_name(&r, 1), "g");
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_LLAMA3, "Here: {\"name\": \"f\", \"parameters\": {}}", "Here: ", &r), 1);
    srv_tool_reply_free(&r);
    static const char *const not_calls[] = {
        "a {brace} in text",
        "{\"name\": \"f\"}",
        "{\"name\": \"f\", \"parameters\": {}} tail",
        "{\"name\": \"f\", \"parameters\": {",
        "{\"name\"",
    };
    expect_content_only(SRV_TOOLS_LLAMA3, not_calls, sizeof not_calls / sizeof *not_calls);
}

static void test_generic(void)
{
    struct srv_tool_reply r;
    T_EQ(extract(SRV_TOOLS_GENERIC,
                 "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"q\": [1, 2]}}]}", NULL, &r),
         1);
    T_STREQ(call_args(&r, 0), "{\"q\":[1,2]}");
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_GENERIC, "{\"response\": \"Hi \\u00e9\"}", "Hi \xc3\xa9", &r), -1);
    srv_tool_reply_free(&r);
    static const char *const not_calls[] = {
        "free text",
        "{\"tool_calls\": []}",
        "{\"tool_calls\": [{\"name\": \"f\"}]}",
        "{\"response\": 3}",
        "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}]} x",
    };
    expect_content_only(SRV_TOOLS_GENERIC, not_calls, sizeof not_calls / sizeof *not_calls);
}

static void test_sendable(void)
{
    T_EQ(srv_tools_sendable(SRV_TOOLS_HERMES, "abc", 3), 3);
    T_EQ(srv_tools_sendable(SRV_TOOLS_HERMES, "abc<tool", 8), 3);
    T_EQ(srv_tools_sendable(SRV_TOOLS_HERMES, "abc<", 4), 3);
    T_EQ(srv_tools_sendable(SRV_TOOLS_HERMES, "abc<tool_call>{", 15), 3);
    T_EQ(srv_tools_sendable(SRV_TOOLS_HERMES, "a<b<tool_c", 10), 3);
    T_EQ(srv_tools_sendable(SRV_TOOLS_LLAMA3, "ab{\"na", 6), 2);
    T_EQ(srv_tools_sendable(SRV_TOOLS_LLAMA3, "abc", 3), 3);
    T_EQ(srv_tools_sendable(SRV_TOOLS_GENERIC, "{\"response\"", 11), 0);
}

static void test_rename_root(void)
{
    struct srv_buf b = {0};
    T_EQ(rename_root("root ::= \"root\" [r-t] root-x root # root\nroot-x ::= \"\\\"root\" root\n",
                     "top", &b),
         0);
    T_STREQ(b.p, "top ::= \"root\" [r-t] root-x top # root\nroot-x ::= \"\\\"root\" top\n");
    srv_buf_free(&b);
}

static const char WEATHER[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
    "\"required\": [\"city\"], \"additionalProperties\": false}}}";

/* A chat request with the given tools (JSON array text) and extra fields, as format. */
static int parse_tools(struct srv_req *r, int format, const char *tools, const char *extra,
                       struct srv_err *e)
{
    char body[8192];
    snprintf(body, sizeof body,
             "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
             "\"tools\": %s%s}",
             tools, extra);
    struct srv_limits lim = {.n_vocab = 100, .max_cache_len = 100, .tool_format = format};
    return srv_req_parse(r, SRV_CHAT, body, strlen(body), &lim, e);
}

/* The same with the one tool WEATHER. */
static int parse(struct srv_req *r, int format, const char *extra, struct srv_err *e)
{
    char tools[sizeof WEATHER + 2];
    snprintf(tools, sizeof tools, "[%s]", WEATHER);
    return parse_tools(r, format, tools, extra, e);
}

static int matches(const kwk_grammar *g, const char *text)
{
    return kwk_grammar_match(g, text, strlen(text), NULL) == 1;
}

static void test_requests(void)
{
    struct srv_req r;
    struct srv_err e;
    /* hermes, auto: lazy from "<tool_call>"; the calls' arguments follow the schema */
    T_EQ(parse(&r, SRV_TOOLS_HERMES, "", &e), 0);
    T_TRUE(r.grammar && r.tools && r.grammar_trigger);
    T_STREQ(r.grammar_trigger, "<tool_call>");
    T_TRUE(matches(r.grammar, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                              "{\"city\": \"Paris\"}}\n</tool_call>"));
    T_TRUE(matches(r.grammar, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                              "\"A\"}}</tool_call>\n<tool_call>{\"name\":\"get_weather\","
                              "\"arguments\":{\"city\":\"B\"}}</tool_call>"));
    T_TRUE(!matches(r.grammar, "<tool_call>{\"name\": \"get_weather\", \"arguments\": "
                               "{\"town\": \"Paris\"}}</tool_call>"));
    T_TRUE(!matches(r.grammar, "<tool_call>{\"name\": \"other\", \"arguments\": {}}"
                               "</tool_call>"));
    T_EQ(json_array_size(r.messages), 1); /* Qwen's template describes the tools itself */
    srv_req_free(&r);
    /* required, one call: from the first byte */
    T_EQ(parse(&r, SRV_TOOLS_HERMES,
               ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false", &e),
         0);
    T_TRUE(r.grammar && !r.grammar_trigger && !r.parallel_tools);
    T_TRUE(!matches(r.grammar, "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":"
                               "\"A\"}}</tool_call>\n<tool_call>{\"name\":\"get_weather\","
                               "\"arguments\":{\"city\":\"B\"}}</tool_call>"));
    srv_req_free(&r);
    /* llama3 */
    T_EQ(parse(&r, SRV_TOOLS_LLAMA3,
               ", \"tool_choice\": {\"type\": \"function\", "
               "\"function\": {\"name\": \"get_weather\"}}",
               &e),
         0);
    T_TRUE(r.tool_choice == SRV_TOOL_NAMED && !strcmp(r.tool_name, "get_weather"));
    T_TRUE(matches(r.grammar, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"X\"}}"));
    srv_req_free(&r);
    /* generic: a system message describes the tools; the reply is JSON */
    T_EQ(parse(&r, SRV_TOOLS_GENERIC, "", &e), 0);
    T_EQ(json_array_size(r.messages), 2);
    json_t *sys = json_array_get(r.messages, 0);
    T_STREQ(json_string_value(json_object_get(sys, "role")), "system");
    T_CONTAINS(json_string_value(json_object_get(sys, "content")), "\"get_weather\"");
    T_TRUE(!r.grammar_trigger);
    T_TRUE(matches(r.grammar, "{\"response\": \"hello\"}"));
    T_TRUE(matches(r.grammar, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": "
                              "{\"city\": \"Paris\"}}]}"));
    T_TRUE(!matches(r.grammar, "hello"));
    srv_req_free(&r);
    /* none: nothing changes but the parse */
    T_EQ(parse(&r, SRV_TOOLS_GENERIC, ", \"tool_choice\": \"none\"", &e), 0);
    T_TRUE(!r.grammar && !r.tools && json_array_size(r.messages) == 1);
    srv_req_free(&r);
    /* refusals name the field */
    T_EQ(parse(&r, SRV_TOOLS_HERMES, ", \"response_format\": {\"type\": \"json_object\"}", &e), -1);
    T_STREQ(e.param, "tools");
    T_EQ(parse(&r, SRV_TOOLS_HERMES, ", \"tool_choice\": {\"type\": \"function\"}", &e), -1);
    T_STREQ(e.param, "tool_choice");
    T_EQ(parse(&r, SRV_TOOLS_HERMES, ", \"parallel_tool_calls\": 1", &e), -1);
    T_STREQ(e.param, "parallel_tool_calls");
}

static void test_history(void)
{
    /* an earlier call (arguments as JSON text) and its result */
    static const char body[] =
        "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
        "\"{\\\"a\\\": 1}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "
        "\"42\"}]}";
    struct srv_limits lim = {.n_vocab = 100, .max_cache_len = 100, .tool_format = SRV_TOOLS_HERMES};
    struct srv_req r;
    struct srv_err e;
    T_EQ(srv_req_parse(&r, SRV_CHAT, body, sizeof body - 1, &lim, &e), 0);
    json_t *fn = json_object_get(
        json_array_get(json_object_get(json_array_get(r.messages, 1), "tool_calls"), 0),
        "function");
    T_TRUE(json_is_object(json_object_get(fn, "arguments"))); /* parsed for tojson */
    T_EQ(json_integer_value(json_object_get(json_object_get(fn, "arguments"), "a")), 1);
    T_STREQ(json_string_value(json_object_get(json_array_get(r.messages, 2), "tool_call_id")),
            "c1");
    srv_req_free(&r);
    /* the generic format writes the call as the JSON it would have answered */
    lim.tool_format = SRV_TOOLS_GENERIC;
    T_EQ(srv_req_parse(&r, SRV_CHAT, body, sizeof body - 1, &lim, &e), 0);
    json_t *m1 = json_array_get(r.messages, 1);
    T_TRUE(!json_object_get(m1, "tool_calls"));
    T_STREQ(json_string_value(json_object_get(m1, "content")),
            "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"a\":1}}]}");
    srv_req_free(&r);
    /* tool results, for a template that knows no tools: user turns holding the result */
    json_t *m2 = NULL;
    T_EQ(srv_req_parse(&r, SRV_CHAT, body, sizeof body - 1, &lim, &e), 0);
    m2 = json_array_get(r.messages, 2);
    T_STREQ(json_string_value(json_object_get(m2, "role")), "user");
    T_STREQ(json_string_value(json_object_get(m2, "content")),
            "{\"tool_response\":{\"tool_call_id\":\"c1\",\"content\":\"42\"}}");
    T_TRUE(!json_object_get(m2, "tool_call_id"));
    srv_req_free(&r);
}

static void test_parameters(void)
{
    struct srv_req r;
    struct srv_err e;
    /* references are the parameters' own ("#" is their root), wherever the call's schema puts
     * them: one tool at the root, several under anyOf, the generic format under tool_calls */
    static const char defs[] =
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"city\": {\"$ref\": \"#/$defs/City\"}, \"next\": "
        "{\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"null\"}]}}, \"required\": [\"city\", "
        "\"next\"], \"additionalProperties\": false, \"$defs\": {\"City\": {\"type\": "
        "\"string\", \"enum\": [\"Paris\", \"Rome\"]}}}}}";
    static const char other[] = ", {\"type\": \"function\", \"function\": {\"name\": \"g\"}}]";
    char one[1024], two[1024];
    snprintf(one, sizeof one, "%s]", defs);
    snprintf(two, sizeof two, "%s%s", defs, other);
    static const char call[] = "{\"name\": \"f\", \"arguments\": {\"city\": \"Rome\", \"next\": "
                               "{\"city\": \"Paris\", \"next\": null}}}";
    char wrapped[512];
    snprintf(wrapped, sizeof wrapped, "<tool_call>%s</tool_call>", call);
    const char *const lists[] = {one, two};
    for (int k = 0; k < 2; k++) {
        T_EQ(parse_tools(&r, SRV_TOOLS_HERMES, lists[k], "", &e), 0);
        T_TRUE(r.grammar && matches(r.grammar, wrapped));
        srv_req_free(&r);
        char generic[600];
        snprintf(generic, sizeof generic, "{\"tool_calls\": [%s]}", call);
        T_EQ(parse_tools(&r, SRV_TOOLS_GENERIC, lists[k], "", &e), 0);
        T_TRUE(r.grammar && matches(r.grammar, generic));
        /* a call object is not a "next" city: "#" is the parameters' root, not the call's */
        snprintf(generic, sizeof generic,
                 "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": "
                 "{\"city\": \"Rome\", \"next\": %s}}]}",
                 call);
        T_TRUE(!matches(r.grammar, generic));
        srv_req_free(&r);
    }
    /* parameters without a type are an object's; another type is refused */
    T_EQ(parse_tools(&r, SRV_TOOLS_LLAMA3,
                     "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                     "{\"properties\": {\"a\": {\"type\": \"integer\"}}}}}]",
                     ", \"tool_choice\": \"required\"", &e),
         0);
    T_TRUE(matches(r.grammar, "{\"name\": \"f\", \"parameters\": {\"a\": 3}}"));
    T_TRUE(!matches(r.grammar, "{\"name\": \"f\", \"parameters\": 3}"));
    srv_req_free(&r);
    T_EQ(parse_tools(&r, SRV_TOOLS_LLAMA3,
                     "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": "
                     "{\"type\": \"string\"}}}]",
                     "", &e),
         -1);
    T_STREQ(e.param, "tools");
}

/* A reply that calls a function the request did not give is content. */
static void test_unknown_names(void)
{
    struct srv_tool_reply r;
    json_t *tools = json_loads(WEATHER, 0, NULL), *list = json_array();
    json_array_append_new(list, tools);
    struct srv_req q = {.tool_format = SRV_TOOLS_LLAMA3, .tools = list};
    static const char known[] = "{\"name\": \"get_weather\", \"parameters\": {}}";
    static const char unknown[] = "{ \"name\": \"rm_rf\", \"parameters\": {}}";
    srv_tools_extract(&q, known, sizeof known - 1, 1, &r);
    T_TRUE(r.calls && json_array_size(r.calls) == 1);
    srv_tool_reply_free(&r);
    srv_tools_extract(&q, unknown, sizeof unknown - 1, 1, &r);
    T_TRUE(!r.calls && r.content_len == sizeof unknown - 1 && !r.null_content);
    srv_tool_reply_free(&r);
    static const char generic[] =
        "{\"tool_calls\": [{\"name\": \"rm_rf\", \"arguments\": {}}], \"response\": \"x\"}";
    q.tool_format = SRV_TOOLS_GENERIC;
    srv_tools_extract(&q, generic, sizeof generic - 1, 1, &r);
    T_TRUE(!r.calls && r.content == generic && r.content_len == sizeof generic - 1);
    srv_tool_reply_free(&r);
    json_decref(list);
}

int main(void)
{
    test_detect();
    test_hermes();
    test_llama3();
    test_generic();
    test_sendable();
    test_rename_root();
    test_requests();
    test_history();
    test_parameters();
    test_unknown_names();
    return t_report("test_toolcall");
}
