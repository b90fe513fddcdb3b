"""Several choices per request: OpenAI's "n" (chat and completions, whole and streamed) and the
completions' "best_of", through the real openai client and raw HTTP against a real `kwker serve`
on the bundled SmolLM2-135M-Instruct.

The references are the server itself: choice 0 of a seeded request is the request of one choice
with that seed, a seeded request repeats, and each streamed choice is its whole reply's. The
engine reads the shared prompt once and copies it to the other choices, which its counters show.
"""
import json
import socket
import uuid

import pytest

from test_server import KEY, Server, metrics, request, wait_for

PROMPT = "Write a short poem about the sea."


@pytest.fixture(scope="module")
def srv():
    # four slots: six choices run in two waves
    s = Server("--api-key", KEY, "--max-batch", 4, "--max-cache-len", 1024)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def chat(client, model_id, **kw):
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": PROMPT}], **kw)


def test_n_chat_seeded(client, model_id):
    kw = dict(temperature=1.0, seed=7, logprobs=True)
    one = chat(client, model_id, **kw)
    r = chat(client, model_id, n=3, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    # choice 0 is the one-choice request with that seed; the others differ from it
    assert texts[0] == one.choices[0].message.content
    assert len(set(texts)) > 1, texts
    # a seeded request repeats, every choice of it
    again = chat(client, model_id, n=3, **kw)
    assert [c.message.content for c in again.choices] == texts
    # the prompt is billed once, every choice's tokens
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    for c in r.choices:
        assert c.message.role == "assistant" and c.finish_reason in ("stop", "length")


def test_n_greedy(client, model_id):
    one = chat(client, model_id, temperature=0)
    r = chat(client, model_id, temperature=0, n=2)
    assert [c.message.content for c in r.choices] == [one.choices[0].message.content] * 2


def test_n_more_than_slots(client, model_id):
    """Six choices on four slots: the last two wait for free slots and still get their own."""
    kw = dict(temperature=1.0, seed=11, max_tokens=6)
    r = chat(client, model_id, n=6, **kw)
    assert [c.index for c in r.choices] == list(range(6))
    first4 = chat(client, model_id, n=4, **kw)
    assert [c.message.content for c in r.choices[:4]] == \
        [c.message.content for c in first4.choices]


def test_prompt_read_once(srv, client, model_id):
    """The engine reads the prompt for the first choice and copies it to the other three."""
    prompt = "Tell me about %s in one line." % uuid.uuid4().hex  # in no slot's cache
    before = metrics(srv.port)
    r = client.completions.create(model=model_id, prompt=prompt, n=4, max_tokens=4,
                                  temperature=1.0, seed=5)
    after = metrics(srv.port)
    read = after["kwker_engine_prompt_tokens_total"] - before["kwker_engine_prompt_tokens_total"]
    reused = (after["kwker_engine_prompt_reused_total"] -
              before["kwker_engine_prompt_reused_total"])
    p = r.usage.prompt_tokens
    assert read + reused == 4 * p
    assert read <= p + 3, (read, p)  # each copy reads its last prompt token again


def collect_stream(srv, body):
    """Raw SSE of a streaming request: the parsed chunks before [DONE], which must end it."""
    status, data = request(srv.port, "POST", body.pop("path"), body=dict(body, stream=True))
    assert status == 200, data
    events = [e for e in data.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[6:]) for e in events[:-1]]


def test_n_chat_stream(srv, client, model_id):
    kw = dict(temperature=1.0, seed=3, max_tokens=12)
    whole = chat(client, model_id, n=3, **kw)
    chunks = collect_stream(srv, dict(
        path="/v1/chat/completions", model=model_id, n=3,
        messages=[{"role": "user", "content": PROMPT}], stream_options={"include_usage": True},
        **kw))
    text, roles, finish = {}, {}, {}
    for ch in chunks[:-1]:
        assert len(ch["choices"]) == 1 and ch["usage"] is None
        c = ch["choices"][0]
        i = c["index"]
        assert i not in finish, "a chunk after the choice's finish"
        d = c["delta"]
        if "role" in d:
            assert i not in roles and i not in text, "the role comes first, once"
            roles[i] = d["role"]
        elif c["finish_reason"]:
            finish[i] = c["finish_reason"]
        else:
            text[i] = text.get(i, "") + d["content"]
    assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert [text.get(i, "") for i in range(3)] == [c.message.content for c in whole.choices]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == whole.usage.model_dump(exclude_none=True)


def test_n_completions(client, model_id):
    r = client.completions.create(model=model_id, prompt="The sea is", n=2, max_tokens=8,
                                  temperature=1.0, seed=9, logprobs=2)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
        # each choice's offsets count from its own text's start
        assert lp.text_offset[0] == 0 and "".join(lp.tokens) == c.text
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    s = client.completions.create(model=model_id, prompt="The sea is", n=2, max_tokens=8,
                                  temperature=1.0, seed=9, stream=True)
    got = {}
    for ch in s:
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + c.text
    assert got == {0: r.choices[0].text, 1: r.choices[1].text}


def test_best_of(client, model_id):
    """best_of candidates are the choices n = best_of gives (same seeds); the n returned are the
    best by mean token logprob, best first, and every candidate's tokens are billed."""
    kw = dict(model=model_id, prompt="Once upon a time", max_tokens=8, temperature=1.0,
              seed=21, logprobs=0)
    cands = client.completions.create(n=4, **kw).choices
    r = client.completions.create(n=2, best_of=4, **kw)

    def mean(c):
        lps = c.logprobs.token_logprobs
        return sum(lps) / len(lps)
    ranked = sorted(cands, key=mean, reverse=True)  # stable: ties keep their order
    assert [c.text for c in r.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in cands)


def test_n_json_schema(client, model_id):
    r = chat(client, model_id, n=2, temperature=1.0, seed=1, max_tokens=40,
             response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                 "type": "object", "properties": {"a": {"type": "integer"}},
                 "required": ["a"], "additionalProperties": False}}})
    for c in r.choices:
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content)["a"], int)


def test_n_stream_client_gone(srv, model_id):
    """A client that leaves a stream of four choices: all four are canceled."""
    canceled = 'kwker_engine_requests_total{outcome="canceled"}'
    before = metrics(srv.port)[canceled]
    body = json.dumps({"model": model_id, "prompt": "Count: one, two,", "n": 4,
                       "max_tokens": 400, "stream": True})
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                  "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (KEY, len(body), body)).encode())
    got = b""
    while b"data: " not in got:  # the headers may come alone
        more = sock.recv(4096)
        assert more, got
        got += more
    sock.close()
    wait_for(lambda: metrics(srv.port)["kwker_engine_running"] == 0, "the choices to end")
    m = metrics(srv.port)
    assert m[canceled] > before
    assert m["kwker_http_requests_in_flight"] == 0


@pytest.mark.parametrize("path,extra,param,code", [
    ("/v1/chat/completions", {"n": 0}, "n", "invalid_value"),
    ("/v1/chat/completions", {"n": 129}, "n", "invalid_value"),
    ("/v1/chat/completions", {"n": "2"}, "n", "invalid_type"),
    ("/v1/completions", {"n": 3, "best_of": 2}, "best_of", "invalid_value"),
    ("/v1/completions", {"best_of": 2, "stream": True}, "best_of", "invalid_value"),
    ("/v1/completions", {"best_of": 0}, "best_of", "invalid_value"),
    ("/v1/completions", {"best_of": 21}, "best_of", "invalid_value"),  # OpenAI's limit
])
def test_bad_choices_400(srv, model_id, path, extra, param, code):
    body = {"model": model_id, "max_tokens": 2}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path
                else {"prompt": "hi"})
    status, r = request(srv.port, "POST", path, body=dict(body, **extra))
    assert status == 400, (status, r)
    assert r["error"]["param"] == param and r["error"]["code"] == code


def test_more_choices_than_the_queue_400():
    """Choices are queued together: more than --max-queue never fit, so a 400, not a 503."""
    s = Server("--api-key", KEY, "--max-cache-len", 256, "--max-queue", 2)
    try:
        model = request(s.port, "GET", "/v1/models")[1]["data"][0]["id"]
        body = {"model": model, "prompt": "hi", "max_tokens": 2}
        status, r = request(s.port, "POST", "/v1/completions", body=dict(body, n=3))
        assert status == 400 and r["error"]["param"] == "n", r
        status, r = request(s.port, "POST", "/v1/completions", body=dict(body, n=2))
        assert status == 200 and len(r["choices"]) == 2, r
    finally:
        s.stop()
