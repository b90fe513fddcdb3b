/* schema_grammar.c - a compiled grammar straight from a JSON Schema: the converter's GBNF
 * through kwk_grammar_new. Thread-safe (each call owns its text). */
#include "grammar/schema.h"

kwk_grammar *kwk_grammar_from_json_schema(const char *schema, size_t len, struct kwk_err *err)
{
    char *text = NULL;
    size_t n = 0;
    if (kwk_json_schema_to_gbnf(schema, len, &text, &n, err))
        return NULL;
    kwk_grammar *g = kwk_grammar_new(text, n, err);
    kwk_free(text);
    return g;
}
