"""Smoke test of bench/embed_side_by_side.py (Kwker's encoders beside llama.cpp's): the tool runs
end to end in --quick mode on all-MiniLM-L6-v2 (preserve vs F32, int4 vs Q4_0), each side in its
own processes, and its JSON has every field with sensible values. A test of the tool, never of
speed: no time is compared with another.

Needs all-MiniLM-L6-v2 (scripts/setup --test; $KWK_MINILM overrides its folder), libkwker
($KWKER_LIB or python/kwker's search), bw_probe ($KWK_BW_PROBE or beside kwker) and
llama-cpp-python (scripts/setup --test installs it): a missing one fails the test and says how
to get it, never skips it. The GGUF files are cached in $KWK_TEST_CACHE/bench-models/embed
(default /tmp/kwker-test-models)."""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "embed_side_by_side.py"
MINILM = Path(os.environ.get("KWK_MINILM") or REPO / "models" / "all-MiniLM-L6-v2")
BIN = Path(os.environ.get("KWKER_BIN") or REPO / "build" / "kwker")
PROBE = Path(os.environ.get("KWK_BW_PROBE") or BIN.parent / "bw_probe")


def run_quick(tmp_path, script, needs, name):
    """script --quick into a JSON file, the model and its GGUF files cached in
    $KWK_TEST_CACHE/bench-models/<name>: (the finished process, the JSON). Fails (never skips)
    where llama_cpp, all-MiniLM-L6-v2's file needs or bw_probe is missing."""
    assert importlib.util.find_spec("llama_cpp") is not None, \
        "llama_cpp (llama-cpp-python) is not importable: run scripts/setup --test (or --bench)"
    if not (MINILM / needs).is_file():
        pytest.fail("all-MiniLM-L6-v2 not found at %s: run scripts/setup --test" % MINILM)
    if not PROBE.is_file():
        pytest.fail("bw_probe not found at %s: build it (scripts/build) or set KWK_BW_PROBE"
                    % PROBE)
    work = Path(os.environ.get("KWK_TEST_CACHE") or "/tmp/kwker-test-models") / "bench-models" \
        / name
    out = tmp_path / ("%s.json" % name)
    cmd = [sys.executable, str(script), "--quick", "--minilm", str(MINILM), "--work-dir",
           str(work), "--bw-probe", str(PROBE), "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def side_runs(rec, side):
    """rec's runs of side: --quick's two, each with a peak RSS above the interpreter's, stolen
    CPU in 0-100 % and the bandwidth probe's numbers before and after."""
    runs = rec["runs"][side]
    assert len(runs) == 2
    for run in runs:
        assert run["peak_rss_kib"] > run["base_rss_kib"] > 0, (side, run)
        assert 0.0 <= run["steal_pct"] <= 100.0
        assert run["bw_before"] > 0 and run["bw_after"] > 0
    return runs


def test_quick_run_writes_complete_json(tmp_path):
    proc, data = run_quick(tmp_path, SCRIPT, "model.safetensors", "embed")
    st = data["settings"]
    assert st["runs"] == 2 and st["threads"] == 2
    assert st["workloads"] == {"throughput": {"texts": 8, "tokens": 64},
                               "query": {"texts": 4, "tokens": 12},
                               "long": {"texts": 2, "tokens": 500}}
    # a BERT sequence fits one ubatch: llama.cpp's batches are at least 512 tokens
    assert min(st["llama_batch"].values()) >= 512
    recs = data["results"]
    assert [(r["model"], r["kwker"], r["llama_format"]) for r in recs] == \
        [("minilm", "preserve", "f32"), ("minilm", "int4", "q4_0")]
    for r in recs:
        # both tokenizers (Kwker's tokenizer.json, llama.cpp's GGUF vocabulary) see as many
        # tokens, and the texts are as long as asked: [CLS] + text + [SEP]
        assert r["same_token_counts"], r["model"]
        for side in ("kwker", "llama"):
            runs = side_runs(r, side)
            for run in runs:
                wl = run["workloads"]
                assert wl["throughput"]["n_tokens"] == 8 * 64
                assert wl["long"]["n_tokens"] == 2 * 500
                assert wl["query"]["n_tokens"] == 4 * 12
                assert len(wl["query"]["latencies_ms"]) == 4  # --quick: one pass of 4 queries
                assert wl["throughput"]["seconds"] > 0 and wl["long"]["seconds"] > 0
            s = r["%s_summary" % side]
            assert s["query"]["ms"] == statistics.median(
                x["workloads"]["query"]["ms"] for x in runs)
            for w in ("throughput", "long"):
                assert s[w]["emb_per_s"] > 0
                assert s[w]["tok_per_s"] == pytest.approx(s[w]["n_tokens"] / s[w]["seconds"])
        assert set(r["ratio"]) == {"throughput", "query", "long"}
        assert all(v > 0 for v in r["ratio"].values())
    # a round alternates the sides (Kwker preserve, llama.cpp F32, Kwker int4, llama.cpp Q4_0)
    # and the next runs them in reverse order
    pres, int4 = recs
    seqs = [[x["seq"] for x in r["runs"][side]] for r in recs for side in ("kwker", "llama")]
    assert seqs == [[1, 8], [2, 7], [3, 6], [4, 5]]
    assert [x["round"] for x in pres["runs"]["kwker"]] == [1, 2]
    # the check: preserve and llama.cpp's F32 run the same numbers (up to llama.cpp's tanh GELU
    # and its sums' order), int4 and Q4_0 only roughly; preserve is its own reference
    med, worst = pres["cos_kwker_llama"]
    assert 0.0 <= med <= worst < 1e-4, pres["cos_kwker_llama"]
    assert pres["cos_kwker_ref"] == [0.0, 0.0]
    assert pres["cos_llama_ref"][1] < 1e-4
    assert 1e-6 < int4["cos_kwker_ref"][0] < 0.2 and 1e-6 < int4["cos_llama_ref"][0] < 0.2
    # the Markdown table: header, separator and one row a pair, also on stdout
    table = data["markdown"].splitlines()
    assert len(table) == 4 and table[2].startswith("| minilm | preserve | F32 |")
    assert table[0].count("|") == table[1].count("|") == table[3].count("|")
    assert data["markdown"] in proc.stdout
