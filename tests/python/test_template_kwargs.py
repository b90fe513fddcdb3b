"""chat_template_kwargs (vLLM's and llama.cpp's request field) and --chat-template-kwargs (the
server's, `kwker chat`'s and `kwker generate`'s default): more variables for the chat template,
as transformers' apply_chat_template(**kwargs) passes them, such as Qwen3's enable_thinking and
Llama 3.1's date_string. Also vLLM's repetition_penalty on the chat and completion routes.

The oracle is transformers' render_jinja_template (what apply_chat_template runs) of the same
template and variables, tokenized by the same vocabulary (SmolLM2's, whose tokenizer the server
runs); the templates are real ones (Qwen3-0.6B's from huggingface.js' end-to-end cases, Llama
3.1's from llama.cpp's set), given with --chat-template-file.
"""
import json
import subprocess

import pytest

from conftest import SHARED_DATA, cli_env, kwker_bin, smollm2_gguf
from test_grammar import dec, tok  # noqa: F401 (the SmolLM2 fixtures)
from test_server import KEY, Server, request

LLAMA31 = SHARED_DATA / "chat-templates" / "llamacpp" / "meta-llama-Llama-3.1-8B-Instruct.jinja"
MSGS = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def qwen3(qwen3_template):
    """The server's default turns thinking off; requests may turn it back on."""
    s = Server("--api-key", KEY, "--max-cache-len", 1024, "--chat-template-file", qwen3_template,
               "--chat-template-kwargs", '{"enable_thinking": false}')
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llama31():
    s = Server("--api-key", KEY, "--max-cache-len", 1024, "--chat-template-file", LLAMA31)
    yield s
    s.stop()


def hf_ids(tok, template, msgs=MSGS, **kwargs):
    import transformers.utils.chat_template_utils as ctu
    out, _ = ctu.render_jinja_template(
        conversations=[msgs], chat_template=template.read_text(), add_generation_prompt=True,
        bos_token=tok.bos_token, eos_token=tok.eos_token, **kwargs)
    return tok.encode(out[0], add_special_tokens=False)


def model_of(srv):
    status, r = request(srv.port, "GET", "/v1/models")
    assert status == 200, r
    return r["data"][0]["id"]


def tokenize(srv, **body):
    status, r = request(srv.port, "POST", "/tokenize", body=dict(messages=MSGS, **body))
    assert status == 200, r
    return r["tokens"]


def test_enable_thinking(qwen3, qwen3_template, tok):
    off = hf_ids(tok, qwen3_template, enable_thinking=False)
    on = hf_ids(tok, qwen3_template, enable_thinking=True)
    assert off != on  # the variable changes this template's render (an empty think block)
    assert hf_ids(tok, qwen3_template) == on  # absent, the template's default: thinking
    # the server's --chat-template-kwargs apply when a request gives none
    assert tokenize(qwen3) == off
    assert tokenize(qwen3, chat_template_kwargs=None) == off
    assert tokenize(qwen3, chat_template_kwargs={}) == off
    # a request's own win over the server's
    assert tokenize(qwen3, chat_template_kwargs={"enable_thinking": True}) == on
    # the chat route renders the same prompt as /tokenize
    for kw, ids in ((None, off), ({"enable_thinking": True}, on)):
        body = {"model": model_of(qwen3), "messages": MSGS, "max_tokens": 1, "temperature": 0}
        if kw:
            body["chat_template_kwargs"] = kw
        status, r = request(qwen3.port, "POST", "/v1/chat/completions", body=body)
        assert status == 200, r
        assert r["usage"]["prompt_tokens"] == len(ids)


def test_date_string_and_special_tokens(llama31, tok):
    base = hf_ids(tok, LLAMA31)
    dated = hf_ids(tok, LLAMA31, date_string="01 Jan 2027")
    assert base != dated
    assert tokenize(llama31) == base
    assert tokenize(llama31, chat_template_kwargs={"date_string": "01 Jan 2027"}) == dated
    # as transformers' kwargs, they may set the special tokens' texts the server passes
    want = hf_ids(tok, LLAMA31, date_string="x")
    want_bos = tok.encode(tok.decode(want).replace(tok.bos_token, "<BOS>", 1),
                          add_special_tokens=False)
    import transformers.utils.chat_template_utils as ctu
    out, _ = ctu.render_jinja_template(conversations=[MSGS], chat_template=LLAMA31.read_text(),
                                       add_generation_prompt=True, bos_token="<BOS>",
                                       eos_token=tok.eos_token, date_string="x")
    assert tok.encode(out[0], add_special_tokens=False) == want_bos
    assert tokenize(llama31, chat_template_kwargs={"bos_token": "<BOS>", "date_string": "x"}) \
        == want_bos


@pytest.mark.parametrize("kwargs,why", [
    (5, "an object of template variables"),
    ([{"enable_thinking": False}], "an object of template variables"),
    ("enable_thinking=false", "an object of template variables"),
    ({"messages": []}, "may not set 'messages'"),
    ({"tools": None}, "may not set 'tools'"),
    ({"documents": []}, "may not set 'documents'"),
    ({"add_generation_prompt": False}, "may not set 'add_generation_prompt'"),
])
def test_bad_kwargs_400(llama31, kwargs, why):
    for path in ("/v1/chat/completions", "/tokenize"):
        body = {"model": model_of(llama31), "messages": MSGS, "max_tokens": 1,
                "chat_template_kwargs": kwargs}
        status, r = request(llama31.port, "POST", path, body=body)
        assert status == 400, (path, r)
        err = r["error"]
        assert err["param"] == "chat_template_kwargs" and why in err["message"], err
        assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("text,why", [
    ("not json", "not JSON"),
    ("[1]", "an object of template variables"),
    ('{"messages": 1}', "may not set 'messages'"),
    ('{"a": 1, "a": 2}', "not JSON"),
    ("[" * 100 + "]" * 100, "nested deeper"),
])
def test_bad_option_stops_at_start(text, why):
    for cmd in (["serve", "--port", "0"], ["generate", "--chat", "hi", "-n", "1"],
                ["chat"]):
        p = subprocess.run([kwker_bin(), *cmd, "--model", smollm2_gguf(),
                            "--chat-template-kwargs", text], capture_output=True, text=True,
                           timeout=300, env=cli_env(), input="")
        assert p.returncode != 0 and "--chat-template-kwargs" in p.stderr and why in p.stderr, \
            (cmd, p.returncode, p.stderr[-2000:])


def test_generate_takes_the_kwargs(qwen3_template):
    """`kwker generate --chat` renders with them: its greedy reply equals the server's for
    the same variables, and thinking off and on give different prompts (so, here, replies)."""
    def generate(kw):
        p = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "--chat",
                            MSGS[1]["content"], "--chat-template-file", str(qwen3_template),
                            "--chat-template-kwargs", json.dumps(kw), "-n", "12", "-t", "2"],
                           capture_output=True, text=True, timeout=600, env=cli_env())
        assert p.returncode == 0, p.stderr
        return p.stdout.rstrip("\n")

    s = Server("--api-key", KEY, "--max-cache-len", 1024, "--chat-template-file", qwen3_template)
    replies = []
    try:
        for kw in ({"enable_thinking": False}, {"enable_thinking": True}):
            status, r = request(s.port, "POST", "/v1/chat/completions", body={
                "model": model_of(s), "messages": [MSGS[1]], "max_tokens": 12, "temperature": 0,
                "chat_template_kwargs": kw})
            assert status == 200, r
            replies.append(generate(kw))
            assert r["choices"][0]["message"]["content"].rstrip("\n") == replies[-1]
    finally:
        s.stop()
    assert replies[0] != replies[1]


def test_repetition_penalty(llama31):
    """vLLM's repetition_penalty reaches the sampler: the server's greedy reply equals `kwker
    generate --repetition-penalty` (the library's penalty is checked against transformers in
    test_sampling.py) on a prompt where the penalty changes the reply."""
    prompt = "1, 2, 1, 2, 1, 2, 1, 2,"

    def generate(*extra):
        p = subprocess.run([kwker_bin(), "generate", "--model", smollm2_gguf(), "--prompt",
                            prompt, "-n", "16", "-t", "2", *extra], capture_output=True,
                           text=True, timeout=600, env=cli_env())
        assert p.returncode == 0, p.stderr
        return p.stdout

    plain, penalized = generate(), generate("--repetition-penalty", "1.5")
    assert plain != penalized
    for pen, want in ((1.5, penalized), (1.0, plain)):
        status, r = request(llama31.port, "POST", "/v1/completions", body={
            "model": model_of(llama31), "prompt": prompt, "max_tokens": 16, "temperature": 0, "repetition_penalty": pen})
        assert status == 200, r
        assert r["choices"][0]["text"] in (want, want.rstrip("\n"))
    for bad in (0, -1, "x", 1e7):
        status, r = request(llama31.port, "POST", "/v1/chat/completions", body={
            "model": model_of(llama31), "messages": MSGS, "max_tokens": 1,
            "repetition_penalty": bad})
        assert status == 400 and r["error"]["param"] == "repetition_penalty", (bad, r)
