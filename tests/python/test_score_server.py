"""`kwker serve`'s vLLM routes POST /score and /classify (and their /v1/ names) by raw HTTP, on
the tiny random checkpoints of tiny_encoders: a cross-encoder of one label (ce_bert1) scores
pairs as /v1/rerank and sentence-transformers' CrossEncoder.predict do; an embedding model
(st_mean_norm) scores the cosine of SentenceTransformer's embeddings of the two texts; a
classifier of three labels (ce_bert3, id2label in config.json) answers /classify with the
softmax of transformers' float32 logits and the most probable label's name. Also:
truncate_prompt_tokens (-1, k, too large; without it a longer input is a 400, as vLLM's),
use_activation, token-id inputs, usage, aliases and auth, every 4xx of a malformed body, and the
models that cannot answer (a decoder, a head of three labels for /score, no head for /classify).
Nothing here asserts on time.
"""
import concurrent.futures

import numpy as np
import pytest

from conftest import smollm2_gguf
from test_rerank_server import DOCS, QUERY, by_index, hf_logits, load_hf
from test_server import KEY, Server, request
import tiny_encoders

RERANKER, CLASSIFIER, EMBEDDER = "ce_bert1", "ce_bert3", "st_mean_norm"
SHORT_DOCS = [d for d in DOCS if len(d) < 200]  # each pair within the model's 128 tokens
LONG = "France " * 200


def post(port, path, body, key=KEY):
    return request(port, "POST", path, body, key=key)


def start(name):
    return Server("--model", str(tiny_encoders.build(name)), "--api-key", KEY, "--timeout", 30)


@pytest.fixture(scope="module")
def ce():
    s = start(RERANKER)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def emb():
    s = start(EMBEDDER)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cls():
    s = start(CLASSIFIER)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ce_hf():
    return load_hf(str(tiny_encoders.build(RERANKER)))


def scores(reply):
    """float32 scores of a /score reply in order (index i at position i)."""
    assert reply["object"] == "list" and reply["id"].startswith("score-")
    assert [d["index"] for d in reply["data"]] == list(range(len(reply["data"])))
    assert all(d["object"] == "score" for d in reply["data"])
    return np.asarray([d["score"] for d in reply["data"]], dtype=np.float32)


def sigmoid(x):
    return 1 / (1 + np.exp(-np.asarray(x, np.float64)))


def n_tokens(tok, texts, max_length=None):
    kw = dict(truncation=True, max_length=max_length) if max_length else {}
    return sum(len(tok(t, **kw)["input_ids"]) for t in texts)


# ---- a cross-encoder ------------------------------------------------------------------------

def test_score_equals_rerank_and_cross_encoder(ce, ce_hf):
    """1:N: the head's logit through a sigmoid, bit for bit /v1/rerank's number for the same
    pair, and CrossEncoder.predict's."""
    from sentence_transformers import CrossEncoder
    for path in ("/score", "/v1/score"):
        status, j = post(ce.port, path, {"text_1": QUERY, "text_2": SHORT_DOCS})
        assert status == 200, j
        got = scores(j)
        status, rr = post(ce.port, "/v1/rerank", {"query": QUERY, "documents": SHORT_DOCS})
        assert status == 200
        assert got.tobytes() == by_index(rr).tobytes()
        assert j["usage"] == rr["usage"]
        assert isinstance(j["created"], int) and j["model"] == rr["model"]
    model = CrossEncoder(str(tiny_encoders.build(RERANKER)), device="cpu")
    ref = model.predict([(QUERY, d) for d in SHORT_DOCS], convert_to_numpy=True)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, sigmoid(hf_logits(ce_hf, 128, QUERY, SHORT_DOCS)), rtol=1e-5)


def test_pairwise_and_names(ce, ce_hf):
    """N:N pairs text_1[i] with text_2[i]; a one-element text_1 is 1:N; vLLM's other names
    (queries / documents, queries / items, data_1 / data_2) score the same."""
    a = ["What is the capital of France?", "yellow fruit", "", "Berlin"]
    b = SHORT_DOCS[:4]
    status, j = post(ce.port, "/v1/score", {"text_1": a, "text_2": b})
    assert status == 200, j
    got = scores(j)
    ref = [sigmoid(hf_logits(ce_hf, 128, q, [d]))[0] for q, d in zip(a, b)]
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    for n1, n2 in [("queries", "documents"), ("queries", "items"), ("data_1", "data_2")]:
        status, k = post(ce.port, "/score", {n1: a, n2: b})
        assert status == 200 and scores(k).tobytes() == got.tobytes(), (n1, k)
    status, one = post(ce.port, "/score", {"text_1": [QUERY], "text_2": b})
    status2, lone = post(ce.port, "/score", {"text_1": QUERY, "text_2": b})
    assert status == status2 == 200 and scores(one).tobytes() == scores(lone).tobytes()
    status, single = post(ce.port, "/score", {"text_1": a[1], "text_2": b[1]})
    assert status == 200 and scores(single).tobytes() == got[1:2].tobytes()


def test_truncation_cross_encoder(ce, ce_hf):
    """Without truncate_prompt_tokens a pair longer than the model is a 400 (vLLM's); -1 cuts
    it to the model's length (as /v1/rerank always does), k to k tokens, longest_first."""
    docs = [LONG, "short", "Paris " * 30]
    status, j = post(ce.port, "/score", {"text_1": QUERY, "text_2": docs})
    assert status == 400 and j["error"]["code"] == "context_length_exceeded", j
    assert "pair 0" in j["error"]["message"] and j["error"]["param"] == "text_2"
    status, j = post(ce.port, "/score", {"text_1": QUERY, "text_2": docs,
                                         "truncate_prompt_tokens": -1})
    assert status == 200, j
    _, rr = post(ce.port, "/v1/rerank", {"query": QUERY, "documents": docs})
    assert scores(j).tobytes() == by_index(rr).tobytes()
    for k in (5, 12, 40):
        status, j = post(ce.port, "/score", {"text_1": QUERY, "text_2": docs,
                                             "truncate_prompt_tokens": k})
        assert status == 200, j
        np.testing.assert_allclose(scores(j), sigmoid(hf_logits(ce_hf, k, QUERY, docs)),
                                   rtol=1e-5)
        tok = ce_hf[0]
        want = sum(len(ids) for ids in tok([QUERY] * 3, docs, truncation=True,
                                          max_length=k)["input_ids"])
        assert j["usage"] == {"prompt_tokens": want, "total_tokens": want}
    status, j = post(ce.port, "/score", {"text_1": "q", "text_2": "d", "truncate_prompt_tokens": 2})
    assert status == 400 and j["error"]["param"] == "truncate_prompt_tokens", j
    status, j = post(ce.port, "/score", {"text_1": "q", "text_2": "d",
                                         "truncate_prompt_tokens": 129})
    assert status == 400 and "more than this model's maximum context length of 128" in \
        j["error"]["message"], j


def test_use_activation(ce, ce_hf):
    status, j = post(ce.port, "/score", {"text_1": QUERY, "text_2": SHORT_DOCS[:3],
                                         "use_activation": False})
    assert status == 200, j
    np.testing.assert_allclose(scores(j), hf_logits(ce_hf, 128, QUERY, SHORT_DOCS[:3]).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_concurrent_score_and_rerank(ce):
    """Score and rerank requests at once: each reply is bitwise the one it gets alone."""
    jobs = [("score", {"text_1": QUERY if i % 2 else "capital",
                       "text_2": SHORT_DOCS[:1 + i % 5]}) if i % 3 else
            ("rerank", {"query": QUERY, "documents": SHORT_DOCS[:1 + i % 4]}) for i in range(18)]
    path = {"score": "/v1/score", "rerank": "/v1/rerank"}
    alone = [post(ce.port, path[k], b) for k, b in jobs]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda kb: post(ce.port, path[kb[0]], kb[1]), jobs))
    for (s1, a), (s2, t), (kind, _) in zip(alone, together, jobs):
        assert s1 == s2 == 200
        key = "data" if kind == "score" else "results"
        assert a[key] == t[key] and a["usage"] == t["usage"]


# ---- an embedding model ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(tiny_encoders.build(EMBEDDER)), device="cpu")


def cosines(st_model, a, b, max_seq_length=None):
    if max_seq_length:
        st_model.max_seq_length = max_seq_length
    try:
        ea = st_model.encode(a, convert_to_numpy=True).astype(np.float64)
        eb = st_model.encode(b, convert_to_numpy=True).astype(np.float64)
    finally:
        st_model.max_seq_length = 128
    if len(ea) == 1:
        ea = np.repeat(ea, len(eb), axis=0)
    return (ea * eb).sum(1) / (np.linalg.norm(ea, axis=1) * np.linalg.norm(eb, axis=1))


def test_embedding_cosine(emb, st_model):
    """vLLM's bi-encoder score: the cosine of the two texts' embeddings, each distinct text
    embedded once (usage counts the tokens of the texts run)."""
    b = SHORT_DOCS + [QUERY, SHORT_DOCS[0]]  # the query itself, and a repeat
    status, j = post(emb.port, "/v1/score", {"text_1": QUERY, "text_2": b})
    assert status == 200, j
    got = scores(j)
    np.testing.assert_allclose(got, cosines(st_model, [QUERY], b), rtol=1e-5, atol=2e-6)
    assert abs(got[len(SHORT_DOCS)] - 1) < 1e-6
    tok = st_model.tokenizer
    want = n_tokens(tok, set([QUERY] + b))
    assert j["usage"] == {"prompt_tokens": want, "total_tokens": want}
    a = ["why is the sky blue?", "", "café", "a"]
    status, j = post(emb.port, "/score", {"queries": a, "documents": SHORT_DOCS[:4]})
    assert status == 200, j
    np.testing.assert_allclose(scores(j), cosines(st_model, a, SHORT_DOCS[:4]), rtol=1e-5,
                               atol=2e-6)


def test_embedding_truncation(emb, st_model):
    status, j = post(emb.port, "/score", {"text_1": "short", "text_2": ["fine", LONG]})
    assert status == 400 and j["error"]["code"] == "context_length_exceeded", j
    assert "'text_2[1]'" in j["error"]["message"] and j["error"]["param"] == "text_2"
    for k, seq in [(-1, 128), (6, 6)]:
        texts = [LONG, "Paris is the capital of France.", "a"]
        status, j = post(emb.port, "/score", {"text_1": QUERY, "text_2": texts,
                                              "truncate_prompt_tokens": k})
        assert status == 200, j
        np.testing.assert_allclose(scores(j), cosines(st_model, [QUERY], texts, seq),
                                   rtol=1e-5, atol=2e-6)
        want = n_tokens(st_model.tokenizer, [QUERY] + texts, seq)
        assert j["usage"]["prompt_tokens"] == want


# ---- a classifier -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cls_hf():
    return load_hf(str(tiny_encoders.build(CLASSIFIER)))


def hf_class_logits(hf, texts, max_length=None):
    """transformers' float32 logits of each text alone (token types 0)."""
    import torch
    tok, model = hf
    out = []
    with torch.no_grad():
        for t in texts:
            kw = dict(truncation=True, max_length=max_length) if max_length else {}
            ids = torch.tensor([tok(t, **kw)["input_ids"]])
            out.append(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0])
    return torch.stack(out).numpy()


def softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


TEXTS = ["I love this movie", "The food was terrible.", "a", "Naïve café — 東京 🙂",
         "neutral statement about the weather"]
LABELS = ["contradiction", "entailment", "neutral"]


def check_classify(j, probs_ref, n_classes):
    assert j["object"] == "list" and j["id"].startswith("classify-")
    assert [d["index"] for d in j["data"]] == list(range(len(probs_ref)))
    got = np.asarray([d["probs"] for d in j["data"]], np.float64)
    np.testing.assert_allclose(got, probs_ref, rtol=1e-5, atol=1e-7)
    assert all(d["num_classes"] == n_classes for d in j["data"])
    return got


def test_classify_equals_transformers(cls, cls_hf):
    ref = softmax(hf_class_logits(cls_hf, TEXTS))
    for path in ("/classify", "/v1/classify"):
        status, j = post(cls.port, path, {"model": j_model(cls), "input": TEXTS})
        assert status == 200, j
        got = check_classify(j, ref, 3)
        assert [d["label"] for d in j["data"]] == [LABELS[i] for i in got.argmax(1)]
        want = n_tokens(cls_hf[0], TEXTS)
        assert j["usage"] == {"prompt_tokens": want, "total_tokens": want}
    status, one = post(cls.port, "/classify", {"input": TEXTS[1]})
    assert status == 200 and one["data"] == [dict(j["data"][1], index=0)]


def j_model(srv):
    status, j = request(srv.port, "GET", "/v1/models")
    assert status == 200
    return j["data"][0]["id"]


def test_classify_ids_truncation_activation(cls, cls_hf):
    tok = cls_hf[0]
    ids = [tok(t)["input_ids"] for t in TEXTS[:3]]
    status, by_text = post(cls.port, "/classify", {"input": TEXTS[:3]})
    status2, by_ids = post(cls.port, "/classify", {"input": ids})
    assert status == status2 == 200 and by_text["data"] == by_ids["data"]
    long = ["word " * 300, TEXTS[0]]
    status, j = post(cls.port, "/classify", {"input": long})
    assert status == 400 and j["error"]["code"] == "context_length_exceeded", j
    for k, ref_len in [(-1, 96), (4, 4)]:
        status, j = post(cls.port, "/classify", {"input": long, "truncate_prompt_tokens": k})
        assert status == 200, j
        check_classify(j, softmax(hf_class_logits(cls_hf, long, ref_len)), 3)
        assert j["usage"]["prompt_tokens"] == n_tokens(tok, long, ref_len)
    status, j = post(cls.port, "/classify", {"input": TEXTS, "use_activation": False})
    assert status == 200
    check_classify(j, hf_class_logits(cls_hf, TEXTS), 3)
    # token ids keep their first k, as vLLM cuts a prompt of ids
    status, j = post(cls.port, "/classify", {"input": [ids[0] * 40], "truncate_prompt_tokens": 7})
    status2, k7 = post(cls.port, "/classify", {"input": [(ids[0] * 40)[:7]]})
    assert status == status2 == 200 and j["data"] == k7["data"]


def test_classify_one_label(ce, ce_hf):
    """A head of one label: a sigmoid (vLLM's PoolerClassify), config.json's LABEL_0."""
    status, j = post(ce.port, "/classify", {"input": TEXTS})
    assert status == 200, j
    check_classify(j, sigmoid(hf_class_logits(ce_hf, TEXTS)), 1)
    assert {d["label"] for d in j["data"]} == {"LABEL_0"}


# ---- what cannot be answered ----------------------------------------------------------------

BAD_SCORE = [
    ({"text_1": "q"}, "text_2", "'text_2' is required"),
    ({"text_2": ["a"]}, "text_1", "'text_1' is required"),
    ({"queries": ["a"]}, "documents", "'documents' is required"),
    ({"text_1": "q", "text_2": []}, "text_2", "'text_2' is an empty list"),
    ({"text_1": [], "text_2": ["a"]}, "text_1", "'text_1' is an empty list"),
    ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2",
     "Input lengths must be either 1:1, 1:N or N:N"),
    ({"text_1": ["a", "b"], "text_2": "c"}, "text_2", "1:1, 1:N or N:N"),
    ({"text_1": "q", "text_2": ["a", 3]}, "text_2", "'text_2[1]' is not a string"),
    ({"text_1": "q", "text_2": [{"content": []}]}, "text_2", "'text_2[0]' is not a string"),
    ({"text_1": 5, "text_2": "a"}, "text_1", "'text_1' must be a string or a list of strings"),
    ({"text_1": "q", "text_2": ["a"] * 1001}, "text_2", "at most 1000 texts; it has 1001"),
    ({"text_1": "q" * 9000, "text_2": ["a"] * 950}, "text_2", "more than 8388608 bytes"),
    ({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens",
     "must be -1"),
    ({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens",
     "must be -1"),
    ({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": 1}, "truncate_prompt_tokens",
     "too few tokens"),
    ({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": "5"}, "truncate_prompt_tokens",
     "must be an integer"),
    ({"text_1": "q", "text_2": "a", "truncate_prompt_tokens": 2.5}, "truncate_prompt_tokens",
     "must be an integer"),
    ({"text_1": "q", "text_2": "a", "use_activation": 1}, "use_activation",
     "must be a boolean"),
    ({"text_1": "q", "text_2": "a", "truncation_side": "left"}, "truncation_side",
     "may only be 'right'"),
    ({"text_1": "q", "text_2": "a", "truncation_side": 1}, "truncation_side",
     "must be a string"),
    ({"text_1": "q", "text_2": "a", "encoding_format": "base64"}, "encoding_format",
     "must be 'float'"),
    ({"text_1": "q", "text_2": "a", "model": 7}, "model", "'model' must be a string"),
    ({"text_1": "q", "text_2": "a", "user": 7}, "user", "'user' must be a string"),
    ('{"text_1": "q", "text_2": [', None, "could not parse the JSON"),
    ('["q"]', None, "the body must be a JSON object"),
    ('{"text_1": "q", "text_1": "r", "text_2": "a"}', None, "could not parse the JSON"),
    ("[" * 100 + "]" * 100, None, "nested deeper"),
    (b'{"text_1": "q\xff", "text_2": "a"}', None, "could not parse the JSON"),
]

BAD_CLASSIFY = [
    ({}, "input", "'input' is required"),
    ({"input": []}, "input", "'input' is an empty list"),
    ({"input": ""}, "input", "'input' is an empty string"),
    ({"input": ["a", 3]}, "input", "'input[1]' is not a string"),
    ({"input": [1.5]}, "input", "'input' must be"),
    ({"input": {"text": "a"}}, "input", "'input' must be"),
    ({"input": [[1, 2], [-1]]}, "input", "not a token id of this model"),
    ({"input": ["a"] * 2049}, "input", "at most 2048 inputs"),
    ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "must be -1"),
    ({"input": "a", "truncate_prompt_tokens": 97}, "truncate_prompt_tokens",
     "maximum context length of 96"),
    ({"input": ["a", "b c"], "truncate_prompt_tokens": 1}, "truncate_prompt_tokens",
     "too few tokens"),
    ({"input": "a", "use_activation": "no"}, "use_activation", "must be a boolean"),
    ({"input": "a", "truncate_prompt_tokens": 2, "truncation_side": "left"}, "truncation_side",
     "may only be 'right'"),
    ({"input": "a", "model": ["m"]}, "model", "'model' must be a string"),
    ('{"input": ', None, "could not parse the JSON"),
    (b'{"input": "\xc3\x28"}', None, "could not parse the JSON"),
]


@pytest.mark.parametrize("body,param,want", BAD_SCORE, ids=[b[2][:40] for b in BAD_SCORE])
def test_bad_score_requests(ce, emb, body, param, want):
    for s in (ce, emb):
        status, j = post(s.port, "/v1/score", body)
        assert status == 400, j
        assert want in j["error"]["message"], j
        assert j["error"]["param"] == param and j["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,param,want", BAD_CLASSIFY, ids=[b[2][:40] for b in BAD_CLASSIFY])
def test_bad_classify_requests(cls, body, param, want):
    status, j = post(cls.port, "/v1/classify", body)
    assert status == 400, j
    assert want in j["error"]["message"], j
    assert j["error"]["param"] == param and j["error"]["type"] == "invalid_request_error"


def test_model_auth_and_aliases(ce, cls):
    for path, body in [("/score", {"text_1": "q", "text_2": "a"}),
                       ("/classify", {"input": "a"})]:
        s = ce if path == "/score" else cls
        for p in (path, "/v1" + path):
            status, j = post(s.port, p, body, key=None)
            assert status == 401 and j["error"]["type"] == "authentication_error", p
            status, j = post(s.port, p, dict(body, model="someone-else"))
            assert status == 404 and j["error"]["code"] == "model_not_found", p
            status, j = post(s.port, p, dict(body, model=j_model(s)))
            assert status == 200, (p, j)
        status, _ = request(s.port, "GET", path)
        assert status == 404


@pytest.mark.parametrize("which,path,want", [
    ("decoder", "/v1/score", "it is a generative model"),
    ("decoder", "/v1/classify", "it is a generative model"),
    ("three", "/v1/score", "more than one label"),
    ("embedder", "/v1/classify", "without a classification head"),
])
def test_models_that_cannot(which, path, want, ce, cls, emb):
    body = {"text_1": "q", "text_2": "a"} if path.endswith("score") else {"input": "a"}
    if which == "decoder":
        s = Server("--timeout", 30, "--model", smollm2_gguf())
    else:
        s = {"three": cls, "embedder": emb}[which]
    try:
        status, j = post(s.port, path, body)
    finally:
        if which == "decoder":
            s.stop()
    assert status == 400 and want in j["error"]["message"], j
    assert j["error"]["code"] == "model_not_supported" and j["error"]["param"] == "model"


def test_classify_gguf_labels(tmp_path):
    """A classifier's GGUF carries its label names in <arch>.classifier.output_labels (as
    llama.cpp's converter writes them): /classify names its labels from there; the GGUF of a
    one-label head (no names written: transformers' default) answers LABEL_0."""
    import gguf_export
    for name, want in ((CLASSIFIER, LABELS), (RERANKER, ["LABEL_0"])):
        path = tmp_path / (name + ".gguf")
        gguf_export.export_rank(tiny_encoders.build(name), path, "f32", pooler_as_cls=True)
        s = Server("--model", str(path), "--api-key", KEY, "--timeout", 30)
        try:
            status, j = post(s.port, "/classify", {"input": TEXTS})
        finally:
            s.stop()
        assert status == 200, j
        for d in j["data"]:  # one label: one prob, the argmax 0
            assert d["label"] == want[int(np.argmax(d["probs"]))], d


def test_metrics_count_score_and_classify(ce, cls):
    """/metrics counts /score's requests and pairs and /classify's requests and inputs
    answered 200 (a 400 counts neither)."""
    from test_server import metrics
    before = metrics(ce.port)
    assert post(ce.port, "/score", {"text_1": QUERY, "text_2": SHORT_DOCS[:3]})[0] == 200
    assert post(ce.port, "/score", {"text_1": "q", "text_2": []})[0] == 400
    after = metrics(ce.port)
    assert after["kwker_score_requests_total"] - before["kwker_score_requests_total"] == 1
    assert after["kwker_score_pairs_total"] - before["kwker_score_pairs_total"] == 3
    before = metrics(cls.port)
    assert post(cls.port, "/classify", {"input": TEXTS[:2]})[0] == 200
    assert post(cls.port, "/classify", {"input": []})[0] == 400
    after = metrics(cls.port)
    assert after["kwker_classify_requests_total"] - before["kwker_classify_requests_total"] == 1
    assert after["kwker_classify_inputs_total"] - before["kwker_classify_inputs_total"] == 2
