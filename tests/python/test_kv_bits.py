"""kv_bits: the KV cache's element, IEEE half (16, the default for balanced / int4) or float32 (32,
the default for preserve), through the C API (via the Python binding), KwkDecoder, Engine and the
CLI (generate, chat, bench, perplexity, serve).

What must hold: bad values are refused with a message naming them (ValueError in Python, KWK_EARG
from the C side, exit code 2 from the CLI); the defaults are 32 for preserve (its logits stay
bitwise those of an explicit 32) and 16 for balanced / int4; 16 and 32 give close but different
logits (the half cache really runs) on every precision; a half cache keeps batch invariance
(token by token = the whole prompt at once) and an Engine, whose prompt reuse copies cache rows
between slots, gives the decoder's tokens and logprobs. That a half cache computes bitwise what a
float cache holding the same values does is test_attn's (C) check, per kernel table.
"""
import ctypes
import json

import numpy as np
import pytest

from conftest import rel_err, smollm2_gguf, token_by_token
import tiny_models
# the helpers and tiny-model fixture act_bits' tests use: a 2-thread decoder of 64 positions, its
# logits, a kwker command, log-softmax
from test_act_bits import decoder, log_softmax, logits, run, tiny  # noqa: F401 (tiny: fixture)

PRECS = ["preserve", "balanced", "int4"]
# Largest relative difference (of the logits' range, conftest.rel_err) between a half and a
# float cache on the tiny random models: a half keeps 11 significant bits, so keys and values
# move by up to 2^-12 of themselves; measured 0.00015-0.0003 (llama_odd, qwen2).
MAX_REL_16_32 = 0.003


# --- refused values ---

@pytest.mark.parametrize("bad", [8, 24, 64, -16, True, "16"])
def test_python_rejects_bad_values(tiny, bad):
    with pytest.raises(ValueError, match="kv_bits"):
        decoder(tiny[0], "int4", kv_bits=bad)


@pytest.mark.parametrize("bad", [1, 8, 15, 17, 31, 33, -16, 1 << 30])
def test_c_api_rejects_bad_values(tiny, bad):
    """kwk_decoder_new itself (bypassing the binding's check): KWK_EARG naming the value."""
    from kwker._lib import KwkErr
    from kwker.decode import _DecoderParams
    with decoder(tiny[0], "preserve") as d:
        p = _DecoderParams()
        d._lib.kwk_decoder_params_init(ctypes.byref(p))
        p.precision = 2
        p.max_cache_len = 16
        p.kv_bits = bad
        err = KwkErr()
        h = d._lib.kwk_decoder_new(d._model, ctypes.byref(p), ctypes.byref(err))
        if h:
            d._lib.kwk_decoder_free(h)
        assert not h, "kv_bits %d accepted" % bad
        assert err.code == -10004, err.code  # KWK_EARG
        assert ("kv_bits %d" % bad) in err.text(), err.text()


# --- the defaults and what 16 and 32 compute ---

def test_defaults(tiny):
    for prec, want in (("preserve", 32), ("balanced", 16), ("int4", 16)):
        with decoder(tiny[0], prec) as d:
            assert d.kv_bits == want, (prec, d.kv_bits)
        with decoder(tiny[0], prec, kv_bits=48 - want) as d:
            assert d.kv_bits == 48 - want, (prec, d.kv_bits)


def test_preserve_default_is_32_bitwise(tiny):
    assert np.array_equal(logits(tiny[0], "preserve", tiny[1], kv_bits=32),
                          logits(tiny[0], "preserve", tiny[1]))


@pytest.mark.parametrize("prec", ["balanced", "int4"])
def test_quantized_default_is_16_bitwise(tiny, prec):
    assert np.array_equal(logits(tiny[0], prec, tiny[1], kv_bits=16),
                          logits(tiny[0], prec, tiny[1]))


@pytest.mark.parametrize("prec", PRECS)
def test_16_is_close_to_32_but_not_equal(tiny, prec):
    """A half cache changes the numbers (its stores round), by little: bounded against a float
    cache, and a half preserve stays near transformers' float32 model (the float cache)."""
    l16 = logits(tiny[0], prec, tiny[1], kv_bits=16)
    l32 = logits(tiny[0], prec, tiny[1], kv_bits=32)
    assert np.isfinite(l16).all()
    assert not np.array_equal(l16, l32), "kv_bits=16 computed exactly what 32 does"
    d = rel_err(l16, l32)
    assert 0 < d < MAX_REL_16_32, d
    # deterministic: a second decoder gives the same bits
    assert np.array_equal(l16, logits(tiny[0], prec, tiny[1], kv_bits=16))


@pytest.mark.parametrize("prec", ["preserve", "int4"])
def test_16_is_batch_invariant(tiny, prec):
    """Token by token (each row reading the halves the rows before it stored) gives the bits of
    the whole prompt at once."""
    ids = np.asarray(tiny[1], dtype=np.int32)
    with decoder(tiny[0], prec, kv_bits=16) as d:
        whole = np.array(d.forward(ids), copy=True)
        rows = token_by_token(d, ids)
    assert np.array_equal(rows, whole)


@pytest.mark.parametrize("name", ["llama_odd", "qwen2", "mistral_sw8"])
@pytest.mark.parametrize("prec", ["preserve", "int4"])
def test_16_long_prompt_chunks_agree(name, prec):
    """A prompt chunk of 16 or more rows of one slot reads its slot's keys and values widened
    once into floats (forward.c stage_slot); shorter chunks and decode rows read the halves.
    Both paths give the same bits: 40 tokens at once = chunks of 7 = 20 + 20 = token by token,
    with a sliding window (mistral_sw8: 8 positions) too."""
    model = tiny_models.build(name)
    ids = np.asarray(tiny_models.prompt_ids(name, n=40), dtype=np.int32)
    with decoder(model, prec, kv_bits=16) as d:
        out = np.empty((len(ids), d.vocab_size), dtype=np.float32)

        def run(sizes):
            d._lib.kwk_decoder_truncate(d._dec, 0)
            rows, at = [], 0
            for n in sizes:
                d._eval(ids[at:at + n], 2, out[:n])
                rows.append(out[:n].copy())
                at += n
            return np.concatenate(rows)

        whole = run([40])
        for sizes in ([7, 7, 7, 7, 7, 5], [20, 20], [1] * 40, [3, 17, 16, 4]):
            assert np.array_equal(run(sizes), whole), sizes


# --- the engine ---

@pytest.mark.parametrize("prec, kv", [("int4", 16), ("int4", 32), ("preserve", 16)])
def test_engine_takes_the_decoders(tiny, prec, kv):
    """Engine(decoder) runs with the decoder's kv_bits: its greedy tokens are the decoder's, its
    logprobs those of the decoder's cache type (not the other's), and a second request for the
    same prompt (its prefix copied from the first's slot) gives the same again."""
    from kwker.serve import Engine
    model, ids = tiny
    n_new = 8
    with decoder(model, prec, kv_bits=kv) as d:
        want = [int(t) for t in d.generate_greedy(list(ids), max_new_tokens=n_new,
                                                  eos_token_id=[])[len(ids):]]
        with Engine(d, max_batch=2) as e:
            got, lps = [], []
            for _ in range(2):
                req = e.submit(list(ids), max_new_tokens=n_new, eos_token_id=[], lookup=0,
                               prompt_cache=True)
                got.append(req.result())
                lps.append(np.array(req.logprobs))
    assert got == [want, want]
    seq = list(ids) + want
    pos = np.arange(len(ids) - 1, len(seq) - 1)
    lp = {b: log_softmax(logits(model, prec, seq, kv_bits=b))[pos, want] for b in (16, 32)}
    for x in lps:
        mine, other = np.abs(x - lp[kv]).max(), np.abs(x - lp[48 - kv]).max()
        assert mine < 1e-4 and other > mine, (mine, other)


def test_engine_from_a_path(tiny):
    from kwker.serve import Engine
    model, ids = tiny
    with pytest.raises(ValueError, match="kv_bits"):
        Engine(model, precision="int4", kv_bits=8)
    with decoder(model, "balanced", kv_bits=32) as d:
        want = [int(t) for t in d.generate_greedy(list(ids), max_new_tokens=6,
                                                  eos_token_id=[])[len(ids):]]
    with Engine(model, precision="balanced", kv_bits=32, n_threads=2, max_batch=2,
                max_cache_len=64) as e:
        assert e.generate([list(ids)], max_new_tokens=6, eos_token_id=[], lookup=0) == [want]


# --- the CLI ---

@pytest.mark.parametrize("cmd", ["generate", "chat", "bench", "perplexity", "serve"])
@pytest.mark.parametrize("bad", [["--kv-bits", "8"], ["--kv-bits", "x"], ["--kv-bits"]])
def test_cli_rejects_bad_values(cmd, bad, tmp_path):
    extra = {"generate": ["--prompt", "x"], "perplexity": ["--file", tmp_path / "t.txt"]}
    p = run(cmd, "--model", smollm2_gguf(), "--precision", "int4", *extra.get(cmd, []), *bad,
            timeout=120)
    assert p.returncode == 2, (cmd, bad, p.returncode, p.stderr)
    assert "value for --kv-bits" in p.stderr, p.stderr


@pytest.mark.parametrize("cmd", ["generate", "chat", "bench", "perplexity", "serve"])
def test_cli_help_names_it(cmd):
    p = run(cmd, "--help", timeout=60)
    assert "--kv-bits" in p.stdout + p.stderr, (cmd, p.stdout, p.stderr)


def bench_json(model, *args):
    p = run("bench", "--model", model, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "--json",
            "--cache-dir", "off", *args)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_bench_json_kv_bits(tiny):
    model = tiny[0]
    assert bench_json(model, "--precision", "int4")["kv_bits"] == 16
    assert bench_json(model, "--precision", "int4", "--kv-bits", "32")["kv_bits"] == 32
    assert bench_json(model, "--precision", "preserve")["kv_bits"] == 32
    assert bench_json(model, "--precision", "preserve", "--kv-bits", "16")["kv_bits"] == 16


def test_generate_equals_python():
    """kwker generate --kv-bits 32 on SmolLM2 int4 gives the Python decoder's kv_bits=32 tokens."""
    import kwker
    prompt = "The capital of France is"
    p = run("generate", "--model", smollm2_gguf(), "--prompt", prompt, "-n", "12", "-t", "2",
            "--precision", "int4", "--kv-bits", "32", "--cache-dir", "off")
    assert p.returncode == 0, p.stderr
    tok = kwker.Tokenizer.from_pretrained(smollm2_gguf())
    with kwker.KwkDecoder(smollm2_gguf(), max_cache_len=256, precision="int4", n_threads=2,
                          kv_bits=32) as d:
        d.generate(tok.encode(prompt), max_new_tokens=12, tokenizer=tok, prompt_cache=False)
        assert p.stdout in (d.stats["text"] + "\n", d.stats["text"]), (p.stdout, d.stats)
