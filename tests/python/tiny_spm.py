"""A small SentencePiece unigram tokenizer in XLM-R's shape, for the "t5" GGUF vocabulary tests.

spm_dir() trains one (sentencepiece, on War and Peace plus a few lines of other scripts, nmt_nfkc
normalization as XLM-R's) and saves beside its sentencepiece.bpe.model the tokenizer.json that
transformers' converter writes for such a model: the fairseq ids (<s> <pad> </s> <unk>, the
pieces one up, <mask> last), Precompiled, Strip(right), Replace(" {2,}", "▁"), Metaspace
"always", and XLM-R's pair form. That file is the oracle: it agrees with sentencepiece itself
on text without special tokens (test_tokenizer_ugm.py checks).

write_t5_vocab() writes a GGUF's tokenizer keys the way llama.cpp's converter does for an
XLM-R checkpoint that ships sentencepiece.bpe.model (its XLMRobertaModel class: the behaviour,
not its code): tokens realigned to the fairseq ids and padded with [PADn] to the config's
vocab_size, so <mask> is not in the file; types from sentencepiece; add_space_prefix and
remove_extra_whitespaces from the normalizer spec; the charsmap; gguf-py's SpecialVocab.
"""
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

SPM_VERSION = 1
TRAIN_CHARS = 300000
VOCAB = 3000
# The extra lines train pieces in other scripts and give the charsmap's rewrites something to
# do (ligatures, full-width forms, compatibility characters).
EXTRA = ["Grüße aus München, ﬁne café naïve", "日本語のテキストです。東京", "Привет мир",
         "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ", "x² ½ ℌ", "emoji 🙂 ok", "ελληνικά κείμενα"]
SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def _root():
    root = Path(os.environ.get("KWK_TEST_CACHE") or "/tmp/kwker-test-models")
    root.mkdir(parents=True, exist_ok=True)
    return root


def spm_dir(vocab=VOCAB, normalization="nmt_nfkc", add_dummy_prefix=True,
            remove_extra_whitespaces=True):
    """A folder with sentencepiece.bpe.model and its Hugging Face tokenizer files (cached)."""
    key = json.dumps([SPM_VERSION, vocab, normalization, add_dummy_prefix,
                      remove_extra_whitespaces])
    out = _root() / ("spm-" + hashlib.sha256(key.encode()).hexdigest()[:12])
    if (out / "tokenizer.json").is_file():
        return out
    import sentencepiece as spm
    from conftest import SHARED_DATA
    text = (SHARED_DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-spm", dir=_root()))
    try:
        train = tmp / "train.txt"
        train.write_text(text[:TRAIN_CHARS] + "\n" + "\n".join(EXTRA * 40), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(train), model_prefix=str(tmp / "sentencepiece.bpe"), vocab_size=vocab,
            model_type="unigram", character_coverage=0.9995, num_threads=1,
            normalization_rule_name=normalization, add_dummy_prefix=add_dummy_prefix,
            remove_extra_whitespaces=remove_extra_whitespaces, minloglevel=2)
        train.unlink()
        (tmp / "sentencepiece.bpe.vocab").unlink()
        hf_tokenizer(tmp).save_pretrained(str(tmp))
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "tokenizer.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _proto(folder):
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    m.ParseFromString((Path(folder) / "sentencepiece.bpe.model").read_bytes())
    return m


def hf_tokenizer(folder):
    """The PreTrainedTokenizerFast transformers' XLM-R converter makes of the folder's model."""
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors)
    from transformers import PreTrainedTokenizerFast
    m = _proto(folder)
    spec = m.normalizer_spec
    vocab = [(s, 0.0) for s in SPECIAL[:4]] + [(p.piece, p.score) for p in m.pieces[3:]] + \
        [("<mask>", 0.0)]
    tk = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    norm = []
    if spec.precompiled_charsmap:
        norm.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        norm += [normalizers.Strip(left=False, right=True),
                 normalizers.Replace(Regex(" {2,}"), "\u2581")]
    tk.normalizer = normalizers.Sequence(norm)
    scheme = "always" if spec.add_dummy_prefix else "never"
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    tk.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    tk.add_special_tokens([AddedToken(s, special=True) for s in SPECIAL])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", sep_token="</s>", pad_token="<pad>",
                                   cls_token="<s>", mask_token="<mask>")


def n_vocab(folder):
    """XLM-R's config vocab_size for the folder's model: its pieces, the fairseq offset, <mask>."""
    return len(_proto(folder).pieces) + 2


def write_t5_vocab(w, folder, vocab_size=None, add_flags=True):
    """Add the folder's tokenizer to gguf.GGUFWriter w as llama.cpp's converter does (above).
    add_flags=False leaves out add_space_prefix and remove_extra_whitespaces (their defaults
    then apply)."""
    import gguf
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(Path(folder) / "sentencepiece.bpe.model"))
    m = _proto(folder)
    n = vocab_size or n_vocab(folder)
    T = gguf.TokenType
    tokens = [b"[PAD%d]" % i for i in range(n)]
    scores = [-10000.0] * n
    types = [T.UNUSED] * n
    for i in range(sp.vocab_size()):
        ty = T.NORMAL
        if sp.IsUnknown(i):
            ty = T.UNKNOWN
        elif sp.IsControl(i):
            ty = T.CONTROL
        elif sp.IsUnused(i):
            ty = T.UNUSED
        elif sp.IsByte(i):
            ty = T.BYTE
        tokens[i] = sp.IdToPiece(i).encode("utf-8")
        scores[i] = sp.GetScore(i)
        types[i] = ty
    tokens = [b"<s>", b"<pad>", b"</s>", b"<unk>"] + tokens[3:-1]
    scores = [0.0] * 4 + scores[3:-1]
    types = [T.CONTROL, T.CONTROL, T.CONTROL, T.UNKNOWN] + types[3:-1]
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    if add_flags:
        w.add_add_space_prefix(m.normalizer_spec.add_dummy_prefix)
        w.add_remove_extra_whitespaces(m.normalizer_spec.remove_extra_whitespaces)
    if m.normalizer_spec.precompiled_charsmap:
        w.add_precompiled_charsmap(m.normalizer_spec.precompiled_charsmap)
    gguf.SpecialVocab(Path(folder), n_vocab=len(tokens)).add_to_gguf(w, quiet=True)


def vocab_gguf(folder, out_path, **kw):
    """A vocabulary-only GGUF of the folder's tokenizer (architecture "bert", as XLM-R's)."""
    import gguf
    w = gguf.GGUFWriter(str(out_path), "bert")
    write_t5_vocab(w, folder, **kw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_path
