/* fuzz_matcher_preserve.c - libFuzzer target: a grammar matcher over a tokenizer's vocabulary
 * whose tool-call markers are special tokens, kept out of the grammar vocabulary's trie unless
 * the matcher preserves them (kwk_matcher_preserve).
 * Input: GBNF text, a NUL byte, then a script of one-byte operations (some with operands) run on
 * one matcher in the input's order: preserve ids (some invalid), mask, accept a masked token,
 * accept a token, accept bytes, reset, drop the tables, check done. After each the matcher must
 * agree with itself (the mask with kwk_matcher_allows, a token allowed with its accept) and with
 * kwk_grammar_match on the text so far: a special token is allowed exactly when it is preserved
 * and the text with its bytes can still become a sentence. Without a NUL every special token is
 * preserved and one mask checked. Size-capped so an input stays fast. The tokenizer and the
 * vocabulary are built on the first call and kept (one fuzzing thread). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h" /* kg_matcher_flush: the tables dropped between calls */
#include "kwker.h"

#define FUZZ_MAX_INPUT (8 * 1024)
#define FUZZ_MAX_OPS 512
#define TEXT_MAX 1024 /* text checked against kwk_grammar_match; past it the checks stop */

/* The model's tokens (byte-level BPE, no merges): pieces of the markers spelled out, JSON, and
 * bytes of UTF-8 characters cut anywhere. */
static const char *const plain[] = {
    "<", ">", "/", "|", "[", "]", "{", "}", "\"", ":", ",", " ", "\n", "a", "b", "s", "x", "ab",
    "tool", "_call", "TOOL", "_CALLS", "python", "_tag", "</", "null", "calls", "begin", "\xc3",
    "\xa9", "\xc3\xa9", "\xef\xbd\x9c", "\xe2\x96\x81", "\xff",
};
enum { N_PLAIN = sizeof plain / sizeof plain[0] };

/* Added tokens from id N_PLAIN + 1 (N_PLAIN is a hole). "<tool" is a prefix of "<tool_call>";
 * R1's marker is multi-byte UTF-8; "<x>" is added but not special (in the trie). */
static const struct {
    const char *content;
    int special;
} added[] = {
    {"<tool_call>", 1}, {"</tool_call>", 1}, {"[TOOL_CALLS]", 1}, {"<|python_tag|>", 1},
    {"</s>", 1}, {"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>", 1},
    {"<tool", 1}, {"<x>", 0},
};
enum { N_ADDED = sizeof added / sizeof added[0], N_VOCAB = N_PLAIN + 1 + N_ADDED };

static struct {
    int ready;
    kwk_tokenizer *tok;
    kwk_grammar_vocab *v;
    char bytes[N_VOCAB][64]; /* each token's bytes as kwk_tokenizer_token_bytes gives them */
    size_t len[N_VOCAB];
    uint8_t held[N_VOCAB]; /* special with bytes: what kwk_matcher_preserve may let in */
} V;

static void fail(const char *what, int32_t tok)
{
    fprintf(stderr, "fuzz_matcher_preserve: %s (token %d)\n", what, (int)tok);
    abort();
}

/* GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the others for
 * U+0100 on, in byte order. */
static int byte_is_self(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
}

static unsigned byte_char(unsigned b)
{
    unsigned n = 0;
    if (byte_is_self(b))
        return b;
    for (unsigned c = 0; c < b; c++)
        n += !byte_is_self(c);
    return 256 + n;
}

/* Append s[n] to the JSON buffer as a string whose characters are each byte's stand-in (bl) or
 * the UTF-8 text itself; every non-ASCII character as \uXXXX (all are in the BMP here). */
static void json_str(char *out, size_t cap, size_t *at, const char *s, size_t n, int bl)
{
    *at += (size_t)snprintf(out + *at, cap - *at, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned c = (unsigned char)s[i];
        if (bl) {
            c = byte_char(c);
        } else if (c >= 0xe0) { /* three bytes of UTF-8 (no four-byte text here) */
            c = (c & 0x0f) << 12 | ((unsigned char)s[i + 1] & 0x3f) << 6 |
                ((unsigned char)s[i + 2] & 0x3f);
            i += 2;
        } else if (c >= 0xc0) {
            c = (c & 0x1f) << 6 | ((unsigned char)s[i + 1] & 0x3f);
            i += 1;
        }
        if (c == '"' || c == '\\')
            *at += (size_t)snprintf(out + *at, cap - *at, "\\%c", (char)c);
        else if (c < 0x20 || c >= 0x7f)
            *at += (size_t)snprintf(out + *at, cap - *at, "\\u%04x", c);
        else
            *at += (size_t)snprintf(out + *at, cap - *at, "%c", (char)c);
    }
    *at += (size_t)snprintf(out + *at, cap - *at, "\"");
}

static void vocab_init(void)
{
    static char json[8192];
    size_t at = 0, cap = sizeof json;
    struct kwk_err err;
    at += (size_t)snprintf(json + at, cap - at, "{\"added_tokens\": [");
    for (int i = 0; i < N_ADDED; i++) {
        at += (size_t)snprintf(json + at, cap - at, "%s{\"id\": %d, \"content\": ", i ? ", " : "",
                               N_PLAIN + 1 + i);
        json_str(json, cap, &at, added[i].content, strlen(added[i].content), 0);
        at += (size_t)snprintf(json + at, cap - at,
                               ", \"special\": %s, \"lstrip\": false, \"rstrip\": false,"
                               " \"normalized\": false, \"single_word\": false}",
                               added[i].special ? "true" : "false");
    }
    at += (size_t)snprintf(json + at, cap - at,
                           "], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\","
                           " \"add_prefix_space\": false, \"use_regex\": false},"
                           " \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"},"
                           " \"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int i = 0; i < N_PLAIN; i++) {
        at += (size_t)snprintf(json + at, cap - at, "%s", i ? ", " : "");
        json_str(json, cap, &at, plain[i], strlen(plain[i]), 1);
        at += (size_t)snprintf(json + at, cap - at, ": %d", i);
    }
    at += (size_t)snprintf(json + at, cap - at, "}, \"merges\": []}}");
    if (at >= cap)
        fail("tokenizer JSON over its buffer", -1);
    V.tok = kwk_tokenizer_load_json(json, at, &err);
    if (!V.tok || kwk_tokenizer_n_vocab(V.tok) != N_VOCAB)
        fail(V.tok ? "tokenizer size" : err.msg, -1);
    for (int32_t i = 0; i < N_VOCAB; i++) {
        int rc = kwk_tokenizer_token_bytes(V.tok, i, V.bytes[i], sizeof V.bytes[i], &V.len[i]);
        if (rc)
            V.len[i] = 0; /* the hole */
        V.held[i] = V.len[i] > 0 && kwk_tokenizer_is_special(V.tok, i) == 1;
        /* the harness's own check: the tokenizer holds the vocabulary meant */
        const char *want = i < N_PLAIN   ? plain[i]
                           : i > N_PLAIN ? added[i - N_PLAIN - 1].content
                                         : "";
        if (V.len[i] != strlen(want) || memcmp(V.bytes[i], want, V.len[i]) ||
            V.held[i] != (i > N_PLAIN && added[i - N_PLAIN - 1].special))
            fail("tokenizer bytes differ from the vocabulary meant", i);
    }
    V.v = kwk_grammar_vocab_new(V.tok, &err);
    if (!V.v || kwk_grammar_vocab_size(V.v) != N_VOCAB)
        fail("grammar vocabulary", -1);
    V.ready = 1;
}

/* One run: the matcher, the ids it was asked to preserve (as the contract says it keeps them)
 * and the text it has taken since the start. */
struct run {
    const kwk_grammar *g;
    kwk_matcher *m;
    uint8_t kept[N_VOCAB];
    char text[TEXT_MAX + 64];
    size_t n_text;
    int known; /* 0 once the text outgrew TEXT_MAX or a call failed on a limit */
};

static int usable(const struct run *r, int32_t t)
{
    return t >= 0 && t < N_VOCAB && V.len[t] > 0 && (!V.held[t] || r->kept[t]);
}

/* Whether the text so far followed by s[n] can still become a sentence: 1, 0, or negative
 * when kwk_grammar_match hit a limit. */
static int live(struct run *r, const char *s, size_t n)
{
    int prefix;
    if (n > sizeof r->text - r->n_text)
        return -1;
    memcpy(r->text + r->n_text, s, n);
    int rc = kwk_grammar_match(r->g, r->text, r->n_text + n, &prefix);
    return rc < 0 ? rc : prefix;
}

static void took(struct run *r, const char *s, size_t n)
{
    if (r->n_text + n > TEXT_MAX) {
        r->known = 0;
        return;
    }
    memcpy(r->text + r->n_text, s, n);
    r->n_text += n;
}

/* A call failed on a limit (or memory): the matcher may have lost its place. */
static void limited(struct run *r, int rc)
{
    if (rc < 0 && rc != KWK_EARG && rc != KWK_ERANGE)
        r->known = 0;
}

/* The mask against kwk_matcher_allows for every token, against what may be allowed at all,
 * and, for the special tokens, against kwk_grammar_match. Returns the mask's count (negative:
 * the matcher's limit). */
static int32_t check_mask(struct run *r, uint32_t *mask)
{
    int32_t count = kwk_matcher_mask(r->m, mask), bits = 0;
    limited(r, count);
    if (count < 0)
        return count;
    for (int32_t t = 0; t < N_VOCAB; t++) {
        int bit = (int)(mask[t >> 5] >> (t & 31) & 1), a = kwk_matcher_allows(r->m, t);
        bits += bit;
        if (a >= 0 && a != bit)
            fail("the mask and kwk_matcher_allows disagree", t);
        if (bit && !usable(r, t))
            fail("a special token not preserved (or a hole) is allowed", t);
        if (!r->known || !V.held[t])
            continue;
        int want = r->kept[t] ? live(r, V.bytes[t], V.len[t]) : 0;
        if (want >= 0 && want != bit)
            fail("a special token's bit disagrees with kwk_grammar_match", t);
    }
    if (bits != count)
        fail("the mask's count is not its bits", count);
    return count;
}

static int32_t id_of(uint8_t b)
{
    return (int32_t)(b % (N_VOCAB + 3)) - 1; /* -1 .. N_VOCAB + 1: some outside */
}

/* Operand mode (c >> 6): 1 NULL ids, 2 a negative count; else n = c & 7 ids from the script. */
static void op_preserve(struct run *r, const uint8_t *s, size_t n, size_t *i)
{
    uint8_t c = *i < n ? s[(*i)++] : 0;
    int cnt = c & 7, mode = c >> 6, rc;
    int32_t ids[8] = {0};
    if (mode == 1) {
        rc = kwk_matcher_preserve(r->m, NULL, cnt);
        if (rc != (cnt ? KWK_EARG : 0))
            fail("preserve of NULL ids", cnt);
        return;
    }
    if (mode == 2) {
        if (kwk_matcher_preserve(r->m, ids, -1 - cnt) != KWK_EARG)
            fail("preserve of a negative count", -1 - cnt);
        return;
    }
    for (int k = 0; k < cnt; k++)
        ids[k] = id_of(*i < n ? s[(*i)++] : 0);
    rc = kwk_matcher_preserve(r->m, ids, cnt);
    if (rc == -ENOMEM)
        return;
    if (rc)
        fail("preserve of valid arguments failed", rc);
    for (int k = 0; k < cnt; k++)
        if (ids[k] >= 0 && ids[k] < N_VOCAB && V.held[ids[k]])
            r->kept[ids[k]] = 1;
}

/* Take the k-th token of the mask: it must be accepted. */
static void op_pick(struct run *r, uint8_t k)
{
    uint32_t mask[(N_VOCAB + 31) / 32];
    int32_t count = check_mask(r, mask);
    if (count <= 0)
        return;
    int32_t t = 0, left = k % count;
    for (;; t++)
        if ((mask[t >> 5] >> (t & 31) & 1) && left-- == 0)
            break;
    int rc = kwk_matcher_accept(r->m, t);
    limited(r, rc);
    if (rc == KWK_EARG || rc == KWK_ERANGE)
        fail("a token the mask allows is refused", t);
    if (rc == 0)
        took(r, V.bytes[t], V.len[t]);
}

static void op_accept(struct run *r, int32_t t)
{
    int a = kwk_matcher_allows(r->m, t), rc = kwk_matcher_accept(r->m, t);
    limited(r, a);
    limited(r, rc);
    if ((t < 0 || t >= N_VOCAB) && rc != KWK_ERANGE)
        fail("a token outside the vocabulary is not KWK_ERANGE", t);
    if (a == 1 && rc != 0 && !(rc < 0 && rc != KWK_EARG && rc != KWK_ERANGE))
        fail("an allowed token is refused", t);
    if (a == 0 && rc == 0)
        fail("a token not allowed is accepted", t);
    if (rc == 0 && !usable(r, t))
        fail("a special token not preserved is accepted", t);
    if (rc == 0)
        took(r, V.bytes[t], V.len[t]);
}

static void op_bytes(struct run *r, const uint8_t *s, size_t n, size_t *i)
{
    size_t len = *i < n ? s[(*i)++] % 16 : 0;
    len = len < n - *i ? len : n - *i;
    const char *b = (const char *)s + *i;
    int want = r->known ? live(r, b, len) : -1;
    int rc = kwk_matcher_accept_bytes(r->m, b, len);
    *i += len;
    limited(r, rc);
    if (want >= 0 && rc >= 0 && (rc == 0) != want)
        fail("accept_bytes disagrees with kwk_grammar_match", (int32_t)len);
    if (rc == 0)
        took(r, b, len);
}

static void op_done(struct run *r)
{
    int done = kwk_matcher_done(r->m), fin = kwk_matcher_finished(r->m);
    if (fin && !done)
        fail("finished but not done", -1);
    if (!r->known)
        return;
    int whole = kwk_grammar_match(r->g, r->text, r->n_text, NULL);
    if (whole >= 0 && whole != done)
        fail("kwk_matcher_done disagrees with kwk_grammar_match", whole);
}

static void script_run(struct run *r, const uint8_t *s, size_t n)
{
    uint32_t mask[(N_VOCAB + 31) / 32];
    size_t i = 0;
    for (int ops = 0; i < n && ops < FUZZ_MAX_OPS; ops++) {
        switch (s[i++] % 8) {
        case 0:
            op_preserve(r, s, n, &i);
            break;
        case 1:
            check_mask(r, mask);
            break;
        case 2:
            op_pick(r, i < n ? s[i++] : 0);
            break;
        case 3:
            op_accept(r, id_of(i < n ? s[i++] : 0));
            break;
        case 4:
            op_bytes(r, s, n, &i);
            break;
        case 5:
            kwk_matcher_reset(r->m);
            r->n_text = 0;
            r->known = 1;
            break;
        case 6: {
            int rc = kg_matcher_flush(r->m);
            limited(r, rc);
            break;
        }
        default:
            op_done(r);
            break;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_MAX_INPUT)
        return 0;
    if (!V.ready)
        vocab_init();
    const uint8_t *nul = memchr(data, 0, size);
    size_t g_len = nul ? (size_t)(nul - data) : size;
    struct kwk_err err;
    kwk_grammar *g = kwk_grammar_new((const char *)data, g_len, &err);
    if (!g)
        return 0;
    static struct run r; /* its text is large for a fuzzer's stack */
    memset(&r, 0, sizeof r);
    r.g = g;
    r.known = 1;
    r.m = kwk_matcher_new(g, V.v, &err);
    if (r.m && nul) {
        script_run(&r, nul + 1, size - g_len - 1);
    } else if (r.m) {
        static const uint8_t all[] = {0x00,        0x07,        N_PLAIN + 2, N_PLAIN + 3,
                                      N_PLAIN + 4, N_PLAIN + 5, N_PLAIN + 6, N_PLAIN + 7,
                                      N_PLAIN + 8, 0x01};
        script_run(&r, all, sizeof all);
    }
    kwk_matcher_free(r.m);
    kwk_grammar_free(g);
    return 0;
}
