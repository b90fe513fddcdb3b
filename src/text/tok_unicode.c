/* tok_unicode.c - UTF-8 decoding and repair, Unicode character classes (from utf8proc) and
 * GPT-2's byte-to-character mapping. Pure functions: any thread. */
#include <string.h>

#include <utf8proc.h>

#include "text/tokenizer.h"

size_t tok_utf8_len(uint8_t c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xF0)
        return 4;
    if (c >= 0xE0)
        return 3;
    if (c >= 0xC0)
        return 2;
    return 1;
}

/* Length of the valid sequence at s (1..4), or 0 when invalid; *cp receives the code point.
 * *sub receives the length of the maximal subpart of an ill-formed sequence (>= 1). */
static size_t utf8_valid(const uint8_t *s, size_t n, uint32_t *cp, size_t *sub)
{
    uint8_t c = s[0];
    *sub = 1;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if (i >= n)
            return 0;
        uint8_t d = s[i];
        if (d < lo || d > hi)
            return 0;
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (d & 0x3F);
        *sub = i + 1;
    }
    *cp = v;
    return len;
}

size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp)
{
    size_t sub;
    size_t len = utf8_valid((const uint8_t *)s, n, cp, &sub);
    if (!len) {
        *cp = 0xFFFD;
        return 1;
    }
    return len;
}

void tok_utf8_sanitize(const char *src, size_t n, struct tok_buf *out)
{
    size_t i = 0, run = 0;
    tok_buf_reserve(out, n);
    while (i < n) {
        uint32_t cp;
        size_t sub;
        size_t len = utf8_valid((const uint8_t *)src + i, n - i, &cp, &sub);
        if (len) {
            i += len;
            continue;
        }
        tok_buf_add(out, src + run, i - run);
        tok_buf_add(out, "\xEF\xBF\xBD", 3);
        i += sub;
        run = i;
    }
    tok_buf_add(out, src + run, n - run);
}

size_t tok_utf8_complete_prefix(const char *s, size_t n)
{
    /* Look back at most 3 bytes for a lead byte whose sequence is cut short. */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = (uint8_t)s[n - back];
        if ((c & 0xC0) == 0x80)
            continue;
        if (c >= 0xC0 && tok_utf8_len(c) > back) {
            uint32_t cp;
            size_t sub;
            /* Only hold back a prefix that could still become valid. */
            utf8_valid((const uint8_t *)s + n - back, back, &cp, &sub);
            if (sub == back)
                return n - back;
        }
        return n;
    }
    return n;
}

int tok_is_whitespace(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static int cat(uint32_t c)
{
    return utf8proc_category((utf8proc_int32_t)c);
}

static int is_p(int k)
{
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

int tok_is_punct(uint32_t c)
{
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
               (c >= 0x7B && c <= 0x7E);
    return is_p(cat(c));
}

int tok_is_bert_punct(uint32_t c)
{
    return tok_is_punct(c);
}

int tok_is_numeric(uint32_t c)
{
    int k = cat(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

int tok_is_alnum(uint32_t c)
{
    int k = cat(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

int tok_is_control(uint32_t c)
{
    if (c == '\t' || c == '\n' || c == '\r')
        return 0;
    /* HF's is_other() (unicode_categories) does not count unassigned code points. */
    int k = cat(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
           k == UTF8PROC_CATEGORY_CO;
}

int tok_is_mn(uint32_t c)
{
    return cat(c) == UTF8PROC_CATEGORY_MN;
}

int tok_is_mark(uint32_t c)
{
    int k = cat(c);
    return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

int tok_is_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

uint32_t tok_lower(uint32_t c)
{
    if (c < 0x80)
        return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
}

void tok_buf_add_lower(struct tok_buf *b, uint32_t c)
{
    /* The one full-mapping difference that matters in practice: Rust's to_lowercase gives
     * U+0130 -> "i\u0307", the simple mapping gives "i". */
    if (c == 0x130) {
        tok_buf_add(b, "i\xCC\x87", 3);
        return;
    }
    tok_buf_add_cp(b, tok_lower(c));
}

static int byte_printable(uint32_t b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_byte_cp(uint8_t b)
{
    if (byte_printable(b))
        return b;
    if (b <= 0x20)
        return 256u + b;
    if (b >= 0x7F && b <= 0xA0)
        return 256u + 33 + (b - 0x7Fu);
    return 256u + 67; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_printable(cp) ? (int)cp : -1;
    if (cp <= 256 + 32)
        return (int)(cp - 256);
    if (cp <= 256 + 66)
        return (int)(0x7F + cp - 289);
    if (cp == 256 + 67)
        return 0xAD;
    return -1;
}
