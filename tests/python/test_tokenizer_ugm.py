"""GGUF "t5" vocabularies (SentencePiece unigram: XLM-R and the embedders and rerankers built on
it, T5): Kwker's ids against Hugging Face's tokenizer of the same model, against sentencepiece
itself and against llama.cpp on the same file; decoding, pairs, the flags, malformed files.

The model is a small unigram trained here (tiny_spm.py) with XLM-R's nmt_nfkc charsmap; its GGUF
is written as llama.cpp's converter writes an XLM-R checkpoint's.
"""
import gguf
import pytest

import tiny_spm
from conftest import SHARED_DATA
from kwker import KwkError
from kwker.tokenizer import Tokenizer


def vector_texts():
    """llama.cpp's tokenizer test strings (spaces, newlines, digits, CJK, emoji, accents)."""
    inp = (SHARED_DATA / "llamacpp-vocab" / "ggml-vocab-llama-spm.gguf.inp").read_text(
        encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")[:-1]
    assert len(texts) >= 40, "llama.cpp's vectors missing from %s" % SHARED_DATA
    return texts


def prose_texts():
    """Lines of wikitext-2 and of War and Peace past what the model was trained on."""
    wiki = (SHARED_DATA / "text" / "wikitext-2-raw-v1.test.hf-rows-crlf.txt").read_text(
        encoding="utf-8").splitlines()
    war = (SHARED_DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")
    tail = war[tiny_spm.TRAIN_CHARS + 1000:tiny_spm.TRAIN_CHARS + 61000]
    lines = [w for w in wiki if w.strip()][:300]
    return lines + [tail[i:i + 700] for i in range(0, len(tail), 700)]


EDGE_TEXTS = [
    "", " ", "  ", "\n", "\t", " a", "   lead", "trail   ", "mid    spaces  end ", "a\tb\nc\r\nd",
    "Grüße aus München", "ﬁne ﬂour", "ｆｕｌｌ　ｗｉｄｔｈ　ｓｐａｃｅ", "x² ½ ℌ ①", "日本語のテキスト",
    "🙂🙃 ok", "Привет, мир!", "ελληνικά", "e\u0301 combining", "\u00a0nbsp\u2003em",
    "unknown ☃ ⛄ characters ꙮ", "▁ already ▁▁ escaped", "[PAD5] looks like filler",
    "<s>x</s>", "a <unk> b", "<pad><s>", "</s></s>",
]


@pytest.fixture(scope="module")
def spm():
    return tiny_spm.spm_dir()


@pytest.fixture(scope="module")
def files(spm, tmp_path_factory):
    """(Kwker's tokenizer of the GGUF, Hugging Face's of the folder, the GGUF's path)."""
    from transformers import AutoTokenizer
    path = tiny_spm.vocab_gguf(spm, tmp_path_factory.mktemp("ugm") / "vocab.gguf")
    return Tokenizer(str(path)), AutoTokenizer.from_pretrained(str(spm)), path


def test_oracle_is_sentencepiece(spm, files):
    """The Hugging Face tokenizer the tests trust gives sentencepiece's own ids (fairseq
    offset) on text without special tokens."""
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm / "sentencepiece.bpe.model"))
    fair = {0: 3, 1: 0, 2: 2}
    _, hf, _ = files
    texts = vector_texts() + prose_texts() + [t for t in EDGE_TEXTS if "<" not in t]
    for text in texts:
        want = [fair.get(i, i + 1) for i in sp.encode(text)]
        assert hf(text, add_special_tokens=False)["input_ids"] == want, repr(text[:120])


@pytest.mark.parametrize("which", ["vectors", "prose", "edge"])
def test_ids_match_hf(files, which):
    kw, hf, _ = files
    texts = {"vectors": vector_texts, "prose": prose_texts, "edge": lambda: EDGE_TEXTS}[which]()
    for text in texts:
        assert kw.encode(text) == hf(text)["input_ids"], repr(text[:120])
        assert kw.encode(text, add_special_tokens=False) == \
            hf(text, add_special_tokens=False)["input_ids"], repr(text[:120])


def test_unknown_pieces_fuse(files):
    """Characters outside the vocabulary become one <unk> a run, as in Hugging Face."""
    kw, hf, _ = files
    ids = kw.encode("☃⛄ꙮ", add_special_tokens=False)
    assert ids == hf("☃⛄ꙮ", add_special_tokens=False)["input_ids"]
    assert ids.count(3) == 1, ids


def test_ids_match_llamacpp(files):
    """llama.cpp's UGM tokenizer on the same file gives the same ids, special text parsed
    (the GGUF has no <mask>: its last id is a [PADn] filler in both)."""
    import llama_cpp
    kw, _, path = files
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = vector_texts() + prose_texts()[:200] + [t for t in EDGE_TEXTS if t.strip()]
    for text in texts:
        want = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        assert kw.encode(text) == want, repr(text[:120])


def test_decode_matches_hf(files):
    kw, hf, _ = files
    for text in vector_texts() + prose_texts()[:100] + EDGE_TEXTS:
        ids = hf(text)["input_ids"]
        assert kw.decode(ids) == hf.decode(ids), repr(text[:120])
        assert kw.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), \
            repr(text[:120])


def test_pair_is_xlmr_form(files):
    """The pair joins as XLM-R's tokenizer and llama.cpp's rerank prompt do:
    <s> a </s> </s> b </s>, one token type."""
    kw, hf, _ = files
    cases = [("what is a tokenizer?", "A tokenizer cuts text into pieces."),
             ("日本語", "テキスト"), ("q", "")]
    for a, b in cases:
        ids, types = kw.encode_pair(a, b)
        # batched: an empty b keeps the pair form there (kwker.h), unbatched it does not
        assert ids == hf([a], [b])["input_ids"][0], (a, b)
        assert list(types) == [0] * len(ids)
    long_a, long_b = " ".join(["alpha"] * 60), " ".join(["beta"] * 30)
    ids, _ = kw.encode_pair(long_a, long_b, max_tokens=40)
    assert ids == hf(long_a, long_b, truncation="longest_first", max_length=40)["input_ids"]


@pytest.mark.parametrize("dummy,collapse", [(False, True), (True, False), (False, False)])
def test_normalizer_flags(tmp_path, dummy, collapse):
    """Without the dummy prefix Metaspace prepends nothing; without remove_extra_whitespaces
    spaces are kept one "▁" each: both as Hugging Face's tokenizer of such a model."""
    from transformers import AutoTokenizer
    folder = tiny_spm.spm_dir(vocab=1200, add_dummy_prefix=dummy,
                              remove_extra_whitespaces=collapse)
    kw = Tokenizer(str(tiny_spm.vocab_gguf(folder, tmp_path / "v.gguf")))
    hf = AutoTokenizer.from_pretrained(str(folder))
    for text in vector_texts() + EDGE_TEXTS + prose_texts()[:60]:
        assert kw.encode(text) == hf(text)["input_ids"], repr(text[:120])


def test_flag_defaults_are_llamacpps(spm, tmp_path):
    """A file without add_space_prefix / remove_extra_whitespaces reads them as llama.cpp does:
    no prefix, every space kept."""
    kw = Tokenizer(str(tiny_spm.vocab_gguf(spm, tmp_path / "v.gguf", add_flags=False)))
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(tmp_path / "v.gguf"), vocab_only=True, verbose=False)
    for text in ["hello world", "a  b", "x\n\ny", " lead", "x  \n y ", "  "] + vector_texts():
        assert kw.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), \
            repr(text[:120])


def test_identity_normalization(tmp_path):
    """A model without a charsmap (identity rules) loads and matches Hugging Face's."""
    from transformers import AutoTokenizer
    folder = tiny_spm.spm_dir(vocab=1200, normalization="identity")
    kw = Tokenizer(str(tiny_spm.vocab_gguf(folder, tmp_path / "v.gguf")))
    hf = AutoTokenizer.from_pretrained(str(folder))
    for text in vector_texts() + EDGE_TEXTS:
        assert kw.encode(text) == hf(text)["input_ids"], repr(text[:120])


def _rewrite(src, dst, drop=(), replace=None):
    """Copy a vocabulary GGUF without the keys in drop and with replace's keys given new
    values (a list or bytes: an array of gguf-py's type for it)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "bert")
    replace = replace or {}
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop \
                or name in replace:
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(field.parts[i]) for i in field.data])
            elif sub == gguf.GGUFValueType.UINT8:
                w.add_array(name, bytes(int(field.parts[i][0]) for i in field.data))
            else:
                w.add_array(name, [field.parts[i].tolist()[0] for i in field.data])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[-1]).decode())
        else:
            w.add_key_value(name, field.parts[-1].tolist()[0], vt)
    for name, val in replace.items():
        w.add_array(name, val)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_rewrite_keeps_a_file_whole(files, tmp_path):
    """The malformed-file tests' copier itself: an unchanged copy tokenizes the same."""
    kw, _, path = files
    copy = Tokenizer(str(_rewrite(path, tmp_path / "same.gguf")))
    for text in EDGE_TEXTS + vector_texts():
        assert copy.encode(text) == kw.encode(text), repr(text[:120])


def test_scores_summing_to_minus_infinity_follow_hf(tmp_path):
    """Pieces of score -1e308 make every path's sum -inf: Hugging Face's lattice keeps the
    first path that reaches a position unless a later one scores strictly more, and so does
    Kwker's (it once walked back through positions no path had set)."""
    import json
    import tokenizers
    tj = {"version": "1.0", "added_tokens": [], "normalizer": None, "post_processor": None,
          "decoder": None, "truncation": None, "padding": None,
          "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                            "prepend_scheme": "always", "split": True},
          "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False,
                    "vocab": [["<unk>", 0.0], ["\u2581", -1e308], ["a", -1e308],
                              ["b", -1e308], ["ab", -5.0]]}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tj))
    kw, hf = Tokenizer(str(path)), tokenizers.Tokenizer.from_file(str(path))
    for text in ["ab ba c", "abc", "a b c ba", "bbbb aab"]:
        assert kw.encode(text) == hf.encode(text).ids, text


@pytest.mark.parametrize("case,why", [
    ("inf_scores", "tokenizer.ggml.scores"),
    ("no_scores", "tokenizer.ggml.scores"),
    ("short_scores", "tokenizer.ggml.scores"),
    ("string_scores", "tokenizer.ggml.scores"),
    ("charsmap_short", "precompiled_charsmap"),
    ("charsmap_size", "precompiled_charsmap"),
    ("charsmap_strings", "precompiled_charsmap"),
])
def test_malformed_t5_vocabularies_are_errors(files, tmp_path, case, why):
    _, _, path = files
    n = len(gguf.GGUFReader(str(path)).fields["tokenizer.ggml.tokens"].data)
    edits = {
        "inf_scores": dict(replace={"tokenizer.ggml.scores": [-float("inf")] * n}),
        "no_scores": dict(drop=("tokenizer.ggml.scores",)),
        "short_scores": dict(replace={"tokenizer.ggml.scores": [0.5] * (n - 1)}),
        "string_scores": dict(replace={"tokenizer.ggml.scores": ["x"] * n}),
        "charsmap_short": dict(replace={"tokenizer.ggml.precompiled_charsmap": bytes([1, 0])}),
        "charsmap_size": dict(replace={"tokenizer.ggml.precompiled_charsmap": bytes(
            [0xF0, 0xFF, 0xFF, 0x7F, 0, 0, 0, 0])}),
        "charsmap_strings": dict(replace={"tokenizer.ggml.precompiled_charsmap": ["a", "b"]}),
    }[case]
    bad = _rewrite(path, tmp_path / (case + ".gguf"), **edits)
    with pytest.raises(KwkError) as e:
        Tokenizer(str(bad))
    assert str(bad) in str(e.value) and why in str(e.value), str(e.value)


def test_charsmap_replacement_not_utf8_is_not_written(tmp_path):
    """A charsmap whose replacement is not UTF-8 (here A's "a" patched to 0xFF) leaves the text
    as it was (the steps after the normalizer match regexes on UTF-8 text): the same ids as the
    file without that charsmap, where the rule's absence leaves "A" too; the intact file maps it."""
    import sentencepiece
    (tmp_path / "rules.tsv").write_text("41\t61\n")
    war = (SHARED_DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")
    (tmp_path / "t.txt").write_text(war[:20000] + "\nABC x\n")
    sentencepiece.SentencePieceTrainer.train(
        input=str(tmp_path / "t.txt"), model_prefix=str(tmp_path / "sentencepiece.bpe"),
        vocab_size=150, model_type="unigram", normalization_rule_tsv=str(tmp_path / "rules.tsv"),
        minloglevel=2, num_threads=1)
    tiny_spm.hf_tokenizer(tmp_path).save_pretrained(str(tmp_path))
    good = tiny_spm.vocab_gguf(tmp_path, tmp_path / "good.gguf")
    cm = bytes(int(x[0]) for x in (lambda f: [f.parts[i] for i in f.data])(
        gguf.GGUFReader(str(good)).fields["tokenizer.ggml.precompiled_charsmap"]))
    trie = int.from_bytes(cm[:4], "little")
    strings = cm[4 + trie:]
    at = strings.index(b"a\x00")
    assert at == 0 or strings[at - 1] == 0, "the replacement 'a' must be a whole string"
    patched = cm[:4 + trie] + strings[:at] + b"\xff" + strings[at + 1:]
    bad = _rewrite(good, tmp_path / "bad.gguf",
                   replace={"tokenizer.ggml.precompiled_charsmap": patched})
    none = _rewrite(good, tmp_path / "none.gguf", drop=("tokenizer.ggml.precompiled_charsmap",))
    kg, kb, kn = (Tokenizer(str(p)) for p in (good, bad, none))
    assert kg.encode("A") == kg.encode("a") != kn.encode("A")
    # written, the byte would also stop the collapse of "  " (its regex refuses such a text)
    for text in ["A  b   A", "ABC", "x A\u3000y  z"]:
        assert kb.encode(text) == kn.encode(text), repr(text)
