#!/usr/bin/env python3
"""side_by_side.py - Kwker beside llama.cpp on the same weights, threads and machine (issue 6).

  python3 bench/side_by_side.py [--models smollm2-135m,smollm2-360m,smollm2-1.7b,qwen2.5-0.5b,
      smollm2-135m-instruct] [--precisions preserve,balanced,int4] [--runs 5] [-p 512] [-n 128]
      [-t 2] [--isa native|avx2|avxvnni] [--models-dir .cache/bench-models] [--json FILE] [--resume]
      [--report] [--quick] [--probe-pattern best|stream|streams4] [--peak-probe PATH|none]

For each model and each precision pair (Kwker preserve vs llama.cpp BF16, balanced vs Q8_0,
int4 vs Q4_0 and vs Q4_K_M) it runs `kwker bench --json` and llama.cpp (llama-cpp-python's
low-level API: the prompt in llama_decode calls of 512 tokens, then n single-token decodes),
each run a fresh process, alternately A B A B, --runs times each, with a read-bandwidth probe
(bench/bw_probe.c) right before and after every run, and on CPUs with AMX a probe of the tile
unit (bench/peak_probe.c) beside it. It prints medians, the ratio Kwker / llama.cpp, the peak
resident memory of each run, and the percentage of the bandwidth ceiling (probe GB/s / bytes
read per generated token: weights and KV cache) as a Markdown table ready for
docs/benchmarks.md. bench/README.md says what each number means and how it is
counted.

Internal: `--llama-worker JSON` is the llama.cpp side of one run (run by the chosen Python, so
that --isa avx2 can use the AVX2-only llama-cpp-python of .cache/venv-llama-avx2, and --isa
avxvnni the AVX2 + AVX-VNNI one of .cache/venv-llama-avxvnni).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# The shapes of the real checkpoints (their config.json); weights are random (seeded).
MODELS = {
    "smollm2-135m": dict(config="LlamaConfig", hidden=576, layers=30, heads=9, kv=3, inter=1536,
                         vocab=49152, theta=100000.0, eps=1e-5, max_pos=8192, bos=1, eos=2,
                         seed=135),
    "smollm2-360m": dict(config="LlamaConfig", hidden=960, layers=32, heads=15, kv=5, inter=2560,
                         vocab=49152, theta=100000.0, eps=1e-5, max_pos=8192, bos=1, eos=2,
                         seed=360),
    "smollm2-1.7b": dict(config="LlamaConfig", hidden=2048, layers=24, heads=32, kv=32,
                         inter=8192, vocab=49152, theta=130000.0, eps=1e-5, max_pos=8192, bos=1,
                         eos=2, seed=1700),
    "qwen2.5-0.5b": dict(config="Qwen2Config", hidden=896, layers=24, heads=14, kv=2,
                         inter=4864, vocab=151936, theta=1000000.0, eps=1e-6, max_pos=32768,
                         bos=151643, eos=151643, seed=500),
    # the real model: the bundled Q4_1 GGUF dequantized to F32 (bench/make_gguf.py)
    "smollm2-135m-instruct": dict(real=REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # Gemma 3 270M: its Q4_K_M GGUF (scripts/setup --test) dequantized to F32 the same way
    "gemma3-270m": dict(real=REPO / "models" / "gemma-3-270m-q4_k_m.gguf"),
}
DEFAULT_MODELS = ["smollm2-135m", "smollm2-360m", "smollm2-1.7b", "qwen2.5-0.5b",
                  "smollm2-135m-instruct"]
# (Kwker precision, llama.cpp format): matched bits.
PAIRS = [("preserve", "bf16"), ("balanced", "q8_0"), ("int4", "q4_0"), ("int4", "q4_k_m")]
LLAMA_FORMATS = ["bf16", "q8_0", "q4_0", "q4_k_m"]
BUILDER_VERSION = 1  # bump when the checkpoint or GGUF writer changes: forces a rebuild
AVX2_VENV = REPO / ".cache" / "venv-llama-avx2"
AVXVNNI_VENV = REPO / ".cache" / "venv-llama-avxvnni"
# Kwker's log line saying which dot products its AVX2 quantized kernels use (base/cpu.c)
AVX2_DOT_RE = re.compile(r"avx2 dot products: ([\w-]+)")
# and whether its AVX-512 prompt products ran on AMX ("amx") or vector instructions ("vector")
PROMPT_TILES_RE = re.compile(r"prompt tiles: ([\w-]+)")
PRESERVE_RE = re.compile(r"preserve products: ([\w-]+)")  # KWKER_AMX_PRESERVE's choice


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Models: random checkpoints (safetensors bf16) and their GGUF files
# --------------------------------------------------------------------------------------------

def hf_config(spec):
    import transformers
    kw = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden"],
              intermediate_size=spec["inter"], num_hidden_layers=spec["layers"],
              num_attention_heads=spec["heads"], num_key_value_heads=spec["kv"],
              rms_norm_eps=spec["eps"], max_position_embeddings=spec["max_pos"],
              tie_word_embeddings=True, bos_token_id=spec["bos"], eos_token_id=spec["eos"],
              pad_token_id=None, hidden_act="silu",
              rope_parameters={"rope_type": "default", "rope_theta": spec["theta"]})
    if spec["config"] == "Qwen2Config":
        kw["use_sliding_window"] = False
    cfg = getattr(transformers, spec["config"])(**kw)
    cfg.architectures = [spec["config"].replace("Config", "ForCausalLM")]
    cfg.dtype = "bfloat16"
    return cfg


def write_checkpoint(spec, folder):
    """config.json + model.safetensors (bf16) with seeded random weights: matrices and the
    (tied) embeddings N(0, 0.02), RMSNorm weights 1 + N(0, 0.1), q/k/v biases N(0, 0.02).
    Names and shapes come from transformers' own model built on the meta device."""
    import torch
    import transformers
    from safetensors.torch import save_file
    cfg = hf_config(spec)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes.pop("lm_head.weight", None)  # tied: transformers does not save it
    gen = torch.Generator().manual_seed(spec["seed"])
    tensors = {}
    for name in sorted(shapes):
        shape = shapes[name]
        t = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * t
        else:
            t = 0.02 * t
        tensors[name] = t.to(torch.bfloat16)
        del t

    def write(tmp):
        cfg.save_pretrained(str(tmp))
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tensors.clear()
    replace_folder(folder, write)


def replace_folder(folder, write):
    """write(tmp) fills a temporary folder beside `folder`, which then takes its place (an old
    one removed first): a folder half written is never taken for a whole one."""
    import shutil
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=str(folder.parent)))
    try:
        write(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_bf16_gguf(folder, out_path):
    """The checkpoint as a BF16 GGUF, as llama.cpp's convert_hf_to_gguf.py --outtype bf16 writes
    it (tests/python/gguf_export.py documents the mapping; this is its streaming form: one
    tensor in memory at a time, bf16 bits copied unchanged, q/k rows permuted for "llama")."""
    import gguf
    import numpy as np
    import torch
    from safetensors import safe_open
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import gguf_export as gx
    cfg = gx.read_config(folder)
    arch = gx.GGUF_ARCH[cfg["architectures"][0]]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    rope = gx.rope_params(cfg)
    st_path = str(Path(folder) / "model.safetensors")

    def load(st, name):
        t = st.get_tensor(name)
        if t.dim() <= 1 or name.endswith("norm.weight"):
            return t.to(torch.float32).numpy(), gguf.GGMLQuantizationType.F32
        a = t.view(torch.int16).numpy().view(np.uint16)
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = gx.permute_qk(a, n_head)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            a = gx.permute_qk(a, n_kv)
        return np.ascontiguousarray(a), gguf.GGMLQuantizationType.BF16

    tmp = Path(str(out_path) + ".part")
    w = gguf.GGUFWriter(str(tmp), arch)
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
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    if arch == "llama":
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(gx.head_dim(cfg))
    bos, eos = cfg["bos_token_id"], cfg["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    # A SentencePiece-style filler vocabulary of vocab_size pieces: llama.cpp needs one to load,
    # the benchmark feeds token ids and never tokenizes.
    toks, scores, types = gx._vocab(cfg["vocab_size"], bos, eos)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    with safe_open(st_path, framework="pt") as st:
        names = [n for n in st.keys() if not n.endswith("rotary_emb.inv_freq")]
        for name in names:  # tensor infos first: shapes and types without the data
            sl = st.get_slice(name)
            shape = tuple(sl.get_shape())
            one_d = len(shape) <= 1 or name.endswith("norm.weight")
            n = 1
            for s in shape:
                n *= s
            w.add_tensor_info(gx.gguf_name(name), shape,
                              np.dtype(np.float32) if one_d else np.dtype(np.uint16),
                              n * (4 if one_d else 2),
                              raw_dtype=None if one_d else gguf.GGMLQuantizationType.BF16)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name in names:
            data, _ = load(st, name)
            w.write_tensor_data(data)
            del data
    w.close()
    os.replace(tmp, out_path)


def fresh_checkpoint(out, want, write):
    """out/hf, the random checkpoint write(folder) makes, written again (and the GGUFs made from
    it removed) when out/builder.json does not record `want` or the weights are missing."""
    folder = out / "hf"
    stamp = out / "builder.json"
    have = json.loads(stamp.read_text()) if stamp.exists() else None
    if have != want or not (folder / "model.safetensors").is_file():
        t0 = time.time()
        write(folder)
        for p in out.glob("*.gguf"):
            p.unlink()
        stamp.write_text(json.dumps(want))
        log("wrote %s (%.1f s)" % (folder, time.time() - t0))
    return folder

def model_files(name, models_dir, formats, threads=2):
    """{"kwker": {precision: path}, "llama": {format: path}} for one model, built when missing
    (or older than their source). Random models: Kwker loads the safetensors folder, llama.cpp
    its BF16 GGUF and llama.cpp's quantizations of it. The real model: the F32 "original"
    (make_gguf.py); Kwker preserve loads its BF16 GGUF (the bits llama.cpp's BF16 row reads),
    balanced / int4 pack from the F32 original, llama.cpp's quantizations are of the F32 one."""
    sys.path.insert(0, str(HERE))
    import llamacpp
    spec = MODELS[name]
    out = Path(models_dir) / name
    out.mkdir(parents=True, exist_ok=True)
    if "real" in spec:
        import make_gguf
        types = sorted(set(formats) | {"bf16"}, key=LLAMA_FORMATS.index)
        paths = make_gguf.make_all(spec["real"], out, types, threads, log=log)
        return {"kwker": {"preserve": paths["bf16"], "balanced": paths["f32"],
                          "int4": paths["f32"]},
                "llama": {f: paths[f] for f in formats}}
    folder = fresh_checkpoint(out, {"version": BUILDER_VERSION, "spec": dict(spec)},
                              lambda f: write_checkpoint(spec, f))
    bf16 = out / ("%s.bf16.gguf" % name)
    if not bf16.exists():
        t0 = time.time()
        write_bf16_gguf(folder, bf16)
        log("wrote %s (%.1f s)" % (bf16, time.time() - t0))
    llama = {}
    for f in formats:
        p = out / ("%s.%s.gguf" % (name, f))
        if f != "bf16" and not p.exists():
            t0 = time.time()
            llamacpp.quantize(bf16, p, f, threads)
            log("wrote %s (%.1f s)" % (p, time.time() - t0))
        llama[f] = p
    return {"kwker": {p: folder for p in ("preserve", "balanced", "int4")}, "llama": llama}


# --------------------------------------------------------------------------------------------
# Bytes read per generated token
# --------------------------------------------------------------------------------------------

def llama_bytes_per_token(path):
    """Every tensor of the GGUF file at its stored size, except token_embd when a separate
    output matrix exists (then one row of it is read per token: counted as 0). Tied models
    read token_embd whole as the output matrix. The KV cache: kv_bytes_per_token."""
    import gguf
    r = gguf.GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes:
        total -= sizes.get("token_embd.weight", 0)
    return total


# bytes of a KV cache element by ggml type (llama.cpp's type_k / type_v): f32, f16, bf16, q8_0
GGML_TYPE_BYTES = {0: 4.0, 1: 2.0, 30: 2.0, 8: 34.0 / 32.0}


def kv_bytes_per_token(gguf_path, n_prompt, n_gen, k_bytes, v_bytes):
    """The K and V cache bytes attention reads for one generated token, averaged over the
    n_gen tokens after an n_prompt prompt (token i attends n_prompt + i + 1 positions): layers x
    kv heads x head_dim x positions x element bytes, from the GGUF's shape (the same model on
    both sides)."""
    import gguf
    r = gguf.GGUFReader(str(gguf_path))

    def val(key):
        f = r.fields.get(key)
        return None if f is None else int(f.parts[f.data[0]][0])

    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    layers = val(arch + ".block_count")
    heads = val(arch + ".attention.head_count")
    kv_heads = val(arch + ".attention.head_count_kv") or heads
    head_dim = val(arch + ".attention.key_length") or val(arch + ".embedding_length") // heads
    positions = n_prompt + (n_gen + 1) / 2.0
    return layers * kv_heads * head_dim * positions * (k_bytes + v_bytes)


def kwker_preserve_bytes(path):
    """Kwker preserve reads float32 / bf16 / f16 matrices in their own type (in place, or a
    llama-arch GGUF's attn_q / attn_k as a copy with rows un-permuted; float32 before session
    19), quantized GGUF tensors dequantized to float32; norms and biases are float32 copies. The
    tied embedding is read whole as lm_head; an untied one contributes one row (0 here)."""
    path = Path(path)
    if path.is_dir():
        from safetensors import safe_open
        size = {"F32": 4, "F16": 2, "BF16": 2}
        shapes = {}
        for f in sorted(path.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as st:
                for n in st.keys():
                    sl = st.get_slice(n)
                    shapes[n] = (tuple(sl.get_shape()), size.get(sl.get_dtype(), 4))
        total = 0
        for n, (shape, es) in shapes.items():
            k = 1
            for s in shape:
                k *= s
            total += k * (es if len(shape) == 2 else 4)
        if "lm_head.weight" in shapes:
            total -= _numel(shapes["model.embed_tokens.weight"][0]) * \
                shapes["model.embed_tokens.weight"][1]
        return total
    import gguf
    r = gguf.GGUFReader(str(path))
    plain = {"F32": 4, "F16": 2, "BF16": 2}
    total, emb, has_out = 0, 0, False
    for t in r.tensors:
        n = int(t.n_elements)
        ty = t.tensor_type.name
        es = plain.get(ty, 4) if len(t.shape) > 1 else 4
        total += n * es
        if t.name == "token_embd.weight":
            emb = n * es
        has_out |= t.name == "output.weight"
    return total - (emb if has_out else 0)


def _numel(shape):
    k = 1
    for s in shape:
        k *= s
    return k


def one_d_bytes(path):
    """float32 bytes of the norms and biases (what a packed precision reads besides its pack)."""
    path = Path(path)
    total = 0
    if path.is_dir():
        from safetensors import safe_open
        for f in sorted(path.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as st:
                for n in st.keys():
                    shape = st.get_slice(n).get_shape()
                    if len(shape) == 1:
                        total += 4 * _numel(shape)
        return total
    import gguf
    for t in gguf.GGUFReader(str(path)).tensors:
        if len(t.shape) <= 1:
            total += 4 * int(t.n_elements)
    return total


# libkwker's INFO line after packing ("packed int4: ...") or mapping a cached pack ("mapped
# packed int4: ..."): the bytes of every packed layer matrix and lm_head.
PACKED_RE = re.compile(r"(mapped )?packed (\w+): (\d+) weights in ([0-9.]+) MB")


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------

def run_child(cmd, env=None, timeout=3600):
    """Run cmd to completion in a fresh process; (returncode, stdout, stderr). Its memory is
    the VmHWM it reports itself: wait4's ru_maxrss would not do, as Linux carries the parent's
    resident size at fork into the child's ru_maxrss across exec (and this script holds torch
    and GGUF readers)."""
    p = subprocess.run(cmd, capture_output=True, env=env, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def stream_args(threads, mib):
    """bw_probe's options for 4 long streams a thread (each a quarter of the thread's slice, a
    multiple of 64 bytes), the pattern Kwker's AVX2 decode reads."""
    slice_ = ((mib << 20) // (threads * 256)) * 256
    return ["--streams", "4", "--stream-bytes", str(max(64, slice_ // 4 // 64 * 64))]


def probe(bw_bin, threads, isa, mib, pattern="best"):
    """GB/s of the probe: one sequential stream a thread ("stream"), 4 long streams a thread
    ("streams4"), or the faster of the two ("best", the default: the stricter ceiling)."""
    figures = []
    for pat in (("stream", "streams4") if pattern == "best" else (pattern,)):
        cmd = [str(bw_bin), "-t", str(threads), "-m", str(mib), "--json"]
        if isa in ("avx2", "avxvnni"):
            cmd += ["--isa", "avx2"]
        if pat == "streams4":
            cmd += stream_args(threads, mib)
        rc, out, err = run_child(cmd, timeout=120)
        if rc != 0:
            raise RuntimeError("bw_probe failed (%d): %s" % (rc, err.strip()))
        figures.append(json.loads(out)["gbps"])
    return max(figures)


def run_kwker(a, model, precision):
    env = dict(os.environ, KWKER_LOG="info")
    if a.isa in ("avx2", "avxvnni"):
        env["KWKER_ISA"] = "avx2"
        # avx2 stands for a CPU without AVX-VNNI (as the AVX2-only llama.cpp build does)
        env["KWKER_AVXVNNI"] = "off" if a.isa == "avx2" else "on"
    cmd = [str(a.kwker_bin), "bench", "--model", str(model), "--precision", precision,
           "-p", str(a.n_prompt), "-n", str(a.n_gen), "-t", str(a.threads), "-r", str(a.reps),
           "--json"]
    if a.act_bits and precision != "preserve":
        cmd += ["--act-bits", str(a.act_bits)]
    if a.mix_bits and precision == "int4":
        cmd += ["--mix-bits", str(a.mix_bits)]
    rc, out, err = run_child(cmd, env=env)
    if rc != 0:
        raise RuntimeError("kwker bench failed (%d): %s\n%s" % (rc, " ".join(cmd), err[-2000:]))
    res = json.loads(out.strip().splitlines()[-1])
    m = PACKED_RE.search(err)
    if not res.get("peak_rss_kib", -1) > 0:
        raise RuntimeError("kwker bench --json gave no peak_rss_kib: rebuild kwker")
    if a.isa in ("avx2", "avxvnni") and res.get("isa") != "avx2":
        raise RuntimeError("kwker ran with isa %s, not avx2" % res.get("isa"))
    dot = AVX2_DOT_RE.search(err)
    tiles = PROMPT_TILES_RE.search(err)
    pres = PRESERVE_RE.search(err)
    want = {"avx2": "maddubs", "avxvnni": "avx-vnni"}.get(a.isa)
    if want and (not dot or dot.group(1) != want):
        raise RuntimeError("kwker's AVX2 kernels ran %s, not %s (no AVX-VNNI on this CPU?)"
                           % (dot.group(1) if dot else "?", want))
    return {"pp_tps": res["pp_tps"], "tg_tps": res["tg_tps"], "kv_bits": res.get("kv_bits", 32),
            "peak_rss_kib": res["peak_rss_kib"], "isa": res.get("isa"), "load_s": res.get("load_s"),
            "avx2_dot": dot.group(1) if dot else None,
            "prompt_tiles": tiles.group(1) if tiles else None,
            "preserve_products": pres.group(1) if pres else None,
            "matmul": res.get("matmul"),
            "bits_per_weight": res.get("bits_per_weight"),
            "packed_bytes": float(m.group(4)) * 1e6 if m else None,
            "pack": None if not m else "mapped from the pack cache" if m.group(1) else "packed"}


def run_llama(a, gguf_path):
    job = dict(model=str(gguf_path), n_prompt=a.n_prompt, n_gen=a.n_gen, threads=a.threads,
               n_batch=min(512, a.n_prompt), reps=a.reps, flash_attn=a.llama_flash_attn)
    cmd = [str(a.llama_python), str(Path(__file__).resolve()), "--llama-worker", json.dumps(job)]
    rc, out, err = run_child(cmd)
    if rc != 0:
        raise RuntimeError("llama.cpp run failed (%d): %s\n%s" % (rc, gguf_path, err[-2000:]))
    res = json.loads(out.strip().splitlines()[-1])
    if a.isa in ("avx2", "avxvnni") and res.get("avx512"):
        raise RuntimeError("%s's llama.cpp uses AVX-512: --isa %s needs its AVX2 build"
                           % (a.llama_python, a.isa))
    if a.isa in ("avx2", "avxvnni") and res.get("avx_vnni") != (a.isa == "avxvnni"):
        raise RuntimeError("%s's llama.cpp has AVX_VNNI = %d: --isa %s needs it %s"
                           % (a.llama_python, res.get("avx_vnni"), a.isa,
                              "on" if a.isa == "avxvnni" else "off"))
    return res


def vm_kib(field):
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def llama_worker(job):
    """The llama.cpp side of one run, the way llama-bench measures: a fresh context, the prompt
    in llama_decode calls of n_batch tokens (logits of the last one only), then n_gen decodes
    of one token each; one untimed warm-up pass first (as kwker bench), medians of reps."""
    import ctypes
    import llama_cpp as L
    base_kib = vm_kib("VmHWM")  # the interpreter and its imports: not part of llama.cpp's cost
    sink = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(sink, ctypes.c_void_p())
    L.llama_backend_init()
    t0 = time.perf_counter()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(job["model"].encode(), mp)
    if not model:
        raise SystemExit("llama.cpp could not load %s" % job["model"])
    n_p, n_g, nb = job["n_prompt"], job["n_gen"], job["n_batch"]
    load_s = time.perf_counter() - t0
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    ids = [(i * 2654435761) % (1 << 32) % n_vocab for i in range(n_p)]  # kwker bench's prompt
    prompt = (L.llama_token * n_p)(*ids)
    one = (L.llama_token * 1)()
    # flash attention: llama.cpp's default ("auto") turns it on for the CPU, which speeds up its
    # prompts but slows its generation after a long prompt (135M Q8_0 after 512 tokens: 42
    # tokens/s with it, 68 without). "best" measures both in this process, one context after
    # the other, and keeps each column's faster figure: llama.cpp at its best for each.
    modes = {"auto": [-1], "on": [1], "off": [0], "best": [1, 0]}[job.get("flash_attn", "best")]
    per_mode = {}
    settings = {}
    for fa in modes:
        cp = L.llama_context_default_params()
        cp.n_ctx = n_p + n_g
        cp.n_batch = nb
        cp.n_ubatch = nb
        cp.n_threads = job["threads"]
        cp.n_threads_batch = job["threads"]
        cp.flash_attn_type = fa
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            raise SystemExit("llama.cpp could not make a context for %s" % job["model"])
        mem = L.llama_get_memory(ctx)

        def once():
            L.llama_memory_clear(mem, True)
            t0 = time.perf_counter()
            for i in range(0, n_p, nb):
                k = min(nb, n_p - i)
                ptr = ctypes.cast(ctypes.addressof(prompt) + i * ctypes.sizeof(L.llama_token),
                                  ctypes.POINTER(L.llama_token))
                if L.llama_decode(ctx, L.llama_batch_get_one(ptr, k)) != 0:
                    raise SystemExit("llama_decode failed on the prompt")
            L.llama_synchronize(ctx)
            t1 = time.perf_counter()
            tok = ids[-1]
            for _ in range(n_g):
                tok = (tok * 7919 + 17) % n_vocab  # kwker bench's token stream
                one[0] = tok
                if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                    raise SystemExit("llama_decode failed on a generated token")
            L.llama_synchronize(ctx)
            return t1 - t0, time.perf_counter() - t1

        once()
        pp, tg = zip(*[once() for _ in range(job["reps"])])
        per_mode[fa] = (n_p / statistics.median(pp),
                        n_g / statistics.median(tg) if n_g else 0.0)
        settings = {f: getattr(cp, f) for f in ("type_k", "type_v") if hasattr(cp, f)}
        L.llama_free(ctx)
    info = L.llama_print_system_info().decode(errors="replace")
    settings = {k: (v.value if hasattr(v, "value") else v) for k, v in settings.items()}
    names = {-1: "auto", 0: "off", 1: "on"}
    pp_fa = max(per_mode, key=lambda fa: per_mode[fa][0])
    tg_fa = max(per_mode, key=lambda fa: per_mode[fa][1])
    settings.update(flash_attn_pp=names[pp_fa], flash_attn_tg=names[tg_fa],
                    per_flash_attn={names[fa]: v for fa, v in per_mode.items()})
    L.llama_model_free(model)
    print(json.dumps({"pp_tps": per_mode[pp_fa][0], "tg_tps": per_mode[tg_fa][1],
                      "load_s": load_s, "base_rss_kib": base_kib, "context": settings,
                      "peak_rss_kib": vm_kib("VmHWM"),
                      "avx512": "AVX512 = 1" in info, "avx_vnni": "AVX_VNNI = 1" in info,
                      "version": getattr(L, "__version__", "?")}))
    return 0


def kwker_label(a, kp):
    """Kwker's column: the precision, int4's --mix-bits and the activation bits when not the
    defaults."""
    return (kp + (" mix%d" % a.mix_bits if a.mix_bits and kp == "int4" else "")
            + (" act%d" % a.act_bits if a.act_bits and kp != "preserve" else ""))


def pair_key(a, model, kp, lf):
    # settings added later are keyed only when not their old value, so stored pairs stay valid
    extra = [] if a.llama_flash_attn == "auto" else ["fa=" + a.llama_flash_attn]
    extra += ["act%d" % a.act_bits] if a.act_bits and kp != "preserve" else []
    extra += ["mix%d" % a.mix_bits] if a.mix_bits and kp == "int4" else []
    extra += [] if a.probe_mib == "256" else ["probe=" + a.probe_mib]
    extra += [] if a.probe_pattern == "stream" else ["pattern=" + a.probe_pattern]
    return "|".join(str(x) for x in [a.isa, model, kp, lf, a.n_prompt, a.n_gen, a.threads,
                                     a.runs, a.reps] + extra)


KWKER_SIZES = {}  # (file, precision) -> (weight bytes, KV element bytes), from probe_sizes


def mib_for(nbytes):
    """A probe buffer for nbytes read a token: rounded up to 16 MiB, at least 64 MiB."""
    return max(64, int(-(-int(nbytes) // (16 << 20))) * 16)


def probe_sizes(a, kpath, lpath, kp):
    """Each side's probe buffer in MiB: --probe-mib, or (auto) the bytes that side reads a
    generated token, weights and KV cache, so that the buffer sits in the caches as that side's
    weights do. Its size matters here: this VM's L3 holds 260 MiB, so a 256 MiB buffer reads
    33-60 GB/s as the host's other tenants leave more or less of it, a 64-192 MiB one ~55-60
    and a 1 GiB one ~33 (DRAM). Kwker's bytes come from a short run (its pack's size from its
    log; the pack cache makes it quick) or, for preserve, from the file; llama.cpp's from its
    file, with its default f16 KV cache."""
    if a.probe_mib != "auto":
        return {"kwker": int(a.probe_mib), "llama": int(a.probe_mib)}
    if kp == "preserve":
        kweights, kv_bytes = kwker_preserve_bytes(kpath), 4.0
    else:
        key = (str(kpath), kp, a.mix_bits)  # int4 is in two pairs: one short run for both
        if key not in KWKER_SIZES:
            short = argparse.Namespace(**dict(vars(a), n_prompt=8, n_gen=2, reps=1))
            res = run_kwker(short, kpath, kp)
            if not res["packed_bytes"]:
                raise RuntimeError("kwker bench logged no pack size for %s" % kpath)
            KWKER_SIZES[key] = (res["packed_bytes"] + one_d_bytes(kpath), res["kv_bits"] / 8.0)
        kweights, kv_bytes = KWKER_SIZES[key]
    kv = lambda b: kv_bytes_per_token(lpath, a.n_prompt, a.n_gen, b, b)
    return {"kwker": mib_for(kweights + kv(kv_bytes)),
            "llama": mib_for(llama_bytes_per_token(lpath) + kv(2.0))}


def probe_all(a, sizes):
    return {mib: probe(a.bw_probe, a.threads, a.isa, mib, a.probe_pattern)
            for mib in sorted(set(sizes.values()))}


def tile_probe(a, op):
    """GMAC/s a thread of the AMX tile unit right now (peak_probe's median pass of register-only
    tile multiplies: `bf16_amx` for preserve, whose products use the bf16 tiles, `int8_amx` for
    the quantized precisions), or None without the probe or the unit. One unit serves a physical
    core and its sibling hardware thread, so a neighbour using it halves what Kwker's prompts on
    tiles get while the vector units run at full speed (docs/benchmarks.md, session 33); the
    figure says which state a run saw."""
    if a.peak_probe is None:
        return None
    rc, out, err = run_child([str(a.peak_probe), "-t", str(a.threads), "-s", "0.05", "--only",
                              op, "--json"], timeout=120)
    if rc != 0:
        raise RuntimeError("peak_probe failed (%d): %s" % (rc, err.strip()))
    v = json.loads(out).get(op + "_median")
    return v / a.threads if v else None


def cpu_ticks():
    """(stolen, total) CPU ticks of the whole machine so far (/proc/stat's first line), or None
    where there is no such file. Stolen time is what the hypervisor gave other guests while this
    one had work: a shared host's noisy minutes show up there, not in the run's own figures."""
    try:
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if len(f) < 9 or f[0] != "cpu":
        return None
    ticks = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_pct(before, after):
    """Percent of the machine's CPU time stolen between two cpu_ticks(), or None."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


def measure_pair(a, model, files, kp, lf, bw_state):
    """A B A B ... a.runs times each; probes (one per side's buffer size) before and after every
    run (the probes after one run are the probes before the next). Returns the pair's record."""
    kpath, lpath = files["kwker"][kp], files["llama"][lf]
    runs = {"kwker": [], "llama": []}
    mib = probe_sizes(a, kpath, lpath, kp)
    if set(bw_state.get("last") or {}) != set(mib.values()):
        bw_state["last"] = probe_all(a, mib)
    tile_op = "bf16_amx" if kp == "preserve" else "int8_amx"
    tile = tile_probe(a, tile_op)
    for r in range(a.runs):
        for side in ("kwker", "llama"):
            before, tile_before = bw_state["last"][mib[side]], tile
            t0 = cpu_ticks()
            res = run_kwker(a, kpath, kp) if side == "kwker" else run_llama(a, lpath)
            stolen = steal_pct(t0, cpu_ticks())
            bw_state["last"] = probe_all(a, mib)
            tile = tile_probe(a, tile_op)
            after = bw_state["last"][mib[side]]
            res.update(bw_before=before, bw_after=after, steal_pct=stolen,
                       tile_before=tile_before, tile_after=tile)
            runs[side].append(res)
            log("  %s %-8s run %d: pp %.1f tg %.2f tok/s, peak RSS %.0f MiB, bw %.1f/%.1f GB/s, "
                "stolen %s%%, tile unit %s/%s GMAC/s a thread"
                % (model, kp if side == "kwker" else lf, r + 1, res["pp_tps"], res["tg_tps"],
                   res["peak_rss_kib"] / 1024, before, after, fmt(stolen), fmt(tile_before, 0),
                   fmt(tile, 0)))
    kbytes = None
    if kp == "preserve":
        kbytes = kwker_preserve_bytes(kpath)
    else:
        packed = [x["packed_bytes"] for x in runs["kwker"] if x.get("packed_bytes")]
        if packed:
            kbytes = packed[0] + one_d_bytes(kpath)
    lbytes = llama_bytes_per_token(lpath)
    # The KV cache each side reads a generated token: Kwker's element as its bench reports it
    # (16 or 32 bits), llama.cpp's from its context's type_k / type_v (f16 by default).
    kbits = runs["kwker"][0].get("kv_bits", 32) / 8.0
    ctxt = runs["llama"][0].get("context") or {}
    lk = GGML_TYPE_BYTES.get(ctxt.get("type_k", 1), 2.0)
    lv = GGML_TYPE_BYTES.get(ctxt.get("type_v", 1), 2.0)
    kv = {"kwker": kv_bytes_per_token(lpath, a.n_prompt, a.n_gen, kbits, kbits),
          "llama": kv_bytes_per_token(lpath, a.n_prompt, a.n_gen, lk, lv)}
    weights = {"kwker": kbytes, "llama": lbytes}
    kbytes = kbytes and kbytes + kv["kwker"]
    lbytes = lbytes + kv["llama"]
    rec = {"model": model, "kwker_precision": kwker_label(a, kp), "llama_format": lf,
           "isa": a.isa, "act_bits": a.act_bits or 16, "llama_flash_attn": a.llama_flash_attn,
           "mix_bits": a.mix_bits if kp == "int4" else None,
           "n_prompt": a.n_prompt, "n_gen": a.n_gen, "threads": a.threads, "runs": runs,
           "probe_mib": mib,
           "kwker_file": str(kpath), "llama_file": str(lpath)}
    for side, nbytes in (("kwker", kbytes), ("llama", lbytes)):
        rs = runs[side]
        s = {"pp_tps": statistics.median(x["pp_tps"] for x in rs),
             "tg_tps": statistics.median(x["tg_tps"] for x in rs),
             "peak_rss_mib": statistics.median(x["peak_rss_kib"] for x in rs) / 1024,
             "bw_gbps": statistics.median((x["bw_before"] + x["bw_after"]) / 2 for x in rs),
             "bytes_per_token": nbytes, "weight_bytes_per_token": weights[side],
             "kv_bytes_per_token": kv[side]}
        stolen = [x["steal_pct"] for x in rs if x.get("steal_pct") is not None]
        s["steal_pct"] = statistics.median(stolen) if stolen else None
        tiles = [(x["tile_before"] + x["tile_after"]) / 2 for x in rs
                 if x.get("tile_before") and x.get("tile_after")]
        s["tile_gmacs"] = statistics.median(tiles) if len(tiles) == len(rs) else None
        s["tile_op"] = tile_op if s["tile_gmacs"] else None
        if nbytes:
            s["pct_ceiling"] = statistics.median(
                100.0 * x["tg_tps"] * nbytes / ((x["bw_before"] + x["bw_after"]) / 2 * 1e9)
                for x in rs)
        else:
            s["pct_ceiling"] = None
        if side == "kwker":
            s["avx2_dot"] = rs[0].get("avx2_dot")  # its AVX2 kernels' dot products (log)
            s["prompt_tiles"] = rs[0].get("prompt_tiles")  # AMX or vector (log)
            s["preserve_products"] = rs[0].get("preserve_products")  # KWKER_AMX_PRESERVE
            s["matmul"] = rs[0].get("matmul")  # what this run's prompt products ran on (JSON)
        if side == "llama":
            s["base_rss_mib"] = statistics.median(x["base_rss_kib"] for x in rs) / 1024
            s["avx512"] = rs[0].get("avx512")
            s["avx_vnni"] = rs[0].get("avx_vnni")
            s["version"] = rs[0].get("version")
            s["context"] = rs[0].get("context")
        rec[side] = s
    rec["ratio_pp"] = rec["kwker"]["pp_tps"] / rec["llama"]["pp_tps"]
    rec["ratio_tg"] = (rec["kwker"]["tg_tps"] / rec["llama"]["tg_tps"]
                       if rec["llama"]["tg_tps"] else None)
    return rec


def fmt(x, nd=1):
    return "n/a" if x is None else "%.*f" % (nd, x)


def markdown(recs, a):
    lines = ["| model | Kwker | llama.cpp | pp%d Kwker | pp%d llama.cpp | pp × | tg%d Kwker | "
             "tg%d llama.cpp | tg × | %% of ceiling (probe GB/s) Kwker / llama.cpp | "
             "MB read per token Kwker / llama.cpp (of it KV cache) | "
             "peak RSS MiB Kwker / llama.cpp (Python) | CPU stolen %% Kwker / llama.cpp |"
             % (a.n_prompt, a.n_prompt, a.n_gen, a.n_gen),
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    # the AMX tile unit's rate around the runs: a column only where some run has it
    tiles = any(r["kwker"].get("tile_gmacs") for r in recs)
    if tiles:
        lines[0] += " AMX tile unit GMAC/s a thread (probe) Kwker / llama.cpp |"
        lines[1] += "---:|"
    for r in recs:
        k, l_ = r["kwker"], r["llama"]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s (%s) / %s (%s) | "
                     "%s / %s (%s / %s) | %s / %s (%s) | %s / %s |" % (
                         r["model"], r["kwker_precision"], r["llama_format"].upper(),
                         fmt(k["pp_tps"]), fmt(l_["pp_tps"]), fmt(r["ratio_pp"], 2),
                         fmt(k["tg_tps"]), fmt(l_["tg_tps"]), fmt(r["ratio_tg"], 2),
                         fmt(k["pct_ceiling"], 0), fmt(k["bw_gbps"]),
                         fmt(l_["pct_ceiling"], 0), fmt(l_["bw_gbps"]),
                         fmt(k["bytes_per_token"] and k["bytes_per_token"] / 1e6, 0),
                         fmt(l_["bytes_per_token"] / 1e6, 0),
                         fmt(k.get("kv_bytes_per_token") and k["kv_bytes_per_token"] / 1e6, 0),
                         fmt(l_.get("kv_bytes_per_token") and l_["kv_bytes_per_token"] / 1e6, 0),
                         fmt(k["peak_rss_mib"], 0), fmt(l_["peak_rss_mib"], 0),
                         fmt(l_["base_rss_mib"], 0),
                         fmt(k.get("steal_pct")), fmt(l_.get("steal_pct"))))
        if tiles:
            lines[-1] += " %s / %s |" % (fmt(k.get("tile_gmacs"), 0),
                                         fmt(l_.get("tile_gmacs"), 0))
    return "\n".join(lines)


def find_bin(explicit, env, names):
    if explicit:
        return Path(explicit)
    if os.environ.get(env):
        return Path(os.environ[env])
    for n in names:
        p = REPO / "build" / n
        if p.exists():
            return p
    return REPO / "build" / names[0]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--precisions", default="preserve,balanced,int4",
                    help="pairs to run, by either side's name: preserve, balanced, int4, bf16, "
                         "q8_0, q4_0, q4_k_m (int4 selects both of its pairs)")
    ap.add_argument("--runs", type=int, default=5, help="runs of each side, alternated")
    ap.add_argument("-p", dest="n_prompt", type=int, default=512)
    ap.add_argument("-n", dest="n_gen", type=int, default=128)
    ap.add_argument("-t", dest="threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1,
                    help="timed passes inside each run (after one warm-up pass), median")
    ap.add_argument("--isa", choices=("native", "avx2", "avxvnni"), default="native",
                    help="avx2: Kwker with KWKER_ISA=avx2 KWKER_AVXVNNI=off and llama.cpp from "
                         "the AVX2-only build in .cache/venv-llama-avx2; avxvnni: Kwker's AVX2 "
                         "path with AVX-VNNI and llama.cpp built with AVX2 + AVX_VNNI in "
                         ".cache/venv-llama-avxvnni (--llama-python overrides either)")
    ap.add_argument("--models-dir", default=str(REPO / ".cache" / "bench-models"))
    ap.add_argument("--kwker-bin", default=None, help="default $KWKER_BIN, else build/kwker")
    ap.add_argument("--bw-probe", default=None, help="default $KWK_BW_PROBE, else build/bw_probe")
    ap.add_argument("--peak-probe", default=None,
                    help="the AMX tile unit's probe: default $KWK_PEAK_PROBE, else build/peak_probe "
                         "(beside kwker); 'none' measures without it")
    ap.add_argument("--probe-mib", default="auto",
                    help="the probe's buffer in MiB; auto (default): the model's bytes read per "
                         "token, so that it sits in the caches as the weights do (before "
                         "session 9 the ceilings used 256)")
    ap.add_argument("--probe-pattern", choices=("best", "stream", "streams4"), default="best",
                    help="how the probe reads: one sequential stream a thread (before session "
                         "17 the only one), 4 long streams a thread (the float decodes' pattern), "
                         "or best (default): the faster of the two, the stricter ceiling")
    ap.add_argument("--llama-python", default=None,
                    help="the Python whose llama_cpp runs llama.cpp (default: this one, or the "
                         "AVX2 / AVX-VNNI venv's with --isa avx2 / avxvnni)")
    ap.add_argument("--json", default=None, help="also write every run and summary here")
    ap.add_argument("--resume", action="store_true",
                    help="reuse pairs already measured with the same settings (results file in "
                         "--models-dir) and store each new pair there as soon as it is done")
    ap.add_argument("--report", action="store_true",
                    help="measure nothing: print the table of the pairs already stored by "
                         "--resume with these settings")
    ap.add_argument("--act-bits", type=int, choices=(8, 16), default=None,
                    help="Kwker's activation bits for balanced and int4 (kwker --act-bits; "
                         "default: kwker's own, 16)")
    ap.add_argument("--mix-bits", type=int, choices=(4, 6, 8), default=None,
                    help="int4's wider matrices (kwker --mix-bits; default: kwker's own, 8 "
                         "below 1B parameters, 6 from 1B). 4 keeps none: every matrix at 4 "
                         "bits, the matched-bits comparison with Q4_0")
    ap.add_argument("--llama-flash-attn", choices=("best", "auto", "on", "off"), default="best",
                    help="llama.cpp's flash attention: best (default) measures on and off in "
                         "each run and keeps each column's faster figure; auto is llama.cpp's "
                         "default")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: smollm2-135m only, 2 runs, -p 64 -n 16")
    ap.add_argument("--llama-worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quick:
        a.runs, a.n_prompt, a.n_gen = 2, 64, 16
        if a.models == ",".join(DEFAULT_MODELS):
            a.models = "smollm2-135m"
    return a


def main(argv=None):
    a = parse_args(argv)
    if a.llama_worker:
        return llama_worker(json.loads(a.llama_worker))
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            raise SystemExit("unknown model %r (one of %s)" % (m, ", ".join(MODELS)))
    want = set(x for x in a.precisions.split(",") if x)
    bad = want - {p for pair in PAIRS for p in pair}
    if bad:
        raise SystemExit("unknown precision(s) %s" % ", ".join(sorted(bad)))
    pairs = [(kp, lf) for kp, lf in PAIRS if kp in want or lf in want]
    if a.probe_mib != "auto" and not (a.probe_mib.isdigit() and int(a.probe_mib) > 0):
        raise SystemExit("--probe-mib: auto or a number of MiB, not %r" % a.probe_mib)
    a.kwker_bin = find_bin(a.kwker_bin, "KWKER_BIN", ["kwker"])
    a.bw_probe = find_bin(a.bw_probe, "KWK_BW_PROBE", ["bw_probe"])
    if not a.bw_probe.is_file() and (a.kwker_bin.parent / "bw_probe").is_file():
        a.bw_probe = a.kwker_bin.parent / "bw_probe"  # built beside kwker in the same tree
    if a.peak_probe == "none":
        a.peak_probe = None
    else:
        a.peak_probe = find_bin(a.peak_probe, "KWK_PEAK_PROBE", ["peak_probe"])
        if not a.peak_probe.is_file() and (a.kwker_bin.parent / "peak_probe").is_file():
            a.peak_probe = a.kwker_bin.parent / "peak_probe"
        if not a.report and not a.peak_probe.is_file():
            raise SystemExit("peak_probe not found at %s: build it (ninja -C build peak_probe), "
                             "pass its path, or --peak-probe none" % a.peak_probe)
    for p, what in ((a.kwker_bin, "kwker"), (a.bw_probe, "bw_probe")):
        if not a.report and not Path(p).is_file():
            raise SystemExit("%s not found at %s: build it (ninja -C build %s) or pass its path"
                             % (what, p, what if what == "bw_probe" else "kwker_cli"))
    if a.llama_python is None:
        venv = {"avx2": AVX2_VENV, "avxvnni": AVXVNNI_VENV}.get(a.isa)
        if venv and not a.report:
            # its own llama_cpp: with --system-site-packages the system's would be found too
            if not (venv / "bin" / "python").exists() or not list(
                    venv.glob("lib/python*/site-packages/llama_cpp/__init__.py")):
                raise SystemExit("--isa %s needs its own llama-cpp-python build in %s "
                                 "(bench/README.md says how to build it)" % (a.isa, venv))
            a.llama_python = venv / "bin" / "python"
        else:
            a.llama_python = Path(sys.executable)
    sys.path.insert(0, str(HERE))
    import llamacpp
    if not a.report:
        llamacpp.import_llama_cpp()  # a clear message when llama-cpp-python is missing
    models_dir = Path(a.models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    store = models_dir / "side-by-side-results.json"
    done = json.loads(store.read_text()) if (a.resume or a.report) and store.exists() else {}
    formats = sorted({lf for _, lf in pairs}, key=LLAMA_FORMATS.index)
    recs, bw_state = [], {}
    for m in models:
        if a.report:
            recs += [done[pair_key(a, m, kp, lf)] for kp, lf in pairs
                     if pair_key(a, m, kp, lf) in done]
            continue
        log("%s: preparing files in %s" % (m, models_dir / m))
        files = model_files(m, models_dir, formats, a.threads)
        for kp, lf in pairs:
            key = pair_key(a, m, kp, lf)
            if key in done:
                log("%s %s vs %s: reused from %s" % (m, kp, lf, store))
                recs.append(done[key])
                continue
            log("%s: Kwker %s vs llama.cpp %s, %d runs each" % (m, kp, lf, a.runs))
            rec = measure_pair(a, m, files, kp, lf, bw_state)
            recs.append(rec)
            if a.resume:
                done[key] = rec
                tmp = store.with_suffix(".part")
                tmp.write_text(json.dumps(done, indent=1))
                os.replace(tmp, store)
    table = markdown(recs, a)
    print(table)
    if a.json:
        out = {"settings": {"n_prompt": a.n_prompt, "n_gen": a.n_gen, "threads": a.threads,
                            "runs": a.runs, "reps": a.reps, "isa": a.isa,
                            "probe_pattern": a.probe_pattern,
                            "kwker_bin": str(a.kwker_bin), "llama_python": str(a.llama_python)},
               "results": recs, "markdown": table}
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
