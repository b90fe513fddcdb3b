#!/usr/bin/env python3
"""rerank_side_by_side.py - Kwker's cross-encoders (kwker.Reranker) beside llama.cpp's rank
models: one query scored against many documents with the same weights, threads and machine.

  python3 bench/rerank_side_by_side.py [--models msmarco-minilm-random,bert-base-random]
      [--runs 5] [-t 2] [--pairs preserve:f32,preserve:f16,balanced:q8_0,int4:q4_0]
      [--workloads batch,request,long] [--work-dir .cache/bench-models/rerank]
      [--llama-batch batch=512,request=512,long=512] [--llama-flash-attn on|off] [--nice -10]
      [--kwker-batch-size 32] [--probe-mib 256|0] [--json FILE] [--quick]

Models (random weights: transformers' initialization, seed 1, BertForSequenceClassification
with one label; all-MiniLM-L6-v2's WordPiece tokenizer beside them, as embed_side_by_side's
random model has; made once into the work dir): `msmarco-minilm-random` is in the shape of
cross-encoder/ms-marco-MiniLM-L-6-v2 (384 wide, 6 layers of 12 heads, 1536 in the MLP, 30522
tokens, 512 positions); `bert-base-random` is a BERT-base reranker (768, 12 layers of 12 heads,
3072, 30522 tokens). bge-reranker-base is an XLM-RoBERTa of the second size with a 250k
SentencePiece vocabulary, whose tokenizer Kwker's GGUF loader does not read: hence BERT's
shape and vocabulary. `tiny-random` (128 wide, 2 layers) is --quick's.

GGUF: an F32 rank GGUF written as llama.cpp's converter writes a BERT reranker
(tests/python/gguf_export.py export_rank: pooling_type RANK, classifier -> cls.output), except
that BERT's pooler (dense + tanh on [CLS]) is written as `cls`: the converter drops it (its BERT
is "only for embeddings"), which would leave llama.cpp a matrix less of work than Kwker and
other scores; with it both sides compute transformers' logits. F16, Q8_0 and Q4_0 come from the
F32 file by llama.cpp's own quantizer (bench/make_gguf.py). Kwker loads the Hugging Face folder
(the same F32 numbers): preserve runs them as they are, balanced / int4 pack them at load.

Workloads (texts cut from the wikitext-2 test rows as embed_side_by_side cuts them, token counts
by the WordPiece tokenizer without special tokens): a 16-token query and `batch` 100 documents
of 128 tokens in one call (ms a request, pairs/s), `request` 20 such documents (median ms of
--request-reps calls a run), `long` 16 documents of 490 tokens (a pair fits 512 positions).
Each side takes the strings and tokenizes them itself, timed: Kwker as Hugging Face's
tokenizer(query, doc) does ([CLS] q [SEP] d [SEP], token types 0 then 1), llama.cpp as its
server's rerank does (format_rerank: [BOS] q [EOS] [SEP] d [EOS] by the vocabulary's add_bos /
add_eos / add_sep flags: for BERT [CLS] q [SEP] d, one token less a pair, and every token of
type 0, the only type llama.cpp's BERT graph adds).

Runs: every side of every pair is a fresh process (`--worker`): the model loaded, one untimed
warm-up of each workload's shape (the query and two documents), then the timed workloads. Rounds
alternate the sides (K L L K ...) as embed_side_by_side's do; --runs rounds; medians, ratios
(llama.cpp's ms over Kwker's: above 1 Kwker is faster), peak RSS (VmHWM), the read-bandwidth
probe (bench/bw_probe) between runs and the CPU time stolen during each.

The check (untimed, after the rounds): Kwker's logits of llama.cpp's own token ids with llama.cpp's
token types (all 0; kwker.Reranker.logits) against llama.cpp's logits of them: max |difference|
over every pair of every workload, and each side's against Kwker preserve's logits of those ids
(transformers' float32 numbers). llama.cpp computes BERT's GELU in tanh form, so F32 agrees to
~1e-3 of the logits, not exactly.

llama.cpp side: llama-cpp-python's Llama(embedding=True, pooling_type=RANK, n_ctx = n_batch =
n_ubatch = --llama-batch, flash attention on as embed_side_by_side chose it), its tokenizer
(Llama.tokenize(..., add_bos=False, special=False)), and the low-level API: sequences packed
into a llama_batch of at most n_batch tokens and n_seq_max sequences (whole sequences: a BERT
batch is one ubatch), llama_encode, llama_get_embeddings_seq (n_cls_out floats a sequence).
Kwker side: kwker.Reranker(folder, precision, threads=t).predict(pairs, batch_size=
--kwker-batch-size, activation=False).
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import embed_side_by_side as esbs  # noqa: E402  (texts, configurations, formats, helpers)
import side_by_side as sbs  # noqa: E402  (probe, cpu_ticks, steal_pct, run_child, vm_kib)

log = esbs.log
BERT = dict(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
            layer_norm_eps=1e-12, hidden_act="gelu", num_labels=1)
MODELS = {
    "msmarco-minilm-random": dict(BERT, hidden_size=384, num_hidden_layers=6,
                                  num_attention_heads=12, intermediate_size=1536),
    "bert-base-random": dict(BERT, hidden_size=768, num_hidden_layers=12,
                             num_attention_heads=12, intermediate_size=3072),
    "tiny-random": dict(BERT, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512),
}
DEFAULT_MODELS = "msmarco-minilm-random,bert-base-random"
BUILDER_VERSION = 1  # bump when the random models or their files change
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt")
DEFAULT_PAIRS = "preserve:f32,preserve:f16,balanced:q8_0,int4:q4_0"
QUERY_TOKENS = 16
# (documents, tokens a document) of each workload; one query each
WORKLOADS = {"batch": (100, 128), "request": (20, 128), "long": (16, 490)}
QUICK_WORKLOADS = {"batch": (8, 64), "request": (4, 64), "long": (2, 490)}


# --------------------------------------------------------------------------------------------
# Models and their GGUF files
# --------------------------------------------------------------------------------------------

def write_random_cross_encoder(minilm, shape, folder):
    """A BertForSequenceClassification (one label) in `shape` with transformers' random
    initialization (seed 1), float32 safetensors, MiniLM's tokenizer files beside it."""
    import torch
    import transformers
    torch.manual_seed(1)
    cfg = transformers.BertConfig(**shape)
    cfg.architectures = ["BertForSequenceClassification"]
    model = transformers.BertForSequenceClassification(cfg).eval()
    esbs.save_random_model(model, minilm, TOKENIZER_FILES, folder)


def model_files(name, a, formats):
    """{"hf": folder Kwker loads, f32/f16/q8_0/q4_0: rank GGUF paths}, built when missing or
    stale."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import gguf_export
    minilm = esbs.minilm_of(a, "tokenizer.json")
    out = Path(a.work_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    shape = MODELS[name]
    folder = sbs.fresh_checkpoint(out, {"version": BUILDER_VERSION, "config": shape},
                                  lambda f: write_random_cross_encoder(minilm, shape, f))
    return esbs.gguf_files(out, name, folder, lambda f, p: gguf_export.export_rank(
        f, p, "f32", pooler_as_cls=True), formats, a.threads)


def make_texts(tok, workloads, path):
    """{workload: {"query": text, "docs": [texts]}}, cut by embed_side_by_side.make_texts (which
    counts [CLS] and [SEP] in a text's tokens: 2 more asked here)."""
    want = {}
    for w, (n_docs, n_tokens) in workloads.items():
        want[w + ":query"] = (1, QUERY_TOKENS + 2)
        want[w] = (n_docs, n_tokens + 2)
    got = esbs.make_texts(tok, want, path)
    return {w: {"query": got[w + ":query"][0], "docs": got[w]} for w in workloads}


# --------------------------------------------------------------------------------------------
# One run (a fresh process)
# --------------------------------------------------------------------------------------------

class KwkerSide:
    def __init__(self, job):
        import kwker
        prec, act = esbs.KWKER_CONFIGS[job["config"]]
        self.rr = kwker.Reranker(job["hf"], precision=prec, threads=job["threads"],
                                 act_bits=act)
        self.batch_size = job["kwker_batch_size"]

    def score(self, query, docs, workload):
        return self.rr.predict([[query, d] for d in docs], batch_size=self.batch_size,
                               activation=False)

    def n_tokens(self, query, docs):
        return sum(len(self.rr.tokenize(query, d)[0]) for d in docs)

    def logits(self, seqs):
        """Logits of token-id sequences, token types all 0 (llama.cpp's)."""
        return self.rr.logits(seqs, [[0] * len(s) for s in seqs])[:, 0]

    def close(self):
        self.rr.close()


class LlamaSide:
    """llama.cpp through llama-cpp-python's low-level API: a context of pooling RANK per
    n_batch (made when a workload first needs it, the previous one freed first), the rerank
    prompt built as its server's format_rerank builds it, sequences packed into llama_encode
    calls."""

    def __init__(self, job):
        import llama_cpp
        self.L = llama_cpp
        self.job = job
        self.llm, self.batch, self.n_batch = None, None, None
        self.context(job["llama_batch"]["batch"])
        L = self.L
        vocab = L.llama_model_get_vocab(self.llm._model.model)
        self.add_bos = bool(L.llama_vocab_get_add_bos(vocab))
        self.add_eos = bool(L.llama_vocab_get_add_eos(vocab))
        self.add_sep = bool(L.llama_vocab_get_add_sep(vocab))
        self.bos, self.sep = L.llama_vocab_bos(vocab), L.llama_vocab_sep(vocab)
        eos = L.llama_vocab_eos(vocab)
        self.eos = self.sep if eos == L.LLAMA_TOKEN_NULL else eos  # the server's fallback
        self.n_cls_out = int(L.llama_model_n_cls_out(self.llm._model.model))

    def context(self, n_batch):
        if self.n_batch == n_batch:
            return
        self.free()
        L = self.L
        self.llm = L.Llama(model_path=self.job["gguf"], embedding=True,
                           n_threads=self.job["threads"], n_threads_batch=self.job["threads"],
                           n_ctx=n_batch, n_batch=n_batch, n_ubatch=n_batch,
                           pooling_type=L.LLAMA_POOLING_TYPE_RANK,
                           flash_attn=self.job["llama_flash_attn"] == "on", verbose=False)
        if self.llm.pooling_type() != L.LLAMA_POOLING_TYPE_RANK:
            raise SystemExit("%s: llama.cpp did not take pooling RANK" % self.job["gguf"])
        self.n_seq_max = self.llm.context_params.n_seq_max
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        # the arrays of the batch as numpy views, and each token's seq_id slot
        import numpy as np
        b = self.batch
        self.tok = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self.nsid = np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))
        self.out = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        self.sid = [b.seq_id[i] for i in range(n_batch)]
        self.n_batch = n_batch

    def free(self):
        if self.batch is not None:
            self.L.llama_batch_free(self.batch)
            self.batch = None
        if self.llm is not None:
            self.llm.close()
            self.llm = None
        self.n_batch = None

    def tokenize(self, text):
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def pair(self, q, d):
        """format_rerank's sequence: [BOS] q [EOS] [SEP] d [EOS], each by its flag."""
        return (([self.bos] if self.add_bos else []) + q + ([self.eos] if self.add_eos else [])
                + ([self.sep] if self.add_sep else []) + d
                + ([self.eos] if self.add_eos else []))

    def seqs(self, query, docs):
        q = self.tokenize(query)
        return [self.pair(q, self.tokenize(d)) for d in docs]

    def encode(self, group, out):
        import numpy as np
        n = 0
        for s, seq in enumerate(group):
            k = len(seq)
            self.tok[n:n + k] = seq
            self.pos[n:n + k] = np.arange(k)
            for i in range(n, n + k):
                self.sid[i][0] = s
            n += k
        self.nsid[:n] = 1
        self.out[:n] = 1  # pooled outputs read every token's state
        self.batch.n_tokens = n
        ctx = self.llm._ctx.ctx
        rc = self.L.llama_encode(ctx, self.batch)
        if rc != 0:
            raise RuntimeError("llama_encode failed: %d" % rc)
        for s in range(len(group)):
            out.append(self.L.llama_get_embeddings_seq(ctx, s)[:self.n_cls_out])

    def logits(self, seqs):
        """First logits of each sequence, whole sequences packed into batches of at most
        n_batch tokens and n_seq_max sequences."""
        import numpy as np
        out, group, used = [], [], 0
        for seq in seqs:
            if len(seq) > self.n_batch:
                raise ValueError("a pair of %d tokens exceeds n_batch %d" % (len(seq),
                                                                           self.n_batch))
            if group and (used + len(seq) > self.n_batch or len(group) >= self.n_seq_max):
                self.encode(group, out)
                group, used = [], 0
            group.append(seq)
            used += len(seq)
        if group:
            self.encode(group, out)
        return np.asarray(out, dtype=np.float32)[:, 0]

    def score(self, query, docs, workload):
        self.context(self.job["llama_batch"][workload])
        return self.logits(self.seqs(query, docs))

    def n_tokens(self, query, docs):
        return sum(len(s) for s in self.seqs(query, docs))

    def close(self):
        self.free()


def worker(job):
    """One run of one side: load, warm up each workload's shape once, time the workloads.
    Prints a JSON line. With job["save"] also writes each workload's logits (and llama.cpp's
    token ids) to an npz. job["check"]: no timing; Kwker's logits of the token ids in that npz
    (types 0), written to job["save"]."""
    import numpy as np
    side, base_kib, load_s = esbs.load_side(job, KwkerSide, LlamaSide)
    if job.get("check"):
        ids = np.load(job["check"])
        got = {}
        for w in job["workloads"]:
            flat, offs = ids[w + ":ids"], ids[w + ":offs"]
            got[w] = side.logits([flat[offs[i]:offs[i + 1]].tolist()
                                  for i in range(len(offs) - 1)])
        np.savez(job["save"], **got)
        side.close()
        print(json.dumps({"load_s": load_s}))
        return 0
    texts = json.loads(Path(job["texts"]).read_text())
    res = {"load_s": load_s, "base_rss_kib": base_kib, "workloads": {}}
    saved = {}
    for w in job["workloads"]:
        q, docs = texts[w]["query"], texts[w]["docs"]
        side.score(q, docs[:2], w)  # the shape's warm-up
        reps = job["request_reps"] if w == "request" else job["reps"]
        secs = []
        for _ in range(reps):
            t1 = time.perf_counter()
            scores = side.score(q, docs, w)
            secs.append(time.perf_counter() - t1)
        r = {"n_docs": len(docs), "all_seconds": secs, "seconds": statistics.median(secs),
             "n_tokens": side.n_tokens(q, docs)}
        r["ms"] = 1e3 * r["seconds"]
        r["pairs_per_s"] = len(docs) / r["seconds"]
        res["workloads"][w] = r
        saved[w] = np.asarray(scores, dtype=np.float32)
        if job["side"] == "llama":
            seqs = side.seqs(q, docs)
            saved[w + ":ids"] = np.asarray([t for s in seqs for t in s], dtype=np.int32)
            saved[w + ":offs"] = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    return esbs.finish_worker(job, side, res, saved, lambda side: {"format_rerank": {
        "add_bos": side.add_bos, "add_eos": side.add_eos, "add_sep": side.add_sep}})


def run_one(a, side, cfg, files, texts_path, save, check=None):
    return esbs.run_worker(a, __file__, side, cfg, files, texts_path, save, nice=not check,
                           request_reps=a.request_reps, check=str(check) if check else None,
                           kwker_batch_size=a.kwker_batch_size)


# --------------------------------------------------------------------------------------------
# Rounds, medians, the check
# --------------------------------------------------------------------------------------------

def summarize(runs, workloads):
    """Medians of one configuration's runs."""
    s = esbs.process_medians(runs)
    for w in workloads:
        rs = [r["workloads"][w] for r in runs]
        ms = statistics.median(x["ms"] for x in rs)
        s[w] = {"ms": ms, "ms_runs": [x["ms"] for x in rs], "n_docs": rs[0]["n_docs"],
                "pairs_per_s": 1e3 * rs[0]["n_docs"] / ms, "n_tokens": rs[0]["n_tokens"],
                "tok_per_s": 1e3 * rs[0]["n_tokens"] / ms}
    return s


def check(a, name, files, saved, scratch):
    """The same-token-ids check: {(kwker config, llama format): stats}. Each Kwker
    configuration (and preserve, the reference) scores llama.cpp's token ids in its own
    untimed process."""
    import numpy as np
    lfs = list(dict.fromkeys(lf for _, lf in a.pairs))
    ids_file = saved[("llama", lfs[0])]
    ids = np.load(ids_file)
    for lf in lfs[1:]:  # the same vocabulary in every file: the same ids
        other = np.load(saved[("llama", lf)])
        for w in a.workloads:
            if not np.array_equal(ids[w + ":ids"], other[w + ":ids"]):
                raise RuntimeError("%s: llama.cpp's %s tokenized %s differently" % (name, lf, w))
    kcs = list(dict.fromkeys(["preserve"] + [kc for kc, _ in a.pairs]))
    kw = {}
    for kc in kcs:
        out = scratch / ("%s-check-%s.npz" % (name, kc))
        run_one(a, "kwker", kc, files, None, out, check=ids_file)
        z = np.load(out)
        kw[kc] = np.concatenate([z[w] for w in a.workloads]).astype(np.float64)
    res = {}
    ref = kw["preserve"]
    for kc, lf in a.pairs:
        z = np.load(saved[("llama", lf)])
        ll = np.concatenate([z[w] for w in a.workloads]).astype(np.float64)
        k = kw[kc]
        d = np.abs(k - ll)
        res[(kc, lf)] = {"n_pairs": int(k.size), "max_abs_diff": float(d.max()),
                         "median_abs_diff": float(np.median(d)),
                         "max_abs_logit": float(np.abs(ref).max()),
                         "logit_spread": float(ref.max() - ref.min()),
                         "kwker_vs_ref": float(np.abs(k - ref).max()),
                         "llama_vs_ref": float(np.abs(ll - ref).max())}
    return res


def measure_model(a, name, texts_path, scratch):
    formats = sorted({lf for _, lf in a.pairs}, key=esbs.LLAMA_FORMATS.index)
    files = model_files(name, a, formats)
    runs, saved = esbs.rounds(a, name, files, texts_path, scratch, run_one, lambda wl: ", ".join(
        "%s %.1f ms" % (w, x["ms"]) for w, x in wl.items()))
    checks = check(a, name, files, saved, scratch)
    recs = []
    for kc, lf in a.pairs:
        k = summarize(runs[("kwker", kc)], a.workloads)
        l_ = summarize(runs[("llama", lf)], a.workloads)
        rec = {"model": name, "kwker": esbs.kwker_label(kc), "kwker_config": kc,
               "llama_format": lf, "kwker_file": str(files["hf"]), "llama_file": str(files[lf]),
               "kwker_summary": k, "llama_summary": l_,
               "runs": {"kwker": runs[("kwker", kc)], "llama": runs[("llama", lf)]},
               "ratio": {w: l_[w]["ms"] / k[w]["ms"] for w in a.workloads},
               "check": checks[(kc, lf)],
               "format_rerank": runs[("llama", lf)][0]["format_rerank"]}
        recs.append(rec)
    return recs


def markdown(recs, a, shape):
    head = ["model", "Kwker", "llama.cpp"]
    for w in a.workloads:
        n_docs, n_tok = shape[w]
        what = "1 × %d × %d tok" % (n_docs, n_tok)
        if w == "request":
            head += ["%s ms Kwker / llama.cpp" % what, "×"]
        else:
            head += ["%s ms Kwker / llama.cpp (pairs/s)" % what, "×"]
    head += ["peak RSS MiB Kwker / llama.cpp",
             "largest Δ logit Kwker vs llama.cpp, same ids (largest logit)",
             "largest Δ logit vs Kwker preserve, Kwker / llama.cpp"]
    lines = ["| " + " | ".join(head) + " |",
             "|---|---|---|" + "---:|" * (len(head) - 3)]
    fmt, sci = esbs.fmt, esbs.sci
    for r in recs:
        k, l_, c = r["kwker_summary"], r["llama_summary"], r["check"]
        row = [r["model"], r["kwker"], r["llama_format"].upper()]
        for w in a.workloads:
            nd = 2 if k[w]["ms"] < 100 else 0
            cell = "%s / %s" % (fmt(k[w]["ms"], nd), fmt(l_[w]["ms"], nd))
            if w != "request":
                cell += " (%s / %s)" % (fmt(k[w]["pairs_per_s"]), fmt(l_[w]["pairs_per_s"]))
            row += [cell, fmt(r["ratio"][w], 2)]
        row += ["%s / %s" % (fmt(k["peak_rss_mib"], 0), fmt(l_["peak_rss_mib"], 0)),
                "%s (%s)" % (sci(c["max_abs_diff"]), "%.2f" % c["max_abs_logit"]),
                "%s / %s" % (sci(c["kwker_vs_ref"]), sci(c["llama_vs_ref"]))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help="comma-separated: %s" % ", ".join(MODELS))
    ap.add_argument("--pairs", default=DEFAULT_PAIRS,
                    help="KWKER:LLAMA pairs; KWKER one of %s, LLAMA one of %s" % (
                        ", ".join(esbs.KWKER_CONFIGS), ", ".join(esbs.LLAMA_FORMATS)))
    ap.add_argument("--workloads", default="batch,request,long")
    ap.add_argument("--runs", type=int, default=5, help="rounds (runs of each configuration)")
    ap.add_argument("-t", dest="threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1,
                    help="timed calls of the batch / long workloads in a run (median)")
    ap.add_argument("--request-reps", type=int, default=5,
                    help="timed calls of the request workload in a run (median)")
    ap.add_argument("--work-dir", default=str(REPO / ".cache" / "bench-models" / "rerank"),
                    help="the random models, their GGUF files, texts and scores")
    ap.add_argument("--minilm", default=str(esbs.MINILM),
                    help="all-MiniLM-L6-v2's folder, for its tokenizer (default $KWK_MINILM, "
                         "else models/all-MiniLM-L6-v2)")
    ap.add_argument("--text", default=str(esbs.TEXT), help="the text the workloads are cut from")
    ap.add_argument("--kwker-lib", default=os.environ.get("KWKER_LIB"),
                    help="libkwker.so for the Kwker side (default $KWKER_LIB)")
    ap.add_argument("--kwker-batch-size", type=int, default=32,
                    help="kwker.Reranker.predict's batch_size (pairs a library call; 32 is its "
                         "default and CrossEncoder's)")
    ap.add_argument("--llama-batch", default="batch=512,request=512,long=512",
                    help="llama.cpp's n_batch = n_ubatch = n_ctx per workload (>= 512)")
    ap.add_argument("--llama-flash-attn", choices=("off", "on"), default="on")
    ap.add_argument("--nice", type=int, default=-10 if hasattr(os, "geteuid") and
                    os.geteuid() == 0 else 0,
                    help="the timed runs' niceness (default -10 as root, else 0)")
    esbs.add_probe_args(ap)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: tiny-random only, preserve:f32 and int4:q4_0, 2 runs, "
                         "small workloads")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return a
    if a.quick:
        a.runs, a.request_reps = min(a.runs, 2), min(a.request_reps, 2)
        if a.models == DEFAULT_MODELS:
            a.models = "tiny-random"
        if a.pairs == DEFAULT_PAIRS:
            a.pairs = "preserve:f32,int4:q4_0"
    a.pairs = esbs.parse_pairs(a.pairs)
    a.workloads = esbs.parse_workloads(a.workloads, WORKLOADS)
    a.llama_batch = esbs.parse_batches(a.llama_batch, WORKLOADS,
                                       "a pair of up to 512 tokens must fit one ubatch")
    a.models = [m for m in a.models.split(",") if m]
    for m in a.models:
        if m not in MODELS:
            raise SystemExit("unknown model %r (one of %s)" % (m, ", ".join(MODELS)))
    esbs.find_bw_probe(a)
    return a


def write_json(a, shape, recs):
    table = markdown(recs, a, shape)
    if a.json:
        out = {"settings": esbs.settings(a, shape, ("docs", "tokens"),
                                         {"request_reps": a.request_reps,
                                          "query_tokens": QUERY_TOKENS},
                                         {"kwker_batch_size": a.kwker_batch_size}),
               "results": recs, "markdown": table}
        Path(a.json).write_text(json.dumps(out, indent=1))
    return table


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(json.loads(a.worker))
    shape = QUICK_WORKLOADS if a.quick else WORKLOADS
    scratch, texts_path = esbs.prepare(a, "rerank-sbs-", make_texts, shape)
    recs = esbs.measure_all(a, measure_model, lambda recs: write_json(a, shape, recs),
                            texts_path, scratch)
    print(markdown(recs, a, shape))
    return 0


if __name__ == "__main__":
    sys.exit(main())
