/* tok_normalize.c - the normalizers of tokenizer.json (NFC/NFD/NFKC/NFKD, Lowercase,
 * StripAccents, Replace, Prepend, Strip, BertNormalizer, Sequence) over valid UTF-8 text.
 * Any thread: state lives in the caller's buffers. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/tokenizer.h"

static int unicode_form(int kind, const char *s, size_t n, struct tok_buf *out)
{
    int opt = UTF8PROC_STABLE;
    switch (kind) {
    case TOK_N_NFC: opt |= UTF8PROC_COMPOSE; break;
    case TOK_N_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case TOK_N_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    if (n == 0)
        return 0;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)opt);
    if (m < 0) {
        /* Input is valid UTF-8, so only allocation can fail here. */
        return KWK_ELIMIT;
    }
    tok_buf_add(out, dst, (size_t)m);
    free(dst);
    return 0;
}

/* Replace every non-overlapping match of the step's pattern by its content. */
static void replace_all(const struct tok_step *st, const char *s, size_t n, struct tok_buf *out)
{
    size_t i = 0;
    if (st->re) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(st->re, NULL);
        if (!md) {
            out->oom = 1;
            return;
        }
        /* The first match checks that the subject is UTF-8 (from its offset on, to the end);
         * the later ones skip that check, which would make a long text's replacements
         * quadratic (1 MB of War and Peace: 15 s). */
        size_t at = 0;
        uint32_t check = 0;
        while (at <= n) {
            int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, at, check, md, NULL);
            if (rc < 0)
                break;
            check = PCRE2_NO_UTF_CHECK;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            tok_buf_add(out, s + i, ov[0] - i);
            tok_buf_add(out, st->content, st->content_len);
            i = at = ov[1];
            if (ov[1] == ov[0]) {
                /* An empty match: keep the next character and move past it. */
                if (at >= n)
                    break;
                size_t l = tok_utf8_len((uint8_t)s[at]);
                l = KWK_MIN(l, n - at);
                tok_buf_add(out, s + at, l);
                i = at = at + l;
            }
        }
        pcre2_match_data_free(md);
        tok_buf_add(out, s + i, n - i);
        return;
    }
    if (st->pat_len == 0) {
        tok_buf_add(out, s, n);
        return;
    }
    while (i < n) {
        const char *hit = NULL;
        if (n - i >= st->pat_len)
            hit = memmem(s + i, n - i, st->pat, st->pat_len);
        if (!hit)
            break;
        tok_buf_add(out, s + i, (size_t)(hit - (s + i)));
        tok_buf_add(out, st->content, st->content_len);
        i = (size_t)(hit - s) + st->pat_len;
    }
    tok_buf_add(out, s + i, n - i);
}

static void strip_ws(const struct tok_step *st, const char *s, size_t n, struct tok_buf *out)
{
    size_t a = 0, b = n;
    if (st->left)
        while (a < b) {
            uint32_t cp;
            size_t l = tok_utf8_next(s + a, b - a, &cp);
            if (!tok_is_whitespace(cp))
                break;
            a += l;
        }
    if (st->right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((uint8_t)s[k] & 0xC0) == 0x80)
                k--;
            uint32_t cp;
            tok_utf8_next(s + k, b - k, &cp);
            if (!tok_is_whitespace(cp))
                break;
            b = k;
        }
    tok_buf_add(out, s + a, b - a);
}

/* Lowercase, StripAccents (every mark, as HF's StripAccents), or BERT's accent strip
 * (non-spacing marks only). */
enum { BERT_STRIP = -1 };

static void per_char(int kind, const char *s, size_t n, struct tok_buf *out)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, n - i, &cp);
        if (kind == TOK_N_LOWER)
            tok_buf_add_lower(out, cp);
        else if (kind == BERT_STRIP ? !tok_is_mn(cp) : !tok_is_mark(cp))
            tok_buf_add(out, s + i, l);
        i += l;
    }
}

static int bert(const struct tok_step *st, const char *s, size_t n, struct tok_buf *out)
{
    struct tok_buf a = {0}, b = {0};
    int rc = 0;
    int strip = st->strip_accents < 0 ? st->lowercase : st->strip_accents;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, n - i, &cp);
        i += l;
        if (st->clean_text) {
            if (cp == 0 || cp == 0xFFFD || tok_is_control(cp))
                continue;
            if (tok_is_whitespace(cp))
                cp = ' ';
        }
        if (st->chinese && tok_is_cjk(cp)) {
            tok_buf_addc(&a, ' ');
            tok_buf_add_cp(&a, cp);
            tok_buf_addc(&a, ' ');
        } else {
            tok_buf_add_cp(&a, cp);
        }
    }
    if (strip) {
        rc = unicode_form(TOK_N_NFD, a.p, a.n, &b);
        a.n = 0;
        per_char(BERT_STRIP, b.p, b.n, &a);
    }
    if (st->lowercase)
        per_char(TOK_N_LOWER, a.p, a.n, out);
    else
        tok_buf_add(out, a.p, a.n);
    if (a.oom || b.oom)
        out->oom = 1;
    tok_buf_free(&a);
    tok_buf_free(&b);
    return rc;
}

int tok_normalize(const struct kwk_tokenizer *t, const struct tok_step *st, const char *s,
                  size_t n, struct tok_buf *out)
{
    int rc = 0;
    out->n = 0;
    switch (st->kind) {
    case TOK_NONE:
        tok_buf_add(out, s, n);
        break;
    case TOK_N_SEQ: {
        struct tok_buf cur = {0}, nxt = {0};
        tok_buf_add(&cur, s, n);
        for (int i = 0; i < st->n_subs && !rc; i++) {
            rc = tok_normalize(t, &st->subs[i], cur.p ? cur.p : "", cur.n, &nxt);
            struct tok_buf tmp = cur;
            cur = nxt;
            nxt = tmp;
        }
        if (cur.oom || nxt.oom)
            rc = -12;
        tok_buf_add(out, cur.p ? cur.p : "", cur.n);
        tok_buf_free(&cur);
        tok_buf_free(&nxt);
        break;
    }
    case TOK_N_NFC: case TOK_N_NFD: case TOK_N_NFKC: case TOK_N_NFKD:
        rc = unicode_form(st->kind, s, n, out);
        break;
    case TOK_N_LOWER: case TOK_N_STRIP_ACCENTS:
        per_char(st->kind, s, n, out);
        break;
    case TOK_N_REPLACE:
        replace_all(st, s, n, out);
        break;
    case TOK_N_PREPEND:
        if (n)
            tok_buf_add(out, st->pat, st->pat_len);
        tok_buf_add(out, s, n);
        break;
    case TOK_N_STRIP:
        strip_ws(st, s, n, out);
        break;
    case TOK_N_BERT:
        rc = bert(st, s, n, out);
        break;
    case TOK_N_PRECOMPILED:
        tok_precompiled_apply(st, s, n, out);
        break;
    default:
        tok_buf_add(out, s, n);
        break;
    }
    if (!rc && out->oom)
        rc = -12;
    if (!out->p)
        tok_buf_add(out, "", 0);
    return rc;
}
