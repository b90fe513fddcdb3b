"""Encode throughput on War and Peace, one thread: Kwker vs Hugging Face `tokenizers`.

Usage: python bench/bench_tokenizer.py [--repeat N] [--tokenizer NAME ...]
Prints MB/s for each and the ratio (kwker / tokenizers). A benchmark, not a test: nothing is
asserted except that both produce the same ids.
"""
import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

import tokenizers  # noqa: E402

from kwker.tokenizer import Tokenizer  # noqa: E402
from llamacpp import SHARED_DATA as DATA  # noqa: E402  (bench/: the script's own folder)


def unigram_file():
    """XLM-R's shape: the SentencePiece unigram (nmt_nfkc charsmap, Metaspace) that the tests
    train on War and Peace's first 300 kB (tests/python/tiny_spm.py; cached after one run)."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import tiny_spm
    return tiny_spm.spm_dir() / "tokenizer.json"


def tokenizer_files(tmp):
    t = DATA / "tokenizers"
    llama3 = Path(tmp) / "llama3"
    llama3.mkdir()
    with gzip.open(t / "llama3" / "tokenizer.json.gz", "rb") as f, \
            open(llama3 / "tokenizer.json", "wb") as g:
        shutil.copyfileobj(f, g)
    return {
        "smollm": t / "smollm" / "from-SmolLM-135M-finetune" / "tokenizer.json",
        "llama3": llama3 / "tokenizer.json",
        "llama2": t / "llama2-tinyllama" / "tokenizer.json",
        "bert": t / "bert-uncased" / "bert-base-uncased.tokenizer.json",
        "unigram": unigram_file(),
    }


def best_of(fn, repeat):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokenizer", nargs="*", default=None)
    args = ap.parse_args()
    text = (DATA / "text" / "war-and-peace.txt").read_text(encoding="utf-8")
    mb = len(text.encode("utf-8")) / 1e6
    print("War and Peace: %.2f MB, one thread, best of %d" % (mb, args.repeat))
    paras = [p for p in text.split("\n\n") if p]
    print("modes: 'whole' = the book in one encode call; 'paras' = %d paragraphs, one call each"
          % len(paras))
    print("%-8s %-6s %12s %12s %8s %10s" % ("tokenizer", "mode", "kwker MB/s", "HF MB/s",
                                            "ratio", "tokens"))
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in tokenizer_files(tmp).items():
            if args.tokenizer and name not in args.tokenizer:
                continue
            hf = tokenizers.Tokenizer.from_file(str(path))
            hf.no_truncation()
            hf.no_padding()
            kw = Tokenizer.from_pretrained(str(path))
            t_hf, ids_hf = best_of(lambda: hf.encode(text, add_special_tokens=False).ids,
                                   args.repeat)
            t_kw, ids_kw = best_of(lambda: kw.encode(text, add_special_tokens=False), args.repeat)
            same = "same ids" if ids_hf == ids_kw else "IDS DIFFER"
            print("%-8s %-6s %12.2f %12.2f %8.2f %10d  %s" % (
                name, "whole", mb / t_kw, mb / t_hf, t_hf / t_kw, len(ids_kw), same))
            pmb = sum(len(p.encode("utf-8")) for p in paras) / 1e6
            t_hf, ids_hf = best_of(lambda: [hf.encode(p, add_special_tokens=False).ids
                                            for p in paras], args.repeat)
            t_kw, ids_kw = best_of(lambda: [kw.encode(p, add_special_tokens=False)
                                            for p in paras], args.repeat)
            same = "same ids" if ids_hf == ids_kw else "IDS DIFFER"
            print("%-8s %-6s %12.2f %12.2f %8.2f %10d  %s" % (
                name, "paras", pmb / t_kw, pmb / t_hf, t_hf / t_kw, sum(map(len, ids_kw)), same))


if __name__ == "__main__":
    main()
