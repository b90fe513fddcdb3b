/* tok_precompiled.c - SentencePiece's "Precompiled" normalizer (T5, XLM-R, ...): the charsmap
 * is a double-array trie of byte strings and a blob of replacements; text is rewritten one
 * grapheme cluster (or, failing that, one character) at a time, the way HF's spm_precompiled
 * does it. Every index read from the charsmap is bounds-checked. Any thread. */
#include <string.h>

#include <utf8proc.h>

#include "text/tokenizer.h"

static int b64val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

/* Take a decoded charsmap (owned by st from here on success): a little-endian u32 byte count
 * of the trie, the trie's 32-bit units, then the NUL-separated replacements. */
static int set_charsmap(struct tok_step *st, char *p, size_t n, struct kwk_err *err)
{
    uint32_t trie_bytes = 0;
    if (n >= 4)
        trie_bytes = (uint32_t)(uint8_t)p[0] | (uint32_t)(uint8_t)p[1] << 8 |
                     (uint32_t)(uint8_t)p[2] << 16 | (uint32_t)(uint8_t)p[3] << 24;
    if (n < 4 || trie_bytes % 4 || trie_bytes > n - 4 || trie_bytes < 4)
        return kwk_err_set(err, KWK_EFORMAT, "precompiled_charsmap: bad trie size");
    st->content = p;
    st->content_len = n;
    return 0;
}

int tok_precompiled_init(struct tok_step *st, const char *b64, size_t n, struct kwk_err *err)
{
    struct tok_buf out = {0};
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)b64[i];
        if (c == '=' || c == '\n' || c == '\r')
            continue;
        int v = b64val(c);
        if (v < 0) {
            tok_buf_free(&out);
            return kwk_err_set_pos(err, KWK_EFORMAT, (int64_t)i,
                                   "precompiled_charsmap is not base64 (byte %zu)", i);
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            tok_buf_addc(&out, (char)((acc >> bits) & 0xFF));
        }
    }
    if (out.oom) {
        tok_buf_free(&out);
        return kwk_err_set(err, -12, "out of memory");
    }
    int rc = set_charsmap(st, out.p, out.n, err);
    if (rc)
        tok_buf_free(&out);
    return rc;
}

int tok_precompiled_init_raw(struct tok_step *st, const void *p, size_t n, struct kwk_err *err)
{
    char *copy = kwk_malloc(n ? n : 1);
    if (!copy)
        return kwk_err_set(err, -12, "out of memory");
    memcpy(copy, p, n);
    int rc = set_charsmap(st, copy, n, err);
    if (rc)
        kwk_free(copy);
    return rc;
}

static uint32_t unit_at(const uint8_t *trie, size_t i)
{
    const uint8_t *p = trie + 4 * i;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Whether s[0..n) is UTF-8: a replacement that is not is never written (the steps after the
 * normalizer match regexes without checking the text again). */
static int is_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, n - i, &cp);
        if (cp == 0xFFFD && l == 1)
            return 0;
        i += l;
    }
    return 1;
}

/* The replacement of the shortest charsmap key that prefixes s[0..n), or NULL. */
static const char *transform(const struct tok_step *st, const char *s, size_t n, size_t *out_n)
{
    const uint8_t *blob = (const uint8_t *)st->content;
    size_t trie_bytes = unit_at(blob, 0), units = trie_bytes / 4;
    const uint8_t *trie = blob + 4;
    const char *norm = st->content + 4 + trie_bytes;
    size_t norm_n = st->content_len - 4 - trie_bytes;
    size_t pos = 0;
    uint32_t u = unit_at(trie, 0);
    pos ^= (size_t)((u >> 10) << ((u & (1u << 9)) >> 6));
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c == 0)
            break;
        pos ^= c;
        if (pos >= units)
            return NULL;
        u = unit_at(trie, pos);
        if ((u & ((1u << 31) | 0xFF)) != c)
            return NULL;
        pos ^= (size_t)((u >> 10) << ((u & (1u << 9)) >> 6));
        if (pos >= units)
            return NULL;
        if ((u >> 8) & 1) {
            size_t v = unit_at(trie, pos) & ((1u << 31) - 1);
            if (v >= norm_n)
                return NULL;
            size_t e = v;
            while (e < norm_n && norm[e])
                e++;
            *out_n = e - v;
            return is_utf8(norm + v, e - v) ? norm + v : NULL;
        }
    }
    return NULL;
}

void tok_precompiled_apply(const struct tok_step *st, const char *s, size_t n,
                           struct tok_buf *out)
{
    size_t i = 0;
    while (i < n) {
        /* One extended grapheme cluster [i, j). */
        utf8proc_int32_t state = 0;
        uint32_t prev;
        size_t j = i + tok_utf8_next(s + i, n - i, &prev);
        while (j < n) {
            uint32_t cp;
            size_t l = tok_utf8_next(s + j, n - j, &cp);
            if (utf8proc_grapheme_break_stateful((utf8proc_int32_t)prev, (utf8proc_int32_t)cp,
                                                 &state))
                break;
            prev = cp;
            j += l;
        }
        size_t rn;
        const char *r = j - i < 6 ? transform(st, s + i, j - i, &rn) : NULL;
        if (r) {
            tok_buf_add(out, r, rn);
            i = j;
            continue;
        }
        while (i < j) {
            uint32_t cp;
            size_t l = tok_utf8_next(s + i, j - i, &cp);
            r = transform(st, s + i, l, &rn);
            if (r)
                tok_buf_add(out, r, rn);
            else
                tok_buf_add(out, s + i, l);
            i += l;
        }
    }
}
