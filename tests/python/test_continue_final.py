"""continue_final_message and add_generation_prompt on chat requests (vLLM's fields, transformers'
apply_chat_template arguments): the prompt ends inside the final (assistant) message, whose text
the reply continues, as an assistant's prefill.

The oracle is transformers' render_jinja_template (what apply_chat_template runs) with
continue_final_message=True on the same template, tokenized by the same vocabulary (SmolLM2's,
whose tokenizer the server runs): on the bundled model's own template, which keeps the final
message's spacing, and on Llama 3.1's (llama.cpp's set), which trims it. The reply is the
completion of the same ids through /v1/completions.
"""
import pytest

from conftest import SHARED_DATA
from test_grammar import dec, tok  # noqa: F401 (the SmolLM2 fixtures)
from test_server import KEY, Server, request

LLAMA31 = SHARED_DATA / "chat-templates" / "llamacpp" / "meta-llama-Llama-3.1-8B-Instruct.jinja"
MSGS = [{"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is "}]


@pytest.fixture(scope="module")
def plain():
    s = Server("--api-key", KEY, "--max-cache-len", 1024)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llama31():
    s = Server("--api-key", KEY, "--max-cache-len", 1024, "--chat-template-file", LLAMA31)
    yield s
    s.stop()


def hf_ids(tok, template, msgs=MSGS, **kw):
    import transformers.utils.chat_template_utils as ctu
    out, _ = ctu.render_jinja_template(conversations=[msgs], chat_template=template,
                                       bos_token=tok.bos_token, eos_token=tok.eos_token, **kw)
    return tok.encode(out[0], add_special_tokens=False)


def tokenize(srv, msgs=MSGS, **body):
    status, r = request(srv.port, "POST", "/tokenize", body=dict(messages=msgs, **body))
    assert status == 200, r
    return r["tokens"]


def model_of(srv):
    return request(srv.port, "GET", "/v1/models")[1]["data"][0]["id"]


@pytest.mark.parametrize("which", ["plain", "llama31"])
def test_prompt_equals_transformers(request_fixture, tok, which):
    srv = request_fixture(which)
    template = tok.chat_template if which == "plain" else LLAMA31.read_text()
    want = hf_ids(tok, template, add_generation_prompt=False, continue_final_message=True)
    assert tokenize(srv, add_generation_prompt=False, continue_final_message=True) == want
    # the message's text is the prompt's end: no end-of-turn after it
    assert tok.decode(want).rstrip().endswith("The capital of France is")
    # without it the turn is closed, and the generation prompt follows by default
    assert tokenize(srv) == hf_ids(tok, template, add_generation_prompt=True)
    assert tokenize(srv, add_generation_prompt=False) == hf_ids(tok, template,
                                                                add_generation_prompt=False)


@pytest.fixture
def request_fixture(request):
    return lambda name: request.getfixturevalue(name)


def test_chat_continues_the_message(plain, tok):
    ids = tokenize(plain, add_generation_prompt=False, continue_final_message=True)
    body = {"model": model_of(plain), "messages": MSGS, "max_tokens": 8, "temperature": 0,
            "add_generation_prompt": False, "continue_final_message": True}
    status, chat = request(plain.port, "POST", "/v1/chat/completions", body=body)
    assert status == 200, chat
    status, comp = request(plain.port, "POST", "/v1/completions",
                           body={"model": model_of(plain), "prompt": ids, "max_tokens": 8,
                                 "temperature": 0})
    assert status == 200, comp
    assert chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"]
    assert chat["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("body,param", [
    ({"continue_final_message": True}, "continue_final_message"),  # with a generation prompt
    ({"continue_final_message": "yes", "add_generation_prompt": False},
     "continue_final_message"),
    ({"add_generation_prompt": 1}, "add_generation_prompt"),
])
def test_bad_fields_400(plain, body, param):
    full = {"model": model_of(plain), "messages": MSGS, "max_tokens": 2, **body}
    status, r = request(plain.port, "POST", "/v1/chat/completions", body=full)
    assert status == 400, r
    assert r["error"]["param"] == param


def test_final_message_without_content_400(plain):
    msgs = [MSGS[0], {"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    status, r = request(plain.port, "POST", "/tokenize", body={
        "messages": msgs, "add_generation_prompt": False, "continue_final_message": True})
    assert status == 400, r
    assert r["error"]["param"] == "continue_final_message"


def test_template_that_drops_the_message_400(tmp_path):
    t = tmp_path / "drops.jinja"  # renders every message but the last
    t.write_text("{% for m in messages[:-1] %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    s = Server("--api-key", KEY, "--max-cache-len", 1024, "--chat-template-file", t)
    try:
        status, r = request(s.port, "POST", "/tokenize", body={
            "messages": MSGS, "add_generation_prompt": False, "continue_final_message": True})
        assert status == 400, r
        assert r["error"]["param"] == "continue_final_message"
        assert "does not appear" in r["error"]["message"]
    finally:
        s.stop()
