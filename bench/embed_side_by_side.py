#!/usr/bin/env python3
"""embed_side_by_side.py - Kwker's BERT encoders beside llama.cpp's, embeddings of the same texts
with the same weights, threads and machine.

  python3 bench/embed_side_by_side.py [--models minilm,bge-base-random] [--runs 5] [-t 2]
      [--pairs preserve:f32,preserve:f16,balanced:q8_0,balanced8:q8_0,int4:q4_0]
      [--workloads throughput,query,long] [--work-dir .cache/bench-models/embed]
      [--llama-batch throughput=512,query=512,long=512] [--llama-flash-attn on|off] [--nice -10]
      [--kwker-batch-tokens 2048] [--probe-mib 256|0] [--json FILE] [--quick]

Models: `minilm` is the real all-MiniLM-L6-v2 (models/all-MiniLM-L6-v2, fetched by `scripts/setup
--test`; --minilm PATH overrides); `bge-base-random` is a BERT in bge-base-en-v1.5's shape (768
wide, 12 layers of 12 heads, 3072 in the MLP, 30522 tokens, 512 positions) with transformers'
random initialization (seed 1), MiniLM's tokenizer and mean pooling + Normalize beside it, made
once into the work dir. Each model is exported as llama.cpp lays out a BERT GGUF
(tests/python/gguf_export.py export_bert, F32), and llama.cpp's own quantizer makes F16, Q8_0 and
Q4_0 from that F32 file (bench/make_gguf.py). Kwker loads the Hugging Face folder (the same F32
numbers): preserve runs them as they are, balanced / int4 pack them at load.

Workloads (texts cut from the wikitext-2 test rows, by the model's own WordPiece tokenizer, [CLS]
and [SEP] counted): `throughput` embeds 64 texts of 128 tokens in one call (embeddings/s,
tokens/s); `query` embeds 32 queries of 12 tokens one call each (median ms a call); `long` embeds
16 texts of 500 tokens in one call. Both sides take the strings (their own tokenizers, timed).

Runs: every side of every pair is a fresh process (`--worker`): the model loaded, one untimed
warm-up of each workload's shape, then the timed workloads. A round runs each configuration once,
Kwker's and llama.cpp's alternating (K L L K K L ...); --runs rounds; medians per configuration,
ratios Kwker / llama.cpp of the medians, peak RSS (VmHWM) of each process, the read-bandwidth
probe (bench/bw_probe) between runs and the CPU time the hypervisor stole during each. The check:
cosine between Kwker's and llama.cpp's embeddings of every text at matched bits, and of every
configuration against Kwker preserve (transformers' float32 numbers).

llama.cpp side: llama-cpp-python's Llama(embedding=True, pooling_type=MEAN, n_threads=n_threads_
batch=threads) and its embed(list, normalize=True). embed() packs whole sequences into one
llama_decode of at most n_batch tokens and n_seq_max (= min(n_batch, 256)) sequences; a BERT's
batch is encoded in one ubatch (n_ubatch = n_batch), every token attending over the whole batch
under a mask, so its attention grows with the square of the batch: --llama-batch sets n_batch =
n_ubatch = n_ctx per workload (docs/benchmarks.md, session 46, has the sweep that chose the
defaults). Kwker side: kwker.Encoder(threads=t, batch_tokens=--kwker-batch-tokens,
max_tokens=512: the positions, as llama.cpp).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import llamacpp  # noqa: E402
import side_by_side as sbs  # noqa: E402  (probe, cpu_ticks, steal_pct, run_child, vm_kib)

MINILM = Path(os.environ.get("KWK_MINILM") or REPO / "models" / "all-MiniLM-L6-v2")
TEXT = llamacpp.SHARED_DATA / "text" / "wikitext-2-raw-v1.test.hf-rows-crlf.txt"
BGE_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, vocab_size=30522, max_position_embeddings=512,
                type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")
BUILDER_VERSION = 1  # bump when the random model or its files change
# sentence-transformers' files copied beside the random model (its pooling: mean, Normalize)
ST_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "modules.json",
            "sentence_bert_config.json", "config_sentence_transformers.json")
# Kwker's configurations: (precision, act_bits); llama.cpp's: GGUF file types
KWKER_CONFIGS = {"preserve": ("preserve", 0), "balanced": ("balanced", 0),
                 "balanced8": ("balanced", 8), "int4": ("int4", 0), "int48": ("int4", 8)}
LLAMA_FORMATS = ("f32", "f16", "q8_0", "q4_0")
DEFAULT_PAIRS = "preserve:f32,preserve:f16,balanced:q8_0,balanced8:q8_0,int4:q4_0"
# (texts, tokens a text with [CLS] and [SEP]) of each workload
WORKLOADS = {"throughput": (64, 128), "query": (32, 12), "long": (16, 500)}
QUICK_WORKLOADS = {"throughput": (8, 64), "query": (4, 12), "long": (2, 500)}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def kwker_label(cfg):
    prec, act = KWKER_CONFIGS[cfg]
    return prec + (" act8" if act == 8 else "")


# --------------------------------------------------------------------------------------------
# Models and their GGUF files
# --------------------------------------------------------------------------------------------

def fresh(dst, src):
    return Path(dst).is_file() and Path(dst).stat().st_mtime >= Path(src).stat().st_mtime


def write_random_bert(minilm, folder):
    """A BertModel in bge-base's shape with transformers' own random initialization (seed 1),
    saved as float32 safetensors, with MiniLM's tokenizer and sentence-transformers' files (mean
    pooling, Normalize) beside it."""
    import torch
    import transformers
    torch.manual_seed(1)
    cfg = transformers.BertConfig(**BGE_BASE)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()

    def pooling(tmp):
        (tmp / "1_Pooling").mkdir()
        pool = json.loads((Path(minilm) / "1_Pooling" / "config.json").read_text())
        pool["word_embedding_dimension"] = BGE_BASE["hidden_size"]
        (tmp / "1_Pooling" / "config.json").write_text(json.dumps(pool, indent=2))
    save_random_model(model, minilm, ST_FILES, folder, pooling)


def save_random_model(model, minilm, files, folder, more=None):
    """model saved as float32 safetensors with those of minilm's files that exist beside it (and
    more(tmp), when given, writing others) into folder, in place when whole."""
    def write(tmp):
        model.save_pretrained(str(tmp), safe_serialization=True)
        for f in files:
            if (Path(minilm) / f).is_file():
                shutil.copy(Path(minilm) / f, tmp / f)
        if more is not None:
            more(tmp)
    sbs.replace_folder(folder, write)


def minilm_of(a, needs):
    """--minilm's folder, which must hold `needs`."""
    minilm = Path(a.minilm)
    if not (minilm / needs).is_file():
        raise SystemExit("%s not found: run scripts/setup --test (it fetches all-MiniLM-L6-v2), "
                         "or pass --minilm PATH" % minilm)
    return minilm


def gguf_files(out, name, folder, export, formats, threads):
    """{"hf": folder, f32/f16/q8_0/q4_0: GGUF paths}: out/<name>.f32.gguf by export(folder,
    path) when missing or older than the weights, the others by llama.cpp's quantizer from it."""
    import make_gguf
    f32 = out / ("%s.f32.gguf" % name)
    if not fresh(f32, folder / "model.safetensors"):
        t0 = time.time()
        tmp = Path(str(f32) + ".part")
        export(folder, tmp)
        os.replace(tmp, f32)
        log("wrote %s (%.1f s)" % (f32, time.time() - t0))
    # llama.cpp's quantizer makes the others from the F32 file (make_all keeps an F32 source as
    # it is: "<name>.f32.gguf" is its own output name)
    paths = make_gguf.make_all(f32, out, [f for f in formats if f != "f32"], threads, log=log)
    paths["hf"] = folder
    return paths


def model_files(name, a, formats):
    """{"hf": folder Kwker loads, f32/f16/q8_0/q4_0: GGUF paths}, built when missing or stale."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import gguf_export
    minilm = minilm_of(a, "model.safetensors")
    out = Path(a.work_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    if name == "minilm":
        folder = minilm
    else:
        folder = sbs.fresh_checkpoint(out, {"version": BUILDER_VERSION, "config": BGE_BASE},
                                      lambda f: write_random_bert(minilm, f))
    return gguf_files(out, name, folder, lambda f, p: gguf_export.export_bert(f, p, "f32"),
                      formats, a.threads)


# --------------------------------------------------------------------------------------------
# Texts
# --------------------------------------------------------------------------------------------

def make_texts(tok, workloads, path=TEXT):
    """{workload: [texts]}: consecutive words of the wikitext rows (headings skipped), each text
    exactly its tokens minus [CLS] and [SEP] by the WordPiece tokenizer tok (a text is split on
    whitespace before WordPiece, so the words' counts add up; checked): as many words as fit,
    then, where the next one does not, the first word after it that fills the count. Workloads
    take disjoint stretches of the file."""
    raw = Path(path).read_text(encoding="utf-8")
    words = []
    for line in raw.splitlines():
        s = line.strip()
        if s and not s.startswith("="):
            words += s.split()
    cache = {}

    def n_tok(w):
        if w not in cache:
            cache[w] = len(tok.encode(w, add_special_tokens=False))
        return cache[w]

    out, i = {}, 0
    for name, (n_texts, n_tokens) in workloads.items():
        texts = []
        while len(texts) < n_texts:
            have, start = 0, i
            while i < len(words) and have + n_tok(words[i]) <= n_tokens - 2:
                have += n_tok(words[i])
                i += 1
            picked = words[start:i]
            # short of the count (the next word did not fit): the next word that fills it
            # exactly, words in between skipped
            while have < n_tokens - 2 and i < len(words):
                if n_tok(words[i]) == n_tokens - 2 - have:
                    picked.append(words[i])
                    have = n_tokens - 2
                i += 1
            if have < n_tokens - 2:
                raise SystemExit("%s: too short for the workloads" % path)
            text = " ".join(picked)
            assert len(tok.encode(text, add_special_tokens=False)) == have, text
            texts.append(text)
        out[name] = texts
    return out


# --------------------------------------------------------------------------------------------
# One run (a fresh process)
# --------------------------------------------------------------------------------------------

def vm_kib(field):
    return sbs.vm_kib(field)


class KwkerSide:
    def __init__(self, job):
        import kwker
        prec, act = KWKER_CONFIGS[job["config"]]
        # every one of the 512 positions, as llama.cpp's GGUF takes them: MiniLM's
        # sentence_bert_config.json says 256 (Kwker's default limit), the long texts are 500
        self.enc = kwker.Encoder(job["hf"], precision=prec, threads=job["threads"],
                                 act_bits=act, batch_tokens=job["kwker_batch_tokens"],
                                 max_tokens=512)

    def embed(self, texts, workload):
        return self.enc.embed(texts)

    def n_tokens(self, texts):
        return sum(len(self.enc.tokenize(t)) for t in texts)

    def close(self):
        self.enc.close()


class LlamaSide:
    """llama-cpp-python's Llama with one context per n_batch (made when a workload first needs
    it, the previous one freed first, so that peak RSS is the larger context's)."""

    def __init__(self, job):
        import llama_cpp
        self.L = llama_cpp
        self.job = job
        self.llm, self.n_batch = None, None
        self.context(job["llama_batch"]["throughput"])

    def context(self, n_batch):
        if self.n_batch == n_batch:
            return self.llm
        if self.llm is not None:
            self.llm.close()
            self.llm = None
        L = self.L
        self.llm = L.Llama(model_path=self.job["gguf"], embedding=True,
                           n_threads=self.job["threads"], n_threads_batch=self.job["threads"],
                           n_ctx=n_batch, n_batch=n_batch, n_ubatch=n_batch,
                           pooling_type=L.LLAMA_POOLING_TYPE_MEAN,
                           flash_attn=self.job["llama_flash_attn"] == "on", verbose=False)
        self.n_batch = n_batch
        return self.llm

    def embed(self, texts, workload):
        import numpy as np
        llm = self.context(self.job["llama_batch"].get(workload, 512))
        return np.asarray(llm.embed(texts, normalize=True), dtype=np.float32)

    def n_tokens(self, texts):
        return sum(len(self.llm.tokenize(t.encode("utf-8"))) for t in texts)

    def close(self):
        if self.llm is not None:
            self.llm.close()


def worker(job):
    """One run of one side: load, warm up each workload's shape once, time the workloads.
    Prints a JSON line; with job["save"] also writes the embeddings of every text (npz)."""
    import numpy as np
    texts = json.loads(Path(job["texts"]).read_text())
    side, base_kib, load_s = load_side(job, KwkerSide, LlamaSide)
    res = {"load_s": load_s, "base_rss_kib": base_kib, "workloads": {}}
    embs = {}
    for w in job["workloads"]:
        ts = texts[w]
        warm = ts[:max(1, len(ts) // 8)] if w != "query" else ts[:1]
        side.embed(warm if w != "query" else warm[0], w)
        r = {"n_texts": len(ts)}
        if w == "query":
            lat, out = [], []
            for _ in range(job["query_passes"]):
                for q in ts:
                    t1 = time.perf_counter()
                    e = side.embed(q, w)
                    lat.append(time.perf_counter() - t1)
                    out.append(e)
            r["latencies_ms"] = [1e3 * x for x in lat]
            r["ms"] = statistics.median(r["latencies_ms"])
            embs[w] = np.asarray(out[:len(ts)], dtype=np.float32).reshape(len(ts), -1)
        else:
            secs = []
            for _ in range(job["reps"]):
                t1 = time.perf_counter()
                e = side.embed(ts, w)
                secs.append(time.perf_counter() - t1)
            r["seconds"] = statistics.median(secs)
            r["all_seconds"] = secs
            embs[w] = np.asarray(e, dtype=np.float32)
        r["n_tokens"] = side.n_tokens(ts)
        res["workloads"][w] = r
    return finish_worker(job, side, res, embs)


def load_side(job, kwker_cls, llama_cls):
    """(the side's object for job["side"], VmHWM before it, seconds it took to load)."""
    side_cls = kwker_cls if job["side"] == "kwker" else llama_cls
    base_kib = vm_kib("VmHWM")  # the interpreter and numpy: not the engine's cost
    t0 = time.perf_counter()
    side = side_cls(job)
    return side, base_kib, time.perf_counter() - t0


def finish_worker(job, side, res, arrays, llama_extra=None):
    """A run's end: llama.cpp's settings (and llama_extra(side)'s entries) in res, the side
    closed, peak RSS, arrays saved to job["save"] (npz) when asked, res printed as JSON."""
    import numpy as np
    if job["side"] == "llama":
        res["llama_batch"] = job["llama_batch"]
        if llama_extra is not None:
            res.update(llama_extra(side))
        res["system_info"] = side.L.llama_print_system_info().decode(errors="replace")
    side.close()
    res["peak_rss_kib"] = vm_kib("VmHWM")
    if job.get("save"):
        np.savez(job["save"], **arrays)
    print(json.dumps(res))
    return 0


def run_worker(a, script, side, cfg, files, texts_path, save, nice=True, **more):
    """One run of `script --worker` in a fresh process (at --nice when nice), its job: side,
    cfg, the settings both tools share and `more`; returns the JSON it printed."""
    job = dict(side=side, config=cfg, threads=a.threads, texts=str(texts_path),
               workloads=a.workloads, reps=a.reps, save=str(save) if save else None,
               llama_batch=a.llama_batch, llama_flash_attn=a.llama_flash_attn,
               hf=str(files["hf"]), gguf=str(files.get(cfg, "")), **more)
    env = dict(os.environ)
    if a.kwker_lib:
        env["KWKER_LIB"] = str(a.kwker_lib)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    py = a.llama_python if side == "llama" else sys.executable
    cmd = [str(py), str(Path(script).resolve()), "--worker", json.dumps(job)]
    if a.nice and nice:
        cmd = ["nice", "-n", str(a.nice)] + cmd
    rc, out, err = sbs.run_child(cmd, env=env)
    if rc != 0:
        raise RuntimeError("%s %s run failed (%d):\n%s" % (side, cfg, rc, err[-3000:]))
    return json.loads(out.strip().splitlines()[-1])


def run_one(a, side, cfg, files, texts_path, save):
    return run_worker(a, __file__, side, cfg, files, texts_path, save,
                      query_passes=a.query_passes, kwker_batch_tokens=a.kwker_batch_tokens)


# --------------------------------------------------------------------------------------------
# Rounds, medians, the check
# --------------------------------------------------------------------------------------------

def cosines(x, y):
    import numpy as np
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    y = y / np.linalg.norm(y, axis=1, keepdims=True)
    return (x * y).sum(axis=1).astype(np.float64)


def one_minus_cos(pa, pb, workloads):
    """(median, max) of 1 - cosine over every text of the workloads, embeddings in npz files."""
    import numpy as np
    A, B = np.load(pa), np.load(pb)
    d = np.concatenate([1.0 - cosines(A[w], B[w]) for w in workloads])
    return float(np.median(d)), float(d.max())


def process_medians(runs):
    """Medians of the runs' peak and base RSS (MiB) and load seconds."""
    return {"peak_rss_mib": statistics.median(r["peak_rss_kib"] for r in runs) / 1024,
            "base_rss_mib": statistics.median(r["base_rss_kib"] for r in runs) / 1024,
            "load_s": statistics.median(r["load_s"] for r in runs)}


def summarize(runs, workloads):
    """Medians of one configuration's runs."""
    s = process_medians(runs)
    for w in workloads:
        rs = [r["workloads"][w] for r in runs]
        n_texts, n_tokens = rs[0]["n_texts"], rs[0]["n_tokens"]
        if w == "query":
            s[w] = {"ms": statistics.median(x["ms"] for x in rs),
                    "ms_runs": [x["ms"] for x in rs], "n_tokens": n_tokens}
        else:
            secs = [x["seconds"] for x in rs]
            med = statistics.median(secs)
            s[w] = {"seconds": med, "seconds_runs": secs, "emb_per_s": n_texts / med,
                    "tok_per_s": n_tokens / med, "n_tokens": n_tokens}
    return s


def order_of(a):
    """One round: Kwker's and llama.cpp's configurations alternating."""
    kcfgs = list(dict.fromkeys(kc for kc, _ in a.pairs))
    lcfgs = list(dict.fromkeys(lf for _, lf in a.pairs))
    order = []
    for i in range(max(len(kcfgs), len(lcfgs))):
        order += [("kwker", kcfgs[i])] if i < len(kcfgs) else []
        order += [("llama", lcfgs[i])] if i < len(lcfgs) else []
    return order


def rounds(a, name, files, texts_path, scratch, run_one, describe):
    """--runs rounds of run_one(a, side, cfg, files, texts_path, save) of every configuration
    (order_of), the order reversed every other round (K L K L ... then ... L K L K) so that
    neither side always runs first, each run's stolen CPU, load average and the bandwidth probe
    after it added, a line logged (describe(its workloads) tells their numbers). Returns
    ({(side, cfg): [results]}, {(side, cfg): the npz its first run saved})."""
    order = order_of(a)
    runs = {o: [] for o in order}
    saved = {}
    bw = sbs.probe(a.bw_probe, a.threads, "native", a.probe_mib, "stream") if a.probe_mib else None
    seq = 0
    for r in range(a.runs):
        for side, cfg in (order if r % 2 == 0 else order[::-1]):
            seq += 1
            save = None
            if (side, cfg) not in saved:
                save = scratch / ("%s-%s-%s.npz" % (name, side, cfg))
            t0, load0 = sbs.cpu_ticks(), os.getloadavg()[0]
            res = run_one(a, side, cfg, files, texts_path, save)
            res["steal_pct"] = sbs.steal_pct(t0, sbs.cpu_ticks())
            # the 1-minute load average before and after: other work on the 2 cores (llama.cpp's
            # OpenMP threads spin at their barriers and lose most when the cores are shared)
            res["loadavg"] = [load0, os.getloadavg()[0]]
            after = (sbs.probe(a.bw_probe, a.threads, "native", a.probe_mib, "stream")
                     if a.probe_mib else None)
            res["bw_before"], res["bw_after"], bw = bw, after, after
            res["round"], res["seq"] = r + 1, seq
            if save:
                saved[(side, cfg)] = save
            runs[(side, cfg)].append(res)
            log("  %s %s %-9s run %d: %s; peak RSS %.0f MiB; bw %s GB/s; stolen %s%%; load %.1f"
                % (name, side, cfg, r + 1, describe(res["workloads"]), res["peak_rss_kib"] / 1024,
                   sbs.fmt(after), sbs.fmt(res["steal_pct"]), res["loadavg"][1]))
    return runs, saved


def measure_model(a, name, texts_path, scratch):
    formats = sorted({lf for _, lf in a.pairs}, key=LLAMA_FORMATS.index)
    files = model_files(name, a, formats)
    runs, saved = rounds(a, name, files, texts_path, scratch, run_one, lambda wl: ", ".join(
        "%s %.1f ms" % (w, x["ms"]) if w == "query" else
        "%s %.0f tok/s" % (w, x["n_tokens"] / x["seconds"]) for w, x in wl.items()))
    summ = {o: summarize(rs, a.workloads) for o, rs in runs.items()}
    ref = saved.get(("kwker", "preserve"))
    recs = []
    for kc, lf in a.pairs:
        k, l_ = summ[("kwker", kc)], summ[("llama", lf)]
        rec = {"model": name, "kwker": kwker_label(kc), "kwker_config": kc, "llama_format": lf,
               "kwker_file": str(files["hf"]), "llama_file": str(files[lf]),
               "kwker_summary": k, "llama_summary": l_,
               "runs": {"kwker": runs[("kwker", kc)], "llama": runs[("llama", lf)]},
               "ratio": {}}
        for w in a.workloads:
            rec["ratio"][w] = (l_[w]["ms"] / k[w]["ms"] if w == "query"
                               else k[w]["tok_per_s"] / l_[w]["tok_per_s"])
        kk, ll = saved[("kwker", kc)], saved[("llama", lf)]
        rec["cos_kwker_llama"] = one_minus_cos(kk, ll, a.workloads)
        if ref is not None:
            rec["cos_kwker_ref"] = one_minus_cos(kk, ref, a.workloads)
            rec["cos_llama_ref"] = one_minus_cos(ll, ref, a.workloads)
        same = all(k[w]["n_tokens"] == l_[w]["n_tokens"] for w in a.workloads)
        rec["same_token_counts"] = same
        recs.append(rec)
    return recs


def sweep(a, name, texts_path):
    """--sweep: the throughput and long workloads at each side's batch settings, one process a
    setting and round, settings interleaved: llama.cpp's n_batch (= n_ubatch = n_ctx) with flash
    attention off and on for the first pair's llama.cpp format, Kwker's batch_tokens for its
    Kwker configuration. Prints medians of tokens/s a setting."""
    kc, lf = a.pairs[0]
    files = model_files(name, a, [lf])
    ws = [w for w in a.workloads if w != "query"]
    settings = [("llama", lf, nb, fa) for fa in ("off", "on") for nb in a.sweep_llama]
    settings += [("kwker", kc, bt, None) for bt in a.sweep_kwker]
    got = {s_: [] for s_ in settings}
    for r in range(a.runs):
        for st in (settings if r % 2 == 0 else settings[::-1]):
            side, cfg, n, fa = st
            b = argparse.Namespace(**vars(a))
            # a batch under 512 tokens holds no long text: the throughput workload alone
            b.workloads, b.query_passes = [w for w in ws if n >= 512 or w != "long"], 1
            if side == "llama":
                b.llama_batch = dict(a.llama_batch, throughput=n, long=n)
                b.llama_flash_attn = fa
            else:
                b.kwker_batch_tokens = n
            res = run_one(b, side, cfg, files, texts_path, None)
            tps = {w: res["workloads"][w]["n_tokens"] / res["workloads"][w]["seconds"]
                   for w in b.workloads}
            got[st].append(dict(tps, peak_rss_kib=res["peak_rss_kib"]))
            log("  %s %s %s batch %d%s: %s; peak RSS %.0f MiB" % (
                name, side, cfg, n, "" if fa is None else " flash " + fa,
                ", ".join("%s %.0f tok/s" % kv for kv in tps.items()),
                res["peak_rss_kib"] / 1024))
    lines = ["| model | side | format | batch | flash attention | %s | peak RSS MiB |"
             % " | ".join("%s tok/s" % w for w in ws),
             "|---|---|---|---:|---|%s---:|" % ("---:|" * len(ws))]
    for st, rs in got.items():
        side, cfg, n, fa = st
        lines.append("| %s | %s | %s | %d | %s | %s | %.0f |" % (
            name, side, cfg, n, fa or "", " | ".join(
                "%.0f" % statistics.median(x[w] for x in rs) if w in rs[0] else "n/a"
                for w in ws),
            statistics.median(x["peak_rss_kib"] for x in rs) / 1024))
    return "\n".join(lines), got


def fmt(x, nd=1):
    return sbs.fmt(x, nd)


def sci(x):
    return "n/a" if x is None else "%.1e" % x


def markdown(recs, a):
    w = a.workloads
    head = ["model", "Kwker", "llama.cpp"]
    sep = ["---", "---", "---"]
    for x in w:
        if x == "query":
            head += ["query ms Kwker / llama.cpp", "× (llama.cpp ms / Kwker ms)"]
        else:
            head += ["%s tok/s Kwker / llama.cpp (emb/s)" % x, "%s ×" % x]
        sep += ["---:", "---:"]
    head += ["peak RSS MiB Kwker / llama.cpp", "1 − cos Kwker vs llama.cpp (median / max)",
             "1 − cos vs Kwker preserve, Kwker / llama.cpp (median)"]
    sep += ["---:", "---:", "---:"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(sep) + "|"]
    for r in recs:
        k, l_ = r["kwker_summary"], r["llama_summary"]
        row = [r["model"], r["kwker"], r["llama_format"].upper()]
        for x in w:
            if x == "query":
                row += ["%s / %s" % (fmt(k[x]["ms"], 2), fmt(l_[x]["ms"], 2)),
                        fmt(r["ratio"][x], 2)]
            else:
                row += ["%s / %s (%s / %s)" % (fmt(k[x]["tok_per_s"], 0), fmt(l_[x]["tok_per_s"], 0),
                                               fmt(k[x]["emb_per_s"]), fmt(l_[x]["emb_per_s"])),
                        fmt(r["ratio"][x], 2)]
        ckr, clr = r.get("cos_kwker_ref"), r.get("cos_llama_ref")
        row += ["%s / %s" % (fmt(k["peak_rss_mib"], 0), fmt(l_["peak_rss_mib"], 0)),
                "%s / %s" % (sci(r["cos_kwker_llama"][0]), sci(r["cos_kwker_llama"][1])),
                "%s / %s" % (sci(ckr and ckr[0]), sci(clr and clr[0]))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def parse_pairs(s):
    pairs = []
    for item in s.split(","):
        if not item:
            continue
        kc, _, lf = item.partition(":")
        if kc not in KWKER_CONFIGS or lf not in LLAMA_FORMATS:
            raise SystemExit("--pairs: %r is not KWKER:LLAMA with KWKER in %s and LLAMA in %s"
                             % (item, ", ".join(KWKER_CONFIGS), ", ".join(LLAMA_FORMATS)))
        pairs.append((kc, lf))
    return pairs


def parse_batches(s, workloads=WORKLOADS, why="a BERT sequence must fit one ubatch"):
    """--llama-batch: {workload: n_batch}, 512 unless s says WORKLOAD=N (N >= 512: why)."""
    out = {w: 512 for w in workloads}
    for item in s.split(","):
        if item:
            k, _, v = item.partition("=")
            if k not in out or not v.isdigit() or int(v) < 512:
                raise SystemExit("--llama-batch: WORKLOAD=N with N >= 512 (%s), not %r"
                                 % (why, item))
            out[k] = int(v)
    return out


def parse_workloads(s, known):
    out = [w for w in s.split(",") if w]
    bad = set(out) - set(known)
    if bad:
        raise SystemExit("unknown workload(s) %s" % ", ".join(sorted(bad)))
    return out


def add_probe_args(ap):
    """The arguments after --nice that both tools take: llama.cpp's Python, the bandwidth probe,
    --json."""
    ap.add_argument("--llama-python", default=sys.executable,
                    help="the Python whose llama_cpp runs llama.cpp")
    ap.add_argument("--bw-probe", default=None,
                    help="default $KWK_BW_PROBE, else bw_probe beside $KWKER_LIB or build/")
    ap.add_argument("--probe-mib", type=int, default=256,
                    help="the read-bandwidth probe's buffer between runs (0: no probe)")
    ap.add_argument("--json", default=None, help="also write every run and summary here")


def find_bw_probe(a):
    """a.bw_probe: the probe's path (--bw-probe, $KWK_BW_PROBE, beside --kwker-lib or in build/),
    when --probe-mib asks for it."""
    if a.probe_mib:
        cands = [a.bw_probe, os.environ.get("KWK_BW_PROBE")]
        if a.kwker_lib:
            cands.append(Path(a.kwker_lib).parent / "bw_probe")
        cands.append(REPO / "build" / "bw_probe")
        a.bw_probe = next((Path(c) for c in cands if c and Path(c).is_file()), None)
        if a.bw_probe is None:
            raise SystemExit("bw_probe not found: build it (ninja -C build bw_probe), pass "
                             "--bw-probe PATH, or --probe-mib 0")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm,bge-base-random",
                    help="comma-separated: minilm, bge-base-random")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS,
                    help="KWKER:LLAMA pairs; KWKER one of %s (balanced8 / int48: act_bits=8), "
                         "LLAMA one of %s" % (", ".join(KWKER_CONFIGS), ", ".join(LLAMA_FORMATS)))
    ap.add_argument("--workloads", default="throughput,query,long")
    ap.add_argument("--runs", type=int, default=5, help="rounds (runs of each configuration)")
    ap.add_argument("-t", dest="threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1,
                    help="timed passes of the throughput / long workloads in a run (median)")
    ap.add_argument("--query-passes", type=int, default=2,
                    help="passes over the queries in a run (median of every call)")
    ap.add_argument("--work-dir", default=str(REPO / ".cache" / "bench-models" / "embed"),
                    help="the random model, the GGUF files, the texts and embeddings")
    ap.add_argument("--minilm", default=str(MINILM),
                    help="all-MiniLM-L6-v2's folder (default $KWK_MINILM, else "
                         "models/all-MiniLM-L6-v2)")
    ap.add_argument("--text", default=str(TEXT), help="the text the workloads are cut from")
    ap.add_argument("--kwker-lib", default=os.environ.get("KWKER_LIB"),
                    help="libkwker.so for the Kwker side (default $KWKER_LIB, else "
                         "python/kwker's own search)")
    ap.add_argument("--kwker-batch-tokens", type=int, default=0,
                    help="kwker.Encoder's batch_tokens (0: its default, 2048)")
    ap.add_argument("--llama-batch", default="throughput=512,query=512,long=512",
                    help="llama.cpp's n_batch = n_ubatch = n_ctx per workload (>= 512)")
    ap.add_argument("--llama-flash-attn", choices=("off", "on"), default="on",
                    help="llama.cpp's flash attention (on: 2.5-7x its throughput and long "
                         "workloads on MiniLM, where its masked blocks of other sequences are "
                         "skipped)")
    ap.add_argument("--nice", type=int, default=-10 if hasattr(os, "geteuid") and
                    os.geteuid() == 0 else 0,
                    help="the runs' niceness (default -10 as root, else 0): on a 2-core machine "
                         "shared with builds, both sides' spinning thread pools lose whole time "
                         "slices to them, llama.cpp's OpenMP barriers most")
    add_probe_args(ap)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: minilm only, preserve:f32 and int4:q4_0, 2 runs, small "
                         "workloads")
    ap.add_argument("--sweep", action="store_true",
                    help="measure the batch settings instead (throughput and long workloads): "
                         "llama.cpp's n_batch in --sweep-llama with flash attention off and on "
                         "for the first pair's format, Kwker's batch_tokens in --sweep-kwker")
    ap.add_argument("--sweep-llama", default="512,1024,2048,4096,8192")
    ap.add_argument("--sweep-kwker", default="2048,4096,8192")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return a
    if a.quick:
        a.runs, a.query_passes = min(a.runs, 2), 1
        if a.models == "minilm,bge-base-random":
            a.models = "minilm"
        if a.pairs == DEFAULT_PAIRS:
            a.pairs = "preserve:f32,int4:q4_0"
    a.pairs = parse_pairs(a.pairs)
    a.sweep_llama = [int(x) for x in a.sweep_llama.split(",") if x]
    a.sweep_kwker = [int(x) for x in a.sweep_kwker.split(",") if x]
    a.llama_batch = parse_batches(a.llama_batch)
    a.workloads = parse_workloads(a.workloads, WORKLOADS)
    a.models = [m for m in a.models.split(",") if m]
    for m in a.models:
        if m not in ("minilm", "bge-base-random"):
            raise SystemExit("unknown model %r" % m)
    find_bw_probe(a)
    return a


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(json.loads(a.worker))
    shape = QUICK_WORKLOADS if a.quick else WORKLOADS
    scratch, texts_path = prepare(a, "embed-sbs-", make_texts, shape)
    if a.sweep:
        try:
            tables, raw = [], {}
            for m in a.models:
                t, got = sweep(a, m, texts_path)
                tables.append(t)
                raw[m] = {"%s|%s|%d|%s" % k: v for k, v in got.items()}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print("\n\n".join(tables))
        if a.json:
            Path(a.json).write_text(json.dumps({"sweep": raw, "markdown": tables}, indent=1))
        return 0
    recs = measure_all(a, measure_model, lambda recs: write_json(a, shape, recs), texts_path,
                       scratch)
    print(markdown(recs, a))
    return 0


def prepare(a, prefix, make_texts, shape):
    """Imports llama_cpp and kwker (--kwker-lib's), makes a scratch folder in the work dir and
    the workloads' texts (make_texts(MiniLM's tokenizer, {workload: shape}, --text)) in a
    texts.json there: (scratch, that file)."""
    llamacpp.import_llama_cpp()
    sys.path.insert(0, str(REPO / "python"))
    if a.kwker_lib:
        os.environ["KWKER_LIB"] = str(a.kwker_lib)
    import kwker
    work = Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=str(work)))
    tok = kwker.Tokenizer.from_pretrained(a.minilm)  # every model's tokenizer
    texts = make_texts(tok, {w: shape[w] for w in a.workloads}, a.text)
    tok.close()
    texts_path = scratch / "texts.json"
    texts_path.write_text(json.dumps(texts))
    return scratch, texts_path


def measure_all(a, measure_model, write_json, texts_path, scratch):
    """measure_model(a, model, texts_path, scratch) of every model, write_json(records so far)
    after each; the scratch folder removed at the end. Returns the records."""
    recs = []
    try:
        for m in a.models:
            log("%s: %s, %d rounds" % (m, ", ".join("%s vs %s" % p for p in a.pairs), a.runs))
            recs += measure_model(a, m, texts_path, scratch)
            write_json(recs)  # each model's results kept as soon as they are done
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return recs


def settings(a, shape, names, first, middle):
    """The JSON's settings: the common ones, first after --reps, the workloads' shapes (names of
    the two numbers), middle after --llama-flash-attn."""
    s = {"threads": a.threads, "runs": a.runs, "reps": a.reps}
    s.update(first)
    s["workloads"] = {w: dict(zip(names, shape[w])) for w in a.workloads}
    s.update(llama_batch=a.llama_batch, llama_flash_attn=a.llama_flash_attn)
    s.update(middle)
    s.update(probe_mib=a.probe_mib, llama_version=llamacpp.version(), nice=a.nice,
             pairs=[list(p) for p in a.pairs], kwker_lib=str(a.kwker_lib or ""),
             text=str(a.text))
    return s


def write_json(a, shape, recs):
    table = markdown(recs, a)
    if a.json:
        out = {"settings": settings(a, shape, ("texts", "tokens"),
                                    {"query_passes": a.query_passes},
                                    {"kwker_batch_tokens": a.kwker_batch_tokens or 2048}),
               "results": recs, "markdown": table}
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
