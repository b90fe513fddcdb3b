/* tok_pretok.c - pre-tokenizers of tokenizer.json (ByteLevel, Split, Metaspace,
 * BertPreTokenizer, Whitespace, WhitespaceSplit, Punctuation, Digits, Sequence): they cut a
 * normalized text into pieces with HF's split behaviours. Any thread (scratch is per call). */
#include <string.h>

#include "text/tokenizer.h"

/* A list of pieces: bytes in buf, (offset, length) pairs in spans. */
struct pieces {
    struct tok_buf *buf;
    struct tok_ids *spans;
};

struct seg {
    size_t a, b;
    int m;
};

struct segs {
    struct seg *p;
    size_t n, cap;
    int oom;
};

static void segs_push(struct segs *s, size_t a, size_t b, int m)
{
    if (s->oom || a == b)
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        struct seg *p = kwk_realloc(s->p, cap * sizeof *p);
        if (!p) {
            s->oom = 1;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (struct seg){a, b, m};
}

/* Pieces are (offset, length, origin) triples; origin is the piece's byte offset in the text
 * given to tok_pretokenize, or TOK_NO_ORIGIN when a step rewrote it (Metaspace). */
static void emit(struct pieces *out, const char *s, size_t n, int32_t origin)
{
    if (n == 0)
        return;
    tok_ids_push(out->spans, (int32_t)out->buf->n);
    tok_ids_push(out->spans, (int32_t)n);
    tok_ids_push(out->spans, origin);
    tok_buf_add(out->buf, s, n);
}

static int32_t at(int32_t o0, size_t a)
{
    return o0 == TOK_NO_ORIGIN ? TOK_NO_ORIGIN : o0 + (int32_t)a;
}

/* Find matches of a regex over s[0..n) (empty matches ignored), as segments. */
static int find_regex(pcre2_code *re, pcre2_match_data *md, const char *s, size_t n,
                      struct segs *sg)
{
    size_t at = 0, prev = 0;
    while (at < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return KWK_ELIMIT; /* match limit: pathological pattern */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {
            at = ov[0] + KWK_MIN(tok_utf8_len((uint8_t)s[ov[0] < n ? ov[0] : n - 1]), n - ov[0]);
            if (ov[0] >= n)
                break;
            continue;
        }
        segs_push(sg, prev, ov[0], 0);
        segs_push(sg, ov[0], ov[1], 1);
        prev = at = ov[1];
    }
    segs_push(sg, prev, n, 0);
    return 0;
}

static void find_literal(const char *pat, size_t pn, const char *s, size_t n, struct segs *sg)
{
    size_t i = 0, prev = 0;
    while (pn && i + pn <= n) {
        const char *hit = memmem(s + i, n - i, pat, pn);
        if (!hit)
            break;
        size_t a = (size_t)(hit - s);
        segs_push(sg, prev, a, 0);
        segs_push(sg, a, a + pn, 1);
        prev = i = a + pn;
    }
    segs_push(sg, prev, n, 0);
}

/* Every character satisfying pred is its own match. */
static void find_chars(int (*pred)(uint32_t), const char *s, size_t n, struct segs *sg)
{
    size_t i = 0, prev = 0;
    while (i < n) {
        uint32_t cp;
        size_t l = tok_utf8_next(s + i, n - i, &cp);
        if (pred(cp)) {
            segs_push(sg, prev, i, 0);
            segs_push(sg, i, i + l, 1);
            prev = i + l;
        }
        i += l;
    }
    segs_push(sg, prev, n, 0);
}

/* Apply a split behaviour (HF SplitDelimiterBehavior) to the segments and emit the pieces. */
static void apply_behavior(int behavior, int invert, const char *s, int32_t o0, struct segs *sg,
                           struct pieces *out)
{
    size_t n = sg->n, k = 0;
    if (invert)
        for (size_t i = 0; i < n; i++)
            sg->p[i].m = !sg->p[i].m;
    struct seg *v = sg->p;
    switch (behavior) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!v[i].m)
                emit(out, s + v[i].a, v[i].b - v[i].a, at(o0, v[i].a));
        return;
    case TOK_SPLIT_ISOLATED:
        break;
    case TOK_SPLIT_PREV: {
        int prev_m = 0;
        for (size_t i = 0; i < n; i++) {
            int m = v[i].m;
            if (m && !prev_m && k > 0)
                v[k - 1].b = v[i].b;
            else
                v[k++] = v[i];
            prev_m = m;
        }
        n = k;
        break;
    }
    case TOK_SPLIT_NEXT: {
        int prev_m = 0;
        k = n;
        for (size_t i = n; i-- > 0;) {
            int m = v[i].m;
            if (m && !prev_m && k < n)
                v[k].a = v[i].a;
            else
                v[--k] = v[i];
            prev_m = m;
        }
        for (size_t i = k; i < n; i++)
            emit(out, s + v[i].a, v[i].b - v[i].a, at(o0, v[i].a));
        return;
    }
    case TOK_SPLIT_CONTIGUOUS: {
        int prev_m = 0;
        for (size_t i = 0; i < n; i++) {
            int m = v[i].m;
            if (m == prev_m && k > 0)
                v[k - 1].b = v[i].b;
            else
                v[k++] = v[i];
            prev_m = m;
        }
        n = k;
        break;
    }
    }
    for (size_t i = 0; i < n; i++)
        emit(out, s + v[i].a, v[i].b - v[i].a, at(o0, v[i].a));
}

static int is_ws(uint32_t c) { return tok_is_whitespace(c); }

struct ctx {
    const struct kwk_tokenizer *t;
    struct segs sg;
    struct tok_buf tmp;
    pcre2_match_data *md; /* one ovector pair is all a split needs */
};

/* Split one piece by one step into out. piece_first: the piece starts the whole input. */
static int split_piece(struct ctx *c, const struct tok_step *st, const char *s, size_t n,
                       int piece_first, int32_t o0, struct pieces *out)
{
    int rc = 0;
    c->sg.n = 0;
    switch (st->kind) {
    case TOK_P_BYTELEVEL:
        if (st->add_prefix_space && (n == 0 || s[0] != ' ')) {
            c->tmp.n = 0;
            tok_buf_addc(&c->tmp, ' ');
            tok_buf_add(&c->tmp, s, n);
            s = c->tmp.p;
            n = c->tmp.n;
            o0 = at(o0, 0) == TOK_NO_ORIGIN ? o0 : o0 - 1; /* the added space has no origin */
        }
        if (!st->use_regex) {
            emit(out, s, n, o0);
            return 0;
        }
        /* The GPT-2 regex is compiled into st->re: split like Split/Isolated. */
        __attribute__((fallthrough));
    case TOK_P_SPLIT: {
        if (st->re) {
            rc = find_regex(st->re, c->md, s, n, &c->sg);
        } else {
            find_literal(st->pat, st->pat_len, s, n, &c->sg);
        }
        if (!rc)
            apply_behavior(st->kind == TOK_P_BYTELEVEL ? TOK_SPLIT_ISOLATED : st->behavior,
                           st->kind == TOK_P_BYTELEVEL ? 0 : st->invert, s, o0, &c->sg, out);
        return rc;
    }
    case TOK_P_METASPACE: {
        c->tmp.n = 0;
        int pre = st->prepend_scheme == TOK_PREPEND_ALWAYS ||
                  (st->prepend_scheme == TOK_PREPEND_FIRST && piece_first);
        int starts = n >= st->content_len && !memcmp(s, st->content, st->content_len);
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ')
                tok_buf_add(&c->tmp, st->content, st->content_len);
            else
                tok_buf_addc(&c->tmp, s[i]);
        }
        if (pre && !starts && !(n > 0 && s[0] == ' ')) {
            struct tok_buf t2 = {0};
            tok_buf_add(&t2, st->content, st->content_len);
            tok_buf_add(&t2, c->tmp.p, c->tmp.n);
            tok_buf_free(&c->tmp);
            c->tmp = t2;
        }
        if (!c->tmp.p)
            tok_buf_add(&c->tmp, "", 0);
        if (!st->split) {
            emit(out, c->tmp.p, c->tmp.n, TOK_NO_ORIGIN);
            return 0;
        }
        find_literal(st->content, st->content_len, c->tmp.p, c->tmp.n, &c->sg);
        apply_behavior(TOK_SPLIT_NEXT, 0, c->tmp.p, TOK_NO_ORIGIN, &c->sg, out);
        return 0;
    }
    case TOK_P_WSPLIT:
        find_chars(is_ws, s, n, &c->sg);
        apply_behavior(TOK_SPLIT_REMOVED, 0, s, o0, &c->sg, out);
        return 0;
    case TOK_P_PUNCT:
        find_chars(tok_is_punct, s, n, &c->sg);
        apply_behavior(st->behavior, 0, s, o0, &c->sg, out);
        return 0;
    case TOK_P_DIGITS:
        find_chars(tok_is_numeric, s, n, &c->sg);
        apply_behavior(st->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0, s, o0,
                       &c->sg, out);
        return 0;
    case TOK_P_WHITESPACE:
    case TOK_P_BERT:
        /* Both are expressed as two steps by the loader; see tok_json.c. */
        emit(out, s, n, o0);
        return 0;
    default:
        emit(out, s, n, o0);
        return 0;
    }
}

/* Apply one (non-sequence) step to every piece of in, into out. */
static int apply_step(struct ctx *c, const struct tok_step *st, int first, struct pieces *in,
                      struct pieces *out)
{
    out->buf->n = 0;
    out->spans->n = 0;
    for (size_t i = 0; i + 2 < in->spans->n; i += 3) {
        size_t off = (size_t)in->spans->p[i], len = (size_t)in->spans->p[i + 1];
        int rc = split_piece(c, st, in->buf->p + off, len, first && off == 0, in->spans->p[i + 2],
                             out);
        if (rc)
            return rc;
        if (c->sg.oom || c->tmp.oom || out->buf->oom || out->spans->oom)
            return -12;
    }
    return 0;
}

static int apply(struct ctx *c, const struct tok_step *st, int first, struct pieces *cur,
                 struct pieces *alt)
{
    if (st->kind == TOK_NONE)
        return 0;
    if (st->kind == TOK_P_SEQ) {
        for (int i = 0; i < st->n_subs; i++) {
            int rc = apply(c, &st->subs[i], first, cur, alt);
            if (rc)
                return rc;
        }
        return 0;
    }
    int rc = apply_step(c, st, first, cur, alt);
    struct pieces tmp = *cur;
    *cur = *alt;
    *alt = tmp;
    return rc;
}

int tok_pretokenize(const struct kwk_tokenizer *t, struct tok_scratch *s, const char *text,
                    size_t n, int first, struct tok_buf **buf, struct tok_ids **spans)
{
    struct ctx c = {.t = t};
    c.md = pcre2_match_data_create(1, NULL);
    if (!c.md)
        return -12;
    struct pieces cur = {&s->a, &s->spans_a}, alt = {&s->b, &s->spans_b};
    cur.buf->n = 0;
    cur.spans->n = 0;
    emit(&cur, text, n, 0);
    int rc = cur.buf->oom || cur.spans->oom ? -12 : apply(&c, &t->pretok, first, &cur, &alt);
    kwk_free(c.sg.p);
    tok_buf_free(&c.tmp);
    pcre2_match_data_free(c.md);
    *buf = cur.buf;
    *spans = cur.spans;
    return rc;
}
