"""Smoke test of bench/side_by_side.py (issue 6's Kwker vs llama.cpp benchmark): the tool runs
end to end in --quick mode on one pair and its JSON has every field, with positive numbers.
A test of the tool, never of speed: no figure is compared with another.

Needs the kwker CLI and bw_probe ($KWKER_BIN or <repo>/build/kwker; bw_probe from $KWK_BW_PROBE
or beside kwker), and llama-cpp-python (scripts/setup --test installs it, as --bench does): a
missing one fails the test and says how to get it, never skips it. The random 135M checkpoint and its
GGUF files are cached in $KWK_TEST_CACHE/bench-models (default /tmp/kwker-test-models)."""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_flags, supported_isas

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "side_by_side.py"
BIN = Path(os.environ.get("KWKER_BIN") or REPO / "build" / "kwker")
PROBE = Path(os.environ.get("KWK_BW_PROBE") or BIN.parent / "bw_probe")


def test_quick_run_writes_complete_json(tmp_path):
    assert importlib.util.find_spec("llama_cpp") is not None, \
        "llama_cpp (llama-cpp-python) is not importable: run scripts/setup --test (or --bench)"
    for p, what in ((BIN, "kwker (set KWKER_BIN)"), (PROBE, "bw_probe (set KWK_BW_PROBE)")):
        if not p.is_file():
            pytest.fail("%s not found at %s: build it (scripts/build)" % (what, p))
    models = Path(os.environ.get("KWK_TEST_CACHE") or "/tmp/kwker-test-models") / "bench-models"
    out = tmp_path / "sbs.json"
    # --mix-bits 4: int4 with every matrix at 4 bits, the matched-bits pair with Q4_0
    cmd = [sys.executable, str(SCRIPT), "--quick", "--precisions", "q4_0", "--mix-bits", "4",
           "--models-dir", str(models), "--kwker-bin", str(BIN), "--bw-probe", str(PROBE),
           "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["settings"]["runs"] == 2
    assert data["settings"]["n_prompt"] == 64 and data["settings"]["n_gen"] == 16
    # the ceiling's probe by default: the faster of one stream and 4 long streams a thread
    assert data["settings"]["probe_pattern"] == "best"
    (rec,) = data["results"]
    assert (rec["model"], rec["kwker_precision"], rec["llama_format"]) == \
        ("smollm2-135m", "int4 mix4", "q4_0")
    assert rec["mix_bits"] == 4
    # 4-bit codes and two half-precision numbers (scale, offset) a group of 32: 5 bits a weight
    assert [r["bits_per_weight"] for r in rec["runs"]["kwker"]] == [5.0, 5.0]
    for side in ("kwker", "llama"):
        runs = rec["runs"][side]
        assert len(runs) == 2
        for r in runs:
            for f in ("pp_tps", "tg_tps", "peak_rss_kib", "bw_before", "bw_after"):
                assert r[f] > 0, (side, f, r)
            # the share of the machine's CPU time the hypervisor took during the run (Linux)
            assert 0.0 <= r["steal_pct"] <= 100.0, (side, r)
        s = rec[side]
        for f in ("pp_tps", "tg_tps", "peak_rss_mib", "bw_gbps", "bytes_per_token",
                  "pct_ceiling"):
            assert s[f] is not None and s[f] > 0, (side, f, s)
    assert rec["ratio_pp"] > 0 and rec["ratio_tg"] > 0
    for side in ("kwker", "llama"):
        assert rec[side]["steal_pct"] == statistics.median(
            r["steal_pct"] for r in rec["runs"][side]), side
    # each side's probe buffer is the bytes that side reads a token, rounded up to 16 MiB, at
    # least 64 MiB (llama.cpp's with its default f16 KV cache, which this run uses)
    for side in ("kwker", "llama"):
        mib, nbytes = rec["probe_mib"][side], rec[side]["bytes_per_token"]
        assert mib % 16 == 0 and mib * 2**20 >= nbytes, (side, mib, nbytes)
        assert mib == 64 or (mib - 16) * 2**20 < nbytes, (side, mib, nbytes)
    assert rec["llama"]["base_rss_mib"] > 0
    # which int8 dot products each side's AVX2 code has: Kwker's from its log (AVX-VNNI where
    # the CPU has it), llama.cpp's from its build's system info
    flags = cpu_flags()
    assert rec["kwker"]["avx2_dot"] == ("avx-vnni" if "avx_vnni" in flags else "maddubs")
    # and whether its AVX-512 prompt products ran on AMX (on CPUs with it, unless KWKER_AMX=off
    # or KWKER_ISA lowers the path)
    amx = ("amx_int8" in flags and "avx512" in supported_isas()
           and os.environ.get("KWKER_AMX", "on") != "off"
           and os.environ.get("KWKER_ISA", "avx512") == "avx512")
    assert rec["kwker"]["prompt_tiles"] == ("amx" if amx else "vector")
    # and what this pair's int4 prompts ran on, from kwker bench --json
    assert rec["kwker"]["matmul"] == ("amx-int8" if amx else rec["runs"]["kwker"][0]["isa"])
    # preserve's products: on AMX-BF16 CPUs packed in tile order where preserve packs (unless
    # KWKER_AMX_PRESERVE=off), row-major in place too with KWKER_AMX_PRESERVE=on; else vector
    ap = os.environ.get("KWKER_AMX_PRESERVE")
    amx_bf16 = amx and {"amx_bf16", "avx512_bf16"} <= flags
    assert rec["kwker"]["preserve_products"] == (
        "vector" if not amx_bf16 or ap == "off" else "amx" if ap == "on" else "amx-packed")
    assert isinstance(rec["llama"]["avx_vnni"], bool)
    # llama.cpp at its best: by default each run measures flash attention on and off and keeps
    # each column's faster figure, saying which
    ctx = rec["llama"]["context"]
    assert set(ctx["per_flash_attn"]) == {"on", "off"}
    for col, i in (("pp", 0), ("tg", 1)):
        best = ctx["flash_attn_" + col]
        assert best in ("on", "off")
        assert ctx["per_flash_attn"][best][i] == max(v[i] for v in ctx["per_flash_attn"].values())
    # the AMX tile unit's rate (int8 tiles for int4) around every run, where the CPU has it
    for side in ("kwker", "llama"):
        for r in rec["runs"][side]:
            if "amx_int8" in flags:
                assert r["tile_before"] > 0 and r["tile_after"] > 0, (side, r)
            else:
                assert r["tile_before"] is None and r["tile_after"] is None, (side, r)
        assert rec[side]["tile_op"] == ("int8_amx" if "amx_int8" in flags else None)
    # the Markdown table (stdout and JSON) has the header, the separator and the one row, with a
    # column for the tile unit where there is one
    table = data["markdown"].splitlines()
    assert len(table) == 3 and table[2].startswith("| smollm2-135m | int4 mix4 | Q4_0 |")
    tiles = "AMX tile unit" in table[0]
    assert tiles == ("amx_int8" in flags)
    assert table[2].count("|") == table[1].count("|") == (15 if tiles else 14)
    assert data["markdown"] in proc.stdout
