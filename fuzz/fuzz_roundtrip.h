/* fuzz_roundtrip.h - what the tokenizer fuzz targets do with a tokenizer that loaded: encode a
 * text with its special tokens, abort (a finding) if an id falls outside its vocabulary, since
 * decode and the model would refuse it, and decode the ids; then join the text's halves as a
 * pair (its pair form, truncated to a few lengths), whose ids must be the vocabulary's and
 * whose length must keep to the limit. Included by fuzz targets only. */
#ifndef KWK_FUZZ_ROUNDTRIP_H
#define KWK_FUZZ_ROUNDTRIP_H

#include <stdint.h>
#include <stdlib.h>

#include "kwker.h"

static void fuzz_roundtrip(const kwk_tokenizer *t, const char *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (kwk_tokenizer_encode_alloc(t, text, len, 1, &ids, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= kwk_tokenizer_n_vocab(t))
                abort();
        char *out = NULL;
        if (kwk_tokenizer_decode_alloc(t, ids, n, 0, &out, NULL) == 0)
            kwk_tokenizer_mem_free(out);
    }
    kwk_tokenizer_mem_free(ids);
    static const size_t limits[] = {0, 1, 3, 8};
    for (size_t k = 0; k < sizeof limits / sizeof limits[0]; k++) {
        int32_t *types = NULL;
        ids = NULL;
        n = 0;
        if (kwk_tokenizer_encode_pair(t, text, len / 2, text + len / 2, len - len / 2, limits[k],
                                      &ids, &types, &n) == 0) {
            if (limits[k] && n > limits[k])
                abort();
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= kwk_tokenizer_n_vocab(t) || types[i] < 0)
                    abort();
        }
        kwk_tokenizer_mem_free(ids);
        kwk_tokenizer_mem_free(types);
    }
}

#endif
