"""bench/bw_probe's options (the side-by-side benchmark's bandwidth probe): the sequential read
and the --streams pattern (N blocks read side by side, a decode tile's access pattern), each
with or without --prefetch, report what they read, and bad options are refused with the usage. A test of the tool, never of speed:
figures are only checked to be positive. Needs bw_probe ($KWK_BW_PROBE, or beside $KWKER_BIN)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("KWKER_BIN") or REPO / "build" / "kwker")
PROBE = Path(os.environ.get("KWK_BW_PROBE") or BIN.parent / "bw_probe")


def run(*args):
    if not PROBE.is_file():
        pytest.fail("bw_probe not found at %s: build it (scripts/build) or set KWK_BW_PROBE" % PROBE)
    return subprocess.run([str(PROBE), *args], capture_output=True, text=True, timeout=120)


def has_avx512():
    return "avx512f" in Path("/proc/cpuinfo").read_text()


def test_sequential_json():
    r = run("-m", "8", "-r", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["gbps"] > 0 and d["streams"] == 1 and d["passes"] == 2 and d["mib"] == 8.0


@pytest.mark.parametrize("isa", ["avx2"] + (["avx512"] if has_avx512() else []))
def test_streams_pattern(isa):
    r = run("-t", "2", "-m", "8", "-r", "2", "--streams", "4", "--stream-bytes", "1920",
            "--isa", isa, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["gbps"] > 0 and d["streams"] == 4 and d["stream_bytes"] == 1920
    assert d["threads"] == 2 and d["isa"] == isa


@pytest.mark.parametrize("streams", [["--streams", "4", "--stream-bytes", str(1 << 20)], []])
def test_prefetch(streams):
    # 4 long streams a thread as the float decodes read them, or one, each asked for 2 KiB ahead
    r = run("-t", "2", "-m", "8", "-r", "2", *streams, "--prefetch", "2048", "--isa", "avx2",
            "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["gbps"] > 0 and d["prefetch"] == 2048 and d["streams"] == (4 if streams else 1)


def test_streams_larger_than_a_slice_refused():
    # 1 MiB on 2 threads: each slice is 512 KiB, one run of 4 x 1 MiB does not fit
    r = run("-t", "2", "-m", "1", "--streams", "4", "--stream-bytes", str(1 << 20))
    assert r.returncode == 2
    assert "hold no run" in r.stderr


@pytest.mark.parametrize("args", [
    ("--stream-bytes", "100"),        # not a multiple of 64
    ("--stream-bytes", "0"),
    ("--streams", "0"),
    ("--streams", "65"),
    ("--streams", "4", "--isa", "scalar"),  # the streams are read with AVX2 or AVX-512
    ("--streams",),
    ("--prefetch", "100"),            # not a multiple of 64
    ("--prefetch", "2048", "--isa", "scalar"),
])
def test_bad_options_refused(args):
    r = run(*args)
    assert r.returncode == 2
    assert "usage: bw_probe" in r.stderr
