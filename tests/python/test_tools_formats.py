"""Tool-call formats beyond Hermes / Llama 3 / generic, end to end on SmolLM2-135M-Instruct with
the real templates llama.cpp keeps (given with --chat-template-file; their special tokens are
plain text to this vocabulary, which is enough for a format): Mistral Nemo, Functionary v3.1,
DeepSeek R1 distills, Firefunction v2, and Command R+ (read as llama.cpp reads it: the generic
JSON reply).

- The prompt `kwker serve` renders for a conversation with tools, earlier calls and their
  results equals transformers' render_jinja_template (what apply_chat_template runs) of the
  same messages and tools, as token ids.
- tool_choice "required" / named: the grammar holds the model to the format and the tools'
  schemas from the first byte, and the reply is read back as calls whose arguments validate;
  streamed, the deltas add up to the same reply.
The formats' parsers on malformed text, every byte cut and the grammars' refusals are
tests/c/test_toolcall.c.
"""
import json
import re

import jsonschema
import pytest

from conftest import SHARED_DATA
from test_grammar import dec, tok  # noqa: F401 (the same SmolLM2 fixtures)
from test_tools import serve

# every parameter described: Command R+'s template writes each one's description
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 40,
                                           "description": "The city"},
                                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                                           "description": "Degrees of"}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object",
                   "properties": {"zone": {"type": "string", "maxLength": 40,
                                           "description": "An IANA zone"}},
                   "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}

TEMPLATES = SHARED_DATA / "chat-templates" / "llamacpp"
FILES = {
    "mistral_nemo": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "functionary": "meetkai-functionary-medium-v3.1.jinja",
    "deepseek_r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "deepseek_r1_llama": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "firefunction": "fireworks-ai-llama-3-firefunction-v2.jinja",
    "command_r_plus": "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
}
# the templates that join a call's arguments to strings want them as the request's JSON text;
# the others write them with tojson, from the object transformers' examples give
TEXT_ARGS = {"functionary", "deepseek_r1", "deepseek_r1_llama", "firefunction"}


@pytest.fixture(scope="module", params=sorted(FILES))
def server(request):
    # Firefunction's prompt holds the time to the second: a fixed clock renders a request
    # twice the same (streamed and not), as the tests compare
    mp = pytest.MonkeyPatch()
    mp.setenv("SOURCE_DATE_EPOCH", "1751328000")
    request.addfinalizer(mp.undo)
    gen = serve("--chat-template-file", TEMPLATES / FILES[request.param])
    srv = next(gen)
    srv.format = request.param
    yield srv
    next(gen, None)


def history(fmt, text_args):
    """A conversation with an earlier call and its result (Mistral's template wants ids of 9
    letters or digits)."""
    args = {"city": "Paris"}
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "abcDEF123", "type": "function",
                 "function": {"name": "get_weather",
                              "arguments": json.dumps(args) if text_args else args}}]},
            {"role": "tool", "tool_call_id": "abcDEF123", "content": '{"temp": 21}'},
            # Mistral's template wants user and assistant turns to alternate (the call's turn
            # and the result aside), R1's closes the results at the next assistant turn
            {"role": "assistant", "content": "It is 21 degrees."},
            {"role": "user", "content": "And in Rome?"}]
    return msgs


def generic_system(tools, system):
    """The generic format's instructions (toolcall.c's generic_system), after the request's own
    system message, as llama.cpp's generic format adds its own."""
    lines = [system, "", "You can call the following tools. Each is given as JSON: its name, "
             "what it does, and the JSON Schema of its arguments."]
    lines += [json.dumps(t["function"], separators=(",", ":")) for t in tools]
    lines.append('Answer with one JSON object: {"tool_calls": [{"name": <a tool\'s name>, '
                 '"arguments": <its arguments>}]} to call tools, or {"response": <your reply '
                 'as a string>} to answer the user directly.')
    return "\n".join(lines)


def transformers_prompt(tok, fmt, msgs, tools, **extra):
    import transformers.utils.chat_template_utils as ctu
    src = (TEMPLATES / FILES[fmt]).read_text()
    out, _ = ctu.render_jinja_template(
        conversations=[msgs], tools=tools, chat_template=src, add_generation_prompt=True,
        bos_token=tok.bos_token, eos_token=tok.eos_token, **extra)
    return out[0]


def test_prompt_equals_transformers(server, tok):
    from test_server import request
    fmt, tools = server.format, [WEATHER, TIME]
    status, body = request(server.port, "POST", "/tokenize", body={
        "messages": history(fmt, True), "tools": tools})
    assert status == 200, body
    msgs = history(fmt, fmt in TEXT_ARGS)
    extra = {}
    if fmt == "command_r_plus":  # the generic reply, described in the system message
        msgs[0] = dict(msgs[0], content=generic_system(tools, msgs[0]["content"]))
    if fmt == "firefunction":  # llama.cpp's context: "functions" and "datetime", no "tools"
        text = tok.decode(body["tokens"])
        when = re.search(r"\nToday is ([A-Z][a-z]{2} \d\d \d{4} \d\d:\d\d:\d\d GMT)\.", text)
        assert when, text
        extra = {"functions": json.dumps(tools, indent=2, ensure_ascii=False),
                 "datetime": when.group(1)}
        tools = None
    want = transformers_prompt(tok, fmt, msgs, tools, **extra)
    got = tok.decode(body["tokens"])
    assert got == want
    assert body["tokens"] == tok.encode(want, add_special_tokens=False)


def test_plain_chat_equals_transformers(server, tok):
    """A request without tools renders as transformers renders the template without them:
    Firefunction's still gets "functions" ("") and "datetime", as llama.cpp gives them (its
    template refuses a context without), here the fixture's fixed clock; a template that
    refuses to render without tools (Command R+'s tool-use one) is a 400 as transformers
    raises."""
    from test_server import request
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"}]
    status, body = request(server.port, "POST", "/tokenize", body={"messages": msgs})
    extra = {}
    if server.format == "firefunction":
        extra = {"functions": "", "datetime": "Jul 01 2025 00:00:00 GMT"}
    try:
        want = transformers_prompt(tok, server.format, msgs, None, **extra)
    except Exception as err:  # jinja2's errors: the template itself refuses
        assert server.format == "command_r_plus", err
        assert status == 400 and body["error"]["code"] == "chat_template_error", body
        return
    assert status == 200, body
    assert tok.decode(body["tokens"]) == want


def check_calls(fmt, msg, names):
    assert msg.tool_calls, msg
    ids = set()
    for c in msg.tool_calls:
        assert c.type == "function" and c.id not in ids
        ids.add(c.id)
        if fmt == "mistral_nemo":  # the model's own id, as its template asks them back
            assert re.fullmatch(r"[a-zA-Z0-9]{9}", c.id), c.id
        else:
            assert c.id.startswith("call_") and len(c.id) == 29
        assert c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("parallel", [False, True])
def test_required_and_named_calls(server, parallel):
    client = server.client()
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]
    choices = [("required", {"get_weather", "get_time"}),
               ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})]
    for choice, names in choices[:1] if parallel else choices:
        kw = dict(model=model, messages=msgs, tools=[WEATHER, TIME], tool_choice=choice,
                  temperature=0, max_tokens=150 if parallel else 300,
                  parallel_tool_calls=parallel)
        ch = client.chat.completions.create(**kw).choices[0]
        if parallel and ch.finish_reason == "length":
            # the small model may go on calling until max_tokens: a reply cut in mid-call is
            # content (what follows checks that the stream says the same)
            assert not ch.message.tool_calls and ch.message.content
        else:
            assert ch.finish_reason == ("tool_calls" if choice == "required" else "stop"), ch
            assert ch.message.content is None
            check_calls(server.format, ch.message, names)
        if not parallel:
            assert len(ch.message.tool_calls) == 1
        # streamed: the same calls
        calls, content = {}, ""
        for chunk in client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                c["id"] += tc.id or ""
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
        assert content == (ch.message.content or "")
        got = [calls[i] for i in sorted(calls)]
        want = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in ch.message.tool_calls or []]
        if server.format != "mistral_nemo":  # ids are made per request
            got = [dict(c, id=None) for c in got]
            want = [dict(c, id=None) for c in want]
        assert got == want


def test_auto_free_text_is_content(server):
    """tool_choice "auto": a reply that never writes the format's opening is free text (the
    lazy grammar never triggered), all of it content, streamed to the same text. R1's prompt
    opens a think block that SmolLM2 never closes: its free text is reasoning_content
    (llama.cpp's reading of a forced-open block), streamed as it came."""
    client = server.client()
    model = client.models.list().data[0].id
    kw = dict(model=model, tools=[WEATHER], temperature=0, max_tokens=40,
              messages=[{"role": "user", "content": "What is the capital of France?"}])
    ch = client.chat.completions.create(**kw).choices[0]
    assert not ch.message.tool_calls and ch.finish_reason in ("stop", "length"), ch
    assert ch.message.content is not None  # (SmolLM2 under Mistral's template stops at once)
    reasoning = getattr(ch.message, "reasoning_content", None)
    assert bool(reasoning) == server.format.startswith("deepseek_r1"), ch.message
    chunks = [p.choices[0].delta for p in client.chat.completions.create(stream=True, **kw)
              if p.choices]
    assert "".join(d.content or "" for d in chunks) == ch.message.content
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in chunks) == (
        reasoning or "")
