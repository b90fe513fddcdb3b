"""act_bits: balanced / int4 matrices reading their activations at 8 bits (one int8 pass, as
llama.cpp) instead of 16 (two passes), through the C API (via the Python binding), KwkDecoder,
Engine and the CLI (generate, bench, perplexity, serve).

What must hold: bad values are refused with a message naming them (ValueError in Python, KWK_EARG
from the C side, exit code 2 from the CLI), preserve refuses 8; act_bits=16 is the default bit for
bit; 8 gives logits close to 16 but not equal (the 8-bit kernels really run); the weights are the
same, so one pack file serves both (mapped, not rebuilt, whichever came first, calibrated or not);
an Engine takes its decoder's act_bits. Every cache directory is a pytest tmp dir.
"""
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import (PY_DIR, cli_env, cpu_flags, cpu_has_amx_bf16, kwker_bin, rel_err,
                      smollm2_gguf, token_by_token)
import tiny_models

PRECS = ["balanced", "int4"]
# Largest relative difference (of the logits' range, conftest.rel_err) between 8- and 16-bit
# activations on the tiny random models; measured 0.008-0.016 (llama_odd, qwen2, llama_tied).
MAX_REL_8_16 = 0.05


def decoder(model, prec, **kw):
    from kwker.decode import KwkDecoder
    kw.setdefault("n_threads", 2)
    return KwkDecoder(model, max_cache_len=64, precision=prec, **kw)


def logits(model, prec, ids, **kw):
    with decoder(model, prec, **kw) as d:
        return np.array(d.forward(np.asarray(ids, dtype=np.int32)), copy=True)


def packs(d):
    return sorted(p for p in d.iterdir() if p.name.endswith(".kwkpack")
                  and not p.name.startswith("."))


def same_file(fd, path):
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_ino, a.st_dev) == (b.st_ino, b.st_dev)


def run(*args, timeout=600, env=None):
    return subprocess.run([kwker_bin()] + [str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout, env=env or cli_env())


@pytest.fixture(scope="module", params=["llama_odd", "qwen2"])
def tiny(request):
    """(folder, prompt ids) of a tiny random model: odd sizes (llama_odd) and q/k/v bias (qwen2)."""
    return tiny_models.build(request.param), tiny_models.prompt_ids(request.param)


# --- refused values ---

@pytest.mark.parametrize("bad", [4, 12, 32, -8, True, "eight"])
def test_python_rejects_bad_values(tiny, bad):
    with pytest.raises(ValueError, match="act_bits"):
        decoder(tiny[0], "int4", act_bits=bad)


@pytest.mark.parametrize("bad", [1, 7, 9, 15, 17, 32, -8, 1 << 30])
def test_c_api_rejects_bad_values(tiny, bad):
    """kwk_decoder_new itself (bypassing the binding's check): KWK_EARG naming the value."""
    from kwker._lib import KwkErr
    from kwker.decode import _DecoderParams
    with decoder(tiny[0], "preserve") as d:
        p = _DecoderParams()
        d._lib.kwk_decoder_params_init(ctypes.byref(p))
        p.precision = 2
        p.max_cache_len = 16
        p.act_bits = bad
        err = KwkErr()
        h = d._lib.kwk_decoder_new(d._model, ctypes.byref(p), ctypes.byref(err))
        if h:
            d._lib.kwk_decoder_free(h)
        assert not h, "act_bits %d accepted" % bad
        assert err.code == -10004, err.code  # KWK_EARG
        assert ("act_bits %d" % bad) in err.text(), err.text()


def test_preserve_refuses_8_takes_16(tiny):
    """The C side's check reaches Python as a KwkError with its reason; 16 (= the default) is
    accepted and changes nothing."""
    from kwker import KwkError
    with pytest.raises(KwkError, match="act_bits 8 applies to balanced and int4"):
        decoder(tiny[0], "preserve", act_bits=8)
    with decoder(tiny[0], "preserve", act_bits=16) as d:
        assert d.act_bits is None  # float32 math: no activation bits to speak of
    assert np.array_equal(logits(tiny[0], "preserve", tiny[1], act_bits=16),
                          logits(tiny[0], "preserve", tiny[1]))


# --- what 8 and 16 compute ---

@pytest.mark.parametrize("prec", PRECS)
def test_16_is_the_default_bitwise(tiny, prec):
    with decoder(tiny[0], prec) as d:
        assert d.act_bits == 16
    assert np.array_equal(logits(tiny[0], prec, tiny[1], act_bits=16),
                          logits(tiny[0], prec, tiny[1]))


@pytest.mark.parametrize("prec", PRECS)
def test_8_is_close_to_16_but_not_equal(tiny, prec):
    """8-bit activations change the numbers (the one-pass kernels run), by little: bounded
    against 16 bits, and not much further from the float32 model than 16 bits are."""
    with decoder(tiny[0], prec, act_bits=8) as d:
        assert d.act_bits == 8
    ref = logits(tiny[0], "preserve", tiny[1])
    l16 = logits(tiny[0], prec, tiny[1], act_bits=16)
    l8 = logits(tiny[0], prec, tiny[1], act_bits=8)
    assert np.isfinite(l8).all()
    assert not np.array_equal(l8, l16), "act_bits=8 computed exactly what 16 does"
    d = rel_err(l8, l16)
    assert 0 < d < MAX_REL_8_16, d
    e8, e16 = rel_err(l8, ref), rel_err(l16, ref)
    assert e8 < 2.5 * e16 + 0.005, (e8, e16)
    # deterministic: a second decoder gives the same bits
    assert np.array_equal(l8, logits(tiny[0], prec, tiny[1], act_bits=8))


@pytest.mark.parametrize("prec", PRECS)
def test_8_is_batch_invariant(tiny, prec):
    """Token by token (one row a matmul) gives the bits of the whole prompt at once (many rows):
    the activations' 8-bit scales are per token, so what a token is batched with is irrelevant."""
    ids = np.asarray(tiny[1], dtype=np.int32)
    with decoder(tiny[0], prec, act_bits=8) as d:
        whole = np.array(d.forward(ids), copy=True)
        rows = token_by_token(d, ids)
    assert np.array_equal(rows, whole)


@pytest.mark.parametrize("prec", PRECS)
def test_8_bf16_kv_same_numbers(prec, monkeypatch):
    """The KV cache with keys and values already rounded to bf16 (head_dim 64, AVX-512 BF16
    hosts) gives the bits of the half cache that each tile rounds (KWKER_BF16_KV=off): a prompt
    at once (staged values) and 12 generated tokens (the cache itself)."""
    model = tiny_models.build("llama_wide")
    ids = tiny_models.prompt_ids("llama_wide", n=40)
    outs = {}
    for mode in ("off", "on"):
        monkeypatch.setenv("KWKER_BF16_KV", mode)
        with decoder(model, prec, act_bits=8) as d:
            outs[mode] = (np.array(d.forward(np.asarray(ids, dtype=np.int32)), copy=True),
                          d.generate(ids, max_new_tokens=12))
    assert np.array_equal(outs["on"][0], outs["off"][0])
    assert outs["on"][1] == outs["off"][1]


@pytest.mark.parametrize("prec", PRECS)
def test_8_bf16_kv_batch_invariant(prec):
    """head_dim 64 (llama_wide): where the CPU has AVX-512 BF16, act8 attention runs in bf16 and
    the KV cache holds keys and values already rounded to bf16 (decoder bf16_kv): a 40-token
    prompt at once (values staged, keys read from the cache) and token by token (everything
    from the cache) give the same bits, and the whole prompt again after a truncation to 17
    positions (a second chunk of 23 over the cache's first 17) as well."""
    model = tiny_models.build("llama_wide")
    ids = np.asarray(tiny_models.prompt_ids("llama_wide", n=40), dtype=np.int32)
    with decoder(model, prec, act_bits=8) as d:
        whole = np.array(d.forward(ids), copy=True)
        d._lib.kwk_decoder_truncate(d._dec, 17)
        tail = np.empty((len(ids) - 17, d.vocab_size), dtype=np.float32)
        d._eval(ids[17:], 2, tail)
        rows = token_by_token(d, ids)
    assert np.array_equal(rows, whole)
    assert np.array_equal(tail, whole[17:])


# --- the pack cache: one file for both ---

@pytest.mark.parametrize("prec", PRECS)
@pytest.mark.parametrize("first, second", [(16, 8), (8, 16)])
def test_pack_cache_shared(tiny, prec, first, second, tmp_path):
    """Whichever act_bits packs first, the other maps the same file (not rebuilt: the path is
    still the inode we hold open), and each equals its own uncached run bit for bit."""
    model, ids = tiny
    a = logits(model, prec, ids, act_bits=first, cache_dir=tmp_path)
    files = packs(tmp_path)
    assert len(files) == 1, files
    fd = os.open(files[0], os.O_RDONLY)
    try:
        b = logits(model, prec, ids, act_bits=second, cache_dir=tmp_path)
        assert packs(tmp_path) == files, "act_bits must not key the pack"
        assert same_file(fd, files[0]), "the pack was rebuilt for another act_bits"
    finally:
        os.close(fd)
    assert np.array_equal(a, logits(model, prec, ids, act_bits=first))
    assert np.array_equal(b, logits(model, prec, ids, act_bits=second))


def test_pack_cache_shared_calibrated(tiny, tmp_path):
    """A fitted (AWQ) pack made with act_bits=8 serves act_bits=16 too: the fitting does not
    depend on act_bits (16 from the cache equals 16 fitted afresh)."""
    model, ids = tiny
    calib = list(range(5, 53))
    logits(model, "int4", ids, act_bits=8, calib=calib, cache_dir=tmp_path)
    files = packs(tmp_path)
    assert len(files) == 1, files
    fd = os.open(files[0], os.O_RDONLY)
    try:
        cached16 = logits(model, "int4", ids, act_bits=16, calib=calib, cache_dir=tmp_path)
        assert same_file(fd, files[0]) and packs(tmp_path) == files
    finally:
        os.close(fd)
    assert np.array_equal(cached16, logits(model, "int4", ids, calib=calib))


# --- the engine ---

def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("prec", PRECS)
def test_engine_takes_the_decoders(tiny, prec):
    """Engine(decoder) runs with the decoder's act_bits: its greedy tokens are the decoder's, and
    its logprobs are the 8-bit logits' (not the 16-bit ones)."""
    from kwker.serve import Engine
    model, ids = tiny
    n_new = 8
    with decoder(model, prec, act_bits=8) as d:
        want = [int(t) for t in d.generate_greedy(list(ids), max_new_tokens=n_new,
                                                  eos_token_id=[])[len(ids):]]
        with Engine(d, max_batch=2) as e:
            req = e.submit(list(ids), max_new_tokens=n_new, eos_token_id=[], lookup=0,
                           prompt_cache=False)
            got = req.result()
            lps = np.array(req.logprobs)
    assert got == want
    seq = list(ids) + got
    pos = np.arange(len(ids) - 1, len(seq) - 1)
    lp = {}
    for ab in (8, 16):
        full = log_softmax(logits(model, prec, seq, act_bits=ab))
        lp[ab] = full[pos, got]
    d8, d16 = np.abs(lps - lp[8]).max(), np.abs(lps - lp[16]).max()
    assert d8 < 1e-4, (d8, d16)
    assert d16 > d8, (d8, d16)


def test_engine_from_a_path(tiny):
    from kwker import KwkError
    from kwker.serve import Engine
    model, ids = tiny
    with pytest.raises(ValueError, match="act_bits"):
        Engine(model, precision="int4", act_bits=10)
    with pytest.raises(KwkError, match="act_bits 8 applies to balanced and int4"):
        Engine(model, precision="preserve", act_bits=8)
    with decoder(model, "int4", act_bits=8) as d:
        want = [int(t) for t in d.generate_greedy(list(ids), max_new_tokens=6,
                                                  eos_token_id=[])[len(ids):]]
    with Engine(model, precision="int4", act_bits=8, n_threads=2, max_batch=2,
                max_cache_len=64) as e:
        assert e.generate([list(ids)], max_new_tokens=6, eos_token_id=[], lookup=0) == [want]


# --- the CLI ---

@pytest.mark.parametrize("cmd", ["generate", "chat", "bench", "perplexity", "serve"])
@pytest.mark.parametrize("bad", [["--act-bits", "12"], ["--act-bits", "x"], ["--act-bits"]])
def test_cli_rejects_bad_values(cmd, bad, tmp_path):
    extra = {"generate": ["--prompt", "x"], "perplexity": ["--file", tmp_path / "t.txt"]}
    p = run(cmd, "--model", smollm2_gguf(), "--precision", "int4", *extra.get(cmd, []), *bad,
            timeout=120)
    assert p.returncode == 2, (cmd, bad, p.returncode, p.stderr)
    assert "value for --act-bits" in p.stderr, p.stderr


@pytest.mark.parametrize("cmd", ["generate", "chat", "bench", "perplexity", "serve"])
def test_cli_help_names_it(cmd):
    p = run(cmd, "--help", timeout=60)
    assert "--act-bits" in p.stdout + p.stderr, (cmd, p.stdout, p.stderr)


def test_cli_preserve_refuses_8():
    p = run("generate", "--model", smollm2_gguf(), "--prompt", "x", "-n", "2", "--act-bits", "8")
    assert p.returncode != 0 and "act_bits 8 applies to balanced and int4" in p.stderr, p.stderr


def bench_json(model, *args):
    p = run("bench", "--model", model, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "--json",
            *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_bench_json_act_bits(tiny, tmp_path):
    model = tiny[0]
    cache = ["--cache-dir", tmp_path]
    assert bench_json(model, "--precision", "int4", "--act-bits", "8", *cache)["act_bits"] == 8
    assert bench_json(model, "--precision", "balanced", "--act-bits", "16",
                      *cache)["act_bits"] == 16
    assert bench_json(model, "--precision", "int4", *cache)["act_bits"] == 16
    assert bench_json(model, "--precision", "preserve")["act_bits"] == 32  # float32 math
    # int4 with 8 and with 16 bits above: one pack; balanced: another
    assert len(packs(tmp_path)) == 2, packs(tmp_path)
    p = run("bench", "--model", model, "-p", "8", "-n", "2", "-r", "1", "-t", "2",
            "--precision", "int4", "--act-bits", "8", *cache)
    assert p.returncode == 0 and "8-bit activations" in p.stdout, p.stdout + p.stderr


def test_bench_json_attention(tiny, tmp_path):
    """kwker bench names the attention kernels: bf16 products exactly for 8-bit activations on
    the AVX-512 path of an AVX512_BF16 CPU (on AMX where it has AMX-BF16), the instruction set's
    own tables otherwise (also when KWKER_ISA forces AVX2 or scalar on such a CPU)."""
    model, cache = tiny[0], ["--cache-dir", tmp_path]
    j8 = bench_json(model, "--precision", "int4", "--act-bits", "8", *cache)
    bf16 = j8["isa"] == "avx512" and "avx512_bf16" in cpu_flags()
    amx = bf16 and cpu_has_amx_bf16() and os.environ.get("KWKER_AMX") != "off"
    assert j8["attn"] == ("amx-bf16" if amx else "avx512-bf16" if bf16 else j8["isa"]), j8
    j16 = bench_json(model, "--precision", "int4", "--act-bits", "16", *cache)
    assert j16["attn"] == j16["isa"], j16
    assert bench_json(model, "--precision", "preserve")["attn"] == j16["isa"]
    for isa in ("avx2", "scalar"):
        p = run("bench", "--model", model, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "--json",
                "--precision", "balanced", "--act-bits", "8", *cache,
                env=dict(os.environ, KWKER_ISA=isa))
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        if j["isa"] == isa:  # a machine without AVX2 runs scalar for both
            assert j["attn"] == isa, j


def test_bench_json_matmul(tiny, tmp_path):
    """kwker bench names the prompt products' kernels: AMX's int8 tiles for balanced and int4 on
    the AVX-512 path of a CPU with AMX-INT8 (unless KWKER_AMX=off), AMX-BF16 for preserve's
    packed bf16 weights there (unless KWKER_AMX_PRESERVE=off), the instruction set's own
    kernels otherwise (float32 checkpoints, KWKER_ISA=avx2 or scalar)."""
    model, cache = tiny[0], ["--cache-dir", tmp_path]
    base = cli_env()
    for k in ("KWKER_AMX", "KWKER_AMX_PRESERVE"):
        base.pop(k, None)

    def matmul(m, *args, **env):
        p = run("bench", "--model", m, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "--json",
                *args, *cache, env=dict(base, **env))
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        return j["isa"], j["matmul"]

    amx = {"amx_tile", "amx_int8", "avx512f"} <= cpu_flags()
    for prec, act in (("int4", "8"), ("balanced", "16")):
        isa, name = matmul(model, "--precision", prec, "--act-bits", act)
        assert name == ("amx-int8" if amx and isa == "avx512" else isa), (prec, isa, name)
        assert matmul(model, "--precision", prec, "--act-bits", act, KWKER_AMX="off") == \
            (isa, isa)
        for forced in ("avx2", "scalar"):
            isa_f, name_f = matmul(model, "--precision", prec, KWKER_ISA=forced)
            assert name_f == isa_f, (forced, isa_f, name_f)
    isa, name = matmul(model, "--precision", "preserve")
    assert name == isa  # float32 weights: the vector kernels
    bf16 = tiny_models.build("llama_bf16")
    isa, name = matmul(bf16, "--precision", "preserve")
    assert name == ("amx-bf16" if cpu_has_amx_bf16() and isa == "avx512" else isa), (isa, name)
    assert matmul(bf16, "--precision", "preserve", KWKER_AMX_PRESERVE="off") == (isa, isa)


def test_python_kernels_equal_bench(tiny, tmp_path):
    """KwkDecoder.kernels() names what kwker bench names for the same model, settings and
    environment: in this process (whatever KWKER_ISA / KWKER_AMX it runs under) and in a child
    with KWKER_ISA=avx2 and KWKER_AMX=off."""
    model = tiny[0]
    settings = (("int4", 8), ("balanced", 16), ("preserve", None))

    def bench(prec, act, **extra):
        args = ["--act-bits", act] if act else []
        p = run("bench", "--model", model, "--precision", prec, *args, "-p", "4", "-n", "1",
                "-r", "1", "--json", "--cache-dir", tmp_path, env=cli_env(**extra))
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        return {"isa": j["isa"], "matmul": j["matmul"], "attention": j["attn"]}

    for prec, act in settings:
        with decoder(model, prec, act_bits=act, cache_dir=tmp_path) as d:
            assert d.kernels() == bench(prec, act), (prec, act)
    script = ("import json, sys\n"
              "sys.path.insert(0, sys.argv[5])\n"
              "import kwker.decode as k\n"
              "d = k.KwkDecoder(sys.argv[1], max_cache_len=64, precision=sys.argv[2],\n"
              "                 act_bits=int(sys.argv[3]) or None, cache_dir=sys.argv[4])\n"
              "print(json.dumps(d.kernels()))\n")
    forced = {"KWKER_ISA": "avx2", "KWKER_AMX": "off"}
    for prec, act in settings:
        # a Python child keeps this interpreter's environment (ASan's leak checks off: cli_env)
        p = subprocess.run([sys.executable, "-c", script, str(model), prec, str(act or 0),
                            str(tmp_path), str(PY_DIR)], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, **forced))
        assert p.returncode == 0, p.stderr
        got = json.loads(p.stdout)
        assert got == bench(prec, act, **forced), (prec, act)
        assert got["matmul"] == got["isa"] == "avx2", got


def test_generate_equals_python(tmp_path):
    """kwker generate --act-bits 8 on SmolLM2 gives the Python decoder's act_bits=8 tokens."""
    import kwker
    prompt = "The capital of France is"
    p = run("generate", "--model", smollm2_gguf(), "--prompt", prompt, "-n", "12", "-t", "2",
            "--precision", "int4", "--act-bits", "8", "--cache-dir", tmp_path)
    assert p.returncode == 0, p.stderr
    tok = kwker.Tokenizer.from_pretrained(smollm2_gguf())
    with kwker.KwkDecoder(smollm2_gguf(), max_cache_len=256, precision="int4", n_threads=2,
                          cache_dir=str(tmp_path), act_bits=8) as d:
        d.generate(tok.encode(prompt), max_new_tokens=12, tokenizer=tok, prompt_cache=False)
        assert p.stdout in (d.stats["text"] + "\n", d.stats["text"]), (p.stdout, d.stats)
    assert len(packs(tmp_path)) == 1


def test_perplexity_8_close_to_16(tmp_path):
    """Perplexity of SmolLM2 int4 on two chunks of wikitext: 8-bit activations within a few
    percent of 16-bit ones, and not the same figure."""
    from test_perplexity import WIKITEXT, parse_output
    text = tmp_path / "wiki.txt"
    data = WIKITEXT.read_bytes()
    text.write_bytes(data[:data.index(b"\n", 8000) + 1])
    ppl = {}
    for ab in ("16", "8"):
        p = run("perplexity", "--model", smollm2_gguf(), "--file", text, "--chunks", "2",
                "--ctx", "128", "-t", "2", "--precision", "int4", "--act-bits", ab,
                "--cache-dir", tmp_path / "packs", timeout=900)
        assert p.returncode == 0, p.stderr
        ppl[ab] = parse_output(p.stdout + p.stderr)["ppl_full"]
    assert ppl["8"] != ppl["16"], ppl
    assert abs(ppl["8"] / ppl["16"] - 1) < 0.05, ppl


def test_serve_with_act_bits_8(tmp_path):
    """kwker serve --act-bits 8: a greedy completion is `kwker generate --act-bits 8`'s text."""
    from test_server import Server
    prompt = "Once upon a time"
    flags = ["--precision", "int4", "--act-bits", "8", "--cache-dir", tmp_path]
    p = run("generate", "--model", smollm2_gguf(), "--prompt", prompt, "-n", "12", "-t", "2",
            *flags)
    assert p.returncode == 0, p.stderr
    s = Server("--max-batch", 2, "--max-cache-len", 256, *flags)
    try:
        c = s.client(key="unused")
        model_id = c.models.list().data[0].id
        r = c.completions.create(model=model_id, prompt=prompt, max_tokens=12, temperature=0)
        assert r.choices[0].text in (p.stdout, p.stdout.rstrip("\n"))
    finally:
        s.stop()
    assert len(packs(tmp_path)) == 1


@pytest.mark.parametrize("prec", PRECS)
def test_8_long_decode_steps_shared_by_positions(prec):
    """A decode step of 768 positions or more (here 2090-2099) whose kv groups do not go evenly
    round the threads (llama_wide: 2 groups; on 3 threads) is shared by positions where attention
    runs on AMX (forward.c attend_spans_run: each thread a run of the table's span parts, then a
    merge): its logits are bitwise the prompt's rows, and those of 1 and 2 threads (whole
    groups). On hosts without AMX-BF16 the same checks cover the tables' plain split."""
    from kwker.decode import KwkDecoder
    model = tiny_models.build("llama_wide")
    ids = np.asarray(tiny_models.prompt_ids("llama_wide", n=2100), dtype=np.int32)
    keep = 2090
    outs = {}
    for n in (1, 2, 3):
        with KwkDecoder(model, max_cache_len=2104, precision=prec, act_bits=8,
                        n_threads=n) as d:
            if cpu_has_amx_bf16() and os.environ.get("KWKER_AMX", "on") != "off":
                assert d.kernels()["attention"] == "amx-bf16", d.kernels()
            whole = np.array(d.forward(ids), copy=True)
            outs[n] = (whole, token_by_token(d, ids, start=keep))
    for n in (1, 2, 3):
        assert np.array_equal(outs[n][1], outs[n][0][keep:]), n
        assert np.array_equal(outs[n][0], outs[1][0]), n
