"""XLM-R GGUFs as llama.cpp's converter writes them (a "t5" SentencePiece vocabulary, the position
table cut by pad + 1 rows), the shape of multilingual embedders (bge-m3, multilingual-e5) and
rerankers (bge-reranker-v2-m3): Kwker runs the file as it runs the checkpoint it came from.

The models are tiny_encoders' xlmr_spm_mean (XLMRobertaModel, mean pooling, normalized) and
ce_xlmr_spm (XLMRobertaForSequenceClassification), both with tiny_spm's unigram tokenizer; the
oracles are transformers and sentence-transformers on the checkpoint's folder.
"""
import os

import numpy as np
import pytest

import gguf_export
import kwker
import tiny_encoders as te

TEXTS = te.TEXTS + ["Grüße aus München: ｆｕｌｌｗｉｄｔｈ, ﬁne  spaces   and\ttabs ",
                    "日本語のテキスト。Привет мир!"]
PAIRS = [("what is a tokenizer?", "A tokenizer cuts text into pieces."),
         ("日本語", "テキストです。"), ("Grüße", "  München  "), ("why?", "a " * 25)]


def _gguf(name, ftype="f32"):
    folder = te.build(name)
    out = te.cache_root() / ("%s.t5.%s.gguf" % (folder.name, ftype))
    if not out.exists():
        tmp = out.with_suffix(".part")
        if te.SPECS[name].get("labels"):
            gguf_export.export_rank(folder, tmp, ftype)
        else:
            gguf_export.export_bert(folder, tmp, ftype)
        os.replace(tmp, out)
    return out


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def test_the_gguf_is_llama_cpps_shape():
    import gguf
    r = gguf.GGUFReader(str(_gguf("xlmr_spm_mean")))
    model = bytes(r.fields["tokenizer.ggml.model"].parts[-1]).decode()
    assert model == "t5"
    pos = [t for t in r.tensors if t.name == "position_embd.weight"][0]
    assert int(pos.shape[1]) == te.SPECS["xlmr_spm_mean"]["max_pos"] - 2


def test_embedder_gguf_equals_its_checkpoint():
    """Same tokens as Hugging Face's tokenizer of the checkpoint; F32 states equal the
    checkpoint's (bitwise or 1e-6 of their range); embeddings equal sentence-transformers'."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer
    folder = te.build("xlmr_spm_mean")
    hf = AutoTokenizer.from_pretrained(str(folder))
    with kwker.Encoder(str(_gguf("xlmr_spm_mean"))) as g, kwker.Encoder(str(folder)) as s:
        assert (g.dim, g.max_tokens, g.pooling, g.normalize) == \
            (s.dim, s.max_tokens, "mean", True)
        for text in TEXTS:
            ids = hf(text)["input_ids"]
            assert g.tokenize(text) == s.tokenize(text) == ids, repr(text)
            a, b = g.states(ids), s.states(ids)
            assert np.array_equal(a, b) or _rel(a, b) <= 1e-6, (text, _rel(a, b))
        got = g.embed(TEXTS)
    st = SentenceTransformer(str(folder), device="cpu")
    want = st.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False)
    assert _rel(got, want) <= 1e-5, _rel(got, want)


def test_reranker_gguf_equals_its_checkpoint():
    """The rank GGUF joins pairs as XLM-R's tokenizer does (<s> a </s> </s> b </s>, llama.cpp's
    rerank prompt with the file's add flags) and scores them as the checkpoint does, and as
    sentence-transformers' CrossEncoder does on the folder."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer
    folder = te.build("ce_xlmr_spm")
    hf = AutoTokenizer.from_pretrained(str(folder))
    with kwker.Reranker(str(_gguf("ce_xlmr_spm"))) as g, kwker.Reranker(str(folder)) as s:
        for a, b in PAIRS:
            ids, types = g.tokenize(a, b)
            assert ids == hf(a, b)["input_ids"], (a, b)
            assert (ids, types) == s.tokenize(a, b)
        x, y = g.logits(*zip(*[g.tokenize(a, b) for a, b in PAIRS])), \
            s.logits(*zip(*[s.tokenize(a, b) for a, b in PAIRS]))
        assert np.array_equal(x, y) or _rel(x, y) <= 1e-6, _rel(x, y)
        got = g.predict(PAIRS)
    want = CrossEncoder(str(folder), device="cpu").predict(PAIRS)
    assert _rel(got, want) <= 1e-5, (got, want)


@pytest.mark.parametrize("ftype", ["f16", "q8_0"])
def test_rounded_gguf_embeddings_stay_close(ftype):
    """F16 / Q8_0 files of the embedder: cosines to the checkpoint's embeddings (measured when
    written: F16 >= 0.9999999, Q8_0 >= 0.99995; bounds 0.9999 and 0.999)."""
    folder = te.build("xlmr_spm_mean")
    with kwker.Encoder(str(_gguf("xlmr_spm_mean", ftype))) as g, \
            kwker.Encoder(str(folder)) as s:
        a, b = g.embed(TEXTS), s.embed(TEXTS)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print("%s cosines %s" % (ftype, cos))
    assert cos.min() > (0.9999 if ftype == "f16" else 0.999), cos
