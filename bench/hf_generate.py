#!/usr/bin/env python3
"""hf_generate.py - transformers' own model.generate beside the same call after kwker.install.

  python3 bench/hf_generate.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [-t 2]
      [--batch 1,4] [-p 128] [-n 64] [--runs 3] [--precision preserve]

The model is loaded by transformers in float32 (a .gguf file dequantized, as transformers loads
it; or a folder / Hugging Face id), with torch on -t threads and Kwker on as many. For each batch
size, greedy generation of -n new tokens after prompts of -p tokens (random ids, left-padded to
one length), alternately transformers and Kwker, --runs times each; prints the medians of new
tokens per second (all rows) and the ratio, and checks the outputs are the same tensors.
OMP_WAIT_POLICY defaults to PASSIVE (torch's spinning threads would slow Kwker's steps).
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(HERE.parent / "models" /
                                           "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("-p", "--prompt", type=int, default=128)
    ap.add_argument("-n", "--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--precision", default="preserve")
    a = ap.parse_args()

    # torch's OpenMP threads spin after each parallel region and took 60% of Kwker's time in
    # the step right after transformers' (measured: 97 against 241 tokens/s); passive waiting
    # costs torch nothing measurable here. Set before torch loads libgomp.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    import kwker
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(a.threads)
    path = Path(a.model)
    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    kwker.install(model, precision=a.precision, n_threads=a.threads)
    install_s = time.perf_counter() - t0
    print("install: %.2f s (%s)" % (install_s, "saved copy" if model._kwker_install.saved_dir
                                     else "the model's files"))
    print("| batch | prompt | new | transformers tok/s | Kwker tok/s | Kwker / transformers |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b in [int(x) for x in a.batch.split(",")]:
        ids = torch.randint(10, vocab - 10, (b, a.prompt), generator=gen)
        mask = torch.ones_like(ids)
        for r in range(1, b):  # rows of different lengths, left-padded as a tokenizer pads
            mask[r, : r * 4] = 0
            ids[r, : r * 4] = 0
        kw = dict(attention_mask=mask, max_new_tokens=a.new, min_new_tokens=a.new,
                  do_sample=False, pad_token_id=0)
        times = {"hf": [], "kwk": []}
        outs = {}
        for _ in range(a.runs):
            for side in ("hf", "kwk"):
                fn = model.generate if side == "kwk" else type(model).generate.__get__(model)
                t0 = time.perf_counter()
                with torch.no_grad():
                    outs[side] = fn(ids, **kw)
                times[side].append(time.perf_counter() - t0)
        same = torch.equal(outs["hf"], outs["kwk"])
        hf = b * a.new / statistics.median(times["hf"])
        kw_ = b * a.new / statistics.median(times["kwk"])
        print("| %d | %d | %d | %.1f | %.1f | %.2f%s |" % (b, a.prompt, a.new, hf, kw_, kw_ / hf,
                                                         "" if same else " (outputs differ)"))
    kwker.uninstall(model)


if __name__ == "__main__":
    main()
