"""kwker.Tokenizer.encode_pair (kwk_tokenizer_encode_pair) against Hugging Face: ids and type ids
of text pairs, untruncated and truncated "longest_first" to many max_length values, for the real
tokenizers of the shared data (BERT, TinyLlama's template, Llama 3's and SmolLM's plain joins),
the all-MiniLM-L6-v2 folder under models/, RoBERTa and XLM-R style tokenizers trained here, a
vocab.txt-only folder and BERT GGUFs joined as llama.cpp's rerank prompt.

The reference is the tokenizers library (Tokenizer.encode(a, b) with enable_truncation), and
transformers' batched call tokenizer([a], [b], truncation=True, max_length=m) for the folders
it loads. Documented differences, checked here: a max_length smaller than the pair's special
tokens is KWK_ELIMIT (Hugging Face silently leaves the pair whole); and transformers 5 encodes an
unbatched tokenizer(a, "") as the single text a, where its batched call and tokenizers keep the
pair form, as Kwker does.
"""
import json
import random
import shutil

import pytest

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from conftest import REPO, SHARED_DATA
from kwker import KwkError
from kwker.tokenizer import Tokenizer

TOK = SHARED_DATA / "tokenizers"
MINILM = TOK / "bert-uncased" / "all-MiniLM-L6-v2"
KWK_EUNSUPPORTED, KWK_ELIMIT = -10002, -10003

HARD = ["", " ", "Hello world", "a", "why is the sky blue?", "don't I'm O'Neil",
        "Naïve café owners in Zürich — ŒUVRE, 東京, ελληνικά, 🙂 and déjà vu.",
        "[CLS] [SEP] <s> </s> <|begin_of_text|>", "1234567890 3.14159", "ab " * 40]


def texts():
    rows = (SHARED_DATA / "text" / "wikitext-2-raw-v1.test.hf-rows-crlf.txt").read_text(
        encoding="utf-8").split("\n")
    rows = [r for r in rows if r.strip()]
    rng = random.Random(4321)
    return HARD + rng.sample(rows, 40)


TEXTS = texts()


def pairs(n, seed):
    rng = random.Random(seed)
    out = [(a, b) for a in HARD[:4] for b in HARD[:4]]
    # equal lengths: on a tie b keeps the odd token of an odd budget
    out += [("a b c d e f g", "h i j k l m n"), ("x " * 70, "y " * 70), ("q " * 9, "r " * 8)]
    while len(out) < n:
        out.append((rng.choice(TEXTS), rng.choice(TEXTS)))
    return out


def max_lengths(n_special, rng):
    """No limit, the specials alone, one and two more, and odd and even values up to 130."""
    return [0, n_special, n_special + 1, n_special + 2] + rng.sample(range(n_special + 3, 131),
                                                                      8)


def hf_pair(hf, a, b, m):
    if m:
        hf.enable_truncation(m, strategy="longest_first")
    else:
        hf.no_truncation()
    e = hf.encode(a, b)
    return e.ids, e.type_ids


def check_against(kt, hf, n_pairs=60, seed=1, check_types=True):
    """Every pair and max_length: Kwker's ids (and type ids) are tokenizers'."""
    hf.no_padding()
    n_special = hf.num_special_tokens_to_add(True)
    rng = random.Random(seed)
    checked = 0
    for a, b in pairs(n_pairs, seed):
        for m in max_lengths(n_special, rng):
            want = hf_pair(hf, a, b, m)
            got = kt.encode_pair(a, b, max_tokens=m)
            assert got[0] == want[0], (a[:40], b[:40], m)
            if check_types:
                assert got[1] == want[1], (a[:40], b[:40], m)
            if m:
                assert len(got[0]) <= m
            checked += 1
        for m in range(1, n_special):
            with pytest.raises(KwkError) as ei:
                kt.encode_pair(a, b, max_tokens=m)
            assert ei.value.code == KWK_ELIMIT
            # Hugging Face leaves the pair whole here
            assert hf_pair(hf, a, b, m) == hf_pair(hf, a, b, 0)
    assert checked >= n_pairs * 12


def test_minilm_shared_against_tokenizers():
    hf = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    check_against(Tokenizer(str(MINILM)), hf, seed=2)


def test_bert_base_uncased_against_tokenizers():
    path = TOK / "bert-uncased" / "bert-base-uncased.tokenizer.json"
    check_against(Tokenizer(str(path)), tokenizers.Tokenizer.from_file(str(path)), seed=3)


def test_tinyllama_template_against_tokenizers():
    """TemplateProcessing pair "<s> $A <s>:1 $B:1"."""
    path = TOK / "llama2-tinyllama" / "tokenizer.json"
    check_against(Tokenizer(str(path)), tokenizers.Tokenizer.from_file(str(path)), seed=4)


def test_llama3_bytelevel_post_against_tokenizers(tmp_path):
    """A ByteLevel post-processor adds nothing: a then b, type ids 0 then 1."""
    import gzip
    with gzip.open(TOK / "llama3" / "tokenizer.json.gz", "rb") as f:
        (tmp_path / "tokenizer.json").write_bytes(f.read())
    path = tmp_path / "tokenizer.json"
    check_against(Tokenizer(str(path)), tokenizers.Tokenizer.from_file(str(path)), n_pairs=30,
                  seed=5)


def test_smollm_no_post_processor_against_tokenizers():
    path = TOK / "smollm" / "from-SmolLM-135M-finetune" / "tokenizer.json"
    check_against(Tokenizer(str(path)), tokenizers.Tokenizer.from_file(str(path)), n_pairs=30,
                  seed=6)


@pytest.mark.parametrize("folder", [MINILM, REPO / "models" / "all-MiniLM-L6-v2"],
                         ids=["shared", "models"])
def test_minilm_against_transformers(folder):
    """transformers' batched call, as cross-encoders make it."""
    from transformers import AutoTokenizer
    assert (folder / "tokenizer.json").is_file(), "missing %s: run scripts/setup" % folder
    tok = AutoTokenizer.from_pretrained(str(folder))
    kt = Tokenizer(str(folder))
    rng = random.Random(7)
    for a, b in pairs(40, 7):
        for m in max_lengths(3, rng):
            kw = dict(truncation=True, max_length=m) if m else {}
            r = tok([a], [b], **kw)
            assert kt.encode_pair(a, b, m) == (r["input_ids"][0], r["token_type_ids"][0])
    # the unbatched call with an empty second text is transformers' single form
    assert tok("hello", "")["input_ids"] == Tokenizer(str(folder)).encode("hello")
    assert kt.encode_pair("hello", "") == (tok(["hello"], [""])["input_ids"][0],
                                           tok(["hello"], [""])["token_type_ids"][0])


def train_bpe_roberta(path):
    """A RoBERTa-style tokenizer: byte-level BPE trained on the test texts, RobertaProcessing."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "<pad>", "</s>",
                                                                  "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 3, trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    tok.save(str(path))
    return tok


def train_unigram_xlmr(path):
    """An XLM-R-style tokenizer: Unigram with Metaspace, the pair template XLM-R's converter
    writes (<s> A </s> </s> B </s>, all type 0)."""
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>",
                                                                      "<unk>"],
                                      unk_token="<unk>")
    tok.train_from_iterator(TEXTS * 3, trainer)
    s, e = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", s), ("</s>", e)])
    tok.save(str(path))
    return tok


def test_roberta_style_against_tokenizers(tmp_path):
    hf = train_bpe_roberta(tmp_path / "tokenizer.json")
    kt = Tokenizer(str(tmp_path / "tokenizer.json"))
    assert set(kt.encode_pair("a b c", "d e")[1]) == {0}
    check_against(kt, hf, seed=8)


def test_roberta_in_sequence_against_tokenizers(tmp_path):
    """A Sequence holding ByteLevel and RobertaProcessing: Roberta's pair form."""
    hf = train_bpe_roberta(tmp_path / "tokenizer.json")
    hf.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                             hf.post_processor])
    hf.save(str(tmp_path / "tokenizer.json"))
    check_against(Tokenizer(str(tmp_path / "tokenizer.json")), hf, n_pairs=30, seed=9)


def test_xlmr_style_against_tokenizers(tmp_path):
    hf = train_unigram_xlmr(tmp_path / "tokenizer.json")
    # fewer pairs: tokenizers' encode of this trained Unigram is slow (~17 ms a call)
    check_against(Tokenizer(str(tmp_path / "tokenizer.json")), hf, n_pairs=25, seed=10)


def test_two_token_adders_unsupported(tmp_path):
    """tokenizers wraps each part twice with two Bert steps in a Sequence; Kwker says it has no
    pair form (single encode still works)."""
    j = json.loads((MINILM / "tokenizer.json").read_text())
    bert = {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}
    j["post_processor"] = {"type": "Sequence", "processors": [bert, bert]}
    kt = Tokenizer.from_json(json.dumps(j))
    with pytest.raises(KwkError) as ei:
        kt.encode_pair("a", "b")
    assert ei.value.code == KWK_EUNSUPPORTED
    assert kt.encode("a") == [101, 101, 1037, 102, 102]


def test_vocab_txt_folder(tmp_path):
    """A folder with only vocab.txt: BERT's pair form, as transformers builds it."""
    shutil.copy(MINILM / "vocab.txt", tmp_path / "vocab.txt")
    hf = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    check_against(Tokenizer(str(tmp_path)), hf, n_pairs=30, seed=11)


def write_bert_gguf(path, **flags):
    """ggml-vocab-bert-bge.gguf's vocabulary (llama.cpp's BERT vocab file) with the ids and
    add_*_token flags gguf-py's converter writes (flags: add_bos, add_eos, add_sep, bos, eos,
    sep; None leaves a key out)."""
    import gguf
    r = gguf.GGUFReader(str(SHARED_DATA / "llamacpp-vocab" / "ggml-vocab-bert-bge.gguf"))
    f = r.fields["tokenizer.ggml.tokens"]
    toks = [bytes(f.parts[i]) for i in f.data]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_tokenizer_model("bert")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_unk_token_id(100)
    w.add_pad_token_id(0)
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                     ("sep", w.add_sep_token_id)):
        if flags.get(key) is not None:
            add(flags[key])
    for key, add in (("add_bos", w.add_add_bos_token), ("add_eos", w.add_add_eos_token),
                     ("add_sep", w.add_add_sep_token)):
        if flags.get(key) is not None:
            add(flags[key])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("flags,form", [
    # what gguf-py writes for BERT's TemplateProcessing: [CLS] a [SEP] b [SEP]
    (dict(bos=101, eos=102, sep=102, add_bos=True, add_eos=True, add_sep=False),
     [101, "a", 102, "b", 102]),
    # for RobertaProcessing: all three, <s> a </s> </s> b </s>
    (dict(bos=101, eos=102, sep=102, add_bos=True, add_eos=True, add_sep=True),
     [101, "a", 102, 102, "b", 102]),
    # no flags: WordPiece's defaults in llama.cpp (bos and sep, not eos)
    (dict(bos=101, sep=102), [101, "a", 102, "b"]),
])
def test_bert_gguf_rerank_join(tmp_path, flags, form):
    path = write_bert_gguf(tmp_path / "bert.gguf", **flags)
    kt = Tokenizer(str(path))
    rng = random.Random(12)
    n_special = sum(isinstance(p, int) for p in form)
    for a, b in pairs(30, 12):
        ea, eb = kt.encode(a, False), kt.encode(b, False)
        for m in max_lengths(n_special, rng):
            ka, kb = len(ea), len(eb)
            if m and ka + kb > m - n_special:
                ka, kb = hf_cut(ka, kb, m - n_special)
            want, types, seen_b = [], [], False
            for p in form:
                seen_b = seen_b or p == "b"
                part = ea[:ka] if p == "a" else eb[:kb] if p == "b" else [p]
                want += part
                types += [int(seen_b)] * len(part)
            assert kt.encode_pair(a, b, m) == (want, types), (a[:30], b[:30], m)


def hf_cut(n1, n2, budget):
    """tokenizers' LongestFirst: the kept counts of two texts (the spec, restated)."""
    swap = n1 > n2
    s, l = (n2, n1) if swap else (n1, n2)
    l = s if s > budget else max(s, budget - s)
    if s + l > budget:
        s = budget // 2
        l = s + budget % 2
    return (l, s) if swap else (s, l)


def test_bert_gguf_matches_hf_bert_form(tmp_path):
    """The converter's flags give exactly Hugging Face's BERT pair (the bge vocabulary is
    bert-base-uncased's)."""
    path = write_bert_gguf(tmp_path / "bert.gguf", bos=101, eos=102, sep=102, add_bos=True,
                           add_eos=True, add_sep=False)
    hf = tokenizers.Tokenizer.from_file(str(TOK / "bert-uncased" / "bert-base-uncased."
                                            "tokenizer.json"))
    check_against(Tokenizer(str(path)), hf, n_pairs=30, seed=13)


def test_bad_arguments():
    kt = Tokenizer(str(MINILM))
    with pytest.raises(KwkError) as ei:
        kt.encode_pair("a", "b", max_tokens=2)
    assert ei.value.code == KWK_ELIMIT
    assert kt.encode_pair("", "") == ([101, 102, 102], [0, 0, 1])
    assert kt.encode_pair(b"caf\xc3", "x")[0] == kt.encode_pair("caf\ufffd", "x")[0]
