"""Differential test: random small templates built from the constructs chat templates use, rendered
by Kwker and by transformers' jinja2 environment, must agree on the text (or both fail). The seed
is fixed so failures reproduce; KWKER_TEMPLATE_DIFF_N raises the count for longer local runs."""
import json
import os
import random
import re

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

from kwker.template import ChatTemplate, TemplateError

CTX = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi \"you\" 'there' ü 🤗"},
        {"role": "assistant", "content": "  Hello!\n", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [1.5, None]}}}]},
        {"role": "tool", "content": "42"},
        {"role": "user", "content": [{"type": "text", "text": "part"}]},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "does f",
                                                "parameters": {"type": "object"}}}],
    "n": 3, "f": 2.5, "s": "a,b, c", "e": "", "z": 0, "t": True, "none": None,
    "d": {"b": 2, "a": 1, "c": 3}, "l": [3, 1, 2], "ls": ["b", "A", "c"],
}

ATOMS = ["n", "f", "s", "e", "z", "t", "none", "d", "l", "ls", "missing", "messages[0]",
         "messages[1].content", "messages[-1]['content']", "messages[2].tool_calls[0].function",
         "tools[0]", "1", "0", "-2", "2.5", "1e3", "'x'", "\"q'q\"", "''", "true", "False", "None",
         "[1, 'a']", "{'k': 1}", "(1, 2)", "range(3)", "loop_var"]
FILTERS = ["length", "first", "last", "list", "string", "trim", "upper", "lower", "title",
           "capitalize", "tojson", "tojson(indent=2)", "join(',')", "default('D')",
           "default('D', true)", "items", "dictsort", "sort", "sort(reverse=true)", "unique",
           "reverse", "int", "float", "abs", "round", "round(1)", "wordcount", "count",
           "indent(2)", "indent(2, true)", "batch(2)", "select", "reject",
           "map(attribute='role')", "selectattr('role', 'equalto', 'user')",
           "rejectattr('content')", "replace('a', 'X')", "max", "min", "sum", "center(9)",
           "e", "safe", "pprint"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
         "iterable", "sequence", "boolean", "true", "false", "odd", "even", "divisibleby(2)",
         "eq(1)", "in([1, 'x'])", "lower", "upper"]
OPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">=", "in", "not in", "and",
       "or"]
METHODS = [".strip()", ".split(',')", ".split()", ".upper()", ".startswith('a')",
           ".endswith(('c', 'x'))", ".replace('a', 'b')", ".find('b')", ".lstrip('a')",
           ".rstrip()", ".title()", ".count('a')", ".get('a')", ".get('zz', 7)", ".items()",
           ".keys()", ".values()", "[1:]", "[::-1]", "[0]", "[-1]", "[:2]"]


def expr(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice(ATOMS)
    if r < 0.45:
        return "%s|%s" % (expr(rng, depth + 1), rng.choice(FILTERS))
    if r < 0.55:
        return "%s is %s%s" % (expr(rng, depth + 1), rng.choice(["", "not "]), rng.choice(TESTS))
    if r < 0.75:
        return "(%s %s %s)" % (expr(rng, depth + 1), rng.choice(OPS), expr(rng, depth + 1))
    if r < 0.85:
        return "(%s)%s" % (expr(rng, depth + 1), rng.choice(METHODS))
    if r < 0.92:
        return "(%s if %s else %s)" % (expr(rng, depth + 1), expr(rng, depth + 1),
                                       expr(rng, depth + 1))
    return "not %s" % expr(rng, depth + 1)


def stmt(rng, depth=0):
    r = rng.random()
    ws = lambda: rng.choice(["", "-"])  # noqa: E731
    nl = rng.choice(["", "\n", "\n  ", " "])
    if depth > 2 or r < 0.35:
        return "%s{{%s %s %s}}" % (nl, ws(), expr(rng), ws())
    if r < 0.5:
        return "%s{%%%s if %s %s%%}%s{%%%s else %s%%}%s{%% endif %%}" % (
            nl, ws(), expr(rng), ws(), body(rng, depth + 1), ws(), ws(), body(rng, depth + 1))
    if r < 0.65:
        it = rng.choice(["messages", "l", "ls", "d", "d.items()", "s", "range(3)", "tools",
                         "missing", "n"])
        var = "k, loop_var" if it == "d.items()" else "loop_var"
        extra = rng.choice(["", "{{ loop.index }}{{ loop.first }}{{ loop.last }}",
                            "{{ loop.revindex0 }}{{ loop.length }}", "{{ loop.cycle('a', 'b') }}",
                            "{% if loop.index > 1 %}{% break %}{% endif %}",
                            "{% if loop.first %}{% continue %}{% endif %}x"])
        return "%s{%%%s for %s in %s %s%%}%s%s{%% else %%}E{%% endfor %%}" % (
            nl, ws(), var, it, ws(), extra, body(rng, depth + 1))
    if r < 0.75:
        return "%s{%% set v = %s %%}{{ v }}" % (nl, expr(rng))
    if r < 0.85:
        return ("%s{%% set ns = namespace(c=0) %%}{%% for x in l %%}{%% set ns.c = ns.c + x %%}"
                "{%% endfor %%}{{ ns.c }}" % nl)
    if r < 0.93:
        return ("%s{%% macro m(a, b='B') %%}[{{ a }}|{{ b }}]{%% endmacro %%}{{ m(%s) }}{{ m(1, b=%s) }}"
                % (nl, expr(rng), expr(rng)))
    return "%s{# c #}%s" % (nl, body(rng, depth + 1))


def body(rng, depth):
    return "".join(stmt(rng, depth) for _ in range(rng.randint(1, 2)))


def jinja2_render(src):
    from transformers.utils.chat_template_utils import _compile_jinja_template
    try:
        return "T", _compile_jinja_template(src).render(**CTX)
    except Exception as e:  # any jinja2 or Python error
        return "E", "%s: %s" % (type(e).__name__, e)


def kwk_render(src):
    try:
        return "T", ChatTemplate(src).render(CTX)
    except TemplateError as e:
        return "E", str(e)


N = int(os.environ.get("KWKER_TEMPLATE_DIFF_N", "400"))
LAZY_ERRORS = ("is not iterable", "item pairs")
GENERATOR_FILTERS = ("|select", "|reject", "|map", "|batch", "|items", "|reverse", "|unique")


@pytest.mark.parametrize("chunk", range(4))
def test_random_templates_agree(chunk):
    rng = random.Random(1234 + chunk)
    bad = []
    for i in range(N // 4):
        src = body(rng, 0)
        want, got = jinja2_render(src), kwk_render(src)
        if want[0] == "T" and re.search(r"0x[0-9a-f]{6,}", want[1], re.I):
            continue  # jinja2 printed a Python object's address: nothing stable to compare
        if (want[0] == "T" and got[0] == "E" and any(e in got[1] for e in LAZY_ERRORS) and
                any(f in src for f in GENERATOR_FILTERS)):
            # jinja2's select/map/batch/items are lazy generators: a non-iterable input only
            # fails when consumed; Kwker checks it at once (known, documented divergence)
            continue
        if want[0] == "T" and got[0] == "E" and "is not subscriptable" in got[1]:
            # jinja2's compile-time constant folding turns e.g. (2.5)[:2] into an undefined
            # value instead of the TypeError the same slice raises on a variable
            continue
        if want[0] == "T" and ("dict_items(" in want[1] or "dict_keys(" in want[1] or
                               "dict_values(" in want[1]):
            continue  # Python's dict views print with their type name; Kwker prints lists
        if want[0] != got[0] or (want[0] == "T" and want[1] != got[1]):
            bad.append({"template": src, "jinja2": want, "kwker": got})
    assert not bad, "%d of %d differ, first ones:\n%s" % (
        len(bad), N // 4, json.dumps(bad[:5], ensure_ascii=False, indent=1))
