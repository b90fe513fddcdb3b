"""--reasoning-format (llama.cpp's server option): a thinking template's chat replies split into
`reasoning_content` (the inside of the <think> ... </think> block) and `content`, whole and
streamed, through the real openai client against a real `kwker serve`.

The templates are real ones given with --chat-template-file on the bundled SmolLM2 model: DeepSeek
R1 Distill Qwen's (llama.cpp's set; its generation prompt opens the block, so the reply starts
in it) and Qwen3-0.6B's (huggingface.js' end-to-end cases; the model opens the block itself, and
enable_thinking=false closes it in the prompt). A grammar makes the small model write a think
block deterministically. The oracle: the same prompt (the ids transformers' render of the
template gives) through /v1/completions, which is never split, read by llama.cpp's rule (reasoning
before the first </think>, stripped; content after it and the whitespace that follows).
"""
import json

import pytest

from conftest import SHARED_DATA
from test_grammar import dec, tok  # noqa: F401 (the SmolLM2 fixtures)
from test_server import KEY, Server, request

R1 = SHARED_DATA / "chat-templates" / "llamacpp" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
MSGS = [{"role": "user", "content": "What is the capital of France?"}]
# the prompt opened the block: reasoning, </think>, the answer
OPEN_GRAMMAR = 'root ::= [a-z ]{1,30} "</think>\\n\\n" [a-z ]{1,30}'
# the model opens it
THINK_GRAMMAR = 'root ::= "<think>\\n" [a-z ]{1,30} "</think>\\n\\n" [a-z ]{1,30}'
TAGS = ("<think>", "</think>")


def serve(*args):
    return Server("--api-key", KEY, "--max-cache-len", 1024, *args)


@pytest.fixture(scope="module")
def r1():
    s = serve("--chat-template-file", R1)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def r1_none():
    s = serve("--chat-template-file", R1, "--reasoning-format", "none")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def qwen3(qwen3_template):
    s = serve("--chat-template-file", qwen3_template, "--reasoning-format", "deepseek")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain():
    s = serve()  # SmolLM2's own template: no think tags
    yield s
    s.stop()


def model_of(client):
    return client.models.list().data[0].id


def hf_ids(tok, template, msgs=MSGS, **kwargs):
    import transformers.utils.chat_template_utils as ctu
    out, _ = ctu.render_jinja_template(
        conversations=[msgs], chat_template=template.read_text(), add_generation_prompt=True,
        bos_token=tok.bos_token, eos_token=tok.eos_token, **kwargs)
    return out[0], tok.encode(out[0], add_special_tokens=False)


def raw_reply(srv, ids, **kw):
    """The unsplit text of a reply to the prompt ids (/v1/completions)."""
    c = srv.client()
    r = c.completions.create(model=model_of(c), prompt=ids, temperature=0, **kw)
    return r.choices[0].text, r.choices[0].finish_reason


def split(text, opened):
    """llama.cpp's --reasoning-format deepseek, written out: (reasoning or None, content)."""
    body = text.lstrip()
    if body.startswith("<think>"):
        body = body[len("<think>"):]
    elif not opened:
        return None, text
    reasoning, closed, content = body.partition("</think>")
    return reasoning.strip() or None, content.lstrip() if closed else ""


def chat(srv, stream=False, **kw):
    c = srv.client()
    return c.chat.completions.create(model=model_of(c), messages=kw.pop("messages", MSGS),
                                     temperature=0, stream=stream, **kw)


def fields(r):
    m = r.choices[0].message
    return getattr(m, "reasoning_content", None), m.content, r.choices[0].finish_reason


def streamed(srv, **kw):
    """The concatenated reasoning and content deltas, the finish reason, and the order in
    which the fields came ("r" / "c" per chunk)."""
    reasoning, content, order, finish = [], [], [], None
    for ch in chat(srv, stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        rc = getattr(d, "reasoning_content", None)
        if rc:
            reasoning.append(rc)
            order.append("r")
        if d.content:
            content.append(d.content)
            order.append("c")
        for t in TAGS:  # nothing of the tags leaks into a delta
            assert t not in (rc or "") and t not in (d.content or "")
        finish = ch.choices[0].finish_reason or finish
    return "".join(reasoning) or None, "".join(content), finish, "".join(order)


def test_r1_prompt_opens_the_block(r1, tok):
    """The server's prompt is transformers' render, which leaves the think block open."""
    text, ids = hf_ids(tok, R1)
    assert text.endswith("<think>\n")
    status, t = request(r1.port, "POST", "/tokenize", body={"messages": MSGS})
    assert status == 200 and t["tokens"] == ids


@pytest.mark.parametrize("max_tokens", [60, 4])
def test_r1_split(r1, tok, max_tokens):
    """Forced open: reasoning before </think>, the answer after; cut by max_tokens inside the
    block, all of it reasoning (llama.cpp's reading of a block the prompt opened)."""
    _, ids = hf_ids(tok, R1)
    raw, raw_finish = raw_reply(r1, ids, extra_body={"grammar": OPEN_GRAMMAR},
                                max_tokens=max_tokens)
    want_r, want_c = split(raw, opened=True)
    assert want_r  # the grammar made it think
    if max_tokens == 4:
        assert raw_finish == "length" and "</think>" not in raw and want_c == ""
    else:
        assert want_c and raw_finish == "stop"
    got = fields(chat(r1, extra_body={"grammar": OPEN_GRAMMAR}, max_tokens=max_tokens))
    assert got == (want_r, want_c, raw_finish)
    reasoning, content, finish, order = streamed(r1, extra_body={"grammar": OPEN_GRAMMAR},
                                                 max_tokens=max_tokens)
    assert (reasoning, content, finish) == (want_r, want_c, raw_finish)
    assert order.startswith("r") and "cr" not in order  # reasoning first, as it came
    if max_tokens != 4:
        assert order.count("r") > 1  # streamed as it came, not held to the end


def test_r1_none_keeps_all_in_content(r1_none, tok):
    _, ids = hf_ids(tok, R1)
    raw, finish = raw_reply(r1_none, ids, extra_body={"grammar": OPEN_GRAMMAR}, max_tokens=60)
    assert "</think>" in raw
    assert fields(chat(r1_none, extra_body={"grammar": OPEN_GRAMMAR}, max_tokens=60)) == (
        None, raw, finish)
    assert streamed(r1_none, extra_body={"grammar": OPEN_GRAMMAR}, max_tokens=60)[:3] == (
        None, raw, finish)


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_split(qwen3, qwen3_template, tok, stream):
    """Qwen3 thinks by default: the prompt leaves the block to the model, which opens it."""
    text, ids = hf_ids(tok, qwen3_template)
    assert not text.rstrip().endswith("<think>")
    raw, finish = raw_reply(qwen3, ids, extra_body={"grammar": THINK_GRAMMAR}, max_tokens=60)
    want = split(raw, opened=False)
    assert want[0] and want[1] and raw.startswith("<think>")
    kw = dict(extra_body={"grammar": THINK_GRAMMAR}, max_tokens=60)
    got = streamed(qwen3, **kw)[:3] if stream else fields(chat(qwen3, **kw))
    assert got == (want[0], want[1], finish)


def test_qwen3_no_block_is_content(qwen3, qwen3_template, tok):
    """enable_thinking=false closes the block in the prompt; a reply that opens none is all
    content, as a reply that writes "</think>" without having opened a block is."""
    text, ids = hf_ids(tok, qwen3_template, enable_thinking=False)
    assert text.endswith("</think>\n\n")
    g = 'root ::= [a-z ]{1,10} "</think>" [a-z ]{1,10}'
    raw, finish = raw_reply(qwen3, ids, extra_body={"grammar": g}, max_tokens=40)
    kw = dict(extra_body={"grammar": g, "chat_template_kwargs": {"enable_thinking": False}},
              max_tokens=40)
    assert fields(chat(qwen3, **kw)) == (None, raw, finish)
    assert streamed(qwen3, **kw)[:3] == (None, raw, finish)


def test_plain_template_never_split(plain):
    """SmolLM2's template names no think tags: a think block is content."""
    kw = dict(extra_body={"grammar": THINK_GRAMMAR}, max_tokens=60)
    r, content, finish = fields(chat(plain, **kw))
    assert r is None and content.startswith("<think>\n") and "</think>" in content
    assert streamed(plain, **kw)[:3] == (None, content, finish)


def test_completions_never_split(r1, tok):
    """/v1/completions is never split, whatever the template."""
    _, ids = hf_ids(tok, R1)
    c = r1.client()
    r = c.completions.create(model=model_of(c), prompt=ids, temperature=0, max_tokens=60,
                             extra_body={"grammar": OPEN_GRAMMAR})
    assert "</think>" in r.choices[0].text
    assert getattr(r.choices[0], "reasoning_content", None) is None


def test_bad_reasoning_format_refused():
    import subprocess
    from conftest import cli_env, kwker_bin
    p = subprocess.run([kwker_bin(), "serve", "--reasoning-format", "sometimes"],
                       capture_output=True, text=True, env=cli_env(), timeout=60)
    assert p.returncode != 0 and "--reasoning-format" in p.stderr


def test_r1_json_schema_is_content(r1):
    """A reply held to a JSON schema from its first byte writes no thinking, whatever the
    prompt opened: it is content (llama.cpp reads R1's replies under a schema unsplit too)."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    r, content, finish = fields(chat(r1, response_format=rf, max_tokens=40))
    assert r is None and finish == "stop" and json.loads(content)["city"] is not None
    assert streamed(r1, response_format=rf, max_tokens=40)[:3] == (None, content, finish)


def test_per_request_reasoning_format(r1, r1_none, tok):
    """A request's reasoning_format (llama.cpp's field) over the server's --reasoning-format:
    "none" leaves the block in content on a splitting server, "deepseek" splits on a server
    started with none; both whole and streamed."""
    _, ids = hf_ids(tok, R1)
    raw, raw_finish = raw_reply(r1, ids, max_tokens=60, extra_body={"grammar": OPEN_GRAMMAR})
    want_r, want_c = split(raw, opened=True)
    kw = dict(max_tokens=60)
    off = {"grammar": OPEN_GRAMMAR, "reasoning_format": "none"}
    on = {"grammar": OPEN_GRAMMAR, "reasoning_format": "deepseek"}
    assert fields(chat(r1, extra_body=off, **kw)) == (None, raw, raw_finish)
    assert fields(chat(r1_none, extra_body=on, **kw)) == (want_r, want_c, raw_finish)
    assert streamed(r1_none, extra_body=on, **kw)[:3] == (want_r, want_c, raw_finish)
    # the server's own choice when the request names none
    assert fields(chat(r1_none, extra_body={"grammar": OPEN_GRAMMAR}, **kw))[0] is None


def test_include_reasoning_false(r1, tok):
    """vLLM's include_reasoning false: the block is split off and dropped, whole and streamed."""
    _, ids = hf_ids(tok, R1)
    raw, raw_finish = raw_reply(r1, ids, max_tokens=60, extra_body={"grammar": OPEN_GRAMMAR})
    _, want_c = split(raw, opened=True)
    body = {"grammar": OPEN_GRAMMAR, "include_reasoning": False}
    assert fields(chat(r1, extra_body=body, max_tokens=60)) == (None, want_c, raw_finish)
    r, c, finish, order = streamed(r1, extra_body=body, max_tokens=60)
    assert (r, c, finish) == (None, want_c, raw_finish) and "r" not in order


@pytest.mark.parametrize("extra,param", [({"reasoning_format": "sometimes"}, "reasoning_format"),
                                         ({"reasoning_format": 1}, "reasoning_format"),
                                         ({"include_reasoning": "no"}, "include_reasoning")])
def test_bad_reasoning_fields_400(r1, extra, param):
    body = {"model": model_of(r1.client()), "messages": MSGS, "max_tokens": 2, **extra}
    status, r = request(r1.port, "POST", "/v1/chat/completions", body=body)
    assert status == 400 and r["error"]["param"] == param, r
