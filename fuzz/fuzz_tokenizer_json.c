/* fuzz_tokenizer_json.c - libFuzzer target over tokenizer.json loading: any bytes must load or
 * fail with an error, never crash; a loaded tokenizer must encode a fixed text into ids of its
 * vocabulary and decode them. Inputs are capped at 64 KiB. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kwker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    struct kwk_err err;
    kwk_tokenizer *t = kwk_tokenizer_load_json((const char *)data, size, &err);
    if (!t)
        return 0;
    static const char text[] = "Hello  world! 123 \xC3\xA9\xE4\xB8\xAD <s> \xF0\x9F\x8E\x89\n\t";
    int32_t *ids = NULL;
    size_t n = 0;
    if (kwk_tokenizer_encode_alloc(t, text, sizeof text - 1, 1, &ids, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= kwk_tokenizer_n_vocab(t))
                abort(); /* encode gave an id decode and the model refuse */
        char *out = NULL;
        if (kwk_tokenizer_decode_alloc(t, ids, n, 0, &out, NULL) == 0)
            kwk_tokenizer_mem_free(out);
    }
    kwk_tokenizer_mem_free(ids);
    kwk_tokenizer_free(t);
    return 0;
}
