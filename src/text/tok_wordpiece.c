/* tok_wordpiece.c - the WordPiece model: greedy longest-match-first with a continuation
 * prefix ("##"), a whole word becoming [UNK] when any part fails, as HF's WordPiece does.
 * Any thread. */
#include <string.h>

#include "text/tokenizer.h"

int tok_wordpiece_word(const struct kwk_tokenizer *t, const char *w, size_t n,
                       struct tok_ids *out)
{
    size_t n_chars = 0, start = 0, mark = out->n;
    for (size_t i = 0; i < n; i += tok_utf8_len((uint8_t)w[i]))
        n_chars++;
    if (n_chars > (size_t)t->max_chars_per_word)
        goto unk;
    struct tok_buf key = {0};
    while (start < n) {
        size_t end = n;
        int32_t found = -1;
        while (start < end) {
            key.n = 0;
            if (start > 0)
                tok_buf_add(&key, t->cont_prefix, t->cont_prefix_len);
            tok_buf_add(&key, w + start, end - start);
            if (key.oom) {
                tok_buf_free(&key);
                return -12;
            }
            found = tok_map_get(&t->vocab, key.p, key.n);
            if (found >= 0)
                break;
            /* Step back one whole character. */
            end--;
            while (end > start && ((uint8_t)w[end] & 0xC0) == 0x80)
                end--;
        }
        if (found < 0) {
            tok_buf_free(&key);
            out->n = mark;
            goto unk;
        }
        tok_ids_push(out, found);
        start = end;
    }
    tok_buf_free(&key);
    return out->oom ? -12 : 0;
unk:
    if (t->unk_id >= 0)
        tok_ids_push(out, t->unk_id);
    return out->oom ? -12 : 0;
}
