"""KwkDecoder: run a Hugging Face or GGUF checkpoint with libkwker (greedy generation, logits)."""
import ctypes
import os

import numpy as np

from ._lib import KwkErr, KwkError, check, lib, raise_err

_PRECISIONS = {"preserve": 0, "balanced": 1, "int8": 1, "int4": 2}


class _ModelInfo(ctypes.Structure):
    _fields_ = [
        ("arch", ctypes.c_int),
        ("n_vocab", ctypes.c_int),
        ("n_layers", ctypes.c_int),
        ("d_model", ctypes.c_int),
        ("n_heads", ctypes.c_int),
        ("n_kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("d_ff", ctypes.c_int),
        ("max_position", ctypes.c_int),
        ("bos_id", ctypes.c_int),
        ("n_eos", ctypes.c_int),
        ("eos_ids", ctypes.c_int * 8),
        ("n_params", ctypes.c_int64),
        ("arch_name", ctypes.c_char * 64),
    ]


class _DecoderParams(ctypes.Structure):
    _fields_ = [
        ("max_cache_len", ctypes.c_int),
        ("n_threads", ctypes.c_int),
        ("precision", ctypes.c_int),
    ]


_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
_bound = False


def _bind():
    global _bound
    if _bound:
        return lib()
    L = lib()
    L.kwk_model_load.restype = ctypes.c_void_p
    L.kwk_model_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(KwkErr)]
    L.kwk_model_free.argtypes = [ctypes.c_void_p]
    L.kwk_model_get_info.argtypes = [ctypes.c_void_p, ctypes.POINTER(_ModelInfo)]
    L.kwk_model_check.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    L.kwk_decoder_new.restype = ctypes.c_void_p
    L.kwk_decoder_new.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DecoderParams),
                                  ctypes.POINTER(KwkErr)]
    L.kwk_decoder_free.argtypes = [ctypes.c_void_p]
    L.kwk_decoder_pos.argtypes = [ctypes.c_void_p]
    L.kwk_decoder_truncate.argtypes = [ctypes.c_void_p, ctypes.c_int]
    L.kwk_decoder_eval.argtypes = [ctypes.c_void_p, _I32P, ctypes.c_int, _F32P, ctypes.c_int]
    L.kwk_decoder_generate_greedy.argtypes = [ctypes.c_void_p, _I32P, ctypes.c_int, ctypes.c_int,
                                              _I32P, ctypes.c_int, _I32P,
                                              ctypes.POINTER(ctypes.c_int)]
    L.kwk_isa.restype = ctypes.c_int
    L.kwk_isa_name.restype = ctypes.c_char_p
    L.kwk_isa_name.argtypes = [ctypes.c_int]
    _bound = True
    return L


def _path(model):
    return os.fspath(model).encode()


def runner_unsupported(model_or_path, max_cache_len=2048):
    """A one-line reason why Kwker cannot run this model with that cache, or None when it can."""
    L = _bind()
    if isinstance(model_or_path, KwkDecoder):
        model_or_path = model_or_path.model_path
    buf = ctypes.create_string_buffer(512)
    rc = L.kwk_model_check(_path(model_or_path), int(max_cache_len), buf, len(buf))
    return None if rc == 0 else buf.value.decode("utf-8", "replace")


def _as_ids(input_ids):
    """Flatten list / numpy / torch input of shape [n] or [1, n] to int32 numpy, and remember the
    kind so results come back the same way."""
    kind, shape2d = "list", False
    if type(input_ids).__module__.startswith("torch"):
        kind = "torch"
        arr = input_ids.detach().cpu().numpy()
    elif isinstance(input_ids, np.ndarray):
        kind = "numpy"
        arr = input_ids
    else:
        arr = np.asarray(input_ids)
        if arr.ndim == 2:
            shape2d = True
    if arr.ndim == 2:
        if arr.shape[0] != 1:
            raise ValueError("input_ids must have shape [n] or [1, n], got %s" % (arr.shape,))
        shape2d = True
        arr = arr[0]
    elif arr.ndim != 1:
        raise ValueError("input_ids must have shape [n] or [1, n], got %s" % (arr.shape,))
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError("input_ids must be integers")
    return np.ascontiguousarray(arr, dtype=np.int32), kind, shape2d


def _like(ids, kind, shape2d, template):
    if shape2d:
        ids = ids[None, :]
    if kind == "torch":
        import torch
        return torch.as_tensor(ids.astype(np.int64), device=template.device).to(template.dtype)
    if kind == "numpy":
        return ids.astype(template.dtype, copy=False)
    return ids.tolist()


class KwkDecoder:
    """A model plus a KV cache of max_cache_len positions, run by libkwker on the CPU.

    model: a folder (config.json + safetensors), a .gguf file, or a Hugging Face id found in the
    local Hugging Face cache. precision: "preserve" (the checkpoint's own numbers, float32 math).
    Not thread-safe: use one decoder per thread (they may load the same files).
    """

    def __init__(self, model, max_cache_len=2048, precision="preserve", n_threads=None,
                 weights=None):
        if weights is not None:
            precision = weights
        if precision not in _PRECISIONS:
            raise ValueError("precision must be one of %s" % ", ".join(_PRECISIONS))
        L = _bind()
        self._lib = L
        self._model = self._dec = None
        self.model_path = os.fspath(model)
        err = KwkErr()
        self._model = L.kwk_model_load(_path(model), ctypes.byref(err))
        if not self._model:
            raise_err(err)
        info = _ModelInfo()
        L.kwk_model_get_info(self._model, ctypes.byref(info))
        self.info = info
        self.vocab_size = info.n_vocab
        self.eos_token_id = [info.eos_ids[i] for i in range(info.n_eos)]
        params = _DecoderParams(int(max_cache_len), int(n_threads or 0), _PRECISIONS[precision])
        self._dec = L.kwk_decoder_new(self._model, ctypes.byref(params), ctypes.byref(err))
        if not self._dec:
            raise_err(err)
        self.max_cache_len = int(max_cache_len)
        self.precision = precision

    def close(self):
        if getattr(self, "_dec", None):
            self._lib.kwk_decoder_free(self._dec)
            self._dec = None
        if getattr(self, "_model", None):
            self._lib.kwk_model_free(self._model)
            self._model = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _eval(self, ids, mode, out):
        ptr = ids.ctypes.data_as(_I32P)
        optr = out.ctypes.data_as(_F32P) if out is not None else None
        rc = self._lib.kwk_decoder_eval(self._dec, ptr, len(ids), optr, mode)
        if rc < 0:
            if rc == -10005:
                raise KwkError("token id out of range [0, %d)" % self.vocab_size, rc)
            check(rc, "eval")

    def forward(self, input_ids):
        """Float32 logits [n, vocab] for every position of a fresh sequence (numpy)."""
        ids, _, _ = _as_ids(input_ids)
        self._lib.kwk_decoder_truncate(self._dec, 0)
        out = np.empty((len(ids), self.vocab_size), dtype=np.float32)
        self._eval(ids, 2, out)
        return out

    def generate(self, input_ids, max_new_tokens=16, eos_token_id=None):
        """Greedy generation: the prompt followed by up to max_new_tokens new tokens, in the same
        kind (list, numpy, torch) and shape ([n] or [1, n]) as input_ids. Stops after an eos id
        (eos_token_id: an id, a list, or None for the model's own; [] never stops early)."""
        ids, kind, shape2d = _as_ids(input_ids)
        if len(ids) == 0:
            raise ValueError("input_ids is empty")
        if eos_token_id is None:
            eos = self.eos_token_id
        elif isinstance(eos_token_id, int):
            eos = [eos_token_id]
        else:
            eos = list(eos_token_id)
        eos_arr = np.asarray(eos, dtype=np.int32)
        out = np.empty(max(int(max_new_tokens), 1), dtype=np.int32)
        n_out = ctypes.c_int(0)
        rc = self._lib.kwk_decoder_generate_greedy(
            self._dec, ids.ctypes.data_as(_I32P), len(ids), int(max_new_tokens),
            eos_arr.ctypes.data_as(_I32P), len(eos_arr), out.ctypes.data_as(_I32P),
            ctypes.byref(n_out))
        if rc == -10005:
            raise KwkError("token id out of range [0, %d)" % self.vocab_size, rc)
        check(rc, "generate")
        full = np.concatenate([ids, out[: n_out.value]])
        template = input_ids if kind != "list" else None
        return _like(full, kind, shape2d, template)
