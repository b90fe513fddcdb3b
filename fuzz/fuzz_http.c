/* fuzz_http.c - libFuzzer target for `kwker serve`'s request parsing (tools/kwker/serve/openai.c,
 * toolcall.c, think.c and toolcall_reply.c, included whole: the server lives in the CLI, not the
 * library).
 * Input: one byte choosing the route (bit 0 clear: /v1/chat/completions, or /tokenize with bit
 * 1; set: /v1/completions, or /detokenize with bit 1) and the model's tool-call format (bits
 * 2-4), then the request body. A body that parses is then written back as a response, SSE
 * chunks and an
 * error (or the tokenize routes' answers), with logprobs made from its bytes, so the builders
 * see every string the parser lets through; its text is also read as a reply with tool calls
 * in every format (the model's output is untrusted too) and split at a think block
 * (think.c), whole and streamed in steps, whose deltas must add up to the whole reply's
 * reasoning and content, and cut as continue_final_message cuts a render. Every body is also parsed as a
 * /v1/embeddings request (embed.c): its inputs packed by a tokenizer stand-in (a byte a token
 * between [CLS] and [SEP]) and its reply written as floats, some non-finite, and as base64;
 * the reply must be JSON. And as a /v1/rerank request (rerank.c): its pairs packed by a pair
 * tokenizer stand-in (longest_first over bytes) at a length limit from the first byte, scored
 * from logits made of its bytes (NaN and infinities among them) by both activations, and its
 * reply, which must be JSON with top_n results in order. And as vLLM's /score (score.c): its
 * pairs packed as the rerank ones and its distinct texts as the embeddings inputs, at a
 * truncate_prompt_tokens and model limit from the first byte, each text's index checked, the
 * cosines and both replies written from floats of its bytes; as /classify: its inputs packed
 * and its reply written for 1 to 4 labels by each activation, with label names from the same
 * body read as a config.json (srv_labels_parse). Every reply must be JSON. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/kwker/serve/openai.c"
#include "../tools/kwker/serve/toolcall.c"
#include "../tools/kwker/serve/think.c"
#include "../tools/kwker/serve/toolcall_reply.c"
#include "../tools/kwker/serve/embed.c"
#include "../tools/kwker/serve/rerank.c"
#include "../tools/kwker/serve/score.c"
#include "../tests/c/fake_tokenizer.h"

#define FUZZ_MAX_INPUT (256 * 1024)

/* The reply streamed as http.c streams it, arriving in steps of `step` bytes, then read whole:
 * the deltas must add up to the whole reply's reasoning and content (think.c), or abort. */
static void stream_check(const struct srv_req *q, const char *text, size_t len, size_t step)
{
    struct srv_reply_stream st = {0};
    struct srv_delta d;
    struct srv_buf r = {0}, c = {0};
    for (size_t k = 0; k < len; k += step) {
        srv_reply_stream_next(&st, q, text, k, NULL, &d);
        srv_buf_add(&r, d.reasoning, d.reasoning_len);
        srv_buf_add(&c, d.content, d.content_len);
    }
    struct srv_tool_reply whole;
    if (q->tools)
        srv_tools_extract(q, text, len, 42, &whole);
    else {
        memset(&whole, 0, sizeof whole);
        srv_think_reply(q, text, len, &whole);
    }
    srv_reply_stream_next(&st, q, text, len, &whole, &d);
    srv_buf_add(&r, d.reasoning, d.reasoning_len);
    srv_buf_add(&c, d.content, d.content_len);
    size_t want_r = whole.reasoning ? whole.reasoning_len : 0;
    size_t want_c = whole.null_content ? 0 : whole.content_len;
    if (!r.err && !c.err &&
        (r.len != want_r || (want_r && memcmp(r.p, whole.reasoning, want_r)) || c.len != want_c ||
         (want_c && memcmp(c.p, whole.content, want_c))))
        abort();
    srv_tool_reply_free(&whole);
    srv_buf_free(&r);
    srv_buf_free(&c);
}

static void build_all(struct srv_req *r, const uint8_t *data, size_t size)
{
    struct srv_lp lps[4];
    memset(lps, 0, sizeof lps);
    for (int i = 0; i < 4; i++) {
        lps[i].token = (int32_t)(i < (int)size ? data[i] : i) * 131;
        lps[i].logprob = -(float)i;
        lps[i].n_top = r->top_logprobs;
        for (int k = 0; k < r->top_logprobs; k++) {
            lps[i].top_ids[k] = k;
            lps[i].top_lps[k] = -(float)k;
        }
    }
    if (r->echo) { /* an echoed prompt's first token: no logprob, no alternatives (null) */
        lps[0].logprob = NAN;
        lps[0].n_top = 0;
    }
    struct srv_ctx c = {.kind = r->kind, .id = "fuzz-1", .created = 1, .model = r->model,
                        .logprobs = r->logprobs, .top_logprobs = r->top_logprobs,
                        .include_usage = r->include_usage};
    struct srv_buf b = {0};
    /* the request's own text (content of the first message or the prompt) as the reply */
    const char *text = r->prompt;
    size_t len = r->prompt_len;
    json_t *m0 = json_array_get(r->messages, 0);
    if (m0) {
        text = json_string_value(json_object_get(m0, "content"));
        len = json_string_length(json_object_get(m0, "content"));
    }
    /* continue_final_message's cut of the text as a render, the final message its second
     * half: a prefix of the text, or refused */
    if (text && srv_continue_cut(text, len, text + len / 2, len - len / 2) > (long)len)
        abort();
    if (r->kind == SRV_TOKENIZE || r->kind == SRV_DETOKENIZE) {
        srv_tokens_response(&b, r->prompt_ids, (size_t)r->n_prompt_ids, 2048, NULL);
        srv_text_response(&b, text, len);
        srv_buf_free(&b);
        return;
    }
    /* two choices, the second cut by length, as n = 2 answers */
    struct srv_choice two[2] = {{text, len, lps, 4, KWK_FINISH_STOP, NULL},
                                {text, len / 2, lps, 2, KWK_FINISH_LENGTH, NULL}};
    srv_json_response(&b, &c, two, 2, 3, 4);
    for (int f = 0; f < SRV_TOOLS_N && r->kind == SRV_CHAT; f++) {
        struct srv_tool_reply tr;
        struct srv_req q = *r; /* the same request read in format f (shallow: not freed) */
        q.tool_format = f;
        json_t *ctx = json_object(); /* the template's context as the format wants it */
        if (ctx && srv_tools_context(&q, q.tool_format, ctx) == 0 && json_object_get(ctx, "tools") &&
            !json_is_null(json_object_get(ctx, "tools")) && !json_is_array(q.tools))
            abort();
        json_decref(ctx);
        q.think = (int)(len % 3); /* off, a block the reply opens, or the prompt's */
        srv_tools_extract(&q, text ? text : "", text ? len : 0, 42, &tr);
        if (srv_tools_sendable(f, text ? text : "", text ? len : 0) > (text ? len : 0))
            abort();
        stream_check(&q, text ? text : "", text ? len : 0, 1 + len / 256);
        c.tools = &tr;
        struct srv_choice one = {text, len, lps, 4, KWK_FINISH_STOP, &tr};
        srv_json_response(&b, &c, &one, 1, 3, 4);
        if (tr.calls)
            srv_sse_tool_calls(&b, &c, tr.calls);
        srv_sse_finish(&b, &c, KWK_FINISH_STOP);
        c.tools = NULL;
        srv_tool_reply_free(&tr);
    }
    for (int think = SRV_THINK_ON; think <= SRV_THINK_OPEN && r->kind == SRV_CHAT; think++) {
        struct srv_tool_reply tr = {0}; /* a reply without tools, split at its think block */
        struct srv_req q = *r;
        q.tools = NULL;
        q.think = think;
        srv_think_reply(&q, text ? text : "", text ? len : 0, &tr);
        c.tools = &tr;
        struct srv_choice one = {text, len, lps, 4, KWK_FINISH_STOP, &tr};
        srv_json_response(&b, &c, &one, 1, 3, 4);
        if (tr.reasoning)
            srv_sse_reasoning(&b, &c, tr.reasoning, tr.reasoning_len, lps, 4);
        c.tools = NULL;
        stream_check(&q, text ? text : "", text ? len : 0, 1 + len / 512);
    }
    srv_sse_role(&b, &c);
    srv_sse_content(&b, &c, text, len, lps, 4);
    srv_sse_finish(&b, &c, KWK_FINISH_LENGTH);
    srv_sse_usage(&b, &c, 3, 4);
    srv_sse_done(&b);
    srv_buf_free(&b);
}

static void embed_all(const uint8_t *data, size_t size)
{
    struct srv_embed_limits lim = {.n_vocab = 30522, .dim = 1 + data[0] % 7,
                                   .max_tokens = 8 << (data[0] >> 5)};
    struct srv_embed_req r;
    struct srv_err e;
    struct srv_buf b = {0};
    if (srv_embed_parse(&r, (const char *)data + 1, size - 1, &lim, &e) ||
        srv_embed_pack(&r, fake_encode, NULL, &lim, &e)) {
        free(srv_json_error(&e));
        srv_embed_req_free(&r);
        return;
    }
    size_t n = (size_t)r.n_in * (size_t)lim.dim;
    float *vec = malloc(sizeof(float) * n);
    for (size_t i = 0; vec && i < n; i++) {
        uint32_t u = (uint32_t)data[i % size] * 0x01010101u; /* 0xffffffff: a NaN */
        memcpy(&vec[i], &u, 4);
    }
    for (int base64 = 0; vec && base64 < 2; base64++) {
        srv_embed_response(&b, r.model, vec, r.n_in, lim.dim, base64, r.offs[r.n_in]);
        json_t *j = b.err ? NULL : json_loadb(b.p, b.len, 0, NULL);
        if (!b.err && !j)
            abort();
        json_decref(j);
        srv_buf_free(&b);
    }
    free(vec);
    srv_embed_req_free(&r);
}

/* The reply's results: top_n of them, scores not increasing (a non-finite one is null). */
static void check_rerank_reply(const struct srv_buf *b, const struct srv_rerank_req *r)
{
    if (b->err)
        return;
    json_t *j = json_loadb(b->p, b->len, 0, NULL);
    json_t *res = json_object_get(j, "results");
    if (!j || json_array_size(res) != (size_t)r->top_n)
        abort();
    double prev = INFINITY;
    for (size_t i = 0; i < json_array_size(res); i++) {
        json_t *s = json_object_get(json_array_get(res, i), "relevance_score");
        if (json_is_number(s) && json_number_value(s) > prev)
            abort();
        if (json_is_number(s))
            prev = json_number_value(s);
    }
    json_decref(j);
}

static void rerank_all(const uint8_t *data, size_t size)
{
    struct srv_rerank_req r;
    struct srv_err e;
    struct srv_buf b = {0};
    if (srv_rerank_parse(&r, (const char *)data + 1, size - 1, &e) ||
        srv_rerank_pack(&r, fake_pair, NULL, 3 + (data[0] & 63), &e)) {
        free(srv_json_error(&e));
        srv_rerank_req_free(&r);
        return;
    }
    float *s = malloc(sizeof(float) * (size_t)r.n_docs);
    for (int act = 0; s && act < 2; act++) {
        for (int i = 0; i < r.n_docs; i++) {
            uint32_t u = (uint32_t)data[(size_t)i % size] * 0x01010101u; /* NaN, huge, tiny */
            memcpy(&s[i], &u, 4);
            if (data[(size_t)i % size] == 0x7f)
                s[i] = i % 2 ? INFINITY : -INFINITY;
        }
        srv_rerank_scores(s, r.n_docs, act ? KWK_SCORE_SIGMOID : KWK_SCORE_IDENTITY);
        srv_rerank_response(&b, act ? "rerank-1" : NULL, r.model ? r.model : "m", &r, s);
        check_rerank_reply(&b, &r);
        srv_buf_free(&b);
    }
    free(s);
    srv_rerank_req_free(&r);
}

/* A reply that must parse as JSON, with n entries in "data". */
static void check_data_reply(struct srv_buf *b, size_t n)
{
    if (b->err)
        return;
    json_t *j = json_loadb(b->p, b->len, 0, NULL);
    if (!j || json_array_size(json_object_get(j, "data")) != n)
        abort();
    json_decref(j);
    b->len = 0;
}

/* Floats from the input's bytes: NaN, infinities, huge and tiny among them. */
static void floats_of(float *v, size_t n, const uint8_t *data, size_t size)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)data[i % size] * 0x01010101u;
        memcpy(&v[i], &u, 4);
        if (data[i % size] == 0x7f)
            v[i] = i % 2 ? INFINITY : -INFINITY;
    }
}

/* Hugging Face's truncation over fake_encode's tokens: [101] the first cap - 2 bytes [102]. */
static int fake_encode_trunc(void *user, const char *text, size_t len, int32_t *ids, size_t cap,
                             size_t *n)
{
    if (cap < 2) {
        *n = len + 2;
        return KWK_ELIMIT;
    }
    return fake_encode(user, text, len + 2 > cap ? cap - 2 : len, ids, cap, n);
}

static void score_all(const uint8_t *data, size_t size)
{
    struct srv_score_req r;
    struct srv_err e;
    struct srv_trunc t;
    struct srv_buf b = {0};
    int max_tokens = 3 + (data[0] & 63), dim = 1 + data[0] % 5;
    if (srv_score_parse(&r, (const char *)data + 1, size - 1, &e) ||
        srv_trunc_resolve(r.truncate, max_tokens, &t, &e) ||
        srv_score_pack_pairs(&r, fake_pair, NULL, &t, &e) ||
        srv_score_pack_texts(&r, t.strict ? fake_encode : fake_encode_trunc, NULL, &t, &e)) {
        free(srv_json_error(&e));
        srv_score_req_free(&r);
        return;
    }
    for (int i = 0; i < r.n_a; i++)
        if (r.a_of[i] < 0 || r.a_of[i] >= r.uniq.n_in)
            abort();
    for (int i = 0; i < r.n_b; i++)
        if (r.b_of[i] < 0 || r.b_of[i] >= r.uniq.n_in)
            abort();
    size_t nv = (size_t)r.uniq.n_in * (size_t)dim;
    float *vec = malloc(sizeof(float) * nv), *s = malloc(sizeof(float) * (size_t)r.n_b);
    if (vec && s) {
        floats_of(vec, nv, data, size);
        srv_score_cosines(&r, vec, dim, s);
        srv_score_response(&b, "score-1", 1, r.model ? r.model : "m", s, r.n_b,
                           r.uniq.offs[r.uniq.n_in]);
        check_data_reply(&b, (size_t)r.n_b);
        floats_of(s, (size_t)r.n_b, data, size);
        srv_rerank_scores(s, r.n_b, KWK_SCORE_SIGMOID);
        srv_score_response(&b, "score-2", 2, "m", s, r.n_b, r.pairs.offs[r.n_b]);
        check_data_reply(&b, (size_t)r.n_b);
    }
    free(vec);
    free(s);
    srv_buf_free(&b);
    srv_score_req_free(&r);
}

static void classify_all(const uint8_t *data, size_t size)
{
    struct srv_embed_limits lim = {.n_vocab = 30522, .max_tokens = 4 + (data[0] & 63)};
    struct srv_classify_req r;
    struct srv_labels l;
    struct srv_err e;
    struct srv_trunc t;
    struct srv_buf b = {0};
    int n_labels = 1 + (data[0] >> 6);
    /* the body as a config.json too: id2label and problem_type, untrusted */
    if (srv_labels_parse(&l, (const char *)data + 1, size - 1, n_labels))
        l.names = NULL;
    if (srv_classify_parse(&r, (const char *)data + 1, size - 1, &lim, &e) ||
        srv_trunc_resolve(r.truncate, lim.max_tokens, &t, &e) ||
        srv_classify_pack(&r, t.strict ? fake_encode : fake_encode_trunc, NULL, &t, &e)) {
        free(srv_json_error(&e));
        srv_classify_req_free(&r);
        srv_labels_free(&l);
        return;
    }
    size_t n = (size_t)r.in.n_in * (size_t)n_labels;
    float *logits = malloc(sizeof(float) * n);
    for (int act = 0; logits && act < 3; act++) {
        floats_of(logits, n, data, size);
        l.act = act;
        srv_classify_response(&b, "classify-1", 1, r.in.model ? r.in.model : "m", &l, logits,
                              r.in.n_in, data[0] & 1, r.in.offs[r.in.n_in]);
        check_data_reply(&b, (size_t)r.in.n_in);
    }
    free(logits);
    srv_buf_free(&b);
    srv_labels_free(&l);
    srv_classify_req_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > FUZZ_MAX_INPUT)
        return 0;
    static const int kinds[4] = {SRV_CHAT, SRV_COMPLETION, SRV_TOKENIZE, SRV_DETOKENIZE};
    int kind = kinds[data[0] & 3];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    struct srv_limits lim = {.n_vocab = 49152, .max_cache_len = 2048,
                             .tool_format = (data[0] >> 2 & 7) % SRV_TOOLS_N};
    struct srv_req r;
    struct srv_err e;
    embed_all(data, size);
    rerank_all(data, size);
    score_all(data, size);
    classify_all(data, size);
    if (srv_req_parse(&r, kind, body, len, &lim, &e) == 0) {
        build_all(&r, (const uint8_t *)body, len);
        srv_req_free(&r);
    } else {
        char *j = srv_json_error(&e);
        free(j);
    }
    /* the bearer check on a NUL-terminated copy of a prefix, against a key from the input */
    size_t split = len < 64 ? len : 64;
    char *hdr = malloc(split + 1), *key = malloc(split + 1);
    if (hdr && key) {
        memcpy(hdr, body, split);
        hdr[split] = 0;
        memcpy(key, body + len - split, split);
        key[split] = 0;
        srv_auth_ok(hdr, key);
        srv_auth_ok(NULL, key);
    }
    free(hdr);
    free(key);
    return 0;
}
