"""vLLM's stopping fields on the chat and completion routes: stop_token_ids (more ids that end a
reply as eos does, their text left out), min_tokens (eos and those ids held back until that many
tokens) and ignore_eos (the model's eos does not end the reply), against a real `kwker serve` on
the bundled SmolLM2-135M-Instruct. The references are the server's own greedy replies without
the fields: each field changes them exactly where it says.
"""
import pytest

from test_server import KEY, Server, request

MSGS = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def srv():
    s = Server("--api-key", KEY, "--max-cache-len", 1024)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def model_id(srv):
    return request(srv.port, "GET", "/v1/models")[1]["data"][0]["id"]


def chat(srv, model_id, **kw):
    body = {"model": model_id, "messages": MSGS, "temperature": 0, "max_tokens": 40,
            "logprobs": True}
    status, r = request(srv.port, "POST", "/v1/chat/completions", body=dict(body, **kw))
    assert status == 200, r
    return r


def tokens(r):
    return [t["token"] for t in r["choices"][0]["logprobs"]["content"]]


def test_stop_token_ids(srv, model_id):
    base = chat(srv, model_id)
    assert base["choices"][0]["finish_reason"] == "stop"  # the model's own eos
    n = base["usage"]["completion_tokens"]
    assert n > 4
    # the third token's id, found by tokenizing the reply's first tokens' text
    text = base["choices"][0]["message"]["content"]
    status, t = request(srv.port, "POST", "/tokenize", body={"prompt": text,
                                                             "add_special_tokens": False})
    assert status == 200
    stop_id = t["tokens"][2]
    r = chat(srv, model_id, stop_token_ids=[stop_id])
    c = r["choices"][0]
    assert c["finish_reason"] == "stop"
    # it ends at the id's first appearance; its own text is not in the reply
    assert r["usage"]["completion_tokens"] == t["tokens"].index(stop_id) + 1
    assert c["message"]["content"] == "".join(tokens(base)[:t["tokens"].index(stop_id)])


def test_min_tokens_and_ignore_eos(srv, model_id):
    base = chat(srv, model_id)
    n = base["usage"]["completion_tokens"]
    # min_tokens past where the model stops: the eos is held back, so the reply goes on
    r = chat(srv, model_id, min_tokens=n + 5)
    assert r["usage"]["completion_tokens"] >= n + 5
    assert r["choices"][0]["message"]["content"].startswith(base["choices"][0]["message"]["content"])
    # ignore_eos: to max_tokens, finish_reason "length"
    r = chat(srv, model_id, ignore_eos=True, max_tokens=n + 8)
    assert r["usage"]["completion_tokens"] == n + 8
    assert r["choices"][0]["finish_reason"] == "length"
    # the same on the completions route
    status, c = request(srv.port, "POST", "/v1/completions", body={
        "model": model_id, "prompt": "Hello", "max_tokens": 12, "temperature": 0,
        "ignore_eos": True})
    assert status == 200 and c["usage"]["completion_tokens"] == 12, c


@pytest.mark.parametrize("extra,param,code", [
    ({"stop_token_ids": 5}, "stop_token_ids", "invalid_type"),
    ({"stop_token_ids": [1, "a"]}, "stop_token_ids", "invalid_type"),
    ({"stop_token_ids": [10 ** 9]}, "stop_token_ids", "invalid_value"),
    ({"stop_token_ids": list(range(65))}, "stop_token_ids", "invalid_value"),
    ({"min_tokens": -1}, "min_tokens", "invalid_value"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens", "invalid_value"),
    ({"ignore_eos": "yes"}, "ignore_eos", "invalid_type"),
    ({"include_stop_str_in_output": True}, "include_stop_str_in_output", "invalid_value"),
])
def test_bad_fields_400(srv, model_id, extra, param, code):
    body = {"model": model_id, "messages": MSGS, "max_tokens": 4, **extra}
    status, r = request(srv.port, "POST", "/v1/chat/completions", body=body)
    assert status == 400, r
    assert r["error"]["param"] == param and r["error"]["code"] == code
