/* tok_encode.c - the encode pipeline: U+FFFD repair, added tokens (two passes: as written, then
 * normalized), normalizer, pre-tokenizer, model, post-processor, and byte offsets when the text
 * was not rewritten. Any thread: all state is per call (plus the tokenizer's locked cache). */
#include <errno.h>
#include <string.h>

#include "text/tokenizer.h"

void tok_scratch_free(struct tok_scratch *s)
{
    tok_buf_free(&s->norm);
    tok_buf_free(&s->a);
    tok_buf_free(&s->b);
    tok_ids_free(&s->spans_a);
    tok_ids_free(&s->spans_b);
    tok_ids_free(&s->syms);
    tok_ids_free(&s->tmp);
    kwk_free(s->cache);
    tok_buf_free(&s->cache_keys);
    tok_ids_free(&s->cache_ids);
}

static int is_word_char(uint32_t cp)
{
    return cp == '_' || tok_is_alnum(cp);
}

static uint32_t last_cp(const char *s, size_t n)
{
    size_t k = n - 1;
    while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80)
        k--;
    uint32_t cp;
    tok_utf8_next(s + k, n - k, &cp);
    return cp;
}

/* The longest added token of one class (normalized or not) matching at s[i], or NULL. */
static const struct tok_added *match_at(const struct kwk_tokenizer *t, const char *s, size_t n,
                                        size_t i, int norm)
{
    uint8_t b = (uint8_t)s[i];
    const int32_t *first = norm ? t->added_norm_first : t->added_first;
    for (int32_t k = first[b]; k < first[b + 1]; k++) {
        const struct tok_added *a = norm ? &t->added[t->added_norm_order[k]] : &t->added[k];
        const char *c = norm ? a->norm : a->content;
        size_t l = norm ? a->norm_len : a->len;
        if (a->normalized != norm || l == 0 || l > n - i || memcmp(s + i, c, l))
            continue;
        if (a->single_word) {
            if (i > 0 && is_word_char(last_cp(s, i)))
                continue;
            uint32_t cp;
            if (i + l < n && (tok_utf8_next(s + i + l, n - i - l, &cp), is_word_char(cp)))
                continue;
        }
        return a;
    }
    return NULL;
}

struct enc {
    const struct kwk_tokenizer *t;
    struct tok_scratch s;
    struct tok_ids ids;
    int want_offsets; /* fill offs with (start, end) byte pairs per id */
    int offsets_lost; /* a step rewrote the text: offsets cannot be given */
    struct tok_ids offs;
};

/* Bytes of the input a model token covers (offsets): byte-level pieces are one byte per
 * character; others are their text less a continuation prefix; unknown tokens cover the rest. */
static size_t token_bytes(const struct kwk_tokenizer *t, int32_t id, int first, size_t rest)
{
    const char *p = t->pieces[id];
    size_t n = t->piece_lens[id];
    if (id == t->unk_id || !p)
        return rest;
    if (t->byte_level && t->model == TOK_MODEL_BPE) {
        size_t chars = 0;
        for (size_t i = 0; i < n; i += tok_utf8_len((uint8_t)p[i]))
            chars++;
        return chars;
    }
    if (n == 6 && !memcmp(p, "<0x", 3) && p[5] == '>')
        return 1;
    if (!first && t->cont_prefix && n >= t->cont_prefix_len &&
        !memcmp(p, t->cont_prefix, t->cont_prefix_len))
        n -= t->cont_prefix_len;
    return n;
}

static void piece_offsets(struct enc *e, size_t k0, int32_t origin, size_t len, size_t base)
{
    if (origin == TOK_NO_ORIGIN) {
        e->offsets_lost = 1;
        return;
    }
    /* A prefix space added by ByteLevel has origin - 1: clamp tokens into the real text. */
    int64_t pos = origin, lo = origin < 0 ? 0 : origin, hi = (int64_t)origin + (int64_t)len;
    for (size_t k = k0; k < e->ids.n; k++) {
        int64_t end = pos + (int64_t)token_bytes(e->t, e->ids.p[k], k == k0,
                                                 (size_t)(hi - pos > 0 ? hi - pos : 0));
        int64_t a = KWK_MAX(KWK_MIN(pos, hi), lo), b = KWK_MAX(KWK_MIN(end, hi), lo);
        tok_ids_push(&e->offs, (int32_t)(base + (size_t)a));
        tok_ids_push(&e->offs, (int32_t)(base + (size_t)b));
        pos = end;
    }
}

static int model_pieces(struct enc *e, const char *text, size_t n, int first, size_t base)
{
    const struct kwk_tokenizer *t = e->t;
    struct tok_buf *buf;
    struct tok_ids *spans;
    int rc = tok_pretokenize(t, &e->s, text, n, first, &buf, &spans);
    for (size_t i = 0; !rc && i + 2 < spans->n; i += 3) {
        const char *w = buf->p + spans->p[i];
        size_t wl = (size_t)spans->p[i + 1], k0 = e->ids.n;
        switch (t->model) {
        case TOK_MODEL_BPE: rc = tok_bpe_word(t, &e->s, w, wl, &e->ids); break;
        case TOK_MODEL_WORDPIECE: rc = tok_wordpiece_word(t, w, wl, &e->ids); break;
        case TOK_MODEL_UNIGRAM: rc = tok_unigram_word(t, w, wl, &e->ids); break;
        default: {
            int32_t id = tok_map_get(&t->vocab, w, wl);
            if (id < 0)
                id = t->unk_id;
            if (id >= 0)
                tok_ids_push(&e->ids, id);
        }
        }
        if (e->want_offsets)
            piece_offsets(e, k0, spans->p[i + 2], wl, base);
    }
    return rc;
}

/* Split text on added tokens of one class; plain stretches go to the next stage. base is the
 * byte offset of s in the (repaired) input, for offsets. */
static int split_added(struct enc *e, const char *s, size_t n, int norm, int first, size_t base);

static int plain_segment(struct enc *e, const char *s, size_t n, int norm, int first,
                         size_t base)
{
    if (n == 0)
        return 0;
    if (norm)
        return model_pieces(e, s, n, first, base);
    struct tok_buf nb = {0};
    int rc = tok_normalize(e->t, &e->t->normalizer, s, n, &nb);
    if (!rc && e->want_offsets && (nb.n != n || memcmp(nb.p, s, n)))
        e->offsets_lost = 1;
    if (!rc)
        rc = e->t->has_normalized_added ? split_added(e, nb.p, nb.n, 1, first, base)
                                        : model_pieces(e, nb.p, nb.n, first, base);
    tok_buf_free(&nb);
    return rc;
}

static int split_added(struct enc *e, const char *s, size_t n, int norm, int first, size_t base)
{
    const struct kwk_tokenizer *t = e->t;
    size_t prev = 0, i = 0;
    int rc = 0;
    while (i < n && !rc) {
        const struct tok_added *a = NULL;
        uint8_t b = (uint8_t)s[i];
        const int32_t *f = norm ? t->added_norm_first : t->added_first;
        if (f[b] < f[b + 1])
            a = match_at(t, s, n, i, norm);
        if (!a) {
            i++;
            continue;
        }
        size_t start = i, stop = i + (norm ? a->norm_len : a->len);
        if (a->lstrip)
            while (start > prev) {
                size_t k = start - 1;
                while (k > prev && ((uint8_t)s[k] & 0xC0) == 0x80)
                    k--;
                uint32_t cp;
                tok_utf8_next(s + k, start - k, &cp);
                if (!tok_is_whitespace(cp))
                    break;
                start = k;
            }
        if (a->rstrip)
            while (stop < n) {
                uint32_t cp;
                size_t l = tok_utf8_next(s + stop, n - stop, &cp);
                if (!tok_is_whitespace(cp))
                    break;
                stop += l;
            }
        rc = plain_segment(e, s + prev, start - prev, norm, first && prev == 0, base + prev);
        tok_ids_push(&e->ids, a->id);
        if (e->want_offsets) {
            tok_ids_push(&e->offs, (int32_t)(base + i));
            tok_ids_push(&e->offs, (int32_t)(base + i + (norm ? a->norm_len : a->len)));
        }
        prev = i = stop;
    }
    if (!rc)
        rc = plain_segment(e, s + prev, n - prev, norm, first && prev == 0, base + prev);
    return rc;
}

static void post_process(const struct tok_step *st, struct tok_ids *ids, struct tok_ids *offs)
{
    if (st->kind == TOK_PP_SEQ) {
        for (int i = 0; i < st->n_subs; i++)
            post_process(&st->subs[i], ids, offs);
        return;
    }
    if (st->kind != TOK_PP_TEMPLATE)
        return;
    struct tok_ids out = {0}, oo = {0};
    for (int i = 0; i < st->n_tmpl; i++) {
        if (st->tmpl[i] >= 0) {
            tok_ids_push(&out, st->tmpl[i]);
            if (offs) {
                tok_ids_push(&oo, 0);
                tok_ids_push(&oo, 0);
            }
            continue;
        }
        for (size_t k = 0; k < ids->n; k++) {
            tok_ids_push(&out, ids->p[k]);
            if (offs) {
                tok_ids_push(&oo, offs->p[2 * k]);
                tok_ids_push(&oo, offs->p[2 * k + 1]);
            }
        }
    }
    if (out.oom || oo.oom) {
        tok_ids_free(&out);
        tok_ids_free(&oo);
        ids->oom = 1;
        return;
    }
    tok_ids_free(ids);
    *ids = out;
    if (offs) {
        tok_ids_free(offs);
        *offs = oo;
    } else {
        tok_ids_free(&oo);
    }
}

static int encode(const kwk_tokenizer *t, const char *text, size_t len, int add_special,
                  struct tok_ids *ids, struct tok_ids *offs)
{
    struct enc e = {.t = t, .want_offsets = offs != NULL};
    struct tok_buf clean = {0};
    int rc = 0;
    if (!t || (!text && len))
        return KWK_EARG;
    if (len > (size_t)INT32_MAX / 2)
        return KWK_ELIMIT;
    tok_utf8_sanitize(text ? text : "", len, &clean);
    if (clean.oom) {
        rc = -ENOMEM;
        goto out;
    }
    if (!clean.p)
        tok_buf_add(&clean, "", 0);
    rc = split_added(&e, clean.p, clean.n, 0, 1, 0);
    if (!rc && offs && e.offsets_lost)
        rc = KWK_EUNSUPPORTED;
    if (!rc && add_special)
        post_process(&t->post, &e.ids, offs ? &e.offs : NULL);
    if (!rc && (e.ids.oom || e.offs.oom))
        rc = -ENOMEM;
out:
    tok_buf_free(&clean);
    tok_scratch_free(&e.s);
    if (rc) {
        tok_ids_free(&e.ids);
        tok_ids_free(&e.offs);
    } else {
        *ids = e.ids;
        if (offs)
            *offs = e.offs;
    }
    return rc;
}

int kwk_tokenizer_encode(const kwk_tokenizer *t, const char *text, size_t len, int add_special,
                         int32_t *ids, size_t cap, size_t *n)
{
    struct tok_ids v = {0};
    int rc = encode(t, text, len, add_special, &v, NULL);
    if (rc)
        return rc;
    if (ids && cap)
        memcpy(ids, v.p, KWK_MIN(cap, v.n) * sizeof *ids);
    if (n)
        *n = v.n;
    rc = v.n > cap ? KWK_ELIMIT : 0;
    tok_ids_free(&v);
    return rc;
}

int kwk_tokenizer_encode_alloc(const kwk_tokenizer *t, const char *text, size_t len,
                               int add_special, int32_t **ids, size_t *n)
{
    struct tok_ids v = {0};
    if (!ids || !n)
        return KWK_EARG;
    *ids = NULL;
    *n = 0;
    int rc = encode(t, text, len, add_special, &v, NULL);
    if (rc)
        return rc;
    if (!v.p && !(v.p = kwk_malloc(sizeof *v.p)))
        return -ENOMEM;
    *ids = v.p;
    *n = v.n;
    return 0;
}

int kwk_tokenizer_encode_offsets(const kwk_tokenizer *t, const char *text, size_t len,
                                 int add_special, int32_t **ids, uint32_t **offsets, size_t *n)
{
    struct tok_ids v = {0}, o = {0};
    if (!ids || !offsets || !n)
        return KWK_EARG;
    *ids = NULL;
    *offsets = NULL;
    *n = 0;
    int rc = encode(t, text, len, add_special, &v, &o);
    if (rc)
        return rc;
    if (!v.p)
        v.p = kwk_malloc(sizeof *v.p);
    if (!o.p)
        o.p = kwk_malloc(sizeof *o.p);
    if (!v.p || !o.p || o.n != 2 * v.n) {
        tok_ids_free(&v);
        tok_ids_free(&o);
        return -ENOMEM;
    }
    *ids = v.p;
    *offsets = (uint32_t *)o.p;
    *n = v.n;
    return 0;
}
