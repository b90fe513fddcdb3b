/* test_think.c - a thinking model's reply split into reasoning_content and content
 * (tools/kwker/serve/think.c, included whole with the files it calls, as the fuzz target does):
 * whole replies (forced open, unclosed, none, nested and stray tags), the same replies
 * streamed at every byte cut (the deltas add up to the whole reply's fields, no tag leaks),
 * with Hermes and R1 calls after the block, the prompts that open it, the templates that think,
 * and the JSON of both. The whole path through a model is tests/python/test_reasoning.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/think.c"
#include "../../tools/kwker/serve/toolcall.c"
#include "../../tools/kwker/serve/toolcall_reply.c"

/* A reply as the server reads it: text, the request's think mode, and the fields it must give
 * (reasoning NULL: no reasoning_content). */
static const struct {
    const char *text;
    int think;
    const char *reasoning, *content;
} CASES[] = {
    {"<think>a b</think>\n\nAnswer.", SRV_THINK_ON, "a b", "Answer."},
    {"  <think>\n x \n</think>  y ", SRV_THINK_ON, "x", "y "},
    {"no think", SRV_THINK_ON, NULL, "no think"},
    {"  hi\n", SRV_THINK_ON, NULL, "  hi\n"},
    {"<think>cut by max_tokens", SRV_THINK_ON, "cut by max_tokens", ""},
    {"reason</think>answer", SRV_THINK_OPEN, "reason", "answer"},
    {"\nreasoning only, cut </thi", SRV_THINK_OPEN, "reasoning only, cut </thi", ""},
    {"<think>again</think>x", SRV_THINK_OPEN, "again", "x"},
    {"<think>a</think>b", SRV_THINK_OFF, NULL, "<think>a</think>b"},
    {"<think>a<think>b</think>c</think>d", SRV_THINK_ON, "a<think>b", "c</think>d"},
    {"</think>x", SRV_THINK_ON, NULL, "</think>x"},
    {"x<think>y</think>z", SRV_THINK_ON, NULL, "x<think>y</think>z"},
    {"<think></think>x", SRV_THINK_ON, NULL, "x"},
    {"<think>\n\n</think>\n\n", SRV_THINK_ON, NULL, ""},
    {"<thinking>x</thinking>", SRV_THINK_ON, NULL, "<thinking>x</thinking>"},
    {"<th", SRV_THINK_OPEN, "<th", ""},
    {"<th", SRV_THINK_ON, NULL, "<th"},
    {"", SRV_THINK_OPEN, NULL, ""},
    {"", SRV_THINK_ON, NULL, ""},
    {" \n ", SRV_THINK_OPEN, NULL, ""},
    {"a </thinker> b</think>c", SRV_THINK_OPEN, "a </thinker> b", "c"},
    {"\xc3\xa9t\xc3\xa9</think>\xe2\x82\xac", SRV_THINK_OPEN, "\xc3\xa9t\xc3\xa9", "\xe2\x82\xac"},
};

#define N_CASES (sizeof CASES / sizeof *CASES)

static int field_is(const char *p, size_t n, const char *want)
{
    if (!want)
        return !p;
    return p && n == strlen(want) && !memcmp(p, want, n);
}

static void test_whole(void)
{
    for (size_t i = 0; i < N_CASES; i++) {
        struct srv_req q = {.kind = SRV_CHAT, .think = CASES[i].think};
        struct srv_tool_reply r = {0};
        srv_think_reply(&q, CASES[i].text, strlen(CASES[i].text), &r);
        T_CHECK(field_is(r.reasoning, r.reasoning_len, CASES[i].reasoning),
                "case %zu reasoning: \"%.*s\"", i, (int)r.reasoning_len,
                r.reasoning ? r.reasoning : "(none)");
        T_CHECK(field_is(r.content, r.content_len, CASES[i].content), "case %zu content: \"%.*s\"",
                i, (int)r.content_len, r.content);
    }
}

/* What a stream sent, field by field. */
struct sent {
    char reasoning[256], content[256];
    size_t n_reasoning, n_content;
};

static void add(char *buf, size_t *n, const char *p, size_t k)
{
    T_TRUE(*n + k < 256);
    if (k && *n + k < 256) {
        memcpy(buf + *n, p, k);
        *n += k;
    }
}

static void take(struct sent *s, const struct srv_delta *d)
{
    add(s->reasoning, &s->n_reasoning, d->reasoning, d->reasoning_len);
    add(s->content, &s->n_content, d->content, d->content_len);
}

/* text arriving at each of the offsets cuts[n] (the last its length), then read whole as the
 * server does at DONE: the deltas must add up to the whole reply's fields. */
static void check_stream(const struct srv_req *q, const char *text, const size_t *cuts, size_t n,
                         const char *what)
{
    size_t len = strlen(text);
    struct srv_reply_stream st = {0};
    struct srv_delta d;
    struct sent s = {0};
    for (size_t i = 0; i < n; i++) {
        srv_reply_stream_next(&st, q, text, cuts[i], NULL, &d);
        T_CHECK(d.reasoning_len + d.content_len <= cuts[i], "%s: more sent than arrived", what);
        take(&s, &d);
    }
    struct srv_tool_reply whole;
    if (q->tools)
        srv_tools_extract(q, text, len, 1, &whole);
    else {
        memset(&whole, 0, sizeof whole);
        srv_think_reply(q, text, len, &whole);
    }
    srv_reply_stream_next(&st, q, text, len, &whole, &d);
    take(&s, &d);
    size_t want_r = whole.reasoning ? whole.reasoning_len : 0;
    T_CHECK(s.n_reasoning == want_r && (!want_r || !memcmp(s.reasoning, whole.reasoning, want_r)),
            "%s: streamed reasoning \"%.*s\" of \"%s\"", what, (int)s.n_reasoning, s.reasoning,
            text);
    size_t want_c = whole.null_content ? 0 : whole.content_len;
    T_CHECK(s.n_content == want_c && !memcmp(s.content, whole.content, want_c),
            "%s: streamed content \"%.*s\" of \"%s\"", what, (int)s.n_content, s.content, text);
    srv_tool_reply_free(&whole);
}

/* Every byte cut: a byte at a time, and every split into two arrivals. */
static void check_cuts(const struct srv_req *q, const char *text)
{
    size_t len = strlen(text), cuts[512];
    if (len + 1 > sizeof cuts / sizeof *cuts)
        return;
    for (size_t k = 0; k <= len; k++)
        cuts[k] = k;
    check_stream(q, text, cuts, len + 1, "bytewise");
    for (size_t k = 0; k <= len; k++) {
        size_t two[2] = {k, len};
        check_stream(q, text, two, 2, "two parts");
    }
}

static void test_streamed(void)
{
    for (size_t i = 0; i < N_CASES; i++) {
        struct srv_req q = {.kind = SRV_CHAT, .think = CASES[i].think};
        check_cuts(&q, CASES[i].text);
    }
}

/* Replies made of the pieces a split turns on (tags whole and cut, whitespace, a call's
 * opening), in every mode, with and without tools: streamed at every cut, they add up. */
static void test_random(void)
{
    static const char *const pieces[] = {"<think>", "</think>", "<th",         "</thi",
                                         "<",       ">",        " ",           "\n",
                                         "a",       "bc",       "<tool_call>", "{\"name\": \"f\"}"};
    json_t *tools =
        json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 0, NULL);
    for (int i = 0; i < 400; i++) {
        char text[128] = "";
        for (int k = (int)(t_rnd() % 9); k > 0; k--)
            strcat(text, pieces[t_rnd() % (sizeof pieces / sizeof *pieces)]);
        struct srv_req q = {.kind = SRV_CHAT, .think = (int)(t_rnd() % 3)};
        if (i % 2) {
            q.tools = tools;
            q.tool_format = SRV_TOOLS_HERMES;
            q.tool_choice = SRV_TOOL_AUTO;
        }
        check_cuts(&q, text);
    }
    json_decref(tools);
}

/* Nothing of a tag goes out while it may still be arriving: a reply opened by the prompt whose
 * text so far ends with "</thi" has sent only the reasoning before it. */
static void test_held_back(void)
{
    struct srv_req q = {.kind = SRV_CHAT, .think = SRV_THINK_OPEN};
    struct srv_reply_stream st = {0};
    struct srv_delta d;
    static const char text[] = "plan it </thi";
    srv_reply_stream_next(&st, &q, text, sizeof text - 1, NULL, &d);
    T_TRUE(d.reasoning_len == 7 && !memcmp(d.reasoning, "plan it", 7));
    T_EQ(d.content_len, 0);
    /* a reply opening its own block: nothing while "<thi" could be "<think>" */
    q.think = SRV_THINK_ON;
    memset(&st, 0, sizeof st);
    srv_reply_stream_next(&st, &q, "\n<thi", 5, NULL, &d);
    T_EQ(d.reasoning_len + d.content_len, 0);
    /* and the whitespace before a text that opens none is content, sent once decided */
    srv_reply_stream_next(&st, &q, "\n<thing", 7, NULL, &d);
    T_TRUE(d.content_len == 7 && !memcmp(d.content, "\n<thing", 7));
}

static const char WEATHER[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]";

#define R1_CALL(name, json)                                                                        \
    R1_CALL_BEGIN "function" R1_SEP name "\n```json\n" json "\n```" R1_CALL_END

/* Calls after the block: Qwen3's Hermes calls and R1's, streamed at every cut; a call drafted
 * inside the block is reasoning, never a call. */
static void test_with_tools(void)
{
    json_t *tools = json_loads(WEATHER, 0, NULL);
    static const struct {
        int format, think;
        const char *text;
        int n_calls;
    } cases[] = {
        {SRV_TOOLS_HERMES, SRV_THINK_ON,
         "<think>Weather?</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
         "{\"city\": \"Paris\"}}\n</tool_call>",
         1},
        {SRV_TOOLS_HERMES, SRV_THINK_ON,
         "<think>maybe <tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>"
         "</think>No call.",
         0},
        {SRV_TOOLS_HERMES, SRV_THINK_ON, "<think>hm</think>Sunny, I guess.", 0},
        {SRV_TOOLS_HERMES, SRV_THINK_OFF,
         "<think>x</think><tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>",
         1},
        {SRV_TOOLS_DEEPSEEK_R1, SRV_THINK_OPEN,
         "Paris?\n</think>\n\n" R1_CALLS_BEGIN R1_CALL("get_weather", "{\"city\": \"Paris\"}")
             R1_CALLS_END,
         1},
        {SRV_TOOLS_DEEPSEEK_R1, SRV_THINK_OPEN, "long thought, cut", 0},
        {SRV_TOOLS_GENERIC, SRV_THINK_ON, "<think>a</think>{\"response\": \"hi\"}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct srv_req q = {.kind = SRV_CHAT,
                            .tool_format = cases[i].format,
                            .think = cases[i].think,
                            .tools = tools,
                            .tool_choice = SRV_TOOL_AUTO};
        struct srv_tool_reply r;
        srv_tools_extract(&q, cases[i].text, strlen(cases[i].text), 1, &r);
        T_CHECK((r.calls ? (int)json_array_size(r.calls) : 0) == cases[i].n_calls,
                "tools case %zu: calls", i);
        T_CHECK(cases[i].think == SRV_THINK_OFF || r.reasoning, "tools case %zu: reasoning", i);
        srv_tool_reply_free(&r);
        check_cuts(&q, cases[i].text);
    }
    json_decref(tools);
}

static void test_prompts(void)
{
    static const struct {
        const char *prompt;
        int open;
    } cases[] = {
        {"<\xef\xbd\x9c"
         "Assistant\xef\xbd\x9c><think>\n",
         1},                                                   /* R1 */
        {"<|im_start|>assistant\n<think>\n", 1},               /* QwQ */
        {"<|im_start|>assistant\n<think>\n\n</think>\n\n", 0}, /* Qwen3 enable_thinking=false */
        {"<|im_start|>assistant\n", 0},                        /* Qwen3, the model opens it */
        {"<|im_start|>user\n<think><|im_end|>\n<|im_start|>assistant\n", 0},
        {"<think>", 1},
        {"think>", 0},
        {"", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        T_CHECK(srv_think_prompt_open(cases[i].prompt, strlen(cases[i].prompt)) == cases[i].open,
                "prompt %zu", i);
}

static void test_templates(void)
{
    static const struct {
        const char *file;
        int thinks;
    } cases[] = {
        {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", 1},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", 1},
        {"Qwen-Qwen2.5-7B-Instruct.jinja", 0},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", 0},
        {"../../tokenizers/smollm/SmolLM2-135M-Instruct/chat_template.jinja", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "chat-templates/llamacpp/%s", cases[i].file);
        char *src = t_read_shared(rel);
        if (!src)
            continue;
        T_CHECK(srv_think_template(src) == cases[i].thinks, "%s", cases[i].file);
        free(src);
    }
    T_EQ(srv_think_template(NULL), 0);
    T_EQ(srv_think_template("{{ '<think>\\n' }}"), 1);
}

/* The message and the chunks: reasoning_content beside content, none without a block. */
static void test_json(void)
{
    static const char text[] = "<think>Why?</think>\n\nBecause.";
    struct srv_req q = {.kind = SRV_CHAT, .think = SRV_THINK_ON};
    struct srv_tool_reply tr = {0};
    srv_think_reply(&q, text, sizeof text - 1, &tr);
    struct srv_ctx c = {.kind = SRV_CHAT, .id = "chatcmpl-1", .model = "m", .tools = &tr};
    struct srv_buf b = {0};
    struct srv_choice one = {text, sizeof text - 1, NULL, 0, KWK_FINISH_STOP, &tr};
    srv_json_response(&b, &c, &one, 1, 1, 2);
    json_t *j = b.p ? json_loadb(b.p, b.len, 0, NULL) : NULL;
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    T_STREQ(json_string_value(json_object_get(msg, "reasoning_content")), "Why?");
    T_STREQ(json_string_value(json_object_get(msg, "content")), "Because.");
    T_STREQ(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(j);
    b.len = 0;
    srv_sse_reasoning(&b, &c, "Why", 3, NULL, 0);
    T_CONTAINS(b.p, "\"delta\":{\"reasoning_content\":\"Why\"},\"logprobs\":null");
    /* without a block: no reasoning_content at all */
    static const char plain[] = "Because.";
    srv_think_reply(&q, plain, sizeof plain - 1, &tr);
    b.len = 0;
    one = (struct srv_choice){plain, sizeof plain - 1, NULL, 0, KWK_FINISH_STOP, &tr};
    srv_json_response(&b, &c, &one, 1, 1, 2);
    T_TRUE(b.p && !strstr(b.p, "reasoning_content"));
    srv_buf_free(&b);
}

int main(void)
{
    test_whole();
    test_streamed();
    test_random();
    test_held_back();
    test_with_tools();
    test_prompts();
    test_templates();
    test_json();
    return t_report("test_think");
}
