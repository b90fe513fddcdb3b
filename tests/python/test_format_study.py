"""bench/format_study.py's simulated formats against the gguf package's own quantizers (ports of
ggml's reference ones): q4s-32 is llama.cpp's Q4_0 and q8s-32 its Q8_0 value for value, and
q4a-32 gives back weights already on a Q4_1 grid exactly, the caveat the study's table rests on.
Activations: act8 rounds per group of columns with a shorter tail group. Needs torch and gguf
(scripts/setup --test installs both)."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fs():
    spec = importlib.util.spec_from_file_location("format_study", REPO / "bench" / "format_study.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["format_study"] = mod
    spec.loader.exec_module(mod)
    return mod


def weights(rows=8, cols=96, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[:, 5] *= 9.0  # an outlier column, as real layers have
    return w


def ggml_roundtrip(w, qtype):
    from gguf import GGMLQuantizationType as T, quants
    t = getattr(T, qtype)
    return quants.dequantize(quants.quantize(w, t), t)


@pytest.mark.parametrize("fmt,qtype", [("q4s-32", "Q4_0"), ("q8s-32", "Q8_0")])
def test_symmetric_formats_are_ggmls(fs, fmt, qtype):
    import torch
    w = weights()
    ours = fs.fake_quant(torch.from_numpy(w), fmt).numpy()
    ref = ggml_roundtrip(w, qtype)
    assert np.abs(ours - w).max() > 0  # lossy: the comparison below is not trivially equal
    np.testing.assert_array_equal(ours, ref)


def test_q4a_32_reproduces_a_q4_1_grid(fs):
    import torch
    w = ggml_roundtrip(weights(seed=1), "Q4_1")
    ours = fs.fake_quant(torch.from_numpy(w), "q4a-32").numpy()
    np.testing.assert_array_equal(ours, w)
    # a coarser group re-quantizes the same weights with a loss
    assert np.abs(fs.fake_quant(torch.from_numpy(w), "q4a-128").numpy() - w).max() > 0


def test_opt_never_worse_than_plain(fs):
    import torch
    w = torch.from_numpy(weights(seed=2))
    for kind in ("q4a-32", "q4s-32", "q4a-64"):
        plain = ((fs.fake_quant(w, kind) - w) ** 2).sum()
        opt = ((fs.fake_quant(w, kind + "-opt") - w) ** 2).sum()
        assert opt <= plain, kind  # the search includes t = 1.0, the plain choice


def test_act8_groups_and_tail(fs):
    import torch
    x = torch.tensor([[1.0, -2.0, 0.5, 0.25, 3.0, 0.0]])
    y = fs.act8(x, 4)  # groups [0, 4) and a tail [4, 6)
    g0 = torch.round(x[0, :4] * 127 / 2.0) * 2.0 / 127
    assert torch.equal(y[0, :4], g0)
    assert torch.equal(y[0, 4:], torch.tensor([3.0, 0.0]))  # amax itself is exact
    assert torch.equal(fs.act8(torch.zeros(1, 6), 4), torch.zeros(1, 6))


def test_bits_per_weight(fs):
    assert fs.bits_per_weight("q4s-32", [(10, 64)]) == pytest.approx(4.5)
    assert fs.bits_per_weight("q4a-128", [(1, 576)]) == pytest.approx(4 + 32 * 5 / 576)
    assert fs.bits_per_weight("q8s-32", [(3, 96)]) == pytest.approx(8.5)
