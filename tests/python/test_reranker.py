"""kwker.Reranker (cross-encoders) against transformers' float32
AutoModelForSequenceClassification and sentence-transformers' CrossEncoder, on every kernel path
this CPU has.

Models: the tiny random cross-encoders of tiny_encoders.CROSS_ENCODERS:
BertForSequenceClassification with 1 and 3 labels (gelu and gelu_new, named labels), one whose
config.json says sentence_transformers.activation_fn Identity, a
RobertaForSequenceClassification and an XLMRobertaForSequenceClassification whose tokenizers
join pairs as RoBERTa does ([CLS] a [SEP] [SEP] b [SEP], token types all 0: the BERT
vocabulary, RoBERTa's pair form).

Reference: each pair tokenized by Hugging Face's tokenizer(a, b, truncation=True,
max_length=max tokens) and run alone (no padding) through transformers' float32 eager model; its
logits. Acceptance for preserve: max|kwker - transformers| <= 1e-5 * max|logits| over all the
pairs and labels of a model (conftest.REL_TOL; measured 2.5e-7 to 1.8e-6 when this test was
written, every path). Kernel paths: each of KWKER_ISA=scalar|avx2|avx512 the CPU supports runs
in its own child process (KWKER_ISA is read once per process: kwk_worker below); the other tests
run in this process on the library's own choice.

Scores: sentence-transformers' CrossEncoder applies the activation_fn a model's config names
(config.json's sentence_transformers.activation_fn, before version 4
sbert_ce_default_activation_function; since version 5 config_sentence_transformers.json's
activation_fn), else Sigmoid for one label and Identity for more; predict() is compared with
CrossEncoder.predict itself (sentence-transformers is a test dependency, scripts/setup --test).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import gguf_export
import tiny_encoders as te
from conftest import PY_DIR, REL_TOL, rel_err, supported_isas

import kwker
from kwker import KwkError

KWK_ELIMIT, KWK_ERANGE, KWK_EUNSUPPORTED = -10003, -10005, -10002
CE = list(te.CROSS_ENCODERS)
ISAS = supported_isas()

LONG = " ".join(te.TEXTS * 8)  # about 380 tokens: past every tiny model's positions
QUERIES = ["why is the sky blue?", "Naïve café owners in Zürich", "a"]
DOCS = ["The sky is blue because of Rayleigh scattering of sunlight.",
        "Hello, world! The quick brown fox jumps over the lazy dog.",
        "東京, ελληνικά, 🙂 and déjà vu — ŒUVRE.", "a", LONG]
# 15 pairs, a long document after each query (its tokens cut), and two long texts (both cut:
# longest_first takes from the longer one first)
PAIRS = [[q, d] for q in QUERIES for d in DOCS] + [[LONG, LONG], [LONG[:700], LONG]]


def max_len(name):
    return te.max_tokens(te.SPECS[name])


def score_err(got, ref):
    """max|got - ref| / max|ref|: the acceptance's measure for logits."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def check_logits(got, ref, what, tol=REL_TOL):
    return te.check_close(got, ref, what, tol, score_err, "max|logit|",
                          lambda r: np.abs(r).max())


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


# -- references ----------------------------------------------------------------------------------

def load_hf_cls(path, act=None):
    """transformers' float32 AutoModelForSequenceClassification (eager attention, eval), its
    hidden_act replaced by act when given."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification
    from tiny_models import torch_single_thread
    torch_single_thread()
    kw = {}
    if act is not None:
        kw["config"] = AutoConfig.from_pretrained(str(path), hidden_act=act)
    return AutoModelForSequenceClassification.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager", **kw).eval()


def hf_logits(model, ids, types=None):
    """float32 logits [labels] of one sequence alone (no padding)."""
    import torch
    t = torch.tensor([list(ids)], dtype=torch.long)
    kw = {} if types is None else {"token_type_ids": torch.tensor([list(types)],
                                                                  dtype=torch.long)}
    with torch.no_grad():
        return model(input_ids=t, attention_mask=torch.ones_like(t), **kw).logits[0].numpy()


class Ref:
    """A cross-encoder's reference on PAIRS: Hugging Face's token ids and type ids (all 0 when
    its tokenizer gives none), transformers' logits [n, labels]."""

    def __init__(self, name, pairs=PAIRS, max_length=None):
        from transformers import AutoTokenizer
        self.name, self.path = name, te.build(name)
        self.max_length = max_length or max_len(name)
        tok = AutoTokenizer.from_pretrained(str(self.path))
        model = load_hf_cls(self.path)
        self.ids, self.types, logits = [], [], []
        for a, b in pairs:
            enc = tok(a, b, truncation=True, max_length=self.max_length)
            ids = list(enc["input_ids"])
            types = enc.get("token_type_ids")
            self.ids.append(ids)
            self.types.append(list(types) if types is not None else [0] * len(ids))
            logits.append(hf_logits(model, ids, types))
        self.logits = np.stack(logits)
        self.n_labels = self.logits.shape[1]


_refs = {}


def ref(name):
    if name not in _refs:
        _refs[name] = Ref(name)
    return _refs[name]


# -- the child process: kwker on one kernel path -------------------------------------------------

def _reranker_op(rr, kind, arg):
    if kind in ("logits", "scores"):
        return np.asarray(rr.predict(arg, activation=kind == "scores"), dtype=np.float32)
    if kind == "tok":
        return np.asarray(rr.tokenize(*arg), dtype=np.int64)
    raise ValueError(kind)


def kwk_worker(job_path, out_path):
    """Run each case's ops through kwker.Reranker in this process (its KWKER_ISA) and save each
    result as key|op in an .npz, with errors and the library's ISA in __meta__ (tiny_encoders.
    run_cases). A case: {key, model, ops: [[name, kind, arg]]}, kind "logits" / "scores" (arg:
    pairs; predict with activation False / True), "tok" (arg: a pair; ids then types, stacked)."""
    te.run_cases(job_path, out_path, lambda c, meta: kwker.Reranker(c["model"]), _reranker_op)


def _cases(names):
    cases = []
    for name in names:
        ops = [["logits", "logits", PAIRS], ["scores", "scores", PAIRS]]
        ops += [["alone%d" % i, "logits", [p]] for i, p in enumerate(PAIRS)]
        ops += [["tok%d" % i, "tok", p] for i, p in enumerate(PAIRS)]
        cases.append({"key": name, "model": str(te.build(name)), "ops": ops})
    return cases


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runner = te.EncRunner(tmp_path_factory.mktemp("rerank-runs"), "test_reranker",
                          "kwker reranker worker")

    def get(isa):
        return runner.run(_cases(CE), isa)
    return get


result = te.result


def _rows(x, n_labels):
    """predict's shape ([n] for one label) as [n, labels]."""
    return np.asarray(x).reshape(-1, n_labels)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", CE)
def test_pairs_tokenized_as_hf(runs, isa, name):
    """Each pair's ids and token type ids are Hugging Face's tokenizer(a, b, truncation=True,
    max_length=max tokens): the pair form, and the long texts cut longest first."""
    res, r = runs(isa), ref(name)
    for i, (a, b) in enumerate(PAIRS):
        got = result(res, name, "tok%d" % i, isa)
        assert got.shape[0] == 2
        assert got[0].tolist() == r.ids[i], "%s pair %d: ids %s, HF %s" % (
            name, i, got[0].tolist(), r.ids[i])
        assert got[1].tolist() == r.types[i], "%s pair %d: types %s, HF %s" % (
            name, i, got[1].tolist(), r.types[i])
    assert max(len(x) for x in r.ids) == r.max_length  # the long pairs were cut to the limit


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", CE)
def test_logits_match_transformers(runs, isa, name):
    res, r = runs(isa), ref(name)
    got = _rows(result(res, name, "logits", isa), r.n_labels)
    err = check_logits(got, r.logits, "%s [%s] logits of %d pairs" % (name, isa, len(PAIRS)))
    print("%s [%s]: max|kwker - transformers| / max|logit| = %.3g" % (name, isa, err))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", CE)
def test_scores_and_batch_invariance(runs, isa, name):
    """predict() applies the model's activation to those very logits, and each pair's logits
    alone are bitwise its row in the batch of all pairs."""
    res, r = runs(isa), ref(name)
    logits = _rows(result(res, name, "logits", isa), r.n_labels)
    scores = _rows(result(res, name, "scores", isa), r.n_labels)
    if expected_activation(name) == "sigmoid":
        np.testing.assert_allclose(scores, sigmoid(logits), rtol=1e-6, atol=1e-7)
    else:
        assert np.array_equal(scores, logits)
    for i in range(len(PAIRS)):
        alone = _rows(result(res, name, "alone%d" % i, isa), r.n_labels)[0]
        assert np.array_equal(alone, logits[i]), \
            "%s [%s] pair %d: alone %s, in the batch %s" % (name, isa, i, alone, logits[i])


# -- activations: sentence-transformers' rule ---------------------------------------------------

def expected_activation(name):
    """CrossEncoder's default for a spec: its activation_fn, else sigmoid for one label."""
    spec = te.SPECS[name]
    if spec.get("ce_act"):
        return {"Identity": "identity", "Sigmoid": "sigmoid"}[spec["ce_act"].rsplit(".", 1)[1]]
    return "sigmoid" if spec["labels"] == 1 else "identity"


@pytest.mark.parametrize("name", CE)
def test_activation_and_shapes(name):
    r = ref(name)
    with kwker.Reranker(str(r.path)) as rr:
        assert rr.n_labels == r.n_labels == te.SPECS[name]["labels"]
        assert rr.score_activation == expected_activation(name)
        assert rr.max_length == r.max_length
        logits = rr.predict(PAIRS, activation=False)
        scores = rr.predict(PAIRS)
        if r.n_labels == 1:
            assert logits.shape == scores.shape == (len(PAIRS),)
            one = rr.predict(PAIRS[0])
            assert np.ndim(one) == 0 and one == scores[0]   # one pair: a scalar, as CE gives
        else:
            assert logits.shape == scores.shape == (len(PAIRS), r.n_labels)
            assert np.array_equal(rr.predict(PAIRS[0]), scores[0])
            soft = rr.predict(PAIRS, apply_softmax=True)
            np.testing.assert_allclose(soft.sum(1), 1.0, atol=1e-6)
            assert np.array_equal(np.argmax(soft, 1), np.argmax(scores, 1))
        assert scores.dtype == logits.dtype == np.float32
        check_logits(_rows(logits, r.n_labels), r.logits, name)
        want = sigmoid(logits) if expected_activation(name) == "sigmoid" else logits
        np.testing.assert_allclose(scores, want, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rr.predict(PAIRS, activation="sigmoid"), sigmoid(logits),
                                   rtol=1e-6, atol=1e-7)
        assert np.array_equal(rr.predict(PAIRS, activation="identity"), logits)
        assert rr.predict([]).shape == ((0,) if r.n_labels == 1 else (0, r.n_labels))
        with pytest.raises(ValueError):
            rr.predict(PAIRS, activation="tanh")


def test_labels():
    with kwker.Reranker(str(te.build("ce_bert3"))) as rr:
        assert rr.labels == ["contradiction", "entailment", "neutral"]
        assert rr.id2label == {0: "contradiction", 1: "entailment", 2: "neutral"}
    with kwker.Reranker(str(te.build("ce_bert1"))) as rr:
        assert rr.labels == ["LABEL_0"]  # transformers writes its default name


def test_labels_untrusted(tmp_path):
    """id2label is untrusted: ids that are not the head's outputs give no labels, and nothing
    is sized by them (a key of 3e8 once made a list of that length)."""
    for n, id2label in enumerate([{"0": "a", "300000000": "b"}, {"1": "a"}, {"0": "a", "1": "b"},
                                  {"x": "a"}, []]):
        d = _edited_copy("ce_bert1", tmp_path / str(n), config={"id2label": id2label})
        with kwker.Reranker(str(d)) as rr:
            assert rr.labels is None, id2label
    d = _edited_copy("ce_bert1", tmp_path / "ok", config={"id2label": {"0": "relevant"}})
    with kwker.Reranker(str(d)) as rr:
        assert rr.labels == ["relevant"]


def test_against_sentence_transformers():
    """CrossEncoder.predict and .rank themselves (their default activation, padded batches of
    32 through transformers' default attention), to 1e-5 of the largest score."""
    from sentence_transformers import CrossEncoder
    from tiny_models import torch_single_thread
    torch_single_thread()
    for name in CE:
        r = ref(name)
        # max_length given: CrossEncoder would take min(model_max_length, positions), which for
        # a RoBERTa is 2 past what its positions hold
        ce = CrossEncoder(str(r.path), max_length=r.max_length, device="cpu")
        want = np.asarray(ce.predict(PAIRS), dtype=np.float64)
        with kwker.Reranker(str(r.path)) as rr:
            got = rr.predict(PAIRS)
            assert got.shape == want.shape, (name, got.shape, want.shape)
            err = score_err(got, want)
            print("%s: max|kwker - CrossEncoder| / max|score| = %.3g (%s)" % (
                name, err, rr.score_activation))
            assert err <= REL_TOL, "%s: %.3g from CrossEncoder.predict" % (name, err)
            if r.n_labels == 1:
                docs = DOCS + ["why is the sky blue?", "blue sky"]
                a = rr.rank(QUERIES[0], docs, return_documents=True)
                b = ce.rank(QUERIES[0], docs, return_documents=True)
                assert [x["corpus_id"] for x in a] == [x["corpus_id"] for x in b], (a, b)
                assert [x["text"] for x in a] == [x["text"] for x in b]
                np.testing.assert_allclose([x["score"] for x in a], [x["score"] for x in b],
                                           rtol=0, atol=REL_TOL * max(abs(b[0]["score"]), 1e-3))


def _edited_copy(name, tmp_path, config=None, drop=(), files=None):
    """A copy of a tiny model's folder with config.json keys set (None deletes) and files
    written ({relative path: JSON value})."""
    src = te.build(name)
    dst = tmp_path / name
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in (config or {}).items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    for rel, val in (files or {}).items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_text(json.dumps(val))
    return dst


@pytest.mark.parametrize("config, n_from, want", [
    # sentence-transformers before version 4: the key at config.json's top
    ({"sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, "ce_bert1",
     "identity"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}},
     "ce_bert3", "sigmoid"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Sigmoid"}},
     "ce_bert1_identity", "sigmoid"),
    ({"sentence_transformers": None}, "ce_bert1_identity", "sigmoid"),
])
def test_activation_from_config(tmp_path, config, n_from, want):
    d = _edited_copy(n_from, tmp_path, config=config)
    with kwker.Reranker(str(d)) as rr:
        assert rr.score_activation == want
        logits = rr.predict(PAIRS[:3], activation=False)
        np.testing.assert_allclose(rr.predict(PAIRS[:3]),
                                   sigmoid(logits) if want == "sigmoid" else logits,
                                   rtol=1e-6, atol=1e-7)


def test_unsupported_activation_refused(tmp_path):
    d = _edited_copy("ce_bert1", tmp_path, config={
        "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}})
    with pytest.raises(KwkError) as ei:
        kwker.Reranker(str(d))
    assert ei.value.code == KWK_EUNSUPPORTED and "Tanh" in str(ei.value), ei.value


# a sentence-transformers folder's modules.json: the Transformer module alone
ST_MODULES = [{"idx": 0, "name": "0", "path": "",
               "type": "sentence_transformers.base.modules.transformer.Transformer"}]


def _same_activation(d, want):
    """CrossEncoder loads the folder d with the activation named want (its torch class) and
    Kwker with that activation."""
    from sentence_transformers import CrossEncoder
    assert type(CrossEncoder(str(d), device="cpu").activation_fn).__name__ == want
    with kwker.Reranker(str(d)) as rr:
        assert rr.score_activation == want.lower()


def test_activation_from_config_sentence_transformers_json(tmp_path):
    """What sentence-transformers 5 and 6 save (CrossEncoder.save): activation_fn in
    config_sentence_transformers.json, which CrossEncoder reads before config.json's keys."""
    d = _edited_copy("ce_bert1", tmp_path, files={"config_sentence_transformers.json": {
        "activation_fn": "torch.nn.modules.linear.Identity", "model_type": "CrossEncoder",
        "prompts": {}, "default_prompt_name": None}, "modules.json": ST_MODULES})
    _same_activation(d, "Identity")


def test_activation_precedence(tmp_path):
    """config_sentence_transformers.json's activation_fn wins over config.json's, even over
    one Kwker does not run (CrossEncoder then never reads config.json's); CrossEncoder agrees."""
    d = _edited_copy("ce_bert1", tmp_path, config={
        "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}},
        files={"config_sentence_transformers.json": {
            "activation_fn": "torch.nn.modules.activation.Sigmoid", "model_type": "CrossEncoder"},
            "modules.json": ST_MODULES})
    _same_activation(d, "Sigmoid")


def test_st_json_of_another_model_type(tmp_path):
    """A config_sentence_transformers.json without model_type CrossEncoder is another kind of
    model's: CrossEncoder converts it and keeps config.json's activation, and so does Kwker."""
    d = _edited_copy("ce_bert1", tmp_path, files={"config_sentence_transformers.json": {
        "activation_fn": "torch.nn.modules.linear.Identity"}, "modules.json": ST_MODULES})
    _same_activation(d, "Sigmoid")


def test_st_json_without_modules_json(tmp_path):
    """Without modules.json sentence-transformers builds a fresh CrossEncoder from config.json
    and never reads config_sentence_transformers.json: neither does Kwker."""
    d = _edited_copy("ce_bert1", tmp_path, files={"config_sentence_transformers.json": {
        "activation_fn": "torch.nn.modules.linear.Identity"}})
    _same_activation(d, "Sigmoid")


def test_untrusted_activation_is_the_default(tmp_path):
    """An activation_fn outside torch is ignored as sentence-transformers ignores it without
    trust_remote_code: the default (sigmoid for one label), whichever file names it."""
    d = _edited_copy("ce_bert1", tmp_path, config={
        "sentence_transformers": {"activation_fn": "mypkg.Scaled"}})
    with kwker.Reranker(str(d)) as rr:
        assert rr.score_activation == "sigmoid"
    d2 = _edited_copy("ce_bert1_identity", tmp_path / "b", files={
        "config_sentence_transformers.json": {"activation_fn": "mypkg.Scaled"}})
    with kwker.Reranker(str(d2)) as rr:
        assert rr.score_activation == "identity"  # config.json's Identity stands


def test_folder_saved_by_sentence_transformers(tmp_path):
    """CrossEncoder(...).save(folder) with activation_fn Identity, loaded back by kwker: the
    same scores as CrossEncoder loaded from that folder."""
    import torch
    from sentence_transformers import CrossEncoder
    r = ref("ce_bert1")
    ce = CrossEncoder(str(r.path), activation_fn=torch.nn.Identity(), device="cpu")
    ce.save(str(tmp_path / "saved"))
    back = CrossEncoder(str(tmp_path / "saved"), device="cpu")
    want = np.asarray(back.predict(PAIRS[:5]))
    with kwker.Reranker(str(tmp_path / "saved")) as rr:
        assert score_err(rr.predict(PAIRS[:5]), want) <= REL_TOL


# -- truncation and max_length ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ce_bert1", "ce_roberta1"])
def test_max_length(name):
    """A smaller max_length cuts pairs as HF's tokenizer does with that max_length (and the
    logits are transformers' of those tokens); a larger one is the model's limit."""
    short = Ref(name, PAIRS, max_length=20)
    with kwker.Reranker(str(short.path), max_length=20) as rr:
        assert rr.max_length == 20
        for i, (a, b) in enumerate(PAIRS):
            assert rr.tokenize(a, b) == (short.ids[i], short.types[i]), (name, i)
        assert max(len(x) for x in short.ids) == 20
        check_logits(_rows(rr.predict(PAIRS, activation=False), 1), short.logits,
                     "%s max_length=20" % name)
    with kwker.Reranker(str(short.path), max_length=10 ** 6) as rr:
        assert rr.max_length == max_len(name)
    with pytest.raises(ValueError):
        kwker.Reranker(str(short.path), max_length=0)
    if name == "ce_bert1":  # 3 holds [CLS] [SEP] [SEP] and no text, as HF gives it
        with kwker.Reranker(str(short.path), max_length=3) as rr:
            assert rr.tokenize(*PAIRS[0]) == ([101, 102, 102], [0, 0, 1])
    with kwker.Reranker(str(short.path), max_length=2) as rr:  # cannot hold the specials
        with pytest.raises(KwkError) as ei:
            rr.predict(PAIRS[:1])
        assert ei.value.code == KWK_ELIMIT, ei.value


# -- batching ------------------------------------------------------------------------------------

def test_batch_invariance_in_process():
    """Scores bitwise equal alone, in one batch, reversed, in batches of 1 and 4, and with a
    batch_tokens budget that forces a pass per pair."""
    path = str(te.build("ce_bert3"))
    with kwker.Reranker(path) as rr:
        alone = np.stack([rr.predict(p, activation=False) for p in PAIRS])
        assert np.array_equal(rr.predict(PAIRS, activation=False), alone)
        assert np.array_equal(rr.predict(PAIRS[::-1], activation=False)[::-1], alone)
        assert np.array_equal(rr.predict(np.array(PAIRS), activation=False), alone)
        assert np.array_equal(rr.predict(np.array(PAIRS[2]), activation=False), alone[2])
        for bs in (1, 4):
            assert np.array_equal(rr.predict(PAIRS, activation=False, batch_size=bs), alone)
        with pytest.raises(ValueError):
            rr.predict(PAIRS, batch_size=0)
    with kwker.Reranker(path, batch_tokens=1) as small:
        assert np.array_equal(small.predict(PAIRS * 3, activation=False),
                              np.concatenate([alone] * 3))


# -- rank ----------------------------------------------------------------------------------------

def test_rank():
    docs = DOCS + ["why is the sky blue?", "blue sky", "a"]
    with kwker.Reranker(str(te.build("ce_bert1_identity"))) as rr:
        scores = rr.predict([[QUERIES[0], d] for d in docs])
        out = rr.rank(QUERIES[0], docs)
        assert [set(x) for x in out] == [{"corpus_id", "score"}] * len(docs)
        ids = [x["corpus_id"] for x in out]
        assert sorted(ids) == list(range(len(docs)))
        got = [x["score"] for x in out]
        assert got == sorted(got, reverse=True)
        assert all(isinstance(x["score"], float) and x["score"] == float(scores[x["corpus_id"]])
                   for x in out)
        # equal scores ("a" twice) keep the documents' order, as Python's sort does
        ia, ib = ids.index(3), ids.index(len(docs) - 1)
        assert ia < ib
        top = rr.rank(QUERIES[0], docs, top_k=3, return_documents=True)
        assert [x["corpus_id"] for x in top] == ids[:3]
        assert [x["text"] for x in top] == [docs[i] for i in ids[:3]]
        assert rr.rank(QUERIES[0], []) == []
        assert rr.rank(QUERIES[0], docs, top_k=0) == []
        raw = rr.rank(QUERIES[0], docs, activation=False)
        assert [x["corpus_id"] for x in raw] == ids  # identity: the same numbers
        with pytest.raises(TypeError):
            rr.rank(QUERIES[0], "one string")
    with kwker.Reranker(str(te.build("ce_bert1"))) as rr:  # sigmoid: the order of the logits
        logits = rr.predict([[QUERIES[1], d] for d in docs], activation=False)
        order = [x["corpus_id"] for x in rr.rank(QUERIES[1], docs)]
        assert order == list(np.argsort(-logits.astype(np.float64), kind="stable"))
    with kwker.Reranker(str(te.build("ce_bert3"))) as rr:
        with pytest.raises(KwkError) as ei:
            rr.rank(QUERIES[0], docs)
        assert ei.value.code == KWK_EUNSUPPORTED


# -- errors --------------------------------------------------------------------------------------

def test_embedding_model_refused():
    with pytest.raises(KwkError) as ei:
        kwker.Reranker(str(te.build("st_mean_norm")))
    assert ei.value.code == KWK_EUNSUPPORTED, ei.value
    assert "classification head" in str(ei.value) and "Encoder" in str(ei.value), ei.value


def test_decoder_refused():
    import tiny_models
    with pytest.raises(KwkError) as ei:
        kwker.Reranker(str(tiny_models.build("llama_tied")))
    assert ei.value.code == KWK_EUNSUPPORTED, ei.value
    assert "decoder" in str(ei.value).lower() or "encoder" in str(ei.value).lower(), ei.value


def test_bad_inputs():
    with kwker.Reranker(str(te.build("ce_bert1"))) as rr:
        V = rr.info.n_vocab
        for bad in (["only one"], [["a", "b", "c"]], [["a", 5]], ["a", "b", "c"], [None]):
            with pytest.raises(TypeError):
                rr.predict(bad)
        with pytest.raises(KwkError) as ei:
            rr.logits([[101, V, 102]])
        assert ei.value.code == KWK_ERANGE
        with pytest.raises(KwkError) as ei:
            rr.logits([[101, 2339, 102]], [[0, 0, 2]])  # type_vocab_size 2
        assert ei.value.code == KWK_ERANGE, ei.value
        with pytest.raises(ValueError):
            rr.logits([[101, 2339, 102]], [[0, 0]])
        assert rr.predict(PAIRS[:2]).shape == (2,)  # still works after the errors
        assert repr(rr).startswith("Reranker(")
    with pytest.raises(ValueError):
        rr.predict(PAIRS[:1])  # closed
    assert "closed" in repr(rr)
    with kwker.Reranker(str(te.build("ce_roberta1"))) as rr:  # one token type
        # a model of one token type has no segments: a pair's type ids read as 0 (as llama.cpp
        # sends them), so BERT-style types give the all-zero logits, bit for bit
        ids = [[101, 2339, 102, 102, 2003, 102]]
        assert np.array_equal(rr.logits(ids, [[0, 0, 0, 0, 1, 1]]),
                              rr.logits(ids, [[0] * 6]))


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, %r); import kwker; "
            "r = kwker.Reranker(%r); print(r.predict([['a', 'b'], ['c', 'd']]).shape)"
            % (str(PY_DIR), str(te.build("ce_bert1"))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "(2,)"


# -- quantized precisions ---------------------------------------------------------------------

# max|logit - preserve's| measured on the tiny models when this test was written (their logits
# are 0.1 to 1.4 in size): balanced 0.0029-0.010 (act_bits=8 0.0067-0.012), int4 0.031-0.097
# (act_bits=8 0.034-0.102). Bounds about 2.5x those; a dropped head bias or a wrong scale moves
# logits by 0.2 and more.
QUANT_BOUNDS = {("balanced", 0): 0.03, ("balanced", 8): 0.03, ("int4", 0): 0.25,
                ("int4", 8): 0.25}


@pytest.mark.parametrize("name", CE)
def test_quantized_precisions(name):
    path = str(te.build(name))
    with kwker.Reranker(path) as rr:
        ref_logits = rr.predict(PAIRS, activation=False)
    for (precision, act_bits), bound in QUANT_BOUNDS.items():
        with kwker.Reranker(path, precision=precision, act_bits=act_bits) as q:
            got = q.predict(PAIRS, activation=False)
            err = float(np.abs(got.astype(np.float64) - ref_logits).max())
            print("%s %s act_bits=%d: max|logit - preserve's| %.4f" % (name, precision,
                                                                      act_bits, err))
            assert err <= bound, "%s %s act_bits=%d: %.4f" % (name, precision, act_bits, err)
            assert np.array_equal(q.predict(PAIRS[4], activation=False), got[4])


# -- GGUF: llama.cpp's rank head ----------------------------------------------------------------
#
# gguf_export.export_rank writes what llama.cpp's converter writes for a
# *ForSequenceClassification (its docstring says what that is): BERT's pooler is NOT written, so
# llama.cpp runs a BERT reranker's GGUF as classifier(first token's state), without the pooler's
# dense and tanh; pooler_as_cls=True writes the pooler as cls, what a converter keeping the whole
# head would write.

def _rank_gguf(name, ftype="f32", pooler_as_cls=False):
    folder = te.build(name)
    out = te.cache_root() / ("%s.rank%s.%s.gguf" % (folder.name, "-pooler" if pooler_as_cls
                                                    else "", ftype))
    if not out.exists():
        tmp = out.with_suffix(".part")
        gguf_export.export_rank(folder, tmp, ftype, pooler_as_cls)
        os.replace(tmp, out)
    return out


def _same(a, b):
    return np.array_equal(a, b) or score_err(a, b) <= 1e-6


def _gelu_ref(r):
    """transformers' logits of r's tokens with hidden_act "gelu": what a GGUF of r's model
    computes (a GGUF does not say BERT's activation; Kwker takes the erf GELU, see
    test_encoder.test_gguf_f32)."""
    model = load_hf_cls(r.path, act="gelu")
    return np.stack([hf_logits(model, i, t) for i, t in zip(r.ids, r.types)])


@pytest.mark.parametrize("name", CE)
def test_gguf_f32_rank_head(name):
    """A rank GGUF with the whole head (RoBERTa's as llama.cpp writes it; BERT's with the
    pooler as cls) gives the safetensors' logits for the same tokens: bitwise, or 1e-6 of the
    largest should a sum run in another order (a gelu_new model: transformers' with the erf
    GELU, to 1e-5). Its labels: the head's, its activation the default for their count (a GGUF
    does not carry sentence-transformers' activation_fn)."""
    r = ref(name)
    bert = not te.SPECS[name].get("post")
    with kwker.Reranker(str(_rank_gguf(name, pooler_as_cls=bert))) as g, \
            kwker.Reranker(str(r.path)) as s:
        assert (g.n_labels, g.max_length) == (s.n_labels, s.max_length)
        assert g.score_activation == ("sigmoid" if r.n_labels == 1 else "identity")
        a = g.logits(r.ids, r.types)
        if te.SPECS[name]["act"] == "gelu":
            b = s.logits(r.ids, r.types)
            assert _same(a, b), "%s: GGUF F32 logits differ from the safetensors' by %.3g" % (
                name, score_err(a, b))
            check_logits(a, r.logits, "%s GGUF F32" % name)
        else:
            check_logits(a, _gelu_ref(r), "%s GGUF F32 (erf GELU)" % name)


def test_gguf_bert_head_as_llama_cpp_writes_it():
    """llama.cpp's own BERT reranker GGUF (no pooler): cls.output on the first token's state,
    as llama.cpp computes it (transformers' classifier applied to last_hidden_state[0])."""
    import torch
    r = ref("ce_bert3")
    model = load_hf_cls(r.path, act="gelu")  # gelu_new in the checkpoint: see _gelu_ref
    want = []
    with torch.no_grad():
        for ids, types in zip(r.ids, r.types):
            t = torch.tensor([ids])
            h = model.bert(input_ids=t, attention_mask=torch.ones_like(t),
                           token_type_ids=torch.tensor([types])).last_hidden_state[0, 0]
            want.append(model.classifier(h).numpy())
    with kwker.Reranker(str(_rank_gguf("ce_bert3"))) as g:
        check_logits(g.logits(r.ids, r.types), np.stack(want), "llama.cpp-style BERT GGUF")


def test_gguf_bert_pairs_as_llama_cpp():
    """A BERT rank GGUF joins a pair as llama.cpp's rerank prompt does: [CLS] a [SEP] b, no
    closing [SEP] (BERT's vocabulary adds no eos); the first len(HF) - 1 ids are HF's."""
    r = ref("ce_bert1")
    with kwker.Reranker(str(_rank_gguf("ce_bert1", pooler_as_cls=True))) as g:
        for i, (a, b) in enumerate(PAIRS[:4]):
            ids, types = g.tokenize(a, b)
            assert ids == r.ids[i][:-1], (i, ids, r.ids[i])
            assert types == r.types[i][:-1], (i, types, r.types[i])


@pytest.mark.parametrize("name", ["ce_roberta1", "ce_xlmr1"])
def test_gguf_one_token_type_pairs(name):
    """A rank GGUF of one token type scores its pairs as the same ids all of type 0 (the BERT
    vocabulary's pair types read as 0, as llama.cpp sends them), bit for bit."""
    with kwker.Reranker(str(_rank_gguf(name))) as g:
        got = g.predict(PAIRS[:3], activation=False)
        assert got.shape == (3,)
        enc = [g.tokenize(a, b) for a, b in PAIRS[:3]]
        assert any(1 in types for _, types in enc)  # BERT's pair types were given
        zero = g.logits([ids for ids, _ in enc], [[0] * len(ids) for ids, _ in enc])
        assert np.array_equal(got, zero.reshape(-1)), (got, zero)


@pytest.mark.parametrize("ftype", ["f16", "q8_0"])
@pytest.mark.parametrize("name", ["ce_bert1", "ce_xlmr1"])
def test_gguf_rounded(name, ftype):
    """F16 / Q8_0 rank GGUFs (the head's matrices rounded too): logits near the checkpoint's.
    Measured when this test was written, max|logit - transformers'|: F16 5.0e-4 (ce_bert1) and
    2.6e-4 (ce_xlmr1), Q8_0 0.0077 and 0.0080 (logits 0.1 to 1.4 in size); bounds 2e-3 and
    0.03."""
    r = ref(name)
    with kwker.Reranker(str(_rank_gguf(name, ftype, pooler_as_cls=True))) as g:
        got = g.logits(r.ids, r.types)
    err = float(np.abs(got.astype(np.float64) - r.logits).max())
    print("%s %s GGUF: max|logit - transformers'| %.3g" % (name, ftype, err))
    assert err <= (2e-3 if ftype == "f16" else 0.03), err


# -- the pair limit: the tokenizer's model_max_length, as CrossEncoder's --------------------------

def _with_limits(name, tmp_path, mml, sbc=None):
    """A copy of a tiny cross-encoder with tokenizer_config.json's model_max_length set (a JSON
    value; "drop": no key) and, when sbc is given, sentence-transformers' folder files beside it
    as CrossEncoder.save writes them (modules.json of the Transformer alone,
    sentence_bert_config.json with sbc's keys, config_sentence_transformers.json naming a
    CrossEncoder)."""
    d = _edited_copy(name, tmp_path)
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc.pop("model_max_length", None)
    if mml != "drop":
        tc["model_max_length"] = mml
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    if sbc is not None:
        (d / "modules.json").write_text(json.dumps([{
            "idx": 0, "name": "0", "path": "",
            "type": "sentence_transformers.base.modules.transformer.Transformer"}]))
        (d / "sentence_bert_config.json").write_text(json.dumps(dict(
            {"transformer_task": "sequence-classification"}, **sbc)))
        # without it sentence-transformers converts the folder as a SentenceTransformer's,
        # taking none of its module files
        (d / "config_sentence_transformers.json").write_text(json.dumps({
            "model_type": "CrossEncoder", "__version__": {"sentence_transformers": "6.3.0"}}))
    return d


def _cross_encoder(path, **kw):
    from sentence_transformers import CrossEncoder
    from tiny_models import torch_single_thread
    torch_single_thread()
    return CrossEncoder(str(path), device="cpu", **kw)


def _same_scores(rr, ce, what):
    want = np.asarray(ce.predict(PAIRS), dtype=np.float64)
    err = score_err(rr.predict(PAIRS), want)
    assert err <= REL_TOL, "%s: %.3g from CrossEncoder.predict" % (what, err)


@pytest.mark.parametrize("name", ["ce_bert1", "ce_roberta1"])
def test_model_max_length_as_cross_encoder(tmp_path, name):
    """A tokenizer whose model_max_length (24) is under the positions: CrossEncoder cuts pairs
    at 24 and so does kwker (its scores of long pairs are CrossEncoder.predict's); max_length=60
    is CrossEncoder(max_length=60); a folder saved by sentence-transformers takes
    sentence_bert_config.json's max_seq_length (16) over the tokenizer's."""
    d = _with_limits(name, tmp_path / "a", 24)
    ce = _cross_encoder(d)
    assert ce.max_seq_length == 24
    with kwker.Reranker(str(d)) as rr:
        assert rr.max_length == 24
        assert (rr.info.max_seq_length, rr.info.model_max_length, rr.info.max_tokens) == \
            (0, 24, 24)
        _same_scores(rr, ce, "%s model_max_length 24" % name)
    with kwker.Reranker(str(d), max_length=60) as rr:
        assert rr.max_length == 60
        _same_scores(rr, _cross_encoder(d, max_length=60), "%s max_length=60" % name)
    with kwker.Reranker(str(d), max_length=10 ** 6) as rr:
        assert rr.max_length == max_len(name)  # the positions
    d = _with_limits(name, tmp_path / "b", 24, sbc={"max_seq_length": 16})
    ce = _cross_encoder(d)
    assert ce.max_seq_length == 16
    with kwker.Reranker(str(d)) as rr:
        assert (rr.max_length, rr.info.max_seq_length, rr.info.model_max_length) == (16, 16, 24)
        _same_scores(rr, ce, "%s max_seq_length 16" % name)


@pytest.mark.parametrize("mml", ["24", -24, 0, 24.5, 10 ** 30, None, "drop"],
                         ids=["string", "negative", "zero", "fraction", "1e30", "null",
                              "missing"])
def test_bad_model_max_length_falls_back_to_the_positions(tmp_path, mml):
    """A model_max_length that is not a positive whole number, or transformers' 1e30 (no
    limit), leaves the positions as the pair limit."""
    d = _with_limits("ce_bert1", tmp_path, mml)
    with kwker.Reranker(str(d)) as rr:
        assert rr.max_length == max_len("ce_bert1")
        assert rr.info.model_max_length == (2 ** 31 - 1 if mml == 10 ** 30 else 0)
        if mml in (10 ** 30, "drop"):  # what transformers reads as no limit
            assert _cross_encoder(d).max_seq_length == max_len("ce_bert1")
            _same_scores(rr, _cross_encoder(d), "model_max_length %r" % (mml,))
