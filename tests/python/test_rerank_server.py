"""`kwker serve` with a cross-encoder reranker (a tiny random BertForSequenceClassification with
one label, from tiny_encoders): POST /v1/rerank and its aliases by raw HTTP, against
transformers' float32 logits through a sigmoid (sentence-transformers' CrossEncoder default for
one label), each pair tokenized as CrossEncoder does (the tokenizer called on lists of queries
and documents, truncation longest_first to the model's positions). Also: ordering, top_n,
return_documents, Jina's / Cohere's object documents, documents longer than the model, the 400s
(bad bodies, an embedding model without a head, a head of three labels, a decoder), concurrent
clients (bitwise the scores of each alone, embeddings requests in between), --max-queue, a
client that goes away, a request of megabytes tokenized off the event loop (/health answers
meanwhile: compared with the big request's own time, no absolute time), and `kwker rerank`
printing the server's reply.
"""
import concurrent.futures
import http.client
import json
import socket
import subprocess
import time

import numpy as np
import pytest

from conftest import cli_env, kwker_bin, smollm2_gguf
from test_embeddings_server import abandon
from test_server import KEY, Server, metrics, request, wait_for
import tiny_encoders

QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital and largest city of France.",
        "Bananas are yellow and grow in bunches.",
        "Berlin is the capital of Germany.",
        "Naïve café owners in Zürich — ŒUVRE, 東京, ελληνικά, 🙂 and déjà vu.",
        "",
        "a",
        "France " * 200,  # longer than the model: truncated, never refused
        "The Eiffel Tower is in Paris, France."]
RERANKER, THREE_LABELS, EMBEDDER = "ce_bert1", "ce_bert3", "st_mean_norm"


@pytest.fixture(scope="module")
def ce_path():
    return str(tiny_encoders.build(RERANKER))


@pytest.fixture(scope="module")
def srv(ce_path):
    s = Server("--model", ce_path, "--api-key", KEY, "--timeout", 30)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def info(srv):
    status, j = request(srv.port, "GET", "/v1/models")
    assert status == 200
    return j["data"][0]["id"], j["data"][0]["max_model_len"]


def load_hf(path):
    import torch
    import transformers
    from tiny_models import torch_single_thread
    torch_single_thread()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    return tok, model


@pytest.fixture(scope="module")
def hf(ce_path):
    return load_hf(ce_path)


def hf_pairs(hf, max_tokens, query, docs):
    """CrossEncoder's tokenization: lists of queries and documents (a lone call with an empty
    document would drop it and encode the query alone), longest_first to max_tokens."""
    tok, _ = hf
    return tok([query] * len(docs), list(docs), truncation=True, max_length=max_tokens)


def hf_logits(hf, max_tokens, query, docs):
    """transformers' float32 logit of each pair, run alone (no padding)."""
    import torch
    _, model = hf
    enc = hf_pairs(hf, max_tokens, query, docs)
    out = []
    with torch.no_grad():
        for i, ids in enumerate(enc["input_ids"]):
            t = torch.tensor([ids])
            types = torch.tensor([enc["token_type_ids"][i]]) if "token_type_ids" in enc \
                else torch.zeros_like(t)
            out.append(model(input_ids=t, token_type_ids=types,
                             attention_mask=torch.ones_like(t)).logits[0, 0])
    return torch.stack(out)


def hf_scores(hf, max_tokens, query, docs):
    """float32 sigmoid of transformers' float32 logits (CrossEncoder's default for one label)."""
    import torch
    return torch.sigmoid(hf_logits(hf, max_tokens, query, docs)).numpy().astype(np.float32)


def rerank(srv, body, path="/v1/rerank", key=KEY):
    return request(srv.port, "POST", path, body, key=key)


def by_index(reply):
    """float32 scores of a reply in document order (every document must be there once)."""
    res = reply["results"]
    idx = [r["index"] for r in res]
    assert sorted(idx) == list(range(len(idx))), idx
    out = np.zeros(len(res), dtype=np.float32)
    for r in res:
        out[r["index"]] = r["relevance_score"]
    return out


def check_order(reply):
    """Scores descending, equal scores by index."""
    keys = [(-r["relevance_score"], r["index"]) for r in reply["results"]]
    assert keys == sorted(keys), keys


def test_scores_equal_transformers(srv, info, hf):
    mid, max_tokens = info
    assert max_tokens == 128  # the model's positions: DOCS[6] is longer
    status, j = rerank(srv, {"model": mid, "query": QUERY, "documents": DOCS})
    assert status == 200, j
    assert j["model"] == mid and j["object"] == "list" and j["id"].startswith("rerank-")
    check_order(j)
    got, ref = by_index(j), hf_scores(hf, max_tokens, QUERY, DOCS)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=0)
    assert [r["document"]["text"] for r in j["results"]] == [DOCS[r["index"]]
                                                             for r in j["results"]]
    n = sum(len(ids) for ids in hf_pairs(hf, max_tokens, QUERY, DOCS)["input_ids"])
    assert j["usage"] == {"prompt_tokens": n, "total_tokens": n}
    # the long document was cut to the model's length, with the query kept whole
    assert len(hf_pairs(hf, max_tokens, QUERY, DOCS[6:7])["input_ids"][0]) == max_tokens


def test_long_query_and_documents_truncated(srv, info, hf):
    """longest_first: a query longer than the model loses tokens too; nothing is refused."""
    mid, max_tokens = info
    query = "capital city " * 150
    docs = ["Paris " * 500, "short document", "Lyon is a city in France. " * 40]
    status, j = rerank(srv, {"query": query, "documents": docs})
    assert status == 200, j
    np.testing.assert_allclose(by_index(j), hf_scores(hf, max_tokens, query, docs), rtol=1e-5)
    assert j["usage"]["prompt_tokens"] == 3 * max_tokens


def test_empty_query(srv, info, hf):
    """An empty query is scored, as vLLM and llama.cpp score it ([CLS] [SEP] doc [SEP])."""
    _, max_tokens = info
    status, j = rerank(srv, {"query": "", "documents": DOCS[:3]})
    assert status == 200, j
    np.testing.assert_allclose(by_index(j), hf_scores(hf, max_tokens, "", DOCS[:3]), rtol=1e-5)


@pytest.mark.parametrize("name", ["ce_roberta1", "ce_xlmr1", "ce_bert1_identity"])
def test_other_rerankers(name):
    """RoBERTa's and XLM-R's pair forms (<s> a </s></s> b </s>, token types all 0), and a
    CrossEncoder saved with activation_fn Identity: its scores are the raw logits."""
    path = str(tiny_encoders.build(name))
    spec = tiny_encoders.SPECS[name]
    max_tokens = tiny_encoders.max_tokens(spec)
    s = Server("--model", path, "--timeout", 30)
    try:
        status, j = request(s.port, "POST", "/v1/rerank", {"query": QUERY, "documents": DOCS})
    finally:
        s.stop()
    assert status == 200, j
    check_order(j)
    logits = hf_logits(load_hf(path), max_tokens, QUERY, DOCS).numpy()
    got = by_index(j)
    if spec.get("ce_act", "").endswith("Identity"):
        span = logits.max() - logits.min()
        assert np.abs(got - logits).max() <= 1e-5 * span, (got, logits)
    else:
        np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits.astype(np.float64))), rtol=1e-5)


def test_top_n_and_return_documents(srv):
    status, full = rerank(srv, {"query": QUERY, "documents": DOCS})
    assert status == 200
    for top_n, want in [(1, 1), (3, 3), (len(DOCS), len(DOCS)), (100, len(DOCS)),
                        (0, len(DOCS)), (None, len(DOCS))]:
        status, j = rerank(srv, {"query": QUERY, "documents": DOCS, "top_n": top_n})
        assert status == 200, j
        assert j["results"] == full["results"][:want], top_n
    status, j = rerank(srv, {"query": QUERY, "documents": DOCS, "top_n": 2,
                             "return_documents": False})
    assert status == 200
    assert [set(r) for r in j["results"]] == [{"index", "relevance_score"}] * 2
    assert [(r["index"], r["relevance_score"]) for r in j["results"]] == \
        [(r["index"], r["relevance_score"]) for r in full["results"][:2]]
    assert j["usage"] == full["usage"]


def test_object_documents(srv):
    """Jina's and Cohere's {"text": ...} documents (other fields ignored) score as strings."""
    status, strings = rerank(srv, {"query": QUERY, "documents": DOCS})
    objs = [{"text": d, "title": "t%d" % i} if i % 2 else {"text": d} for i, d in enumerate(DOCS)]
    status, j = rerank(srv, {"query": QUERY, "documents": objs})
    assert status == 200, j
    assert j["results"] == strings["results"]


def test_ties_keep_index_order(srv):
    status, j = rerank(srv, {"query": QUERY, "documents": ["same text"] * 5 + ["other"] +
                             ["same text"]})
    assert status == 200
    check_order(j)
    same = [r["index"] for r in j["results"] if r["index"] != 5]
    assert same == sorted(same)


def test_aliases_and_auth(srv):
    body = {"query": QUERY, "documents": DOCS[:4]}
    status, ref = rerank(srv, body)
    assert status == 200
    for path in ["/rerank", "/v2/rerank", "/v1/reranking", "/reranking"]:
        status, j = rerank(srv, body, path)
        assert status == 200 and j["results"] == ref["results"], path
        status, j = rerank(srv, body, path, key=None)
        assert status == 401 and j["error"]["type"] == "authentication_error", path
    status, _ = request(srv.port, "GET", "/v1/rerank")
    assert status == 404


BAD = [
    ({"documents": ["a"]}, "query", "'query' is required"),
    ({"query": 5, "documents": ["a"]}, "query", "'query' must be a string"),
    ({"query": "q"}, "documents", "'documents' is required"),
    ({"query": "q", "documents": "a"}, "documents", "'documents' must be a list of strings or "
     "of objects with a string 'text'"),
    ({"query": "q", "documents": []}, "documents", "'documents' is an empty list"),
    ({"query": "q", "documents": ["a", 3]}, "documents", "'documents[1]' is not a string"),
    ({"query": "q", "documents": ["a", None]}, "documents", "'documents[1]' is not a string"),
    ({"query": "q", "documents": ["a", "b", {"title": "x"}]}, "documents",
     "'documents[2].text' must be a string"),
    ({"query": "q", "documents": [{"text": ["x"]}]}, "documents",
     "'documents[0].text' must be a string"),
    ({"query": "q", "documents": ["a"] * 1001}, "documents",
     "at most 1000 documents; it has 1001"),
    ({"query": "q" * 9000, "documents": ["a"] * 950}, "documents",
     "more than 8388608 bytes to tokenize"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n", "'top_n' must be at least 1"),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n", "'top_n' must be an integer"),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, "top_n", "'top_n' must be an integer"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents",
     "'return_documents' must be a boolean"),
    ({"query": "q", "documents": ["a"], "model": 7}, "model", "'model' must be a string"),
    ("{\"query\": \"q\", \"documents\": [", None, "could not parse the JSON"),
    ("[\"q\"]", None, "the body must be a JSON object"),
    ("{\"query\": \"q\", \"query\": \"r\", \"documents\": [\"a\"]}", None,
     "could not parse the JSON"),
    ("[" * 100 + "]" * 100, None, "nested deeper"),
]


@pytest.mark.parametrize("body,param,want", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_requests(srv, body, param, want):
    status, j = rerank(srv, body)
    assert status == 400, j
    assert want in j["error"]["message"], j
    assert j["error"]["param"] == param and j["error"]["type"] == "invalid_request_error"


def test_unknown_model(srv, info):
    status, j = rerank(srv, {"model": "bge-reranker-v2-m3", "query": "q", "documents": ["a"]})
    assert status == 404 and j["error"]["code"] == "model_not_found"
    status, j = rerank(srv, {"model": info[0], "query": "q", "documents": ["a"]})
    assert status == 200


def test_concurrent_clients(srv, info):
    """Several clients at once, rerank and embeddings requests mixed: each rerank reply is
    bitwise its reply alone (the head's logits do not depend on the batch)."""
    mid = info[0]
    jobs = [(QUERY if i % 3 else "capital", [DOCS[(i + k) % len(DOCS)] for k in range(1 + i % 5)])
            for i in range(24)]
    alone = [rerank(srv, {"query": q, "documents": d}) for q, d in jobs]
    status, emb_alone = request(srv.port, "POST", "/v1/embeddings",
                                {"model": mid, "input": DOCS[:3]})
    assert status == 200 and all(s == 200 for s, _ in alone)

    def one(i):
        if i % 4 == 3:
            return request(srv.port, "POST", "/v1/embeddings", {"model": mid, "input": DOCS[:3]})
        q, d = jobs[i]
        return rerank(srv, {"query": q, "documents": d})
    before = metrics(srv.port)
    with concurrent.futures.ThreadPoolExecutor(12) as ex:
        replies = list(ex.map(one, range(len(jobs))))
    for i, (status, j) in enumerate(replies):
        assert status == 200, j
        if i % 4 == 3:
            assert j["data"] == emb_alone["data"]
        else:
            assert j["results"] == alone[i][1]["results"] and j["usage"] == alone[i][1]["usage"]
    after = metrics(srv.port)
    n_rerank = sum(1 for i in range(len(jobs)) if i % 4 != 3)
    assert after["kwker_rerank_requests_total"] - before["kwker_rerank_requests_total"] == \
        n_rerank
    assert after["kwker_rerank_documents_total"] - before["kwker_rerank_documents_total"] == \
        sum(len(jobs[i][1]) for i in range(len(jobs)) if i % 4 != 3)
    assert after["kwker_prompt_tokens_total"] > before["kwker_prompt_tokens_total"]


def test_embeddings_on_reranker(srv, info, ce_path):
    """A reranker is still an encoder: /v1/embeddings answers as the library embeds."""
    import kwker
    status, j = request(srv.port, "POST", "/v1/embeddings", {"model": info[0], "input": DOCS[:3],
                                                             "encoding_format": "float"})
    assert status == 200, j
    got = np.asarray([d["embedding"] for d in j["data"]], dtype=np.float32)
    with kwker.Encoder(ce_path, threads=2) as e:
        assert got.tobytes() == e.embed(DOCS[:3]).tobytes()


def test_chat_on_reranker(srv, info):
    status, j = request(srv.port, "POST", "/v1/chat/completions",
                        {"model": info[0], "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 400 and "/v1/rerank" in j["error"]["message"]


def test_client_goes_away(srv):
    abandon(srv.port, "/v1/rerank", {"query": QUERY, "documents": DOCS * 100})
    status, j = rerank(srv, {"query": QUERY, "documents": DOCS[:2]})
    assert status == 200 and len(j["results"]) == 2


def _no_pair_form(tmp_path):
    """A reranker whose tokenizer.json has a TemplateProcessing without "pair" (tokenizers
    refuses such a file; Kwker loads it with no pair form)."""
    import shutil
    d = tmp_path / "no_pair"
    shutil.copytree(tiny_encoders.build("ce_bert1"), d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["post_processor"] = {"type": "TemplateProcessing",
                            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                            "special_tokens": {}}
    (d / "tokenizer.json").write_text(json.dumps(tj))
    return str(d)


@pytest.mark.parametrize("which,want", [
    ("embedder", "embedding model without a classification head"),
    ("three", "more than one label"),
    ("decoder", "it is a generative model"),
    ("no_pair", "no pair form"),
])
def test_models_that_cannot_rerank(which, want, tmp_path):
    path = {"embedder": lambda: str(tiny_encoders.build(EMBEDDER)),
            "three": lambda: str(tiny_encoders.build(THREE_LABELS)),
            "decoder": smollm2_gguf,
            "no_pair": lambda: _no_pair_form(tmp_path)}[which]()
    s = Server("--model", path, "--timeout", 30)
    try:
        status, j = request(s.port, "POST", "/v1/rerank", {"query": "q", "documents": ["a"]})
        assert status == 400 and want in j["error"]["message"], j
        assert j["error"]["code"] == "model_not_supported" and j["error"]["param"] == "model"
        if which != "decoder":  # still an encoder: embeddings answer
            status, j = request(s.port, "POST", "/v1/embeddings",
                                {"model": s.client().models.list().data[0].id, "input": "a"})
            assert status == 200, j
    finally:
        s.stop()


def test_max_queue(ce_path):
    """--max-queue bounds the requests waiting for the encoder: a 503 server_busy beyond it,
    while the ones taken are answered in full. The first request holds the worker for a while:
    1000 pairs of the model's full length."""
    s = Server("--model", ce_path, "--max-queue", 1)
    try:
        big = {"query": "capital " * 100, "documents": ["France " * 120] * 1000}
        small = {"query": QUERY, "documents": DOCS[:2]}
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            first = ex.submit(request, s.port, "POST", "/v1/rerank", big)
            wait_for(lambda: metrics(s.port)["kwker_http_requests_in_flight"] >= 1 or
                     first.done(), "the large request to be running")
            smalls = [ex.submit(request, s.port, "POST", "/v1/rerank", small) for _ in range(5)]
            replies = [f.result() for f in [first] + smalls]
    finally:
        s.stop()
    assert replies[0][0] == 200 and len(replies[0][1]["results"]) == 1000
    busy = [j for st, j in replies[1:] if st == 503]
    assert all(st in (200, 503) for st, _ in replies[1:])
    assert 1 <= len(busy) <= 4 and "--max-queue" in busy[0]["error"]["message"]


def test_tokenizing_leaves_the_event_loop_free(ce_path, hf):
    """About 7 MB of documents: the event loop only parses the body, the encoder worker
    tokenizes the pairs (a second or more of WordPiece). GET /health, asked again and again
    while the big request runs, is answered first, and each time within half the big request's
    time: were the loop tokenizing, the /health asked meanwhile would wait for all of it. The
    big reply is still transformers' scores, each pair truncated to the model's length."""
    units = [DOCS[0], DOCS[1], DOCS[2], DOCS[7]]  # ASCII: the body is as long as the text
    docs = [" ".join(units[(k + i) % 4] for i in range(22000)) for k in range(8)]
    body = json.dumps({"query": QUERY, "documents": docs}).encode()
    assert 6 << 20 < len(body) < 8 << 20
    s = Server("--model", ce_path, "--max-body", 16 << 20, "--timeout", 300)
    try:
        mid = s.client().models.list().data[0].id
        big = socket.create_connection(("127.0.0.1", s.port))
        big.settimeout(600)

        def big_reply():
            resp = http.client.HTTPResponse(big)
            resp.begin()
            data = resp.read()
            return time.monotonic(), resp.status, json.loads(data)
        health = []  # (sent, answered, status) of each /health
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            big.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: x\r\nContent-Type: "
                        b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                        b"\r\n\r\n" + body)
            t_sent = time.monotonic()
            waiter = ex.submit(big_reply)
            while not waiter.done():
                t = time.monotonic()
                status, _ = request(s.port, "GET", "/health", key=None)
                health.append((t, time.monotonic(), status))
            t_big, big_status, j = waiter.result()
        big.close()
    finally:
        s.stop()
    assert all(st == 200 for _, _, st in health)
    assert health[0][1] < t_big
    slowest = max(done - sent for sent, done, _ in health)
    assert slowest < (t_big - t_sent) / 2, (slowest, t_big - t_sent, len(health))
    assert big_status == 200, j
    assert j["model"] == mid
    np.testing.assert_allclose(by_index(j), hf_scores(hf, 128, QUERY, docs), rtol=1e-5, atol=0)
    assert j["usage"] == {"prompt_tokens": 8 * 128, "total_tokens": 8 * 128}


def cli_rerank(path, *args, stdin=None):
    return subprocess.run([kwker_bin(), "rerank", "--model", path, "-t", "2"] + list(args),
                          input=stdin, capture_output=True, text=True, env=cli_env(),
                          timeout=600)


def test_cli_equals_server(srv, ce_path):
    for top_n, extra in [(None, []), (3, ["--top-n", "3"]), (None, ["--no-documents"])]:
        body = {"query": QUERY, "documents": DOCS}
        if top_n:
            body["top_n"] = top_n
        if "--no-documents" in extra:
            body["return_documents"] = False
        status, j = rerank(srv, body)
        assert status == 200
        del j["id"]
        p = cli_rerank(ce_path, "--query", QUERY, *extra, "--", *DOCS)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == j
    # documents from stdin, one a line, the options after them
    status, j = rerank(srv, {"query": QUERY, "documents": DOCS[:4]})
    del j["id"]
    p = cli_rerank(ce_path, "-q", QUERY, stdin="".join(d + "\n" for d in DOCS[:4]))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == j
    p = cli_rerank(ce_path, DOCS[0], "-q", QUERY, DOCS[1])
    assert p.returncode == 0 and [r["index"] for r in json.loads(p.stdout)["results"]] != []


def test_cli_errors(ce_path):
    p = cli_rerank(str(tiny_encoders.build(EMBEDDER)), "-q", "q", "a")
    assert p.returncode == 1 and "without a classification head" in p.stderr
    p = cli_rerank(smollm2_gguf(), "-q", "q", "a")
    assert p.returncode == 1 and "is a generative model" in p.stderr
    p = cli_rerank(ce_path, "a", "b")
    assert p.returncode == 2 and "usage: kwker rerank" in p.stderr
    p = cli_rerank(ce_path, "-q", "q", "--top-n", "0", "a")
    assert p.returncode == 2 and "--top-n" in p.stderr
    p = cli_rerank(ce_path, "-q", "q", stdin="")
    assert p.returncode == 2 and "no documents" in p.stderr
    p = subprocess.run([kwker_bin(), "--help"], capture_output=True, text=True, timeout=60)
    assert "rerank" in p.stdout
