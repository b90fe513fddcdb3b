"""Preserve on a bf16 checkpoint runs its matrices as 16-row panels where the kernels ask for
them (the AVX2 table; kernels/panel.h): a pack file as large as the weights appears in the cache
directory, the numbers stay within float32 rounding of the row-major path (KWKER_BF16_PANELS=0)
and the greedy tokens are the same. The scalar table keeps the checkpoint in place (no pack).
Each ISA runs in a child process (kwk_isa() detects once per process)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tiny_models
from conftest import PY_DIR, supported_isas

CHILD = r"""
import json, sys
sys.path[:0] = [sys.argv[4]]
import numpy as np
import kwker
d = kwker.KwkDecoder(sys.argv[1], max_cache_len=128, cache_dir=sys.argv[2])
ids = [int(t) for t in sys.argv[3].split(",")]
logits = np.asarray(d.forward(ids), dtype=np.float64)
print(json.dumps({"logits": logits.tolist(), "greedy": [int(t) for t in d.generate(ids, 12)],
                  "bits": d.bits_per_weight()}))
"""

IDS = "3,17,250,9,77,1,300,42,5,8,13,21,34,55,89,144,233,377,61,98,7,2,19,400,11,6"


def run_child(tmp_path, isa, panels, tag):
    env = dict(os.environ, KWKER_ISA=isa, KWKER_BF16_PANELS="1" if panels else "0")
    cache = tmp_path / tag
    cache.mkdir()
    p = subprocess.run([sys.executable, "-c", CHILD, str(tiny_models.build("llama_bf16")),
                        str(cache), IDS, str(PY_DIR)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), sorted(f.name for f in cache.iterdir())


@pytest.mark.parametrize("isa", supported_isas())
def test_panels_where_the_table_wants_them(tmp_path, isa):
    with_panels, packs = run_child(tmp_path, isa, True, "on")
    row_major, none = run_child(tmp_path, isa, False, "off")
    assert none == []
    # the AVX2 table asks for panels; scalar and AVX-512 read the checkpoint in place
    assert packs == ([p for p in packs if p.endswith(".kwkpack") and "-preserve-" in p]
                     if isa == "avx2" else [])
    assert len(packs) == (1 if isa == "avx2" else 0), packs
    assert with_panels["bits"] == row_major["bits"] == 16.0
    a, b = np.asarray(with_panels["logits"]), np.asarray(row_major["logits"])
    assert a.shape == b.shape and a.shape[0] == len(IDS.split(","))
    span = b.max() - b.min()
    assert np.abs(a - b).max() <= 1e-5 * span, np.abs(a - b).max() / span
    if isa == "avx2":
        assert not np.array_equal(a, b)  # another summation order: the panels really ran
    assert with_panels["greedy"] == row_major["greedy"]
