"""bench_scoring.py - scoring prompts (each token's logprob given those before it: what
`/v1/completions` with echo and logprobs answers, and evaluation harnesses ask for), Kwker's
serving engine beside llama.cpp on the same weights and thread count, alternately (A B A B ...).

    python3 bench/bench_scoring.py [--models smollm2-135m] [--pairs balanced:q8_0,int4:q4_0]
                                   [--batch 4] [--n-prompt 512] [--runs 3] [-t 2] [--json F]

Models are side_by_side.py's random-weight checkpoints in the real shapes (built on first use).
Each measurement runs in a fresh child process and scores `batch` distinct prompts at once.
Kwker: kwker.serve.Engine.submit(prompt_logprobs=True, max_new_tokens=0), the prompt tokens'
logprobs computed in C. llama.cpp: every prompt in one llama_batch with logits on every row
(as llama-perplexity asks), then the log-softmax of each row and the next token's entry, in
numpy over all rows at once. Figure: prompt tokens scored per second (median of --reps timed
passes after a warm-up), plus Kwker's plain prefill of the same prompts (no logprobs) for what
the scoring costs.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


sys.path.insert(0, str(HERE))
from bench_serving import prompt_ids  # noqa: E402 (the same distinct prompts)
from bench_serving import run as run_child  # noqa: E402


def kwker_child(job):
    sys.path.insert(0, str(REPO / "python"))
    from kwker.serve import Engine
    eng = Engine(job["model"], precision=job["precision"], max_batch=job["batch"],
                 max_cache_len=job["n_prompt"] + 8, n_threads=job["threads"],
                 cache_dir=job.get("cache_dir"))
    n_vocab = eng.vocab_size
    passes = iter(range(1000))

    def once(scored):
        base = next(passes) * job["batch"]
        t0 = time.perf_counter()
        reqs = [eng.submit(prompt_ids(base + b, job["n_prompt"], n_vocab), max_new_tokens=0,
                           eos_token_id=[], lookup=0, prompt_cache=False,
                           prompt_logprobs=scored) for b in range(job["batch"])]
        eng.run_until_done()
        dt = time.perf_counter() - t0
        for r in reqs:
            assert r.error is None
            assert not scored or len(r.prompt_logprobs) == job["n_prompt"]
        return job["batch"] * job["n_prompt"] / dt

    once(True)
    out = {"scored_tps": statistics.median(once(True) for _ in range(job["reps"])),
           "prefill_tps": statistics.median(once(False) for _ in range(job["reps"]))}
    print(json.dumps(out))


def llama_child(job):
    import ctypes

    import llama_cpp as L
    import numpy as np
    sink = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(sink, ctypes.c_void_p())
    L.llama_backend_init()
    model = L.llama_model_load_from_file(job["model"].encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit("llama.cpp could not load %s" % job["model"])
    B, n_p = job["batch"], job["n_prompt"]
    cp = L.llama_context_default_params()
    cp.n_ctx = B * (n_p + 8)
    cp.n_batch = cp.n_ubatch = B * n_p
    cp.n_seq_max = B
    cp.n_threads = cp.n_threads_batch = job["threads"]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not make a context")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(B * n_p, 0, 1)
    passes = iter(range(1000))

    def once():
        base = next(passes) * B
        L.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        ids = [prompt_ids(base + b, n_p, n_vocab) for b in range(B)]
        batch.n_tokens = B * n_p
        for b in range(B):
            for i, t in enumerate(ids[b]):
                k = b * n_p + i
                batch.token[k], batch.pos[k], batch.n_seq_id[k] = t, i, 1
                batch.seq_id[k][0], batch.logits[k] = b, 1
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(B * n_p, n_vocab))
        m = logits.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        nxt = np.array([t for b in range(B) for t in ids[b][1:] + [0]])
        lp = logits[np.arange(B * n_p), nxt] - lse
        assert np.isfinite(lp).all()
        return B * n_p / (time.perf_counter() - t0)

    once()
    out = {"scored_tps": statistics.median(once() for _ in range(job["reps"]))}
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps(out))


def run(job):
    return run_child(job, __file__)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="smollm2-135m")
    ap.add_argument("--pairs", default="balanced:q8_0,int4:q4_0")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3, help="alternating runs per side")
    ap.add_argument("--reps", type=int, default=2, help="timed passes inside a run (median)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--models-dir", default=str(REPO / ".cache" / "bench-models"))
    ap.add_argument("--cache-dir", default=str(REPO / ".cache" / "bench-packs"))
    ap.add_argument("--json", help="write every record to this file")
    a = ap.parse_args(argv)
    if a.child:
        job = json.loads(a.child)
        return kwker_child(job) if job["side"] == "kwker" else llama_child(job)

    sys.path.insert(0, str(HERE))
    import side_by_side
    pairs = [p.split(":") for p in a.pairs.split(",")]
    recs = []
    for name in a.models.split(","):
        files = side_by_side.model_files(name, a.models_dir, sorted({lf for _, lf in pairs}),
                                         a.threads)
        for kp, lf in pairs:
            common = dict(batch=a.batch, n_prompt=a.n_prompt, threads=a.threads, reps=a.reps)
            jk = dict(common, side="kwker", model=str(files["kwker"][kp]), precision=kp,
                      cache_dir=a.cache_dir)
            jl = dict(common, side="llama", model=str(files["llama"][lf]))
            ks, ls = [], []
            for _ in range(a.runs):
                ks.append(run(jk))
                ls.append(run(jl))
            rec = dict(model=name, kwker=kp, llama=lf, batch=a.batch, n_prompt=a.n_prompt,
                       kwker_scored=statistics.median(r["scored_tps"] for r in ks),
                       kwker_prefill=statistics.median(r["prefill_tps"] for r in ks),
                       llama_scored=statistics.median(r["scored_tps"] for r in ls))
            rec["ratio"] = rec["kwker_scored"] / rec["llama_scored"]
            recs.append(rec)
            print("%-14s %-8s vs %-6s  kwker %7.1f (plain prefill %7.1f)  llama.cpp %7.1f  "
                  "ratio %.2fx  (prompt tokens scored / s)" % (
                      name, kp, lf, rec["kwker_scored"], rec["kwker_prefill"],
                      rec["llama_scored"], rec["ratio"]), flush=True)
    print()
    print("| model | Kwker | llama.cpp | Kwker scored tok/s | Kwker plain prefill tok/s | "
          "llama.cpp scored tok/s | ratio |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in recs:
        print("| %s | %s | %s | %.1f | %.1f | %.1f | %.2f× |" % (
            r["model"], r["kwker"], r["llama"], r["kwker_scored"], r["kwker_prefill"],
            r["llama_scored"], r["ratio"]))
    if a.json:
        Path(a.json).write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
