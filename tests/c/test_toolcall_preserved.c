/* test_toolcall_preserved.c - kwker serve's preserved tokens (toolcall.c, included whole as
 * test_toolcall.c does): which of a format's markers a vocabulary holds as one special token
 * (srv_tool_preserved, as llama.cpp's preserved_tokens: one token each, else ordinary text),
 * and a reply whose markers came as those tokens, streamed through the detokenizer that keeps
 * them, read back into calls with no marker ever sent as content. The model's run is
 * tests/python/test_tools_preserved.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/think.c"
#include "../../tools/kwker/serve/toolcall.c"
#include "../../tools/kwker/serve/toolcall_reply.c"

/* An added token of the tokenizer below. */
#define ADDED(id, text, special)                                                                   \
    "{\"id\": " #id ", \"content\": \"" text "\", \"special\": " special ", \"lstrip\": false,"    \
    " \"rstrip\": false, \"normalized\": false, \"single_word\": false}"

/* Byte-level, one token a printable ASCII character (ids 0..94: '!' .. '~'), then space and
 * newline, the markers of several formats added after: all special but </tool_call>, an
 * ordinary added token. */
enum { M_CALLS = 100, M_TOOL, M_TOOL_END, M_PY, M_THINK, M_THINK_END, M_R1_CALLS, M_EOS };

static char *tok_json(void)
{
    /* clang-format off */
    static const char head[] =
        "{\"version\": \"1.0\", \"added_tokens\": ["
        ADDED(100, "[TOOL_CALLS]", "true") "," ADDED(101, "<tool_call>", "true") ","
        ADDED(102, "</tool_call>", "false") "," ADDED(103, "<|python_tag|>", "true") ","
        ADDED(104, "<think>", "true") "," ADDED(105, "</think>", "true") ","
        ADDED(106, "<\\uff5ctool\\u2581calls\\u2581begin\\uff5c>", "true") ","
        ADDED(107, "</s>", "true") ","
        ADDED(108, "<\\uff5ctool\\u2581call\\u2581begin\\uff5c>", "true") ","
        ADDED(109, "<\\uff5ctool\\u2581sep\\uff5c>", "true") ","
        ADDED(110, "<\\uff5ctool\\u2581call\\u2581end\\uff5c>", "true") ","
        ADDED(111, "<\\uff5ctool\\u2581calls\\u2581end\\uff5c>", "true") "],"
        " \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\","
        " \"add_prefix_space\": false, \"use_regex\": false}, \"post_processor\": null,"
        " \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {"
        "\"\\u0120\": 95, \"\\u010a\": 96";
    /* clang-format on */
    struct srv_buf b = {0};
    srv_buf_str(&b, head);
    for (int c = '!'; c <= '~'; c++) {
        char one[32];
        if (c == '"' || c == '\\')
            snprintf(one, sizeof one, ", \"\\%c\": %d", c, c - '!');
        else
            snprintf(one, sizeof one, ", \"%c\": %d", c, c - '!');
        srv_buf_str(&b, one);
    }
    srv_buf_str(&b, "}, \"merges\": []}}");
    srv_buf_add(&b, "", 1);
    return b.err ? NULL : b.p;
}

static kwk_tokenizer *tiny(void)
{
    struct kwk_err err = {0};
    char *j = tok_json();
    kwk_tokenizer *t = j ? kwk_tokenizer_load_json(j, strlen(j), &err) : NULL;
    if (!t)
        fprintf(stderr, "tiny: %s\n", err.msg);
    free(j);
    return t;
}

static const char *str_or_empty(const json_t *v)
{
    return json_is_string(v) ? json_string_value(v) : "";
}

static int has(const int32_t *ids, int n, int32_t id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

static void test_preserved_ids(void)
{
    kwk_tokenizer *t = tiny();
    int32_t ids[SRV_MAX_PRESERVED];
    T_TRUE(t != NULL);
    if (!t)
        return;
    T_EQ(srv_tool_preserved(SRV_TOOLS_MISTRAL, t, ids, SRV_MAX_PRESERVED), 1);
    T_EQ(ids[0], M_CALLS);
    /* </tool_call> is one token but not special: its text is kept anyway */
    int n = srv_tool_preserved(SRV_TOOLS_HERMES, t, ids, SRV_MAX_PRESERVED);
    T_EQ(n, 3);
    T_TRUE(has(ids, n, M_TOOL) && has(ids, n, M_THINK) && has(ids, n, M_THINK_END));
    T_TRUE(!has(ids, n, M_TOOL_END));
    /* Llama 3's tag only with built-in tools in llama.cpp, which this server has not */
    T_EQ(srv_tool_preserved(SRV_TOOLS_LLAMA3, t, ids, SRV_MAX_PRESERVED), 0);
    /* "<function=" is several tokens here */
    T_EQ(srv_tool_preserved(SRV_TOOLS_FUNCTIONARY, t, ids, SRV_MAX_PRESERVED), 1);
    T_EQ(ids[0], M_PY);
    n = srv_tool_preserved(SRV_TOOLS_DEEPSEEK_R1, t, ids, SRV_MAX_PRESERVED);
    T_EQ(n, 7);
    T_TRUE(has(ids, n, M_R1_CALLS) && has(ids, n, M_THINK) && has(ids, n, M_THINK_END));
    T_EQ(srv_tool_preserved(SRV_TOOLS_FIREFUNCTION, t, ids, SRV_MAX_PRESERVED), 0);
    T_EQ(srv_tool_preserved(SRV_TOOLS_GENERIC, t, ids, SRV_MAX_PRESERVED), 0);
    T_EQ(srv_tool_preserved(SRV_TOOLS_COMMAND_R, t, ids, SRV_MAX_PRESERVED), 0);
    T_EQ(srv_tool_preserved(SRV_TOOLS_N, t, ids, SRV_MAX_PRESERVED), 0);
    T_EQ(srv_tool_preserved(SRV_TOOLS_HERMES, t, ids, 1), 1);
    T_EQ(srv_tool_preserved(SRV_TOOLS_HERMES, NULL, ids, SRV_MAX_PRESERVED), 0);
    kwk_tokenizer_free(t);
}

/* The ids of text, with each marker at its place as the one special token. */
static int ids_of(kwk_tokenizer *t, const char *text, int32_t *ids, int cap)
{
    size_t n = 0;
    T_EQ(kwk_tokenizer_encode(t, text, strlen(text), 0, ids, (size_t)cap, &n), 0);
    return (int)n;
}

/* The reply the model wrote as ids, streamed as the server streams it: every detokenizer piece
 * appended, the sendable content checked never to reach the marker, then read back. */
static void streamed(kwk_tokenizer *t, int format, const char *reply, const char *content,
                     int32_t marker, const char *name, const char *args)
{
    int32_t pres[SRV_MAX_PRESERVED], ids[256];
    int n_pres = srv_tool_preserved(format, t, pres, SRV_MAX_PRESERVED);
    int n = ids_of(t, reply, ids, 256);
    T_TRUE(has(ids, n, marker)); /* the marker is its one special token in the reply */
    kwk_detok *d = kwk_detok_new(t, 1);
    T_EQ(kwk_detok_preserve(d, pres, n_pres), 0);
    struct srv_buf all = {0};
    size_t sent = 0;
    for (int i = 0; i <= n; i++) {
        const char *piece;
        size_t len;
        T_EQ(i < n ? kwk_detok_push(d, ids[i], &piece, &len) : kwk_detok_flush(d, &piece, &len), 0);
        srv_buf_add(&all, piece, len);
        size_t upto = srv_tools_sendable(format, all.p ? all.p : "", all.len);
        sent = upto > sent ? upto : sent;
        T_TRUE(sent <= strlen(content)); /* no byte of a marker streams as content */
    }
    T_EQ(all.len, strlen(reply));
    T_TRUE(all.len == strlen(reply) && !memcmp(all.p, reply, all.len));
    struct srv_req q = {.tool_format = format};
    struct srv_tool_reply r;
    srv_tools_extract(&q, all.p, all.len, 7, &r);
    T_TRUE(r.calls && json_array_size(r.calls) == 1);
    json_t *fn = json_object_get(json_array_get(r.calls, 0), "function");
    T_STREQ(str_or_empty(json_object_get(fn, "name")), name);
    T_STREQ(str_or_empty(json_object_get(fn, "arguments")), args);
    T_EQ(r.content_len, strlen(content));
    srv_tool_reply_free(&r);
    srv_buf_free(&all);
    kwk_detok_free(d);
    /* without preserving, the marker is lost and the reply is no call (Llama 3's object is one
     * without its tag) */
    char *text = NULL;
    size_t len = 0;
    T_EQ(kwk_tokenizer_decode_alloc(t, ids, (size_t)n, 1, &text, &len), 0);
    srv_tools_extract(&q, text, len, 7, &r);
    T_EQ(r.calls == NULL, format != SRV_TOOLS_LLAMA3);
    srv_tool_reply_free(&r);
    kwk_tokenizer_mem_free(text);
}

/* Llama 3 preserves nothing: a call written after its special <|python_tag|> is read the same
 * from the text without it, and code after the tag that is no call is content without it. */
static void llama3_tag_dropped(kwk_tokenizer *t)
{
    static const char *const replies[] = {
        "Hi <|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 2}}",
        "<|python_tag|>brave_search.call(query=\"x\")"};
    for (int k = 0; k < 2; k++) {
        int32_t ids[256];
        int n = ids_of(t, replies[k], ids, 256);
        T_TRUE(has(ids, n, M_PY));
        char *text = NULL;
        size_t len = 0;
        T_EQ(kwk_tokenizer_decode_alloc(t, ids, (size_t)n, 1, &text, &len), 0);
        struct srv_req q = {.tool_format = SRV_TOOLS_LLAMA3};
        struct srv_tool_reply r;
        srv_tools_extract(&q, text, len, 7, &r);
        if (k == 0) {
            T_TRUE(r.calls && json_array_size(r.calls) == 1);
            json_t *fn = json_object_get(json_array_get(r.calls, 0), "function");
            T_STREQ(str_or_empty(json_object_get(fn, "name")), "f");
            T_STREQ(str_or_empty(json_object_get(fn, "arguments")), "{\"a\":2}");
            T_EQ(r.content_len, 3);
        } else {
            T_TRUE(r.calls == NULL);
            T_TRUE(r.content_len == len && !strstr(text, "python_tag"));
        }
        srv_tool_reply_free(&r);
        kwk_tokenizer_mem_free(text);
    }
}

static void test_streamed_replies(void)
{
    kwk_tokenizer *t = tiny();
    if (!t)
        return;
    streamed(t, SRV_TOOLS_MISTRAL,
             "Hi [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}]",
             "Hi ", M_CALLS, "f", "{\"a\":1}");
    streamed(t, SRV_TOOLS_HERMES,
             "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "Hi ", M_TOOL,
             "f", "{}");
    llama3_tag_dropped(t);
    streamed(t, SRV_TOOLS_FUNCTIONARY, "Hi <|python_tag|>print(1)", "Hi ", M_PY, "python",
             "{\"code\":\"print(1)\"}");
    kwk_tokenizer_free(t);
}

/* R1: the think block's markers and the calls' opener as special tokens. */
static void test_r1(void)
{
    kwk_tokenizer *t = tiny();
    if (!t)
        return;
    static const char reply[] =
        "<think>hmm</think>\n\n" R1_CALLS_BEGIN R1_CALL_BEGIN "function" R1_SEP
        "f\n```json\n{\"a\": 3}\n```" R1_CALL_END R1_CALLS_END;
    int32_t pres[SRV_MAX_PRESERVED], ids[256];
    int n_pres = srv_tool_preserved(SRV_TOOLS_DEEPSEEK_R1, t, pres, SRV_MAX_PRESERVED);
    int n = ids_of(t, reply, ids, 256);
    T_TRUE(has(ids, n, M_THINK) && has(ids, n, M_R1_CALLS));
    char text[512];
    size_t len = 0;
    kwk_detok *d = kwk_detok_new(t, 1);
    T_EQ(kwk_detok_preserve(d, pres, n_pres), 0);
    for (int i = 0; i <= n; i++) {
        const char *piece;
        size_t k;
        T_EQ(i < n ? kwk_detok_push(d, ids[i], &piece, &k) : kwk_detok_flush(d, &piece, &k), 0);
        if (len + k < sizeof text)
            memcpy(text + len, piece, k), len += k;
    }
    T_EQ(len, strlen(reply));
    struct srv_req q = {.tool_format = SRV_TOOLS_DEEPSEEK_R1, .think = SRV_THINK_OPEN};
    struct srv_tool_reply r;
    srv_tools_extract(&q, text, len, 7, &r);
    T_TRUE(r.calls && json_array_size(r.calls) == 1);
    T_EQ(r.reasoning_len, 3);
    T_TRUE(r.reasoning && !memcmp(r.reasoning, "hmm", 3));
    T_TRUE(r.null_content);
    srv_tool_reply_free(&r);
    kwk_detok_free(d);
    kwk_tokenizer_free(t);
}

/* A reply without tools split at its think block: the tags are special tokens, dropped by the
 * detokenizer unless srv_think_preserved's ids are kept, and then read as reasoning. */
static void test_think_preserved(void)
{
    kwk_tokenizer *t = tiny();
    if (!t)
        return;
    int32_t pres[2], ids[64];
    T_EQ(srv_think_preserved(t, pres, 2), 2);
    T_TRUE(has(pres, 2, M_THINK) && has(pres, 2, M_THINK_END));
    T_EQ(srv_think_preserved(NULL, pres, 2), 0);
    static const char reply[] = "<think>hmm</think>\n\nParis.";
    int n = ids_of(t, reply, ids, 64);
    T_TRUE(has(ids, n, M_THINK) && has(ids, n, M_THINK_END));
    for (int keep = 0; keep < 2; keep++) {
        char text[128];
        size_t len = 0;
        kwk_detok *d = kwk_detok_new(t, 1);
        T_EQ(kwk_detok_preserve(d, pres, keep ? 2 : 0), 0);
        for (int i = 0; i <= n; i++) {
            const char *piece;
            size_t k;
            int rc = i < n ? kwk_detok_push(d, ids[i], &piece, &k) : kwk_detok_flush(d, &piece, &k);
            T_EQ(rc, 0);
            if (len + k < sizeof text)
                memcpy(text + len, piece, k), len += k;
        }
        struct srv_req q = {.kind = SRV_CHAT, .think = SRV_THINK_ON};
        struct srv_tool_reply r = {0};
        srv_think_reply(&q, text, len, &r);
        if (keep) { /* kept: reasoning and content apart */
            T_TRUE(r.reasoning_len == 3 && r.reasoning && !memcmp(r.reasoning, "hmm", 3));
            T_TRUE(r.content_len == 6 && !memcmp(r.content, "Paris.", 6));
        } else { /* dropped: the reasoning's words run into the content */
            T_TRUE(!r.reasoning);
            T_TRUE(r.content_len == len && !memcmp(r.content, "hmm\n\nParis.", len));
        }
        kwk_detok_free(d);
    }
    kwk_tokenizer_free(t);
}

/* Llama 3's content stops at the python tag, or a tail that could begin it. */
static void test_llama3_sendable(void)
{
    T_EQ(srv_tools_sendable(SRV_TOOLS_LLAMA3, "ab<|python_tag|>{", 17), 2);
    T_EQ(srv_tools_sendable(SRV_TOOLS_LLAMA3, "ab<|pyt", 7), 2);
    T_EQ(srv_tools_sendable(SRV_TOOLS_LLAMA3, "a<b", 3), 3);
    T_EQ(srv_tools_sendable(SRV_TOOLS_LLAMA3, "ab{<|python_tag|>", 17), 2);
}

/* Functionary's <|python_tag|> is kept for a request only when it offers a python / ipython
 * tool (its code is a call of that tool alone); the format's other markers always. */
static void test_functionary_python(void)
{
    kwk_tokenizer *t = tiny();
    if (!t)
        return;
    int32_t all[SRV_MAX_PRESERVED], out[SRV_MAX_PRESERVED];
    int n = srv_tool_preserved(SRV_TOOLS_FUNCTIONARY, t, all, SRV_MAX_PRESERVED);
    T_TRUE(n >= 1 && has(all, n, M_PY));
    static const char *const lists[] = {
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]",
        "[{\"type\": \"function\", \"function\": {\"name\": \"python\"}}]",
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, "
        "{\"type\": \"function\", \"function\": {\"name\": \"ipython\"}}]"};
    for (int k = 0; k < 3; k++) {
        json_t *tools = json_loads(lists[k], 0, NULL);
        T_TRUE(tools != NULL);
        struct srv_req q = {.tool_format = SRV_TOOLS_FUNCTIONARY, .tools = tools};
        int m = srv_tool_preserved_req(&q, t, all, n, out);
        T_EQ(m, k == 0 ? n - 1 : n);
        T_EQ(has(out, m, M_PY), k != 0);
        /* another format's list passes through whole */
        q.tool_format = SRV_TOOLS_MISTRAL;
        T_EQ(srv_tool_preserved_req(&q, t, all, n, out), n);
        json_decref(tools);
    }
    kwk_tokenizer_free(t);
}

int main(void)
{
    test_preserved_ids();
    test_functionary_python();
    test_streamed_replies();
    test_r1();
    test_think_preserved();
    test_llama3_sendable();
    return t_report("test_toolcall_preserved");
}
