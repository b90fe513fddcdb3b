/* tok_pair.c - two texts as one sequence (cross-encoders, rerankers): the pair form resolved
 * from the post-processor at load, Hugging Face's "longest_first" truncation, and
 * kwk_tokenizer_encode_pair. Any thread: a loaded tokenizer is read only. */
#include <errno.h>
#include <string.h>

#include "text/tokenizer.h"

int tok_pair_set(struct kwk_tokenizer *t, const struct tok_piece *p, int n)
{
    struct tok_piece *copy = kwk_malloc((size_t)(n > 0 ? n : 1) * sizeof *copy);
    if (!copy)
        return -ENOMEM;
    if (n > 0)
        memcpy(copy, p, (size_t)n * sizeof *p);
    kwk_free(t->pair);
    t->pair = copy;
    t->n_pair = n;
    return 0;
}

/* Steps that add tokens (Template, Bert, Roberta all parse to TOK_PP_TEMPLATE); *last is the
 * last one seen. ByteLevel and empty Sequences add none. */
static int count_adders(const struct tok_step *st, const struct tok_step **last)
{
    int n = 0;
    if (st->kind == TOK_PP_SEQ)
        for (int i = 0; i < st->n_subs; i++)
            n += count_adders(&st->subs[i], last);
    if (st->kind == TOK_PP_TEMPLATE) {
        *last = st;
        n = 1;
    }
    return n;
}

int tok_pair_resolve(struct kwk_tokenizer *t)
{
    static const struct tok_piece plain[] = {{TOK_PAIR_A, 0}, {TOK_PAIR_B, 1}};
    const struct tok_step *adder = NULL;
    if (t->pair)
        return 0;
    int n = count_adders(&t->post, &adder);
    /* Nothing adds tokens: tokenizers merges the two encodings, whose type ids are 0 and 1. */
    if (n == 0)
        return tok_pair_set(t, plain, (int)KWK_ARRAY_LEN(plain));
    /* Two token-adding steps in a Sequence make tokenizers wrap each part separately (or
     * panic, for two templates): no real file does it, and it is refused here. */
    if (n == 1 && adder->pair)
        return tok_pair_set(t, adder->pair, adder->n_pair);
    return 0;
}

/* Hugging Face tokenizers' LongestFirst truncation of a pair to budget tokens (its
 * utils/truncation.rs): the shorter text keeps what it has while the longer fits in the rest,
 * else both get half (the longer, or b when they tie, the odd one). */
static void truncate_longest_first(size_t *na, size_t *nb, size_t budget)
{
    if (*na + *nb <= budget)
        return;
    int swap = *na > *nb;
    size_t n1 = swap ? *nb : *na, n2;
    n2 = n1 > budget ? n1 : KWK_MAX(n1, budget - n1);
    if (n1 + n2 > budget) {
        n1 = budget / 2;
        n2 = n1 + budget % 2;
    }
    *na = KWK_MIN(*na, swap ? n2 : n1);
    *nb = KWK_MIN(*nb, swap ? n1 : n2);
}

static int n_specials(const struct kwk_tokenizer *t)
{
    int n = 0;
    for (int i = 0; i < t->n_pair; i++)
        n += t->pair[i].id >= 0;
    return n;
}

/* The pair form filled in: each special token, or a text's first n ids, with its type id. */
static void join(const struct kwk_tokenizer *t, const int32_t *a, size_t na, const int32_t *b,
                 size_t nb, int32_t *ids, int32_t *types)
{
    size_t k = 0;
    for (int i = 0; i < t->n_pair; i++) {
        const struct tok_piece *p = &t->pair[i];
        const int32_t *src = p->id == TOK_PAIR_A ? a : p->id == TOK_PAIR_B ? b : &p->id;
        size_t n = p->id == TOK_PAIR_A ? na : p->id == TOK_PAIR_B ? nb : 1;
        if (n)
            memcpy(ids + k, src, n * sizeof *ids);
        for (size_t j = 0; types && j < n; j++)
            types[k + j] = p->type_id;
        k += n;
    }
}

/* Tokens the joined pair holds (texts named twice by a template count twice), or SIZE_MAX
 * past what a size_t counts. */
static size_t joined_len(const struct kwk_tokenizer *t, size_t na, size_t nb)
{
    size_t n = 0;
    for (int i = 0; i < t->n_pair; i++) {
        size_t add = t->pair[i].id == TOK_PAIR_A ? na : t->pair[i].id == TOK_PAIR_B ? nb : 1;
        if (add > SIZE_MAX / sizeof(int32_t) - n)
            return SIZE_MAX;
        n += add;
    }
    return n;
}

int kwk_tokenizer_join_pair(const kwk_tokenizer *t, const int32_t *a, size_t na,
                            const int32_t *b, size_t nb, size_t max_tokens, int32_t **ids,
                            int32_t **types, size_t *n)
{
    int32_t *out = NULL, *out_types = NULL;
    if (!t || !ids || !n || (!a && na) || (!b && nb))
        return KWK_EARG;
    *ids = NULL;
    *n = 0;
    if (types)
        *types = NULL;
    if (!t->pair)
        return KWK_EUNSUPPORTED;
    size_t specials = (size_t)n_specials(t);
    if (max_tokens && max_tokens < specials)
        return KWK_ELIMIT; /* tokenizers then leaves the pair whole, longer than asked */
    if (max_tokens)
        truncate_longest_first(&na, &nb, max_tokens - specials);
    size_t total = joined_len(t, na, nb);
    /* a template naming a text twice (no real one does) outgrows the budget, which counts each
     * text once, as tokenizers' does; its longer pair would break the caller's bound */
    if (total == SIZE_MAX || (max_tokens && total > max_tokens))
        return KWK_ELIMIT;
    out = kwk_malloc((total ? total : 1) * sizeof *out);
    out_types = types ? kwk_malloc((total ? total : 1) * sizeof *out_types) : NULL;
    if (!out || (types && !out_types)) {
        kwk_free(out);
        kwk_free(out_types);
        return -ENOMEM;
    }
    join(t, a, na, b, nb, out, out_types);
    *ids = out;
    if (types)
        *types = out_types;
    *n = total;
    return 0;
}

int kwk_tokenizer_encode_pair(const kwk_tokenizer *t, const char *a, size_t na, const char *b,
                              size_t nb, size_t max_tokens, int32_t **ids, int32_t **types,
                              size_t *n)
{
    int32_t *ia = NULL, *ib = NULL;
    size_t la = 0, lb = 0;
    if (!t || !ids || !n || (!a && na) || (!b && nb))
        return KWK_EARG;
    *ids = NULL;
    *n = 0;
    if (types)
        *types = NULL;
    if (!t->pair)
        return KWK_EUNSUPPORTED;
    if (max_tokens && max_tokens < (size_t)n_specials(t))
        return KWK_ELIMIT; /* before encoding anything */
    int rc = kwk_tokenizer_encode_alloc(t, a ? a : "", na, 0, &ia, &la);
    if (!rc)
        rc = kwk_tokenizer_encode_alloc(t, b ? b : "", nb, 0, &ib, &lb);
    if (!rc)
        rc = kwk_tokenizer_join_pair(t, ia, la, ib, lb, max_tokens, ids, types, n);
    kwk_free(ia);
    kwk_free(ib);
    return rc;
}
