/* fuzz_json_schema.c - libFuzzer target: any bytes as a JSON Schema -> GBNF; a schema that
 * converts must compile (kwk_grammar_new on the converter's own text) and match a few fixed
 * JSON texts without failing. Never crashes, never leaks. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kwker.h"

#define FUZZ_MAX_INPUT (64 * 1024)

static const char *const texts[] = {
    "{}", "[]", "null", "true", "0", "-12.5e3", "\"\"", "\"abc\"",
    "{\"a\": 1, \"b\": [true, null, \"x\"]}", "[1, \"2\", {\"c\": {}}]",
    "{\n  \"name\": \"x\",\n  \"age\": 3\n}", "\"2024-01-31T10:00:00Z\"",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_MAX_INPUT)
        return 0;
    char *gbnf = NULL;
    size_t len = 0;
    struct kwk_err err;
    int rc = kwk_json_schema_to_gbnf((const char *)data, size, &gbnf, &len, &err);
    if (rc) {
        if (gbnf || !err.msg[0])
            __builtin_trap(); /* a failure leaves no text and says why */
        return 0;
    }
    kwk_grammar *g = kwk_grammar_new(gbnf, len, &err);
    if (!g && err.code != KWK_ELIMIT) {
        /* the converter's own GBNF must compile */
        fprintf(stderr, "converted GBNF refused: %s\n%s\n", err.msg, gbnf);
        __builtin_trap();
    }
    for (size_t i = 0; g && i < sizeof texts / sizeof texts[0]; i++) {
        int prefix = 0;
        int m = kwk_grammar_match(g, texts[i], strlen(texts[i]), &prefix);
        if (m < 0 && m != KWK_ELIMIT)
            __builtin_trap();
    }
    kwk_grammar_free(g);
    kwk_string_free(gbnf);
    return 0;
}
