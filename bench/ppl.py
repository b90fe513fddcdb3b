#!/usr/bin/env python3
"""ppl.py - perplexity of Kwker's precisions beside llama.cpp's formats on the same weights, with
llama-perplexity's protocol on both sides.

  python3 bench/ppl.py [--chunks 20] [--ctx 512] [-t 2] [--src GGUF] [--text FILE]
                       [--llama f32,q8_0,q4_0,q4_k_m] [--kwker preserve,balanced,int4]
                       [--calib-text FILE] [--calib-tokens 4096]
                       [--kwker-bin build/kwker] [--kwker-bpw balanced=8.5] [--reuse]
                       [--json out.json]

Kwker variants: precision[+mixN][+calib][+gptq], e.g. int4+mix4+calib+gptq (--mix-bits N,
--calib FILE with --calib-text's first --calib-tokens tokens, --gptq).

The original is the source GGUF dequantized to F32 (bench/make_gguf.py, which also makes the
llama.cpp quantizations with llama.cpp's own quantizer). llama.cpp's numbers come from
llama-cpp-python (logits of every position, scored here in float64 numpy), Kwker's from
`kwker perplexity` on the F32 original. The protocol, identical on both sides: tokenize the whole
text (one trailing newline dropped, no special tokens, BOS in front when the vocabulary adds
one), cut it into chunks of ctx tokens, evaluate each chunk from an empty cache (its first token
replaced by BOS when the vocabulary adds one) and score the second half: positions ctx/2 .. ctx-2
predicting the next token. PPL = exp(mean nll), SE = PPL * sqrt(var(nll) / (count - 1)).

The table: format, engine, bits per weight (tensor bytes * 8 / parameters of the GGUF file; for
Kwker's quantized precisions the packed matrices' figure that libkwker logs, or --kwker-bpw),
PPL +/- SE, and the
difference from the same engine's original (llama.cpp F32, Kwker preserve). Kwker preserve and
llama.cpp F32 run the same weights, so they must agree closely: the script prints that check,
and whether both sides tokenized the text to the same ids.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp  # noqa: E402
import make_gguf  # noqa: E402

DEFAULT_TEXT = llamacpp.SHARED_DATA / "text" / \
    "wikitext-2-raw-v1.test.hf-rows-crlf.txt"


def read_text(path):
    """The file's bytes as llama.cpp's -f reads them: one trailing '\\n' dropped."""
    data = Path(path).read_bytes()
    return data[:-1] if data.endswith(b"\n") else data


def chunk_nlls(logits, ids, start, ctx):
    """-log p of tokens ids[start+ctx/2+1 .. start+ctx) given logits[ctx][n_vocab] (float64)."""
    rows = np.asarray(logits[ctx // 2:ctx - 1], dtype=np.float64)
    target = np.asarray(ids[start + ctx // 2 + 1:start + ctx])
    mx = rows.max(axis=1, keepdims=True)
    lse = np.log(np.exp(rows - mx).sum(axis=1)) + mx[:, 0]
    return lse - rows[np.arange(len(target)), target]


def summarize(nlls):
    nll = np.asarray(nlls, dtype=np.float64)
    mean = float(nll.mean())
    var = float((nll * nll).mean() - mean * mean)
    ppl = float(np.exp(mean))
    se = float(np.sqrt(var / (len(nll) - 1)) * ppl) if var > 0 and len(nll) > 1 else float("nan")
    return dict(ppl=ppl, se=se, nll_mean=mean, count=len(nll))


def llama_perplexity(path, text, ctx, n_chunks, threads, log, kv_f32=False):
    m = llamacpp.LlamaLogits(path, n_ctx=ctx, n_threads=threads, kv_f32=kv_f32)
    try:
        add_bos = m.adds_bos()
        t0 = time.time()
        ids = m.tokenize(text, True)
        log("  llama.cpp: %d tokens (BOS %s) in %.1f s" % (
            len(ids), "added" if add_bos else "not added", time.time() - t0))
        n = min(n_chunks, len(ids) // ctx) if n_chunks > 0 else len(ids) // ctx
        nlls, running = [], []
        t0 = time.time()
        for c in range(n):
            chunk = list(ids[c * ctx:(c + 1) * ctx])
            if add_bos:
                chunk[0] = m.bos()
            nlls.extend(chunk_nlls(m.logits(chunk), ids, c * ctx, ctx))
            running.append(float(np.exp(np.mean(nlls))))
            print("[%d]%.4f," % (c + 1, running[-1]), end="", flush=True, file=sys.stderr)
        print(file=sys.stderr)
        res = summarize(nlls)
        res.update(chunks=n, running=running, seconds=time.time() - t0, ids=ids)
        return res
    finally:
        m.close()


def kwker_flags(spec, calib_text=None, calib_tokens=4096):
    """A Kwker variant: precision[+mixN][+calib][+gptq] (e.g. int4+mix6+calib+gptq) -> flags.
    +calib uses calib_text (not the scored text: the fit must carry over to unseen text)."""
    parts = spec.split("+")
    flags = ["--precision", parts[0]]
    for p in parts[1:]:
        if p.startswith("mix"):
            flags += ["--mix-bits", p[3:]]
        elif p == "calib":
            flags += ["--calib", str(calib_text), "--calib-tokens", str(calib_tokens)]
        elif p == "gptq":
            flags += ["--gptq"]
        else:
            raise SystemExit("unknown Kwker variant part %r in %r" % (p, spec))
    return flags


def kwker_perplexity(kwker_bin, model, precision, text_path, ctx, n_chunks, threads,
                     calib_text=None, calib_tokens=4096):
    cmd = [str(kwker_bin), "perplexity", "--model", str(model)] + \
        kwker_flags(precision, calib_text, calib_tokens) + \
        ["--file", str(text_path), "--chunks", str(n_chunks), "--ctx", str(ctx),
         "-t", str(threads)]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
        return dict(error=tail, cmd=" ".join(cmd))
    m = re.search(r"nll_mean = ([-0-9.]+), ppl = [0-9.eE+-]+, scored tokens = (\d+), "
                  r"chunks = (\d+)", proc.stdout)
    se = re.search(r"PPL = [0-9.]+ \+/- ([0-9.]+|nan)", proc.stdout)
    if not m or not se:
        return dict(error="unparsable output: %s" % proc.stdout[-300:], cmd=" ".join(cmd))
    mean = float(m.group(1))
    return dict(ppl=float(np.exp(mean)), se=float(se.group(1)), nll_mean=mean,
                count=int(m.group(2)), chunks=int(m.group(3)), seconds=time.time() - t0,
                cmd=" ".join(cmd))


def llama_tokens(path, text, ctx):
    m = llamacpp.LlamaLogits(path, n_ctx=ctx, n_threads=1)
    try:
        return m.tokenize(text, True)
    finally:
        m.close()


def kwker_packed_bpw(kwker_bin, model, precision, text_path):
    """Bits per weight of Kwker's packed matrices (layers and lm_head: the weights read per
    token), as the library logs when it packs (KWKER_LOG=info); a one-chunk run of 8 tokens.
    None when the log has no such line (preserve packs nothing: float32, 32 bits)."""
    if precision == "preserve":
        return 32.0
    # calibration changes the numbers, not the matrix types: leave it out (it takes time)
    spec = "+".join(p for p in precision.split("+") if p not in ("calib", "gptq"))
    cmd = [str(kwker_bin), "perplexity", "--model", str(model)] + kwker_flags(spec) + \
        ["--file", str(text_path), "--chunks", "1", "--ctx", "8", "--cache-dir", "off"]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=dict(os.environ, KWKER_LOG="info"))
    m = re.search(r"([0-9.]+) bits per weight", proc.stderr)
    return float(m.group(1)) if m else None


def kwker_tokens(model, text):
    """Kwker's ids of the text (for the tokenization cross-check), or None without libkwker."""
    try:
        sys.path.insert(0, str(llamacpp.REPO / "python"))
        from kwker import Tokenizer
        return Tokenizer.from_pretrained(str(model)).encode(text.decode("utf-8", "replace"),
                                                            add_special_tokens=False)
    except Exception as e:  # the cross-check is informative only
        return "unavailable (%s)" % e


class ResultCache:
    """With --reuse: rows measured before with the same engine, files (path and mtime), text,
    ctx, chunks and threads, kept in <bench cache>/ppl-results.json."""

    def __init__(self, enabled):
        self.path = llamacpp.cache_dir() / "ppl-results.json"
        self.enabled = enabled
        self.data = {}
        if enabled and self.path.is_file():
            self.data = json.loads(self.path.read_text())

    @staticmethod
    def key(*parts):
        def norm(x):
            if isinstance(x, Path) or (isinstance(x, str) and os.path.exists(x)):
                st = os.stat(x)
                return [str(Path(x).resolve()), st.st_size, int(st.st_mtime)]
            return x
        return json.dumps([norm(p) for p in parts])

    def get(self, key):
        return dict(self.data[key]) if self.enabled and key in self.data else None

    def put(self, key, row):
        if not self.enabled or "error" in row:
            return
        self.data[key] = {k: v for k, v in row.items() if k != "ids"}
        tmp = self.path.with_suffix(".part")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def fmt_row(cols, widths):
    return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cols, widths)) + " |"


def print_table(rows):
    head = ["format", "engine", "bits/weight", "PPL ± SE", "vs original"]
    body = []
    for r in rows:
        bpw = "%.3f" % r["bpw"] if isinstance(r.get("bpw"), float) else (r.get("bpw") or "?")
        if "error" in r:
            body.append([r["format"], r["engine"], bpw, "failed: %s" % r["error"], ""])
            continue
        delta = "%+.3f%%" % r["delta_pct"] if r.get("delta_pct") is not None else ""
        body.append([r["format"], r["engine"], bpw, "%.4f ± %.5f" % (r["ppl"], r["se"]), delta])
    widths = [max(len(str(x[i])) for x in body + [head]) for i in range(len(head))]
    print(fmt_row(head, widths))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print(fmt_row(b, widths))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=20, help="chunks to score (0: all)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--src", default=str(make_gguf.DEFAULT_SRC), help="source GGUF")
    ap.add_argument("--text", default=str(DEFAULT_TEXT))
    ap.add_argument("--llama", default="f32,q8_0,q4_0,q4_k_m",
                    help="llama.cpp formats ('' for none); f32 is the original")
    ap.add_argument("--kwker", default="preserve,balanced,int4",
                    help="Kwker precisions on the F32 original ('' for none)")
    ap.add_argument("--calib-text", default=str(llamacpp.SHARED_DATA /
                                                "text" / "war-and-peace.txt"),
                    help="calibration text of the +calib variants (default War and Peace: "
                         "not the scored text)")
    ap.add_argument("--calib-tokens", type=int, default=4096)
    ap.add_argument("--kwker-bin", default=os.environ.get("KWKER_BIN") or str(
        llamacpp.REPO / "build" / "kwker"))
    ap.add_argument("--kwker-bpw", default="",
                    help="bits per weight of Kwker's precisions, e.g. balanced=8.5,int4=4.8 "
                         "(default: what the library logs when it packs)")
    ap.add_argument("--no-f32-kv", action="store_true",
                    help="skip the extra F32 run with an f32 KV cache")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse rows measured before with identical files and settings")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    llama_fmts = [f for f in a.llama.split(",") if f]
    kwk_precs = [p for p in a.kwker.split(",") if p]
    kwk_bpw = dict(kv.split("=") for kv in a.kwker_bpw.split(",") if "=" in kv)
    paths = make_gguf.make_all(a.src, None, [f for f in llama_fmts if f != "f32"], a.threads,
                               log=log)
    text = read_text(a.text)
    rows, llama_ids = [], None
    cache = ResultCache(a.reuse)
    # llama.cpp's cache is f16 by default; the F32 original also runs with an f32 cache, the
    # exact counterpart of Kwker preserve (float32 everywhere) for the cross-check.
    runs = [(f, False) for f in llama_fmts]
    if "f32" in llama_fmts and not a.no_f32_kv:
        runs.insert(llama_fmts.index("f32") + 1, ("f32", True))
    for fmt, kv_f32 in runs:
        log("llama.cpp %s%s: %s" % (fmt, " (f32 KV cache)" if kv_f32 else "", paths[fmt]))
        key = cache.key("llama.cpp", llamacpp.version(), fmt, kv_f32, paths[fmt], a.text, a.ctx,
                        a.chunks, a.threads)
        r = cache.get(key)
        if r is None:
            r = llama_perplexity(paths[fmt], text, a.ctx, a.chunks, a.threads, log, kv_f32)
            llama_ids = r.pop("ids")
            cache.put(key, r)
        else:
            log("  (reused from %s)" % cache.path)
        r.update(format=fmt.upper() + (" kv=f32" if kv_f32 else ""), engine="llama.cpp",
                 bpw=llamacpp.bits_per_weight(paths[fmt]))
        log("  PPL = %.4f +/- %.5f (%d chunks, %.0f s)" % (r["ppl"], r["se"], r["chunks"],
                                                          r["seconds"]))
        rows.append(r)
    for prec in kwk_precs:
        log("kwker %s on %s" % (prec, paths["f32"]))
        key = cache.key("kwker", a.kwker_bin, prec, paths["f32"], a.text, a.ctx, a.chunks,
                        a.threads, os.environ.get("KWKER_ISA", ""),
                        *((a.calib_text, a.calib_tokens) if "calib" in prec else ()))
        r = cache.get(key)
        if r is None:
            r = kwker_perplexity(a.kwker_bin, paths["f32"], prec, a.text, a.ctx, a.chunks,
                                 a.threads, a.calib_text, a.calib_tokens)
            cache.put(key, r)
        else:
            log("  (reused from %s)" % cache.path)
        bpw = kwk_bpw.get(prec)
        bpw = float(bpw) if bpw else kwker_packed_bpw(a.kwker_bin, paths["f32"], prec, a.text)
        r.update(format=prec, engine="kwker", bpw=bpw)
        log("  " + ("failed: %s" % r["error"] if "error" in r else "PPL = %.4f +/- %.5f (%d "
                    "chunks, %.0f s)" % (r["ppl"], r["se"], r["chunks"], r["seconds"])))
        rows.append(r)

    base = {"llama.cpp": "F32", "kwker": "preserve"}
    ref = {r["engine"]: r for r in rows if r["format"] == base[r["engine"]] and "ppl" in r}
    exact = next((r for r in rows if r["format"] == "F32 kv=f32" and "ppl" in r),
                 ref.get("llama.cpp"))
    for r in rows:
        b = ref.get(r["engine"])
        r["delta_pct"] = 100.0 * (r["ppl"] / b["ppl"] - 1.0) if b and "ppl" in r else None
    print("\nPerplexity, %s, %d chunks of %d tokens, %d threads (%s)" % (
        Path(a.text).name, a.chunks, a.ctx, a.threads, Path(a.src).name))
    print_table(rows)
    if exact and "kwker" in ref:
        lr, kr = exact, ref["kwker"]
        print("\ncross-check: Kwker preserve %.4f vs llama.cpp %s %.4f on the same weights: "
              "%+.4f%% (mean nll %.6f vs %.6f, %d vs %d scored tokens)" % (
                  kr["ppl"], lr["format"], lr["ppl"], 100 * (kr["ppl"] / lr["ppl"] - 1),
                  kr["nll_mean"],
                  lr["nll_mean"], kr["count"], lr["count"]))
    if llama_ids is None and llama_fmts and kwk_precs:
        llama_ids = llama_tokens(paths[llama_fmts[0]], text, a.ctx)
    if llama_ids is not None and kwk_precs:
        kids = kwker_tokens(paths["f32"], text)
        if isinstance(kids, str):
            print("tokenization cross-check: %s" % kids)
        else:
            n = min(len(kids), len(llama_ids))
            diff = next((i for i in range(n) if kids[i] != llama_ids[i]), None)
            if diff is None and len(kids) == len(llama_ids):
                print("tokenization cross-check: Kwker and llama.cpp give the same %d ids" % n)
            else:
                first = diff if diff is not None else n
                used = a.chunks * a.ctx if a.chunks > 0 else n
                print("tokenization cross-check: ids differ (Kwker %d, llama.cpp %d tokens; first "
                      "difference at token %d, %s the %d tokens of the chunks scored)" % (
                          len(kids), len(llama_ids), first,
                          "beyond" if first >= used else "WITHIN", used))
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"args": vars(a), "rows": [{k: v for k, v in r.items()} for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
