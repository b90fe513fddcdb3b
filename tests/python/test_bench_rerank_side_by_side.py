"""Smoke test of bench/rerank_side_by_side.py (Kwker's cross-encoders beside llama.cpp's rank
models): the tool runs end to end in --quick mode on its tiny random BERT reranker (preserve vs
F32, int4 vs Q4_0), each side in its own processes, its JSON has every field with sensible
values, and the two sides' logits of the same token ids agree. A test of the tool, never of
speed: no time is compared with another.

Needs all-MiniLM-L6-v2's tokenizer (scripts/setup --test; $KWK_MINILM overrides its folder),
libkwker ($KWKER_LIB or python/kwker's search), bw_probe ($KWK_BW_PROBE or beside kwker),
transformers (the random model) and llama-cpp-python (scripts/setup --test installs it): a
missing one fails the test and says how to get it, never skips it. The model and its GGUF files
are cached in $KWK_TEST_CACHE/bench-models/rerank (default /tmp/kwker-test-models)."""
import statistics
from pathlib import Path

import pytest

from test_bench_embed_side_by_side import run_quick, side_runs

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "rerank_side_by_side.py"
WORKLOADS = {"batch": (8, 64), "request": (4, 64), "long": (2, 490)}  # --quick's
QUERY = 16


def test_quick_run_writes_complete_json(tmp_path):
    proc, data = run_quick(tmp_path, SCRIPT, "tokenizer.json", "rerank")
    st = data["settings"]
    assert st["runs"] == 2 and st["threads"] == 2 and st["request_reps"] == 2
    assert st["query_tokens"] == QUERY
    assert st["workloads"] == {w: {"docs": n, "tokens": t} for w, (n, t) in WORKLOADS.items()}
    assert min(st["llama_batch"].values()) >= 512  # a pair fits one ubatch
    recs = data["results"]
    assert [(r["model"], r["kwker"], r["llama_format"]) for r in recs] == \
        [("tiny-random", "preserve", "f32"), ("tiny-random", "int4", "q4_0")]
    for r in recs:
        # llama.cpp's rerank prompt for a BERT vocabulary: [CLS] q [SEP] d (no closing [SEP]),
        # Hugging Face's: [CLS] q [SEP] d [SEP]
        assert r["format_rerank"] == {"add_bos": True, "add_eos": False, "add_sep": True}
        for side, extra in (("kwker", 3), ("llama", 2)):
            runs = side_runs(r, side)
            for run in runs:
                for w, (n, t) in WORKLOADS.items():
                    x = run["workloads"][w]
                    assert x["n_docs"] == n
                    assert x["n_tokens"] == n * (QUERY + t + extra), (side, w, x["n_tokens"])
                    assert len(x["all_seconds"]) == (2 if w == "request" else 1)
                    assert x["seconds"] == statistics.median(x["all_seconds"]) > 0
            s = r["%s_summary" % side]
            for w in WORKLOADS:
                assert s[w]["ms"] == statistics.median(x["workloads"][w]["ms"] for x in runs)
                assert s[w]["pairs_per_s"] == pytest.approx(1e3 * s[w]["n_docs"] / s[w]["ms"])
        assert set(r["ratio"]) == set(WORKLOADS) and all(v > 0 for v in r["ratio"].values())
    # a round alternates the sides and the next runs them in reverse order
    seqs = [[x["seq"] for x in r["runs"][side]] for r in recs for side in ("kwker", "llama")]
    assert seqs == [[1, 8], [2, 7], [3, 6], [4, 5]]
    # the check, on llama.cpp's token ids (types 0): preserve and F32 run the same numbers up to
    # llama.cpp's tanh GELU and its sums' order; int4 and Q4_0 only roughly; preserve is its
    # own reference
    pres, int4 = recs[0]["check"], recs[1]["check"]
    n_pairs = sum(n for n, _ in WORKLOADS.values())
    assert pres["n_pairs"] == int4["n_pairs"] == n_pairs
    assert pres["max_abs_logit"] > 0
    assert pres["kwker_vs_ref"] == 0.0
    assert 0.0 <= pres["median_abs_diff"] <= pres["max_abs_diff"] \
        <= 1e-3 * max(1.0, pres["max_abs_logit"]), pres
    assert pres["llama_vs_ref"] == pytest.approx(pres["max_abs_diff"])
    assert int4["kwker_vs_ref"] > 0 and int4["llama_vs_ref"] > 0
    assert int4["max_abs_diff"] <= 0.25 * max(1.0, pres["max_abs_logit"]), int4
    # the Markdown table: header, separator and one row a pair, also on stdout
    table = data["markdown"].splitlines()
    assert len(table) == 4 and table[2].startswith("| tiny-random | preserve | F32 |")
    assert table[0].count("|") == table[1].count("|") == table[3].count("|")
    assert data["markdown"] in proc.stdout
