#!/usr/bin/env python3
"""What constrained decoding costs a generated token: the same prompt generated free, under a
JSON schema (greedy: the argmax is checked first; sampling: a mask every token) and under a lazy
grammar whose trigger never comes (tool calls under "auto": the cost of watching for it),
interleaved A B C A B C ..., medians of the time per generated token. Prints one line per mode and the
ratios to free generation. Not a test: figures go to docs/benchmarks.md.

    python3 bench/constrained.py [--model M] [--precision balanced] [--act-bits 8] [--runs 5]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from kwker.decode import KwkDecoder  # noqa: E402
from kwker.grammar import Grammar  # noqa: E402
from kwker.template import ChatTemplate  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "bio": {"type": "string"},
    },
    "required": ["name", "age", "city", "hobbies", "bio"],
    "additionalProperties": False,
}
PROMPT = ("Describe an imaginary person as JSON with a name, an age, a city, a list of hobbies "
          "and a long biography.")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--precision", default="balanced")
    ap.add_argument("--act-bits", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-n", type=int, default=160, help="new tokens a run")
    a = ap.parse_args()
    dec = KwkDecoder(a.model, max_cache_len=1024, precision=a.precision, n_threads=a.threads,
                     act_bits=a.act_bits if a.precision != "preserve" else None,
                     cache_dir=True)
    tok = dec.tokenizer()
    prompt = ChatTemplate(tok.chat_template).render({
        "messages": [{"role": "user", "content": PROMPT}], "add_generation_prompt": True})
    ids = tok.encode(prompt, add_special_tokens=False)
    g = Grammar.from_json_schema(PERSON)
    lazy = Grammar.from_gbnf('root ::= "<tool_call>" [a-z]+ "</tool_call>"')
    modes = {
        "free greedy": dict(),
        "schema greedy": dict(grammar=g),
        "lazy greedy": dict(grammar=lazy, grammar_trigger="<tool_call>"),
        "free sampled": dict(do_sample=True, temperature=0.8, top_k=0, seed=1),
        "schema sampled": dict(do_sample=True, temperature=0.8, top_k=0, seed=1, grammar=g),
        "lazy sampled": dict(do_sample=True, temperature=0.8, top_k=0, seed=1, grammar=lazy,
                             grammar_trigger="<tool_call>"),
    }
    # every mode generates exactly n tokens: eos never ends it (min_new_tokens), and a schema
    # reply that ends early is counted by its own tokens
    times = {m: [] for m in modes}
    dec.generate(ids, max_new_tokens=8)  # warm
    for _ in range(a.runs):
        for m, kw in modes.items():
            t0 = time.perf_counter()
            r = dec.generate(ids, max_new_tokens=a.n, lookup=0, prompt_cache=True,
                             return_dict_in_generate=True, **kw)
            dt = time.perf_counter() - t0
            n = len(r.tokens)
            times[m].append((dt, n))
    print("model %s, %s, act_bits %s, %d threads, %d runs (interleaved), up to %d tokens"
          % (Path(a.model).name, a.precision, a.act_bits, a.threads, a.runs, a.n))
    base = {}
    for m in modes:
        per_tok = statistics.median(dt / max(n, 1) * 1e3 for dt, n in times[m])
        toks = statistics.median(n for _, n in times[m])
        base.setdefault(m.split()[1], per_tok)
        ref = base[m.split()[1]]
        print("%-15s %7.3f ms/token  (median %d tokens)  x%.3f of free" % (m, per_tok, toks,
                                                                          per_tok / ref))


if __name__ == "__main__":
    main()
