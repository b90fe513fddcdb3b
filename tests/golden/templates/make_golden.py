"""Make the chat-template golden files: every real template (llama.cpp's collection, SmolLM2's and
Llama 3's) rendered by transformers over a fixed set of conversations.

Rendering goes through transformers.utils.chat_template_utils.render_jinja_template, the function
tokenizer.apply_chat_template calls (same jinja2 environment: ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, HF's tojson, raise_exception, strftime_now), with the
clock fixed at FIXED_NOW and messages normalized as apply_chat_template normalizes them.

    python tests/golden/templates/make_golden.py          # rewrite golden.json
    python tests/golden/templates/make_golden.py --check  # compare with the committed file

golden.json: {"now": ..., "cases": {template_name: {conversation_name: {"text": ...} |
{"error": message, "raised": true if raise_exception}}}}.
"""
import datetime
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
DATA = Path(os.environ.get("KWKER_SHARED_DATA") or REPO.parent / "shared" / "data").resolve()
FIXED_NOW = datetime.datetime(2025, 7, 10, 12, 0, 0)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "max_results": {"type": "integer", "default": 5}},
            "required": ["query"]}}},
]

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What can you do?"}
A1 = {"role": "assistant", "content": "I can answer questions and help with tasks."}
U2 = {"role": "user", "content": "Tell me a joke."}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": {"location": "Paris, France",
                                                       "unit": "celsius"}}}]}
CALL_STR = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_9", "type": "function",
     "function": {"name": "search", "arguments": "{\"query\": \"jinja2 trim_blocks\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
          "content": "{\"temperature\": 22, \"condition\": \"sunny\"}"}
UNICODE = "Grüße, 世界! 🤗 «quotes» \"double\" 'single' back\\slash\ttab\nnew line {{ not jinja }} {% raw %}"

CONVERSATIONS = {
    "system_user_gen": {"messages": [SYS, U1], "add_generation_prompt": True},
    "system_user_nogen": {"messages": [SYS, U1], "add_generation_prompt": False},
    "user_only": {"messages": [U1], "add_generation_prompt": True},
    "multi_turn_gen": {"messages": [SYS, U1, A1, U2], "add_generation_prompt": True},
    "multi_turn_nosys_nogen": {"messages": [U1, A1, U2, A1], "add_generation_prompt": False},
    "tools_list": {"messages": [SYS, {"role": "user", "content": "Weather in Paris?"}],
                   "tools": TOOLS, "add_generation_prompt": True},
    "tool_call_and_result": {"messages": [{"role": "user", "content": "Weather in Paris?"}, CALL,
                                          RESULT],
                             "tools": TOOLS, "add_generation_prompt": True},
    "tool_call_full_turn": {"messages": [SYS, {"role": "user", "content": "Weather in Paris?"},
                                         CALL, RESULT,
                                         {"role": "assistant", "content": "It is 22 C and sunny."}],
                            "tools": TOOLS, "add_generation_prompt": False},
    "tool_call_string_args": {"messages": [{"role": "user", "content": "Look it up."}, CALL_STR],
                              "tools": TOOLS, "add_generation_prompt": False},
    "content_parts": {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe "},
                                     {"type": "text", "text": "this."}]}],
        "add_generation_prompt": True},
    "unicode_quotes": {"messages": [SYS, {"role": "user", "content": UNICODE},
                                    {"role": "assistant", "content": UNICODE + " ✓"}],
                       "add_generation_prompt": False},
    "unicode_quotes_gen": {"messages": [{"role": "user", "content": UNICODE}],
                           "add_generation_prompt": True},
    "extra_kwargs": {"messages": [SYS, U1], "add_generation_prompt": True,
                     "enable_thinking": False, "date_string": "01 Jan 2025"},
    "whitespace_content": {"messages": [{"role": "user", "content": "  padded  \n\n"},
                                        {"role": "assistant", "content": "\n answer \n"}],
                           "add_generation_prompt": False},
    "tools_multi_turn_unicode": {"messages": [SYS, U1, A1, {"role": "user", "content": UNICODE}],
                                 "tools": TOOLS, "add_generation_prompt": True},
    "tools_no_system_nogen": {"messages": [U1, A1], "tools": TOOLS[:1],
                              "add_generation_prompt": False},
    "flat_tools_documents": {"messages": [{"role": "user", "content": "Search for jinja."}],
                             "tools": [{"name": "internet_search",
                                        "description": "Search the internet.",
                                        "parameter_definitions": {"query": {
                                            "description": "What to search", "type": "str",
                                            "required": True}}}],
                             "documents": [{"title": "Jinja", "text": "A template engine."},
                                           {"title": "Kwker", "text": "An inference runtime."}],
                             "add_generation_prompt": True},
    "builtin_tools": {"messages": [SYS, {"role": "user", "content": "Search the news."}],
                      "tools": TOOLS, "builtin_tools": ["brave_search", "wolfram_alpha"],
                      "add_generation_prompt": True},
    "reasoning_field": {"messages": [U1, {"role": "assistant", "content": "Sure.",
                                          "reasoning_content": "The user greets me."}, U2],
                        "add_generation_prompt": True, "enable_thinking": True},
}


def templates():
    """name -> (source, special-token kwargs the tokenizer would pass)."""
    out = {}
    generic = {"bos_token": "<s>", "eos_token": "</s>"}
    for p in sorted((DATA / "chat-templates" / "llamacpp").glob("*.jinja")):
        out["llamacpp/" + p.stem] = (p.read_text(encoding="utf-8"), generic)
    smol = DATA / "tokenizers" / "smollm" / "SmolLM2-135M-Instruct"
    out["smollm2/chat_template"] = ((smol / "chat_template.jinja").read_text(encoding="utf-8"),
                                    {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                                     "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>"})
    cfg = json.loads((DATA / "tokenizers" / "llama3" / "tokenizer_config.json").read_text())
    out["llama3/tokenizer_config"] = (cfg["chat_template"], {"bos_token": cfg["bos_token"],
                                                             "eos_token": cfg["eos_token"]})
    return out


def context(conv, special):
    """The variables the template sees, as apply_chat_template passes them (JSON-able)."""
    from copy import deepcopy
    conv = deepcopy(conv)
    msgs = [{k: v for k, v in m.items() if v is not None} for m in conv.pop("messages")]
    fields = ("reasoning_content", "thinking", "reasoning")
    for i, m in enumerate(msgs):
        r = next((m[k] for k in fields if m.get(k) is not None), None)
        if r is not None:
            msgs[i] = {"thinking": r, **m, "reasoning_content": r}
    ctx = dict(special)
    ctx.update(conv)
    ctx["messages"] = msgs
    ctx.setdefault("tools", None)
    ctx.setdefault("documents", None)
    ctx.setdefault("add_generation_prompt", False)
    return ctx


def render_jinja2(source, ctx, now=FIXED_NOW):
    """Render with transformers' own environment; returns {"text"} or {"error", "raised"}."""
    import jinja2
    import transformers.utils.chat_template_utils as ctu

    class _Clock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return now

    saved = ctu.datetime
    ctu.datetime = _Clock
    try:
        c = dict(ctx)
        messages = c.pop("messages")
        tools = c.pop("tools")
        documents = c.pop("documents")
        agp = c.pop("add_generation_prompt")
        rendered, _ = ctu.render_jinja_template(conversations=[messages], tools=tools,
                                                documents=documents, chat_template=source,
                                                add_generation_prompt=agp, **c)
        return {"text": rendered[0]}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": str(e), "raised": False, "syntax": True}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises TemplateError itself; UndefinedError & co. are subclasses
        raised = type(e) is jinja2.exceptions.TemplateError
        return {"error": str(e), "raised": raised}
    except Exception as e:  # TypeError, ValueError ... from Python operations
        return {"error": "%s: %s" % (type(e).__name__, e), "raised": False}
    finally:
        ctu.datetime = saved


def build():
    cases = {}
    for name, (src, special) in templates().items():
        cases[name] = {cname: render_jinja2(src, context(conv, special))
                       for cname, conv in CONVERSATIONS.items()}
    return {"now": FIXED_NOW.isoformat(), "cases": cases}


def main():
    golden = build()
    path = HERE / "golden.json"
    text = json.dumps(golden, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    if "--check" in sys.argv:
        same = path.exists() and path.read_text(encoding="utf-8") == text
        print("golden.json is up to date" if same else "golden.json differs")
        return 0 if same else 1
    path.write_text(text, encoding="utf-8")
    n = sum(len(v) for v in golden["cases"].values())
    errs = sum(1 for v in golden["cases"].values() for c in v.values() if "error" in c)
    print("wrote %s: %d templates, %d renders (%d raise an error)" % (
        path, len(golden["cases"]), n, errs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
