/* fake_tokenizer.h - the encoder routes' tokenizer contract over bytes, for the server's C
 * tests and the HTTP fuzz target (which include it): a text is [101] its bytes [102]
 * (KWK_ELIMIT past cap, *n saying how many it wanted); a pair is [101] a [102] b [102], types 0
 * then 1, the longer text losing bytes from its end first until the whole fits cap (at least
 * the three), as kwk_tokenizer_encode_pair's longest_first. Inline: each includer uses one or
 * both. */
#ifndef KWK_FAKE_TOKENIZER_H
#define KWK_FAKE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "kwker.h"

static inline int fake_encode(void *user, const char *text, size_t len, int32_t *ids,
                              size_t cap, size_t *n)
{
    (void)user;
    *n = len + 2;
    for (size_t i = 0; i < *n && i < cap; i++)
        ids[i] = i == 0 ? 101 : i == len + 1 ? 102 : (unsigned char)text[i - 1];
    return cap < *n ? KWK_ELIMIT : 0;
}

static inline int fake_pair(void *user, const char *a, size_t na, const char *b, size_t nb,
                            int32_t *ids, int32_t *types, size_t cap, size_t *n)
{
    (void)user;
    if (cap < 3)
        return KWK_ELIMIT;
    while (na + nb + 3 > cap)
        *(na > nb ? &na : &nb) -= 1;
    size_t k = 0;
    ids[k] = 101, types[k++] = 0;
    for (size_t i = 0; i < na; i++)
        ids[k] = (unsigned char)a[i], types[k++] = 0;
    ids[k] = 102, types[k++] = 0;
    for (size_t i = 0; i < nb; i++)
        ids[k] = (unsigned char)b[i], types[k++] = 1;
    ids[k] = 102, types[k++] = 1;
    *n = k;
    return 0;
}

#endif
