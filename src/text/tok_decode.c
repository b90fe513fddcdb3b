/* tok_decode.c - ids back to text through tokenizer.json's decoders (ByteLevel, Metaspace,
 * ByteFallback, Fuse, Strip, Replace, WordPiece, Sequence; none = join with spaces), with HF's
 * rules for invalid bytes (U+FFFD). Any thread. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "text/tokenizer.h"

/* A list of token strings. */
struct toks {
    struct tok_buf buf;
    struct tok_ids sp; /* (offset, length) pairs */
};

static void toks_add(struct toks *l, const char *s, size_t n)
{
    tok_ids_push(&l->sp, (int32_t)l->buf.n);
    tok_ids_push(&l->sp, (int32_t)n);
    tok_buf_add(&l->buf, s, n);
}

static void toks_free(struct toks *l)
{
    tok_buf_free(&l->buf);
    tok_ids_free(&l->sp);
}

#define TOK_AT(l, i) ((l)->buf.p + (l)->sp.p[2 * (i)])
#define TOK_LEN(l, i) ((size_t)(l)->sp.p[2 * (i) + 1])
#define TOK_N(l) ((l)->sp.n / 2)

static void dec_bytelevel(struct toks *in, struct toks *out)
{
    struct tok_buf raw = {0};
    for (size_t i = 0; i < TOK_N(in); i++) {
        const char *s = TOK_AT(in, i);
        size_t n = TOK_LEN(in, i), mark = raw.n;
        int ok = 1;
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            k += tok_utf8_next(s + k, n - k, &cp);
            int b = tok_cp_to_byte(cp);
            if (b < 0) {
                ok = 0;
                break;
            }
            tok_buf_addc(&raw, (char)b);
        }
        if (!ok) {
            raw.n = mark;
            tok_buf_add(&raw, s, n);
        }
    }
    struct tok_buf fixed = {0};
    tok_utf8_sanitize(raw.p ? raw.p : "", raw.n, &fixed);
    toks_add(out, fixed.p ? fixed.p : "", fixed.n);
    if (raw.oom || fixed.oom)
        out->buf.oom = 1;
    tok_buf_free(&raw);
    tok_buf_free(&fixed);
}

static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int h = kwk_hex_digit(s[3]), l = kwk_hex_digit(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static void flush_bytes(struct tok_buf *bytes, struct toks *out)
{
    if (!bytes->n)
        return;
    struct tok_buf chk = {0};
    tok_utf8_sanitize(bytes->p, bytes->n, &chk);
    if (chk.n == bytes->n && !memcmp(chk.p, bytes->p, bytes->n)) {
        toks_add(out, bytes->p, bytes->n);
    } else {
        for (size_t i = 0; i < bytes->n; i++)
            toks_add(out, "\xEF\xBF\xBD", 3);
    }
    tok_buf_free(&chk);
    bytes->n = 0;
}

static void dec_bytefallback(struct toks *in, struct toks *out)
{
    struct tok_buf bytes = {0};
    for (size_t i = 0; i < TOK_N(in); i++) {
        int b = byte_token(TOK_AT(in, i), TOK_LEN(in, i));
        if (b >= 0) {
            tok_buf_addc(&bytes, (char)b);
            continue;
        }
        flush_bytes(&bytes, out);
        toks_add(out, TOK_AT(in, i), TOK_LEN(in, i));
    }
    flush_bytes(&bytes, out);
    tok_buf_free(&bytes);
}

static void dec_metaspace(const struct tok_step *st, struct toks *in, struct toks *out)
{
    struct tok_buf t = {0};
    for (size_t i = 0; i < TOK_N(in); i++) {
        const char *s = TOK_AT(in, i);
        size_t n = TOK_LEN(in, i);
        t.n = 0;
        for (size_t k = 0; k < n;) {
            if (st->content_len && n - k >= st->content_len &&
                !memcmp(s + k, st->content, st->content_len)) {
                if (!(i == 0 && st->prepend_scheme != TOK_PREPEND_NEVER))
                    tok_buf_addc(&t, ' ');
                k += st->content_len;
            } else {
                tok_buf_addc(&t, s[k++]);
            }
        }
        toks_add(out, t.p ? t.p : "", t.n);
    }
    tok_buf_free(&t);
}

static void dec_strip(const struct tok_step *st, struct toks *in, struct toks *out)
{
    for (size_t i = 0; i < TOK_N(in); i++) {
        const char *s = TOK_AT(in, i);
        size_t a = 0, b = TOK_LEN(in, i), c = st->content_len;
        for (int k = 0; k < st->left && c && b - a >= c && !memcmp(s + a, st->content, c); k++)
            a += c;
        for (int k = 0; k < st->right && c && b - a >= c && !memcmp(s + b - c, st->content, c);
             k++)
            b -= c;
        toks_add(out, s + a, b - a);
    }
}

static void cleanup(struct tok_buf *t)
{
    static const char *const from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " do not",
                                       " 's", " 've", " 're"};
    static const char *const to[] = {".", "?", "!", ",", "'", "n't", "'m", " don't", "'s", "'ve",
                                     "'re"};
    struct tok_step st = {.kind = TOK_N_REPLACE};
    struct tok_buf o = {0};
    for (size_t r = 0; r < KWK_ARRAY_LEN(from); r++) {
        st.pat = (char *)from[r];
        st.pat_len = strlen(from[r]);
        st.content = (char *)to[r];
        st.content_len = strlen(to[r]);
        tok_normalize(NULL, &st, t->p ? t->p : "", t->n, &o);
        struct tok_buf x = *t;
        *t = o;
        o = x;
    }
    tok_buf_free(&o);
}

static void dec_wordpiece(const struct tok_step *st, struct toks *in, struct toks *out)
{
    struct tok_buf t = {0};
    for (size_t i = 0; i < TOK_N(in); i++) {
        const char *s = TOK_AT(in, i);
        size_t n = TOK_LEN(in, i);
        t.n = 0;
        if (i != 0) {
            if (n >= st->content_len && !memcmp(s, st->content, st->content_len)) {
                s += st->content_len;
                n -= st->content_len;
            } else {
                tok_buf_addc(&t, ' ');
            }
        }
        tok_buf_add(&t, s, n);
        if (st->cleanup)
            cleanup(&t);
        toks_add(out, t.p ? t.p : "", t.n);
    }
    tok_buf_free(&t);
}

static int apply(const struct tok_step *st, struct toks *cur)
{
    struct toks out = {0};
    switch (st->kind) {
    case TOK_D_SEQ:
        for (int i = 0; i < st->n_subs; i++) {
            int rc = apply(&st->subs[i], cur);
            if (rc)
                return rc;
        }
        return 0;
    case TOK_D_BYTELEVEL: dec_bytelevel(cur, &out); break;
    case TOK_D_BYTEFALLBACK: dec_bytefallback(cur, &out); break;
    case TOK_D_METASPACE: dec_metaspace(st, cur, &out); break;
    case TOK_D_STRIP: dec_strip(st, cur, &out); break;
    case TOK_D_WORDPIECE: dec_wordpiece(st, cur, &out); break;
    case TOK_D_FUSE: {
        struct tok_buf all = {0};
        for (size_t i = 0; i < TOK_N(cur); i++)
            tok_buf_add(&all, TOK_AT(cur, i), TOK_LEN(cur, i));
        toks_add(&out, all.p ? all.p : "", all.n);
        tok_buf_free(&all);
        break;
    }
    case TOK_D_REPLACE: {
        struct tok_step r = *st;
        struct tok_buf o = {0};
        r.kind = TOK_N_REPLACE;
        for (size_t i = 0; i < TOK_N(cur); i++) {
            tok_normalize(NULL, &r, TOK_AT(cur, i), TOK_LEN(cur, i), &o);
            toks_add(&out, o.p ? o.p : "", o.n);
        }
        tok_buf_free(&o);
        break;
    }
    default:
        return 0;
    }
    int oom = out.buf.oom || out.sp.oom;
    toks_free(cur);
    *cur = out;
    return oom ? -12 : 0;
}

/* Whether id is one of keep[n_keep] (a handful of preserved tokens: a scan is enough). */
static int kept(int32_t id, const int32_t *keep, size_t n_keep)
{
    for (size_t k = 0; k < n_keep; k++)
        if (keep[k] == id)
            return 1;
    return 0;
}

int tok_decode_ids(const struct kwk_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                   struct tok_buf *out)
{
    return tok_decode_keep(t, ids, n, skip_special, NULL, 0, out);
}

int tok_decode_keep(const struct kwk_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                    const int32_t *keep, size_t n_keep, struct tok_buf *out)
{
    struct toks l = {0};
    int rc = 0;
    out->n = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            rc = KWK_ERANGE;
            goto done;
        }
        if (!t->pieces[id] ||
            (skip_special && (t->attr[id] & TOK_ATTR_SPECIAL) && !kept(id, keep, n_keep)))
            continue;
        toks_add(&l, t->pieces[id], t->piece_lens[id]);
    }
    if (l.buf.oom || l.sp.oom) {
        rc = -12;
        goto done;
    }
    if (t->decoder.kind == TOK_NONE) {
        struct tok_buf j = {0};
        for (size_t i = 0; i < TOK_N(&l); i++) {
            if (i)
                tok_buf_addc(&j, ' ');
            tok_buf_add(&j, TOK_AT(&l, i), TOK_LEN(&l, i));
        }
        tok_utf8_sanitize(j.p ? j.p : "", j.n, out);
        tok_buf_free(&j);
    } else {
        rc = apply(&t->decoder, &l);
        if (rc)
            goto done;
        struct tok_buf j = {0};
        for (size_t i = 0; i < TOK_N(&l); i++)
            tok_buf_add(&j, TOK_AT(&l, i), TOK_LEN(&l, i));
        tok_utf8_sanitize(j.p ? j.p : "", j.n, out);
        tok_buf_free(&j);
    }
    if (!out->p)
        tok_buf_add(out, "", 0);
    if (out->oom)
        rc = -12;
done:
    toks_free(&l);
    return rc;
}

/* One token through the decoder chain as if it stood in the middle of a text: what a grammar
 * must see of it (kwk_tokenizer_token_bytes). Bytes stay raw: no U+FFFD repair, since a
 * byte-level token may hold part of a character that the next token completes. Strip and Fuse
 * act on a whole text (after Fuse the text is one piece), so they do nothing here. */
static void piece_bytes(const struct tok_step *st, struct tok_buf *cur)
{
    struct tok_buf out = {0};
    const char *s = cur->p ? cur->p : "";
    size_t n = cur->n;
    switch (st->kind) {
    case TOK_D_SEQ:
        for (int i = 0; i < st->n_subs; i++)
            piece_bytes(&st->subs[i], cur);
        return;
    case TOK_D_BYTELEVEL:
        for (size_t k = 0; k < n;) {
            uint32_t cp;
            k += tok_utf8_next(s + k, n - k, &cp);
            int b = tok_cp_to_byte(cp);
            if (b < 0) { /* not a byte-level piece (an added token): kept as it is */
                out.n = 0;
                tok_buf_add(&out, s, n);
                break;
            }
            tok_buf_addc(&out, (char)b);
        }
        break;
    case TOK_D_BYTEFALLBACK: {
        int b = byte_token(s, n);
        if (b < 0)
            return;
        tok_buf_addc(&out, (char)b);
        break;
    }
    case TOK_D_METASPACE:
        for (size_t k = 0; k < n;) {
            if (st->content_len && n - k >= st->content_len &&
                !memcmp(s + k, st->content, st->content_len)) {
                tok_buf_addc(&out, ' ');
                k += st->content_len;
            } else {
                tok_buf_addc(&out, s[k++]);
            }
        }
        break;
    case TOK_D_REPLACE: {
        struct tok_step r = *st;
        r.kind = TOK_N_REPLACE;
        tok_normalize(NULL, &r, s, n, &out);
        break;
    }
    case TOK_D_WORDPIECE:
        if (n >= st->content_len && !memcmp(s, st->content, st->content_len)) {
            tok_buf_add(&out, s + st->content_len, n - st->content_len);
        } else {
            tok_buf_addc(&out, ' ');
            tok_buf_add(&out, s, n);
        }
        break;
    default: /* Strip, Fuse: whole-text steps */
        return;
    }
    if (!out.p)
        tok_buf_add(&out, "", 0);
    if (out.oom)
        cur->oom = 1;
    tok_buf_free(cur);
    *cur = out;
}

int kwk_tokenizer_token_bytes(const kwk_tokenizer *t, int32_t id, char *buf, size_t cap,
                              size_t *len)
{
    if (!t || !len || (!buf && cap))
        return KWK_EARG;
    if (id < 0 || id >= t->n_vocab || !t->pieces[id])
        return KWK_ERANGE;
    struct tok_buf cur = {0};
    tok_buf_add(&cur, t->pieces[id], t->piece_lens[id]);
    if (t->decoder.kind == TOK_NONE) {
        /* no decoder: Hugging Face joins the pieces with spaces */
        struct tok_buf sp = {0};
        tok_buf_addc(&sp, ' ');
        tok_buf_add(&sp, cur.p ? cur.p : "", cur.n);
        tok_buf_free(&cur);
        cur = sp;
    } else {
        piece_bytes(&t->decoder, &cur);
    }
    int rc = cur.oom ? -ENOMEM : 0;
    if (!rc) {
        *len = cur.n;
        if (cur.n > cap)
            rc = KWK_ELIMIT;
        else if (cur.n)
            memcpy(buf, cur.p, cur.n);
    }
    tok_buf_free(&cur);
    return rc;
}
