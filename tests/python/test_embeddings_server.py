"""`kwker serve` with an embedding model (the real all-MiniLM-L6-v2, which scripts/setup --test
puts in models/; $KWK_MINILM overrides): /v1/embeddings driven by the official `openai` client
and by raw HTTP, against the library itself (kwker.Encoder, the same C code called directly)
and `kwker embed`. Every comparison is bitwise: a sequence's embedding does not depend on what
it is batched with, so the server's batching of concurrent requests must not change a bit.
Also: the 400s of bad requests, chat on an encoder and embeddings on a decoder, a client that
goes away. Nothing here asserts on time.
"""
import base64
import concurrent.futures
import json
import os
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_env, kwker_bin, smollm2_gguf
from test_server import KEY, Server, metrics, request

REPO = Path(__file__).resolve().parents[2]
# TEXTS[6] is 256 tokens, [CLS] and [SEP] counted: MiniLM's limit, its sentence_bert_config.json's
# max_seq_length (its positions hold 512)
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.",
         "Kwker runs language models on CPUs.", "café, naïve, 東京", "a",
         "An embedding is a vector that stands for a text; similar texts have near vectors.",
         " ".join(["token"] * 254), "What is the capital of France?"]


def minilm_path():
    p = Path(os.environ.get("KWK_MINILM") or REPO / "models" / "all-MiniLM-L6-v2")
    if not (p / "model.safetensors").exists():
        pytest.fail("all-MiniLM-L6-v2 not found at %s: run scripts/setup --test" % p)
    return str(p)


@pytest.fixture(scope="module")
def srv():
    s = Server("--model", minilm_path(), "--api-key", KEY, "--timeout", 30)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def enc():
    import kwker
    e = kwker.Encoder(minilm_path(), threads=2)
    yield e
    e.close()


def embed_http(srv, body):
    """(status, JSON) of a raw /v1/embeddings request."""
    return request(srv.port, "POST", "/v1/embeddings", body)


def floats_of(reply):
    """float32 [n, dim] of an OpenAI reply (client object or JSON), float or base64."""
    data = reply["data"] if isinstance(reply, dict) else [d.model_dump() for d in reply.data]
    rows = []
    for i, d in enumerate(data):
        assert d["index"] == i and d["object"] == "embedding"
        e = d["embedding"]
        rows.append(np.frombuffer(base64.b64decode(e), dtype="<f4") if isinstance(e, str)
                    else np.asarray(e, dtype=np.float64).astype(np.float32))
    return np.stack(rows)


def same(a, b):
    """Bitwise equality of float32 arrays (NaN-free)."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def test_models_health_tokenize(srv, model_id, enc):
    assert model_id == "all-MiniLM-L6-v2"
    status, j = request(srv.port, "GET", "/v1/models")
    assert status == 200 and j["data"][0]["max_model_len"] == enc.max_tokens == 256
    assert len(enc.tokenize(TEXTS[6])) == 256
    assert request(srv.port, "GET", "/health", key=None)[0] == 200
    status, j = request(srv.port, "POST", "/tokenize", {"prompt": "Hello world"})
    assert status == 200 and j["tokens"] == enc.tokenize("Hello world") == [101, 7592, 2088, 102]
    status, j = request(srv.port, "POST", "/tokenize",
                        {"messages": [{"role": "user", "content": "Hi"}]})
    assert status == 400 and "embedding model and has no chat template" in j["error"]["message"]


def test_equal_to_library(client, model_id, enc):
    r = client.embeddings.create(model=model_id, input=TEXTS, encoding_format="float")
    got = floats_of(r)
    assert got.shape == (len(TEXTS), enc.dim)
    assert same(got, enc.embed(TEXTS))
    assert r.model == model_id and r.object == "list"
    # the model's own pooling: mean, normalized
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)


def test_float_equals_base64(srv, client, model_id):
    f = floats_of(client.embeddings.create(model=model_id, input=TEXTS, encoding_format="float"))
    # the client asks for base64 by default and decodes it itself
    d = np.asarray([e.embedding for e in client.embeddings.create(model=model_id,
                                                                   input=TEXTS).data],
                   dtype=np.float32)
    status, j = embed_http(srv, {"model": model_id, "input": TEXTS, "encoding_format": "base64"})
    assert status == 200 and isinstance(j["data"][0]["embedding"], str)
    assert same(f, d) and same(f, floats_of(j))


def test_batch_equals_singles(client, model_id):
    batch = floats_of(client.embeddings.create(model=model_id, input=TEXTS,
                                               encoding_format="float"))
    for i, t in enumerate(TEXTS):
        one = floats_of(client.embeddings.create(model=model_id, input=t,
                                                 encoding_format="float"))
        assert same(one[0], batch[i]), "input %d: batched differs from alone" % i


def test_concurrent_requests(srv, model_id, enc):
    ref = enc.embed(TEXTS)
    jobs = [[(i * 3 + k) % len(TEXTS) for k in range(1 + i % 4)] for i in range(24)]

    def one(idx):
        return embed_http(srv, {"model": model_id, "input": [TEXTS[k] for k in idx],
                                "encoding_format": "float" if len(idx) % 2 else "base64"})
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        replies = list(ex.map(one, jobs))
    for idx, (status, j) in zip(jobs, replies):
        assert status == 200, j
        assert same(floats_of(j), ref[idx])
    m = metrics(srv.port)
    assert m["kwker_encoder_sequences_total"] >= sum(len(j) for j in jobs)
    assert 1 <= m["kwker_encoder_batches_total"] <= m["kwker_encoder_sequences_total"]


def test_queued_requests_share_a_batch(srv, model_id, enc):
    """Requests that arrive while the encoder is busy wait, then run together: eight small
    requests queued behind a large one take fewer encoder calls than requests, and each still
    gets its own exact rows."""
    from test_server import wait_for
    before = metrics(srv.port)
    big = {"model": model_id, "input": [TEXTS[6]] * 96, "encoding_format": "base64"}
    with concurrent.futures.ThreadPoolExecutor(9) as ex:
        first = ex.submit(embed_http, srv, big)
        wait_for(lambda: metrics(srv.port)["kwker_http_requests_in_flight"] >= 1 or first.done(),
                 "the large request to be running")
        small = [ex.submit(embed_http, srv, {"model": model_id, "input": TEXTS[i],
                                             "encoding_format": "float"}) for i in range(6)]
        small += [ex.submit(embed_http, srv, {"model": model_id, "input": TEXTS[:2],
                                              "encoding_format": "float"}) for _ in range(2)]
        replies = [f.result() for f in [first] + small]
    ref = enc.embed(TEXTS)
    assert same(floats_of(replies[0][1]), np.repeat(ref[6:7], 96, axis=0))
    for i, (status, j) in enumerate(replies[1:]):
        assert status == 200 and same(floats_of(j), ref[i:i + 1] if i < 6 else ref[:2])
    after = metrics(srv.port)
    calls = after["kwker_encoder_batches_total"] - before["kwker_encoder_batches_total"]
    assert 2 <= calls < 9, "%d encoder calls for 9 requests" % calls


def test_token_ids_equal_texts(srv, client, model_id, enc):
    ids = [enc.tokenize(t) for t in TEXTS]
    by_text = floats_of(client.embeddings.create(model=model_id, input=TEXTS,
                                                 encoding_format="float"))
    by_ids = floats_of(client.embeddings.create(model=model_id, input=ids,
                                                encoding_format="float"))
    assert same(by_text, by_ids)
    one = floats_of(client.embeddings.create(model=model_id, input=ids[1],
                                             encoding_format="float"))
    assert same(one[0], by_text[1])


def test_usage(srv, client, model_id, enc):
    n = sum(len(enc.tokenize(t)) for t in TEXTS)
    before = metrics(srv.port)
    r = client.embeddings.create(model=model_id, input=TEXTS)
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n
    status, j = embed_http(srv, {"model": model_id, "input": [[101, 2000, 102], [101, 102]]})
    assert status == 200 and j["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    after = metrics(srv.port)
    assert after["kwker_prompt_tokens_total"] - before["kwker_prompt_tokens_total"] == n + 5
    assert after["kwker_embeddings_requests_total"] - before["kwker_embeddings_requests_total"] == 2
    assert after["kwker_embeddings_inputs_total"] - before["kwker_embeddings_inputs_total"] == \
        len(TEXTS) + 2


BAD = [
    ({"input": "x"}, "model", "'model' is required"),
    ({"model": "M"}, "input", "'input' is required"),
    ({"model": "M", "input": ""}, "input", "'input' is an empty string"),
    ({"model": "M", "input": []}, "input", "'input' is an empty list"),
    ({"model": "M", "input": ["a", ""]}, "input", "'input[1]' is an empty string"),
    ({"model": "M", "input": [[101, 102], []]}, "input", "'input[1]' is an empty list"),
    ({"model": "M", "input": ["a", [101]]}, "input", "'input[1]' is not a string"),
    ({"model": "M", "input": [101, 30522]}, "input", "'input[1]' is 30522, not a token id"),
    ({"model": "M", "input": [[101], [101, -5]]}, "input", "'input[1][1]' is -5"),
    ({"model": "M", "input": 42}, "input", "'input' must be a string, a list of strings"),
    ({"model": "M", "input": ["a"] * 2049}, "input", "at most 2048 inputs; it has 2049"),
    ({"model": "M", "input": ["short", "word " * 600]}, "input",
     "maximum context length is 256 tokens, however you requested 602 tokens (input 1)"),
    ({"model": "M", "input": ["token " * 255]}, "input",
     "maximum context length is 256 tokens, however you requested 257 tokens (input 0)"),
    ({"model": "M", "input": [[101] * 257]}, "input", "requested 257 tokens (input 0)"),
    ({"model": "M", "input": "x", "encoding_format": "int8"}, "encoding_format",
     "'float' or 'base64'"),
    ({"model": "M", "input": "x", "dimensions": 128}, "dimensions",
     "must be 384, this model's embedding size"),
    ({"model": "M", "input": "x", "dimensions": "384"}, "dimensions", "must be an integer"),
    ({"model": "M", "input": "x", "user": 5}, "user", "'user' must be a string"),
    ("{\"model\": \"M\", \"input\": [", None, "could not parse the JSON"),
    ("[" * 100 + "]" * 100, None, "nested deeper"),
]


@pytest.mark.parametrize("body,param,want", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_requests(srv, model_id, body, param, want):
    if isinstance(body, dict) and body.get("model") == "M":
        body = dict(body, model=model_id)
    status, j = embed_http(srv, body)
    assert status == 400, j
    assert want in j["error"]["message"], j
    assert j["error"]["param"] == param and j["error"]["type"] == "invalid_request_error"


def test_bad_requests_through_client(client, model_id):
    import openai
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        client.embeddings.create(model=model_id, input="word " * 600)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.embeddings.create(model="text-embedding-3-small", input="x")


def test_chat_on_encoder(srv, client, model_id):
    import openai
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.chat.completions.create(model=model_id,
                                       messages=[{"role": "user", "content": "Hi"}])
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.completions.create(model=model_id, prompt="Hi")
    m = metrics(srv.port)  # /metrics keeps working without an engine
    assert m['kwker_http_requests_total{status="400"}'] >= 2


def test_embeddings_on_decoder():
    s = Server("--timeout", 30)
    try:
        import openai
        c = s.client()
        with pytest.raises(openai.BadRequestError, match="does not make embeddings"):
            c.embeddings.create(model=c.models.list().data[0].id, input="Hi")
    finally:
        s.stop()


def abandon(port, path, body, n=4):
    """n POSTs of the JSON body to path whose clients close once the request is sent."""
    body = json.dumps(body).encode()
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.close()


def test_client_goes_away(srv, model_id, enc):
    """Requests whose clients close before the answer: the server answers the others and stops
    cleanly (Server.stop checks the exit code, an ASan report included)."""
    abandon(srv.port, "/v1/embeddings", {"model": model_id, "input": TEXTS * 64})
    status, j = embed_http(srv, {"model": model_id, "input": TEXTS[:2], "encoding_format":
                                 "float"})
    assert status == 200 and same(floats_of(j), enc.embed(TEXTS[:2]))


def cli_embed(*args, stdin=None):
    return subprocess.run([kwker_bin(), "embed", "--model", minilm_path(), "-t", "2"] +
                          list(args), input=stdin, capture_output=True, text=True,
                          env=cli_env(), timeout=600)


def test_cli_equals_server(client, model_id):
    server = floats_of(client.embeddings.create(model=model_id, input=TEXTS,
                                                encoding_format="float"))
    p = cli_embed(*TEXTS)
    assert p.returncode == 0, p.stderr
    assert same(np.asarray([json.loads(ln) for ln in p.stdout.splitlines()], np.float64), server)
    p = cli_embed("--json", stdin="".join(t + "\n" for t in TEXTS))
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["dim"] == 384 and same(np.asarray(j["data"], np.float64), server)


def test_cli_errors():
    p = cli_embed("ok", "")
    assert p.returncode != 0 and "text 1 is empty" in p.stderr
    p = cli_embed("word " * 600)
    assert p.returncode != 0 and "text 0 has 602 tokens, more than the model's 256" in p.stderr
    p = subprocess.run([kwker_bin(), "embed", "--model", smollm2_gguf(), "Hi"],
                       capture_output=True, text=True, env=cli_env(), timeout=600)
    assert p.returncode != 0 and "not an embedding model" in p.stderr
    p = cli_embed("--pooling", "median", "x")
    assert p.returncode == 2 and "--pooling" in p.stderr


def test_pooling_flags(enc):
    """--pooling cls --no-normalize: the server's embeddings are the library's with the same
    override."""
    import kwker
    s = Server("--model", minilm_path(), "--pooling", "cls", "--no-normalize")
    try:
        c = s.client()
        got = floats_of(c.embeddings.create(model=c.models.list().data[0].id, input=TEXTS,
                                            encoding_format="float"))
    finally:
        s.stop()
    with kwker.Encoder(minilm_path(), threads=2, pooling="cls", normalize=False) as e:
        assert same(got, e.embed(TEXTS))
    assert not np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-3)


def test_decoder_flags_refused():
    """Flags of the other kind of model are refused at start, never ignored."""
    for args, want in [(["--model", minilm_path(), "--kv-bits", "16"], "--kv-bits"),
                       (["--model", smollm2_gguf(), "--pooling", "mean"], "--pooling")]:
        p = subprocess.run([kwker_bin(), "serve", "--port", "0"] + args, capture_output=True,
                           text=True, env=cli_env(), timeout=600)
        assert p.returncode != 0 and want in p.stderr, p.stderr


def test_max_queue():
    """--max-queue bounds the requests waiting for the encoder: beyond it a 503 server_busy,
    while the ones taken are answered in full."""
    from test_server import wait_for
    s = Server("--model", minilm_path(), "--max-queue", 1)
    try:
        mid = s.client().models.list().data[0].id
        big = {"model": mid, "input": [TEXTS[6]] * 96}
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            first = ex.submit(request, s.port, "POST", "/v1/embeddings", big)
            wait_for(lambda: metrics(s.port)["kwker_http_requests_in_flight"] >= 1 or
                     first.done(), "the large request to be running")
            small = [ex.submit(request, s.port, "POST", "/v1/embeddings",
                               {"model": mid, "input": TEXTS[i]}) for i in range(5)]
            replies = [f.result() for f in [first] + small]
    finally:
        s.stop()
    assert replies[0][0] == 200
    busy = [j for st, j in replies[1:] if st == 503]
    assert all(st in (200, 503) for st, _ in replies[1:])
    assert 1 <= len(busy) <= 4 and "--max-queue" in busy[0]["error"]["message"]


def test_max_seq_length_honoured(tmp_path):
    """A tiny model whose sentence_bert_config.json says max_seq_length 40 (of 128 positions):
    /v1/models' max_model_len is 40, an input of 41 tokens is a 400 naming the limit, inputs up
    to 40 are SentenceTransformer.encode's embeddings (the library's to the bit)."""
    import shutil
    import kwker
    import tiny_encoders as te
    from conftest import REL_TOL, rel_err
    from sentence_transformers import SentenceTransformer
    d = tmp_path / "st40"
    shutil.copytree(te.build("st_mean_norm"), d)
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    texts = [" ".join(["token"] * 38), "Hello world"]
    with kwker.Encoder(str(d), threads=2) as e:
        assert e.max_tokens == 40 and len(e.tokenize(texts[0])) == 40
        want = e.embed(texts)
    ref = SentenceTransformer(str(d), device="cpu").encode(texts, convert_to_numpy=True)
    assert rel_err(want, ref) <= REL_TOL
    s = Server("--model", str(d), "--timeout", 30)
    try:
        status, j = request(s.port, "GET", "/v1/models")
        assert status == 200 and j["data"][0]["max_model_len"] == 40
        mid = j["data"][0]["id"]
        status, j = request(s.port, "POST", "/v1/embeddings",
                            {"model": mid, "input": texts, "encoding_format": "float"})
        assert status == 200 and same(floats_of(j), want)
        status, j = request(s.port, "POST", "/v1/embeddings",
                            {"model": mid, "input": ["a", "token " * 39]})
        assert status == 400 and "maximum context length is 40 tokens, however you requested " \
            "41 tokens (input 1)" in j["error"]["message"], j
    finally:
        s.stop()
