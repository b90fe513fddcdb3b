"""Preserve on a bf16 checkpoint runs its matrices packed where the kernels ask for it (the
AVX2 table: 16-row panels, kernels/panel.h; the AVX-512 table on AMX-BF16 CPUs: AMX tile order,
kernels/bf16t.h) and there is a pack cache to keep them in (or KWKER_BF16_PANELS=1): a pack
file as large as the weights appears in the cache directory, the numbers stay within float32
rounding of the row-major path and the greedy tokens are the same. Without a cache, with
KWKER_BF16_PANELS=0, and on the scalar table (and AVX-512 without AMX-BF16) the checkpoint is
read in place. Each run is a child process (kwk_isa() detects once per process)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gguf_export
import tiny_models
from conftest import PY_DIR, cpu_has_amx_bf16, supported_isas

CHILD = r"""
import json, sys
sys.path[:0] = [sys.argv[4]]
import numpy as np
import kwker
cache = None if sys.argv[2] == "none" else sys.argv[2]
d = kwker.KwkDecoder(sys.argv[1], max_cache_len=128, cache_dir=cache)
ids = [int(t) for t in sys.argv[3].split(",")]
logits = np.asarray(d.forward(ids), dtype=np.float64)
print(json.dumps({"logits": logits.tolist(), "greedy": [int(t) for t in d.generate(ids, 12)],
                  "bits": d.bits_per_weight()}))
"""

def packs_for(isa):
    """Whether preserve packs bf16 matrices on this kernel path (with a cache)."""
    return isa == "avx2" or (isa == "avx512" and cpu_has_amx_bf16())


IDS = "3,17,250,9,77,1,300,42,5,8,13,21,34,55,89,144,233,377,61,98,7,2,19,400,11,6"


def run_child(tmp_path, isa, panels_env, cached, model=None):
    """(result, pack files written) of one child; panels_env None leaves KWKER_BF16_PANELS unset;
    model defaults to the llama_bf16 folder."""
    env = dict(os.environ, KWKER_ISA=isa)
    env.pop("KWKER_BF16_PANELS", None)
    env.pop("KWKER_AMX_PRESERVE", None)
    if panels_env is not None:
        env["KWKER_BF16_PANELS"] = panels_env
    model = model or tiny_models.build("llama_bf16")
    cache = tmp_path / ("cache-%s-%s-%s-%s" % (panels_env, cached, isa, os.path.basename(model)))
    cache.mkdir()
    p = subprocess.run([sys.executable, "-c", CHILD, str(model),
                        str(cache) if cached else "none", IDS, str(PY_DIR)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    res["logits"] = np.asarray(res["logits"])
    return res, sorted(f.name for f in cache.iterdir() if f.suffix == ".kwkpack")


@pytest.mark.parametrize("isa", supported_isas())
def test_panels_where_the_table_wants_them(tmp_path, isa):
    cached, packs = run_child(tmp_path, isa, None, True)
    in_place, none = run_child(tmp_path, isa, "0", True)
    assert none == []
    # the AVX2 table asks for panels, AVX-512 on AMX-BF16 for tile order; else in place
    if packs_for(isa):
        assert len(packs) == 1 and packs[0].endswith(".kwkpack") and "-preserve-" in packs[0]
    else:
        assert packs == []
    assert cached["bits"] == in_place["bits"] == 16.0
    a, b = cached["logits"], in_place["logits"]
    assert a.shape == b.shape and a.shape[0] == len(IDS.split(","))
    span = b.max() - b.min()
    assert np.abs(a - b).max() <= 1e-5 * span, np.abs(a - b).max() / span
    # another summation order: the pack really ran
    assert np.array_equal(a, b) == (not packs_for(isa))
    assert cached["greedy"] == in_place["greedy"]


def test_no_cache_reads_in_place_unless_asked(tmp_path):
    """No pack cache: the checkpoint in place (no private copy at every load), bitwise the
    row-major numbers; KWKER_BF16_PANELS=1 packs panels in memory, bitwise the cached ones."""
    isa = "avx2" if "avx2" in supported_isas() else "scalar"
    in_place, _ = run_child(tmp_path, isa, "0", False)
    default, _ = run_child(tmp_path, isa, None, False)
    forced, _ = run_child(tmp_path, isa, "1", False)
    cached, _ = run_child(tmp_path, isa, "1", True)
    assert np.array_equal(default["logits"], in_place["logits"])
    assert np.array_equal(forced["logits"], cached["logits"])
    assert np.array_equal(forced["logits"], in_place["logits"]) == (isa != "avx2")


@pytest.mark.parametrize("isa", supported_isas())
def test_bf16_gguf_keeps_bf16_and_panels(tmp_path, isa):
    """A llama GGUF stores attn_q / attn_k rows permuted; the loader puts them back in a bf16
    copy (moving rows is exact), so the file runs as bf16 throughout: 16.0 bits a weight (a
    float32 copy of q / k made it more), packed where the table asks, and the same logits and
    greedy tokens as the folder's bf16 weights (the export writes those very numbers)."""
    folder = tiny_models.build("llama_bf16")
    path = gguf_export.build_gguf(folder, "bf16")
    from_gguf, packs = run_child(tmp_path, isa, None, True, model=path)
    from_folder, _ = run_child(tmp_path, isa, None, True)
    assert from_gguf["bits"] == 16.0
    assert (len(packs) == 1) == packs_for(isa), packs
    # the same weights, the same kernels: bitwise (the folder is bf16 too)
    assert np.array_equal(from_gguf["logits"], from_folder["logits"])
    assert from_gguf["greedy"] == from_folder["greedy"]
