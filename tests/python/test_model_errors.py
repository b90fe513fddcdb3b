"""Model loading errors through the C API (ctypes on libkwker): a tiny LlamaForCausalLM saved by
transformers loads; corrupted copies of it (truncated safetensors, a broken header length, a
missing tensor, a config.json shape that disagrees with the weights) fail with a message naming
the file and the problem; a GPT-2 checkpoint gets a one-line "not supported" reason.

The library must be built (build/libkwker.so or $KWKER_LIB): without it these tests fail.
"""
import ctypes
import json
import shutil
from pathlib import Path

import pytest

from kwker import _lib

KWK_EFORMAT = -10001
KWK_EUNSUPPORTED = -10002
KWK_ENOTFOUND = -10008


# The binding's own prototypes and struct: ctypes prototypes live on the one shared library
# object, so a test that declared its own would change them for every later test.
from kwker.decode import _ModelInfo as KwkModelInfo  # noqa: E402
from kwker.decode import _bind  # noqa: E402


def clib():
    return _bind()  # raises (the test fails) when the library is not built


def load(path):
    """(info or None, err) for kwk_model_load(path)."""
    lib = clib()
    err = _lib.KwkErr()
    m = lib.kwk_model_load(str(path).encode(), ctypes.byref(err))
    if not m:
        return None, err
    info = KwkModelInfo()
    lib.kwk_model_get_info(m, ctypes.byref(info))
    lib.kwk_model_free(m)
    return info, err


def check(path, max_cache_len=0):
    buf = ctypes.create_string_buffer(512)
    rc = clib().kwk_model_check(str(path).encode(), max_cache_len, buf, len(buf))
    return rc, buf.value.decode()


def expect_error(path, code, *needles):
    info, err = load(path)
    assert info is None, "%s loaded but should not have" % path
    msg = err.text()
    assert err.code == code, "code %d (want %d): %s" % (err.code, code, msg)
    for n in needles:
        assert str(n) in msg, "%r not in %r" % (str(n), msg)
    return msg


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny") / "llama"
    model.save_pretrained(str(path), safe_serialization=True)
    assert (path / "model.safetensors").exists()
    return path, sum(p.numel() for p in model.parameters())


def copy_of(src, tmp_path, name="m"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_tiny_llama_loads(tiny_llama):
    path, n_params = tiny_llama
    info, err = load(path)
    assert info is not None, err.text()
    assert info.arch == 1 and info.arch_name == b"LlamaForCausalLM"
    assert (info.n_vocab, info.n_layers, info.d_model, info.d_ff) == (64, 2, 32, 48)
    assert (info.n_heads, info.n_kv_heads, info.head_dim) == (4, 2, 8)
    assert info.max_position == 128
    assert info.n_params == n_params
    assert check(path, 64) == (0, "")


def test_truncated_safetensors(tiny_llama, tmp_path):
    d = copy_of(tiny_llama[0], tmp_path)
    st = d / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])
    expect_error(d, KWK_EFORMAT, st, "past the end of the data", "truncated")
    st.write_bytes(data[:100])  # inside the JSON header
    expect_error(d, KWK_EFORMAT, st, "header length")


def test_bad_header_length(tiny_llama, tmp_path):
    d = copy_of(tiny_llama[0], tmp_path)
    st = d / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[7] ^= 0x40
    st.write_bytes(bytes(data))
    expect_error(d, KWK_EFORMAT, st, "header length")
    data[7] ^= 0x40
    data[0] -= 3  # header ends early: the JSON is cut
    st.write_bytes(bytes(data))
    expect_error(d, KWK_EFORMAT, st, "header JSON is invalid at byte")


def test_missing_tensor(tiny_llama, tmp_path):
    from safetensors.torch import load_file, save_file
    d = copy_of(tiny_llama[0], tmp_path)
    st = d / "model.safetensors"
    tensors = load_file(str(st))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(st), metadata={"format": "pt"})
    expect_error(d, KWK_ENOTFOUND, d, "model.layers.1.mlp.up_proj.weight is missing")


def test_config_shape_mismatch(tiny_llama, tmp_path):
    d = copy_of(tiny_llama[0], tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 40
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, KWK_EFORMAT, d / "model.safetensors",
                 "model.layers.0.mlp.gate_proj.weight: shape [48, 32] but config needs [40, 32]")


def test_bad_config_json(tiny_llama, tmp_path):
    d = copy_of(tiny_llama[0], tmp_path)
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n "vocab_size": }')
    msg = expect_error(d, KWK_EFORMAT, d / "config.json", "invalid JSON at line 2")
    rc, reason = check(d)
    assert rc == KWK_EFORMAT and reason == msg


@pytest.mark.parametrize("key,value,needle", [
    ("num_attention_heads", 1e302, '"num_attention_heads" must be an integer'),
    ("num_attention_heads", -1e19, '"num_attention_heads" must be an integer'),
    ("num_attention_heads", 4.5, '"num_attention_heads" must be an integer'),
    ("rope_theta", 1e39, '"rope_theta" must be a number'),
    ("rms_norm_eps", -1e300, '"rms_norm_eps" must be a number'),
])
def test_config_numbers_out_of_range(tiny_llama, tmp_path, key, value, needle):
    # Each is refused by name before it is converted (a double past int's range converted to
    # int is undefined; past float's, it became infinity).
    d = copy_of(tiny_llama[0], tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, KWK_EFORMAT, d / "config.json", needle)


def test_gguf_float_out_of_range(tiny_llama, tmp_path):
    # The same for GGUF metadata: rope.freq_base of infinity is refused, not run.
    import struct
    from gguf_export import build_gguf
    src = build_gguf(copy_of(tiny_llama[0], tmp_path))
    data = bytearray(src.read_bytes())
    key = b"llama.rope.freq_base"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 6  # GGUF float32
    struct.pack_into("<f", data, at + 4, float("inf"))
    bad = tmp_path / "inf.gguf"
    bad.write_bytes(bytes(data))
    expect_error(bad, KWK_EFORMAT, bad, "llama.rope.freq_base must be a number")


def test_gpt2_unsupported(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel
    d = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64,
                               n_positions=32)).save_pretrained(str(d))
    rc, reason = check(d, 16)
    assert rc == KWK_EUNSUPPORTED
    assert "architecture GPT2LMHeadModel is not supported (supported: Llama, Mistral, Qwen2, " \
           "Qwen3, Gemma3ForCausalLM; encoders: BERT, RoBERTa, XLM-RoBERTa)" in reason
    assert "\n" not in reason
    expect_error(d, KWK_EUNSUPPORTED, d, "architecture GPT2LMHeadModel is not supported")


def test_unknown_id_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    expect_error("nobody/no-such-model", KWK_ENOTFOUND, "models--nobody--no-such-model",
                 "never downloads")
