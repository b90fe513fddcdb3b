#!/usr/bin/env python3
"""make_gguf.py - the benchmark's GGUF files: a model dequantized to an F32 GGUF ("the original"
of the quantization benchmarks) and llama.cpp's own quantizations of it.

  python3 bench/make_gguf.py [--src models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out DIR]
                             [--types q8_0,q4_0,q4_k_m] [--threads 2] [--force]

The F32 file keeps every metadata key of the source (tokenizer included) with general.file_type
set to ALL_F32, and every tensor dequantized with gguf.quants.dequantize (exact: each stored
number times its block scale, plus offset). The quantized files come from llama_model_quantize
(llama-quantize's code, no importance matrix). Files go to DIR (default $KWK_BENCH_CACHE or
<repo>/.cache/bench) as <stem>.f32.gguf and <stem>.<type>.gguf, and are reused when newer than
their source unless --force. Prints one line per file with its bits per weight.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp  # noqa: E402

DEFAULT_SRC = llamacpp.REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SKIP_KEYS = ("general.architecture", "general.file_type", "general.alignment")


def stem_of(src):
    name = Path(src).name
    for suffix in (".gguf",):
        name = name[:-len(suffix)] if name.endswith(suffix) else name
    # "SmolLM2-135M-Instruct.Q4_1" -> "SmolLM2-135M-Instruct": the format is named by our suffix.
    head, dot, tail = name.rpartition(".")
    return head if dot and tail.upper().startswith(("Q", "F", "BF", "IQ")) else name


def fresh(dst, src):
    return Path(dst).is_file() and Path(dst).stat().st_mtime >= Path(src).stat().st_mtime


def copy_field(writer, field):
    import gguf
    vtype = field.types[0]
    sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
    writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)


def write_f32(src, dst):
    """Dequantize every tensor of src into an F32 GGUF at dst (same metadata)."""
    import gguf
    from gguf.quants import dequantize
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    tmp = Path(str(dst) + ".part")
    w = gguf.GGUFWriter(str(tmp), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name in SKIP_KEYS:
            continue
        copy_field(w, field)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in r.tensors:
        # numpy order is the reverse of GGUF's (ne0 = the fastest axis = the last numpy axis).
        shape = tuple(int(x) for x in reversed(t.shape))
        data = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        w.add_tensor(t.name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


def make_all(src=DEFAULT_SRC, out=None, types=("q8_0", "q4_0", "q4_k_m"), threads=2,
             force=False, log=print):
    """Build (or reuse) the F32 original and its quantizations; returns {format: path}."""
    src = Path(src)
    if not src.is_file():
        raise SystemExit("source model %s not found (scripts/setup fetches the default one)" % src)
    out = Path(out) if out else llamacpp.cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    stem = stem_of(src)
    paths = {"f32": out / ("%s.f32.gguf" % stem)}
    if force or not fresh(paths["f32"], src):
        t0 = time.time()
        write_f32(src, paths["f32"])
        log("wrote %s (%.1f s)" % (paths["f32"], time.time() - t0))
    for ty in types:
        if ty not in llamacpp.FTYPES:
            raise SystemExit("unknown llama.cpp type %r (one of %s)" % (ty, ", ".join(
                llamacpp.FTYPES)))
        p = out / ("%s.%s.gguf" % (stem, ty))
        if force or not fresh(p, paths["f32"]):
            t0 = time.time()
            llamacpp.quantize(paths["f32"], p, ty, threads)
            log("wrote %s (%.1f s)" % (p, time.time() - t0))
        paths[ty] = p
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=str(DEFAULT_SRC), help="source GGUF (any llama.cpp types)")
    ap.add_argument("--out", default=None, help="output folder (default: the bench cache)")
    ap.add_argument("--types", default="q8_0,q4_0,q4_k_m",
                    help="llama.cpp quantizations to make, comma-separated ('' for none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date")
    a = ap.parse_args(argv)
    types = [t for t in a.types.split(",") if t]
    paths = make_all(a.src, a.out, types, a.threads, a.force)
    for fmt, p in paths.items():
        n_bytes, n_params, by_type = llamacpp.gguf_stats(p)
        print("%-7s %6.3f bits/weight  %s  (%s)" % (fmt, 8.0 * n_bytes / n_params, p, ", ".join(
            "%s %.1fM" % (k, v / 1e6) for k, v in sorted(by_type.items()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
