/* test_schema.c - the JSON Schema to GBNF converter: exact grammars for small schemas, refusals
 * naming keyword and pointer, malformed JSON with line and column, limits, and acceptance of
 * JSON texts through kwk_grammar_from_json_schema + kwk_grammar_match. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kwker.h"
#include "test.h"

static char *convert(const char *schema, struct kwk_err *err)
{
    char *out = NULL;
    size_t n = 0;
    if (kwk_json_schema_to_gbnf(schema, strlen(schema), &out, &n, err))
        return NULL;
    if (strlen(out) != n)
        fprintf(stderr, "length %zu vs %zu\n", strlen(out), n);
    return out;
}

/* The rules of the grammar for schema, without the shared primitives' (lines that start with
 * one of theirs). */
static void expect_rules(const char *schema, const char *want)
{
    struct kwk_err err = {0};
    char *g = convert(schema, &err);
    T_CHECK(g != NULL, "%s: %s", schema, err.msg);
    if (!g)
        return;
    static const char *const prims[] = {"space ::=",         "boolean ::=",   "null ::=",
                                        "integral-part ::=", "decimal-part ::=", "number ::=",
                                        "integer ::=",       "char ::=",      "key-char ::=",
                                        "string ::=",        "value ::=",     "object ::=",
                                        "array ::=",         "uuid ::=",      "date ::=",
                                        "time ::=",          "date-time ::=", "date-string ::=",
                                        "time-string ::=",   "date-time-string ::="};
    char got[8192] = "";
    for (char *line = strtok(g, "\n"); line; line = strtok(NULL, "\n")) {
        int prim = 0;
        for (size_t i = 0; i < KWK_ARRAY_LEN(prims); i++)
            prim |= strncmp(line, prims[i], strlen(prims[i])) == 0;
        if (!prim && strlen(got) + strlen(line) + 2 < sizeof got) {
            strcat(got, line);
            strcat(got, "\n");
        }
    }
    T_STREQ(got, want);
    kwk_string_free(g);
}

static void test_exact(void)
{
    expect_rules("{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, "
                 "\"age\": {\"type\": \"integer\"}}, \"required\": [\"name\", \"age\"], "
                 "\"additionalProperties\": false}",
                 "root ::= \"{\" space name-kv \",\" space age-kv \"}\" space\n"
                 "age ::= integer\n"
                 "age-kv ::= \"\\\"age\\\"\" space \":\" space age\n"
                 "name ::= string\n"
                 "name-kv ::= \"\\\"name\\\"\" space \":\" space name\n");
    /* optional properties keep the schema's order through -rest rules */
    expect_rules("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"boolean\"}, \"b\": "
                 "{\"type\": \"null\"}, \"c\": {\"const\": 1}}, \"required\": [\"b\"], "
                 "\"additionalProperties\": false}",
                 "root ::= \"{\" space ( a-kv a-rest | b-kv b-rest ) \"}\" space\n"
                 "a ::= boolean\n"
                 "a-kv ::= \"\\\"a\\\"\" space \":\" space a\n"
                 "a-rest ::= \",\" space b-kv b-rest\n"
                 "b ::= null\n"
                 "b-kv ::= \"\\\"b\\\"\" space \":\" space b\n"
                 "b-rest ::= ( \",\" space c-kv )?\n"
                 "c ::= (\"1\") space\n"
                 "c-kv ::= \"\\\"c\\\"\" space \":\" space c\n");
    expect_rules("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 123}",
                 "root ::= (\"-\" ([0-5]) | [0-9] | ([1-8] [0-9] | [9] [0-9]) | \"1\" ([0-1] "
                 "[0-9] | [2] [0-3])) space\n");
    expect_rules("{\"type\": \"array\", \"items\": {\"type\": \"number\"}, \"minItems\": 1, "
                 "\"maxItems\": 3}",
                 "root ::= \"[\" space item (\",\" space item){0,2} \"]\" space\n"
                 "item ::= number\n");
    expect_rules("{\"type\": \"string\", \"pattern\": \"^[a-z]+\\\\d{2}$\"}",
                 "root ::= \"\\\"\" (([a-z])+ ([0-9]){2}) \"\\\"\" space\n");
    expect_rules("{\"enum\": [\"a\\\"b\", null]}",
                 "root ::= (\"\\\"a\\\\\\\"b\\\"\" | \"null\") space\n");
    /* enums: the values that are one literal as a prefix tree split between characters (é and
     * è, 日 and 旧 share first bytes), objects and arrays beside it, duplicates once */
    expect_rules("{\"enum\": [\"red\", \"green\", \"gray\", \"blue\"]}",
                 "root ::= (\"\\\"\" (\"blue\\\"\" | \"gr\" (\"ay\\\"\" | \"een\\\"\") | "
                 "\"red\\\"\")) space\n");
    expect_rules("{\"enum\": [\"a\", \"ab\", \"abc\"]}",
                 "root ::= (\"\\\"a\" (\"\\\"\" | \"b\" (\"\\\"\" | \"c\\\"\"))) space\n");
    expect_rules("{\"enum\": [\"\xc3\xa9\", \"\xc3\xa8\", \"\xe6\x97\xa5\xe6\x9c\xac\", "
                 "\"\xe6\x97\xa5\", \"\xe6\x97\xa7\"]}",
                 "root ::= (\"\\\"\" (\"\xc3\xa8\\\"\" | \"\xc3\xa9\\\"\" | \"\xe6\x97\xa5\" "
                 "(\"\\\"\" | \"\xe6\x9c\xac\\\"\") | \"\xe6\x97\xa7\\\"\")) space\n");
    expect_rules("{\"enum\": [12, 1, 1.5, null, \"\", {\"a\": 1}, \"x\", \"x\", 1.0, [true], "
                 "false]}",
                 "root ::= (\"\\\"\" (\"\\\"\" | \"x\\\"\") | \"1\" (\"\" | \".5\" | \"2\") | "
                 "\"false\" | \"null\" | \"{\" space \"\\\"a\\\"\" space \":\" space \"1\" space "
                 "\"}\" | \"[\" space \"true\" space \"]\") space\n");
    expect_rules("{\"enum\": [\"\"]}", "root ::= (\"\\\"\\\"\") space\n");
    expect_rules("{\"type\": [\"string\", \"null\"], \"maxLength\": 2}",
                 "root ::= null | root-string\n"
                 "root-string ::= \"\\\"\" char{0,2} \"\\\"\" space\n");
    expect_rules("{\"type\": \"string\", \"format\": \"date\"}", "root ::= date-string\n");
    expect_rules("{\"$defs\": {\"n\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/n\"}}},"
                 " \"$ref\": \"#/$defs/n\"}",
                 "root ::= ref-defs-n\n"
                 "ref-defs-n ::= \"[\" space (ref-defs-n (\",\" space ref-defs-n)*)? \"]\" space\n");
}

static void expect_refused(const char *schema, int code, const char *a, const char *b)
{
    struct kwk_err err = {0};
    char *g = convert(schema, &err);
    T_CHECK(g == NULL, "%s converted", schema);
    kwk_string_free(g);
    T_EQ(err.code, code);
    T_CONTAINS(err.msg, a);
    T_CONTAINS(err.msg, b);
}

static void test_refusals(void)
{
    int U = KWK_EUNSUPPORTED;
    expect_refused("{\"properties\": {\"n\": {\"type\": \"number\", \"multipleOf\": 2}}}", U,
                   "\"multipleOf\"", "#/properties/n");
    expect_refused("{\"type\": \"array\", \"uniqueItems\": true}", U, "\"uniqueItems\"", "#");
    expect_refused("{\"not\": {}}", U, "\"not\"", "at #");
    expect_refused("{\"if\": {}, \"then\": {}}", U, "\"if\"", "at #");
    expect_refused("{\"items\": {\"contains\": {}}}", U, "\"contains\"", "#/items");
    expect_refused("{\"patternProperties\": {\"a\": {}}}", U, "\"patternProperties\"", "#");
    expect_refused("{\"type\": \"object\", \"minProperties\": 1}", U, "minProperties", "#");
    expect_refused("{\"type\": \"number\", \"minimum\": 1.5}", U, "bound", "#/minimum");
    expect_refused("{\"type\": \"string\", \"format\": \"email\"}", U, "\"email\"", "at #");
    expect_refused("{\"type\": \"string\", \"pattern\": \"(?=a)b\"}", U, "lookaround",
                   "#/pattern");
    expect_refused("{\"type\": \"string\", \"pattern\": \"(a)\\\\1\"}", U, "backreference",
                   "#/pattern");
    expect_refused("{\"$ref\": \"http://example.com/s.json\"}", U, "\"$ref\"", "not in this");
    expect_refused("{\"$ref\": \"#\"}", U, "\"$ref\"", "refers back");
    expect_refused("{\"oneOf\": [{\"type\": \"integer\"}, {\"type\": \"number\"}]}", U,
                   "\"oneOf\"", "branches 0 and 1");
    expect_refused("{\"allOf\": [{\"pattern\": \"a\"}, {\"pattern\": \"b\"}]}", U, "pattern",
                   "#/allOf/1/pattern");
    expect_refused("false", U, "allows no value", "#");
    /* keywords that constrain nothing here are not refused */
    struct kwk_err err = {0};
    char *g = convert("{\"type\": \"string\", \"multipleOf\": 3, \"title\": \"t\", "
                      "\"unknownKeyword\": 1, \"uniqueItems\": false}",
                      &err);
    T_TRUE(g != NULL);
    kwk_string_free(g);
    /* oneOf with disjoint branches converts */
    g = convert("{\"oneOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": "
                "\"a\"}}, \"required\": [\"kind\"]}, {\"type\": \"object\", \"properties\": "
                "{\"kind\": {\"const\": \"b\"}}, \"required\": [\"kind\"]}, {\"type\": "
                "\"string\"}]}",
                &err);
    T_CHECK(g != NULL, "%s", err.msg);
    kwk_string_free(g);
}

static void test_errors_and_limits(void)
{
    struct kwk_err err = {0};
    const char *bad = "{\"type\": \"object\",\n  \"properties\": {\"a\": }}";
    T_TRUE(convert(bad, &err) == NULL);
    T_EQ(err.code, KWK_EFORMAT);
    T_EQ(err.line, 2);
    T_TRUE(err.col > 0);
    T_TRUE(err.pos > 0);
    T_TRUE(convert("{\"type\": \"strin\"}", &err) == NULL);
    T_EQ(err.code, KWK_EFORMAT);
    T_CONTAINS(err.msg, "\"type\"");
    T_TRUE(convert("{\"minLength\": -1}", &err) == NULL);
    T_EQ(err.code, KWK_EFORMAT);
    /* nesting */
    char deep[2000] = "";
    for (int i = 0; i < 70; i++)
        strcat(deep, "{\"items\": ");
    strcat(deep, "{}");
    for (int i = 0; i < 70; i++)
        strcat(deep, "}");
    T_TRUE(convert(deep, &err) == NULL);
    T_EQ(err.code, KWK_ELIMIT);
    /* schema size */
    size_t big = (size_t)KWK_GRAMMAR_TEXT_MAX + 1;
    char *text = malloc(big);
    memset(text, ' ', big);
    text[0] = '{';
    text[big - 1] = '}';
    char *out = NULL;
    T_EQ(kwk_json_schema_to_gbnf(text, big, &out, NULL, &err), KWK_ELIMIT);
    free(text);
    T_TRUE(out == NULL);
    T_TRUE(convert("{\"type\": \"string\", \"maxLength\": 20000}", &err) == NULL);
    T_EQ(err.code, KWK_ELIMIT);
    T_TRUE(convert("{\"type\": \"integer\", \"minimum\": 1e30}", &err) == NULL);
    T_EQ(err.code, KWK_ELIMIT);
    /* anyOf inside allOf multiplies past the cap */
    char many[4000] = "{\"allOf\": [";
    for (int i = 0; i < 5; i++)
        strcat(many, i ? ", {\"anyOf\": [{}, {}, {}, {}]}" : "{\"anyOf\": [{}, {}, {}, {}]}");
    strcat(many, "]}");
    T_TRUE(convert(many, &err) == NULL);
    T_EQ(err.code, KWK_ELIMIT);
    T_EQ(kwk_json_schema_to_gbnf("{}", 2, NULL, NULL, &err), KWK_EARG);
}

/* ---- acceptance ---- */

static void expect_match(const char *schema, const char *const *yes, const char *const *no)
{
    struct kwk_err err = {0};
    kwk_grammar *g = kwk_grammar_from_json_schema(schema, strlen(schema), &err);
    T_CHECK(g != NULL, "%s: %s", schema, err.msg);
    if (!g)
        return;
    for (; yes && *yes; yes++)
        T_CHECK(kwk_grammar_match(g, *yes, strlen(*yes), NULL) == 1, "%s accepts %s", schema,
                *yes);
    for (; no && *no; no++)
        T_CHECK(kwk_grammar_match(g, *no, strlen(*no), NULL) == 0, "%s rejects %s", schema, *no);
    kwk_grammar_free(g);
}

static void test_acceptance(void)
{
    const char *person = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": "
                         "\"string\", \"minLength\": 1}, \"age\": {\"type\": \"integer\", "
                         "\"minimum\": 0}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": "
                         "\"string\"}}}, \"required\": [\"name\"]}";
    expect_match(person,
                 (const char *const[]){"{\"name\":\"Ann\"}", "{\"name\":\"Ann\",\"age\":3}",
                                       "{\n  \"name\": \"Ann\",\n  \"age\": 30,\n  \"tags\": [\n"
                                       "    \"a\",\n    \"b\"\n  ]\n}",
                                       "{\"name\":\"\\u00e9\\n\",\"tags\":[],\"x\":{\"y\":[1]}}",
                                       "{ \"name\" : \"A\" }", NULL},
                 (const char *const[]){"{}", "{\"name\":\"\"}", "{\"age\":1,\"name\":\"A\"}",
                                       "{\"name\":\"A\",\"age\":-1}",
                                       "{\"name\":\"A\",\"x\":1,\"age\":2}",
                                       "{\"name\":\"A\",\"name\":\"B\"}",
                                       "{\"name\":\"a\x01\"}", NULL});
    /* integer ranges at their edges */
    expect_match("{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 123}",
                 (const char *const[]){"-5", "0", "9", "10", "99", "100", "123", "-1", NULL},
                 (const char *const[]){"-6", "124", "0123", "1000", "-", "1.5", "-10", "7.0",
                                       NULL});
    expect_match("{\"type\": \"integer\", \"exclusiveMinimum\": 10, \"exclusiveMaximum\": 20}",
                 (const char *const[]){"11", "19", NULL},
                 (const char *const[]){"10", "20", "5", NULL});
    expect_match("{\"type\": \"integer\", \"minimum\": 250}",
                 (const char *const[]){"250", "251", "300", "999", "1000", "123456", NULL},
                 (const char *const[]){"249", "99", "0", "-250", NULL});
    expect_match("{\"type\": \"integer\", \"maximum\": -42}",
                 (const char *const[]){"-42", "-43", "-100", "-9999", NULL},
                 (const char *const[]){"-41", "0", "42", NULL});
    expect_match("{\"type\": \"integer\", \"minimum\": -9223372036854775807, \"maximum\": "
                 "9223372036854775807}",
                 (const char *const[]){"9223372036854775807", "-9223372036854775807", "0", NULL},
                 (const char *const[]){"9223372036854775808", NULL});
    /* patterns, unanchored unless anchored */
    expect_match("{\"type\": \"string\", \"pattern\": \"^\\\\d{3}-[A-Z]{2}$\"}",
                 (const char *const[]){"\"123-AB\"", NULL},
                 (const char *const[]){"\"123-ab\"", "\"x123-AB\"", "\"1234-AB\"", NULL});
    expect_match("{\"type\": \"string\", \"pattern\": \"ab+\"}",
                 (const char *const[]){"\"ab\"", "\"xxabbbyy\"", NULL},
                 (const char *const[]){"\"a\"", "\"ba\"", NULL});
    expect_match("{\"type\": \"string\", \"pattern\": \"^(cat|dog)s?$\"}",
                 (const char *const[]){"\"cat\"", "\"dogs\"", NULL},
                 (const char *const[]){"\"cow\"", "\"cats!\"", NULL});
    /* formats */
    expect_match("{\"type\": \"string\", \"format\": \"date-time\"}",
                 (const char *const[]){"\"2024-02-29T12:30:00Z\"",
                                       "\"2024-02-29T12:30:00.123+01:00\"", NULL},
                 (const char *const[]){"\"2024-13-01T00:00:00Z\"", "\"2024-02-29\"", NULL});
    expect_match("{\"format\": \"uuid\"}",
                 (const char *const[]){"\"123e4567-e89b-12d3-a456-426614174000\"", "12", NULL},
                 (const char *const[]){"\"123e4567e89b12d3a456426614174000\"", NULL});
    /* enums with strings needing escapes */
    expect_match("{\"enum\": [\"a\\\"b\", \"tab\\tbed\", \"back\\\\slash\", \"\\u00e9\", 1]}",
                 (const char *const[]){"\"a\\\"b\"", "\"tab\\tbed\"", "\"back\\\\slash\"",
                                       "\"\xc3\xa9\"", "1", NULL},
                 (const char *const[]){"\"a\"b\"", "\"ab\"", "2", "1.0", NULL});
    /* nested $ref recursion */
    const char *tree = "{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": "
                       "{\"type\": \"integer\"}, \"kids\": {\"type\": \"array\", \"items\": "
                       "{\"$ref\": \"#/$defs/node\"}}}, \"required\": [\"v\"], "
                       "\"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}";
    expect_match(tree,
                 (const char *const[]){"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]}]}",
                                       "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":"
                                       "4}]}]}",
                                       NULL},
                 (const char *const[]){"{\"v\":1,\"kids\":[{}]}", "{\"v\":1,\"w\":2}", NULL});
    /* allOf merges objects; additionalProperties false sees the other branch's keys as extra */
    expect_match("{\"allOf\": [{\"properties\": {\"a\": {\"type\": \"integer\"}}, "
                 "\"required\": [\"a\"]}, {\"properties\": {\"b\": {\"type\": \"string\"}}}]}",
                 (const char *const[]){"{\"a\":1}", "{\"a\":1,\"b\":\"x\"}", "3", NULL},
                 (const char *const[]){"{\"b\":\"x\"}", "{\"a\":\"1\"}", NULL});
    /* prefixItems with items false, minItems */
    expect_match("{\"prefixItems\": [{\"type\": \"integer\"}, {\"type\": \"string\"}], "
                 "\"items\": false, \"minItems\": 1}",
                 (const char *const[]){"[1]", "[1,\"a\"]", "[ 1 , \"a\" ]", NULL},
                 (const char *const[]){"[]", "[1,\"a\",2]", "[\"a\"]", NULL});
    /* whitespace: at most a newline and 20 spaces or tabs between tokens */
    expect_match("{\"type\": \"array\"}", (const char *const[]){"[\n                    1]", NULL},
                 (const char *const[]){"[\n                     1]", "[\n\n1]", NULL});
}

/* ---- enums as prefix trees ---- */

#define N_WORDS 5000

/* The JSON text of the i-th of N_WORDS distinct strings with shared prefixes: characters that
 * share first bytes but not a code point (é è, 日 旧 旦), escapes, parts that are prefixes of
 * others ("a" "ab" "abc", "nul" "null"), an empty part. */
static void enum_word(int i, char *out, size_t cap)
{
    static const char *const a[8] = {"\xc3\xa9", "\xc3\xa8", "\xe6\x97\xa5\xe6\x9c\xac",
                                     "\xe6\x97\xa5", "\xe6\x97\xa7", "a", "ab", "abc"};
    static const char *const b[25] = {
        "red", "green", "gray",  "grey", "blue", "q\\\"", "t\\tb", "", "x", "xy", "xyz",
        "back\\\\", "sl/ash", "\xe4\xb8\xad", "\xe4\xb8\xad\xe6\x96\x87", "caf\xc3\xa9", "cafe",
        "caf", "n", "nu", "nul", "null", "0", "01", "1"};
    snprintf(out, cap, "\"%s/%s/%d\"", a[i % 8], b[i / 8 % 25], i / 200);
}

/* {"enum": [the n texts that word(i) writes]}; the caller frees. */
static char *enum_schema(int n, void (*word)(int, char *, size_t))
{
    size_t cap = 64, len = 0;
    char w[8192], *s = malloc(cap);
    len = (size_t)snprintf(s, cap, "{\"enum\": [");
    for (int i = 0; i < n; i++) {
        word(i, w, sizeof w);
        while (len + strlen(w) + 8 > cap)
            s = realloc(s, cap *= 2);
        len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? ", " : "", w);
    }
    snprintf(s + len, cap - len, "]}");
    return s;
}

/* Tokens for masks over the enum's start: every byte, then pieces across its branches. */
static const char *const enum_pieces[] = {
    "\"", "\"\xc3", "\"\xc3\xa9", "\xc3\xa9/", "\"\xe6\x97", "\xa5\xe6", "\xe6\x97\xa6", "\"a",
    "\"ab", "abc/", "/red/", "/gr", "ey/", "\\\"", "\\t", "1\"", "10\"", "\"x", "/nul", "null/",
    "\" ", "/\xe4\xb8\xad", "\"\"", "/1", "24\""};
#define N_ENUM_TOKENS (256 + (int)KWK_ARRAY_LEN(enum_pieces))

static uint32_t enum_token(int t, char *out)
{
    if (t < 256) {
        out[0] = (char)t;
        return 1;
    }
    memcpy(out, enum_pieces[t - 256], strlen(enum_pieces[t - 256]));
    return (uint32_t)strlen(enum_pieces[t - 256]);
}

static kwk_grammar_vocab *enum_vocab(void)
{
    static char bytes[N_ENUM_TOKENS][16];
    const char *ptrs[N_ENUM_TOKENS];
    uint32_t lens[N_ENUM_TOKENS];
    for (int t = 0; t < N_ENUM_TOKENS; t++) {
        lens[t] = enum_token(t, bytes[t]);
        ptrs[t] = bytes[t];
    }
    struct kwk_err err = {0};
    kwk_grammar_vocab *v = kwk_grammar_vocab_from_bytes(ptrs, lens, N_ENUM_TOKENS, &err);
    T_CHECK(v != NULL, "%s", err.msg);
    return v;
}

/* The mask after text (which m has taken) allows exactly the tokens that keep it a prefix. */
static void enum_mask_check(const kwk_grammar *g, kwk_matcher *m, const char *text)
{
    uint32_t allowed[(N_ENUM_TOKENS + 31) / 32] = {0};
    int bad = 0;
    T_TRUE(kwk_matcher_mask(m, allowed) > 0);
    for (int t = 0; t < N_ENUM_TOKENS; t++) {
        char buf[64];
        size_t n = strlen(text);
        int prefix = 0, bit = (int)(allowed[t / 32] >> (t % 32) & 1);
        memcpy(buf, text, n);
        n += enum_token(t, buf + n);
        T_TRUE(kwk_grammar_match(g, buf, n, &prefix) >= 0);
        bad += bit != prefix;
    }
    T_EQ(bad, 0);
}

/* An enum of N_WORDS strings (more than the matcher's 1024 stacks if they were alternatives)
 * converts, and a matcher from its start takes every value and nothing else. */
static void test_enum_many(void)
{
    struct kwk_err err = {0};
    char *schema = enum_schema(N_WORDS, enum_word), w[256], x[256];
    kwk_grammar *g = kwk_grammar_from_json_schema(schema, strlen(schema), &err);
    kwk_grammar_vocab *v = enum_vocab();
    kwk_matcher *m = g && v ? kwk_matcher_new(g, v, &err) : NULL;
    T_CHECK(m != NULL, "%s", err.msg);
    free(schema);
    if (!m)
        goto out;
    enum_mask_check(g, m, "");
    T_EQ(kwk_matcher_accept_bytes(m, "\"\xe6\x97", 3), 0);
    enum_mask_check(g, m, "\"\xe6\x97");
    int missed = 0, wrong = 0;
    for (int i = 0; i < N_WORDS; i++) {
        enum_word(i, w, sizeof w);
        size_t n = strlen(w);
        kwk_matcher_reset(m);
        missed += kwk_matcher_accept_bytes(m, w, n) != 0 || !kwk_matcher_done(m);
        missed += kwk_grammar_match(g, w, n, NULL) != 1;
        /* a prefix (the part before the number, closed), a character more, one changed */
        snprintf(x, sizeof x, "%.*s\"", (int)(strrchr(w, '/') - w + 1), w);
        wrong += kwk_grammar_match(g, x, strlen(x), NULL) != 0;
        snprintf(x, sizeof x, "%.*sz\"", (int)n - 1, w);
        wrong += kwk_grammar_match(g, x, strlen(x), NULL) != 0;
        snprintf(x, sizeof x, "%s", w);
        x[n - 2] = 'z';
        wrong += kwk_grammar_match(g, x, n, NULL) != 0;
        int prefix = 0;
        wrong += kwk_grammar_match(g, w, n - 1, &prefix) != 0 || !prefix;
    }
    T_EQ(missed, 0);
    T_EQ(wrong, 0);
    /* 旦 shares 日's and 旧's first two bytes; a lone first byte is only a prefix */
    kwk_matcher_reset(m);
    T_TRUE(kwk_matcher_accept_bytes(m, "\"\xe6\x97\xa6", 4) != 0);
    T_EQ(kwk_grammar_match(g, "\"\xe6\x97\xa6/red/0\"", 11, NULL), 0);
    T_EQ(kwk_grammar_match(g, "\"\xe6\"", 3, NULL), 0);
    T_EQ(kwk_grammar_match(g, "\"\"", 2, NULL), 0);
out:
    kwk_matcher_free(m);
    kwk_grammar_vocab_free(v);
    kwk_grammar_free(g);
}

/* "a", "aa" ... 300 a's: a node per value, deeper than one rule nests groups. */
static void deep_word(int i, char *out, size_t cap)
{
    out[0] = '"';
    memset(out + 1, 'a', (size_t)i + 1);
    snprintf(out + i + 2, cap - (size_t)i - 2, "\"");
}

/* Long values: 40 of 3000 shared bytes and a number, so the shared part is one literal. */
static void long_word(int i, char *out, size_t cap)
{
    memset(out, 'b', 3001);
    out[0] = '"';
    snprintf(out + 3001, cap - 3001, "%d\"", i * 7);
}

static void expect_enum_words(int n, void (*word)(int, char *, size_t), const char *rule)
{
    struct kwk_err err = {0};
    char *schema = enum_schema(n, word), *gbnf = NULL, w[8192];
    size_t len = 0;
    T_EQ(kwk_json_schema_to_gbnf(schema, strlen(schema), &gbnf, &len, &err), 0);
    if (gbnf && rule)
        T_CONTAINS(gbnf, rule);
    kwk_grammar *g = kwk_grammar_from_json_schema(schema, strlen(schema), &err);
    T_CHECK(g != NULL, "%s", err.msg);
    for (int i = 0; g && i < n; i++) {
        word(i, w, sizeof w);
        size_t k = strlen(w);
        T_EQ(kwk_grammar_match(g, w, k, NULL), 1);
        w[k - 1] = 'c'; /* one character more */
        w[k] = '"';
        T_EQ(kwk_grammar_match(g, w, k + 1, NULL), 0);
    }
    kwk_grammar_free(g);
    kwk_string_free(gbnf);
    free(schema);
}

static void test_enum_deep(void)
{
    expect_enum_words(300, deep_word, "\nroot-enum-0 ::= \"a\" (");
    expect_enum_words(40, long_word, NULL);
}

/* Every allocation of a conversion failed in turn gives -ENOMEM, never another error. */
static void expect_alloc_failures(const char *schema)
{
    int failed = 0, done = 0;
    for (long n = 1; n < 5000 && !done; n++) {
        struct kwk_err err = {0};
        char *out = NULL;
        size_t len = 0;
        kwk_alloc_fail_after(n);
        int rc = kwk_json_schema_to_gbnf(schema, strlen(schema), &out, &len, &err);
        kwk_alloc_fail_after(0);
        if (rc == 0) {
            done = 1;
            kwk_string_free(out);
        } else if (rc != -12) {
            failed++;
            fprintf(stderr, "allocation %ld: %d %s\n", n, rc, err.msg);
        }
    }
    T_TRUE(done);
    T_EQ(failed, 0);
}

static void test_alloc_failures(void)
{
    expect_alloc_failures("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", "
                          "\"pattern\": \"^x+$\"}, \"b\": {\"anyOf\": [{\"type\": \"integer\", "
                          "\"minimum\": 3}, {\"enum\": [1, \"z\"]}]}}, \"required\": [\"a\"]}");
    /* an enum deep enough for rules of its own, with an object beside its tree */
    char *deep = enum_schema(150, deep_word);
    size_t n = strlen(deep);
    deep = realloc(deep, n + 32);
    strcpy(deep + n - 2, ", {\"k\": [1]}]}"); /* over the closing "]}" */
    expect_alloc_failures(deep);
    free(deep);
}

int main(void)
{
    test_exact();
    test_refusals();
    test_errors_and_limits();
    test_acceptance();
    test_enum_many();
    test_enum_deep();
    test_alloc_failures();
    return t_report("test_schema");
}
