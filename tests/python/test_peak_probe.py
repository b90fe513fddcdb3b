"""bench/peak_probe (arithmetic peaks, and the AMX tile unit's state for side_by_side.py): its
JSON names every operation, with a best and a median figure where the CPU has the operation
and null where it lacks it; --only picks operations; bad options are refused with the usage.
A test of the tool, never of speed: figures are only checked to be positive and the median no
better than the best. Needs peak_probe ($KWK_PEAK_PROBE, or beside $KWKER_BIN)."""
import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import cpu_flags

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("KWKER_BIN") or REPO / "build" / "kwker")
PROBE = Path(os.environ.get("KWK_PEAK_PROBE") or BIN.parent / "peak_probe")

# Each operation and the /proc/cpuinfo flags it needs (Linux lists AMX only with OS support).
OPS = {
    "fp32_fma_avx512": {"avx512f"},
    "fp32_fma_avx2": {"avx2", "fma"},
    "int8_vnni_avx512": {"avx512f", "avx512_vnni"},
    "bf16_dp_avx512": {"avx512f", "avx512_bf16"},
    "int8_maddubs_avx2": {"avx2"},
    "int8_tile_loop_avx512": {"avx512f", "avx512bw", "avx512_vnni"},
    "int8_tile_avx512": {"avx512f", "avx512bw", "avx512_vnni"},
    "int8_tile_avx2": {"avx2", "fma"},
    "int8_tile_avx2_nosign": {"avx2", "fma"},
    "int16_tile_avx2_pmaddwd": {"avx2", "fma"},
    "bf16_amx": {"amx_tile", "amx_bf16"},
    "int8_amx": {"amx_tile", "amx_int8"},
    "fp32_fma_beside_amx": {"amx_tile", "amx_int8", "avx512f"},
}


def run(*args):
    if not PROBE.is_file():
        pytest.fail("peak_probe not found at %s: build it (scripts/build) or set KWK_PEAK_PROBE"
                    % PROBE)
    return subprocess.run([str(PROBE), *args], capture_output=True, text=True, timeout=300)


def test_every_operation_in_json():
    r = run("-t", "2", "-s", "0.01", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["threads"] == 2
    flags = cpu_flags()
    assert set(d) == {"threads"} | set(OPS) | {op + "_median" for op in OPS if d[op] is not None}
    for op, need in OPS.items():
        if need <= flags:
            assert d[op] > 0 and 0 < d[op + "_median"] <= d[op], (op, d)
        else:
            assert d[op] is None, (op, d)


def test_only_picks_operations():
    r = run("-s", "0.01", "--only", "fp32_fma_avx2,fp32_fma_beside_amx", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    beside = OPS["fp32_fma_beside_amx"] <= cpu_flags()
    assert set(d) == {"threads", "fp32_fma_avx2", "fp32_fma_avx2_median", "fp32_fma_beside_amx"} \
        | ({"fp32_fma_beside_amx_median"} if beside else set())
    assert d["threads"] == 1 and d["fp32_fma_avx2"] > 0
    assert (d["fp32_fma_beside_amx"] is not None) == beside


@pytest.mark.parametrize("args", [["-t", "0"], ["-s", "0"], ["--bogus"], ["-t"]])
def test_bad_options_refused(args):
    r = run(*args)
    assert r.returncode == 2 and "peak_probe" in r.stderr and r.stdout == ""
