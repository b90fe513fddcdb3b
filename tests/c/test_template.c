/* test_template.c - unit tests of the chat-template engine: lexer (whitespace control), parser
 * (precedence, errors with line/column), values (Python printing, equality, ordering), JSON in
 * and out, the public API, limits and allocation failures. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kwker.h"
#include "test.h"
#include "text/template.h"

/* Render src with context json (NULL = none); returns a static copy of the output or of
 * "ERR <code>: <message>". */
static char result[1 << 16];

static const char *render_opts(const char *src, const char *json, int trim, int dialect,
                               const struct kwk_render_opts *ro)
{
    struct kwk_template_opts o;
    struct kwk_err err;
    kwk_template_opts_init(&o);
    o.trim_blocks = o.lstrip_blocks = trim;
    o.dialect = dialect;
    kwk_template *t = kwk_template_new(src, strlen(src), &o, &err);
    if (!t) {
        snprintf(result, sizeof result, "ERR %d: %s", err.code, err.msg);
        return result;
    }
    char *out = NULL;
    size_t n = 0;
    int rc = kwk_template_render(t, json, json ? strlen(json) : 0, ro, &out, &n, &err);
    if (rc)
        snprintf(result, sizeof result, "ERR %d: %s", rc, err.msg);
    else
        snprintf(result, sizeof result, "%.*s", (int)n, out);
    kwk_string_free(out);
    kwk_template_free(t);
    return result;
}

static const char *render(const char *src, const char *json)
{
    return render_opts(src, json, 1, KWK_TEMPLATE_JINJA2, NULL);
}

static void test_lexer(void)
{
    struct tarena a;
    struct ttoken *toks;
    size_t n;
    struct kwk_err err;
    struct tlex_opts o = {1, 1};
    ta_init(&a, 0);
    const char *src = "a {{ x.0.1 }}{% if 1.5e3 != 'q\\n' %}b{% endif %}";
    T_EQ(tpl_lex(src, strlen(src), &o, &a, &toks, &n, &err), 0);
    /* DATA VB NAME . INT . INT VE BB NAME FLOAT != STRING BE DATA BB NAME BE EOF */
    T_EQ(n, 19);
    T_EQ(toks[0].type, TK_DATA);
    T_EQ(toks[4].type, TK_INT); /* "0" after a dot is never the start of a float */
    T_EQ(toks[6].type, TK_INT);
    T_EQ(toks[10].type, TK_FLOAT);
    T_NEAR(toks[10].fval, 1500.0, 0);
    T_EQ(toks[12].type, TK_STRING);
    T_EQ(toks[12].n, 2);
    T_TRUE(toks[12].p[1] == '\n');
    T_EQ(toks[18].type, TK_EOF);
    ta_free(&a);

    /* Whitespace control as jinja2 does it. */
    T_STREQ(render("  {% if true %}\n  x\n  {% endif %}\n", NULL), "  x\n");
    T_STREQ(render_opts("  {% if true %}\n  x\n  {% endif %}\n", NULL, 0, 0, NULL),
            "  \n  x\n  ");
    T_STREQ(render("a  {%- if true -%}  b  {%- endif %}", NULL), "ab");
    T_STREQ(render("a\n  {%+ if true %}b{% endif +%}\nc", NULL), "a\n  b\nc");
    T_STREQ(render("x {# comment #}\ny", NULL), "x y");
    T_STREQ(render("{% raw %}{{ a }}{% endraw %}", NULL), "{{ a }}");
    T_STREQ(render("a\r\nb\n", NULL), "a\nb"); /* newlines normalized, one trailing dropped */
    T_STREQ(render("{{ 'a' 'b' }}{{ \"\\u00e9\\x41\" }}", NULL), "abéA");
}

static void test_parser(void)
{
    T_STREQ(render("{{ 1 + 2 * 3 ** 2 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}", NULL), "19|9|64");
    T_STREQ(render("{{ -2|abs }}|{{ not 1 == 2 }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}", NULL),
            "2|True|True|False");
    T_STREQ(render("{{ 'a' ~ 1 * 3 }}|{{ 1 if 0 else 2 if 0 else 3 }}", NULL), "a3|3");
    T_STREQ(render("{{ x is divisibleby 3 }}{{ x is not none and x is odd }}", "{\"x\": 9}"),
            "TrueTrue");
    T_STREQ(render("{{ [1, 2, ][1] }}{{ {'a': 1, }['a'] }}{{ () }}{{ (1,) }}", NULL),
            "21()(1,)");
    T_STREQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}", NULL), "21");

    const char *r = render("ok\n{% if x %}\n  {{ 1 + }}\n{% endif %}", NULL);
    T_CONTAINS(r, "ERR -10006");
    T_CONTAINS(r, "line 3");
    struct kwk_err err;
    const char *bad = "a\n{{ 1 +* 2 }}";
    kwk_template *t = kwk_template_new(bad, strlen(bad), NULL, &err);
    T_TRUE(t == NULL);
    T_EQ(err.code, KWK_ESYNTAX);
    T_EQ(err.line, 2);
    T_EQ(err.col, 7);
    T_CONTAINS(err.msg, "column 7");
    T_CONTAINS(render("{% for x in y %}", NULL), "expected 'endfor'");
    T_CONTAINS(render("{% if x %}{% endfor %}", NULL), "ERR -10006");
    T_CONTAINS(render("{{ 'abc }}", NULL), "unterminated string");
    T_CONTAINS(render("{% break %}", NULL), "outside of a loop");
    T_CONTAINS(render("{{ (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
                      "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
                      "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
                      "1 }}", NULL), "ERR");
}

static void test_values(void)
{
    char buf[64];
    static const struct {
        double f;
        const char *s;
    } floats[] = {{1.0, "1.0"}, {0.1, "0.1"}, {1e20, "1e+20"}, {1e16, "1e+16"},
                  {1e15, "1000000000000000.0"}, {1e-5, "1e-05"}, {0.0001, "0.0001"},
                  {-2.5, "-2.5"}, {123456789.125, "123456789.125"}, {5e-324, "5e-324"},
                  {1.7976931348623157e308, "1.7976931348623157e+308"}, {-0.0, "-0.0"}};
    for (size_t i = 0; i < KWK_ARRAY_LEN(floats); i++) {
        tv_float_repr(floats[i].f, buf, sizeof buf);
        T_STREQ(buf, floats[i].s);
    }
    T_STREQ(render("{{ x }}|{{ x|string }}|{{ x|tojson }}|{{ x|pprint }}",
                   "{\"x\": [1, 2.0, \"it's\", \"q\\\"\", null, true, {\"k\": []}]}"),
            "[1, 2.0, \"it's\", 'q\"', None, True, {'k': []}]|"
            "[1, 2.0, \"it's\", 'q\"', None, True, {'k': []}]|"
            "[1, 2.0, \"it's\", \"q\\\"\", null, true, {\"k\": []}]|"
            "[1, 2.0, \"it's\", 'q\"', None, True, {'k': []}]");
    T_STREQ(render("{{ 1 == 1.0 }}{{ true == 1 }}{{ [1] == [1.0] }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}",
                   NULL), "TrueTrueTrueTrueTrue");
    T_CONTAINS(render("{{ 1 < 'a' }}", NULL), "'<' not supported between instances of 'int' and 'str'");
    T_CONTAINS(render("{{ 'a' + 1 }}", NULL), "can only concatenate str");
    T_STREQ(render("{{ [] or 'e' }}{{ 0 and 1 }}{{ '' ~ none }}", NULL), "e0None");
    T_STREQ(render("{{ 'ü'|upper }}{{ 'ÀB'|lower }}{{ 'hello world-x'|title }}{{ 'aBC'|capitalize }}",
                   NULL), "ÜàbHello World-XAbc");
    T_STREQ(render("{{ d|dictsort }}{{ d|items|list }}", "{\"d\": {\"b\": 1, \"a\": 2}}"),
            "[('a', 2), ('b', 1)][('b', 1), ('a', 2)]");
    T_STREQ(render("{{ xs|sort(attribute='n')|map(attribute='n')|join(',') }}",
                   "{\"xs\": [{\"n\": 3}, {\"n\": 1}, {\"n\": 2}]}"), "1,2,3");
    T_STREQ(render("{{ xs|selectattr('r', 'equalto', 'u')|list|length }}"
                   "{{ xs|rejectattr('r')|list }}", "{\"xs\": [{\"r\": \"u\"}, {\"r\": \"\"}]}"),
            "1[{'r': ''}]");
    T_STREQ(render("{{ 'a\\nb'|indent(2) }}|{{ 'a\\n\\nb\\n'|indent(2, true) }}", NULL),
            "a\n  b|  a\n\n  b\n");
    T_STREQ(render("{{ x|tojson(indent=2, sort_keys=true) }}", "{\"x\": {\"b\": [], \"a\": {}}}"),
            "{\n  \"a\": {},\n  \"b\": []\n}");
    T_STREQ(render("{{ x|tojson }}", "{\"x\": \"\\u0000\\u001f\\u007f\\ud83e\\udd17\"}"),
            "\"\\u0000\\u001f\x7f\xf0\x9f\xa4\x97\"");
    T_STREQ(render("{{ x }}", "{\"x\": 12345678901234567890}"), "1.2345678901234567e+19");
    T_CONTAINS(render("{{ x }}", "{\"x\": [1, 2"), "ERR -10001");
    T_CONTAINS(render("{{ x }}", "[1]"), "must be an object");
}

static void test_limits(void)
{
    struct kwk_render_opts ro;
    kwk_render_opts_init(&ro);
    ro.max_steps = 10000;
    T_CONTAINS(render_opts("{% for i in range(100000) %}{{ i }}{% endfor %}", NULL, 1, 0, &ro),
               "step limit");
    kwk_render_opts_init(&ro);
    ro.max_output = 1000;
    T_CONTAINS(render_opts("{% for i in range(1000) %}xxxx{% endfor %}", NULL, 1, 0, &ro),
               "ERR -10003");
    T_CONTAINS(render_opts("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                           "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, 1, 0, &ro),
               "ERR -10003");
    T_CONTAINS(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL), "depth limit");
    kwk_render_opts_init(&ro);
    ro.max_memory = 1 << 20;
    T_CONTAINS(render_opts("{% set ns = namespace(l=[]) %}{% for i in range(1000000) %}"
                           "{% set ns.l = ns.l + [i] %}{% endfor %}", NULL, 1, 0, &ro),
               "ERR -10003");
    T_CONTAINS(render("{{ raise_exception('boom') }}", NULL), "ERR -10007: boom");
    T_CONTAINS(render("{{ strftime_now('%Y') | length }}", NULL), "4");
    kwk_render_opts_init(&ro);
    ro.now = 1752148800; /* 2025-07-10 12:00:00 */
    ro.have_now = 1;
    T_STREQ(render_opts("{{ strftime_now('%d %b %Y %H:%M') }}", NULL, 1, 0, &ro),
            "10 Jul 2025 12:00");
}

static void test_alloc_failures(void)
{
    /* Every allocation failing in turn must give an error, never a crash or a leak. */
    const char *src = "{% for m in messages %}{{ m.role|upper }}: {{ m.content|tojson }}"
                      "{% endfor %}{{ messages|map(attribute='role')|join(',') }}";
    const char *json = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
                       "{\"role\": \"assistant\", \"content\": [1, 2]}]}";
    int ok = 0, failed = 0;
    for (long n = 1; n < 200; n++) {
        kwk_alloc_fail_after(n);
        const char *r = render(src, json);
        kwk_alloc_fail_after(0);
        if (!strncmp(r, "ERR", 3))
            failed++;
        else if (!strcmp(r, "USER: \"hi\"ASSISTANT: [1, 2]user,assistant"))
            ok++;
        else
            T_STREQ(r, "USER: \"hi\"ASSISTANT: [1, 2]user,assistant");
    }
    T_TRUE(failed > 0);
    T_TRUE(ok > 0);
}

static void test_api_args(void)
{
    struct kwk_err err;
    char *out = (char *)1;
    T_EQ(kwk_template_render(NULL, NULL, 0, NULL, &out, NULL, &err), KWK_EARG);
    kwk_template *t = kwk_template_new("", 0, NULL, &err);
    T_TRUE(t != NULL);
    size_t n = 7;
    T_EQ(kwk_template_render(t, NULL, 0, NULL, &out, &n, &err), 0);
    T_EQ(n, 0);
    T_STREQ(out, "");
    kwk_string_free(out);
    kwk_template_free(t);
    kwk_template_free(NULL);
    kwk_string_free(NULL);
    T_STREQ(render_opts("{{ true }}{{ [1, 'a'] }}{{ 'n' + 1 }}", NULL, 0, KWK_TEMPLATE_HFJS, NULL),
            "true[1, \"a\"]n1");
}

int main(void)
{
    test_lexer();
    test_parser();
    test_values();
    test_limits();
    test_alloc_failures();
    test_api_args();
    return t_report("test_template");
}
