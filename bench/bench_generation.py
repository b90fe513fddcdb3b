"""Generation benchmark (never a test): prompt reuse across chat turns, n-gram lookup, and a draft
model, on SmolLM2-135M-Instruct (GGUF), through the Python binding over libkwker.

  (a) time to first token of chat turns 2-6, prompt reuse on vs off: a ~1,024-token system prompt
      cut from War and Peace, ~64-token user messages, replies capped at 32 tokens;
  (b) decode tokens/s with lookup=8 vs lookup=0 on 5 quoting prompts (edits / summaries of a given
      code snippet or paragraph) and 5 free-text prompts, 128 new tokens at most (eos ends early);
  (c) a draft model: no smaller model with SmolLM2's vocabulary is available here, so the draft
      is the same checkpoint at precision int4 (about 5x fewer weight bytes per token) for the
      target at preserve (float32 math): a real draft (same tokenizer, close predictions) that
      proposes n_draft=4 tokens in the first step (then +2 after a step that keeps them all, -1
      otherwise), lookup off on both sides.

A/B runs are interleaved (A B A B ...) --reps times each and medians reported. Greedy decoding, so
A and B produce the same tokens (checked). Usage:

  KWKER_LIB=build/libkwker.so python3 bench/bench_generation.py [--threads 2] [--reps 3]
      [--parts abc] [--model PATH]

Prints markdown tables (paste into docs/benchmarks.md).
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import kwker  # noqa: E402
from kwker.template import apply_chat_template  # noqa: E402
from llamacpp import SHARED_DATA  # noqa: E402  (bench/: the script's own folder)

TEXT = SHARED_DATA / "text" / "war-and-peace.txt"

CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, x in enumerate(values):
        total += x
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''

C_CODE = '''static int parse_port(const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 1 || v > 65535)
        return -1;
    *out = (int)v;
    return 0;
}
'''

PARAGRAPH = ("The old bridge crossed the river at its narrowest point, where the water ran fast "
             "and cold over dark stones. Every morning the baker's cart rattled across it on the "
             "way to the market, and every evening the same cart came back empty, pulled by a "
             "tired brown horse that knew the road better than its driver. In spring the river "
             "rose and the villagers watched the bridge with worry, but it had stood for two "
             "hundred years and it stood again.")

QUOTING = [
    "Here is a Python function:\n\n%s\nRename the variable `total` to `running_sum` and show the "
    "whole function again." % CODE,
    "Here is a C function:\n\n%s\nAdd a comment above each line explaining it, and show the "
    "whole function." % C_CODE,
    "Fix the punctuation in this paragraph and return it in full:\n\n%s" % PARAGRAPH,
    "Summarize this paragraph, quoting its most important sentence exactly:\n\n%s" % PARAGRAPH,
    "Add type hints to this Python function and show the full result:\n\n%s" % CODE,
]

FREE = [
    "Write a short poem about autumn leaves.",
    "Explain how photosynthesis works to a ten-year-old.",
    "Give me five tips for learning a new language.",
    "Describe a day at the beach.",
    "What are the benefits of regular exercise?",
]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


class Run:
    """Times one generate call: time to first token (the streamer's first call) and decode rate."""

    def __init__(self, dec, tok):
        self.dec, self.tok = dec, tok

    def __call__(self, ids, **kw):
        first = []

        def streamer(token, text):
            if not first:
                first.append(time.perf_counter())
            return 0
        t0 = time.perf_counter()
        out = self.dec.generate(ids, tokenizer=self.tok, streamer=streamer, **kw)
        t1 = time.perf_counter()
        st = dict(self.dec.stats)
        n = st["generated"]
        ttft = (first[0] if first else t1) - t0
        rate = (n - 1) / (t1 - first[0]) if first and n > 1 and t1 > first[0] else float("nan")
        return {"ttft": ttft, "rate": rate, "n": n, "stats": st,
                "tokens": list(out[len(ids):])}


def chat_ids(tok, messages):
    text = apply_chat_template(tok.chat_template, messages, add_generation_prompt=True,
                               bos_token=tok.bos_token, eos_token=tok.eos_token)
    return tok.encode(text, add_special_tokens=False)


def cut_tokens(tok, text, n):
    """About n tokens of text (decoded from the first n ids)."""
    return tok.decode(tok.encode(text, add_special_tokens=False)[:n]).strip()


def part_a(model, tok, args):
    words = TEXT.read_text(encoding="utf-8", errors="replace").split()
    book = " ".join(words[20000:60000])
    system = "You are a literary assistant. Here is the passage we discuss:\n\n" + \
        cut_tokens(tok, book, 1024)
    rest = " ".join(words[70000:])
    users = [cut_tokens(tok, "Consider this excerpt: " + " ".join(rest.split()[i * 300:
                                                                         i * 300 + 120]), 64)
             for i in range(6)]
    decs = {m: kwker.KwkDecoder(model, max_cache_len=4096, n_threads=args.threads)
            for m in ("reuse", "fresh")}
    ttft = {m: {t: [] for t in range(1, 7)} for m in decs}
    prompt_len = {}
    reused = {t: [] for t in range(1, 7)}
    for rep in range(args.reps):
        msgs = {m: [{"role": "system", "content": system}] for m in decs}
        for turn in range(1, 7):
            res = {}
            order = ("reuse", "fresh") if (rep + turn) % 2 == 0 else ("fresh", "reuse")
            for m in order:
                msgs[m].append({"role": "user", "content": users[turn - 1]})
                ids = chat_ids(tok, msgs[m])
                if turn == 1 and m == "reuse":
                    # start each repetition from an empty cache
                    decs[m].generate(ids[:2], max_new_tokens=0, prompt_cache=False)
                r = Run(decs[m], tok)(ids, max_new_tokens=32, prompt_cache=(m == "reuse"),
                                      lookup=0)
                res[m] = r
                prompt_len[turn] = len(ids)
                ttft[m][turn].append(r["ttft"])
                msgs[m].append({"role": "assistant", "content": r["stats"]["text"]})
            reused[turn].append(res["reuse"]["stats"]["prompt_reused"])
            if res["reuse"]["tokens"] != res["fresh"]["tokens"]:
                print("WARNING: turn %d: reuse changed the reply" % turn, file=sys.stderr)
            print("  (a) rep %d turn %d: prompt %d, reused %d, ttft reuse %.3f s, fresh %.3f s"
                  % (rep + 1, turn, prompt_len[turn], reused[turn][-1], res["reuse"]["ttft"],
                     res["fresh"]["ttft"]), file=sys.stderr, flush=True)
    for d in decs.values():
        d.close()
    lines = ["| turn | prompt tokens | reused | TTFT reuse (s) | TTFT no reuse (s) | speed-up |",
             "|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for turn in range(2, 7):
        a, b = median(ttft["reuse"][turn]), median(ttft["fresh"][turn])
        ratios.append(b / a)
        lines.append("| %d | %d | %d | %.3f | %.3f | %.1fx |" % (
            turn, prompt_len[turn], median(reused[turn]), a, b, b / a))
    lines.append("| 2-6 | | | %.3f (sum) | %.3f (sum) | %.1fx (median of turns) |" % (
        sum(median(ttft["reuse"][t]) for t in range(2, 7)),
        sum(median(ttft["fresh"][t]) for t in range(2, 7)), median(ratios)))
    return "\n".join(lines)


def part_b(model, tok, args):
    dec = kwker.KwkDecoder(model, max_cache_len=2048, n_threads=args.threads)
    run = Run(dec, tok)
    rows = []
    for kind, prompts in (("quoting", QUOTING), ("free text", FREE)):
        for i, p in enumerate(prompts):
            ids = chat_ids(tok, [{"role": "user", "content": p}])
            rates = {8: [], 0: []}
            acc = []
            toks = {}
            for rep in range(args.reps):
                for lk in ((8, 0) if rep % 2 == 0 else (0, 8)):
                    r = run(ids, max_new_tokens=args.n_new, lookup=lk, prompt_cache=True)
                    rates[lk].append(r["rate"])
                    toks[lk] = r["tokens"]
                    if lk == 8:
                        acc.append((r["stats"]["accepted"], r["stats"]["proposed"],
                                    r["stats"]["steps"]))
            if toks[8] != toks[0]:
                print("WARNING: lookup changed the tokens of %s prompt %d" % (kind, i + 1),
                      file=sys.stderr)
            a, p_, s = acc[-1]
            rows.append((kind, i + 1, len(ids), len(toks[8]), median(rates[0]),
                         median(rates[8]), a, p_, s))
            print("  (b) %s %d: %d tokens, off %.1f tok/s, lookup %.1f tok/s, accepted %d/%d" % (
                kind, i + 1, len(toks[8]), median(rates[0]), median(rates[8]), a, p_),
                file=sys.stderr, flush=True)
    dec.close()
    lines = ["| prompts | # | prompt tokens | new tokens | lookup=0 tok/s | lookup=8 tok/s | "
             "speed-up | accepted / proposed | passes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, i, np_, nn, r0, r8, a, p_, s in rows:
        lines.append("| %s | %d | %d | %d | %.1f | %.1f | %.2fx | %d / %d | %d |" % (
            kind, i, np_, nn, r0, r8, r8 / r0, a, p_, s))
    for kind in ("quoting", "free text"):
        sel = [r for r in rows if r[0] == kind]
        lines.append("| **%s** (median) | | | | %.1f | %.1f | **%.2fx** | | |" % (
            kind, median([r[4] for r in sel]), median([r[5] for r in sel]),
            median([r[5] / r[4] for r in sel])))
    return "\n".join(lines)


def part_c(model, tok, args):
    dec = kwker.KwkDecoder(model, max_cache_len=2048, n_threads=args.threads)
    draft = kwker.KwkDecoder(model, max_cache_len=2048, n_threads=args.threads, precision="int4")
    run = Run(dec, tok)
    prompts = [QUOTING[0], QUOTING[2], FREE[1], FREE[3]]
    names = ["quoting 1", "quoting 3", "free 2", "free 4"]
    lines = ["| prompt | new tokens | no draft tok/s | draft tok/s | speed-up | accepted / "
             "proposed |", "|---|---:|---:|---:|---:|---:|"]
    for i, p in enumerate(prompts):
        ids = chat_ids(tok, [{"role": "user", "content": p}])
        rates = {"off": [], "draft": []}
        toks = {}
        acc = None
        for rep in range(args.reps):
            for m in (("draft", "off") if rep % 2 == 0 else ("off", "draft")):
                kw = {"draft": draft, "n_draft": 4} if m == "draft" else {}
                r = run(ids, max_new_tokens=args.n_new, lookup=0, prompt_cache=True, **kw)
                rates[m].append(r["rate"])
                toks[m] = r["tokens"]
                if m == "draft":
                    acc = (r["stats"]["accepted"], r["stats"]["proposed"])
        if toks["off"] != toks["draft"]:
            print("WARNING: the draft changed the tokens", file=sys.stderr)
        a, b = median(rates["off"]), median(rates["draft"])
        lines.append("| %s | %d | %.1f | %.1f | %.2fx | %d / %d |" % (
            names[i], len(toks["off"]), a, b, b / a, acc[0], acc[1]))
        print("  (c) prompt %d: off %.1f, draft %.1f tok/s, accepted %d/%d" % (
            i + 1, a, b, acc[0], acc[1]), file=sys.stderr, flush=True)
    dec.close()
    draft.close()
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get(
        "KWK_SMOLLM2_GGUF", str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n-new", type=int, default=128)
    ap.add_argument("--parts", default="abc")
    args = ap.parse_args()
    tok = kwker.Tokenizer.from_pretrained(args.model)
    print("model %s, %d threads, %d interleaved repetitions, medians; load average at start "
          "%s" % (Path(args.model).name, args.threads, args.reps,
                  " ".join("%.1f" % x for x in os.getloadavg())))
    print("command: %s\n" % " ".join(["python3"] + sys.argv))
    if "a" in args.parts:
        print("### (a) Time to first token, chat turns 2-6, prompt reuse on vs off\n")
        print(part_a(args.model, tok, args) + "\n", flush=True)
    if "b" in args.parts:
        print("### (b) Decode tokens/s, n-gram lookup=8 vs off (max %d new tokens)\n" % args.n_new)
        print(part_b(args.model, tok, args) + "\n", flush=True)
    if "c" in args.parts:
        print("### (c) Draft model: preserve target, int4 draft of the same checkpoint "
              "(max %d new tokens)\n" % args.n_new)
        print(part_c(args.model, tok, args) + "\n", flush=True)
    print("load average at end %s" % " ".join("%.1f" % x for x in os.getloadavg()))


if __name__ == "__main__":
    main()
