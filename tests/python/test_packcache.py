"""The packed-weight cache through KwkDecoder(cache_dir=...) and the CLI's --cache-dir: logits from
a mapped pack equal a fresh pack's bit for bit (tiny models and SmolLM2-135M, balanced and int4);
a changed checkpoint gets its own file; corrupt, truncated and old-format files are rebuilt; the
size limit evicts least recently used packs; an unusable directory still loads; two processes
packing at once both succeed; unchanged checkpoint files are not read again (source keys). Every
cache directory is a pytest tmp dir (never ~/.cache).

A pack is known to be reused (not rebuilt) when the path is still the file we hold open: a rebuilt
pack is renamed over it and so is another inode.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import PY_DIR, cli_env, kwker_bin, smollm2_gguf
import tiny_models

PRECS = ["balanced", "int4"]


def decoder(model, prec, cache_dir, **kw):
    from kwker.decode import KwkDecoder
    return KwkDecoder(model, max_cache_len=64, precision=prec, n_threads=2, cache_dir=cache_dir,
                      **kw)


def logits(model, prec, cache_dir, ids, **kw):
    d = decoder(model, prec, cache_dir, **kw)
    try:
        return np.array(d.forward(np.asarray(ids, dtype=np.int32)), copy=True)
    finally:
        d.close()


def packs(d):
    return sorted(p for p in Path(d).iterdir() if p.name.endswith(".kwkpack")
                  and not p.name.startswith("."))


def temporaries(d):
    return [p for p in Path(d).iterdir() if ".tmp." in p.name]


def same_file(fd, path):
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)


@pytest.fixture(scope="module")
def tiny():
    return tiny_models.build("llama_odd")


@pytest.fixture(scope="module")
def ids():
    return tiny_models.prompt_ids("llama_odd")


@pytest.mark.parametrize("prec", PRECS)
def test_tiny_round_trip(tiny, ids, prec, tmp_path):
    ref = logits(tiny, prec, None, ids)
    first = logits(tiny, prec, tmp_path, ids)
    files = packs(tmp_path)
    assert len(files) == 1 and prec in files[0].name, files
    fd = os.open(files[0], os.O_RDONLY)
    try:
        second = logits(tiny, prec, tmp_path, ids)
        assert same_file(fd, files[0]), "the pack was rebuilt instead of mapped"
    finally:
        os.close(fd)
    assert np.array_equal(ref, first) and np.array_equal(ref, second)
    assert not temporaries(tmp_path)


def test_changed_checkpoint_repacks(tiny, ids, tmp_path):
    from safetensors.numpy import load_file, save_file
    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    cache = tmp_path / "cache"
    before = logits(model, "int4", cache, ids)
    assert len(packs(cache)) == 1
    st = next(model.glob("*.safetensors"))
    tensors = load_file(str(st))
    name = next(k for k in sorted(tensors) if "down_proj" in k)
    tensors[name] = tensors[name].copy()
    tensors[name].flat[3] += np.float32(0.5)
    save_file(tensors, str(st), metadata={"format": "pt"})
    after = logits(model, "int4", cache, ids)
    assert len(packs(cache)) == 2, "a changed checkpoint must get a new pack file"
    assert np.array_equal(after, logits(model, "int4", None, ids))
    assert not np.array_equal(after, before)


def flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) - 77] ^= 0x04
    path.write_bytes(bytes(data))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4096)


def old_version(path):
    data = bytearray(path.read_bytes())
    version = int.from_bytes(data[8:12], "little")
    data[8:12] = (version - 1).to_bytes(4, "little")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,log", [(flip_byte, "corrupt"), (truncate, "truncated"),
                                        (old_version, None)])
def test_damaged_pack_rebuilt(tiny, ids, tmp_path, capfd, damage, log):
    ref = logits(tiny, "balanced", tmp_path, ids)
    path = packs(tmp_path)[0]
    good = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        damage(path)
        capfd.readouterr()
        got = logits(tiny, "balanced", tmp_path, ids)
        err = capfd.readouterr().err
        assert not same_file(fd, path), "the damaged pack was not replaced"
    finally:
        os.close(fd)
    assert np.array_equal(ref, got)
    assert path.read_bytes() == good, "the rebuilt pack differs from the first one"
    if log:
        assert log in err and str(path) in err, err
    assert len(packs(tmp_path)) == 1 and not temporaries(tmp_path)


def test_lru_eviction(tiny, ids, tmp_path):
    other = tiny_models.build("llama_tied")
    other_ids = tiny_models.prompt_ids("llama_tied")
    logits(tiny, "balanced", tmp_path, ids)
    (a,) = packs(tmp_path)
    limit = int(os.path.getsize(a) * 2.5)
    os.utime(a, (1_000_000_000, 1_000_000_000))  # long ago
    logits(tiny, "int4", tmp_path, ids, cache_max_bytes=limit)
    (b,) = [p for p in packs(tmp_path) if p != a]
    os.utime(b, (1_000_000_100, 1_000_000_100))
    logits(tiny, "balanced", tmp_path, ids, cache_max_bytes=limit)  # a used: the newest now
    assert os.path.getmtime(a) > os.path.getmtime(b)
    logits(other, "balanced", tmp_path, other_ids, cache_max_bytes=limit)
    logits(other, "int4", tmp_path, other_ids, cache_max_bytes=limit)
    left = packs(tmp_path)
    assert b not in left and a in left, left
    assert sum(os.path.getsize(p) for p in left) <= limit


def test_unusable_dir_still_loads(tiny, ids, tmp_path, capfd):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bad = blocker / "packs"
    got = logits(tiny, "int4", bad, ids)
    err = capfd.readouterr().err
    assert np.array_equal(got, logits(tiny, "int4", None, ids))
    assert str(bad) in err and "without the cache" in err, err


def test_cache_dir_true_uses_env(tiny, ids, tmp_path, monkeypatch):
    from kwker.decode import default_cache_dir
    monkeypatch.setenv("KWKER_CACHE", str(tmp_path / "env-packs"))
    assert default_cache_dir() == str(tmp_path / "env-packs")
    logits(tiny, "balanced", True, ids)
    assert len(packs(tmp_path / "env-packs")) == 1
    monkeypatch.setenv("KWKER_CACHE", "off")
    assert default_cache_dir() is None
    monkeypatch.delenv("KWKER_CACHE")
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "kwker",
                                               "packs")


def test_negative_limit_rejected(tiny):
    with pytest.raises(ValueError):
        decoder(tiny, "balanced", None, cache_max_bytes=-1)


WORKER = r"""
import sys
import numpy as np
sys.path[:0] = [%r]
from kwker.decode import KwkDecoder
d = KwkDecoder(sys.argv[1], max_cache_len=64, precision=sys.argv[2], n_threads=1,
               cache_dir=sys.argv[3])
np.save(sys.argv[4], d.forward(np.asarray([int(t) for t in sys.argv[5].split(",")], np.int32)))
""" % str(PY_DIR)


def test_two_processes_at_once(tiny, ids, tmp_path):
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tiny), "int4", str(cache),
                               str(tmp_path / ("out%d.npy" % k)), ",".join(map(str, ids))],
                              stderr=subprocess.PIPE, text=True) for k in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    ref = logits(tiny, "int4", None, ids)
    for k in range(2):
        assert np.array_equal(np.load(tmp_path / ("out%d.npy" % k)), ref)
    assert len(packs(cache)) == 1 and not temporaries(cache)
    assert np.array_equal(logits(tiny, "int4", cache, ids), ref)


def test_cli_cache_dir(tiny, tmp_path):
    env = cli_env(KWKER_CACHE=str(tmp_path / "env"))
    base = [kwker_bin(), "bench", "--model", str(tiny), "--precision", "int4", "-p", "4",
            "-n", "2", "-r", "1", "-t", "1"]
    for extra, where in [([], tmp_path / "env"), (["--cache-dir", str(tmp_path / "opt")],
                                                  tmp_path / "opt")]:
        r = subprocess.run(base + extra, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert len(packs(where)) == 1, (extra, r.stderr)
    shutil.rmtree(tmp_path / "env")
    r = subprocess.run(base + ["--cache-dir", "off"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "env").exists()


@pytest.mark.parametrize("prec", PRECS)
def test_smollm2_round_trip(prec, tmp_path):
    sm_ids = [1, 9690, 28, 588, 314, 253, 1345, 30, 216, 2, 15]
    ref = logits(smollm2_gguf(), prec, None, sm_ids)
    first = logits(smollm2_gguf(), prec, tmp_path, sm_ids)
    (path,) = packs(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    try:
        second = logits(smollm2_gguf(), prec, tmp_path, sm_ids)
        assert same_file(fd, path)
    finally:
        os.close(fd)
    assert np.array_equal(ref, first) and np.array_equal(ref, second)


def test_env_limit_keeps_only_the_newest(tiny, ids, tmp_path, monkeypatch, capfd):
    """KWKER_CACHE_MAX (with a K suffix) when cache_max_bytes is 0: a limit below one pack
    leaves just the pack just written, with a warning that the directory is over its limit."""
    logits(tiny, "balanced", tmp_path, ids)
    monkeypatch.setenv("KWKER_CACHE_MAX", "1K")
    capfd.readouterr()
    logits(tiny, "int4", tmp_path, ids)
    err = capfd.readouterr().err
    (left,) = packs(tmp_path)
    assert "int4" in left.name
    assert "over its limit" in err and str(tmp_path) in err, err


def bench_log(model, cache, env_extra=None):
    env = cli_env(KWKER_LOG="info", **(env_extra or {}))
    r = subprocess.run([kwker_bin(), "bench", "--model", str(model), "--precision", "int4",
                        "--cache-dir", str(cache), "-p", "4", "-n", "2", "-r", "1", "-t", "1"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_unchanged_checkpoint_not_read(tiny, ids, tmp_path):
    """Source keys: once a checkpoint's files are hashed, a later load of the same, unchanged
    files maps the pack without reading them, to the same logits; files written within the last
    second are hashed every time (a write in the same clock tick keeps ctime); a rewritten file
    is hashed again and gets its own pack; KWKER_CACHE_REHASH=1 hashes at every load."""
    from safetensors.numpy import load_file, save_file
    model = tmp_path / "model"
    shutil.copytree(tiny, model)
    cache = tmp_path / "cache"
    err = bench_log(model, cache)
    assert "hashing the weights" not in err and not list(cache.glob("*.kwksrc")), err
    err = bench_log(model, cache)  # just written: too recent to stand for its bytes
    assert "hashing the weights" in err and not list(cache.glob("*.kwksrc")), err
    time.sleep(1.2)
    err = bench_log(model, cache)
    assert "hashing the weights" in err and len(list(cache.glob("*.kwksrc"))) == 1, err
    err = bench_log(model, cache)
    assert "unchanged since they were hashed: not read" in err, err
    assert np.array_equal(logits(model, "int4", cache, ids), logits(model, "int4", None, ids))
    err = bench_log(model, cache, {"KWKER_CACHE_REHASH": "1"})
    assert "hashing the weights" in err, err

    st = next(model.glob("*.safetensors"))
    tensors = load_file(str(st))
    name = next(k for k in sorted(tensors) if "up_proj" in k)
    tensors[name] = tensors[name].copy()
    tensors[name].flat[7] -= np.float32(0.25)
    save_file(tensors, str(st), metadata={"format": "pt"})
    time.sleep(1.2)
    err = bench_log(model, cache)  # a new id: hashed, and packed anew
    assert "hashing the weights" not in err and len(packs(cache)) == 2, err
    assert len(list(cache.glob("*.kwksrc"))) == 2
    assert "not read" in bench_log(model, cache)
    assert np.array_equal(logits(model, "int4", cache, ids), logits(model, "int4", None, ids))
