"""Tool calls end to end, on the real SmolLM2-135M-Instruct (the bundled GGUF).

- A lazy grammar (kwk_gen_params.grammar_trigger): free text until the trigger, then the
  grammar. Greedy tokens equal a reference loop (the decoder's logits; argmax while the trigger
  has not come, a token that brings it with bytes the grammar refuses set aside; the matcher's
  mask after it), alone and through the engine.
- `kwker serve` with "tools", through the official openai client: the generic format (SmolLM2's
  own template knows no tools) and the Hermes format (Qwen 2.5's template given with
  --chat-template-file): tool_choice required / named / auto / none, calls whose arguments
  validate against the tool's schema, streaming deltas equal to the whole reply, earlier calls
  and tool results in the history rendered as transformers renders them, bad requests as 400s.
"""
import json

import jsonschema
import numpy as np
import pytest

from conftest import SHARED_DATA
from kwker.grammar import Grammar, Matcher
from kwker.template import ChatTemplate
from test_grammar import dec, tok, vocab  # noqa: F401 (the same SmolLM2 fixtures)

TEMPLATES = SHARED_DATA / "chat-templates" / "llamacpp"
QWEN_TEMPLATE = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
LLAMA31_TEMPLATE = TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a time zone",
                 "parameters": {"type": "object",
                                "properties": {"zone": {"type": "string", "maxLength": 40}},
                                "required": ["zone"], "additionalProperties": False}},
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
# a user turn after which SmolLM2 under Qwen's tool prompt writes the call itself (greedy)
ECHO_CALL = ('Reply with exactly this text: <tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Paris"}}\n</tool_call>')


def qwen_ids(tok, messages, tools):
    t = ChatTemplate(QWEN_TEMPLATE.read_text())
    text = t.render({"messages": messages, "tools": tools, "add_generation_prompt": True})
    return tok.encode(text, add_special_tokens=False)


# ---- the lazy grammar ------------------------------------------------------------------------

def reference_lazy(dec, tok, vocab, grammar, trigger, ids, n_new, eos):
    """What lazy constrained greedy decoding must give, step by step from the raw logits."""
    m = Matcher(grammar, vocab)
    trig = trigger.encode()
    keep = len(trig) - 1
    tail, lazy, seq, out = b"", True, list(ids), []
    for _ in range(n_new):
        logits = np.array(dec.forward(seq)[-1], dtype=np.float64)
        if lazy:
            while True:
                t = int(np.argmax(logits))
                if t in eos:
                    break
                b = b"" if tok.is_special(t) else tok.token_bytes(t)
                buf = tail + b
                i = buf.find(trig)
                if i >= 0:
                    m.reset()
                    if m.accept_bytes(buf[i:]):
                        lazy = False
                        break
                    m.reset()
                    logits[t] = -np.inf  # brings the trigger with text the grammar refuses
                    continue
                tail = buf[len(buf) - keep:] if keep and len(buf) > keep else \
                    (buf if keep else b"")
                break
        else:
            allowed = np.zeros(len(logits), dtype=bool)
            allowed[:len(vocab)] = m.mask()
            if m.done:
                allowed[eos] = True
            t = int(np.argmax(np.where(allowed, logits, -np.inf)))
            if t not in eos:
                assert m.accept(t)
        out.append(t)
        if t in eos or (not lazy and m.finished):
            break
        seq.append(t)
    return out, not lazy


CALL_GBNF = (r'''root ::= "<tool_call>" "\n"? "{\"name\": \"get_weather\", \"arguments\": '''
             r'''{\"city\": \"" [A-Z] [a-z]{1,12} "\"}}" "\n"? "</tool_call>"''')


def test_lazy_grammar_equals_reference_loop(dec, tok, vocab):
    g = Grammar.from_gbnf(CALL_GBNF)
    eos = dec._eos_list(None)
    ids = qwen_ids(tok, [{"role": "user", "content": ECHO_CALL}], [WEATHER])
    ref, fired = reference_lazy(dec, tok, vocab, g, "<tool_call>", ids, 60, eos)
    assert fired  # the prompt makes the model write the trigger: the grammar took over
    r = dec.generate(ids, max_new_tokens=60, grammar=g, grammar_trigger="<tool_call>",
                     lookup=0, prompt_cache=False, return_dict_in_generate=True)
    assert r.tokens == ref
    assert r.finish_reason == "stop"
    call = r.text[r.text.index("<tool_call>"):]
    assert g.match(call)
    # speculation checks each candidate the same way
    r2 = dec.generate(ids, max_new_tokens=60, grammar=g, grammar_trigger="<tool_call>",
                      lookup=8, return_dict_in_generate=True)
    assert r2.tokens == ref
    # the engine gives it the same
    eng = dec.engine()
    reqs = [eng.submit(ids, max_new_tokens=60, grammar=g, grammar_trigger=trig)
            for trig in ("<tool_call>", None)]
    for q in reqs:
        q.result()
    assert reqs[0].tokens == ref
    # beside it, the same grammar held from the first byte: this reply starts with the trigger,
    # so it is the same reply
    assert r.text.startswith("<tool_call>") and reqs[1].tokens == ref


def test_trigger_is_not_looked_for_in_a_think_block(dec, tok, vocab):
    """think_close keeps the trigger out of a thinking model's block: a reply inside a block the
    prompt opened (think_open None) is the plain greedy reply although it writes the trigger; a
    reply that opens no block ("<think>" given) is the lazy grammar's as without the fields."""
    g = Grammar.from_gbnf(CALL_GBNF)
    eos = dec._eos_list(None)
    ids = qwen_ids(tok, [{"role": "user", "content": ECHO_CALL}], [WEATHER])
    free = dec.generate(ids, max_new_tokens=60, return_dict_in_generate=True)
    assert "<tool_call>" in free.text and "</think>" not in free.text
    inside = dec.generate(ids, max_new_tokens=60, grammar=g, grammar_trigger="<tool_call>",
                          think_close="</think>", return_dict_in_generate=True)
    assert inside.tokens == free.tokens
    ref, fired = reference_lazy(dec, tok, vocab, g, "<tool_call>", ids, 60, eos)
    assert fired
    opened_none = dec.generate(ids, max_new_tokens=60, grammar=g, grammar_trigger="<tool_call>",
                               think_open="<think>", think_close="</think>",
                               return_dict_in_generate=True)
    assert opened_none.tokens == ref
    # the engine copies the tags with the request
    eng = dec.engine()
    q = eng.submit(ids, max_new_tokens=60, grammar=g, grammar_trigger="<tool_call>",
                   think_close="</think>")
    q.result()
    assert q.tokens == free.tokens


def test_lazy_grammar_without_its_trigger_is_free_text(dec, tok, vocab):
    """A reply that never brings the trigger is the model's plain greedy reply."""
    g = Grammar.from_gbnf(CALL_GBNF)
    ids = qwen_ids(tok, [{"role": "user", "content": "What is the capital of France?"}], None)
    free = dec.generate(ids, max_new_tokens=40, return_dict_in_generate=True)
    assert "<tool_call>" not in free.text
    r = dec.generate(ids, max_new_tokens=40, grammar=g, grammar_trigger="<tool_call>",
                     return_dict_in_generate=True)
    assert r.tokens == free.tokens


def test_trigger_with_refused_tail_is_chosen_again(dec, tok, vocab):
    """The trigger "Par" arrives inside " Paris"; the grammar wants "Par" then "x", so " Paris"
    is never chosen and the next best token is: the reference loop agrees token for token."""
    g = Grammar.from_gbnf('root ::= "Par" "x"{1,3} "."')
    eos = dec._eos_list(None)
    ids = qwen_ids(tok, [{"role": "user", "content": "What is the capital of France?"}], None)
    free = dec.generate(ids, max_new_tokens=20, return_dict_in_generate=True)
    assert " Paris" in free.text  # the unconstrained reply has the trigger inside a token
    ref, _ = reference_lazy(dec, tok, vocab, g, "Par", ids, 20, eos)
    r = dec.generate(ids, max_new_tokens=20, grammar=g, grammar_trigger="Par", lookup=0,
                     prompt_cache=False, return_dict_in_generate=True)
    assert r.tokens == ref
    assert r.tokens != free.tokens
    if "Par" in r.text:
        assert g.match(r.text[r.text.index("Par"):], prefix=True)


def test_trigger_needs_a_grammar(dec):
    with pytest.raises(ValueError):
        dec.generate([1, 2, 3], max_new_tokens=2, grammar_trigger="<tool_call>")


# ---- the server ------------------------------------------------------------------------------

def serve(*extra):
    from test_server import KEY, Server
    s = Server("--api-key", KEY, "--max-batch", 4, "--max-cache-len", 2048, *extra)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def generic():
    yield from serve()


@pytest.fixture(scope="module")
def hermes():
    yield from serve("--chat-template-file", QWEN_TEMPLATE)


@pytest.fixture(scope="module")
def llama3():
    """Llama 3.1's template on SmolLM2 (its header tokens are plain text to this vocabulary,
    which is enough for the format: calls are {"name", "parameters"} objects)."""
    yield from serve("--chat-template-file", LLAMA31_TEMPLATE)


@pytest.fixture(scope="module")
def forced_generic():
    """--tool-format overrides what the template says (Qwen's template, the generic format)."""
    yield from serve("--chat-template-file", QWEN_TEMPLATE, "--tool-format", "generic")


def check_calls(msg, names=None):
    assert msg.tool_calls, msg
    ids = set()
    for c in msg.tool_calls:
        assert c.type == "function"
        assert c.id.startswith("call_") and len(c.id) == 29 and c.id not in ids
        ids.add(c.id)
        assert names is None or c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("server", ["generic", "hermes", "llama3", "forced_generic"])
@pytest.mark.parametrize("temperature", [0, 1])
def test_required_and_named_calls_follow_the_schema(server, temperature, request):
    srv = request.getfixturevalue(server)
    client = srv.client()
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "What is the weather in Paris and the time in Tokyo?"}]
    for choice, names in (("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})):
        r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME],
                                           tool_choice=choice, temperature=temperature, seed=7,
                                           max_tokens=300, parallel_tool_calls=False)
        ch = r.choices[0]
        # OpenAI answers a call the request forced by name with "stop"
        assert ch.finish_reason == ("tool_calls" if choice == "required" else "stop"), ch
        assert ch.message.content is None
        check_calls(ch.message, names)
        assert len(ch.message.tool_calls) == 1  # parallel_tool_calls false


@pytest.mark.parametrize("server", ["generic", "hermes", "llama3"])
@pytest.mark.parametrize("parallel", [False, True])
def test_streamed_calls_equal_the_whole_reply(server, parallel, request):
    """The same reply streamed: content deltas and per-call chunks that add up to the whole
    reply's content, calls and finish_reason (also for a reply cut by max_tokens in mid-call,
    which is content, as vLLM gives it)."""
    srv = request.getfixturevalue(server)
    client = srv.client()
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
              tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=200,
              parallel_tool_calls=parallel)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, content, finish = {}, "", None
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
        finish = chunk.choices[0].finish_reason or finish
    assert finish == whole.finish_reason
    assert content == (whole.message.content or "")
    assert [dict(calls[i], id=None) for i in sorted(calls)] == [
        {"id": None, "name": c.function.name, "arguments": c.function.arguments}
        for c in whole.message.tool_calls or []]
    if not parallel:
        assert finish == "tool_calls" and len(calls) == 1
        check_calls(whole.message)


def test_auto_call_after_its_trigger(hermes, dec, tok):
    """tool_choice auto in the Hermes format: the model writes free text or a <tool_call>; from
    the trigger on, the grammar holds, so the call parses and its arguments validate."""
    client = hermes.client()
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, tools=[WEATHER], temperature=0,
                                       max_tokens=200,
                                       messages=[{"role": "user", "content": ECHO_CALL}])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    check_calls(ch.message, {"get_weather"})
    # the same prompt, streamed: no content before the call, then the call
    parts = list(client.chat.completions.create(
        model=model, tools=[WEATHER], temperature=0, max_tokens=200, stream=True,
        messages=[{"role": "user", "content": ECHO_CALL}]))
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text.strip() == ""
    streamed = [tc for p in parts if p.choices for tc in p.choices[0].delta.tool_calls or []]
    assert [tc.function.arguments for tc in streamed] == \
        [c.function.arguments for c in ch.message.tool_calls]


def test_auto_free_text_streams_as_content(hermes):
    client = hermes.client()
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model=model, tools=[WEATHER], temperature=0,
                                       max_tokens=40, messages=msgs)
    ch = r.choices[0]
    assert not ch.message.tool_calls and ch.finish_reason in ("stop", "length")
    assert ch.message.content and "<tool_call>" not in ch.message.content
    parts = [p.choices[0].delta.content or "" for p in client.chat.completions.create(
        model=model, tools=[WEATHER], temperature=0, max_tokens=40, messages=msgs, stream=True)
        if p.choices]
    assert "".join(parts) == ch.message.content
    assert sum(1 for p in parts if p) > 3  # content streamed as it came, not held to the end


def test_tool_choice_none_is_plain_chat(generic):
    """"none": the tools are not rendered and nothing is constrained: the plain reply."""
    client = generic.client()
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "Say hello."}]
    plain = client.chat.completions.create(model=model, messages=msgs, temperature=0,
                                           max_tokens=20)
    none = client.chat.completions.create(model=model, messages=msgs, temperature=0,
                                          max_tokens=20, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens


def test_history_renders_as_transformers_does(hermes, tok):
    """An assistant turn with tool_calls (arguments as OpenAI's JSON text) and the tool's result
    render as Qwen's template renders them from transformers' message dicts."""
    from test_server import request
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    status, body = request(hermes.port, "POST", "/tokenize", body={
        "messages": msgs, "tools": [WEATHER]})
    assert status == 200, body
    want = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    assert body["tokens"] == qwen_ids(tok, want, [WEATHER])
    text = tok.decode(body["tokens"])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n{\"temp\": 21}\n</tool_response>" in text


@pytest.mark.parametrize("body,param", [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools"),
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "format": "email"}}}}}]},
     "tools"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]}, "messages"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}]},
     "messages"),
    ({"tools": [dict(WEATHER, function=dict(WEATHER["function"], name="f%d" % i))
                for i in range(129)]}, "tools"),
])
def test_bad_tool_requests_are_400(generic, body, param):
    from test_server import request
    client = generic.client()
    model = client.models.list().data[0].id
    req = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req.update(body)
    status, resp = request(generic.port, "POST", "/v1/chat/completions", body=req)
    assert status == 400, resp
    assert resp["error"]["param"] == param, resp
    assert resp["error"]["type"] == "invalid_request_error"


def test_tools_on_completions_are_400(generic):
    from test_server import request
    client = generic.client()
    model = client.models.list().data[0].id
    status, resp = request(generic.port, "POST", "/v1/completions", body={
        "model": model, "prompt": "hi", "tools": [WEATHER]})
    assert status == 400 and resp["error"]["param"] == "tools", resp


def test_generic_format_describes_tools_once(forced_generic, tok):
    """--tool-format generic on Qwen's template: the tools are described by the generic system
    message only (the template is not given them, so it does not add its <tools> block)."""
    from test_server import request
    status, body = request(forced_generic.port, "POST", "/tokenize", body={
        "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]})
    assert status == 200, body
    text = tok.decode(body["tokens"])
    assert "<tools>" not in text and "<tool_call>" not in text
    assert text.count('"get_weather"') == 1 and '{"tool_calls": [' in text
