"""bench_serving.py - batched serving throughput: B requests at once (64-token prompts, 64 new
tokens each, greedy), generated tokens per second summed over the requests, Kwker's engine beside
llama.cpp's batched decoding on the same weights and thread count, alternately (A B A B ...).

    python3 bench/bench_serving.py [--models smollm2-135m,smollm2-360m] [--batches 1,8]
                                   [--pairs balanced:q8_0,int4:q4_0] [--runs 3] [-t 2] [--json F]

Models are side_by_side.py's random-weight checkpoints in the real shapes (built on first use).
Each measurement runs in a fresh child process. Two figures per run:
  total   B * n_gen / (time from submitting every prompt to the last token): what a client sees
  decode  B * (n_gen - 1) / (time from the last request's first token to the last token): the
          batched decode rate alone, the figure llama-batched-bench calls S_TG
llama.cpp side: one context with n_seq_max = B, every prompt in one llama_batch (one sequence id
each), then n_gen steps of one llama_batch holding each sequence's next token; greedy argmax of
each sequence's logits in numpy, as the engine picks its tokens in C.

--shared-prompt: the B requests of a pass share one prompt (the `n` choices of one request, or a
burst with one system prompt). Kwker submits them with prompt reuse on (the engine reads the
prompt once and copies its K/V to the others) and, alternated with it, off (each reads its own:
what the engine did before requests in flight shared a prompt); llama.cpp decodes the prompt
once in sequence 0 and copies it with llama_memory_seq_cp, as its `batched` example does.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def prompt_ids(b, n, n_vocab):
    """Request b's prompt: distinct per request and per pass (b counts on), the same on both
    sides, so no pass can reuse an earlier pass's prompt."""
    return [((b * 1000 + i) * 2654435761) % (1 << 32) % n_vocab for i in range(n)]


# ---- children: one measurement each ------------------------------------------------------------

def kwker_child(job):
    sys.path.insert(0, str(REPO / "python"))
    from kwker.serve import Engine
    eng = Engine(job["model"], precision=job["precision"], max_batch=job["batch"],
                 max_cache_len=job["n_prompt"] + job["n_gen"] + 8, n_threads=job["threads"],
                 prefill_chunk=512, cache_dir=job.get("cache_dir"))
    n_vocab = eng.vocab_size

    passes = iter(range(1000))

    def once():
        base = next(passes) * job["batch"]
        shared = job.get("shared")
        t0 = time.perf_counter()
        reqs = [eng.submit(prompt_ids(base + (0 if shared else b), job["n_prompt"], n_vocab),
                           max_new_tokens=job["n_gen"], lookup=0, eos_token_id=[],
                           prompt_cache=bool(job.get("share_on"))) for b in range(job["batch"])]
        eng.run_until_done()
        t_end = time.perf_counter()
        for r in reqs:
            assert len(r.tokens) == job["n_gen"], (len(r.tokens), r.finish_reason)
        t_first = t0 + max(r.ttft_s for r in reqs)
        return (job["batch"] * job["n_gen"] / (t_end - t0),
                job["batch"] * (job["n_gen"] - 1) / max(t_end - t_first, 1e-9))

    once()
    res = [once() for _ in range(job["reps"])]
    print(json.dumps({"total_tps": statistics.median(r[0] for r in res),
                      "decode_tps": statistics.median(r[1] for r in res)}))


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
    B, n_p, n_g = job["batch"], job["n_prompt"], job["n_gen"]
    cp = L.llama_context_default_params()
    cp.n_ctx = B * (n_p + n_g + 8)
    cp.n_batch = cp.n_ubatch = max(512, B * n_p)
    cp.n_seq_max = B
    cp.n_threads = cp.n_threads_batch = job["threads"]
    if job.get("shared"):  # sequences share the prompt's cells only in one unified cache
        cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not make a context")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(B * n_p, 0, 1)

    def fill(rows):
        batch.n_tokens = len(rows)
        for i, (tok, pos, seq, want) in enumerate(rows):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = want

    def argmax_rows(n):
        out = []
        for i in range(n):
            p = L.llama_get_logits_ith(ctx, i)
            out.append(int(np.argmax(np.ctypeslib.as_array(p, shape=(n_vocab,)))))
        return out

    passes = iter(range(1000))

    def once():
        base = next(passes) * B
        L.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        rows = []
        for b in range(1 if job.get("shared") else B):
            ids = prompt_ids(base + b, n_p, n_vocab)
            rows += [(t, i, b, int(i == n_p - 1)) for i, t in enumerate(ids)]
        fill(rows)
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed on the prompts")
        if job.get("shared"):  # the prompt's cells shared by every sequence
            for b in range(1, B):
                L.llama_memory_seq_cp(mem, 0, b, -1, -1)
        # logits of the rows flagged, in order: one per sequence
        last = [0 if job.get("shared") else b for b in range(B)]
        nxt = [int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, (k + 1) * n_p - 1),
                                                   shape=(n_vocab,)))) for k in last]
        t_first = time.perf_counter()
        for s in range(1, n_g):
            fill([(nxt[b], n_p + s - 1, b, 1) for b in range(B)])
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed on a decode step")
            nxt = argmax_rows(B)
        t_end = time.perf_counter()
        return B * n_g / (t_end - t0), B * (n_g - 1) / (t_end - t_first)

    once()
    res = [once() for _ in range(job["reps"])]
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps({"total_tps": statistics.median(r[0] for r in res),
                      "decode_tps": statistics.median(r[1] for r in res)}))


# ---- the parent: build models, alternate sides, print --------------------------------------------

def run(job, script=__file__):
    """One measurement: script's --child run of job in a fresh process; its last JSON line."""
    cmd = [sys.executable, str(script), "--child", json.dumps(job)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit("child failed: %s\n%s" % (" ".join(cmd[:3]), out.stderr[-3000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="smollm2-135m,smollm2-360m")
    ap.add_argument("--pairs", default="int4:q4_0,balanced:q8_0")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--runs", type=int, default=3, help="alternating runs per side")
    ap.add_argument("--reps", type=int, default=2, help="timed passes inside a run (median)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=64)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--shared-prompt", action="store_true",
                    help="the B requests of a pass share one prompt (module docstring)")
    ap.add_argument("--models-dir", default=str(REPO / ".cache" / "bench-models"))
    ap.add_argument("--json", help="write every record to this file")
    ap.add_argument("--cache-dir", default=str(REPO / ".cache" / "bench-packs"),
                    help="Kwker's packed-weight cache (packing is not timed; this only saves "
                         "the repacking in every child)")
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
            for B in [int(x) for x in a.batches.split(",")]:
                common = dict(batch=B, n_prompt=a.n_prompt, n_gen=a.n_gen, threads=a.threads,
                              reps=a.reps, shared=a.shared_prompt)
                jk = dict(common, side="kwker", model=str(files["kwker"][kp]), precision=kp,
                          cache_dir=a.cache_dir, share_on=a.shared_prompt)
                jl = dict(common, side="llama", model=str(files["llama"][lf]))
                ks, ls, kn = [], [], []
                for _ in range(a.runs):
                    ks.append(run(jk))
                    ls.append(run(jl))
                    if a.shared_prompt:  # the same prompts, each read by its own request
                        kn.append(run(dict(jk, share_on=False)))
                rec = dict(model=name, kwker=kp, llama=lf, batch=B,
                           kwker_total=statistics.median(r["total_tps"] for r in ks),
                           kwker_decode=statistics.median(r["decode_tps"] for r in ks),
                           llama_total=statistics.median(r["total_tps"] for r in ls),
                           llama_decode=statistics.median(r["decode_tps"] for r in ls))
                rec["ratio_total"] = rec["kwker_total"] / rec["llama_total"]
                rec["ratio_decode"] = rec["kwker_decode"] / rec["llama_decode"]
                if kn:
                    rec["kwker_unshared_total"] = statistics.median(r["total_tps"] for r in kn)
                    print("%-14s %-8s B=%d shared prompt read once: total %.1f tok/s, read by "
                          "each: %.1f (%.2fx)" % (name, kp, B, rec["kwker_total"],
                                                  rec["kwker_unshared_total"], rec["kwker_total"] /
                                                  rec["kwker_unshared_total"]), flush=True)
                recs.append(rec)
                print("%-14s %-8s vs %-6s B=%d  kwker %7.1f / %7.1f  llama.cpp %7.1f / %7.1f  "
                      "ratio %.2fx / %.2fx  (total / decode tok/s)" % (
                          name, kp, lf, B, rec["kwker_total"], rec["kwker_decode"],
                          rec["llama_total"], rec["llama_decode"], rec["ratio_total"],
                          rec["ratio_decode"]), flush=True)
    print()
    print("| model | Kwker | llama.cpp | requests | Kwker tok/s (total / decode) | "
          "llama.cpp tok/s (total / decode) | ratio (total / decode) |")
    print("|---|---|---|---|---|---|---|")
    for r in recs:
        print("| %s | %s | %s | %d | %.1f / %.1f | %.1f / %.1f | %.2f× / %.2f× |" % (
            r["model"], r["kwker"], r["llama"], r["batch"], r["kwker_total"], r["kwker_decode"],
            r["llama_total"], r["llama_decode"], r["ratio_total"], r["ratio_decode"]))
    if a.json:
        Path(a.json).write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
