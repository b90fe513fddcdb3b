"""Tiny random checkpoints saved by transformers, the oracle models of the decoder tests.

Each spec below becomes a folder (config.json, generation_config.json, safetensors) under the
test cache ($KWK_TEST_CACHE or /tmp/kwker-test-models), keyed by a hash of the spec and of this
builder's version, so reruns reuse them. Folders are written to a temporary name and renamed into
place, so concurrent test runs never see half a checkpoint.

Weights: torch.manual_seed(spec seed), then every matrix is redrawn from N(0, 1/fan_in) and every
1-D parameter (RMSNorm weights, q/k/v biases) from 1 + N(0, 0.2) or N(0, 0.2): transformers'
own init leaves norms at exactly 1 and biases at exactly 0, which would hide a decoder that
ignores them. Embeddings are N(0, 1) (N(0, 0.01) when tied, else greedy loops on one id).
Logits then spread over several units, so greedy tokens are well separated.

config.json comes in two styles: "v5" is what this transformers writes (rope_parameters, dtype,
head_dim always present); "legacy" is what most hub checkpoints carry (top-level rope_theta,
rope_scaling, torch_dtype, no head_dim unless it differs). transformers reads both; the decoder
must too.

eos: the decoder's generate() stops at the model's eos ids while the references are plain
16-step greedy runs, so each spec's eos id is one that the reference greedy runs of its test
prompts never produce (checked by the tests, see test_decode_oracle.py). The ids are small random
integers so that nothing depends on them.
"""
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

BUILDER_VERSION = 4

# name -> spec. Keys: arch (llama|mistral|qwen2|qwen3|gemma3), hidden, heads, kv, inter, vocab, layers,
# tie, style (v5|legacy), dtype (float32|bfloat16|float16), optional head_dim, theta, eps,
# rope (dict of rope_parameters beyond type default), sliding_window, shard (max_shard_size),
# max_pos, seed, bos, eos, gemma3's local_theta, qpas (query_pre_attn_scalar) and pattern (its
# sliding window pattern, 6 unless given), data_at (the safetensors data made to start that many bytes past a
# 64-byte boundary of the file, the header padded with spaces as safetensors pads it to 8).
SPECS = {
    "llama_tied": dict(arch="llama", hidden=64, heads=4, kv=2, inter=128, vocab=512, layers=2,
                       tie=True, style="v5", theta=10000.0, eps=1e-5, seed=1),
    "llama_odd": dict(arch="llama", hidden=80, heads=5, kv=1, inter=200, vocab=1003, layers=3,
                      tie=False, style="legacy", theta=10000.0, eps=1e-6, seed=2),
    "llama3": dict(arch="llama", hidden=64, heads=4, kv=4, inter=160, vocab=600, layers=2,
                   tie=False, style="legacy", theta=500000.0, eps=1e-5, seed=3,
                   rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=64)),
    "mistral": dict(arch="mistral", hidden=64, heads=8, kv=2, inter=96, vocab=700, layers=2,
                    tie=False, style="v5", theta=1000000.0, eps=1e-5, seed=4,
                    sliding_window=4096),
    "mistral_sw8": dict(arch="mistral", hidden=64, heads=4, kv=2, inter=96, vocab=700, layers=3,
                        tie=False, style="legacy", theta=10000.0, eps=1e-5, seed=5,
                        sliding_window=8),
    "qwen2": dict(arch="qwen2", hidden=96, heads=6, kv=2, inter=160, vocab=800, layers=2,
                  tie=True, style="legacy", theta=1000000.0, eps=1e-6, seed=6),
    "qwen3": dict(arch="qwen3", hidden=64, heads=4, kv=2, inter=128, vocab=900, layers=2,
                  tie=False, style="v5", theta=1000000.0, eps=1e-6, seed=7, head_dim=24),
    "llama_sharded": dict(arch="llama", hidden=64, heads=4, kv=1, inter=192, vocab=1003,
                          layers=3, tie=False, style="v5", theta=10000.0, eps=1e-5, seed=8,
                          shard="150KB"),
    "llama_bf16": dict(arch="llama", hidden=64, heads=4, kv=2, inter=128, vocab=512, layers=2,
                       tie=False, style="legacy", theta=10000.0, eps=1e-5, seed=9,
                       dtype="bfloat16"),
    "qwen2_f16": dict(arch="qwen2", hidden=64, heads=4, kv=2, inter=128, vocab=512, layers=2,
                      tie=False, style="v5", theta=10000.0, eps=1e-6, seed=10, dtype="float16"),
    # wide enough that generation's row chunks are several 16-row blocks a thread (d_ff: 48)
    "llama_wide": dict(arch="llama", hidden=256, heads=4, kv=2, inter=768, vocab=512, layers=2,
                       tie=False, style="v5", theta=10000.0, eps=1e-5, seed=11),
    # bf16 rows of 2048 columns lying 32 bytes past a cache line, as safetensors leaves the bench
    # checkpoints: preserve on AMX reads down_proj through its head chunk (amx_bf16.c, chunks_of)
    "llama_bf16_wide_ff": dict(arch="llama", hidden=64, heads=4, kv=2, inter=2048, vocab=512,
                               layers=2, tie=False, style="v5", theta=10000.0, eps=1e-5, seed=12,
                               dtype="bfloat16", data_at=32),
    # Gemma 3's text decoder: seven layers in its default pattern (every sixth global), a 5-position
    # window on the local ones, local and global rotary bases, tied embeddings scaled by
    # sqrt(hidden); query_pre_attn_scalar = head_dim, as llama.cpp assumes for GGUF files
    "gemma3": dict(arch="gemma3", hidden=64, heads=4, kv=2, inter=96, vocab=640, layers=7,
                   tie=True, style="v5", theta=1000000.0, local_theta=10000.0, eps=1e-6,
                   seed=13, head_dim=32, sliding_window=5, qpas=32),
    # the hub's older config.json (rope_theta, rope_local_base_freq, sliding_window_pattern, no
    # layer_types), a pattern of 2, a softmax scale from query_pre_attn_scalar != head_dim, one
    # kv head (the 270M model's) and an untied head
    "gemma3_legacy": dict(arch="gemma3", hidden=48, heads=2, kv=1, inter=80, vocab=560, layers=4,
                          tie=False, style="legacy", theta=1000000.0, local_theta=20000.0,
                          eps=1e-6, seed=14, head_dim=48, sliding_window=6, qpas=20, pattern=2),
}

# Architectures with a GGUF export (all of them: "mistral" is written as llama.cpp's "llama").
ARCH_CLASS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}


def cache_root():
    root = Path(os.environ.get("KWK_TEST_CACHE") or "/tmp/kwker-test-models")
    root.mkdir(parents=True, exist_ok=True)
    return root


def spec_key(name, spec=None):
    spec = SPECS[name] if spec is None else spec
    blob = json.dumps({"v": BUILDER_VERSION, "name": name, "spec": spec}, sort_keys=True)
    return "%s-%s" % (name, hashlib.sha256(blob.encode()).hexdigest()[:12])


def special_ids(spec):
    """(bos, eos): fixed small ids derived from the seed, distinct, below every vocab size."""
    bos = spec.get("bos", 1)
    eos = spec.get("eos", 2)
    return bos, eos


def prompt_ids(name, n=None, seed=0):
    """A deterministic random prompt of 12-24 ids for a model (bos first), as a list of int."""
    import numpy as np
    spec = SPECS[name]
    rng = np.random.default_rng(1000 * spec["seed"] + seed)
    if n is None:
        n = int(rng.integers(12, 25))
    bos, eos = special_ids(spec)
    ids = [bos]
    while len(ids) < n:
        t = int(rng.integers(3, spec["vocab"]))
        if t != eos:
            ids.append(t)
    return ids


def _make_config(spec):
    import transformers
    cfg_cls = getattr(transformers, ARCH_CLASS[spec["arch"]][0])
    bos, eos = special_ids(spec)
    rope = {"rope_type": "default", "rope_theta": spec["theta"]}
    rope.update(spec.get("rope") or {})
    kw = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
              intermediate_size=spec["inter"], num_hidden_layers=spec["layers"],
              num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"],
              rms_norm_eps=spec["eps"], max_position_embeddings=spec.get("max_pos", 256),
              tie_word_embeddings=spec["tie"], bos_token_id=bos, eos_token_id=eos,
              pad_token_id=None, rope_parameters=rope)
    if spec.get("head_dim"):
        kw["head_dim"] = spec["head_dim"]
    if spec["arch"] == "mistral":
        kw["sliding_window"] = spec.get("sliding_window")
    if spec["arch"] == "qwen2":
        kw["use_sliding_window"] = False
    if spec["arch"] == "gemma3":
        pattern = spec.get("pattern", 6)
        kw["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": spec["theta"]},
            "sliding_attention": {"rope_type": "default", "rope_theta": spec["local_theta"]}}
        kw.update(sliding_window=spec["sliding_window"], query_pre_attn_scalar=spec["qpas"],
                  layer_types=["full_attention" if (i + 1) % pattern == 0 else
                               "sliding_attention" for i in range(spec["layers"])])
    return cfg_cls(**kw)


def _randomize(model, spec):
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                if "embed_tokens" in name:
                    # Tied models read logits off the embeddings: large ones make the residual
                    # stream point back at its own token and greedy repeats one id forever.
                    p.normal_(0.0, 0.1 if spec["tie"] else 1.0)
                else:
                    p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:  # biases
                p.copy_(0.2 * torch.randn_like(p))


def _legacy_config(cfg, spec):
    """Rewrite a transformers-5 config.json in the style of hub checkpoints."""
    rope = cfg.pop("rope_parameters", None) or {}
    if spec["arch"] == "gemma3":  # transformers 4.50's Gemma 3 keys
        cfg["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        rope = dict(rope["full_attention"])
        cfg["sliding_window_pattern"] = spec.get("pattern", 6)
        cfg.pop("layer_types", None)
        cfg.pop("_sliding_window_pattern", None)
    cfg["rope_theta"] = rope.pop("rope_theta", spec["theta"])
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = rope
    else:
        cfg["rope_scaling"] = None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    if not spec.get("head_dim"):
        cfg.pop("head_dim", None)
    cfg["transformers_version"] = "4.44.0"
    return cfg


def place_data(path, at):
    """Rewrite a safetensors file so that its data starts `at` (a multiple of 8) bytes past a
    64-byte boundary: the JSON header is padded with spaces (the format allows it; safetensors
    pads to 8 bytes), so every tensor keeps its bytes and moves by the same amount."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].rstrip(b" ")
    header += b" " * ((at - 8 - len(header)) % 64)
    path.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n:])


def build(name, root=None):
    """Path of the folder for SPECS[name], building it when missing."""
    spec = SPECS[name]
    root = cache_root() if root is None else Path(root)
    out = root / spec_key(name)
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    torch.manual_seed(spec["seed"])
    cfg = _make_config(spec)
    model_cls = getattr(transformers, ARCH_CLASS[spec["arch"]][1])
    model = model_cls(cfg).to(torch.float32).eval()
    _randomize(model, spec)
    if spec["tie"]:
        model.tie_weights()
    dtype = getattr(torch, spec.get("dtype", "float32"))
    model = model.to(dtype)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + name, dir=root))
    try:
        kw = {"safe_serialization": True}
        if spec.get("shard"):
            kw["max_shard_size"] = spec["shard"]
        model.save_pretrained(str(tmp), **kw)
        if spec.get("data_at") is not None:
            for f in tmp.glob("*.safetensors"):
                place_data(f, spec["data_at"])
        gen = transformers.GenerationConfig(bos_token_id=cfg.bos_token_id,
                                            eos_token_id=cfg.eos_token_id, do_sample=False)
        gen.save_pretrained(str(tmp))
        cpath = tmp / "config.json"
        cfg_json = json.loads(cpath.read_text())
        if spec["style"] == "legacy":
            cfg_json = _legacy_config(cfg_json, spec)
        cpath.write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
        (tmp / "kwk_spec.json").write_text(json.dumps({"name": name, "spec": spec}, indent=2))
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def torch_single_thread():
    """Tiny models run ~20x faster on one torch thread than on two when the cores are busy
    (intra-op threads spin-wait on each other); the numbers are float32 either way."""
    import torch
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def load_hf(path):
    """The transformers model of a folder, in float32 (bf16/f16 weights widened), eval mode."""
    import torch
    from transformers import AutoModelForCausalLM
    torch_single_thread()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def hf_logits(model, ids):
    """float32 logits [n, vocab] of transformers' forward on one fresh sequence."""
    import torch
    with torch.no_grad():
        out = model(torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
    return out.logits[0].float().numpy()


def hf_generate(model, ids, max_new_tokens=16):
    """transformers' greedy continuation (do_sample=False) that never stops early.

    eos is disabled by passing a GenerationConfig without eos_token_id (and a pad id, so
    transformers does not warn): exactly max_new_tokens new tokens come back. The tests check that
    the model's own eos id is not among them, so the decoder (which stops at eos) must produce the
    same list.
    """
    import torch
    from transformers import GenerationConfig
    gc = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0,
                          eos_token_id=None, pad_token_id=0, bos_token_id=None)
    with torch.no_grad():
        out = model.generate(torch.tensor([list(ids)], dtype=torch.long), generation_config=gc,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return [int(t) for t in out[0].tolist()]


class OracleCase:
    """One model's reference: prompt, transformers' logits on it, its greedy continuation and
    the logits of the whole greedy sequence."""

    def __init__(self, name, path, prompt, prompt_logits, gen, full_logits, margin):
        self.name = name
        self.path = path
        self.prompt = prompt
        self.prompt_logits = prompt_logits
        self.gen = gen                # prompt + 16 new tokens
        self.full_logits = full_logits
        self.margin = margin          # smallest (top1 - top2) / range over the greedy steps

    @property
    def new_tokens(self):
        return self.gen[len(self.prompt):]

    def case(self, key=None, model=None, max_cache_len=64, **extra):
        c = {"key": key or self.name, "model": str(model or self.path), "prompt": self.prompt,
             "gen_ref": self.new_tokens, "max_cache_len": max_cache_len}
        c.update(extra)
        return c


def greedy_margin(full_logits, n_prompt):
    """Smallest gap between the best and second-best logit over the greedy steps, relative to the
    logit range: how far a decoder's error may go before it could flip a greedy token."""
    import numpy as np
    steps = full_logits[n_prompt - 1:-1]
    top2 = np.sort(steps, axis=-1)[:, -2:]
    span = float(full_logits.max() - full_logits.min())
    return float((top2[:, 1] - top2[:, 0]).min()) / span


def oracle_case(name, max_new_tokens=16, model=None, path=None, n_prompt=None):
    """Reference of a tiny model: the first prompt seed whose greedy run never emits eos, has
    every greedy step decided by a margin >= 100x the tolerance (so a correct decoder cannot
    flip a token by rounding) and at least 4 distinct new tokens (else the best margin)."""
    path = build(name) if path is None else path
    model = load_hf(path) if model is None else model
    _, eos = special_ids(SPECS[name])
    best = None
    for seed in range(40):
        # The search uses a plain argmax loop over full forwards (cheap); the chosen case is
        # then checked against model.generate below.
        prompt = prompt_ids(name, n=n_prompt, seed=seed)
        gen = _argmax_loop(model, prompt, max_new_tokens)
        new = gen[len(prompt):]
        if eos in new:
            continue
        full = hf_logits(model, gen)
        margin = greedy_margin(full, len(prompt))
        c = OracleCase(name, path, prompt, None, gen, full, margin)
        if best is None or (c.margin, len(set(new)) >= 4) > (best.margin, True):
            best = c
        if margin >= 1e-3 and len(set(new)) >= 4:
            best = c
            break
    if best is None:
        raise RuntimeError("no prompt of %s avoids eos in greedy generation" % name)
    gen = hf_generate(model, best.prompt, max_new_tokens)
    if gen != best.gen:
        raise RuntimeError("%s: transformers' generate %s disagrees with its own forward %s" % (
            name, gen, best.gen))
    best.prompt_logits = hf_logits(model, best.prompt)
    return best


def _argmax_loop(model, prompt, max_new_tokens):
    import torch
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids], dtype=torch.long), use_cache=False).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids


def _resume(dec, c):
    """generate(prompt) then generate(prompt + first half of the reference continuation): the
    second call reuses the cached prefix and must continue exactly like one long run."""
    import numpy as np
    half = len(c["gen_ref"]) // 2
    dec.generate(list(c["prompt"]), max_new_tokens=len(c["gen_ref"]))
    return np.asarray(dec.generate(list(c["prompt"]) + c["gen_ref"][:half],
                                   max_new_tokens=len(c["gen_ref"]) - half))


def kwk_worker(job_path, out_path):
    """Child-process side of conftest.KwkRunner: run each case through kwker and save arrays.

    Stages per case (each recorded separately, so one failure does not hide the others):
      fwd_prompt  KwkDecoder.forward(prompt)                        [n, V]
      generate    KwkDecoder.generate(prompt, max_new_tokens)        prompt + new tokens
      fwd_full    KwkDecoder.forward(prompt + reference new tokens)  [N, V]
      gen_plain   generate(..., lookup=0, prompt_cache=False): no speculation, no reuse
      gen_greedy_c  generate_greedy(...): the C API's plain greedy loop
      gen_resume  generate(prompt), then generate(prompt + half the reference continuation)
                  for the other half: prompt-prefix reuse
      steps       C API: eval(prompt, LOGITS_ALL) then eval(1 token, LOGITS_LAST) for each
                  reference token: the one-token decode path        [N - n + 1, V]
      chunked     C API: eval the reference sequence in chunks of 5, 7 and the rest (batched
                  steps at non-zero positions), LOGITS_ALL          [N, V]
    """
    import ctypes
    import traceback
    import numpy as np

    job = json.loads(Path(job_path).read_text())
    arrays, errors = {}, {}
    meta = {"errors": errors, "isa": None, "setup_error": None}

    def save():
        arrays["__meta__"] = np.array(json.dumps(meta))
        np.savez(out_path, **arrays)

    try:
        import kwker
        from kwker import _lib
        raw = ctypes.CDLL(_lib.lib()._name)  # own function objects: no clash with decode.py
        raw.kwk_isa.restype = ctypes.c_int
        raw.kwk_isa_name.restype = ctypes.c_char_p
        raw.kwk_isa_name.argtypes = [ctypes.c_int]
        meta["isa"] = raw.kwk_isa_name(raw.kwk_isa()).decode()
    except BaseException:
        meta["setup_error"] = traceback.format_exc()[-6000:]
        save()
        return

    # the binding's mirror of struct kwk_decoder_params: one place to follow the header
    from kwker.decode import _DecoderParams as Params

    # and of struct kwk_model_info (a copy here went stale when the header grew: the library
    # wrote past it)
    from kwker.decode import _ModelInfo as Info

    vp = ctypes.c_void_p
    raw.kwk_model_load.restype = vp
    raw.kwk_model_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(_lib.KwkErr)]
    raw.kwk_model_free.argtypes = [vp]
    raw.kwk_model_get_info.argtypes = [vp, ctypes.POINTER(Info)]
    raw.kwk_decoder_params_init.argtypes = [ctypes.POINTER(Params)]
    raw.kwk_decoder_new.restype = vp
    raw.kwk_decoder_new.argtypes = [vp, ctypes.POINTER(Params), ctypes.POINTER(_lib.KwkErr)]
    raw.kwk_decoder_free.argtypes = [vp]
    raw.kwk_decoder_truncate.argtypes = [vp, ctypes.c_int]
    raw.kwk_decoder_eval.restype = ctypes.c_int
    raw.kwk_decoder_eval.argtypes = [vp, ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_float), ctypes.c_int]

    def c_eval(dec, ids, n_vocab, mode):
        ids_a = (ctypes.c_int32 * len(ids))(*ids)
        rows = len(ids) if mode == 2 else 1
        out = np.zeros((rows, n_vocab), dtype=np.float32)
        rc = raw.kwk_decoder_eval(dec, ids_a, len(ids),
                                  out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), mode)
        if rc != 0:
            raise RuntimeError("kwk_decoder_eval(%d ids, mode %d) returned %d (%s)" % (
                len(ids), mode, rc, _lib.lib().kwk_status_str(rc).decode()))
        return out

    def c_stages(c, key, errs):
        err = _lib.KwkErr()
        m = raw.kwk_model_load(c["model"].encode(), ctypes.byref(err))
        if not m:
            raise RuntimeError("kwk_model_load: " + err.text())
        dec = None
        try:
            info = Info()
            raw.kwk_model_get_info(m, ctypes.byref(info))
            p = Params()
            raw.kwk_decoder_params_init(ctypes.byref(p))
            p.max_cache_len = c["max_cache_len"]
            p.n_threads = c.get("n_threads") or 0
            dec = raw.kwk_decoder_new(m, ctypes.byref(p), ctypes.byref(err))
            if not dec:
                raise RuntimeError("kwk_decoder_new: " + err.text())
            V = info.n_vocab
            prompt, new = c["prompt"], c["gen_ref"]
            try:
                rows = [c_eval(dec, prompt, V, 2)[-1]]
                for t in new[:-1]:
                    rows.append(c_eval(dec, [t], V, 1)[0])
                arrays[key + "|steps"] = np.stack(rows)
            except Exception:
                errs["steps"] = traceback.format_exc()[-3000:]
            try:
                if "chunked" in c.get("skip", ()):
                    return
                raw.kwk_decoder_truncate(dec, 0)
                seq = prompt + new
                parts = [seq[:5], seq[5:12], seq[12:]]
                arrays[key + "|chunked"] = np.concatenate(
                    [c_eval(dec, part, V, 2) for part in parts if part])
            except Exception:
                errs["chunked"] = traceback.format_exc()[-3000:]
        finally:
            if dec:
                raw.kwk_decoder_free(dec)
            raw.kwk_model_free(m)

    for c in job["cases"]:
        key = c["key"]
        errors[key] = errs = {}
        try:
            dec = kwker.KwkDecoder(c["model"], max_cache_len=c["max_cache_len"],
                                   n_threads=c.get("n_threads"))
        except Exception:
            errs["load"] = traceback.format_exc()[-3000:]
            dec = None
        if dec is not None:
            for stage, fn in (
                    ("fwd_prompt", lambda: np.asarray(dec.forward(c["prompt"]))),
                    ("generate", lambda: np.asarray(
                        dec.generate(list(c["prompt"]), max_new_tokens=len(c["gen_ref"])))),
                    ("fwd_full", lambda: np.asarray(dec.forward(c["prompt"] + c["gen_ref"]))),
                    ("gen_plain", lambda: np.asarray(dec.generate(
                        list(c["prompt"]), max_new_tokens=len(c["gen_ref"]), lookup=0,
                        prompt_cache=False))),
                    ("gen_greedy_c", lambda: np.asarray(dec.generate_greedy(
                        list(c["prompt"]), max_new_tokens=len(c["gen_ref"])))),
                    ("gen_resume", lambda: _resume(dec, c))):
                if stage.startswith("gen_") and "variants" in c.get("skip", ()):
                    continue
                if stage.startswith("fwd_") and "forward" in c.get("skip", ()):
                    continue
                print("case %s: %s" % (key, stage), flush=True)  # locates a crash
                try:
                    arrays[key + "|" + stage] = fn()
                except Exception:
                    errs[stage] = traceback.format_exc()[-3000:]
            del dec
        if c.get("c_api", True):
            print("case %s: C API steps / chunks" % key, flush=True)
            try:
                c_stages(c, key, errs)
            except Exception:
                errs["c_api"] = traceback.format_exc()[-3000:]
    save()


if __name__ == "__main__":
    import sys
    names = sys.argv[1:] or list(SPECS)
    for n in names:
        print(n, build(n))
