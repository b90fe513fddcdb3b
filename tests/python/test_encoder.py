"""kwker.Encoder (BERT embeddings) against transformers' float32 BertModel and
sentence-transformers' pooling, on every kernel path this CPU has.

Models: the tiny random BERT checkpoints of tiny_encoders.SPECS (gelu and gelu_new, 1 to 8 heads,
type_vocab_size 1 and 2, a BertForMaskedLM checkpoint whose tensors carry "bert.", an
XLM-RoBERTa and a RobertaForMaskedLM checkpoint ("roberta.", positions from pad + 1), folders with
and without sentence-transformers' files: mean / cls / max / mean_sqrt_len / lasttoken pooling,
with and without a Normalize module) and the real all-MiniLM-L6-v2 (scripts/setup --test puts
it in models/; $KWK_MINILM elsewhere; a missing folder fails, never skips).

Acceptance (conftest.REL_TOL, the decoder tests' measure): max|kwker - ref| <= 1e-5 * (max(ref)
- min(ref)) for preserve's token states against transformers' last_hidden_state (each sequence
run alone, no padding), and for embed() against those reference states pooled and normalized by
hand as sentence-transformers defines it (tiny_encoders.pool; sentence-transformers is not
installed). Kernel paths: each of KWKER_ISA=scalar|avx2|avx512 the CPU supports runs in its own
child process (the library reads KWKER_ISA once per process, tiny_encoders.EncRunner); the other
tests run in this process on the library's own choice.
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf_export
import tiny_encoders as te
from conftest import PY_DIR, REL_TOL, REPO, SHARED_DATA, rel_err, supported_isas

import kwker
from kwker import KwkError

KWK_EARG, KWK_ELIMIT, KWK_ERANGE, KWK_EUNSUPPORTED = -10004, -10003, -10005, -10002
TINY = list(te.SPECS)
ISAS = supported_isas()


def minilm_path():
    p = Path(os.environ.get("KWK_MINILM") or REPO / "models" / "all-MiniLM-L6-v2")
    if not (p / "model.safetensors").is_file():
        pytest.fail("all-MiniLM-L6-v2 not found at %s: run scripts/setup --test" % p)
    return p


def cosine(a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def rowwise_cosines(a, b):
    return [cosine(x, y) for x, y in zip(a, b)]


def check_close(got, ref, what, tol=REL_TOL):
    return te.check_close(got, ref, what, tol, rel_err, "the reference's range", np.ptp)


# -- references ----------------------------------------------------------------------------------

# all-MiniLM-L6-v2's sentence_bert_config.json says max_seq_length 256 (kwker's default limit,
# as sentence-transformers'); its positions hold 512, which these tests cover: kwker.Encoder's
# max_tokens=512 is sentence-transformers' model.max_seq_length = 512.
MINILM_ALL = {"max_tokens": 512}


class Ref:
    """A model's reference: its sequences (token ids from Hugging Face's tokenizer), transformers'
    float32 states of each alone, and the pooling its folder asks for; enc: the kwker.Encoder
    arguments that take its longest sequence."""

    def __init__(self, path, seqs, states, pooling, normalize, max_pos, enc=None):
        self.path, self.seqs, self.states = path, seqs, states
        self.pooling, self.normalize, self.max_pos = pooling, normalize, max_pos
        self.enc = enc or {}

    def pooled(self, pooling=None, normalize=None):
        p = self.pooling if pooling is None else pooling
        n = self.normalize if normalize is None else normalize
        return np.stack([te.pool(s, p, n) for s in self.states])


def _long_ids(n, seed, vocab=te.TOKENIZER_VOCAB):
    """[CLS] + n - 2 random ordinary word-piece ids + [SEP] (ids 101 and 102, and ids below
    vocab - 10, in a model of another vocabulary)."""
    rng = np.random.default_rng(seed)
    return [101] + [int(t) for t in rng.integers(1000, min(29000, vocab - 10), n - 2)] + [102]


_refs = {}


def tiny_ref(name):
    if name not in _refs:
        path = te.build(name)
        model = te.load_hf(path)
        spec = te.SPECS[name]
        seqs = [te.hf_tokenize(path, t) for t in te.TEXTS]
        v = te.vocab_size(name)
        seqs += [_long_ids(te.max_tokens(spec), spec["seed"], v), [101, 102],
                 _long_ids(37, 5, v)]
        pooling, normalize = te.pooling_of(name)
        _refs[name] = Ref(path, seqs, [te.hf_states(model, s) for s in seqs], pooling,
                          normalize, te.max_tokens(spec))
    return _refs[name]


def minilm_texts():
    """Short, unicode, two middling ones and one of exactly 512 tokens (the model's limit)."""
    path = minilm_path()
    base = (SHARED_DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")[5000:20000]
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = tok(base, add_special_tokens=False)["input_ids"][:510]
    long_text = tok.decode(ids)
    assert len(tok(long_text)["input_ids"]) == 512, "the long text must be exactly 512 tokens"
    return ["why is the sky blue?",
            "Naïve café owners in Zürich — ŒUVRE, 東京タワー, ελληνικά, 🙂 and déjà vu!",
            base[:300], base[2000:3500], long_text]


def minilm_ref():
    if "minilm" not in _refs:
        path = minilm_path()
        model = te.load_hf(path)
        seqs = [te.hf_tokenize(path, t) for t in minilm_texts()]
        _refs["minilm"] = Ref(path, seqs, [te.hf_states(model, s) for s in seqs], "mean",
                              True, 512, MINILM_ALL)
    return _refs["minilm"]


# -- every kernel path: preserve against transformers ------------------------------------------

def _cases(names):
    cases = []
    for name in names:
        r = minilm_ref() if name == "minilm" else tiny_ref(name)
        ops = [["states%d" % i, "states", s] for i, s in enumerate(r.seqs)]
        ops.append(["embed", "embed", r.seqs])
        if name == "minilm":
            ops.append(["embed_texts", "embed", minilm_texts()])
            ops += [["tok%d" % i, "tokenize", t] for i, t in enumerate(minilm_texts())]
        else:
            ops.append(["embed_texts", "embed", te.TEXTS])
            ops += [["tok%d" % i, "tokenize", t] for i, t in enumerate(te.TEXTS)]
        cases.append({"key": name, "model": str(r.path), "enc": r.enc, "ops": ops})
    return cases


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runner = te.EncRunner(tmp_path_factory.mktemp("enc-runs"))

    def get(isa):
        return runner.run(_cases(TINY + ["minilm"]), isa)
    return get


result = te.result


def _ref_of(name):
    return minilm_ref() if name == "minilm" else tiny_ref(name)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TINY + ["minilm"])
def test_states_match_transformers(runs, isa, name):
    res = runs(isa)
    r = _ref_of(name)
    for i, (seq, ref) in enumerate(zip(r.seqs, r.states)):
        check_close(result(res, name, "states%d" % i, isa), ref,
                    "%s [%s] states of sequence %d (%d tokens)" % (name, isa, i, len(seq)))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TINY + ["minilm"])
def test_embed_matches_pooled_reference(runs, isa, name):
    res = runs(isa)
    r = _ref_of(name)
    props = res["_meta"]["props"][name]
    assert (props["pooling"], props["normalize"]) == (r.pooling, r.normalize), \
        "%s: the encoder pools %s, the folder says %s" % (name, props, (r.pooling, r.normalize))
    hidden = r.states[0].shape[1]
    assert props["dim"] == hidden and props["max_tokens"] == r.max_pos, props
    got = result(res, name, "embed", isa)
    check_close(got, r.pooled(), "%s [%s] embed of %d sequences (%s%s)" % (
        name, isa, len(r.seqs), r.pooling, ", normalized" if r.normalize else ""))
    if r.normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["bert_gelu", "minilm"])
def test_text_inputs(runs, isa, name):
    """embed(strings) tokenizes with the model's tokenizer as Hugging Face does (tokenize gives
    its ids) and equals, bitwise, embed of those ids batched with other sequences."""
    res = runs(isa)
    r = _ref_of(name)
    texts = minilm_texts() if name == "minilm" else te.TEXTS
    for i, t in enumerate(texts):
        got = result(res, name, "tok%d" % i, isa).tolist()
        assert got == r.seqs[i], "%s: kwker tokenizes %r as %s, HF as %s" % (
            name, t, got, r.seqs[i])
    emb_texts = result(res, name, "embed_texts", isa)
    emb_ids = result(res, name, "embed", isa)[:len(texts)]
    assert np.array_equal(emb_texts, emb_ids), \
        "%s [%s]: embed(texts) differs from embed(their ids) inside a larger batch" % (name, isa)


# -- the API and its errors (this process, the library's own kernel path) ----------------------

@pytest.fixture(scope="module")
def minilm():
    e = kwker.Encoder(str(minilm_path()), **MINILM_ALL)
    yield e
    e.close()


def test_minilm_properties(minilm):
    assert (minilm.dim, minilm.max_tokens, minilm.pooling, minilm.normalize) == \
        (384, 512, "mean", True)
    assert minilm.info.is_encoder == 1 and minilm.info.arch == 6  # KWK_ARCH_BERT
    assert repr(minilm).startswith("Encoder(")


def test_shapes(minilm):
    one = minilm.embed("why is the sky blue?")
    assert one.shape == (384,) and one.dtype == np.float32
    two = minilm.embed(["why is the sky blue?", "hello"])
    assert two.shape == (2, 384)
    assert np.array_equal(two[0], one)
    ids = minilm.tokenize("why is the sky blue?")
    assert np.array_equal(minilm.embed(ids), one)                     # one id sequence: 1-D
    assert np.array_equal(minilm.embed(np.asarray([ids]))[0], one)    # 2-D integer array
    assert minilm.embed([]).shape == (0, 384)
    st = minilm.states("why is the sky blue?")
    assert st.shape == (len(ids), 384) and st.dtype == np.float32
    assert np.array_equal(minilm.states(ids), st)


def test_ollama_reference(minilm):
    """ollama's all-minilm (llama.cpp over an F16 GGUF) on "why is the sky blue?": its weights
    are rounded to halves (a relative error of up to 2^-11 each) and its math runs in F16 / F32
    mixed, so it is not transformers' float32 result; measured: cosine 0.9999994 between
    transformers and ollama, and the same for Kwker preserve; 0.9999 leaves room for summation
    order and is still far above what a wrong pooling or tokenization gives (below 0.99)."""
    ref = json.loads((SHARED_DATA / "reference" / "ollama-embed-reference.json").read_text())
    ref = np.asarray(ref["all-minilm:latest"], dtype=np.float64)
    got = minilm.embed("why is the sky blue?")
    c = cosine(got, ref)
    assert c > 0.9999, "cosine to ollama's embedding %.7f" % c
    assert np.abs(got - ref).max() < 2e-3


def test_pooling_overrides():
    """pooling= / normalize= replace the folder's choice; each against transformers' states."""
    r = tiny_ref("bert_gelu")
    for pooling in ("mean", "cls", "last", "max", "mean_sqrt_len"):
        for normalize in (False, True):
            with kwker.Encoder(str(r.path), pooling=pooling, normalize=normalize) as e:
                assert (e.pooling, e.normalize) == (pooling, normalize)
                check_close(e.embed(r.seqs), r.pooled(pooling, normalize),
                            "bert_gelu pooling=%s normalize=%s" % (pooling, normalize))
    with pytest.raises(ValueError):
        kwker.Encoder(str(r.path), pooling="median")


def test_batch_invariance(minilm):
    """A text's embedding is bitwise the same alone, inside batches, in any order, and with a
    batch_tokens budget small enough to force several forward passes."""
    texts = minilm_texts()
    alone = [minilm.embed(t) for t in texts]
    together = minilm.embed(texts)
    rev = minilm.embed(texts[::-1])[::-1]
    for i in range(len(texts)):
        assert np.array_equal(together[i], alone[i]), "text %d differs inside a batch" % i
        assert np.array_equal(rev[i], alone[i]), "text %d differs in reversed order" % i
    with kwker.Encoder(str(minilm_path()), batch_tokens=64, **MINILM_ALL) as small:  # to 512
        assert small.max_tokens == 512
        many = texts[:4] * 3
        out = small.embed(many)
        for i, t in enumerate(many):
            assert np.array_equal(out[i], alone[i % 4]), "batch_tokens=64: text %d" % i
        assert np.array_equal(small.embed(texts[4]), alone[4])


def test_batch_invariance_tiny_passes():
    """Many short sequences of a tiny model (max 64 positions) through a 64-token budget:
    several passes, each sequence's embedding bitwise what it is alone, and equal to the
    reference."""
    r = tiny_ref("st_sqrt")
    with kwker.Encoder(str(r.path), batch_tokens=1) as e:
        assert e.max_tokens == 64
        alone = [e.embed(s) for s in r.seqs]
        mixed = r.seqs * 4
        order = np.random.default_rng(0).permutation(len(mixed))
        out = e.embed([mixed[i] for i in order])
        for row, i in zip(out, order):
            assert np.array_equal(row, alone[i % len(r.seqs)])
        check_close(np.stack(alone), r.pooled(), "st_sqrt alone")


def test_bad_inputs(minilm):
    V = minilm.vocab_size
    assert V == 30522
    cases = [([101, V, 102], KWK_ERANGE), ([101, -1, 102], KWK_ERANGE), ([], KWK_EARG),
             ([101] + [1996] * 511 + [102], KWK_ELIMIT)]
    for ids, code in cases:
        with pytest.raises(KwkError) as ei:
            minilm.embed([[101, 102], ids])
        assert ei.value.code == code, "ids %s...: code %d (%s), expected %d" % (
            ids[:4], ei.value.code, ei.value, code)
        with pytest.raises(KwkError) as ei:
            minilm.states(ids)
        assert ei.value.code == code, "states: %s" % ei.value
    with pytest.raises(TypeError):
        minilm.embed([1.5, 2.5])
    # the encoder still works after the errors
    assert minilm.embed([[101, 102]]).shape == (1, 384)


def test_truncation(minilm):
    """Too long a text raises; truncate=True cuts it as Hugging Face's tokenizer does with
    truncation=True, max_length=512 (the text's tokens cut, [CLS] and [SEP] kept), and gives
    transformers' embedding of those 512 tokens."""
    path = minilm_path()
    text = (SHARED_DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")[30000:36000]
    full = minilm.tokenize(text)
    assert len(full) > 700
    with pytest.raises(KwkError) as ei:
        minilm.embed(text)
    assert ei.value.code == KWK_ELIMIT
    hf_ids = te.hf_tokenize(path, text, truncation=True, max_length=512)
    assert len(hf_ids) == 512 and hf_ids[-1] == 102
    model = te.load_hf(path)
    ref = te.pool(te.hf_states(model, hf_ids), "mean", True)
    got = minilm.embed(text, truncate=True)
    check_close(got, ref, "truncated text")
    assert np.array_equal(got, minilm.embed(hf_ids))
    assert np.array_equal(minilm.embed(full, truncate=True), got)  # ids keep their last
    check_close(minilm.states(text, truncate=True), te.hf_states(model, hf_ids),
                "truncated states")


def test_truncation_tiny():
    r = tiny_ref("bert_gelu_new")  # 64 positions
    text = " ".join(te.TEXTS * 6)
    hf_ids = te.hf_tokenize(r.path, text, truncation=True, max_length=64)
    with kwker.Encoder(str(r.path)) as e:
        assert len(e.tokenize(text)) > 64
        got = e.embed([text, te.TEXTS[0]], truncate=True)
        ref = np.stack([te.pool(te.hf_states(te.load_hf(r.path), hf_ids), "cls", True),
                        r.pooled()[0]])
        check_close(got, ref, "bert_gelu_new truncated")


def test_decoder_refused():
    import tiny_models
    path = tiny_models.build("llama_tied")
    with pytest.raises(KwkError) as ei:
        kwker.Encoder(str(path))
    assert ei.value.code == KWK_EUNSUPPORTED, ei.value
    assert "decoder" in str(ei.value).lower() or "encoder" in str(ei.value).lower(), \
        "the message should say why: %s" % ei.value


def test_encoder_refused_by_decoder():
    with pytest.raises(KwkError) as ei:
        kwker.KwkDecoder(str(tiny_ref("bert_gelu").path), max_cache_len=32)
    assert ei.value.code == KWK_EUNSUPPORTED, ei.value
    assert "encoder" in str(ei.value).lower(), "the message should say why: %s" % ei.value


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, %r); import kwker; "
            "e = kwker.Encoder(%r); print(e.embed('hi').shape)" % (str(PY_DIR),
                                                                 str(tiny_ref('bert_gelu').path)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "(64,)"


# -- quantized precisions ---------------------------------------------------------------------

def test_quantized_precisions(minilm):
    """balanced / int4 (and 8-bit activations) against preserve on all-MiniLM-L6-v2, by the
    cosine of each text's embedding (short, unicode, 74, 358 and 512 tokens). Measured on an
    AVX-512 CPU when this test was written: balanced 0.99972-0.99992 (act_bits=8
    0.99960-0.99978), int4 0.9604-0.9856, the lower the longer the text. For scale, transformers
    with the layer matrices rounded to llama.cpp's Q8_0 gives 0.99968-0.99990 and to Q4_0
    0.9351-0.9758 (Q4_1 0.9393-0.9787, Q5_0 0.9820-0.9923). The bounds: balanced > 0.999
    (Q8_0's class), int4 > 0.95 (no worse than Q4_0 at its best). A wrong scale or a dropped
    bias gives < 0.9."""
    texts = minilm_texts()
    ref = minilm.embed(texts)
    bounds = [("balanced", 0, 0.999), ("balanced", 8, 0.999), ("int4", 0, 0.95),
              ("int4", 8, 0.95)]
    for precision, act_bits, bound in bounds:
        with kwker.Encoder(str(minilm_path()), precision=precision, act_bits=act_bits,
                           **MINILM_ALL) as e:
            got = e.embed(texts)
            cos = rowwise_cosines(got, ref)
            print("%s act_bits=%d: cosines to preserve %s" % (
                precision, act_bits, " ".join("%.6f" % c for c in cos)))
            assert min(cos) > bound, "%s act_bits=%d: cosines %s" % (precision, act_bits, cos)
            assert np.array_equal(e.embed(texts[0]), got[0])  # batch invariant too
    with pytest.raises((KwkError, ValueError)):
        kwker.Encoder(str(minilm_path()), act_bits=8)  # preserve computes in float32
    with pytest.raises(ValueError):
        kwker.Encoder(str(minilm_path()), act_bits=4)


# -- GGUF: llama.cpp's BERT layout --------------------------------------------------------------

def _gguf(name, ftype, special="cls"):
    folder = minilm_path() if name == "minilm" else te.build(name)
    root = te.cache_root()
    stem = folder.name if name != "minilm" else \
        "minilm-" + hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]
    out = root / ("%s.%s.%s.gguf" % (stem, ftype, special))
    if not out.exists():
        tmp = out.with_suffix(".part")
        gguf_export.export_bert(folder, tmp, ftype, special=special)
        os.replace(tmp, out)
    return out


GGUF_MODELS = ["bert_gelu", "st_mean_norm", "st_cls", "bert_mlm", "bert_gelu_new", "minilm"]


def _hf_with_act(path, act):
    """transformers' BertModel of a folder with its hidden_act replaced."""
    from transformers import BertConfig, BertModel
    cfg = BertConfig.from_pretrained(str(path))
    cfg.hidden_act = act
    cfg._attn_implementation = "eager"
    return BertModel.from_pretrained(str(path), config=cfg).eval()


@pytest.mark.parametrize("name", GGUF_MODELS)
def test_gguf_f32(name):
    """The F32 GGUF holds the checkpoint's very floats: the same states (bitwise, or 1e-6 of
    their range should the loader order a sum differently) and the same tokens. A GGUF does not
    say BERT's activation: Kwker takes the erf GELU of transformers' "gelu" (every common BERT
    checkpoint's; llama.cpp computes the tanh form for all), so the GGUF of a gelu_new
    checkpoint gives transformers' states of that checkpoint with hidden_act "gelu" instead."""
    r = _ref_of(name)
    path = _gguf(name, "f32")
    texts = minilm_texts() if name == "minilm" else te.TEXTS
    act = "gelu" if name == "minilm" else te.SPECS[name]["act"]
    with kwker.Encoder(str(path)) as g, kwker.Encoder(str(r.path), **r.enc) as s:
        assert (g.dim, g.max_tokens) == (s.dim, s.max_tokens)
        for i, t in enumerate(texts):
            assert g.tokenize(t) == r.seqs[i], "GGUF tokenizer: %r" % t
        if act == "gelu":
            for seq in r.seqs:
                a, b = g.states(seq), s.states(seq)
                assert np.array_equal(a, b) or rel_err(a, b) <= 1e-6, \
                    "%s: GGUF F32 states differ from the safetensors' by %.3g" % (
                        name, rel_err(a, b))
            states = r.states
        else:
            model = _hf_with_act(r.path, "gelu")
            states = [te.hf_states(model, seq) for seq in r.seqs]
            for seq, ref in zip(r.seqs, states):
                check_close(g.states(seq), ref, "%s GGUF F32 (erf GELU) states" % name)
        # a GGUF says its pooling in bert.pooling_type (mean / cls / last), always normalized
        # (llama.cpp's server normalizes); without sentence-transformers files it has no key
        pooling = r.pooling if (Path(r.path) / "modules.json").exists() else "cls"
        assert (g.pooling, g.normalize) == (pooling, True)
        ref = np.stack([te.pool(st, pooling, True) for st in states])
        check_close(g.embed(r.seqs), ref, "%s GGUF F32 embed" % name)


@pytest.mark.parametrize("ftype", ["f16", "q8_0"])
@pytest.mark.parametrize("name", ["bert_gelu", "st_mean_norm", "minilm"])
def test_gguf_rounded(name, ftype):
    """F16 / Q8_0 GGUFs: preserve computes in float32 over the file's rounded weights, so its
    states equal transformers' on those weights (read back and dequantized by the gguf
    package) to the usual 1e-5; and the embeddings stay close to the checkpoint's by cosine
    (measured when this test was written: F16 >= 0.9999997, Q8_0 >= 0.99967 on MiniLM,
    >= 0.99995 on the tiny models; bounds 0.9999 and 0.999)."""
    import torch
    from transformers import BertConfig, BertModel
    r = _ref_of(name)
    path = _gguf(name, ftype)
    cfg = BertConfig.from_pretrained(str(r.path))
    cfg._attn_implementation = "eager"
    model = BertModel(cfg, add_pooling_layer=False).eval()
    missing, unexpected = model.load_state_dict(gguf_export.read_back_bert(path), strict=False)
    assert not unexpected and not [m for m in missing if "position_ids" not in m], \
        (missing, unexpected)
    pooling = r.pooling if (Path(r.path) / "modules.json").exists() else "cls"
    with kwker.Encoder(str(path)) as g:
        assert (g.pooling, g.normalize) == (pooling, True)
        for i, seq in enumerate(r.seqs[:4]):
            check_close(g.states(seq), te.hf_states(model, seq),
                        "%s %s states of sequence %d" % (name, ftype, i))
        emb = g.embed(r.seqs)
    bound = 0.9999 if ftype == "f16" else 0.999
    cos = rowwise_cosines(emb, r.pooled(pooling, True))
    assert min(cos) > bound, "%s %s: cosines to the checkpoint's %s" % (name, ftype, cos)


def test_gguf_bos_special_keys():
    """A GGUF written by today's gguf-py (no cls_token_id: bos = [CLS], eos = [SEP]) still
    tokenizes as Hugging Face does."""
    r = tiny_ref("st_mean_norm")
    with kwker.Encoder(str(_gguf("st_mean_norm", "f32", special="bos"))) as g:
        for i, t in enumerate(te.TEXTS):
            assert g.tokenize(t) == r.seqs[i], "bos-style GGUF tokenizer: %r" % t
        check_close(g.embed(te.TEXTS), r.pooled()[:len(te.TEXTS)], "bos-style GGUF embed")


@pytest.mark.parametrize("name", ["st_mean_norm", "minilm"])
def test_int4_keeps_a_q4_0_files_grid(name):
    """int4 from a Q4_0 BERT GGUF packs the file's own codes and scales (as decoders do): its
    embeddings are preserve's of the same file but for the activations' 16-bit rounding
    (1 - cos under 1e-5; measured 1.000000 on MiniLM), where KWKER_INT4_GRID=off fits a grid
    again to the dequantized floats and moves them (MiniLM's llama.cpp Q4_0: cosine 0.984-0.99).
    Each run in its own process: the switch is read when packing."""
    import subprocess
    import sys
    path = _gguf(name, "q4_0")
    texts = te.TEXTS if name != "minilm" else minilm_texts()
    out = {}
    for prec, grid in (("preserve", "on"), ("int4", "on"), ("int4", "off")):
        code = ("import sys, json, numpy as np; sys.path.insert(0, %r); import kwker\n"
                "e = kwker.Encoder(%r, precision=%r)\n"
                "np.save(sys.argv[1], e.embed(json.loads(sys.argv[2]), truncate=True))\n"
                % (str(REPO / "python"), str(path), prec))
        npy = str(te.cache_root() / ("grid-%s-%s-%s.npy" % (name, prec, grid)))
        subprocess.run([sys.executable, "-c", code, npy, json.dumps(texts)], check=True,
                       timeout=300, env=dict(os.environ, KWKER_INT4_GRID=grid))
        out[prec, grid] = np.load(npy)
    on = rowwise_cosines(out["int4", "on"], out["preserve", "on"])
    off = rowwise_cosines(out["int4", "off"], out["preserve", "on"])
    assert min(on) > 1 - 1e-5, on
    assert min(off) < 1 - 1e-4, off


def _edited_copy(name, tmp_path, config=None, modules=None):
    """A copy of tiny model name's folder with config.json keys replaced and modules.json set."""
    import shutil
    src = te.build(name)
    dst = tmp_path / name
    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    if modules is not None:
        mods = [{"idx": i, "name": str(i), "path": p, "type": "sentence_transformers.models." + t}
                for i, (t, p) in enumerate(modules)]
        (dst / "modules.json").write_text(json.dumps(mods))
    return dst


def test_heads_must_split_the_hidden_size(tmp_path):
    """An encoder whose head_dim * heads is not its hidden size is refused by name at load (its
    passes assume it: a 64-wide model with head_dim 32 x 4 heads overflowed the scratch)."""
    d = _edited_copy("bert_gelu", tmp_path, config={"head_dim": 32})
    with pytest.raises(KwkError, match="must split its hidden size 64"):
        kwker.Encoder(str(d))


def test_roberta_model_type_decides(tmp_path):
    """model_type says RoBERTa even where architectures names BertModel: positions still start
    at pad_token_id + 1, so the embeddings are the RoBERTa folder's, bit for bit."""
    d = _edited_copy("xlmr_mean_norm", tmp_path, config={"architectures": ["BertModel"]})
    with kwker.Encoder(str(te.build("xlmr_mean_norm"))) as a, kwker.Encoder(str(d)) as b:
        assert a.max_tokens == b.max_tokens == te.max_tokens(te.SPECS["xlmr_mean_norm"])
        assert np.array_equal(a.embed(te.TEXTS), b.embed(te.TEXTS))


@pytest.mark.parametrize("modules", [
    [("Transformer", ""), ("Normalize", "2_Normalize"), ("Pooling", "1_Pooling")],
    [("Transformer", ""), ("Normalize", "2_Normalize")],
    [("Transformer", "")],
])
def test_modules_out_of_order_or_without_pooling_are_refused(tmp_path, modules):
    """sentence-transformers runs its modules in order: Normalize before Pooling, or no Pooling
    at all (token states, not one embedding), is not what Kwker's pooling computes: refused."""
    d = _edited_copy("st_mean_norm", tmp_path, modules=modules)
    with pytest.raises(KwkError, match="Pooling"):
        kwker.Encoder(str(d))


# -- the sequence limit: sentence-transformers' max_seq_length, the tokenizer's model_max_length -

LONG_TEXTS = [" ".join(te.TEXTS * 6), te.TEXTS[1] * 3, te.TEXTS[0]]
INT32_MAX = 2 ** 31 - 1
KEEP = object()


def _limited(tmp_path, name, sbc=KEEP, mml=KEEP):
    """A copy of tiny model name's folder with sentence_bert_config.json replaced (sbc: a JSON
    value, "drop": no file) and tokenizer_config.json's model_max_length set (mml: a JSON value,
    "drop": no key; KEEP: the MiniLM tokenizer's 512)."""
    import shutil
    d = tmp_path / name
    shutil.copytree(te.build(name), d)
    if sbc == "drop":
        (d / "sentence_bert_config.json").unlink()
    elif sbc is not KEEP:
        (d / "sentence_bert_config.json").write_text(json.dumps(sbc))
    if mml is not KEEP:
        tc = json.loads((d / "tokenizer_config.json").read_text())
        tc.pop("model_max_length")
        if mml != "drop":
            tc["model_max_length"] = mml
        (d / "tokenizer_config.json").write_text(json.dumps(tc))  # NaN is written as NaN
    return d


def _around(e, n_tokens):
    """The longest prefix (in words) of LONG_TEXTS[0] of at most n_tokens tokens and the
    shortest of more."""
    words = LONG_TEXTS[0].split()
    for k in range(1, len(words) + 1):
        if len(e.tokenize(" ".join(words[:k]))) > n_tokens:
            return " ".join(words[:k - 1]), " ".join(words[:k])
    raise AssertionError("LONG_TEXTS[0] is not more than %d tokens" % n_tokens)


def _st_model(path):
    from sentence_transformers import SentenceTransformer
    from tiny_models import torch_single_thread
    torch_single_thread()
    return SentenceTransformer(str(path), device="cpu")


def _limits(e):
    i = e.info
    return (i.max_seq_length, i.model_max_length, i.max_tokens, e.max_tokens)


def test_max_seq_length_as_sentence_transformers(tmp_path):
    """sentence_bert_config.json's max_seq_length (40, of 128 positions) is the limit:
    SentenceTransformer.encode's embeddings of long texts are kwker's with truncate=True, a text
    just over it raises KWK_ELIMIT without truncate, and max_tokens=N is setting
    SentenceTransformer.max_seq_length = N."""
    d = _limited(tmp_path, "st_mean_norm", sbc={"max_seq_length": 40, "do_lower_case": False})
    st = _st_model(d)
    assert st.max_seq_length == 40
    want = st.encode(LONG_TEXTS, convert_to_numpy=True)
    with kwker.Encoder(str(d)) as e:
        assert _limits(e) == (40, 512, 40, 40) and e.info.max_position == 128
        assert len(e.tokenize(LONG_TEXTS[0])) > 128
        check_close(e.embed(LONG_TEXTS, truncate=True), want, "max_seq_length 40")
        fits, over = _around(e, 40)
        assert len(e.tokenize(fits)) <= 40 < len(e.tokenize(over))
        with pytest.raises(KwkError, match="at most 40") as ei:
            e.embed(over)
        assert ei.value.code == KWK_ELIMIT
        ids = e.tokenize(over)
        e.embed(ids[:39] + [102])
        with pytest.raises(KwkError) as ei:
            e.embed(ids[:40] + [102])  # ids too: 41 of them
        assert ei.value.code == KWK_ELIMIT
        check_close(e.embed(fits), st.encode(fits, convert_to_numpy=True), "up to 40 tokens")
    st.max_seq_length = 100
    want = st.encode(LONG_TEXTS, convert_to_numpy=True)
    with kwker.Encoder(str(d), max_tokens=100) as e:
        assert e.max_tokens == 100
        check_close(e.embed(LONG_TEXTS, truncate=True), want, "max_tokens=100")
    with kwker.Encoder(str(d), max_tokens=10 ** 6) as e:
        assert e.max_tokens == 128  # cut to the positions
    for bad in (0, -1, True):
        with pytest.raises(ValueError):
            kwker.Encoder(str(d), max_tokens=bad)


def test_model_max_length_without_max_seq_length(tmp_path):
    """Without a max_seq_length the tokenizer's model_max_length (48) decides, as
    sentence-transformers' min(max_position_embeddings, model_max_length); a folder without
    modules.json is not a sentence-transformers folder: its sentence_bert_config.json is
    ignored, by sentence-transformers too."""
    d = _limited(tmp_path / "a", "st_mean_norm", sbc="drop", mml=48)
    st = _st_model(d)
    assert st.max_seq_length == 48
    with kwker.Encoder(str(d)) as e:
        assert _limits(e) == (0, 48, 48, 48)
        check_close(e.embed(LONG_TEXTS, truncate=True), st.encode(LONG_TEXTS,
                                                                  convert_to_numpy=True),
                    "model_max_length 48")
    d = _limited(tmp_path / "b", "bert_gelu", sbc={"max_seq_length": 20}, mml=48)
    assert _st_model(d).max_seq_length == 48
    with kwker.Encoder(str(d)) as e:
        assert _limits(e) == (0, 48, 48, 48)
    d = _limited(tmp_path / "c", "st_mean_norm", sbc={"max_seq_length": None}, mml=30)
    assert _st_model(d).max_seq_length == 30
    with kwker.Encoder(str(d)) as e:
        assert _limits(e) == (0, 30, 30, 30)


BAD_LIMITS = [("string", "40"), ("negative", -40), ("zero", 0), ("fraction", 40.5),
              ("bool", True), ("list", [40]), ("null", None), ("1e30", 10 ** 30),
              ("huge", 2 ** 31), ("NaN", float("nan")), ("missing", "drop")]


@pytest.mark.parametrize("what,value", BAD_LIMITS, ids=[b[0] for b in BAD_LIMITS])
def test_bad_limits_fall_back_to_the_positions(tmp_path, what, value):
    """A max_seq_length or model_max_length that is not a positive whole number, or that says
    "no limit" (1e30, transformers' default), leaves the positions (128) as the limit: never a
    crash, never more than the positions. NaN makes a file jansson refuses: the whole file is
    ignored (the model still loads)."""
    big = INT32_MAX if what in ("1e30", "huge") else 0
    sbc = "drop" if value == "drop" else {"max_seq_length": value}
    with kwker.Encoder(str(_limited(tmp_path / "sbc", "st_mean_norm", sbc=sbc))) as e:
        assert _limits(e) == (big, 512, 128, 128), what
        assert e.embed(LONG_TEXTS, truncate=True).shape == (3, 64)
    d = _limited(tmp_path / "mml", "st_mean_norm", sbc="drop", mml=value)
    with kwker.Encoder(str(d)) as e:
        assert _limits(e) == (0, big, 128, 128), what
        with pytest.raises(KwkError) as ei:
            e.embed(_around(e, 128)[1])
        assert ei.value.code == KWK_ELIMIT
    if what in ("1e30", "missing"):  # what transformers reads as "no limit"
        assert _st_model(d).max_seq_length == 128
    (d / "sentence_bert_config.json").write_text("{\"max_seq_length\": 40,")  # not JSON
    with kwker.Encoder(str(d)) as e:
        assert _limits(e) == (0, big, 128, 128), what


def test_minilm_limit_is_sentence_transformers(minilm):
    """The real all-MiniLM-L6-v2: max_seq_length 256 of 512 positions (the tokenizer says 512).
    kwker's embedding of a long text with truncate=True is SentenceTransformer.encode's; its
    GGUF has no such files: the positions decide, as llama.cpp."""
    text = (SHARED_DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")[30000:33000]
    st = _st_model(minilm_path())
    assert st.max_seq_length == 256
    with kwker.Encoder(str(minilm_path())) as e:
        assert _limits(e) == (256, 512, 256, 256)
        assert len(e.tokenize(text)) > 300
        check_close(e.embed(text, truncate=True), st.encode(text, convert_to_numpy=True),
                    "MiniLM truncated at 256")
        with pytest.raises(KwkError, match="at most 256") as ei:
            e.embed(text)
        assert ei.value.code == KWK_ELIMIT
    assert _limits(minilm) == (256, 512, 256, 512)  # max_tokens=512 given
    with kwker.Encoder(str(_gguf("st_mean_norm", "f32"))) as g:
        assert _limits(g) == (0, 0, 128, 128)
