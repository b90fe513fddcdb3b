/* fuzz_tokenizer_json.c - libFuzzer target over tokenizer.json loading: any bytes must load or
 * fail with an error, never crash; a loaded tokenizer must encode a fixed text into ids of its
 * vocabulary and decode them. Inputs are capped at 64 KiB. */
#include <stdint.h>
#include <string.h>

#include "fuzz_roundtrip.h"
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
    fuzz_roundtrip(t, text, sizeof text - 1);
    kwk_tokenizer_free(t);
    return 0;
}
