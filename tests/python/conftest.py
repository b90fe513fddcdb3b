"""pytest set-up for the Python tests: puts python/ (the kwker package) and this folder on
sys.path, and provides the session fixtures of the decoder oracle tests.

The kwker library picks its kernel instruction set once per process (KWKER_ISA is read at load),
so every decoder run of the oracle tests happens in a child process with KWKER_ISA set: one
child per (ISA, batch of cases), each case a model path, a prompt and the reference greedy
continuation. The child (tiny_models.kwk_worker) writes logits and tokens to an .npz file that
the tests compare with transformers' float32 results computed here, in this process.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TEST_DIR = Path(__file__).resolve().parent
REPO = TEST_DIR.parent.parent
PY_DIR = REPO / "python"
for _p in (str(PY_DIR), str(TEST_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

# The team's shared test data (real tokenizers, llama.cpp's vocabulary vectors, chat templates,
# wikitext-2): $KWKER_SHARED_DATA, else ../shared/data beside the checkout. A checkout elsewhere
# sets the variable; a missing directory fails the tests that read it (they assert on what they
# find there), never skips them.
SHARED_DATA = Path(os.environ.get("KWKER_SHARED_DATA") or REPO.parent / "shared" / "data").resolve()


def smollm2_gguf():
    """The bundled SmolLM2-135M-Instruct GGUF ($KWK_SMOLLM2_GGUF or models/), which
    scripts/setup fetches: a missing file fails the test that needs it, never skips it."""
    env = os.environ.get("KWK_SMOLLM2_GGUF")
    path = Path(env) if env else REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.fail("SmolLM2 GGUF not found at %s: run scripts/setup" % path)
    return str(path)


def kwker_bin():
    """The kwker CLI under test ($KWKER_BIN, which scripts/test points at the ASan build, or
    build/kwker)."""
    path = Path(os.environ.get("KWKER_BIN") or REPO / "build" / "kwker")
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail("kwker binary not found at %s: build it (scripts/build) or set KWKER_BIN"
                    % path)
    return str(path)


def cli_env(**extra):
    """The environment for a child running the kwker binary (os.environ plus extra). Under
    scripts/test's ASan build leak checking is off for this interpreter (CPython keeps memory
    to exit by design) but back on for the child, which frees what it allocates, so a leak in
    the CLI or the server fails the test that ran it. Python children keep it off."""
    env = dict(os.environ, **extra)
    if "detect_leaks=0" in env.get("ASAN_OPTIONS", ""):
        env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"].replace("detect_leaks=0", "detect_leaks=1")
    return env


# Packed-weight caches made by tests (CLI runs default to the user's cache) stay in a temporary
# folder of this session, never in ~/.cache; tests of the cache itself pass their own folders.
if "KWKER_CACHE" not in os.environ:
    os.environ["KWKER_CACHE"] = tempfile.mkdtemp(prefix="kwker-test-cache-")

# Tolerance of the acceptance: max|kwker - ref| <= REL_TOL * (max(ref) - min(ref)).
REL_TOL = 1e-5


def cpu_flags():
    """The CPU's feature flags as /proc/cpuinfo lists them (a set; empty where it cannot be read).
    Linux lists the AMX flags only when the OS supports the tile state."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")),
                            []))
    except OSError:
        return set()


def supported_isas():
    """Kernel paths this CPU supports, in KWKER_ISA spelling (scalar is always there)."""
    flags = cpu_flags()
    isas = ["scalar"]
    if {"avx2", "fma"} <= flags:
        isas.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        isas.append("avx512")
    return isas


def best_isa():
    return supported_isas()[-1]


# Kernel paths beyond KWKER_ISA's: "avx512+amx" is the AVX-512 table with preserve's row-major
# bf16 products on AMX-BF16 (KWKER_AMX_PRESERVE=on), a path of its own numbers; "avx512+bf16t"
# the same table with preserve's bf16 matrices packed in AMX tile order (kernels/bf16t.h: what
# preserve runs by default on AMX-BF16 CPUs with a pack cache; KWKER_BF16_PANELS=1 packs
# without one), the tile unit's numbers again.
AMX_PRESERVE = "avx512+amx"
AMX_PACKED = "avx512+bf16t"


def cpu_has_amx():
    """What the library's AMX-INT8 prompt tiles need: AMX-TILE and AMX-INT8 beside AVX-512."""
    return {"amx_tile", "amx_int8"} <= cpu_flags() and "avx512" in supported_isas()


def cpu_has_amx_bf16():
    """What the library's AMX-BF16 paths need: AMX-TILE, AMX-INT8, AMX-BF16 and AVX512_BF16."""
    return {"amx_tile", "amx_int8", "amx_bf16", "avx512_bf16"} <= cpu_flags()


def isa_env(env, isa):
    """env (a dict) set for the kernel path isa: KWKER_ISA, for AMX_PRESERVE
    KWKER_AMX_PRESERVE=on too, for AMX_PACKED KWKER_BF16_PANELS=1; None: the library's own
    choice. The other paths read bf16 checkpoints in place (the runner's decoders have no pack
    cache), on the vector tables."""
    env.pop("KWKER_ISA", None)
    env.pop("KWKER_AMX_PRESERVE", None)
    env.pop("KWKER_BF16_PANELS", None)
    if isa == AMX_PRESERVE:
        env["KWKER_ISA"] = "avx512"
        env["KWKER_AMX_PRESERVE"] = "on"
    elif isa == AMX_PACKED:
        env["KWKER_ISA"] = "avx512"
        env["KWKER_BF16_PANELS"] = "1"
    elif isa is not None:
        env["KWKER_ISA"] = isa
    return env


def rel_err(got, ref):
    """max|got - ref| / (max(ref) - min(ref)), the acceptance's error measure."""
    import numpy as np
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, "shape %s != reference %s" % (got.shape, ref.shape)
    span = float(ref.max() - ref.min())
    return float(np.abs(got - ref).max()) / span


def describe_diff(got, ref):
    """A one-line account of where two logit arrays [n, V] differ most."""
    import numpy as np
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    d = np.abs(got - ref)
    pos, tok = np.unravel_index(int(d.argmax()), d.shape)
    span = float(ref.max() - ref.min())
    per_pos = d.max(axis=-1) / span
    first_bad = int(np.argmax(per_pos > REL_TOL)) if (per_pos > REL_TOL).any() else -1
    return ("max|diff| %.3g (rel %.3g of range %.3g) at position %d token %d "
            "(kwker %.6g, ref %.6g); first position over tolerance: %d of %d; "
            "per-position rel err: %s" % (
                float(d.max()), float(d.max()) / span, span, pos, tok, float(got[pos, tok]),
                float(ref[pos, tok]), first_bad, d.shape[0],
                " ".join("%.1e" % e for e in per_pos)))


def token_by_token(d, ids, start=0):
    """Logits of ids[start:] fed one token a call to decoder d (KwkDecoder) after its sequence is
    cut to its first start tokens (0: a fresh sequence; else they must be ids[:start]): one row
    a matmul and every key and value read back from the cache, for batch-invariance checks."""
    import numpy as np
    d._lib.kwk_decoder_truncate(d._dec, start)
    out = np.empty((1, d.vocab_size), dtype=np.float32)
    rows = []
    for t in ids[start:]:
        d._eval(np.asarray([t], dtype=np.int32), 2, out)
        rows.append(out[0].copy())
    return np.stack(rows)


def first_token_diff(got, ref):
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            return "first differing token at new-token index %d: kwker %d, transformers %d " \
                   "(kwker %s, transformers %s)" % (i, a, b, list(got), list(ref))
    if len(got) != len(ref):
        return "lengths differ: kwker %d tokens %s, transformers %d tokens %s" % (
            len(got), list(got), len(ref), list(ref))
    return "identical"


def run_worker(tmpdir, module, job, isa, timeout, what):
    """module.kwk_worker(job file, out file) in a child process with the kernel path isa set
    (KWKER_ISA is read once a process); job is written as JSON. Returns the .npz path the child
    wrote; a child that failed or wrote nothing fails the test with its output."""
    fd, job_path = tempfile.mkstemp(suffix=".json", dir=str(tmpdir))
    os.close(fd)
    out = job_path[:-5] + ".npz"
    Path(job_path).write_text(json.dumps(job))
    env = isa_env(dict(os.environ), isa)
    code = ("import sys; sys.path[:0] = [%r, %r]; import %s; %s.kwk_worker(%r, %r)"
            % (str(PY_DIR), str(TEST_DIR), module, module, job_path, out))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        raise AssertionError(
            "%s (KWKER_ISA=%s) failed with exit code %d (a negative code is a signal: the "
            "library crashed)\nstdout:\n%s\nstderr:\n%s" % (
                what, isa, proc.returncode, proc.stdout[-4000:], proc.stderr[-8000:]))
    return out


class KwkRunner:
    """Runs decoder cases in child processes with KWKER_ISA set, memoized per (isa, batch)."""

    def __init__(self, tmpdir):
        self.tmpdir = Path(tmpdir)
        self.memo = {}

    def run(self, cases, isa=None, timeout=600):
        """cases: list of dicts (key, model, prompt, gen_ref, max_cache_len, [n_threads]).
        Returns key -> result dict: arrays and 'errors' (stage -> message), plus '_isa'."""
        import numpy as np
        memo_key = (isa, json.dumps(cases, sort_keys=True))
        if memo_key in self.memo:
            return self.memo[memo_key]
        out = run_worker(self.tmpdir, "tiny_models", {"isa": isa, "cases": cases}, isa, timeout,
                         "kwker worker")
        res = {}
        with np.load(out, allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            for k in z.files:
                if k == "__meta__":
                    continue
                case, stage = k.split("|", 1)
                res.setdefault(case, {})[stage] = z[k]
        for c in cases:
            r = res.setdefault(c["key"], {})
            r["errors"] = meta["errors"].get(c["key"], {})
            r["_isa"] = meta["isa"]
            r["_setup_error"] = meta.get("setup_error")
        self.memo[memo_key] = res
        return res


@pytest.fixture(scope="session")
def kwk_runner(tmp_path_factory):
    return KwkRunner(tmp_path_factory.mktemp("kwk-runs"))


@pytest.fixture(scope="session")
def oracle_refs():
    """(name, prompt length or None for 12-24) -> tiny_models.OracleCase, built (and run by
    transformers) once per session."""
    import tiny_models
    cache = {}

    def get(name, n_prompt=None):
        key = (name, n_prompt)
        if key not in cache:
            cache[key] = tiny_models.oracle_case(name, n_prompt=n_prompt)
        return cache[key]
    return get


@pytest.fixture(scope="session")
def isas():
    return supported_isas()


@pytest.fixture(scope="module")
def qwen3_template(tmp_path_factory):
    """Qwen3-0.6B's chat template (a thinking one, enable_thinking), from huggingface.js'
    end-to-end cases, as a file for --chat-template-file."""
    cases = json.loads((SHARED_DATA / "chat-templates" / "hfjinja_e2e_cases.json").read_text())
    path = tmp_path_factory.mktemp("tpl") / "qwen3.jinja"
    path.write_text(cases["custom_templates"]["Qwen/Qwen3-0.6B"]["chat_template"])
    return path
