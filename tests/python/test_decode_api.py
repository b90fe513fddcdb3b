"""The Python decoder API (kwker.KwkDecoder, kwker.decode.runner_unsupported,
kwker.cpu_backend.decoder_available) on tiny random checkpoints, in this process (default ISA).

Input kinds, Hugging Face ids resolved from a fake offline cache, the unsupported-model reason,
`import kwker` without torch, out-of-range ids, cache overflow, fresh-sequence forward(), and
thread-count independence. Every test fails (never skips) when the library is missing.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tiny_models
from conftest import PY_DIR, describe_diff, rel_err

MODEL = "llama_tied"


@pytest.fixture(scope="module")
def kwker_mod():
    import kwker
    return kwker


@pytest.fixture(scope="module")
def model_path():
    return tiny_models.build(MODEL)


@pytest.fixture(scope="module")
def dec(kwker_mod, model_path):
    return kwker_mod.KwkDecoder(str(model_path), max_cache_len=64)


@pytest.fixture(scope="module")
def prompt():
    return tiny_models.prompt_ids(MODEL, n=10)


def test_decoder_available(kwker_mod):
    from kwker import cpu_backend
    assert cpu_backend.decoder_available() is True


def test_forward_shape_dtype_and_fresh_sequence(dec, prompt, oracle_refs):
    V = tiny_models.SPECS[MODEL]["vocab"]
    a = dec.forward(prompt)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (len(prompt), V)
    other = tiny_models.prompt_ids(MODEL, n=7, seed=5)
    dec.forward(other)
    b = dec.forward(prompt)
    assert np.array_equal(a, b), "forward() does not start a fresh sequence: " + \
        describe_diff(b, a)
    # a prefix's logits are the first rows of the longer sequence's (causality)
    c = dec.forward(prompt[:4])
    assert rel_err(c, a[:4]) <= 1e-5


def test_forward_input_kinds(dec, prompt):
    import torch
    ref = dec.forward(prompt)
    for x in (np.array(prompt, dtype=np.int64), np.array(prompt, dtype=np.int32),
              torch.tensor(prompt, dtype=torch.long)):
        got = dec.forward(x)
        assert isinstance(got, np.ndarray) and got.shape == ref.shape, type(x)
        assert np.array_equal(got, ref), type(x)


def test_generate_input_kinds(dec, prompt):
    import torch
    n_new = 5
    ref = dec.generate(list(prompt), max_new_tokens=n_new)
    assert isinstance(ref, list) and all(type(t) is int for t in ref), ref
    assert ref[:len(prompt)] == prompt and len(ref) == len(prompt) + n_new

    got = dec.generate(np.array(prompt, dtype=np.int64), max_new_tokens=n_new)
    assert isinstance(got, np.ndarray) and got.shape == (len(ref),), got.shape
    assert got.dtype.kind in "iu" and got.tolist() == ref

    got = dec.generate(np.array([prompt], dtype=np.int64), max_new_tokens=n_new)
    assert isinstance(got, np.ndarray) and got.shape == (1, len(ref)), got.shape
    assert got[0].tolist() == ref

    got = dec.generate(torch.tensor(prompt), max_new_tokens=n_new)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (len(ref),)
    assert not got.is_floating_point() and got.tolist() == ref

    got = dec.generate(torch.tensor([prompt]), max_new_tokens=n_new)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (1, len(ref))
    assert got[0].tolist() == ref


def test_generate_matches_transformers(dec, oracle_refs):
    ref = oracle_refs(MODEL)
    assert dec.generate(list(ref.prompt), max_new_tokens=16) == ref.gen


def _fake_hub(root, org, name, src):
    """A Hugging Face cache layout: blobs/ hold the files, snapshots/<rev>/ symlinks to them,
    refs/main names the revision."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = root / ("models--%s--%s" % (org, name))
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    for i, f in enumerate(sorted(src.iterdir())):
        blob = repo / "blobs" / ("%040x" % (i + 1))
        shutil.copyfile(f, blob)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    return snap


def test_hf_id_from_hf_hub_cache(kwker_mod, model_path, prompt, dec, tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    _fake_hub(hub, "kwk-test", "tiny-llama", model_path)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    d = kwker_mod.KwkDecoder("kwk-test/tiny-llama", max_cache_len=64)
    got = d.forward(prompt)
    want = dec.forward(prompt)
    assert rel_err(got, want) <= 1e-6, describe_diff(got, want)


def test_hf_id_from_hf_home(kwker_mod, model_path, prompt, dec, tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    _fake_hub(home / "hub", "kwk-test", "tiny-llama-2", model_path)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    d = kwker_mod.KwkDecoder("kwk-test/tiny-llama-2", max_cache_len=64)
    assert rel_err(d.forward(prompt), dec.forward(prompt)) <= 1e-6


def test_hf_id_missing_raises(kwker_mod, tmp_path, monkeypatch):
    (tmp_path / "hub").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "nohome"))
    with pytest.raises(Exception) as ei:
        kwker_mod.KwkDecoder("kwk-test/no-such-model", max_cache_len=32)
    assert "no-such-model" in str(ei.value), str(ei.value)


def test_runner_unsupported(kwker_mod, model_path, tmp_path):
    from kwker import decode
    assert decode.runner_unsupported(str(model_path), 64) is None
    from transformers import GPT2Config, GPT2LMHeadModel
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64,
                               n_positions=32)).save_pretrained(str(gpt2))
    reason = decode.runner_unsupported(str(gpt2), 16)
    assert isinstance(reason, str) and reason.strip(), reason
    assert "\n" not in reason.strip(), "reason is not one line: %r" % reason
    assert "gpt2" in reason.lower(), "reason does not name the architecture: %r" % reason
    with pytest.raises(Exception):
        kwker_mod.KwkDecoder(str(gpt2), max_cache_len=16)


def test_import_without_torch(model_path):
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, %r)\n"
            "import kwker\n"
            "from kwker import cpu_backend, decode\n"
            "assert cpu_backend.decoder_available()\n"
            "d = kwker.KwkDecoder(%r, max_cache_len=32)\n"
            "out = d.generate([1, 5, 9], max_new_tokens=3)\n"
            "assert type(out) is list and len(out) == 6, out\n"
            "import numpy as np\n"
            "assert d.forward(np.array([1, 5, 9])).shape == (3, %d)\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "print('ok')\n" % (str(PY_DIR), str(model_path), tiny_models.SPECS[MODEL]["vocab"]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr


@pytest.mark.parametrize("bad", [512, 100000, -1])
def test_token_out_of_range_raises(dec, prompt, bad):
    before = dec.forward(prompt)
    with pytest.raises(Exception) as ei:
        dec.forward(prompt[:3] + [bad] + prompt[3:])
    assert not isinstance(ei.value, (SystemError, MemoryError))
    with pytest.raises(Exception):
        dec.generate(prompt[:3] + [bad], max_new_tokens=2)
    # the decoder is still usable and unchanged
    assert np.array_equal(dec.forward(prompt), before)


def test_cache_overflow_raises(kwker_mod, model_path):
    d = kwker_mod.KwkDecoder(str(model_path), max_cache_len=16)
    ids = tiny_models.prompt_ids(MODEL, n=20)
    with pytest.raises(Exception):
        d.forward(ids)
    assert d.forward(ids[:16]).shape[0] == 16


def test_thread_count_does_not_change_logits(kwker_mod):
    path = tiny_models.build("llama_odd")
    ids = tiny_models.prompt_ids("llama_odd", n=24)
    outs = {}
    for n in (1, 2):
        d = kwker_mod.KwkDecoder(str(path), max_cache_len=64, n_threads=n)
        outs[n] = (d.forward(ids), d.generate(ids, max_new_tokens=8))
    assert rel_err(outs[2][0], outs[1][0]) <= 1e-6, describe_diff(outs[2][0], outs[1][0])
    assert outs[1][1] == outs[2][1]


@pytest.mark.parametrize("precision", ["preserve", "balanced", "int4"])
def test_prompt_grid_does_not_change_logits(kwker_mod, precision):
    """Prompt products on more threads than llama_odd has row blocks (hidden 80: 5 blocks; kv 16
    rows: 1) cut the tokens too (forward.c plan_grid); every grid, and the generation after it,
    gives one thread's numbers bitwise (the kernels' batch invariance)."""
    path = tiny_models.build("llama_odd")
    ids = tiny_models.prompt_ids("llama_odd", n=100)
    outs = {}
    for n in (1, 2, 3, 7, 12):
        d = kwker_mod.KwkDecoder(str(path), max_cache_len=128, precision=precision, n_threads=n)
        outs[n] = (d.forward(ids), d.generate(ids, max_new_tokens=6))
    for n in (2, 3, 7, 12):
        assert np.array_equal(outs[n][0], outs[1][0]), (n, describe_diff(outs[n][0], outs[1][0]))
        assert outs[n][1] == outs[1][1], n


@pytest.mark.parametrize("precision", ["preserve", "balanced", "int4"])
def test_generation_chunks_do_not_change_logits(kwker_mod, precision):
    """Chunks of up to 16 tokens (generation) hand out rows in chunks: each thread takes its own
    big chunk first, then shrinking ranges of the tail from a counter, then any big chunk a late
    thread has not begun (forward.c mm_run_dyn). On 1, 2, 3, 7 and 12 threads (more than this host's cores, so
    threads start late and others take their chunks) every split gives one thread's logits
    bitwise, for fresh chunks of 1, 5 and 12 tokens and a greedy run after them."""
    path = tiny_models.build("llama_wide")
    ids = tiny_models.prompt_ids("llama_wide", n=12)
    outs = {}
    for n in (1, 2, 3, 7, 12):
        d = kwker_mod.KwkDecoder(str(path), max_cache_len=64, precision=precision, n_threads=n)
        outs[n] = ([d.forward(ids[:k]) for k in (1, 5, 12)],
                   d.generate(ids, max_new_tokens=8))
    for n in (2, 3, 7, 12):
        for got, want in zip(outs[n][0], outs[1][0]):
            assert np.array_equal(got, want), (n, describe_diff(got, want))
        assert outs[n][1] == outs[1][1], n


def test_generate_fills_the_cache_exactly(kwker_mod, oracle_refs):
    """A cache of n + 16 positions holds a whole 16-token greedy run after n prompt ids (only
    n + 15 are ever fed), from a fresh decoder and again on the same decoder (prompt reuse)."""
    ref = oracle_refs(MODEL)
    d = kwker_mod.KwkDecoder(str(ref.path), max_cache_len=len(ref.prompt) + 16)
    assert d.generate(list(ref.prompt), max_new_tokens=16) == ref.gen
    assert d.generate(list(ref.prompt), max_new_tokens=16) == ref.gen


def test_preserved_ids_kinds():
    """gen_params takes preserved_ids as a list, a numpy array or a tensor of any shape; id 0 is
    an id like any other (an array has no truth value to test), and a non-id is refused."""
    from kwker.decode import gen_params
    for ids, n in (([0], 1), (np.array([0]), 1), (np.array([5, 6]), 2), (np.array([[5], [6]]), 2),
                   ([], 0), (None, 0)):
        p, keep = gen_params(preserved_ids=ids)
        assert p.n_preserved == n, (ids, p.n_preserved)
        if n:
            assert [p.preserved_ids[i] for i in range(n)] == np.asarray(ids).ravel().tolist()
    for bad in ([-1], np.array([2 ** 40])):
        with pytest.raises(ValueError):
            gen_params(preserved_ids=bad)
