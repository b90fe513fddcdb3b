"""Peak resident memory of a kwker process (issue 6): on the bundled quantized GGUF, a balanced or
int4 run holds its pack and little else: no float32 expansion of the checkpoint (the GGUF's
quantized tensors are dequantized only for packing, one matrix at a time), no resident copy of the
file beside the pack (its pages are dropped once hashed or dequantized; embedding rows are read
with pread).

The bounds derive from the files: the pack's size (what must be resident) plus ALLOWANCE for code,
libraries, the KV cache of the run's 72 positions (under 2 MiB here), activations and per-thread
scratch (measured at about 16 MiB above the pack). ALLOWANCE is well under what the regressions
this guards against would add: the GGUF file resident (94 MB), or the embedding table as float32
(n_vocab x d_model x 4 = 113 MB).
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import kwker_bin, smollm2_gguf

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
ALLOWANCE = 32 * MIB


def table_bytes():
    """Bytes of the embedding table as float32 (the largest single matrix: the tied head)."""
    from gguf import GGUFReader

    for t in GGUFReader(smollm2_gguf()).tensors:
        if t.name == "token_embd.weight":
            return int(t.n_elements) * 4
    raise AssertionError("token_embd.weight not in %s" % smollm2_gguf())


def bench(binary, precision, cache_dir):
    # no preloaded sanitizer runtime (scripts/test preloads one for pytest): it would allocate
    # shadow memory and redzones in the measured process
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    cmd = [binary, "bench", "--model", smollm2_gguf(), "--precision", precision,
           "-p", "64", "-n", "8", "-t", "2", "-r", "1", "--json", "--cache-dir", str(cache_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def instrumented(path):
    """Sanitizer builds reserve shadow memory: their resident sizes say nothing about ours."""
    data = Path(path).read_bytes()
    return b"__asan_init" in data or b"__msan_init" in data


def measured_bin():
    """An uninstrumented kwker: $KWKER_BIN when it is one, else $KWKER_RELEASE_BIN or
    build/kwker (scripts/test builds both the release and the ASan binary)."""
    under_test = kwker_bin()
    if not instrumented(under_test):
        return under_test
    alt = Path(os.environ.get("KWKER_RELEASE_BIN") or REPO / "build" / "kwker")
    if not alt.is_file() or instrumented(alt):
        pytest.fail("%s is a sanitizer build and %s is no release build to measure memory with: "
                    "set KWKER_RELEASE_BIN" % (under_test, alt))
    return str(alt)


@pytest.mark.parametrize("precision", ["balanced", "int4"])
def test_peak_rss_is_the_pack(tmp_path, precision):
    binary = measured_bin()
    cold = bench(binary, precision, tmp_path)  # packs and writes the cache
    packs = list(tmp_path.glob("*.kwkpack"))
    assert len(packs) == 1, packs
    pack = packs[0].stat().st_size
    warm = bench(binary, precision, tmp_path)  # maps the pack
    peak = warm["peak_rss_kib"] * 1024
    assert peak <= pack + ALLOWANCE, (
        "%s: peak %.1f MiB > pack %.1f MiB + %.0f MiB" % (precision, peak / MIB, pack / MIB,
                                                          ALLOWANCE / MIB))
    # Packing holds the pack being written and one matrix's float32 copy at a time (at most the
    # tied head), never the whole expansion.
    peak_cold = cold["peak_rss_kib"] * 1024
    assert peak_cold <= pack + table_bytes() + ALLOWANCE, (
        "%s cold: peak %.1f MiB > pack %.1f MiB + table %.1f MiB + %.0f MiB"
        % (precision, peak_cold / MIB, pack / MIB, table_bytes() / MIB, ALLOWANCE / MIB))
