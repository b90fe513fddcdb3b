"""Tiny random BERT checkpoints saved by transformers, the oracle models of the encoder tests, and
the child-process side of their runs on each kernel path (KWKER_ISA is read once per process).

Each spec becomes a folder under the test cache ($KWK_TEST_CACHE or /tmp/kwker-test-models),
keyed by a hash of the spec and of BUILDER_VERSION, written under a temporary name and renamed
into place (as tiny_models.py does): config.json + model.safetensors from BertModel (or
BertForMaskedLM, whose tensors carry a "bert." prefix and an MLM head; RoBERTa's classes too),
the all-MiniLM-L6-v2 tokenizer files from the shared data beside them (so the vocabulary is the
tokenizer's 30522, or larger: padded rows no text reaches), and, when the spec says,
sentence-transformers' files (modules.json with or without a Normalize module,
1_Pooling/config.json).

Weights: torch.manual_seed(spec seed), every matrix redrawn from N(0, 1/fan_in), the word,
position and token-type embeddings from N(0, 1) (so a wrong position or token-type row shows),
LayerNorm weights from 1 + N(0, 0.2) and every bias from N(0, 0.2): transformers' own init
leaves norms at 1 and biases at 0, which would hide an encoder that ignores them.
"""
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

BUILDER_VERSION = 1

# name -> spec: hidden, heads, layers, inter, act (hidden_act), types (type_vocab_size), max_pos,
# eps (layer_norm_eps), seed, vocab (default: the tokenizer's 30522), cls (the transformers class
# saved), config (its config class, default BertConfig; RoBERTa's count positions from pad + 1),
# pad (pad_token_id, default 0), st (None: no sentence-transformers files; else
# dict(pool=mean|cls|max|mean_sqrt_len|lasttoken, normalize=bool)).
# Cross-encoders (cls *ForSequenceClassification) add labels (num_labels), id2label (config.json's
# label names; default transformers' LABEL_i), ce_act (sentence-transformers' CrossEncoder
# activation_fn, written to config.json as sentence_transformers.activation_fn, as its save
# does; default none: sigmoid for one label, the logits for more) and post (None: the BERT
# tokenizer's own pair form [CLS] a [SEP] b [SEP], token types 0 / 1; "roberta": its
# tokenizer.json's post-processor replaced by a RobertaProcessing, [CLS] a [SEP] [SEP] b [SEP]
# with token types all 0, "template": a TemplateProcessing of that same pair form; both with
# tokenizer_class PreTrainedTokenizerFast, which follows tokenizer.json, where transformers'
# BertTokenizer would rebuild BERT's pair form). tok="spm": tiny_spm's SentencePiece unigram
# tokenizer (XLM-R's shape: sentencepiece.bpe.model beside its tokenizer.json) instead of
# MiniLM's, the vocabulary its size.
SPECS = {
    "bert_gelu": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=2,
                      max_pos=128, eps=1e-12, seed=21),
    "bert_gelu_new": dict(hidden=96, heads=6, layers=3, inter=200, act="gelu_new", types=1,
                          max_pos=64, eps=1e-12, seed=22, vocab=30600),
    "bert_h8": dict(hidden=128, heads=8, layers=2, inter=256, act="gelu", types=2, max_pos=512,
                    eps=1e-12, seed=23),
    "bert_mlm": dict(hidden=64, heads=2, layers=2, inter=96, act="gelu", types=2, max_pos=96,
                     eps=1e-5, seed=24, cls="BertForMaskedLM"),
    "st_mean_norm": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=2,
                         max_pos=128, eps=1e-12, seed=25, st=dict(pool="mean", normalize=True)),
    "st_mean": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=2, max_pos=128,
                    eps=1e-12, seed=25, st=dict(pool="mean", normalize=False)),
    "st_cls": dict(hidden=48, heads=3, layers=2, inter=96, act="gelu_new", types=2, max_pos=64,
                   eps=1e-12, seed=26, st=dict(pool="cls", normalize=False)),
    "st_max_norm": dict(hidden=64, heads=4, layers=1, inter=128, act="gelu", types=1,
                        max_pos=64, eps=1e-12, seed=27, st=dict(pool="max", normalize=True)),
    "st_sqrt": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=2, max_pos=64,
                    eps=1e-12, seed=28, st=dict(pool="mean_sqrt_len", normalize=False)),
    "st_last_norm": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=2,
                         max_pos=64, eps=1e-12, seed=29, st=dict(pool="lasttoken",
                                                                 normalize=True)),
    "xlmr_mean_norm": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=1,
                           max_pos=66, eps=1e-5, seed=30, config="XLMRobertaConfig",
                           cls="XLMRobertaModel", pad=1, st=dict(pool="mean", normalize=True)),
    "roberta_mlm": dict(hidden=48, heads=2, layers=2, inter=96, act="gelu", types=1,
                        max_pos=80, eps=1e-5, seed=31, config="RobertaConfig",
                        cls="RobertaForMaskedLM", pad=1),
    "ce_bert1": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=2, max_pos=128,
                     eps=1e-12, seed=40, cls="BertForSequenceClassification", labels=1),
    "ce_bert3": dict(hidden=48, heads=3, layers=2, inter=96, act="gelu_new", types=2,
                     max_pos=96, eps=1e-12, seed=41, cls="BertForSequenceClassification",
                     labels=3, id2label={"0": "contradiction", "1": "entailment",
                                         "2": "neutral"}),
    "ce_bert1_identity": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=2,
                              max_pos=64, eps=1e-12, seed=42,
                              cls="BertForSequenceClassification", labels=1,
                              ce_act="torch.nn.modules.linear.Identity"),
    "ce_roberta1": dict(hidden=48, heads=2, layers=2, inter=96, act="gelu", types=1,
                        max_pos=80, eps=1e-5, seed=43, config="RobertaConfig",
                        cls="RobertaForSequenceClassification", pad=1, labels=1,
                        post="roberta"),
    "xlmr_spm_mean": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=1,
                          max_pos=66, eps=1e-5, seed=32, config="XLMRobertaConfig",
                          cls="XLMRobertaModel", pad=1, tok="spm",
                          st=dict(pool="mean", normalize=True)),
    "ce_xlmr_spm": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=1,
                        max_pos=66, eps=1e-5, seed=45, config="XLMRobertaConfig",
                        cls="XLMRobertaForSequenceClassification", pad=1, labels=1, tok="spm"),
    "ce_xlmr1": dict(hidden=64, heads=4, layers=2, inter=128, act="gelu", types=1, max_pos=66,
                     eps=1e-5, seed=44, config="XLMRobertaConfig",
                     cls="XLMRobertaForSequenceClassification", pad=1, labels=1,
                     post="template"),
}

# The cross-encoders among SPECS.
CROSS_ENCODERS = [n for n, sp in SPECS.items() if sp.get("cls", "").endswith(
    "ForSequenceClassification")]


def max_tokens(spec):
    """Tokens a sequence of spec's model may hold: its positions, less RoBERTa's pad + 1 rows."""
    return spec["max_pos"] - (spec["pad"] + 1 if spec.get("config", "BertConfig") != "BertConfig"
                              else 0)

def vocab_size(name):
    """The vocabulary of SPECS[name]'s model: its tokenizer's (or the spec's vocab)."""
    spec = SPECS[name]
    if spec.get("tok") == "spm":
        import tiny_spm
        return tiny_spm.n_vocab(tiny_spm.spm_dir())
    return spec.get("vocab", TOKENIZER_VOCAB)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt")
TOKENIZER_VOCAB = 30522

# What a folder without sentence-transformers files pools with (kwker.h, kwk_model_info: the
# first token's state, normalized, vLLM's default for BERT).
DEFAULT_POOLING = ("cls", True)

TEXTS = [
    "why is the sky blue?",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Naïve café owners in Zürich — ŒUVRE, 東京, ελληνικά, 🙂 and déjà vu.",
    "a",
]


def cache_root():
    root = Path(os.environ.get("KWK_TEST_CACHE") or "/tmp/kwker-test-models")
    root.mkdir(parents=True, exist_ok=True)
    return root


def tokenizer_dir():
    from conftest import SHARED_DATA
    d = SHARED_DATA / "tokenizers" / "bert-uncased" / "all-MiniLM-L6-v2"
    assert (d / "tokenizer.json").is_file(), "shared tokenizer missing: %s" % d
    return d


def spec_key(name):
    blob = json.dumps({"v": BUILDER_VERSION, "name": name, "spec": SPECS[name]}, sort_keys=True)
    return "enc-%s-%s" % (name, hashlib.sha256(blob.encode()).hexdigest()[:12])


def pooling_of(name):
    """(pooling name, normalize) the folder of a spec asks for."""
    st = SPECS[name].get("st")
    if not st:
        return DEFAULT_POOLING
    pool = "last" if st["pool"] == "lasttoken" else st["pool"]
    return pool, bool(st["normalize"])


def _randomize(model):
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                if "embeddings" in name:
                    p.normal_(0.0, 1.0)
                else:
                    p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
            elif "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))


def write_st_files(folder, pool, normalize, dim):
    """sentence-transformers' modules.json (Transformer, Pooling, and Normalize when asked)
    and 1_Pooling/config.json with one pooling mode set."""
    folder = Path(folder)
    mods = [{"idx": 0, "name": "0", "path": "",
             "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        mods.append({"idx": 2, "name": "2", "path": "2_Normalize",
                     "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(mods, indent=2))
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
             "weightedmean_tokens", "lasttoken")
    key = {"mean": "mean_tokens", "cls": "cls_token", "max": "max_tokens",
           "mean_sqrt_len": "mean_sqrt_len_tokens", "lasttoken": "lasttoken"}[pool]
    cfg = {"word_embedding_dimension": dim}
    cfg.update({"pooling_mode_" + m: m == key for m in modes})
    cfg["include_prompt"] = True
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False}))


def write_pair_form(folder, post):
    """Replace the BERT tokenizer's pair form in folder (spec "post"): "roberta" writes a
    RobertaProcessing, "template" a TemplateProcessing, both [CLS] a [SEP] [SEP] b [SEP] with
    every token type 0 (RoBERTa's and XLM-R's form, over the BERT vocabulary), and
    tokenizer_config.json's class becomes PreTrainedTokenizerFast so that transformers follows
    tokenizer.json (its BertTokenizer builds BERT's own pair form instead)."""
    folder = Path(folder)
    tj = json.loads((folder / "tokenizer.json").read_text())
    if post == "roberta":
        tj["post_processor"] = {"type": "RobertaProcessing", "sep": ["[SEP]", 102],
                                "cls": ["[CLS]", 101], "trim_offsets": True,
                                "add_prefix_space": False}
    elif post == "template":
        def special(t):
            return {"SpecialToken": {"id": t, "type_id": 0}}

        def seq(t):
            return {"Sequence": {"id": t, "type_id": 0}}
        pp = tj["post_processor"]
        assert pp["type"] == "TemplateProcessing", pp["type"]
        pp["pair"] = [special("[CLS]"), seq("A"), special("[SEP]"), special("[SEP]"), seq("B"),
                      special("[SEP]")]
    else:
        raise ValueError("post must be 'roberta' or 'template', not %r" % (post,))
    (folder / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))


def build(name, root=None):
    """Path of the folder for SPECS[name], building it when missing."""
    spec = SPECS[name]
    root = cache_root() if root is None else Path(root)
    out = root / spec_key(name)
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    torch.manual_seed(spec["seed"])
    tok_dir, tok_files = tokenizer_dir(), TOKENIZER_FILES
    if spec.get("tok") == "spm":
        import tiny_spm
        tok_dir = tiny_spm.spm_dir()
        tok_files = [f.name for f in tok_dir.iterdir() if f.is_file()]
    vocab = vocab_size(name)
    cfg = getattr(transformers, spec.get("config", "BertConfig"))(
        vocab_size=vocab, hidden_size=spec["hidden"],
        num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
        intermediate_size=spec["inter"], hidden_act=spec["act"],
        max_position_embeddings=spec["max_pos"], type_vocab_size=spec["types"],
        layer_norm_eps=spec["eps"], pad_token_id=spec.get("pad", 0))
    if "labels" in spec:
        cfg.num_labels = spec["labels"]
        if spec.get("id2label"):
            cfg.id2label = {int(k): v for k, v in spec["id2label"].items()}
            cfg.label2id = {v: int(k) for k, v in spec["id2label"].items()}
    model_cls = getattr(transformers, spec.get("cls", "BertModel"))
    model = model_cls(cfg).to(torch.float32).eval()
    _randomize(model)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + name, dir=root))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        for f in tok_files:
            shutil.copyfile(tok_dir / f, tmp / f)
        if spec.get("post"):
            write_pair_form(tmp, spec["post"])
        if spec.get("ce_act"):
            cfg_path = tmp / "config.json"
            saved = json.loads(cfg_path.read_text())
            saved["sentence_transformers"] = {"activation_fn": spec["ce_act"],
                                              "version": "4.1.0"}
            cfg_path.write_text(json.dumps(saved, indent=2))
        if spec.get("st"):
            write_st_files(tmp, spec["st"]["pool"], spec["st"]["normalize"], spec["hidden"])
        (tmp / "kwk_spec.json").write_text(json.dumps({"name": name, "spec": spec}, indent=2))
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# -- the reference: transformers' float32 states, sentence-transformers' pooling ---------------

def load_hf(path):
    """transformers' BertModel of a folder (float32, eager attention, eval mode); a
    BertForMaskedLM folder gives its "bert." encoder."""
    import torch
    from transformers import AutoModel
    from tiny_models import torch_single_thread
    torch_single_thread()
    return AutoModel.from_pretrained(str(path), dtype=torch.float32,
                                     attn_implementation="eager").eval()


def hf_states(model, ids):
    """float32 last_hidden_state [n, hidden] of one sequence alone (no padding; token types 0)."""
    import torch
    with torch.no_grad():
        t = torch.tensor([list(ids)], dtype=torch.long)
        out = model(input_ids=t, attention_mask=torch.ones_like(t),
                    token_type_ids=torch.zeros_like(t))
    return out.last_hidden_state[0].float().numpy()


def pool(states, mode, normalize):
    """sentence-transformers' Pooling (one unpadded sequence) then Normalize, in float64:
    mean = sum / n; cls = the first row; last(token) = the last row; max = element-wise max;
    mean_sqrt_len = sum / sqrt(n); Normalize divides by max(||x||_2, 1e-12) (F.normalize)."""
    import numpy as np
    s = np.asarray(states, dtype=np.float64)
    n = s.shape[0]
    if mode == "mean":
        v = s.sum(0) / max(n, 1e-9)
    elif mode == "cls":
        v = s[0]
    elif mode in ("last", "lasttoken"):
        v = s[-1]
    elif mode == "max":
        v = s.max(0)
    elif mode == "mean_sqrt_len":
        v = s.sum(0) / np.sqrt(n)
    else:
        raise ValueError(mode)
    if normalize:
        v = v / max(np.linalg.norm(v), 1e-12)
    return v


def hf_tokenize(path, text, **kw):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path))
    return tok(text, **kw)["input_ids"]


# -- the child process: kwker on one kernel path -------------------------------------------------

def run_cases(job_path, out_path, load, op, **meta):
    """The child-process loop of a kernel-path run: for each case of the job file {cases: [{key,
    model, ops: [[name, kind, arg]]}]}, model = load(case, meta) (kwker's model, which may set
    meta entries), then op(model, kind, arg) of each op saved as key|name in the .npz out_path,
    a traceback per failed load or op in meta["errors"], the library's ISA in meta["isa"] (a
    library that does not load: meta["setup_error"], nothing run), meta as JSON in __meta__.
    meta: further entries to start with (props: {})."""
    import traceback
    import numpy as np
    job = json.loads(Path(job_path).read_text())
    arrays, meta = {}, dict({"errors": {}}, **meta)
    meta.update(isa=None, setup_error=None)

    def save():
        arrays["__meta__"] = np.array(json.dumps(meta))
        np.savez(out_path, **arrays)

    try:
        import ctypes
        import kwker  # noqa: F401  (loads the library: a failure is the setup error)
        from kwker import _lib
        L = _lib.lib()
        L.kwk_isa.restype = ctypes.c_int
        L.kwk_isa_name.restype = ctypes.c_char_p
        L.kwk_isa_name.argtypes = [ctypes.c_int]
        meta["isa"] = L.kwk_isa_name(L.kwk_isa()).decode()
    except BaseException:
        meta["setup_error"] = traceback.format_exc()[-6000:]
        save()
        return
    for c in job["cases"]:
        key = c["key"]
        errs = meta["errors"][key] = {}
        print("case %s: load" % key, flush=True)  # locates a crash
        try:
            model = load(c, meta)
        except Exception:
            errs["load"] = traceback.format_exc()[-3000:]
            continue
        for name, kind, arg in c["ops"]:
            print("case %s: %s" % (key, name), flush=True)
            try:
                arrays[key + "|" + name] = op(model, kind, arg)
            except Exception:
                errs[name] = traceback.format_exc()[-3000:]
        model.close()
    save()


def _load_encoder(c, meta):
    import kwker
    enc = kwker.Encoder(c["model"], **c.get("enc", {}))
    meta["props"][c["key"]] = {"dim": enc.dim, "max_tokens": enc.max_tokens,
                               "pooling": enc.pooling, "normalize": enc.normalize}
    return enc


def _encoder_op(enc, kind, arg):
    import numpy as np
    if kind == "states":
        return enc.states(arg)
    if kind == "embed":
        return enc.embed(arg)
    if kind == "tokenize":
        return np.asarray(enc.tokenize(arg), dtype=np.int64)
    raise ValueError(kind)


def kwk_worker(job_path, out_path):
    """Run each case's ops through kwker.Encoder in this process (its KWKER_ISA) and save every
    result as key|op in an .npz, with errors (a traceback per failed op) and the encoder's
    properties in __meta__ (run_cases). A case: {key, model, enc: Encoder kwargs, ops: [[name,
    kind, arg]]}, kind "states" (arg: ids), "embed" (arg: a list of id lists or strings),
    "tokenize" (arg: text)."""
    run_cases(job_path, out_path, _load_encoder, _encoder_op, props={})


class EncRunner:
    """Runs cases in child processes with a kernel path set (module.kwk_worker: this module's
    for encoder cases), memoized per (isa, cases)."""

    def __init__(self, tmpdir, module="tiny_encoders", what="kwker encoder worker"):
        self.tmpdir = Path(tmpdir)
        self.module, self.what = module, what
        self.memo = {}

    def run(self, cases, isa=None, timeout=900):
        import numpy as np
        from conftest import run_worker
        memo_key = (isa, json.dumps(cases, sort_keys=True))
        if memo_key in self.memo:
            return self.memo[memo_key]
        out = run_worker(self.tmpdir, self.module, {"cases": cases}, isa, timeout, self.what)
        res = {"_arrays": {}}
        with np.load(out, allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            for k in z.files:
                if k != "__meta__":
                    res["_arrays"][k] = z[k]
        res["_meta"] = meta
        self.memo[memo_key] = res
        return res


def check_close(got, ref, what, tol, err, scale_name, scale):
    """got is float32, of ref's shape, finite, and err(got, ref) <= tol (the message names the
    error's scale: scale_name, scale(ref)). Returns the error."""
    import numpy as np
    got = np.asarray(got)
    assert got.dtype == np.float32, "%s: dtype %s" % (what, got.dtype)
    assert got.shape == np.shape(ref), "%s: shape %s, reference %s" % (what, got.shape,
                                                                      np.shape(ref))
    assert np.isfinite(got).all(), "%s: non-finite values" % what
    e = err(got, ref)
    assert e <= tol, "%s: max|kwker - transformers| = %.3g of %s (%.3g), over %.0e" % (
        what, e, scale_name, float(scale(ref)), tol)
    return e


def _alnum(s):
    return "".join(ch for ch in (s or "").lower() if ch.isalnum())


def result(res, key, op, isa):
    """The array of op of case key in an EncRunner result, failing the test (with the child's
    traceback) where the library did not load, chose another kernel path than isa, or the op
    failed."""
    import pytest
    meta = res["_meta"]
    if meta.get("setup_error"):
        pytest.fail("kwker could not be loaded (KWKER_ISA=%s):\n%s" % (isa, meta["setup_error"]))
    assert _alnum(meta["isa"]) == _alnum(isa), \
        "KWKER_ISA=%s but the library chose %r" % (isa, meta["isa"])
    errs = meta["errors"].get(key, {})
    for e in ("load", op):
        if e in errs:
            pytest.fail("%s [%s] %s failed:\n%s" % (key, isa, e, errs[e]))
    arr = res["_arrays"].get(key + "|" + op)
    assert arr is not None, "%s [%s]: no result for %s" % (key, isa, op)
    return arr


if __name__ == "__main__":
    import sys
    for n in sys.argv[1:] or list(SPECS):
        print(n, build(n))
