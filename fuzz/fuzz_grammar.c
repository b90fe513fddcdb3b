/* fuzz_grammar.c - libFuzzer target: compile arbitrary GBNF text and run what it compiles to.
 * Input: the grammar, optionally followed by a NUL byte and a text. The text is matched whole
 * (kwk_grammar_match) and fed to a matcher over a small fixed vocabulary in pieces: after each
 * piece a mask, whose every token must agree with kwk_matcher_allows. Size-capped so a step
 * stays fast. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kwker.h"

#define FUZZ_MAX_INPUT (16 * 1024)

/* Tokens of JSON, of classes and of partial UTF-8. */
static const char *const vocab[] = {
    "a", "b", "ab", "abc", "{", "}", "\"", "\": ", ", ", "[", "]", "0", "12", "-", ".", "e",
    " ", "\n", "\\", "\\n", "true", "null", "x", "(", ")", "\xc3", "\xa9", "\xc3\xa9",
    "\xe4\xb8", "\xad", "\xf0\x9f\x98\x80", "\xed\xa0\x80", "\xff", "\x00", "aaaa", "  ",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_MAX_INPUT)
        return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t g_len = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t text_len = nul ? size - g_len - 1 : 0;
    struct kwk_err err;
    kwk_grammar *g = kwk_grammar_new((const char *)data, g_len, &err);
    if (!g)
        return 0;
    int prefix = 0;
    int whole = kwk_grammar_match(g, text, text_len, &prefix);

    enum { N = sizeof vocab / sizeof vocab[0] };
    uint32_t lens[N];
    for (int i = 0; i < N; i++)
        lens[i] = i == 33 ? 1 : (uint32_t)strlen(vocab[i]);
    kwk_grammar_vocab *v = kwk_grammar_vocab_from_bytes(vocab, lens, N, &err);
    kwk_matcher *m = v ? kwk_matcher_new(g, v, &err) : NULL;
    size_t pos = 0;
    int rc = 0;
    while (m && rc == 0) {
        uint32_t mask[(N + 31) / 32];
        int32_t c = kwk_matcher_mask(m, mask);
        if (c < 0)
            break;
        for (int i = 0; i < N; i++)
            if ((int)(mask[i >> 5] >> (i & 31) & 1) != kwk_matcher_allows(m, i))
                abort(); /* the mask and the one-token check disagree */
        if (pos == text_len)
            break;
        size_t step = 1 + (unsigned char)text[pos] % 3;
        step = step < text_len - pos ? step : text_len - pos;
        rc = kwk_matcher_accept_bytes(m, text + pos, step);
        pos += step;
    }
    /* A text the matcher took whole agrees with whole-text matching. */
    if (m && rc == 0 && pos == text_len && whole >= 0 && kwk_matcher_done(m) != whole)
        abort();
    kwk_matcher_free(m);
    kwk_grammar_vocab_free(v);
    kwk_grammar_free(g);
    return 0;
}
