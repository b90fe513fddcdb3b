"""Chat templates against transformers: every real template (llama.cpp's collection, SmolLM2's,
Llama 3's) over a set of conversations must render byte-identical to the committed golden files
(tests/golden/templates/golden.json, made by make_golden.py with transformers) and to jinja2
rendering live in this process; where jinja2 fails, Kwker must fail too (raise_exception with
the same message)."""
import datetime
import importlib.util
import json
from pathlib import Path

import pytest

from kwker.template import ChatTemplate, TemplateError

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "templates"
_spec = importlib.util.spec_from_file_location("make_golden", GOLDEN_DIR / "make_golden.py")
mg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mg)

GOLDEN = json.loads((GOLDEN_DIR / "golden.json").read_text(encoding="utf-8"))
TEMPLATES = mg.templates()
CASES = [(t, c) for t in sorted(TEMPLATES) for c in sorted(mg.CONVERSATIONS)]
_compiled = {}


def kwk_render(name, conv):
    src, special = TEMPLATES[name]
    if name not in _compiled:
        _compiled[name] = ChatTemplate(src)
    ctx = mg.context(mg.CONVERSATIONS[conv], special)
    try:
        return {"text": _compiled[name].render(ctx, now=mg.FIXED_NOW)}
    except TemplateError as e:
        return {"error": str(e), "code": e.code}


def check(got, want, what):
    if "text" in want:
        assert "text" in got, "%s: jinja2 renders, Kwker failed: %s" % (what, got["error"])
        assert got["text"] == want["text"], "%s: output differs" % what
    else:
        assert "error" in got, "%s: jinja2 fails (%s) but Kwker rendered:\n%s" % (
            what, want["error"], got["text"])
        if want.get("raised"):
            # raise_exception: the very message, prefixed by the binding's "chat template: "
            assert got["error"].endswith(want["error"]), (got["error"], want["error"])


def test_golden_covers_every_case():
    assert sorted(GOLDEN["cases"]) == sorted(TEMPLATES)
    for t in TEMPLATES:
        assert sorted(GOLDEN["cases"][t]) == sorted(mg.CONVERSATIONS)
    assert len(CASES) >= 14 * 19


@pytest.mark.parametrize("name,conv", CASES, ids=["%s-%s" % c for c in CASES])
def test_golden(name, conv):
    check(kwk_render(name, conv), GOLDEN["cases"][name][conv], "%s / %s" % (name, conv))


@pytest.mark.parametrize("name,conv", CASES, ids=["%s-%s" % c for c in CASES])
def test_live_jinja2(name, conv):
    src, special = TEMPLATES[name]
    want = mg.render_jinja2(src, mg.context(mg.CONVERSATIONS[conv], special))
    check(kwk_render(name, conv), want, "%s / %s" % (name, conv))


def test_golden_has_real_text():
    # Most renders must produce text (not only errors), or the comparison proves little.
    texts = sum(1 for v in GOLDEN["cases"].values() for c in v.values() if "text" in c)
    assert texts >= 120


# The huggingface.js e2e file's 41 model templates (Zephyr, Mistral, Qwen 1.5-3, Command-R,
# Llama 3.1/3.2 Vision, SmolLM3, ...) over the same conversations, against jinja2 live.
_E2E = json.loads((mg.DATA / "chat-templates" / "hfjinja_e2e_cases.json").read_text("utf-8"))
E2E_TEMPLATES = [(s, n) for s in ("default_templates", "custom_templates") for n in _E2E[s]]


@pytest.mark.parametrize("section,name", E2E_TEMPLATES, ids=[n for _, n in E2E_TEMPLATES])
def test_e2e_templates_over_conversations(section, name):
    src = _E2E[section][name]["chat_template"]
    t = ChatTemplate(src)
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    for conv in sorted(mg.CONVERSATIONS):
        ctx = mg.context(mg.CONVERSATIONS[conv], special)
        want = mg.render_jinja2(src, ctx)
        try:
            got = {"text": t.render(ctx, now=mg.FIXED_NOW)}
        except TemplateError as e:
            got = {"error": str(e)}
        check(got, want, "%s / %s" % (name, conv))
