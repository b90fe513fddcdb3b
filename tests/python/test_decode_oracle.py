"""Kwker's decoder against transformers' float32 forward on tiny random checkpoints, on every
kernel path this CPU has (KWKER_ISA=scalar|avx2|avx512, each in its own child process; where the
CPU has AMX-BF16 also "avx512+amx": KWKER_AMX_PRESERVE=on, the bf16 checkpoints' products on
AMX, exact products in the tile unit's order of sums, and "avx512+bf16t": the bf16 checkpoints
packed in AMX tile order, the same products from kernels/amx_bf16t.c).

For each model of tiny_models.SPECS and each ISA:
- logits at every prompt position (KwkDecoder.forward) within 1e-5 of the reference's logit
  range (max|kwker - ref| <= 1e-5 * (max(ref) - min(ref)));
- the greedy tokens of KwkDecoder.generate(prompt, 16) equal transformers'
  model.generate(do_sample=False, max_new_tokens=16); so do those of generate() without
  speculation / prompt reuse, of generate_greedy(), and of a generate() resuming a cached prefix;
- the logits of the whole greedy sequence, three ways: forward() on it, the C API's one-token
  decode steps (kwk_decoder_eval with one id after the prompt), and batched steps at non-zero
  positions (chunks of 5, 7 and the rest).

eos: transformers runs with eos disabled (exactly 16 new tokens); each reference prompt is
chosen so that its greedy run never produces the model's eos id, so Kwker's generate (which stops
at eos) must return the same 16 tokens. test_reference_* check those premises without kwker.
"""
import re

import numpy as np
import pytest

import tiny_models
from conftest import (AMX_PACKED, AMX_PRESERVE, REL_TOL, cpu_has_amx_bf16, describe_diff,
                      first_token_diff, rel_err, supported_isas)

MODELS = list(tiny_models.SPECS)
ISAS = supported_isas() + ([AMX_PRESERVE, AMX_PACKED] if cpu_has_amx_bf16() else [])


# Prompt lengths at the edges: 2 ids (decode from the second position on) and 100 ids (past
# any kernel tile or block size, and 12x the 8-token sliding window).
LENGTH_CASES = [("llama_odd", 2), ("qwen3", 2), ("mistral_sw8", 2), ("gemma3", 2),
                ("llama_odd", 100), ("qwen2", 100), ("mistral_sw8", 100), ("llama3", 100),
                ("gemma3", 100), ("gemma3_legacy", 100)]


def _all_cases(oracle_refs):
    cases = [oracle_refs(n).case() for n in MODELS]
    cases += [oracle_refs(n, k).case(key="%s@%d" % (n, k), max_cache_len=128)
              for n, k in LENGTH_CASES]
    return cases


@pytest.fixture(scope="module")
def kwk_results(kwk_runner, oracle_refs):
    def get(isa):
        return kwk_runner.run(_all_cases(oracle_refs), isa)
    return get


def _norm_isa(s):
    """The ISA name kwk_isa_name gives for a kernel path (AMX_PRESERVE is the avx512 table)."""
    return re.sub(r"[^a-z0-9]", "", (s or "").split("+")[0].lower())


def stage(results, model, isa, name):
    """The array a stage produced, failing (never skipping) with kwker's own error when absent."""
    r = results[model]
    if r.get("_setup_error"):
        pytest.fail("kwker could not be loaded (KWKER_ISA=%s):\n%s" % (isa, r["_setup_error"]))
    assert _norm_isa(r["_isa"]) == _norm_isa(isa), \
        "KWKER_ISA=%s but the library chose %r" % (isa, r["_isa"])
    errs = r["errors"]
    for e in ("load", name) + (("c_api",) if name in ("steps", "chunked") else ()):
        if e in errs:
            pytest.fail("%s [%s] stage %s failed:\n%s" % (model, isa, e, errs[e]))
    assert name in r, "%s [%s]: no result for %s" % (model, isa, name)
    return r[name]


def check_logits(got, ref, what):
    got = np.asarray(got)
    assert got.dtype == np.float32, "%s: dtype %s, expected float32" % (what, got.dtype)
    assert got.shape == ref.shape, "%s: shape %s, expected %s" % (what, got.shape, ref.shape)
    assert np.isfinite(got).all(), "%s: non-finite logits" % what
    err = rel_err(got, ref)
    assert err <= REL_TOL, "%s: %s" % (what, describe_diff(got, ref))


params = [pytest.param(m, i, id="%s-%s" % (m, i)) for m in MODELS for i in ISAS]


@pytest.mark.parametrize("model,isa", params)
def test_prompt_logits(kwk_results, oracle_refs, model, isa):
    ref = oracle_refs(model)
    got = stage(kwk_results(isa), model, isa, "fwd_prompt")
    check_logits(got, ref.prompt_logits, "%s [%s] prompt logits (n=%d)" % (
        model, isa, len(ref.prompt)))


@pytest.mark.parametrize("model,isa", params)
def test_greedy_tokens(kwk_results, oracle_refs, model, isa):
    ref = oracle_refs(model)
    got = [int(t) for t in stage(kwk_results(isa), model, isa, "generate")]
    assert got[:len(ref.prompt)] == ref.prompt, "%s [%s]: generate() did not return the " \
        "prompt first: %s" % (model, isa, got[:len(ref.prompt)])
    new = got[len(ref.prompt):]
    assert new == ref.new_tokens, "%s [%s]: %s" % (model, isa, first_token_diff(
        new, ref.new_tokens))


@pytest.mark.parametrize("variant", ["gen_plain", "gen_greedy_c", "gen_resume"])
@pytest.mark.parametrize("model,isa", params)
def test_greedy_tokens_other_paths(kwk_results, oracle_refs, model, isa, variant):
    """generate() without speculation or prompt reuse, the C API's greedy loop, and a second
    generate() that continues a cached prefix all give transformers' tokens too."""
    ref = oracle_refs(model)
    got = [int(t) for t in stage(kwk_results(isa), model, isa, variant)]
    assert got == ref.gen, "%s [%s] %s: %s" % (model, isa, variant, first_token_diff(
        got[len(ref.prompt):], ref.new_tokens))


@pytest.mark.parametrize("model,isa", params)
def test_generated_sequence_logits(kwk_results, oracle_refs, model, isa):
    ref = oracle_refs(model)
    got = stage(kwk_results(isa), model, isa, "fwd_full")
    check_logits(got, ref.full_logits, "%s [%s] forward() on prompt + 16 greedy tokens" % (
        model, isa))


@pytest.mark.parametrize("model,isa", params)
def test_decode_step_logits(kwk_results, oracle_refs, model, isa):
    ref = oracle_refs(model)
    got = stage(kwk_results(isa), model, isa, "steps")
    want = ref.full_logits[len(ref.prompt) - 1:-1]
    check_logits(got, want, "%s [%s] one-token decode steps (row 0 = last prompt position)" % (
        model, isa))
    # The greedy tokens follow from these logits: argmax must be the reference's token.
    assert got.argmax(-1).tolist() == ref.new_tokens, "%s [%s]: %s" % (
        model, isa, first_token_diff(got.argmax(-1).tolist(), ref.new_tokens))


@pytest.mark.parametrize("model,isa", params)
def test_chunked_prefill_logits(kwk_results, oracle_refs, model, isa):
    ref = oracle_refs(model)
    got = stage(kwk_results(isa), model, isa, "chunked")
    check_logits(got, ref.full_logits, "%s [%s] batched eval in chunks 5+7+rest" % (
        model, isa))


# ---- premises of the oracle (transformers only) -------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_reference_is_decisive(oracle_refs, model):
    """Each greedy step of the reference is decided by far more than the tolerance, and its
    16 tokens never include eos: a correct decoder cannot differ by rounding or by stopping."""
    ref = oracle_refs(model)
    _, eos = tiny_models.special_ids(tiny_models.SPECS[model])
    assert len(ref.new_tokens) == 16 and eos not in ref.new_tokens
    assert ref.margin >= 20 * REL_TOL, "reference margin %.2e too small" % ref.margin
    assert 12 <= len(ref.prompt) <= 24
    span = float(ref.prompt_logits.max() - ref.prompt_logits.min())
    assert span > 1.0, "logits nearly constant (range %.3g): weights too small" % span


def test_reference_sliding_window_is_exercised(oracle_refs):
    """mistral_sw8's window (8) is shorter than its test sequence and changes the logits."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    ref = oracle_refs("mistral_sw8")
    assert len(ref.gen) > 8 + 4
    cfg = AutoConfig.from_pretrained(str(ref.path))
    assert cfg.sliding_window == 8
    cfg.sliding_window = None
    wide = AutoModelForCausalLM.from_pretrained(str(ref.path), config=cfg,
                                                dtype=torch.float32).eval()
    full = tiny_models.hf_logits(wide, ref.gen)
    d = np.abs(full - ref.full_logits).max(-1)
    assert (d[:8] == 0).all() and (d[8:] > 0.1).all(), d


@pytest.mark.parametrize("model", ["gemma3", "gemma3_legacy"])
def test_reference_gemma3_windows_and_bases_are_exercised(oracle_refs, model):
    """Gemma 3's local layers' window is shorter than the test sequence, and both it and their
    own rotary base change the logits: a decoder that ignored either would fail."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    ref = oracle_refs(model)
    cfg = AutoConfig.from_pretrained(str(ref.path))
    w = cfg.sliding_window
    assert len(ref.gen) > w + 4
    assert "full_attention" in cfg.layer_types and "sliding_attention" in cfg.layer_types
    for change in ("window", "local_base"):
        c = AutoConfig.from_pretrained(str(ref.path))
        if change == "window":
            c.sliding_window = 1 << 20
        else:
            c.rope_parameters["sliding_attention"]["rope_theta"] = \
                c.rope_parameters["full_attention"]["rope_theta"]
        other = AutoModelForCausalLM.from_pretrained(str(ref.path), config=c,
                                                     dtype=torch.float32).eval()
        d = np.abs(tiny_models.hf_logits(other, ref.gen) - ref.full_logits).max(-1)
        if change == "window":
            assert (d[:w] == 0).all() and (d[w:] > 0.01).any(), (change, d)
        else:
            assert (d[1:] > 0.01).any(), (change, d)


def test_reference_checkpoints_have_the_advertised_layout(oracle_refs):
    """The folders carry what the issue lists: shards + index, bf16 / f16 dtypes, tied and
    untied heads, both config.json styles, generation_config.json."""
    import json
    from safetensors import safe_open
    sharded = tiny_models.build("llama_sharded")
    idx = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(idx["weight_map"].values()))
    assert len(files) >= 3 and all(re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f)
                                   for f in files), files
    for name, dt in (("llama_bf16", "BF16"), ("qwen2_f16", "F16"), ("llama_odd", "F32")):
        with open(tiny_models.build(name) / "model.safetensors", "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            hdr = json.loads(f.read(n))
        dts = {v["dtype"] for k, v in hdr.items() if k != "__metadata__"}
        assert dts == {dt}, (name, dts)
    for name in MODELS:
        p = tiny_models.build(name)
        cfg = json.loads((p / "config.json").read_text())
        assert (p / "generation_config.json").exists()
        keys = set()
        for f in sorted(p.glob("*.safetensors")):
            with safe_open(str(f), "np") as st:
                keys.update(st.keys())
        assert ("lm_head.weight" in keys) == (not tiny_models.SPECS[name]["tie"]), name
        legacy = tiny_models.SPECS[name]["style"] == "legacy"
        assert ("rope_theta" in cfg) == legacy and ("rope_parameters" in cfg) == (not legacy)


def test_reference_wide_bf16_rows_lie_off_cache_lines():
    """llama_bf16_wide_ff's down_proj rows (2048 bf16 columns, amx_bf16.c's HEAD_MIN_COLS) start
    32 bytes past a 64-byte boundary of the file (so of the mapping: pages are 4096 bytes), as in
    the bench checkpoints: on the AMX path their first columns go through a head chunk."""
    import json
    p = tiny_models.build("llama_bf16_wide_ff")
    with open(p / "model.safetensors", "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        hdr = json.loads(f.read(n))
    down = {k: v for k, v in hdr.items() if k.endswith("mlp.down_proj.weight")}
    assert len(down) == tiny_models.SPECS["llama_bf16_wide_ff"]["layers"]
    for k, v in down.items():
        assert v["dtype"] == "BF16" and v["shape"] == [64, 2048], (k, v)
        assert (8 + n + v["data_offsets"][0]) % 64 == 32, (k, n, v["data_offsets"])


length_params = [pytest.param(m, k, i, id="%s@%d-%s" % (m, k, i))
                 for m, k in LENGTH_CASES for i in ISAS]


@pytest.mark.parametrize("model,n_prompt,isa", length_params)
def test_prompt_length_edges(kwk_results, oracle_refs, model, n_prompt, isa):
    ref = oracle_refs(model, n_prompt)
    key = "%s@%d" % (model, n_prompt)
    res = kwk_results(isa)
    assert len(ref.prompt) == n_prompt
    assert ref.margin >= 20 * REL_TOL, "reference margin %.2e too small" % ref.margin
    check_logits(stage(res, key, isa, "fwd_prompt"), ref.prompt_logits,
                 "%s [%s] prompt logits" % (key, isa))
    check_logits(stage(res, key, isa, "steps"), ref.full_logits[n_prompt - 1:-1],
                 "%s [%s] one-token decode steps" % (key, isa))
    check_logits(stage(res, key, isa, "chunked"), ref.full_logits,
                 "%s [%s] batched eval in chunks 5+7+rest" % (key, isa))
    got = [int(t) for t in stage(res, key, isa, "generate")][n_prompt:]
    assert got == ref.new_tokens, "%s [%s]: %s" % (key, isa, first_token_diff(
        got, ref.new_tokens))
