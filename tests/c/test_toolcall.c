/* test_toolcall.c - kwker serve's tool calls (tools/kwker/serve/toolcall.c, included whole with
 * openai.c as the fuzz target does: the server lives in the CLI): the format read off a
 * template, requests with tools into a grammar, a lazy trigger and the template's messages, and
 * replies read back into content and calls in each format, malformed ones included. The whole
 * path through a model is tests/python/test_tools.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/think.c"
#include "../../tools/kwker/serve/toolcall.c"
#include "../../tools/kwker/serve/toolcall_reply.c"

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

/* Read text as format, its think block per think; returns the number of calls (-1: not a call
 * reply) and checks that the content is want_content (NULL: null). */
static int extract_think(int format, int think, const char *text, const char *want_content,
                         struct srv_tool_reply *r)
{
    struct srv_req q = {.tool_format = format, .think = think};
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

/* The same with R1's think block read as the server reads it (its format always thinks) when
 * the reply opens it itself. */
static int extract(int format, const char *text, const char *want_content, struct srv_tool_reply *r)
{
    int think = format == SRV_TOOLS_DEEPSEEK_R1 ? SRV_THINK_ON : SRV_THINK_OFF;
    return extract_think(format, think, text, want_content, r);
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
    T_EQ(srv_tool_format_parse("deepseek_r1"), SRV_TOOLS_DEEPSEEK_R1);
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
    /* Firefunction: spaces alone, or before "[", are held (a required call's list may follow,
     * and the reply's content is then null), then sent with the text after them */
    T_EQ(srv_tools_sendable(SRV_TOOLS_FIREFUNCTION, "\n ", 2), 0);
    T_EQ(srv_tools_sendable(SRV_TOOLS_FIREFUNCTION, "\n [", 3), 0);
    T_EQ(srv_tools_sendable(SRV_TOOLS_FIREFUNCTION, "\n Hi", 4), 4);
    /* every format holds whitespace alone before a call the same way (a call after it gives
     * null content; sent, the stream's " " would not add up to the whole reply) */
    static const struct {
        int format;
        const char *text;
        size_t want;
    } blank[] = {
        {SRV_TOOLS_LLAMA3, " {\"name\"", 0},     {SRV_TOOLS_LLAMA3, " \n", 0},
        {SRV_TOOLS_LLAMA3, " a{", 2},             {SRV_TOOLS_FUNCTIONARY, " <function=", 0},
        {SRV_TOOLS_FUNCTIONARY, " x <func", 3},   {SRV_TOOLS_HERMES, "\n<tool_call>", 0},
        {SRV_TOOLS_MISTRAL, "  [TOOL_CA", 0},      {SRV_TOOLS_DEEPSEEK_R1, " " R1_CALLS_BEGIN, 0},
        {SRV_TOOLS_HERMES, "\n\nHi <tool", 5},
    };
    for (size_t i = 0; i < sizeof blank / sizeof *blank; i++)
        T_CHECK(srv_tools_sendable(blank[i].format, blank[i].text, strlen(blank[i].text)) ==
                    blank[i].want,
                "blank case %zu", i);
}

static void test_rename_root(void)
{
    struct srv_buf b = {0};
    T_EQ(rewrite_names("root ::= \"root\" [r-t] root-x root # root\nroot-x ::= \"\\\"root\" root\n",
                       "top", "", &b),
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

/* ---- the formats of llama.cpp's real templates --------------------------------------------- */

static void test_detect_templates(void)
{
    static const struct {
        const char *file;
        int format;
    } cases[] = {
        {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", SRV_TOOLS_COMMAND_R},
        {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", SRV_TOOLS_HERMES},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", SRV_TOOLS_HERMES},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", SRV_TOOLS_HERMES},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", SRV_TOOLS_DEEPSEEK_R1},
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", SRV_TOOLS_DEEPSEEK_R1},
        {"fireworks-ai-llama-3-firefunction-v2.jinja", SRV_TOOLS_FIREFUNCTION},
        {"meetkai-functionary-medium-v3.1.jinja", SRV_TOOLS_FUNCTIONARY},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", SRV_TOOLS_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", SRV_TOOLS_LLAMA3},
        {"meta-llama-Llama-3.3-70B-Instruct.jinja", SRV_TOOLS_LLAMA3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", SRV_TOOLS_MISTRAL},
        {"../../tokenizers/smollm/SmolLM2-135M-Instruct/chat_template.jinja", SRV_TOOLS_GENERIC},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "chat-templates/llamacpp/%s", cases[i].file);
        char *src = t_read_shared(rel);
        if (!src)
            continue;
        T_CHECK(srv_tool_format_detect(src) == cases[i].format, "%s: %s, want %s", cases[i].file,
                srv_tool_format_name(srv_tool_format_detect(src)),
                srv_tool_format_name(cases[i].format));
        free(src);
    }
    for (int f = 0; f < SRV_TOOLS_N; f++)
        T_EQ(srv_tool_format_parse(srv_tool_format_name(f)), f);
}

static const char *call_id_of(const struct srv_tool_reply *r, size_t i)
{
    return json_string_value(json_object_get(json_array_get(r->calls, i), "id"));
}

static void test_mistral(void)
{
    struct srv_tool_reply r;
    T_EQ(
        extract(SRV_TOOLS_MISTRAL,
                "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abc123XYZ\"}, "
                "{\"name\": \"g\", \"arguments\": {}, \"id\": \"zzzzzzzz9\"}]",
                NULL, &r),
        2);
    T_STREQ(call_name(&r, 0), "f");
    T_STREQ(call_args(&r, 0), "{\"a\":1}");
    T_STREQ(call_id_of(&r, 0), "abc123XYZ"); /* the model's ids are the calls' */
    T_STREQ(call_id_of(&r, 1), "zzzzzzzz9");
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_MISTRAL,
                 "Let me look.[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}, \"id\": "
                 "\"a0a0a0a0a\"}]\n",
                 "Let me look.", &r),
         1);
    srv_tool_reply_free(&r);
    static const char *const not_calls[] = {
        "[TOOL_CALLS]",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"a0a0a0a0a\"}",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]",            /* no id */
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": 7}]", /* not a string */
        /* ids other than 9 letters or digits (its template refuses them in the history) */
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abc\"}]",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"a0a0\\na0a0\"}]",
        /* arguments given as a string must be an object's JSON text (clients parse it) */
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": \"not json\", \"id\": \"a0a0a0a0a\"}]",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": \"[1]\", \"id\": \"a0a0a0a0a\"}]",
        "[TOOL_CALLS][]",
        "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"a0a0a0a0a\"}] more",
        "[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {}, \"id\": \"a0a0a0a0a\"}",
        "plain [TOOL text",
    };
    expect_content_only(SRV_TOOLS_MISTRAL, not_calls, sizeof not_calls / sizeof *not_calls);
}

static void test_functionary(void)
{
    struct srv_tool_reply r;
    T_EQ(extract(SRV_TOOLS_FUNCTIONARY,
                 "<function=f>{\"a\": [1, 2]}</function><function=g>{}</function>", NULL, &r),
         2);
    T_STREQ(call_name(&r, 1), "g");
    T_STREQ(call_args(&r, 0), "{\"a\":[1,2]}");
    T_TRUE(!strncmp(call_id_of(&r, 0), "call_", 5));
    srv_tool_reply_free(&r);
    /* content before; the python tag's code to the end is python's {"code"} */
    T_EQ(extract(SRV_TOOLS_FUNCTIONARY,
                 "Running it.\n<function=f>{}</function>\n<|python_tag|>print(\"hi\")\n",
                 "Running it.\n", &r),
         2);
    T_STREQ(call_name(&r, 1), "python");
    T_STREQ(call_args(&r, 1), "{\"code\":\"print(\\\"hi\\\")\\n\"}");
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_FUNCTIONARY, "<function=f>{\"a\": 1}", NULL, &r), 1); /* eos */
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_FUNCTIONARY, "<function=f>{\n\t\"a\": 1\n}\n</function>\n", NULL, &r),
         1);
    srv_tool_reply_free(&r);
    static const char *const not_calls[] = {
        "<function=f>{\"a\": </function>",
        "<function=>{}</function>",
        "<function=f{}</function>",
        "<function=f>[1]</function>",
        "<function=f>{}</function> and text",
        "<function=",
        "a <function",
    };
    expect_content_only(SRV_TOOLS_FUNCTIONARY, not_calls, sizeof not_calls / sizeof *not_calls);
}

#define R1_CALL(name, json)                                                                        \
    R1_CALL_BEGIN "function" R1_SEP name "\n```json\n" json "\n```" R1_CALL_END

static void test_deepseek_r1(void)
{
    struct srv_tool_reply r;
    /* the prompt opened the think block: reasoning up to </think> (stripped, as llama.cpp's),
     * then a call */
    T_EQ(extract_think(SRV_TOOLS_DEEPSEEK_R1, SRV_THINK_OPEN,
                       "I should call f.\n</think>\n\n" R1_CALLS_BEGIN R1_CALL(
                           "f", "{\"a\": 1}") "\n" R1_CALL("g", "{}") R1_CALLS_END,
                       NULL, &r),
         2);
    T_STREQ(call_args(&r, 0), "{\"a\":1}");
    T_STREQ(call_name(&r, 1), "g");
    T_EQ(r.reasoning_len, strlen("I should call f."));
    T_TRUE(r.reasoning && !memcmp(r.reasoning, "I should call f.", r.reasoning_len));
    srv_tool_reply_free(&r);
    /* an opening <think> of the model's own; content after it; no calls */
    T_EQ(extract(SRV_TOOLS_DEEPSEEK_R1, "<think>hmm</think>Paris.", "Paris.", &r), -1);
    T_TRUE(r.reasoning_len == 3 && !memcmp(r.reasoning, "hmm", 3));
    srv_tool_reply_free(&r);
    /* a call written inside the think block is reasoning, never a call */
    T_EQ(extract(SRV_TOOLS_DEEPSEEK_R1,
                 "<think>maybe " R1_CALLS_BEGIN R1_CALL("f", "{}") R1_CALLS_END, "", &r),
         -1);
    T_TRUE(r.reasoning && r.reasoning_len > 0);
    srv_tool_reply_free(&r);
    /* content, then calls whose end an end of text stands for */
    T_EQ(extract_think(SRV_TOOLS_DEEPSEEK_R1, SRV_THINK_OPEN,
                       "ok</think>Sure. " R1_CALLS_BEGIN R1_CALL("f", "{}"), "Sure. ", &r),
         1);
    srv_tool_reply_free(&r);
    /* --reasoning-format none: no split, calls read from the whole text */
    T_EQ(extract_think(SRV_TOOLS_DEEPSEEK_R1, SRV_THINK_OFF,
                       "ok</think>Sure. " R1_CALLS_BEGIN R1_CALL("f", "{}"), "ok</think>Sure. ",
                       &r),
         1);
    T_TRUE(!r.reasoning);
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_DEEPSEEK_R1, "no thinking", "no thinking", &r), -1);
    T_TRUE(!r.reasoning);
    srv_tool_reply_free(&r);
    static const char *const not_calls[] = {
        R1_CALLS_BEGIN R1_CALL("f", "{\"a\": }"),
        R1_CALLS_BEGIN R1_CALL_BEGIN "function" R1_SEP "f\n```json\n{}",
        R1_CALLS_BEGIN R1_CALL("f", "[]") R1_CALLS_END,
        R1_CALLS_BEGIN R1_CALLS_END,
        R1_CALLS_BEGIN R1_CALL("f", "{}") R1_CALLS_END "tail",
        R1_CALLS_BEGIN,
    };
    expect_content_only(SRV_TOOLS_DEEPSEEK_R1, not_calls, sizeof not_calls / sizeof *not_calls);
}

static void test_firefunction(void)
{
    struct srv_tool_reply r;
    T_EQ(extract(SRV_TOOLS_FIREFUNCTION,
                 "Checking. functools[{\"name\": \"f\", \"arguments\": {\"a\": 1}}, "
                 "{\"name\": \"g\", \"arguments\": {}}]",
                 "Checking.", &r),
         2);
    T_STREQ(call_args(&r, 0), "{\"a\":1}");
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_FIREFUNCTION, " [{\"name\": \"f\", \"arguments\": {}}]", NULL, &r), 1);
    srv_tool_reply_free(&r);
    static const char *const not_calls[] = {
        " functools[{\"name\": \"f\", \"arguments\": {}}",
        " functools[]",
        " functools[{\"name\": \"f\"}]",
        " functools[{\"name\": \"f\", \"arguments\": {}}] then",
        "[1, 2]",
        " functools",
    };
    expect_content_only(SRV_TOOLS_FIREFUNCTION, not_calls, sizeof not_calls / sizeof *not_calls);
}

static void test_command_r(void)
{
    struct srv_tool_reply r; /* llama.cpp reads Command R+ in the generic format */
    T_EQ(extract(SRV_TOOLS_COMMAND_R,
                 "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]}", NULL, &r),
         1);
    srv_tool_reply_free(&r);
    T_EQ(extract(SRV_TOOLS_COMMAND_R, "{\"response\": \"hi\"}", "hi", &r), -1);
    srv_tool_reply_free(&r);
}

/* A reply streamed a byte at a time as http.c's stream_tools sends it (the sendable prefix as
 * it grows, then at the end the rest of the content, or all of a content that is not the
 * text's prefix) adds up to the whole reply's content, whatever the cut. */
static void check_streamed(int format, const char *text)
{
    struct srv_req q = {.tool_format = format};
    struct srv_tool_reply whole;
    size_t len = strlen(text), sent = 0;
    srv_tools_extract(&q, text, len, 3, &whole);
    for (size_t k = 0; k <= len; k++) {
        size_t up = srv_tools_sendable(format, text, k);
        T_TRUE(up <= k);
        sent = up > sent ? up : sent;
    }
    if (whole.content != text) {
        T_CHECK(sent == 0, "%s: %zu bytes sent of a content that is not the text's prefix",
                srv_tool_format_name(format), sent);
    } else {
        T_CHECK(sent <= whole.content_len, "%s: %zu bytes sent, content %zu: %s",
                srv_tool_format_name(format), sent, whole.content_len, text);
    }
    srv_tool_reply_free(&whole);
}

static void test_streamed_formats(void)
{
    static const struct {
        int format;
        const char *text;
    } cases[] = {
        {SRV_TOOLS_MISTRAL, "Hi [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": "
                            "\"a0a0a0a0a\"}]"},
        {SRV_TOOLS_MISTRAL, "text with [TOOL and [ and ]"},
        {SRV_TOOLS_FUNCTIONARY, "a<b <function=f>{}</function><|python_tag|>x=1"},
        {SRV_TOOLS_FUNCTIONARY, "<|python_ta"},
        {SRV_TOOLS_DEEPSEEK_R1, "t</think>c" R1_CALLS_BEGIN R1_CALL("f", "{}") R1_CALLS_END},
        {SRV_TOOLS_DEEPSEEK_R1, "plain"},
        {SRV_TOOLS_FIREFUNCTION, "x functools[{\"name\": \"f\", \"arguments\": {}}]"},
        {SRV_TOOLS_FIREFUNCTION, "[{\"name\": \"f\", \"arguments\": {}}]"},
        {SRV_TOOLS_FIREFUNCTION, "a functools"},
        {SRV_TOOLS_COMMAND_R, "{\"response\": \"x\"}"},
        {SRV_TOOLS_HERMES, "a <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"},
        {SRV_TOOLS_LLAMA3, "a {\"name\": \"f\", \"parameters\": {}}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_streamed(cases[i].format, cases[i].text);
}

static const char TIME_TOOL[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"integer\"}}, "
    "\"required\": [\"zone\"], \"additionalProperties\": false}}}";

/* A request with WEATHER and TIME_TOOL in format, extra fields added. */
static int parse_two(struct srv_req *r, int format, const char *extra, struct srv_err *e)
{
    char tools[sizeof WEATHER + sizeof TIME_TOOL + 4];
    snprintf(tools, sizeof tools, "[%s, %s]", WEATHER, TIME_TOOL);
    return parse_tools(r, format, tools, extra, e);
}

/* Each format's grammar: valid calls in, a wrong name or argument type out; the trigger
 * under "auto"; one call when parallel calls are off; only the named tool when named. */
static void test_format_grammars(void)
{
    static const struct {
        int format;
        const char *trigger, *one, *two, *bad_name, *bad_type;
    } cases[] = {
        {SRV_TOOLS_MISTRAL, "[TOOL_CALLS]",
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
         "\"id\": \"abcDEF123\"}]",
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
         "\"id\": \"abcDEF123\"}, {\"name\": \"get_time\", \"arguments\": {\"zone\": 2}, "
         "\"id\": \"000000000\"}]",
         "[TOOL_CALLS][{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Paris\"}, "
         "\"id\": \"abcDEF123\"}]",
         "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": \"2\"}, "
         "\"id\": \"abcDEF123\"}]"},
        {SRV_TOOLS_FUNCTIONARY,
         "<function=", "<function=get_weather>{\"city\": \"Paris\"}</function>",
         "<function=get_weather>{\"city\": \"Paris\"}</function>"
         "<function=get_time>{\"zone\": 2}</function>",
         "<function=get_wether>{\"city\": \"Paris\"}</function>",
         "<function=get_time>{\"zone\": \"2\"}</function>"},
        {SRV_TOOLS_DEEPSEEK_R1, R1_CALLS_BEGIN,
         R1_CALLS_BEGIN R1_CALL("get_weather", "{\"city\": \"Paris\"}") R1_CALLS_END,
         R1_CALLS_BEGIN R1_CALL("get_weather", "{\"city\": \"Paris\"}") "\n" R1_CALL(
             "get_time", "{\"zone\": 2}") R1_CALLS_END,
         R1_CALLS_BEGIN R1_CALL("get_wether", "{\"city\": \"Paris\"}") R1_CALLS_END,
         R1_CALLS_BEGIN R1_CALL("get_time", "{\"zone\": \"2\"}") R1_CALLS_END},
        {SRV_TOOLS_FIREFUNCTION, " functools[",
         " functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
         " functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
         "{\"name\": \"get_time\", \"arguments\": {\"zone\": 2}}]",
         " functools[{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Paris\"}}]",
         " functools[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"2\"}}]"},
    };
    struct srv_req r;
    struct srv_err e;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int f = cases[i].format;
        T_EQ(parse_two(&r, f, "", &e), 0);
        T_CHECK(r.grammar && r.grammar_trigger && !strcmp(r.grammar_trigger, cases[i].trigger),
                "%s: trigger %s", srv_tool_format_name(f),
                r.grammar_trigger ? r.grammar_trigger : "(none)");
        T_CHECK(matches(r.grammar, cases[i].one), "%s: %s", srv_tool_format_name(f), cases[i].one);
        T_CHECK(matches(r.grammar, cases[i].two), "%s: %s", srv_tool_format_name(f), cases[i].two);
        T_CHECK(!matches(r.grammar, cases[i].bad_name), "%s: %s", srv_tool_format_name(f),
                cases[i].bad_name);
        T_CHECK(!matches(r.grammar, cases[i].bad_type), "%s: %s", srv_tool_format_name(f),
                cases[i].bad_type);
        /* what the grammar lets through is read back as the same calls */
        struct srv_tool_reply rep;
        srv_tools_extract(&r, cases[i].two, strlen(cases[i].two), 1, &rep);
        T_CHECK(rep.calls && json_array_size(rep.calls) == 2 && rep.null_content, "%s: %s",
                srv_tool_format_name(f), cases[i].two);
        srv_tool_reply_free(&rep);
        srv_req_free(&r);
        T_EQ(
            parse_two(&r, f, ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false", &e),
            0);
        T_TRUE(r.grammar && !r.grammar_trigger);
        T_TRUE(matches(r.grammar, cases[i].one) && !matches(r.grammar, cases[i].two));
        srv_req_free(&r);
        T_EQ(parse_two(&r, f,
                       ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": "
                       "\"get_time\"}}",
                       &e),
             0);
        T_TRUE(!matches(r.grammar, cases[i].one));
        srv_req_free(&r);
    }
    /* Mistral: a call without its id is refused by the grammar, as the reply's reader
     * refuses it (review: it once let through what then came back as content) */
    T_EQ(parse_two(&r, SRV_TOOLS_MISTRAL, "", &e), 0);
    T_TRUE(!matches(r.grammar, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": "
                               "{\"city\": \"Paris\"}}]"));
    srv_req_free(&r);
    /* Functionary: a tool named python may also be free code after the python tag */
    T_EQ(parse_tools(&r, SRV_TOOLS_FUNCTIONARY,
                     "[{\"type\": \"function\", \"function\": {\"name\": \"python\", "
                     "\"parameters\": {\"type\": \"object\", \"properties\": {\"code\": "
                     "{\"type\": \"string\"}}, \"required\": [\"code\"]}}}]",
                     ", \"tool_choice\": \"required\"", &e),
         0);
    T_TRUE(matches(r.grammar, "<|python_tag|>print(1)\nprint(2)"));
    T_TRUE(matches(r.grammar, "<function=python>{\"code\": \"1\"}</function>"));
    srv_req_free(&r);
    /* Command R+: the generic reply, a system message, and the tools for the template too */
    T_EQ(parse_two(&r, SRV_TOOLS_COMMAND_R, "", &e), 0);
    T_TRUE(!r.grammar_trigger && json_array_size(r.messages) == 2);
    T_TRUE(matches(r.grammar, "{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": "
                              "{\"zone\": 1}}]}"));
    json_t *ctx = json_object();
    T_EQ(srv_tools_context(&r, r.tool_format, ctx), 0);
    T_TRUE(json_array_size(json_object_get(ctx, "tools")) == 2);
    json_decref(ctx);
    srv_req_free(&r);
}

/* Earlier calls as each template wants them: the arguments as the request's text where the
 * template joins them to strings, the content null where the request's was. */
static void test_native_history(void)
{
    static const char body[] =
        "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
        "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", "
        "\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
        "\"{\\\"a\\\":  1}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "
        "\"42\"}]}";
    static const int formats[] = {SRV_TOOLS_FUNCTIONARY, SRV_TOOLS_DEEPSEEK_R1,
                                  SRV_TOOLS_FIREFUNCTION, SRV_TOOLS_MISTRAL};
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        struct srv_limits lim = {.n_vocab = 100, .max_cache_len = 100, .tool_format = formats[i]};
        struct srv_req r;
        struct srv_err e;
        T_EQ(srv_req_parse(&r, SRV_CHAT, body, sizeof body - 1, &lim, &e), 0);
        json_t *m1 = json_array_get(r.messages, 1);
        json_t *args = json_object_get(
            json_object_get(json_array_get(json_object_get(m1, "tool_calls"), 0), "function"),
            "arguments");
        T_TRUE(json_is_null(json_object_get(m1, "content")));
        if (formats[i] == SRV_TOOLS_MISTRAL)
            T_TRUE(json_is_object(args)); /* written with tojson */
        else
            T_STREQ(json_string_value(args), "{\"a\":  1}");
        srv_req_free(&r);
    }
}

/* Firefunction v2's template reads "functions" (indented JSON: Python's json.dumps(tools,
 * indent=2), as llama.cpp's dump(2) writes it) and "datetime" instead of "tools". */
static void test_firefunction_context(void)
{
    static const char want[] =
        "[\n  {\n    \"type\": \"function\",\n    \"function\": {\n      \"name\": "
        "\"get_weather\",\n      \"parameters\": {\n        \"type\": \"object\",\n        "
        "\"properties\": {\n          \"city\": {\n            \"type\": \"string\"\n          "
        "}\n        },\n        \"required\": [\n          \"city\"\n        ],\n        "
        "\"additionalProperties\": false\n      }\n    }\n  }\n]";
    struct srv_req r;
    struct srv_err e;
    T_EQ(parse(&r, SRV_TOOLS_FIREFUNCTION, "", &e), 0);
    json_t *ctx = json_pack("{s:O}", "tools", r.tools);
    T_EQ(srv_tools_context(&r, r.tool_format, ctx), 0);
    T_STREQ(json_string_value(json_object_get(ctx, "functions")), want);
    T_TRUE(json_is_null(json_object_get(ctx, "tools")));
    const char *dt = json_string_value(json_object_get(ctx, "datetime"));
    T_TRUE(dt && strlen(dt) == strlen("Dec 07 2026 15:04:05 GMT") && !strcmp(dt + 20, " GMT"));
    json_decref(ctx);
    srv_req_free(&r);
    /* without tools (or under tool_choice "none") the request reads as the generic format, and
     * the server's Firefunction template still gets "functions" ("") and "datetime", as
     * llama.cpp gives them: without them it refuses every plain chat */
    static const char plain[] =
        "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    struct srv_limits lim = {.n_vocab = 100, .max_cache_len = 100,
                             .tool_format = SRV_TOOLS_FIREFUNCTION};
    T_EQ(srv_req_parse(&r, SRV_CHAT, plain, sizeof plain - 1, &lim, &e), 0);
    T_EQ(r.tool_format, SRV_TOOLS_GENERIC);
    ctx = json_object();
    T_EQ(srv_tools_context(&r, SRV_TOOLS_FIREFUNCTION, ctx), 0);
    T_STREQ(json_string_value(json_object_get(ctx, "functions")), "");
    T_TRUE(json_is_string(json_object_get(ctx, "datetime")));
    json_decref(ctx);
    srv_req_free(&r);
}

/* An R1 reply's reasoning as "reasoning_content": in the message, and streamed as its own
 * deltas (not held to the finish chunk); the content and calls without it. */
static void test_reasoning_reply(void)
{
    static const char text[] =
        "Paris is sunny?</think>\n\n" R1_CALLS_BEGIN R1_CALL("get_weather", "{\"city\": \"Paris\"}")
            R1_CALLS_END;
    struct srv_req q = {.tool_format = SRV_TOOLS_DEEPSEEK_R1,
                        .tool_choice = SRV_TOOL_AUTO,
                        .think = SRV_THINK_OPEN};
    struct srv_tool_reply tr;
    srv_tools_extract(&q, text, sizeof text - 1, 5, &tr);
    struct srv_ctx c = {.kind = SRV_CHAT, .id = "chatcmpl-1", .model = "m", .tools = &tr};
    struct srv_buf b = {0};
    struct srv_choice one = {text, sizeof text - 1, NULL, 0, KWK_FINISH_STOP, &tr};
    srv_json_response(&b, &c, &one, 1, 1, 2);
    json_t *j = b.p ? json_loadb(b.p, b.len, 0, NULL) : NULL;
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    T_STREQ(json_string_value(json_object_get(msg, "reasoning_content")), "Paris is sunny?");
    T_TRUE(json_is_null(json_object_get(msg, "content")));
    T_EQ(json_array_size(json_object_get(msg, "tool_calls")), 1);
    json_decref(j);
    /* the first bytes stream as reasoning before the reply is whole */
    struct srv_reply_stream st = {0};
    struct srv_delta d;
    srv_reply_stream_next(&st, &q, text, 8, NULL, &d);
    T_EQ(d.reasoning_len, 8);
    T_EQ(d.content_len, 0);
    b.len = 0;
    srv_sse_reasoning(&b, &c, d.reasoning, d.reasoning_len, NULL, 0);
    T_CONTAINS(b.p, "\"delta\":{\"reasoning_content\":\"Paris is\"}");
    b.len = 0;
    srv_sse_finish(&b, &c, KWK_FINISH_STOP);
    T_TRUE(!strstr(b.p, "reasoning_content"));
    T_CONTAINS(b.p, "\"finish_reason\":\"tool_calls\"");
    srv_buf_free(&b);
    srv_tool_reply_free(&tr);
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
    test_detect_templates();
    test_mistral();
    test_functionary();
    test_deepseek_r1();
    test_firefunction();
    test_command_r();
    test_streamed_formats();
    test_format_grammars();
    test_native_history();
    test_firefunction_context();
    test_reasoning_reply();
    return t_report("test_toolcall");
}
