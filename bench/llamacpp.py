"""llamacpp.py - helpers around llama-cpp-python (llama.cpp compiled from source by
`scripts/setup --bench`) and the gguf package, shared by the bench/ scripts. Single-threaded
callers; each Llama object is used by one thread.

What is here: GGUF statistics (tensor bytes and parameter counts, for bits per weight), llama.cpp's
own quantizer (llama_model_quantize), and a model loaded with every position's logits kept, the
way llama-perplexity evaluates a chunk.
"""
import ctypes
import os
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# the shared test data (texts, tokenizers): $KWKER_SHARED_DATA, else ../shared/data
SHARED_DATA = Path(os.environ.get("KWKER_SHARED_DATA") or REPO.parent / "shared" / "data")

# llama.cpp's file types (enum llama_ftype) by the names its quantize tool prints.
FTYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q4_k_s": 14,
    "q4_k_m": 15,
    "q5_k_m": 17,
    "q6_k": 18,
    "bf16": 32,
}


def import_llama_cpp():
    """The llama_cpp module, or an error that says how to get it."""
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise SystemExit("llama-cpp-python is not installed (%s): run scripts/setup --bench" % e)
    return llama_cpp


def version():
    """llama-cpp-python's version (which pins the llama.cpp it compiled)."""
    return getattr(import_llama_cpp(), "__version__", "?")


def cache_dir():
    """Where generated GGUF files live: $KWK_BENCH_CACHE, else <repo>/.cache/bench."""
    d = Path(os.environ.get("KWK_BENCH_CACHE") or REPO / ".cache" / "bench")
    d.mkdir(parents=True, exist_ok=True)
    return d


def gguf_stats(path):
    """(tensor bytes, parameters, {type name: parameters}) of a GGUF file."""
    import gguf
    r = gguf.GGUFReader(str(path))
    n_bytes = n_params = 0
    by_type = {}
    for t in r.tensors:
        n_bytes += int(t.n_bytes)
        n_params += int(t.n_elements)
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_elements)
    return n_bytes, n_params, by_type


def bits_per_weight(path):
    n_bytes, n_params, _ = gguf_stats(path)
    return 8.0 * n_bytes / n_params


def quantize(src, dst, ftype, n_threads=2):
    """Quantize GGUF src into dst with llama.cpp's own quantizer (llama_model_quantize, as the
    llama-quantize tool does, no imatrix). ftype: a name of FTYPES. Writes dst atomically."""
    llama_cpp = import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.nthread = int(n_threads)
    tmp = Path(str(dst) + ".part")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError("llama_model_quantize(%s -> %s, %s) failed: %d" % (src, dst, ftype, rc))
    os.replace(tmp, dst)


class LlamaLogits:
    """A llama.cpp model with a context of n_ctx positions that returns the logits of every
    position of a sequence evaluated from an empty cache."""

    def __init__(self, path, n_ctx=512, n_threads=2, kv_f32=False):
        """kv_f32: keep keys and values in float32 (llama.cpp's default cache is f16)."""
        llama_cpp = import_llama_cpp()
        kw = dict(type_k=0, type_v=0) if kv_f32 else {}  # 0 = GGML_TYPE_F32
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx,
                                   n_ubatch=n_ctx, logits_all=True, n_threads=n_threads,
                                   n_threads_batch=n_threads, verbose=False, **kw)
        self.n_ctx = n_ctx
        self.n_vocab = self.llm.n_vocab()

    def tokenize(self, text, add_special):
        """llama.cpp's tokenization of bytes text (special tokens in the text not parsed, as
        llama-perplexity's common_tokenize); add_special adds BOS when the vocabulary does."""
        return self.llm.tokenize(text, add_bos=add_special, special=False)

    def adds_bos(self):
        """Whether the vocabulary adds BOS (probed like kwker perplexity does)."""
        with_bos = self.tokenize(b"a", True)
        without = self.tokenize(b"a", False)
        return len(with_bos) > len(without) and with_bos[0] == self.llm.token_bos()

    def bos(self):
        return self.llm.token_bos()

    def logits(self, ids):
        """float32 [len(ids), n_vocab]: the cache is emptied first (reset, then eval removes
        every position past n_tokens = 0)."""
        self.llm.reset()
        self.llm.eval(list(ids))
        return np.array(self.llm.scores[:len(ids)], dtype=np.float32, copy=True)

    def close(self):
        self.llm.close() if hasattr(self.llm, "close") else None
