"""The tiny random checkpoints written as GGUF (gguf_export.py: what llama.cpp's
convert_hf_to_gguf.py writes, q/k rows permuted for the "llama" architecture) must decode to the
same logits as their safetensors folders.

- F32 GGUF of every model whose GGUF can say everything its config says (all but mistral_sw8:
  llama.cpp's llama architecture has no sliding window; and gemma3_legacy, whose layer pattern,
  local rotary base and softmax scale are not llama.cpp's gemma3 defaults), on every ISA: prompt logits and the
  logits of the greedy sequence within 1e-5 of transformers' range on the folder, the same greedy
  tokens, and within 1e-5 of Kwker's own logits on the folder.
- F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 exports of several models: the reference is
  transformers run on the weights read back from the file (dequantized with gguf.quants, q/k
  un-permuted), so the numbers are the file's own; same tolerance. And a GGUF v2 header.
- Without kwker: the export reads back bit-exactly, and transformers' own GGUF loader turns it
  back into the same model (llama/mistral/qwen2: transformers cannot read qwen3's key_length
  nor llama3's rope_freqs), which checks the permutation and the names.
"""
import numpy as np
import pytest

import gguf_export
import tiny_models
from conftest import REL_TOL, describe_diff, first_token_diff, rel_err, supported_isas
from test_decode_oracle import check_logits, stage

GGUF_MODELS = [m for m in tiny_models.SPECS if m not in ("mistral_sw8", "gemma3_legacy")]
QUANT_VARIANTS = [("llama_tied", "f16"), ("llama_tied", "q8_0"), ("qwen3", "q8_0"),
                  ("llama_odd", "q8_0"), ("llama_bf16", "bf16"), ("qwen2", "q4_0"),
                  ("llama_tied", "q4_1"), ("mistral", "q5_0"), ("qwen3", "q5_1"),
                  ("gemma3", "q8_0"), ("gemma3", "q5_0")]
ISAS = supported_isas()


@pytest.fixture(scope="module")
def gguf_refs(oracle_refs):
    """key -> (OracleCase, gguf path). F32 keys reuse the folder's reference."""
    import torch
    from transformers import AutoModelForCausalLM
    out = {}
    for name in GGUF_MODELS:
        ref = oracle_refs(name)
        out[name + ".f32"] = (ref, gguf_export.build_gguf(ref.path, "f32"))
    ref = oracle_refs("llama_odd")
    out["llama_odd.f32.v2"] = (ref, gguf_export.build_gguf(ref.path, "f32", version=2))
    for name, ftype in QUANT_VARIANTS:
        folder = tiny_models.build(name)
        path = gguf_export.build_gguf(folder, ftype)
        cfg = gguf_export.read_config(folder)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        sd = gguf_export.read_back(path, cfg)
        if cfg.get("tie_word_embeddings"):
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
        out["%s.%s" % (name, ftype)] = (tiny_models.oracle_case(name, model=model, path=folder),
                                        path)
    return out


@pytest.fixture(scope="module")
def gguf_results(kwk_runner, gguf_refs):
    def get(isa):
        cases = [ref.case(key=k, model=path) for k, (ref, path) in sorted(gguf_refs.items())]
        return kwk_runner.run(cases, isa)
    return get


@pytest.fixture(scope="module")
def folder_results(kwk_runner, oracle_refs):
    def get(isa):
        return kwk_runner.run([oracle_refs(n).case() for n in tiny_models.SPECS], isa)
    return get


f32_params = [pytest.param(m, i, id="%s-%s" % (m, i)) for m in GGUF_MODELS for i in ISAS]
quant_keys = ["%s.%s" % v for v in QUANT_VARIANTS]


@pytest.mark.parametrize("model,isa", f32_params)
def test_gguf_f32_matches_transformers(gguf_results, gguf_refs, model, isa):
    key = model + ".f32"
    ref, _ = gguf_refs[key]
    res = gguf_results(isa)
    check_logits(stage(res, key, isa, "fwd_prompt"), ref.prompt_logits,
                 "%s GGUF [%s] prompt logits" % (model, isa))
    check_logits(stage(res, key, isa, "fwd_full"), ref.full_logits,
                 "%s GGUF [%s] logits of prompt + 16 greedy tokens" % (model, isa))
    check_logits(stage(res, key, isa, "steps"), ref.full_logits[len(ref.prompt) - 1:-1],
                 "%s GGUF [%s] one-token decode steps" % (model, isa))
    got = [int(t) for t in stage(res, key, isa, "generate")][len(ref.prompt):]
    assert got == ref.new_tokens, "%s GGUF [%s]: %s" % (model, isa, first_token_diff(
        got, ref.new_tokens))


@pytest.mark.parametrize("model,isa", f32_params)
def test_gguf_f32_matches_folder(gguf_results, folder_results, model, isa):
    """The same weights through both loaders give the same numbers inside Kwker."""
    a = stage(gguf_results(isa), model + ".f32", isa, "fwd_full")
    b = stage(folder_results(isa), model, isa, "fwd_full")
    err = rel_err(a, b)
    assert err <= REL_TOL, "%s [%s] GGUF vs folder: %s" % (model, isa, describe_diff(a, b))


@pytest.mark.parametrize("isa", ISAS)
def test_gguf_version_2(gguf_results, gguf_refs, isa):
    """A GGUF v2 header (same layout as v3 for little-endian files) loads the same."""
    ref, _ = gguf_refs["llama_odd.f32.v2"]
    res = gguf_results(isa)
    check_logits(stage(res, "llama_odd.f32.v2", isa, "fwd_full"), ref.full_logits,
                 "llama_odd GGUF v2 [%s]" % isa)


@pytest.mark.parametrize("key", quant_keys)
@pytest.mark.parametrize("isa", ISAS)
def test_gguf_quantized_matches_dequantized_reference(gguf_results, gguf_refs, key, isa):
    ref, path = gguf_refs[key]
    res = gguf_results(isa)
    check_logits(stage(res, key, isa, "fwd_prompt"), ref.prompt_logits,
                 "%s [%s] prompt logits" % (key, isa))
    check_logits(stage(res, key, isa, "fwd_full"), ref.full_logits,
                 "%s [%s] logits of prompt + 16 greedy tokens" % (key, isa))
    check_logits(stage(res, key, isa, "steps"), ref.full_logits[len(ref.prompt) - 1:-1],
                 "%s [%s] one-token decode steps" % (key, isa))
    got = [int(t) for t in stage(res, key, isa, "generate")][len(ref.prompt):]
    assert got == ref.new_tokens, "%s [%s]: %s" % (key, isa, first_token_diff(
        got, ref.new_tokens))


# ---- the exporter itself (no kwker) --------------------------------------------------------


@pytest.mark.parametrize("model", GGUF_MODELS)
def test_export_reads_back_exactly(model):
    import torch
    folder = tiny_models.build(model)
    path = gguf_export.build_gguf(folder, "f32")
    sd = gguf_export.read_back(path, gguf_export.read_config(folder))
    orig = gguf_export.read_hf_tensors(folder)
    assert set(sd) == set(orig)
    for k, v in orig.items():
        want = torch.from_numpy(v).float()
        if tiny_models.SPECS[model]["arch"] == "gemma3" and k.endswith("norm.weight"):
            # the file holds 1 + w rounded, as the converter writes it: what the model
            # multiplies by, 1 + w in float32, reads back exactly (not w itself)
            assert torch.equal(1.0 + sd[k], 1.0 + want), k
            continue
        assert torch.equal(sd[k], want), k
    types = gguf_export.tensor_types(path)
    assert set(types.values()) == {"F32"}
    assert ("rope_freqs.weight" in types) == (model == "llama3")
    assert ("output.weight" in types) == (not tiny_models.SPECS[model]["tie"])


def test_export_quant_types():
    t = gguf_export.tensor_types(gguf_export.build_gguf(tiny_models.build("llama_tied"), "q8_0"))
    assert t["blk.0.attn_q.weight"] == "Q8_0" and t["token_embd.weight"] == "Q8_0"
    assert t["blk.0.attn_norm.weight"] == "F32"
    t = gguf_export.tensor_types(gguf_export.build_gguf(tiny_models.build("llama_odd"), "q8_0"))
    # hidden 80 is not a multiple of Q8_0's 32-wide blocks: the converter falls back to F16
    assert t["blk.0.attn_q.weight"] == "F16" and t["blk.0.ffn_down.weight"] == "F16"
    t = gguf_export.tensor_types(gguf_export.build_gguf(tiny_models.build("llama_tied"), "f16"))
    assert t["blk.0.ffn_up.weight"] == "F16" and t["output_norm.weight"] == "F32"
    for name, ftype in QUANT_VARIANTS:
        t = gguf_export.tensor_types(gguf_export.build_gguf(tiny_models.build(name), ftype))
        if name != "llama_odd":  # nothing in llama_odd is a multiple of 32 wide: all F16
            assert ftype.upper() in t.values(), (name, ftype, t)
        assert {v for k, v in t.items() if k.endswith(("norm.weight", ".bias"))} <= {"F32"}


def test_export_metadata_like_the_converter():
    import gguf
    r = gguf.GGUFReader(str(gguf_export.build_gguf(tiny_models.build("qwen3"), "f32")))
    f = {k: v.contents() for k, v in r.fields.items()
         if not k.startswith("tokenizer.ggml.") or k.endswith("_id")}
    assert f["general.architecture"] == "qwen3"
    assert f["qwen3.attention.key_length"] == 24 and f["qwen3.attention.value_length"] == 24
    assert f["qwen3.attention.head_count"] == 4 and f["qwen3.attention.head_count_kv"] == 2
    assert f["qwen3.embedding_length"] == 64 and f["qwen3.block_count"] == 2
    assert abs(f["qwen3.rope.freq_base"] - 1e6) < 1
    r = gguf.GGUFReader(str(gguf_export.build_gguf(tiny_models.build("llama_odd"), "f32")))
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.t")}
    assert f["general.architecture"] == "llama"
    assert f["llama.rope.dimension_count"] == 16 and f["llama.vocab_size"] == 1003
    assert "llama.attention.key_length" not in f  # legacy config.json: no head_dim
    assert f["general.file_type"] == 0 and f["general.quantization_version"] == 2


@pytest.mark.parametrize("model", ["llama_tied", "llama_odd", "mistral", "qwen2",
                                   "llama_sharded", "llama_bf16", "qwen2_f16", "gemma3"])
def test_export_loads_in_transformers(oracle_refs, model):
    """transformers' GGUF loader (which undoes llama.cpp's q/k permutation itself) rebuilds
    the same model from the export: the names, shapes and permutation are llama.cpp's."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers import AutoConfig
    ref = oracle_refs(model)
    path = gguf_export.build_gguf(ref.path, "f32")
    cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    if model == "gemma3":
        # transformers' reader leaves query_pre_attn_scalar at its default, 256, where
        # llama.cpp takes key_length (both right for the released models, whose head_dim is 256)
        assert cfg.query_pre_attn_scalar == 256
        cfg.query_pre_attn_scalar = cfg.head_dim
    m = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, config=cfg,
                                             dtype=torch.float32).eval()
    got = tiny_models.hf_logits(m, ref.prompt)
    assert np.abs(got - ref.prompt_logits).max() <= 1e-6 * np.ptp(ref.prompt_logits)


def test_export_vocabulary_readable_by_transformers():
    """The minimal tokenizer.ggml.* vocabulary is a real one: transformers builds a tokenizer
    from it with the model's bos / eos."""
    from transformers import AutoTokenizer
    path = gguf_export.build_gguf(tiny_models.build("llama_tied"), "f32")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert len(tok) == tiny_models.SPECS["llama_tied"]["vocab"]
    assert (tok.bos_token_id, tok.eos_token_id) == tiny_models.special_ids(
        tiny_models.SPECS["llama_tied"])
    assert tok.convert_ids_to_tokens([0, 3, 300]) == ["<unk>", "<0x00>", "\u2581t300"]


@pytest.mark.parametrize("model", ["qwen2", "mistral"])
def test_int4_keeps_a_q4_0_files_grid(model, tmp_path):
    """int4 from a Q4_0 GGUF packs the file's own codes and scales (w = d q - 8 d, exact in
    int4's half scale and offset): its logits differ from preserve's on the same file only by the
    activations' 16-bit rounding (measured 0.004 relative RMS), where fitting a grid again to the
    dequantized floats moved them 0.07-0.14 (KWKER_INT4_GRID=off). Mistral's q / k rows are
    stored permuted by llama.cpp's converter: the grid is read from the file's rows in that
    order (kwk_model_file_row)."""
    import os
    import subprocess
    import sys
    from conftest import PY_DIR
    from test_precision import rel_rms
    path = gguf_export.build_gguf(tiny_models.build(model), "q4_0")
    assert "Q4_0" in set(gguf_export.tensor_types(path).values())
    out = {}
    for prec, grid in (("preserve", "on"), ("int4", "on"), ("int4", "off")):
        npy = tmp_path / ("%s_%s.npy" % (prec, grid))
        code = ("import sys, numpy as np; sys.path.insert(0, %r); import kwker\n"
                "d = kwker.KwkDecoder(%r, max_cache_len=64, precision=%r)\n"
                "np.save(%r, np.asarray(d.forward(np.arange(3, 40, dtype=np.int32))))\n"
                % (str(PY_DIR), str(path), prec, str(npy)))
        subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                       env=dict(os.environ, KWKER_INT4_GRID=grid))
        out[prec, grid] = np.load(npy)
    on = rel_rms(out["int4", "on"], out["preserve", "on"])
    off = rel_rms(out["int4", "off"], out["preserve", "on"])
    assert on <= 0.02 and off >= 0.04, (model, on, off)
