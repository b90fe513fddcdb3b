/* tok_detok.c - the incremental detokenizer for streaming. One kwk_detok per stream (one
 * thread at a time); the tokenizer it reads may be shared. */
#include <errno.h>
#include <string.h>

#include "text/tokenizer.h"

/* Hugging Face's DecodeStream scheme: decode a short window of recent ids, emit what grew past
 * the window's previous text once it does not end in U+FFFD (an unfinished character). */
struct kwk_detok {
    const kwk_tokenizer *t;
    int skip_special;
    struct tok_ids ids;   /* the window */
    size_t prefix_index;  /* ids[0..prefix_index) decode to prefix */
    struct tok_buf prefix;
    struct tok_buf text;  /* scratch: decode of the window */
    struct tok_buf piece; /* what the last call returned */
    struct tok_ids keep;  /* preserved special tokens: decoded even with skip_special */
};

kwk_detok *kwk_detok_new(const kwk_tokenizer *t, int skip_special)
{
    if (!t)
        return NULL;
    kwk_detok *d = kwk_calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->t = t;
    d->skip_special = skip_special;
    return d;
}

void kwk_detok_free(kwk_detok *d)
{
    if (!d)
        return;
    tok_ids_free(&d->ids);
    tok_buf_free(&d->prefix);
    tok_buf_free(&d->text);
    tok_buf_free(&d->piece);
    tok_ids_free(&d->keep);
    kwk_free(d);
}

int kwk_detok_preserve(kwk_detok *d, const int32_t *ids, int n)
{
    if (!d || n < 0 || (n && !ids))
        return KWK_EARG;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < d->t->n_vocab)
            tok_ids_push(&d->keep, ids[i]);
    return d->keep.oom ? -ENOMEM : 0;
}

/* The window's ids[0..n) decoded as this stream decodes them. */
static int window_decode(kwk_detok *d, size_t n, struct tok_buf *out)
{
    return tok_decode_keep(d->t, d->ids.p, n, d->skip_special, d->keep.p, d->keep.n, out);
}

static int ends_with_fffd(const struct tok_buf *b)
{
    return b->n >= 3 && !memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3);
}

int kwk_detok_push(kwk_detok *d, int32_t id, const char **piece, size_t *len)
{
    if (!d || !piece || !len)
        return KWK_EARG;
    *piece = "";
    *len = 0;
    if (id < 0 || id >= d->t->n_vocab)
        return KWK_ERANGE;
    tok_ids_push(&d->ids, id);
    if (d->ids.oom)
        return -ENOMEM;
    int rc = window_decode(d, d->ids.n, &d->text);
    if (rc)
        return rc;
    if (d->text.n <= d->prefix.n || ends_with_fffd(&d->text))
        return 0;
    if (memcmp(d->text.p, d->prefix.p ? d->prefix.p : "", d->prefix.n))
        return KWK_ERUNTIME; /* the decoder rewrote earlier text: cannot stream it */
    d->piece.n = 0;
    tok_buf_add(&d->piece, d->text.p + d->prefix.n, d->text.n - d->prefix.n);
    /* The new window starts at the previous read point. */
    size_t keep = d->prefix_index;
    memmove(d->ids.p, d->ids.p + keep, (d->ids.n - keep) * sizeof *d->ids.p);
    d->ids.n -= keep;
    d->prefix_index = d->ids.n;
    rc = window_decode(d, d->ids.n, &d->prefix);
    if (rc)
        return rc;
    if (d->piece.oom || d->prefix.oom)
        return -ENOMEM;
    *piece = d->piece.p;
    *len = d->piece.n;
    return 0;
}

int kwk_detok_flush(kwk_detok *d, const char **piece, size_t *len)
{
    if (!d || !piece || !len)
        return KWK_EARG;
    *piece = "";
    *len = 0;
    int rc = window_decode(d, d->ids.n, &d->text);
    if (rc)
        return rc;
    if (d->text.n <= d->prefix.n)
        return 0;
    if (memcmp(d->text.p, d->prefix.p ? d->prefix.p : "", d->prefix.n))
        return KWK_ERUNTIME;
    d->piece.n = 0;
    tok_buf_add(&d->piece, d->text.p + d->prefix.n, d->text.n - d->prefix.n);
    if (d->piece.oom)
        return -ENOMEM;
    d->ids.n = 0;
    d->prefix_index = 0;
    d->prefix.n = 0;
    *piece = d->piece.p;
    *len = d->piece.n;
    return 0;
}
