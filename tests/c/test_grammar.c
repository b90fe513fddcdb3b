/* test_grammar.c - unit tests of the grammar module: GBNF parsing of every construct, errors
 * with line and column, UTF-8 character classes against a reference decoder, whole-text
 * matching (a JSON grammar on valid and invalid JSON), limits, and masks checked token by
 * token against whole-text matching on a vocabulary with partial UTF-8 tokens; then the real
 * SmolLM2 tokenizer when its file is there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar.h"
#include "kwker.h"
#include "test.h"

#define SMOLLM2_GGUF "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const char json_gbnf[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? "
    "([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static int last_prefix;

/* Compile gbnf and match text[len]: 1 / 0 as kwk_grammar_match (prefix in last_prefix), or
 * -1000 when the grammar does not compile. */
static int matchn(const char *gbnf, const char *text, size_t len)
{
    struct kwk_err err;
    kwk_grammar *g = kwk_grammar_new(gbnf, strlen(gbnf), &err);
    if (!g) {
        fprintf(stderr, "  compile failed: %s\n", err.msg);
        return -1000;
    }
    int r = kwk_grammar_match(g, text, len, &last_prefix);
    kwk_grammar_free(g);
    return r;
}

static int match(const char *gbnf, const char *text)
{
    return matchn(gbnf, text, strlen(text));
}

/* The error of a grammar that must not compile (code 0 when it did). */
static struct kwk_err compile_err(const char *gbnf)
{
    struct kwk_err err;
    memset(&err, 0, sizeof err);
    kwk_grammar *g = kwk_grammar_new(gbnf, strlen(gbnf), &err);
    if (g) {
        kwk_grammar_free(g);
        err.code = 0;
    }
    return err;
}

static void test_literals(void)
{
    const char *g = "root ::= \"abc\"";
    T_EQ(match(g, "abc"), 1);
    T_EQ(last_prefix, 1);
    T_EQ(match(g, "ab"), 0);
    T_EQ(last_prefix, 1);
    T_EQ(match(g, "abcd"), 0);
    T_EQ(last_prefix, 0);
    T_EQ(match(g, "x"), 0);
    T_EQ(last_prefix, 0);
    T_EQ(match(g, ""), 0);
    T_EQ(last_prefix, 1);
    T_EQ(match("root ::= \"\"", ""), 1);
    T_EQ(match("root ::= \"a\" \"b\"  \"c\"", "abc"), 1);
    T_EQ(match("root ::= \"a\" | \"bc\" | \"\"", "bc"), 1);
    T_EQ(match("root ::= \"a\" | \"bc\" | \"\"", ""), 1);
    T_EQ(match("root ::= \"a\" | \"bc\" | \"\"", "b"), 0);
    /* Escapes, and \xHH as a code point (U+00E9, two bytes), not a raw byte. */
    T_EQ(match("root ::= \"\\n\\r\\t\\\\\\\"\\[\\]\\-\"", "\n\r\t\\\"[]-"), 1);
    T_EQ(match("root ::= \"\\xe9\\u00E9\\U0001F600\"", "\xc3\xa9\xc3\xa9\xf0\x9f\x98\x80"), 1);
    T_EQ(match("root ::= \"\\xe9\"", "\xe9"), 0);
    T_EQ(match("root ::= \"h\xc3\xa9\"", "h\xc3\xa9"), 1); /* raw UTF-8 in a literal */
    /* Rules, references, the start rule anywhere. */
    T_EQ(match("a ::= \"x\" b\nroot ::= a a\nb ::= \"y\"", "xyxy"), 1);
    T_EQ(match("a ::= \"x\" b\nroot ::= a a\nb ::= \"y\"", "xyx"), 0);
    T_EQ(match("root ::= my-rule-2\nmy-rule-2 ::= \"ok\"", "ok"), 1);
}

static void test_classes(void)
{
    const char *g = "root ::= [a-c0-9_]";
    T_EQ(match(g, "b"), 1);
    T_EQ(match(g, "7"), 1);
    T_EQ(match(g, "_"), 1);
    T_EQ(match(g, "d"), 0);
    T_EQ(match("root ::= [^a-c]", "d"), 1);
    T_EQ(match("root ::= [^a-c]", "b"), 0);
    T_EQ(match("root ::= [^a-c]", "\n"), 1);
    T_EQ(match("root ::= [-a]", "-"), 1);  /* '-' first is itself */
    T_EQ(match("root ::= [a-]", "-"), 1);  /* and last */
    T_EQ(match("root ::= [\\]\\[\\-]", "]"), 1);
    T_EQ(match("root ::= [\\]\\[\\-]", "-"), 1);
    T_EQ(match("root ::= [\\x41-\\x43]", "B"), 1);
    T_EQ(match("root ::= .", "\n"), 1);
    T_EQ(match("root ::= .", "ab"), 0);
    T_EQ(match("root ::= . .", "a\xc3\xa9"), 1);
    T_EQ(match("root ::= []", ""), 0);        /* matches nothing */
    T_EQ(match("root ::= [] | \"a\"", "a"), 1);
    T_EQ(match("root ::= [^]", "\xe4\xb8\xad"), 1);
    /* Multi-byte ranges. */
    g = "root ::= [\xc3\xa0-\xc3\xbf]+"; /* U+00E0-U+00FF */
    T_EQ(match(g, "\xc3\xa0\xc3\xbf\xc3\xa9"), 1);
    T_EQ(match(g, "\xc3\x9f"), 0);
    T_EQ(match(g, "\xc3"), 0);
    T_EQ(last_prefix, 1); /* half a character */
    g = "root ::= [\\u4e00-\\u9fa5]";
    T_EQ(match(g, "\xe4\xb8\xad"), 1);
    T_EQ(match(g, "\xe4\xb8"), 0);
    T_EQ(last_prefix, 1);
    T_EQ(match(g, "\xe4\xb7\xbf"), 0); /* U+4DFF */
    T_EQ(last_prefix, 0);
}

static void test_repetition(void)
{
    const char *g = "root ::= \"a\"*";
    T_EQ(match(g, ""), 1);
    T_EQ(match(g, "aaaa"), 1);
    T_EQ(match(g, "aab"), 0);
    T_EQ(match("root ::= \"ab\"+", ""), 0);
    T_EQ(match("root ::= \"ab\"+", "ababab"), 1);
    T_EQ(match("root ::= \"ab\"+", "aba"), 0);
    T_EQ(last_prefix, 1);
    T_EQ(match("root ::= \"a\"? \"b\"", "b"), 1);
    T_EQ(match("root ::= \"a\"? \"b\"", "ab"), 1);
    T_EQ(match("root ::= \"a\"? \"b\"", "aab"), 0);
    g = "root ::= [0-9]{3}";
    T_EQ(match(g, "123"), 1);
    T_EQ(match(g, "12"), 0);
    T_EQ(match(g, "1234"), 0);
    g = "root ::= (\"x\" | \"yz\"){2,}";
    T_EQ(match(g, "x"), 0);
    T_EQ(match(g, "xyz"), 1);
    T_EQ(match(g, "yzxxxyz"), 1);
    g = "root ::= \"a\"{2,4} \"b\"";
    T_EQ(match(g, "ab"), 0);
    T_EQ(match(g, "aab"), 1);
    T_EQ(match(g, "aaaab"), 1);
    T_EQ(match(g, "aaaaab"), 0);
    T_EQ(match("root ::= \"a\"{0} \"b\"", "b"), 1);
    T_EQ(match("root ::= \"a\"{0,1}", ""), 1);
    T_EQ(match("root ::= \"a\"{ 1 , 2 }", "aa"), 1);
    T_EQ(match("root ::= \"ab\"{10000}", ""), 0);
    T_EQ(last_prefix, 1);
    /* Nullable bodies repeated: no endless loop, same language. */
    T_EQ(match("root ::= (\"a\"?)*", ""), 1);
    T_EQ(match("root ::= (\"a\"?)*", "aaa"), 1);
    T_EQ(match("root ::= (\"a\" | \"\")* \"b\"", "aab"), 1);
    T_EQ(match("root ::= ((\"a\")*)* \"b\"", "aaab"), 1);
    T_EQ(match("root ::= (\"a\"*)+ \"b\"", "b"), 1);
    T_EQ(match("root ::= (\"a\"* \"c\"?)+ \"b\"", "aacab"), 1);
    T_EQ(match("root ::= (\"a\"*){3,5} \"b\"", "aaab"), 1);
    T_EQ(match("root ::= x*\nx ::= y\ny ::= \"q\" |", "qq"), 1);
    T_EQ(match("root ::= \"a\"**", "aa"), 1);
    T_EQ(match("root ::= \"\"*", ""), 1);
    /* Right recursion does not deepen the stack: a long text is fine. */
    char *long_text = malloc(200001);
    memset(long_text, 'a', 200000);
    long_text[200000] = 0;
    T_EQ(match("root ::= x\nx ::= \"a\" x | \"\"", long_text), 1);
    T_EQ(match("root ::= \"a\"*", long_text), 1);
    free(long_text);
}

static void test_layout(void)
{
    /* Comments, blank lines, CRLF, newlines inside parentheses and after '|' and '::='. */
    const char *g = "# a grammar\r\n\r\nroot ::= ( # open\n  \"a\"\n  | \"b\" # alt\n\n)\r\n"
                    "  # trailing comment";
    T_EQ(match(g, "a"), 1);
    T_EQ(match(g, "b"), 1);
    T_EQ(match("root ::=\n  \"a\" |\n  \"b\"\n", "b"), 1);
    T_EQ(match("root ::= \"a\"\t\"b\"", "ab"), 1);
    T_EQ(match("root ::= \"a\" # c \"b\"\n", "a"), 1);
    T_EQ(match("root ::= \"#\"", "#"), 1);
    T_EQ(match("root ::= \"a\"\n\n\n\nx ::= \"b\"", "a"), 1);
}

static void expect_err(const char *gbnf, int code, int line, int col, const char *msg)
{
    struct kwk_err err = compile_err(gbnf);
    T_EQ(err.code, code);
    T_EQ(err.line, line);
    T_EQ(err.col, col);
    T_CONTAINS(err.msg, msg);
}

static void test_errors(void)
{
    expect_err("root ::= \"abc", KWK_ESYNTAX, 1, 10, "unterminated literal");
    expect_err("root ::= \"a\\q\"", KWK_ESYNTAX, 1, 12, "unknown escape");
    expect_err("root ::= \"a\\x4\"", KWK_ESYNTAX, 1, 15, "2 hex digits");
    expect_err("root ::= \"\\U00110000\"", KWK_ESYNTAX, 1, 11, "past U+10FFFF");
    expect_err("root ::= \"\\uD800\"", KWK_ESYNTAX, 1, 11, "surrogate");
    expect_err("root ::= x\n  x ::= \"a\" ::=", KWK_ESYNTAX, 2, 13, "expected a symbol");
    expect_err("root ::= foo\n", KWK_ESYNTAX, 1, 10, "undefined rule 'foo'");
    expect_err("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", KWK_ESYNTAX, 2, 1,
               "left recursion");
    expect_err("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n", KWK_ESYNTAX, 2, 1,
               "'expr'");
    /* Through a nullable prefix, and through another rule. */
    expect_err("root ::= a\na ::= b a \"x\" | \"y\"\nb ::= \"z\" |", KWK_ESYNTAX, 2, 1,
               "left recursion: can reach itself before matching any text: rule 'a'");
    expect_err("root ::= a\na ::= \"q\"? (b | \"k\")\nb ::= a \"x\"", KWK_ESYNTAX, 2, 1,
               "left recursion");
    expect_err("root ::= root \"a\" | \"b\"", KWK_ESYNTAX, 1, 1, "rule 'root'");
    expect_err("root ::= \"a\"{3,2}", KWK_ESYNTAX, 1, 13, "n < m");
    expect_err("root ::= \"a\"{10001}", KWK_ELIMIT, 1, 14, "over 10000");
    expect_err("root ::= \"a\"{1,99999}", KWK_ELIMIT, 1, 16, "over 10000");
    expect_err("root ::= \"a\"{1", KWK_ESYNTAX, 1, 15, "expected '}'");
    expect_err("root ::= \"a\"{x}", KWK_ESYNTAX, 1, 14, "expected a number");
    expect_err("root ::= [b-a]", KWK_ESYNTAX, 1, 11, "out of order");
    expect_err("root ::= [abc", KWK_ESYNTAX, 1, 10, "unterminated character class");
    expect_err("foo ::= \"a\"", KWK_ESYNTAX, 1, 1, "no rule 'root'");
    expect_err("root ::= \"a\"\nroot ::= \"b\"", KWK_ESYNTAX, 2, 1, "defined twice");
    expect_err("root ::= \"a\" \"b\"\n  | \"c\"", KWK_ESYNTAX, 2, 3, "expected a rule name");
    expect_err("root ::= (\"a\"", KWK_ESYNTAX, 1, 14, "expected ')'");
    expect_err("root ::= *", KWK_ESYNTAX, 1, 10, "expected an item");
    expect_err("root ::= \"a\" | *", KWK_ESYNTAX, 1, 16, "expected an item");
    expect_err("root = \"a\"", KWK_ESYNTAX, 1, 6, "expected '::='");
    expect_err("root ::= \"a\" )", KWK_ESYNTAX, 1, 14, "expected a symbol");
    expect_err("root ::= \"\xc3\"", KWK_ESYNTAX, 1, 11, "invalid UTF-8");
    expect_err("root ::= \"\xc0\xaf\"", KWK_ESYNTAX, 1, 11, "invalid UTF-8");
    expect_err("root ::= \"\xed\xa0\x80\"", KWK_ESYNTAX, 1, 11, "surrogate");
    expect_err("root ::= [\xff]", KWK_ESYNTAX, 1, 11, "invalid UTF-8");
    expect_err("\n\n  root ::= \"a\"\\", KWK_ESYNTAX, 3, 15, "expected a symbol");
    struct kwk_err err = compile_err("root ::= \"abc");
    T_EQ(err.pos, 9);
    /* Over the text limit. */
    size_t big = (size_t)KWK_GRAMMAR_TEXT_MAX + 1;
    char *t = malloc(big);
    memset(t, ' ', big);
    kwk_grammar *g = kwk_grammar_new(t, big, &err);
    T_TRUE(g == NULL);
    T_EQ(err.code, KWK_ELIMIT);
    free(t);
    T_TRUE(kwk_grammar_new(NULL, 3, &err) == NULL);
    T_EQ(err.code, KWK_EARG);
    T_EQ(kwk_grammar_match(NULL, "", 0, NULL), KWK_EARG);
    kwk_grammar_free(NULL);
}

/* ---- UTF-8 against a reference ---- */

/* The code point of s[n] when it is exactly one valid UTF-8 character, else -1. */
static long ref_utf8_one(const uint8_t *s, size_t n)
{
    if (n == 0)
        return -1;
    size_t len = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3
               : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    if (!len || len != n)
        return -1;
    long cp = len == 1 ? s[0] : s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return -1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const long min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    return cp;
}

static size_t enc(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

struct cls_case {
    const char *gbnf;
    uint32_t ranges[6][2]; /* the class's code points (after negation), {1, 0} ends */
};

static int cls_has(const struct cls_case *c, uint32_t cp)
{
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    for (int i = 0; i < 6 && c->ranges[i][0] <= c->ranges[i][1]; i++)
        if (cp >= c->ranges[i][0] && cp <= c->ranges[i][1])
            return 1;
    return 0;
}

static void test_utf8_classes(void)
{
    static const struct cls_case cases[] = {
        {"root ::= .", {{0, 0x10FFFF}, {1, 0}}},
        {"root ::= [^a-z]", {{0, 0x60}, {0x7B, 0x10FFFF}, {1, 0}}},
        {"root ::= [\\u0800-\\uFFFF]", {{0x800, 0xFFFF}, {1, 0}}},
        {"root ::= [\\u07FF-\\u0801\\u00E9\\U0001F600-\\U0001F64F]",
         {{0x7FF, 0x801}, {0xE9, 0xE9}, {0x1F600, 0x1F64F}, {1, 0}}},
        {"root ::= [^\\x00-\\x7F\\u0100-\\uD7FF\\U00010000-\\U0010FFFE]",
         {{0x80, 0xFF}, {0xE000, 0xFFFF}, {0x10FFFF, 0x10FFFF}, {1, 0}}},
        {"root ::= [\\u0041\\u00ff-\\u0101\\u0fff-\\u1001\\uffff-\\U00010001\\U0003FFFF-\\U00040000]",
         {{0x41, 0x41}, {0xFF, 0x101}, {0xFFF, 0x1001}, {0xFFFF, 0x10001}, {0x3FFFF, 0x40000},
          {1, 0}}},
    };
    for (size_t c = 0; c < KWK_ARRAY_LEN(cases); c++) {
        struct kwk_err err;
        kwk_grammar *g = kwk_grammar_new(cases[c].gbnf, strlen(cases[c].gbnf), &err);
        T_TRUE(g != NULL);
        if (!g)
            continue;
        int bad = 0;
        uint8_t b[4];
        /* Code points around every boundary, and random ones. */
        for (uint32_t k = 0; k < 40000 && bad < 5; k++) {
            uint32_t cp = k < 0x3000   ? k
                        : k < 0x4200   ? 0xD000 + (k - 0x3000)
                        : k < 0x4400   ? 0xFF00 + (k - 0x4200)
                        : k < 0x4500   ? 0x10FF00 + (k - 0x4400)
                        : k < 0x4600   ? 0x3FF80 + (k - 0x4500)
                        : k < 0x4700   ? 0x1F580 + (k - 0x4600)
                                       : t_rnd() % 0x110000;
            size_t n = enc(cp, b);
            int want = cls_has(&cases[c], cp);
            int got = kwk_grammar_match(g, (const char *)b, n, NULL);
            if (got != want) {
                bad++;
                T_CHECK(0, "%s: U+%04X: got %d, want %d", cases[c].gbnf, cp, got, want);
            }
        }
        /* Byte strings that are not one valid character never match; valid ones by the set. */
        for (uint32_t k = 0; k < 70000 && bad < 5; k++) {
            uint8_t s[4];
            size_t n;
            if (k < 65536) {
                s[0] = (uint8_t)(k >> 8), s[1] = (uint8_t)k, n = 2;
            } else {
                static const uint8_t leads[] = {0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xC0, 0xC1};
                s[0] = leads[t_rnd() % sizeof leads];
                s[1] = (uint8_t)t_rnd(), s[2] = (uint8_t)(0x80 | (t_rnd() & 0x3F));
                s[3] = (uint8_t)(0x80 | (t_rnd() & 0x3F));
                n = s[0] >= 0xF0 ? 4 : 3;
            }
            long cp = ref_utf8_one(s, n);
            int want = cp >= 0 && cls_has(&cases[c], (uint32_t)cp);
            int got = kwk_grammar_match(g, (const char *)s, n, NULL);
            if (got != want) {
                bad++;
                T_CHECK(0, "%s: %02x %02x %02x %02x (%zu): got %d, want %d", cases[c].gbnf, s[0],
                        s[1], s[2], s[3], n, got, want);
            }
        }
        T_EQ(bad, 0);
        kwk_grammar_free(g);
    }
    /* Surrogates, overlongs and past U+10FFFF are refused by `.` and by negated classes. */
    const char *dot = "root ::= [^x]";
    T_EQ(match(dot, "\xed\xa0\x80"), 0);
    T_EQ(match(dot, "\xed\xbf\xbf"), 0);
    T_EQ(match(dot, "\xc0\xaf"), 0);
    T_EQ(match(dot, "\xe0\x80\xaf"), 0);
    T_EQ(match(dot, "\xf0\x80\x80\xaf"), 0);
    T_EQ(match(dot, "\xf4\x90\x80\x80"), 0);
    T_EQ(match(dot, "\xff"), 0);
    T_EQ(match(dot, "\xf0\x9f\x98\x80"), 1);
    T_EQ(match(dot, "\xf4\x8f\xbf\xbf"), 1);
    T_EQ(match(dot, "\xed\x9f\xbf"), 1);
    T_EQ(match(dot, "\xee\x80\x80"), 1);
}

/* ---- JSON ---- */

static void test_json(void)
{
    struct kwk_err err;
    kwk_grammar *g = kwk_grammar_new(json_gbnf, strlen(json_gbnf), &err);
    T_TRUE(g != NULL);
    if (!g) {
        fprintf(stderr, "json grammar: %s\n", err.msg);
        return;
    }
    static const char *const good[] = {
        "{}",
        "{\"a\": 1}",
        "{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"e\"}}",
        "{\n  \"name\": \"Kwker\",\n  \"n\": -12.5e+3,\n  \"list\": [1, 2, 3]\n}",
        "{\"s\": \"esc \\\" \\\\ \\n \\u00e9 \\/\"}",
        "{\"utf8\": \"h\xc3\xa9llo \xe4\xb8\xad \xf0\x9f\x98\x80\"}",
        "{\"deep\": [[[[[[[[[[{\"x\": [[[]]]}]]]]]]]]]]}",
        "{\"a\": 0} ",
    };
    static const char *const bad[] = {
        "",
        "[]",
        "{\"a\" 1}",
        "{\"a\": 01}",
        "{\"a\": 1,}",
        "{\"a\": tru}",
        "{\"a\": \"x\ny\"}",
        "{\"a\": \"\\q\"}",
        "{\"a\": \"\\u12G4\"}",
        "{\"a\": \"\xed\xa0\x80\"}",
        "{\"a\": \"\xc3\"}",
        "{'a': 1}",
        "{\"a\": 1}}",
    };
    for (size_t i = 0; i < KWK_ARRAY_LEN(good); i++) {
        int p = 0;
        int r = kwk_grammar_match(g, good[i], strlen(good[i]), &p);
        T_CHECK(r == 1 && p == 1, "good json %zu: %s (got %d)", i, good[i], r);
    }
    for (size_t i = 0; i < KWK_ARRAY_LEN(bad); i++) {
        int r = kwk_grammar_match(g, bad[i], strlen(bad[i]), NULL);
        T_CHECK(r == 0, "bad json %zu: %s (got %d)", i, bad[i], r);
    }
    int p = 0;
    T_EQ(kwk_grammar_match(g, "{\"a\": [1, {\"b\": \"x", 18, &p), 0);
    T_EQ(p, 1);
    T_EQ(kwk_grammar_match(g, "{\"a\" x", 6, &p), 0);
    T_EQ(p, 0);
    /* Every byte split of a valid text: each prefix is a prefix, only the whole a match. */
    const char *t = good[3];
    size_t n = strlen(t);
    int ok = 1;
    for (size_t k = 0; k < n; k++)
        ok &= kwk_grammar_match(g, t, k, &p) == 0 && p == 1;
    T_TRUE(ok);
    kwk_grammar_free(g);
}

/* ---- limits ---- */

static void test_limits(void)
{
    /* Exponentially ambiguous: after n a's, 2^n distinct stacks. */
    const char *amb = "root ::= e\ne ::= \"a\" e \"b\" | \"a\" e \"c\" | \"d\"";
    T_EQ(match(amb, "aaaadbcbb"), 1);
    T_EQ(match(amb, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaad"), KWK_ELIMIT);
    /* Deep nesting: the stack depth limit. */
    size_t n = 2 * KG_DEPTH_MAX + 10;
    char *t = malloc(n + 1);
    memset(t, '(', n);
    t[n] = 0;
    T_EQ(match("root ::= \"(\" root \")\" | \"x\"", t), KWK_ELIMIT);
    /* Nested parentheses in the grammar text. */
    char *gb = malloc(KG_NEST_MAX + 100);
    strcpy(gb, "root ::= ");
    size_t k = strlen(gb);
    for (int i = 0; i <= KG_NEST_MAX; i++)
        gb[k++] = '(';
    gb[k] = 0;
    struct kwk_err err = compile_err(gb);
    T_EQ(err.code, KWK_ELIMIT);
    T_CONTAINS(err.msg, "nested deeper");
    /* Repetitions are linear: nested repeats compile; past the element budget, KWK_ELIMIT. */
    T_EQ(match("root ::= (((\"ab\"){100}){100}){100}", "ab"), 0);
    T_EQ(last_prefix, 1);
    /* A nullable body repeated a bounded number of times: each empty copy is a way through, so
     * the stacks grow with the count; fine for small counts, KWK_ELIMIT past the limits. */
    T_EQ(match("root ::= ((\"a\"{0,3}){0,5}){0,4}", "aaa"), 1);
    T_EQ(match("root ::= ((\"a\"{0,10000}){0,10000}){0,10000}", "aaa"), KWK_ELIMIT);
    size_t cap = 600 * 16 + 64;
    char *many = malloc(cap);
    strcpy(many, "root ::=");
    for (int i = 0; i < 600; i++)
        strcat(many, " \"a\"{10000}");
    err = compile_err(many);
    T_EQ(err.code, KWK_ELIMIT);
    T_CONTAINS(err.msg, "elements");
    free(many);
    free(gb);
    free(t);
}

/* ---- masks against whole-text matching ---- */

struct vocab_set {
    char **bytes;
    uint32_t *lens;
    int32_t n;
};

static void vocab_add(struct vocab_set *v, const char *s, uint32_t len)
{
    v->bytes = realloc(v->bytes, (size_t)(v->n + 1) * sizeof *v->bytes);
    v->lens = realloc(v->lens, (size_t)(v->n + 1) * sizeof *v->lens);
    v->bytes[v->n] = s ? malloc(len + 1) : NULL;
    if (s)
        memcpy(v->bytes[v->n], s, len);
    v->lens[v->n++] = len;
}

static void vocab_set_free(struct vocab_set *v)
{
    for (int32_t i = 0; i < v->n; i++)
        free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
}

/* Handcrafted JSON pieces, partial and invalid UTF-8, duplicates, an empty and a NULL token,
 * then random strings over the bytes that matter. */
static void vocab_build(struct vocab_set *v, int n_random)
{
    static const char *const pieces[] = {
        "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "\t", "\": ", "\":", ", \"", ",\"", "{\"",
        "\"}", "\"]", "}}", "]}", "true", "tru", "false", "null", "nul", "0", "1", "12", "01",
        "-", "-1", ".", ".5", "e", "E+", "e-", "1e5", "a", "ab", "name", " \"", "\\", "\\n",
        "\\u", "\\u00", "\\u00e9", "\\\"", "\\q", "x\ny", "\xc3\xa9", "\xc3", "\xa9", "\xe4\xb8",
        "\xad", "\xe4\xb8\xad", "\xf0\x9f", "\x98\x80", "\xf0\x9f\x98\x80", "\xff", "\xc0\xaf",
        "\xed\xa0\x80", "\xed", "\xa0\x80", "\xf4\x90", "\xf4\x8f\xbf\xbf", "  ", "\n  ",
        "{\n", " }", "\"a\"", "\"a\":", "\"\"", "1}", "1,", "true}", "], ", "\x7f", "\x01", "/",
        "\"ab\": [", "\xc3\xa9\"",
    };
    for (size_t i = 0; i < KWK_ARRAY_LEN(pieces); i++)
        vocab_add(v, pieces[i], (uint32_t)strlen(pieces[i]));
    vocab_add(v, "tru", 3); /* a duplicate */
    vocab_add(v, "", 0);
    vocab_add(v, NULL, 0);
    static const char alphabet[] = "{}[]\":, \n\\ae01.-tru\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\xed";
    for (int i = 0; i < n_random; i++) {
        char s[8];
        uint32_t len = 1 + t_rnd() % 6;
        for (uint32_t k = 0; k < len; k++)
            s[k] = alphabet[t_rnd() % (sizeof alphabet - 1)];
        vocab_add(v, s, len);
    }
}

/* Each token allowed by m (whose text so far is text[n]) iff text + token is a prefix of g;
 * the mask, kwk_matcher_allows and whole-text matching must agree. */
static int mask_check(const kwk_grammar *g, kwk_matcher *m, const struct vocab_set *v,
                      const char *text, size_t n)
{
    uint32_t *mask = calloc(((size_t)v->n + 31) / 32, sizeof *mask);
    char buf[512];
    int bad = 0;
    uint32_t *walked = calloc(((size_t)v->n + 31) / 32, sizeof *walked);
    int32_t count = kwk_matcher_mask(m, mask), want_count = 0;
    /* The same without the matcher's cache of recent masks. */
    T_EQ(kg_matcher_mask_walk(m, walked), count);
    T_TRUE(!memcmp(mask, walked, ((size_t)v->n + 31) / 32 * sizeof *mask));
    free(walked);
    memcpy(buf, text, n);
    for (int32_t i = 0; i < v->n && bad < 5; i++) {
        int want = 0, p = 0;
        if (v->bytes[i] && v->lens[i]) {
            memcpy(buf + n, v->bytes[i], v->lens[i]);
            int r = kwk_grammar_match(g, buf, n + v->lens[i], &p);
            want = r >= 0 && p;
        }
        want_count += want;
        int got = (int)(mask[i >> 5] >> (i & 31) & 1), allows = kwk_matcher_allows(m, i);
        if (got != want || allows != want) {
            bad++;
            T_CHECK(0, "text \"%.*s\" token %d \"%.*s\": mask %d allows %d want %d", (int)n, text,
                    i, (int)v->lens[i], v->bytes[i] ? v->bytes[i] : "", got, allows, want);
        }
    }
    T_EQ(count, want_count);
    int whole = kwk_grammar_match(g, text, n, NULL);
    T_EQ(kwk_matcher_done(m), whole == 1);
    free(mask);
    return bad;
}

static void test_masks(void)
{
    struct vocab_set vs = {0};
    struct kwk_err err;
    vocab_build(&vs, 400);
    kwk_grammar_vocab *v =
        kwk_grammar_vocab_from_bytes((const char *const *)vs.bytes, vs.lens, vs.n, &err);
    kwk_grammar *g = kwk_grammar_new(json_gbnf, strlen(json_gbnf), &err);
    T_TRUE(v != NULL && g != NULL);
    T_EQ(kwk_grammar_vocab_size(v), vs.n);
    kwk_matcher *m = kwk_matcher_new(g, v, &err);
    T_TRUE(m != NULL);
    if (!m)
        goto out;
    /* Walk a JSON text byte by byte through interesting states; check the mask at each. */
    const char *text = "{\"a\xc3\xa9\xe4\xb8\xad\": [1, -2.5e+3, \"x\\u00e9\\n\", true, {}], "
                       "\"b\":\n  {\"c\": null}}";
    size_t n = strlen(text);
    int bad = mask_check(g, m, &vs, "", 0);
    for (size_t k = 1; k <= n && !bad; k++) {
        T_EQ(kwk_matcher_accept_bytes(m, text + k - 1, 1), 0);
        if (k % 7 == 0) /* as when the tables outgrow their budget */
            T_EQ(kg_matcher_flush(m), 0);
        bad += mask_check(g, m, &vs, text, k);
    }
    T_EQ(bad, 0);
    T_EQ(kwk_matcher_done(m), 1);
    T_EQ(kwk_matcher_finished(m), 0); /* ws may follow */
    /* Refused input leaves the state alone. */
    T_EQ(kwk_matcher_accept_bytes(m, "x", 1), KWK_EARG);
    T_EQ(kwk_matcher_done(m), 1);
    T_EQ(kwk_matcher_accept_bytes(m, "\n ", 2), 0);
    T_EQ(kwk_matcher_accept(m, 5000000), KWK_ERANGE);
    T_EQ(kwk_matcher_accept(m, vs.n - 1), KWK_EARG); /* the NULL token */
    T_EQ(kwk_matcher_allows(m, -1), 0);
    /* Random generations: accept random allowed tokens, check against matching. */
    for (int run = 0; run < 20; run++) {
        if (run % 5 == 4)
            T_EQ(kg_matcher_flush(m), 0); /* reset must then rebuild the start */
        kwk_matcher_reset(m);
        char buf[512];
        size_t len = 0;
        uint32_t *mask = calloc(((size_t)vs.n + 31) / 32, sizeof *mask);
        for (int step = 0; step < 40; step++) {
            int32_t c = kwk_matcher_mask(m, mask);
            if (c <= 0)
                break;
            int32_t pick = (int32_t)(t_rnd() % (uint32_t)c), tok = -1;
            for (int32_t i = 0; i < vs.n; i++)
                if ((mask[i >> 5] >> (i & 31) & 1) && pick-- == 0)
                    tok = i;
            if (len + vs.lens[tok] >= sizeof buf - 1)
                break;
            T_EQ(kwk_matcher_accept(m, tok), 0);
            memcpy(buf + len, vs.bytes[tok], vs.lens[tok]);
            len += vs.lens[tok];
            int p = 0, r = kwk_grammar_match(g, buf, len, &p);
            T_TRUE(p == 1);
            T_EQ(kwk_matcher_done(m), r == 1);
        }
        bad += mask_check(g, m, &vs, buf, len);
        free(mask);
    }
    T_EQ(bad, 0);
    /* finished: a grammar that cannot go on. */
    kwk_grammar *g2 = kwk_grammar_new("root ::= \"ab\" | \"a\"", 19, &err);
    kwk_matcher *m2 = kwk_matcher_new(g2, v, &err);
    T_EQ(kwk_matcher_done(m2), 0);
    T_EQ(kwk_matcher_accept_bytes(m2, "a", 1), 0);
    T_EQ(kwk_matcher_done(m2), 1);
    T_EQ(kwk_matcher_finished(m2), 0);
    T_EQ(kwk_matcher_accept_bytes(m2, "b", 1), 0);
    T_EQ(kwk_matcher_finished(m2), 1);
    kwk_matcher_reset(m2);
    T_EQ(kwk_matcher_done(m2), 0);
    T_EQ(kwk_matcher_accept_bytes(m2, "ab", 2), 0);
    T_EQ(kwk_matcher_finished(m2), 1);
    kwk_matcher_free(m2);
    kwk_grammar_free(g2);
    /* A grammar that matches nothing: no token, never done. */
    g2 = kwk_grammar_new("root ::= []", 11, &err);
    m2 = kwk_matcher_new(g2, v, &err);
    T_TRUE(m2 != NULL);
    uint32_t none[64];
    T_EQ(kwk_matcher_mask(m2, none), 0);
    T_EQ(kwk_matcher_done(m2), 0);
    T_EQ(kwk_matcher_accept_bytes(m2, "a", 1), KWK_EARG);
    T_EQ(kg_matcher_flush(m2), 0);
    kwk_matcher_reset(m2);
    T_EQ(kwk_matcher_allows(m2, 0), 0);
    kwk_matcher_free(m2);
    kwk_grammar_free(g2);
    /* The ambiguous grammar in a matcher: KWK_ELIMIT, not a hang. */
    const char *amb = "root ::= e\ne ::= \"a\" e \"b\" | \"a\" e \"c\" | \"d\"";
    g2 = kwk_grammar_new(amb, strlen(amb), &err);
    m2 = kwk_matcher_new(g2, v, &err);
    int rc = 0;
    for (int i = 0; i < 40 && !rc; i++)
        rc = kwk_matcher_accept_bytes(m2, "a", 1);
    T_EQ(rc, KWK_ELIMIT);
    kwk_matcher_free(m2);
    kwk_grammar_free(g2);
out:
    kwk_matcher_free(m);
    kwk_grammar_free(g);
    kwk_grammar_vocab_free(v);
    vocab_set_free(&vs);
    kwk_matcher_free(NULL);
    kwk_grammar_vocab_free(NULL);
}

/* Allocation failures anywhere in compiling, matching and masking: an error, never a crash or
 * a leak. */
static void test_alloc_failures(void)
{
    struct vocab_set vs = {0};
    vocab_build(&vs, 50);
    int failures = 0, successes = 0;
    for (long k = 1; k < 4000; k++) {
        struct kwk_err err;
        kwk_alloc_fail_after(k);
        kwk_grammar *g = kwk_grammar_new(json_gbnf, strlen(json_gbnf), &err);
        kwk_grammar_vocab *v =
            kwk_grammar_vocab_from_bytes((const char *const *)vs.bytes, vs.lens, vs.n, &err);
        kwk_matcher *m = g && v ? kwk_matcher_new(g, v, &err) : NULL;
        uint32_t mask[32];
        int ok = m && kwk_matcher_accept_bytes(m, "{\"a\": [1", 8) == 0 &&
                 kwk_matcher_mask(m, mask) > 0 && kg_matcher_flush(m) == 0 &&
                 kwk_matcher_mask(m, mask) > 0 &&
                 kwk_grammar_match(g, "{\"a\": 1}", 8, NULL) == 1;
        if (m) { /* whatever failed, reset gives a working matcher or a dead one */
            kwk_matcher_reset(m);
            kwk_matcher_mask(m, mask);
        }
        kwk_alloc_fail_after(0);
        ok ? successes++ : failures++;
        kwk_matcher_free(m);
        kwk_grammar_vocab_free(v);
        kwk_grammar_free(g);
        if (ok && k > 50)
            break;
    }
    T_TRUE(failures > 0);
    T_TRUE(successes > 0);
    vocab_set_free(&vs);
}

/* ---- the real SmolLM2 tokenizer ---- */

static void test_real_tokenizer(void)
{
    if (!kwk_file_exists(SMOLLM2_GGUF)) {
        printf("test_grammar: *** SKIPPED the real-tokenizer test: %s is missing ***\n",
               SMOLLM2_GGUF);
        return;
    }
    struct kwk_err err;
    kwk_tokenizer *tok = kwk_tokenizer_load(SMOLLM2_GGUF, &err);
    T_TRUE(tok != NULL);
    if (!tok)
        return;
    kwk_grammar_vocab *v = kwk_grammar_vocab_new(tok, &err);
    kwk_grammar *g = kwk_grammar_new(json_gbnf, strlen(json_gbnf), &err);
    kwk_matcher *m = v && g ? kwk_matcher_new(g, v, &err) : NULL;
    T_TRUE(m != NULL);
    if (!m)
        goto out;
    int32_t nv = kwk_grammar_vocab_size(v);
    T_EQ(nv, kwk_tokenizer_n_vocab(tok));
    const char *text = "{\"name\": \"caf\xc3\xa9 \xe4\xb8\xad\", \"n\": [1, 2.5, -3e4], \"ok\": true}";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    T_EQ(kwk_tokenizer_encode_alloc(tok, text, strlen(text), 0, &ids, &n_ids), 0);
    uint32_t *mask = calloc(((size_t)nv + 31) / 32, sizeof *mask);
    char buf[4096];
    size_t len = 0;
    int bad = 0;
    for (size_t i = 0; i < n_ids && !bad; i++) {
        int32_t c = kwk_matcher_mask(m, mask);
        T_TRUE(c > 0);
        T_TRUE(mask[ids[i] >> 5] >> (ids[i] & 31) & 1);
        /* A sample of tokens against whole-text matching. */
        for (int32_t t = (int32_t)(i % 13); t < nv && bad < 5; t += 13) {
            size_t n = 0;
            if (kwk_tokenizer_is_special(tok, t) ||
                kwk_tokenizer_token_bytes(tok, t, buf + len, sizeof buf - len, &n) || !n) {
                bad += (int)(mask[t >> 5] >> (t & 31) & 1);
                continue;
            }
            int p = 0;
            kwk_grammar_match(g, buf, len + n, &p);
            if ((int)(mask[t >> 5] >> (t & 31) & 1) != p) {
                bad++;
                T_CHECK(0, "token %d \"%.*s\" after \"%.*s\"", t, (int)n, buf + len, (int)len, buf);
            }
        }
        size_t n = 0;
        T_EQ(kwk_tokenizer_token_bytes(tok, ids[i], buf + len, sizeof buf - len, &n), 0);
        len += n;
        T_EQ(kwk_matcher_accept(m, ids[i]), 0);
    }
    T_EQ(bad, 0);
    T_EQ(kwk_matcher_done(m), 1);
    T_TRUE(len == strlen(text) && !memcmp(buf, text, len));
    kwk_tokenizer_mem_free(ids);
    free(mask);
out:
    kwk_matcher_free(m);
    kwk_grammar_free(g);
    kwk_grammar_vocab_free(v);
    kwk_tokenizer_free(tok);
}

int main(void)
{
    test_literals();
    test_classes();
    test_repetition();
    test_layout();
    test_errors();
    test_utf8_classes();
    test_json();
    test_limits();
    test_masks();
    test_alloc_failures();
    test_real_tokenizer();
    return t_report("test_grammar");
}
