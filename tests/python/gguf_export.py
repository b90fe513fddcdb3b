"""Writes a Hugging Face checkpoint folder as GGUF the way llama.cpp's convert_hf_to_gguf.py does,
and reads such a file back into a Hugging Face state dict (the tests' dequantized reference).

What the converter does, and so what this writer does (the behaviour, not its code):
- Architecture: LlamaForCausalLM and MistralForCausalLM become "llama", Qwen2ForCausalLM
  "qwen2", Qwen3ForCausalLM "qwen3", Gemma3ForCausalLM "gemma3". Mistral's sliding_window is not written (llama.cpp's llama
  architecture has none), so only Mistral checkpoints whose window exceeds the test length are
  exported.
- "llama" permutes the rows of q_proj and k_proj (weights and biases) per head from Hugging
  Face's split-half rotary layout to llama.cpp's interleaved one:
  w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape), with
  n_head = num_attention_heads for q and num_key_value_heads for k. qwen2/qwen3: no permutation.
- Tensor names: token_embd, output_norm, output (absent when embeddings are tied: transformers
  does not save lm_head then), blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
  attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}; ".weight" / ".bias" kept.
- gemma3: the converter adds 1 to every norm weight (Gemma's norms scale by 1 + w; llama.cpp's by
  w), names the norms attn_norm (input), post_attention_norm, ffn_norm (pre-feedforward) and
  post_ffw_norm, and writes attention.sliding_window; the file has no layer types,
  query_pre_attn_scalar or local rotary base (llama.cpp assumes every sixth layer global,
  1/sqrt(key_length) and 10000), so only checkpoints with those values are exported.
- Llama 3 rope scaling ("rope_type": "llama3") is not metadata: the converter writes a 1-D
  rope_freqs.weight tensor of per-frequency divisors (1, factor, or the smooth blend) computed
  from rope_theta, head_dim, factor, low/high_freq_factor and original_max_position_embeddings.
  linear / yarn scaling would be rope.scaling.* keys (none of the test models use them).
- Tensor types: bf16 (and anything not f16/f32) is widened to f32 first. 1-D tensors, norms and
  biases are always F32. Otherwise the file type decides: all F32, F16, BF16 or Q8_0 (a matrix
  whose rows are not a multiple of the block size falls back to F16, as the converter's
  QuantError path does). Q4_0/Q4_1/Q5_0/Q5_1 files are made the same way for the loader tests.
- Metadata: <arch>.block_count, context_length (max_position_embeddings), embedding_length,
  feed_forward_length, attention.head_count, attention.head_count_kv, rope.freq_base,
  attention.layer_norm_rms_epsilon, attention.key_length / value_length when config.json has
  head_dim, general.file_type; "llama" adds vocab_size and rope.dimension_count; then the
  tokenizer.ggml.* keys and general.quantization_version = 2.
- Tokenizer: a minimal SentencePiece-style ("llama") vocabulary of vocab_size pieces (<unk>,
  <s>, </s> at 0/1/2 adjusted to the model's bos/eos, 256 byte pieces, then filler pieces) so
  that a reader expecting tokenizer.ggml.* finds it.
"""
import glob
import json
import math
from pathlib import Path

import numpy as np

GGUF_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
}

# gemma3's names where they differ from the table below (its norms around both blocks)
_GEMMA3_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _layer_names(arch):
    return {**_LAYER_NAMES, **_GEMMA3_NAMES} if arch == "gemma3" else _LAYER_NAMES


def gguf_name(hf_name, arch="llama"):
    if hf_name in _TOP_NAMES:
        return _TOP_NAMES[hf_name]
    parts = hf_name.split(".")
    names = _layer_names(arch)
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
        rest = ".".join(parts[3:])
        if rest in names:
            return "blk.%s.%s" % (parts[2], names[rest])
    raise KeyError("no GGUF name for tensor %r" % hf_name)


def hf_name(gguf_tensor_name, arch="llama"):
    inv_top = {v: k for k, v in _TOP_NAMES.items()}
    if gguf_tensor_name in inv_top:
        return inv_top[gguf_tensor_name]
    inv_layer = {v: k for k, v in _layer_names(arch).items()}
    parts = gguf_tensor_name.split(".", 2)
    if parts[0] == "blk" and parts[2] in inv_layer:
        return "model.layers.%s.%s" % (parts[1], inv_layer[parts[2]])
    raise KeyError("no Hugging Face name for GGUF tensor %r" % gguf_tensor_name)


def permute_qk(w, n_head):
    """HF split-half rows -> llama.cpp interleaved rows, per head (weights [rows, cols] or bias)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_qk(w, n_head):
    """Inverse of permute_qk."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def read_config(folder):
    return json.loads((Path(folder) / "config.json").read_text())


def rope_params(cfg):
    """The rope dict of either config style, with rope_theta in it."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "full_attention" in rope:  # Gemma 3 in transformers 5: per layer type; global layers'
        rope = dict(rope["full_attention"])
    if "rope_theta" not in rope:
        rope["rope_theta"] = cfg.get("rope_theta", 10000.0)
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope["type"]
    return rope


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def llama3_rope_factors(cfg):
    """Per-frequency divisors of the llama3 rope type (what the converter puts in rope_freqs)."""
    rope = rope_params(cfg)
    base = rope["rope_theta"]
    dim = head_dim(cfg)
    factor = rope.get("factor", 8.0)
    low = rope.get("low_freq_factor", 1.0)
    high = rope.get("high_freq_factor", 4.0)
    old_ctx = rope.get("original_max_position_embeddings",
                       cfg.get("original_max_position_embeddings", 8192))
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / (base ** (np.float32(i) / np.float32(dim)))
        wavelen = 2 * math.pi / float(np.float32(freq))
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def read_hf_tensors(folder):
    """name -> float32 or float16 numpy array (bf16 widened to float32), over all shards."""
    import torch
    from safetensors import safe_open
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(Path(p).name for p in glob.glob(str(folder / "model*.safetensors")))
    out = {}
    for f in files:
        with safe_open(str(folder / f), framework="pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                if t.dtype not in (torch.float16, torch.float32):
                    t = t.to(torch.float32)
                out[k] = t.numpy()
    return out


def _vocab(n_vocab, bos, eos):
    import gguf
    tokens, scores, types = [], [], []
    for i in range(n_vocab):
        if i == bos:
            tokens.append("<s>"), types.append(gguf.TokenType.CONTROL)
        elif i == eos:
            tokens.append("</s>"), types.append(gguf.TokenType.CONTROL)
        elif i == 0:
            tokens.append("<unk>"), types.append(gguf.TokenType.UNKNOWN)
        elif 3 <= i < 3 + 256:
            tokens.append("<0x%02X>" % (i - 3)), types.append(gguf.TokenType.BYTE)
        else:
            tokens.append("\u2581t%d" % i), types.append(gguf.TokenType.NORMAL)
        scores.append(0.0 if types[-1] != gguf.TokenType.NORMAL else -float(i))
    return tokens, scores, types


def export(folder, out_path, ftype="f32"):
    """Write the checkpoint in folder as a GGUF file at out_path.

    ftype: f32 | f16 | bf16 | q8_0 (the converter's --outtype choices), or q4_0 | q4_1 | q5_0 |
    q5_1, which the converter does not offer (llama-quantize makes them): here every matrix
    simply gets that type, with the same F16 fallback, to test those block formats."""
    import gguf
    cfg = read_config(folder)
    hf_arch = cfg["architectures"][0]
    arch = GGUF_ARCH[hf_arch]
    if hf_arch == "MistralForCausalLM" and (cfg.get("sliding_window") or 1 << 30) < 4096:
        raise ValueError("a llama GGUF cannot carry Mistral's sliding window")
    if arch == "gemma3":
        n = cfg["num_hidden_layers"]
        default = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                   for i in range(n)]
        local = (cfg.get("rope_parameters") or {}).get("sliding_attention", {}).get(
            "rope_theta", cfg.get("rope_local_base_freq", 10000.0))
        if (cfg.get("layer_types") or default) != default or \
                cfg.get("sliding_window_pattern", 6) != 6 or \
                cfg.get("query_pre_attn_scalar", 256) != head_dim(cfg) or local != 10000.0:
            raise ValueError("a gemma3 GGUF says neither layer types, query_pre_attn_scalar "
                             "nor the local rope base: llama.cpp's defaults only")
    file_type = gguf.LlamaFileType.ALL_F32 if ftype == "f32" else \
        gguf.LlamaFileType["MOSTLY_" + ftype.upper()]
    qtype_for = gguf.GGMLQuantizationType[ftype.upper()]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    rope = rope_params(cfg)

    tensors = []  # (gguf name, numpy data) in the converter's order: extra tensors first
    if rope.get("rope_type", "default").lower() == "llama3":
        tensors.append(("rope_freqs.weight", llama3_rope_factors(cfg)))
    for name, data in read_hf_tensors(folder).items():
        if name.endswith((".rotary_emb.inv_freq", ".attention.masked_bias", ".attention.bias")):
            continue
        if arch == "llama":
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = permute_qk(data, n_head)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                data = permute_qk(data, n_kv)
        if arch == "gemma3" and name.endswith("norm.weight"):
            data = data + np.float32(1.0)
        tensors.append((gguf_name(name, arch), data))

    w = gguf.GGUFWriter(str(out_path), arch)
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(Path(folder).name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if cfg.get("head_dim") is not None:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_file_type(file_type)
    if arch == "llama":
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(head_dim(cfg))
    if arch == "gemma3":
        w.add_sliding_window(cfg["sliding_window"])
    bos = cfg.get("bos_token_id", 1)
    eos = cfg.get("eos_token_id", 2)
    eos = eos[0] if isinstance(eos, list) else eos
    toks, scores, types = _vocab(cfg["vocab_size"], bos, eos)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    return _write_tensors(w, tensors, qtype_for, out_path)


def _write_tensors(w, tensors, qtype_for, out_path, float_tables=()):
    """Add tensors in qtype_for, as llama.cpp's converter keeps them: 1-D ones, norms, biases and
    the tables named in float_tables in F32; a matrix its rows cannot be quantized to (not whole
    blocks) in F16. Then write and close the file."""
    import gguf
    for name, data in tensors:
        qtype = qtype_for
        if data.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") or \
                name.split(".")[0] in float_tables:
            qtype = gguf.GGMLQuantizationType.F32
        try:
            q = gguf.quants.quantize(data, qtype)
        except gguf.QuantError:
            qtype = gguf.GGMLQuantizationType.F16
            q = gguf.quants.quantize(data, qtype)
        w.add_tensor(name, q, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out_path)


def read_back(gguf_path, cfg):
    """The GGUF's weights as a float32 Hugging Face state dict (dequantized, q/k un-permuted)."""
    import gguf
    import torch
    r = gguf.GGUFReader(str(gguf_path))
    arch = r.fields["general.architecture"].contents()
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    sd = {}
    for t in r.tensors:
        if t.name == "rope_freqs.weight":
            continue
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        data = data.reshape(shape)
        if arch == "llama":
            if t.name.endswith(("attn_q.weight", "attn_q.bias")):
                data = unpermute_qk(data, n_head)
            elif t.name.endswith(("attn_k.weight", "attn_k.bias")):
                data = unpermute_qk(data, n_kv)
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            data = data - np.float32(1.0)
        sd[hf_name(t.name, arch)] = torch.from_numpy(np.ascontiguousarray(data))
    return sd


def tensor_types(gguf_path):
    """GGUF tensor name -> type name (e.g. 'Q8_0')."""
    import gguf
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(gguf_path)).tensors}


def set_version(path, version):
    """Rewrite the header's version field (v2 and v3 differ only in it for little-endian files:
    both have 64-bit counts and lengths)."""
    with open(path, "r+b") as f:
        assert f.read(4) == b"GGUF"
        f.write(int(version).to_bytes(4, "little"))


def build_gguf(folder, ftype="f32", version=3):
    """Path of the GGUF export of a tiny model folder, written once next to it."""
    folder = Path(folder)
    suffix = "" if version == 3 else ".v%d" % version
    out = folder.parent / ("%s.%s%s.gguf" % (folder.name, ftype, suffix))
    if not out.exists():
        import os
        import tempfile
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=str(folder.parent))
        os.close(fd)
        try:
            export(folder, tmp, ftype)
            if version != 3:
                set_version(tmp, version)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out


# -- BERT encoders ----------------------------------------------------------------------------
#
# What llama.cpp's converter does for BertModel / BertForMaskedLM (its BertModel class; the
# behaviour, not its code), and so what export_bert does:
# - Architecture "bert". A "bert." prefix (BertForMaskedLM) is dropped; embeddings.position_ids,
#   the pooler and the MLM head (cls.*) are not written.
# - Names (gguf-py's TensorNameMap for MODEL_ARCH.BERT): token_embd, position_embd, token_types,
#   token_embd_norm; blk.N.attn_q / attn_k / attn_v / attn_output, attn_output_norm, ffn_up,
#   ffn_down, layer_output_norm; ".weight" / ".bias" kept.
# - Types: 1-D tensors, biases, "_norm.weight" tensors, position_embd and token_types are always
#   F32; the other matrices (token_embd included) take the file type (F32, F16 or Q8_0, a row
#   length that is not a multiple of the block falling back to F16).
# - Metadata: bert.context_length (max_position_embeddings), embedding_length,
#   feed_forward_length, block_count, attention.head_count, attention.layer_norm_epsilon,
#   attention.causal = false, pooling_type from sentence-transformers' 1_Pooling (MEAN, CLS or
#   LAST: the converter refuses the others; no key without modules.json), general.file_type.
# - Vocabulary: tokenizer.ggml.model "bert", the WordPiece vocabulary in "phantom space" form
#   (control tokens as they are; "##x" -> "x"; any other token t -> "\u2581" + t), token types
#   (special added tokens CONTROL, ids the tokenizer lacks up to vocab_size "[PAD<i>]" UNUSED,
#   the rest NORMAL), token_type_count (type_vocab_size), and the special ids. special="cls"
#   writes them as llama.cpp's own BERT vocabulary files do (ggml-vocab-bert-bge.gguf:
#   unknown, seperator (sic), padding, cls and mask token ids); special="bos" writes what
#   gguf-py's SpecialVocab writes today (no cls key: bos = [CLS], eos = [SEP], add_bos / add_eos).

_BERT_TOP = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.LayerNorm": "token_embd_norm",
}
_BERT_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_BERT_ARCHS = ("BertModel", "BertForMaskedLM", "XLMRobertaModel")
# sentence-transformers' pooling modes that a GGUF can say (gguf.PoolingType)
_BERT_GGUF_POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2,
                      "pooling_mode_lasttoken": 3}


def bert_gguf_name(hf_name):
    """The GGUF name of a BertModel tensor (without the "bert." prefix), or None for a tensor the
    converter does not write."""
    stem, _, suffix = hf_name.rpartition(".")
    if hf_name == "embeddings.position_ids" or hf_name.startswith(("pooler.", "cls.")):
        return None
    if stem in _BERT_TOP:
        return "%s.%s" % (_BERT_TOP[stem], suffix)
    parts = stem.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["encoder", "layer"] and parts[3] in _BERT_LAYER:
        return "blk.%s.%s.%s" % (parts[2], _BERT_LAYER[parts[3]], suffix)
    raise KeyError("no GGUF name for BERT tensor %r" % hf_name)


def bert_hf_name(gguf_tensor_name):
    """Inverse of bert_gguf_name (BertModel's names)."""
    stem, _, suffix = gguf_tensor_name.rpartition(".")
    for k, v in _BERT_TOP.items():
        if stem == v:
            return "%s.%s" % (k, suffix)
    parts = stem.split(".", 2)
    inv = {v: k for k, v in _BERT_LAYER.items()}
    if parts[0] == "blk" and parts[2] in inv:
        return "encoder.layer.%s.%s.%s" % (parts[1], inv[parts[2]], suffix)
    raise KeyError("no BERT name for GGUF tensor %r" % gguf_tensor_name)


def _bert_pooling(folder):
    """gguf.PoolingType value from sentence-transformers' files, or None without them."""
    folder = Path(folder)
    mods = folder / "modules.json"
    if not mods.is_file():
        return None
    for mod in json.loads(mods.read_text()):
        if mod["type"] == "sentence_transformers.models.Pooling":
            cfg = json.loads((folder / mod["path"] / "config.json").read_text())
            for key, val in _BERT_GGUF_POOLING.items():
                if cfg.get(key):
                    return val
            raise ValueError("%s: a GGUF says only MEAN, CLS or LAST pooling" % folder)
    return None


def _bert_vocab(folder, n_vocab):
    """(tokens in phantom-space form, token types, {special name: id}) of the folder's
    tokenizer, padded to n_vocab."""
    import gguf
    tj = json.loads((Path(folder) / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    rev = {i: t for t, i in vocab.items()}
    special = {a["id"]: a["content"] for a in tj.get("added_tokens", []) if a.get("special")}
    for a in tj.get("added_tokens", []):
        rev.setdefault(a["id"], a["content"])
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in rev:
            tokens.append("[PAD%d]" % i)
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            tokens.append(rev[i])
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(rev[i])
            types.append(gguf.TokenType.NORMAL)
    tokens = [t if ty == gguf.TokenType.CONTROL else
              (t[2:] if t.startswith("##") else "\u2581" + t) for t, ty in zip(tokens, types)]
    cfg = {}
    tc = Path(folder) / "tokenizer_config.json"
    if tc.is_file():
        cfg = json.loads(tc.read_text())
    ids = {}
    for name in ("unk", "sep", "pad", "cls", "mask"):
        tok = cfg.get(name + "_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        if tok is not None and tok in vocab:
            ids[name] = vocab[tok]
    return tokens, types, ids


def _position_offset(cfg):
    """Rows of RoBERTa's / XLM-R's position table before its first position (pad + 1), which
    llama.cpp's converter cuts; 0 for BERT."""
    return cfg.get("pad_token_id", 1) + 1 if cfg.get("model_type") in ("roberta",
                                                                          "xlm-roberta") else 0


def _write_t5_vocab(w, folder, n_vocab):
    """For a folder with XLM-R's sentencepiece.bpe.model, write its "t5" vocabulary to w as
    llama.cpp's converter does (tiny_spm.write_t5_vocab) and say so."""
    if not (Path(folder) / "sentencepiece.bpe.model").is_file():
        return False
    import tiny_spm
    tiny_spm.write_t5_vocab(w, folder, n_vocab)
    return True


def export_bert(model_dir, out_path, ftype="f32", special="cls"):
    """Write the BERT checkpoint in model_dir (BertModel or BertForMaskedLM, its tokenizer.json
    and, when present, sentence-transformers' modules.json / 1_Pooling) as a GGUF file at
    out_path the way llama.cpp's converter does (above). An XLMRobertaModel beside XLM-R's
    sentencepiece.bpe.model is written as its XLMRobertaModel class writes one: the position
    table cut by pad + 1 rows, the "t5" vocabulary. ftype: f32 | f16 | q8_0 | q4_0."""
    import gguf
    cfg = read_config(model_dir)
    if cfg["architectures"][0] not in _BERT_ARCHS:
        raise ValueError("not a BERT checkpoint: %s" % cfg["architectures"])
    if ftype not in ("f32", "f16", "q8_0", "q4_0"):
        raise ValueError("ftype must be f32, f16, q8_0 or q4_0")
    file_type = gguf.LlamaFileType.ALL_F32 if ftype == "f32" else \
        gguf.LlamaFileType["MOSTLY_" + ftype.upper()]
    qtype_for = gguf.GGMLQuantizationType[ftype.upper()]
    off = _position_offset(cfg)
    tensors = []
    for name, data in read_hf_tensors(model_dir).items():
        for prefix in ("bert.", "roberta."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        if name == "embeddings.position_embeddings.weight":
            data = data[off:]
        g = bert_gguf_name(name)
        if g is not None:
            tensors.append((g, data))
    n_vocab = cfg["vocab_size"]

    w = gguf.GGUFWriter(str(out_path), "bert")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(Path(model_dir).name)
    w.add_context_length(cfg["max_position_embeddings"] - off)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg.get("layer_norm_eps", 1e-12))
    w.add_file_type(file_type)
    w.add_causal_attention(False)
    pooling = _bert_pooling(model_dir)
    if pooling is not None:
        w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    if _write_t5_vocab(w, model_dir, n_vocab):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        return _write_tensors(w, tensors, qtype_for, out_path,
                              float_tables=("position_embd", "token_types"))
    tokens, types, ids = _bert_vocab(model_dir, n_vocab)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(tokens)
    w.add_token_types(types)
    if special == "cls":
        w.add_unk_token_id(ids["unk"])
        w.add_sep_token_id(ids["sep"])
        w.add_pad_token_id(ids["pad"])
        w.add_uint32("tokenizer.ggml.cls_token_id", ids["cls"])
        w.add_mask_token_id(ids["mask"])
    elif special == "bos":
        gguf.SpecialVocab(Path(model_dir), n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    else:
        raise ValueError("special must be 'cls' or 'bos'")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    return _write_tensors(w, tensors, qtype_for, out_path,
                          float_tables=("position_embd", "token_types"))


def read_back_bert(gguf_path):
    """A BERT GGUF's weights as a float32 BertModel state dict (dequantized)."""
    import gguf
    import torch
    sd = {}
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        sd[bert_hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(data.reshape(shape)))
    return sd


def export_rank(folder, out_path, ftype="f32", pooler_as_cls=False):
    """Write the cross-encoder in folder (BertForSequenceClassification,
    RobertaForSequenceClassification or XLMRobertaForSequenceClassification with its
    tokenizer.json) as the rank GGUF llama.cpp's converter writes for it (its BertModel /
    RobertaModel / XLMRobertaModel classes; the behaviour, not its code), at out_path.

    Beyond export_bert's BERT layout: "bert." / "roberta." prefixes dropped; RoBERTa's position
    table cut by pad_token_id + 1 rows (context_length the same less); RoBERTa's
    classifier.dense -> cls, classifier.out_proj -> cls.output; BERT's classifier -> cls.output,
    and BERT's pooler is not written (the converter drops pooler.dense: "only using BERT for
    embeddings"); pooling_type 4 (RANK); classifier.output_labels from id2label unless it is
    transformers' two-label default. pooler_as_cls=True writes BERT's pooler as cls, what a
    converter keeping the whole head would write. ftype: f32 | f16 | q8_0 | q4_0 (types as
    export_bert gives them)."""
    import gguf
    cfg = read_config(folder)
    off = _position_offset(cfg)
    heads = {"classifier": "cls.output", "classifier.out_proj": "cls.output",
             "classifier.dense": "cls"}
    tensors = []
    for name, data in read_hf_tensors(folder).items():
        for prefix in ("bert.", "roberta."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        stem, _, suffix = name.rpartition(".")
        if stem in heads:
            tensors.append(("%s.%s" % (heads[stem], suffix), data))
            continue
        if stem == "pooler.dense":
            if pooler_as_cls:
                tensors.append(("cls." + suffix, data))
            continue
        if name == "embeddings.position_embeddings.weight":
            data = data[off:]
        g = bert_gguf_name(name)
        if g is not None:
            tensors.append((g, data))
    if not (Path(folder) / "sentencepiece.bpe.model").is_file():
        tokens, types, ids = _bert_vocab(folder, cfg["vocab_size"])
    w = gguf.GGUFWriter(str(out_path), "bert")
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(Path(folder).name)
    w.add_context_length(cfg["max_position_embeddings"] - off)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg.get("layer_norm_eps", 1e-12))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if ftype == "f32" else
                    gguf.LlamaFileType["MOSTLY_" + ftype.upper()])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    labels = cfg.get("id2label") or {}
    if labels and not (len(labels) == 2 and labels.get("0") == "LABEL_0"):
        w.add_classifier_output_labels([v for _, v in sorted(labels.items(),
                                                             key=lambda kv: int(kv[0]))])
    w.add_token_type_count(cfg.get("type_vocab_size", 1))
    if not _write_t5_vocab(w, folder, cfg["vocab_size"]):
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("bert-bge")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_unk_token_id(ids["unk"])
        w.add_sep_token_id(ids["sep"])
        w.add_pad_token_id(ids["pad"])
        w.add_uint32("tokenizer.ggml.cls_token_id", ids["cls"])
        w.add_mask_token_id(ids["mask"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return _write_tensors(w, tensors, gguf.GGMLQuantizationType[ftype.upper()],
                                      out_path, float_tables=("position_embd", "token_types"))
