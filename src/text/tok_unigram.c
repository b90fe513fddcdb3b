/* tok_unigram.c - the Unigram model (SentencePiece unigram as HF's Unigram runs it): Viterbi
 * over all vocabulary pieces of a word, unknown characters scored min_score - 10 and fused,
 * optional byte fallback. Any thread. */
#include <float.h>
#include <string.h>

#include "text/tokenizer.h"

#define UNK_PENALTY 10.0

int tok_unigram_word(const struct kwk_tokenizer *t, const char *w, size_t n,
                     struct tok_ids *out)
{
    if (n == 0)
        return 0;
    double *best = kwk_malloc((n + 1) * sizeof *best);
    int32_t *from = kwk_malloc((n + 1) * sizeof *from); /* start byte of the best last piece */
    int32_t *tok = kwk_malloc((n + 1) * sizeof *tok);   /* its id, -2 for an unknown char */
    int rc = 0;
    if (!best || !from || !tok) {
        rc = -12;
        goto out;
    }
    /* A position is reached once any path ends there, whatever its score: the first path
     * found is kept unless a later one scores strictly more (HF's lattice does the same, so
     * scores that sum to -inf still give its path, and the walk back only follows set links). */
    double unk_score = t->min_score - UNK_PENALTY;
    for (size_t i = 0; i <= n; i++) {
        best[i] = -DBL_MAX;
        from[i] = -1;
    }
    best[0] = 0;
    from[0] = 0;
    for (size_t i = 0; i < n;) {
        size_t cl = tok_utf8_len((uint8_t)w[i]);
        cl = KWK_MIN(cl, n - i);
        if (from[i] >= 0) {
            int single = 0;
            for (size_t j = i + 1; j <= n && j - i <= t->max_piece_len; j++) {
                int32_t id = tok_map_get(&t->vocab, w + i, j - i);
                if (id < 0 || (t->attr[id] & TOK_ATTR_ADDED))
                    continue;
                if (j == i + cl)
                    single = 1;
                double s = best[i] + t->scores[id];
                if (from[j] < 0 || s > best[j]) {
                    best[j] = s;
                    from[j] = (int32_t)i;
                    tok[j] = id;
                }
            }
            if (!single) {
                double s = best[i] + unk_score;
                if (from[i + cl] < 0 || s > best[i + cl]) {
                    best[i + cl] = s;
                    from[i + cl] = (int32_t)i;
                    tok[i + cl] = -2;
                }
            }
        }
        i += cl;
    }
    if (from[n] < 0) /* cannot happen: every character boundary is reached (a piece or unk) */
        goto out;
    /* Walk back, then emit forwards; unknown runs fuse into one unk (or bytes). */
    size_t count = 0;
    for (size_t j = n; j > 0; j = (size_t)from[j])
        count++;
    int32_t *seq = kwk_malloc(count * 2 * sizeof *seq);
    if (!seq) {
        rc = -12;
        goto out;
    }
    size_t k = count;
    for (size_t j = n; j > 0; j = (size_t)from[j]) {
        k--;
        seq[2 * k] = tok[j];
        seq[2 * k + 1] = from[j];
    }
    for (size_t i = 0; i < count; i++) {
        if (seq[2 * i] != -2) {
            tok_ids_push(out, seq[2 * i]);
            continue;
        }
        size_t a = (size_t)seq[2 * i + 1], b = i + 1 < count ? (size_t)seq[2 * i + 3] : n;
        if (t->byte_fallback) {
            int ok = 1;
            for (size_t x = a; x < b; x++)
                ok &= t->fallback_ids[(uint8_t)w[x]] >= 0;
            if (ok) {
                for (size_t x = a; x < b; x++)
                    tok_ids_push(out, t->fallback_ids[(uint8_t)w[x]]);
                continue;
            }
        }
        if (t->unk_id >= 0 && !(out->n && out->p[out->n - 1] == t->unk_id && i > 0 &&
                                seq[2 * (i - 1)] == -2))
            tok_ids_push(out, t->unk_id);
    }
    kwk_free(seq);
    if (out->oom)
        rc = -12;
out:
    kwk_free(best);
    kwk_free(from);
    kwk_free(tok);
    return rc;
}
