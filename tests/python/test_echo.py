"""Completions' echo (OpenAI's legacy field, what evaluation harnesses score prompts with): the
prompt leads each choice's text, and with logprobs its tokens' logprobs lead the choice's (the
first token's null: it has no context), max_tokens 0 scoring the prompt alone; whole, streamed,
with n choices and with token-id prompts, against a real `kwker serve` on the bundled
SmolLM2-135M-Instruct.

The oracle for the prompt's logprobs is the log-softmax of KwkDecoder.forward's float32 logits
of the same ids at the same precision (itself checked against transformers by
test_decode_oracle.py); the completion's part is the same request without echo.
"""
import json

import numpy as np
import pytest

import kwker
from conftest import smollm2_gguf
from test_server import KEY, Server, request

PROMPT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def srv():
    s = Server("--api-key", KEY, "--max-cache-len", 1024, "--precision", "preserve",
               "--max-batch", 2)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model_id(srv):
    return request(srv.port, "GET", "/v1/models")[1]["data"][0]["id"]


@pytest.fixture(scope="module")
def dec():
    d = kwker.KwkDecoder(smollm2_gguf(), max_cache_len=256, n_threads=2)
    yield d
    d.close()


def complete(srv, model_id, **kw):
    body = {"model": model_id, "prompt": PROMPT, "temperature": 0}
    status, r = request(srv.port, "POST", "/v1/completions", body=dict(body, **kw))
    assert status == 200, r
    return r


def prompt_ids(srv, prompt=PROMPT):
    status, t = request(srv.port, "POST", "/tokenize", body={"prompt": prompt})
    assert status == 200
    return t["tokens"]


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def test_echo_scores_the_prompt(srv, model_id, dec):
    ids = prompt_ids(srv)
    r = complete(srv, model_id, echo=True, max_tokens=0, logprobs=2)
    c = r["choices"][0]
    assert c["text"] == PROMPT and c["finish_reason"] == "length"
    assert r["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0,
                          "total_tokens": len(ids)}
    lp = c["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ids)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    want = log_softmax(dec.forward(ids))
    np.testing.assert_allclose(lp["token_logprobs"][1:], want[np.arange(len(ids) - 1), ids[1:]],
                               atol=1e-4, rtol=0)
    for k in range(1, len(ids)):
        assert len(lp["top_logprobs"][k]) == 2
        assert max(lp["top_logprobs"][k].values()) == pytest.approx(want[k - 1].max(), abs=1e-4)
    # the offsets walk the echoed text
    assert lp["text_offset"][0] == 0
    assert "".join(lp["tokens"]) == PROMPT


def test_echo_with_a_completion(srv, model_id):
    plain = complete(srv, model_id, max_tokens=6, logprobs=1)
    r = complete(srv, model_id, max_tokens=6, logprobs=1, echo=True)
    c, p = r["choices"][0], plain["choices"][0]
    assert c["text"] == PROMPT + p["text"]
    n = len(prompt_ids(srv))
    assert c["logprobs"]["token_logprobs"][n:] == p["logprobs"]["token_logprobs"]
    assert c["logprobs"]["tokens"][n:] == p["logprobs"]["tokens"]
    assert r["usage"] == plain["usage"]
    # without logprobs: the text alone
    r = complete(srv, model_id, max_tokens=6, echo=True)
    assert r["choices"][0]["text"] == PROMPT + p["text"]
    assert r["choices"][0]["logprobs"] is None


def test_echo_streamed(srv, model_id):
    for lp in (None, 1):
        kw = dict(max_tokens=6, echo=True)
        if lp is not None:
            kw["logprobs"] = lp
        whole = complete(srv, model_id, **kw)["choices"][0]
        status, data = request(srv.port, "POST", "/v1/completions", body=dict(
            model=model_id, prompt=PROMPT, temperature=0, stream=True, **kw))
        assert status == 200
        chunks = [json.loads(e[6:]) for e in data.decode().split("\n\n")
                  if e.startswith("data: {")]
        texts = [ch["choices"][0]["text"] for ch in chunks if ch["choices"]]
        assert texts[0] == PROMPT  # the prompt's chunk first
        assert "".join(texts) == whole["text"]
        if lp is not None:
            toks = sum((ch["choices"][0]["logprobs"]["tokens"] for ch in chunks
                        if ch["choices"] and ch["choices"][0]["logprobs"]), [])
            assert toks == whole["logprobs"]["tokens"]


def test_echo_n_choices(srv, model_id):
    """Three sampled choices on the server's two slots (choice 0 scores the prompt, the others
    copy it): the prompt's logprobs lead each, equal."""
    r = complete(srv, model_id, max_tokens=5, echo=True, logprobs=0, n=3, temperature=1.0,
                 seed=4)
    n = len(prompt_ids(srv))
    first = r["choices"][0]["logprobs"]["token_logprobs"][:n]
    for c in r["choices"]:
        assert c["text"].startswith(PROMPT)
        assert c["logprobs"]["token_logprobs"][:n] == first


def test_echo_of_token_ids(srv, model_id):
    ids = prompt_ids(srv)
    r = complete(srv, model_id, prompt=ids, echo=True, max_tokens=0, logprobs=0)
    c = r["choices"][0]
    assert c["text"] == PROMPT
    assert len(c["logprobs"]["tokens"]) == len(ids)


def test_max_tokens_0_needs_echo(srv, model_id):
    status, r = request(srv.port, "POST", "/v1/completions",
                        body={"model": model_id, "prompt": PROMPT, "max_tokens": 0})
    assert status == 400 and r["error"]["param"] == "max_tokens", r
