/* fuzz_roundtrip.h - what the tokenizer fuzz targets do with a tokenizer that loaded: encode a
 * text with its special tokens, abort (a finding) if an id falls outside its vocabulary, since
 * decode and the model would refuse it, and decode the ids. Included by fuzz targets only. */
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
}

#endif
