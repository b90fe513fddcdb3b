"""KwkDecoder: run a Hugging Face or GGUF checkpoint with libkwker (greedy generation, logits)."""
import ctypes
import os

import numpy as np

from ._lib import Closing, KwkErr, KwkError, check, lib, raise_err
from .sampling import SamplerParams

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
        ("is_encoder", ctypes.c_int),
        ("pooling", ctypes.c_int),
        ("normalize", ctypes.c_int),
        ("n_labels", ctypes.c_int),
        ("score_act", ctypes.c_int),
        ("max_seq_length", ctypes.c_int),
        ("model_max_length", ctypes.c_int),
        ("max_tokens", ctypes.c_int),
    ]


class _DecoderParams(ctypes.Structure):
    _fields_ = [
        ("max_cache_len", ctypes.c_int),
        ("n_threads", ctypes.c_int),
        ("precision", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
        ("cache_max_bytes", ctypes.c_int64),
        ("mix_bits", ctypes.c_int),
        ("calib", ctypes.POINTER(ctypes.c_int32)),
        ("n_calib", ctypes.c_int64),
        ("gptq", ctypes.c_int),
        ("act_bits", ctypes.c_int),
        ("kv_bits", ctypes.c_int),
    ]


def _quant_args(precision, mix_bits, calib, gptq, model_path):
    """Check mix_bits / calib / gptq and give (mix_bits, ids array or None, n, gptq) for the C
    parameters. calib: token ids (any iterable of ints) or a str, encoded with the model's own
    tokenizer (no special tokens)."""
    if mix_bits is not None:
        if precision != "int4":
            raise ValueError("mix_bits applies to precision='int4'")
        if int(mix_bits) not in (4, 6, 8):
            raise ValueError("mix_bits must be 4, 6 or 8 (or None: 6 from a billion "
                             "parameters, 8 below)")
    if gptq and calib is None:
        raise ValueError("gptq=True needs calib (calibration token ids or text)")
    ids = None
    if calib is not None:
        if isinstance(calib, str):
            from .tokenizer import Tokenizer
            calib = Tokenizer.from_pretrained(model_path).encode(calib, add_special_tokens=False)
        calib = [int(t) for t in calib]
        if not calib:
            raise ValueError("calib is empty")
        ids = (ctypes.c_int32 * len(calib))(*calib)
    return int(mix_bits or 0), ids, len(ids) if ids is not None else 0, int(bool(gptq))


def _act_bits_arg(act_bits):
    """act_bits for the C parameters: 0 (the default, 16) for None. Which precisions take 8 is
    the library's check (its KwkError names the reason)."""
    if act_bits is None:
        return 0
    if isinstance(act_bits, (bool, str)) or act_bits not in (8, 16):
        raise ValueError("act_bits must be 8 or 16 (or None: 16), not %r" % (act_bits,))
    return int(act_bits)


def _kv_bits_arg(kv_bits):
    """kv_bits for the C parameters: 0 (by precision) for None."""
    if kv_bits is None:
        return 0
    if isinstance(kv_bits, (bool, str)) or kv_bits not in (16, 32):
        raise ValueError("kv_bits must be 16 or 32 (or None: 16 for balanced / int4, 32 for "
                         "preserve), not %r" % (kv_bits,))
    return int(kv_bits)


def default_cache_dir():
    """The packed-weight cache directory that cache_dir=True means: $KWKER_CACHE, or else
    ~/.cache/kwker/packs (None when $KWKER_CACHE is "" or "off")."""
    env = os.environ.get("KWKER_CACHE")
    if env is not None:
        return None if env in ("", "off") else env
    return os.path.join(os.path.expanduser("~"), ".cache", "kwker", "packs")


def _cache_dir_arg(cache_dir):
    if cache_dir is None or cache_dir is False:
        return None
    if cache_dir is True:
        d = default_cache_dir()
        return None if d is None else os.fsencode(d)
    return os.fsencode(os.fspath(cache_dir))


_TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                             ctypes.c_size_t)


class _GenParams(ctypes.Structure):
    _fields_ = [
        ("max_new_tokens", ctypes.c_int),
        ("sampling", SamplerParams),
        ("logit_bias_ids", ctypes.POINTER(ctypes.c_int32)),
        ("logit_bias", ctypes.POINTER(ctypes.c_float)),
        ("n_logit_bias", ctypes.c_int),
        ("eos_ids", ctypes.POINTER(ctypes.c_int32)),
        ("n_eos", ctypes.c_int),
        ("stop", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop", ctypes.c_int),
        ("tok", ctypes.c_void_p),
        ("prompt_cache", ctypes.c_int),
        ("lookup", ctypes.c_int),
        ("draft", ctypes.c_void_p),
        ("n_draft", ctypes.c_int),
        ("on_token", _TOKEN_FN),
        ("user", ctypes.c_void_p),
        ("top_logprobs", ctypes.c_int),
        ("grammar", ctypes.c_void_p),
        ("grammar_vocab", ctypes.c_void_p),
        ("grammar_trigger", ctypes.c_char_p),
        ("preserved_ids", ctypes.POINTER(ctypes.c_int32)),
        ("n_preserved", ctypes.c_int),
        ("think_open", ctypes.c_char_p),
        ("think_close", ctypes.c_char_p),
        ("prompt_logprobs", ctypes.c_int),
    ]


class _GenOutput(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.POINTER(ctypes.c_int32)),
        ("logprobs", ctypes.POINTER(ctypes.c_float)),
        ("cap", ctypes.c_int),
        ("n_tokens", ctypes.c_int),
        ("finish_reason", ctypes.c_int),
        ("n_prompt", ctypes.c_int),
        ("prompt_reused", ctypes.c_int),
        ("n_proposed", ctypes.c_int),
        ("n_accepted", ctypes.c_int),
        ("n_steps", ctypes.c_int),
        ("text", ctypes.c_void_p),
        ("text_len", ctypes.c_size_t),
        ("top_ids", ctypes.POINTER(ctypes.c_int32)),
        ("top_lps", ctypes.POINTER(ctypes.c_float)),
    ]


_FINISH = {0: None, 1: "stop", 2: "length", 3: "canceled"}
_TOP_MAX = 20  # KWK_SAMPLER_TOP_MAX


class GenerateOutput:
    """What KwkDecoder.generate returns when logprobs are asked for (see its docstring)."""

    def __init__(self, sequences, tokens, logprobs, top_logprobs, text, finish_reason):
        self.sequences = sequences
        self.tokens = tokens
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs
        self.text = text
        self.finish_reason = finish_reason

    def __repr__(self):
        return "GenerateOutput(tokens=%r, finish_reason=%r)" % (self.tokens, self.finish_reason)
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
    L.kwk_decoder_bits_per_weight.argtypes = [ctypes.c_void_p]
    L.kwk_decoder_bits_per_weight.restype = ctypes.c_double
    L.kwk_decoder_kv_bits.argtypes = [ctypes.c_void_p]
    L.kwk_decoder_kv_bits.restype = ctypes.c_int
    for f in (L.kwk_decoder_attn_name, L.kwk_decoder_matmul_name):
        f.argtypes = [ctypes.c_void_p]
        f.restype = ctypes.c_char_p
    L.kwk_decoder_pos.argtypes = [ctypes.c_void_p]
    L.kwk_decoder_truncate.argtypes = [ctypes.c_void_p, ctypes.c_int]
    L.kwk_decoder_tokens.restype = _I32P
    L.kwk_decoder_tokens.argtypes = [ctypes.c_void_p]
    L.kwk_decoder_eval.argtypes = [ctypes.c_void_p, _I32P, ctypes.c_int, _F32P, ctypes.c_int]
    L.kwk_decoder_generate_greedy.argtypes = [ctypes.c_void_p, _I32P, ctypes.c_int, ctypes.c_int,
                                              _I32P, ctypes.c_int, _I32P,
                                              ctypes.POINTER(ctypes.c_int)]
    L.kwk_gen_params_init.argtypes = [ctypes.POINTER(_GenParams)]
    L.kwk_generate.argtypes = [ctypes.c_void_p, _I32P, ctypes.c_int, ctypes.POINTER(_GenParams),
                               ctypes.POINTER(_GenOutput), ctypes.POINTER(KwkErr)]
    L.kwk_gen_output_clear.argtypes = [ctypes.POINTER(_GenOutput)]
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


def gen_params(max_new_tokens=16, min_new_tokens=0, do_sample=False, temperature=1.0, top_k=50,
               top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
               frequency_penalty=0.0, logit_bias=None, seed=None, generator=None, eos=(),
               stop=None, tok=None, prompt_cache=True, lookup=8, top_logprobs=0, grammar=None,
               grammar_trigger=None, preserved_ids=None, think_open=None, think_close=None,
               prompt_logprobs=False):
    """struct kwk_gen_params for generate()'s arguments (eos: a list of ids; stop: strings, which
    need tok, a kwker.Tokenizer; preserved_ids: special tokens whose text the reply keeps;
    think_open / think_close: a thinking model's block, where grammar_trigger is not looked for;
    prompt_logprobs: the prompt tokens' logprobs, the serving engine's).
    Returns (params, buffers the params point into: keep them alive while the params are
    used)."""
    p = _GenParams()
    _bind().kwk_gen_params_init(ctypes.byref(p))
    p.max_new_tokens = int(max_new_tokens)
    sp = p.sampling
    sp.do_sample = int(bool(do_sample))
    sp.temperature = float(temperature)
    sp.top_k = int(top_k or 0)
    sp.top_p = float(top_p)
    sp.min_p = float(min_p or 0.0)
    sp.repetition_penalty = float(repetition_penalty)
    sp.presence_penalty = float(presence_penalty)
    sp.frequency_penalty = float(frequency_penalty)
    sp.min_new_tokens = int(min_new_tokens or 0)
    if generator is not None and seed is None:
        seed = generator.initial_seed()
    sp.seed = int(seed or 0) & 0xFFFFFFFFFFFFFFFF
    keep = []  # ctypes buffers that must outlive the call
    if logit_bias:
        b_ids = np.asarray([int(k) for k in logit_bias], dtype=np.int32)
        b_val = np.asarray([float(v) for v in logit_bias.values()], dtype=np.float32)
        keep += [b_ids, b_val]
        p.logit_bias_ids = b_ids.ctypes.data_as(_I32P)
        p.logit_bias = b_val.ctypes.data_as(_F32P)
        p.n_logit_bias = len(b_ids)
    eos = np.asarray(list(eos), dtype=np.int32)
    keep.append(eos)
    p.eos_ids = eos.ctypes.data_as(_I32P)
    p.n_eos = len(eos)
    if isinstance(stop, str):
        stop = [stop]
    if stop:
        arr = (ctypes.c_char_p * len(stop))(*[s_.encode() for s_ in stop])
        keep.append(arr)
        p.stop = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
        p.n_stop = len(stop)
    if tok is not None:
        p.tok = tok._h
    p.prompt_cache = int(bool(prompt_cache))
    p.lookup = int(lookup or 0)
    p.top_logprobs = int(top_logprobs or 0)
    if grammar is not None:  # a kwker.grammar.Grammar
        keep.append(grammar)
        p.grammar = grammar._h
    if grammar_trigger:  # a lazy grammar: free text until this string appears
        if grammar is None:
            raise ValueError("grammar_trigger needs a grammar or a json_schema")
        trig = grammar_trigger.encode("utf-8")
        keep.append(trig)
        p.grammar_trigger = trig
    p.prompt_logprobs = int(bool(prompt_logprobs))
    for name, tag in (("think_open", think_open), ("think_close", think_close)):
        if tag is not None:  # the C side checks the length (KWK_THINK_TAG_MAX)
            b = tag.encode("utf-8")
            keep.append(b)
            setattr(p, name, b)
    if preserved_ids is not None:  # a numpy array or tensor has no truth value ([0] is one id)
        pres = np.asarray(preserved_ids, dtype=np.int64).ravel()
        if pres.size and (pres.min() < 0 or pres.max() > 0x7FFFFFFF):
            raise ValueError("preserved_ids must be token ids")
        pres = pres.astype(np.int32)
        keep.append(pres)
        p.preserved_ids = pres.ctypes.data_as(_I32P)
        p.n_preserved = len(pres)
    return p, keep


class KwkDecoder(Closing):
    """A model plus a KV cache of max_cache_len positions, run by libkwker on the CPU.

    model: a folder (config.json + safetensors), a .gguf file, or a Hugging Face id found in the
    local Hugging Face cache. precision: "preserve" (the checkpoint's own numbers, float32 math).
    Not thread-safe: use one decoder per thread (they may load the same files).
    max_batch: the slots of the serving engine that generate_batch() uses (default 8).
    cache_dir (balanced / int4; preserve with a cache runs a bf16 checkpoint as panels on AVX2
    CPUs and in AMX tile order on AMX-BF16 CPUs, without one in place): None or False packs at
    every load; True keeps packed weights in default_cache_dir() ($KWKER_CACHE or
    ~/.cache/kwker/packs); a path uses that directory. cache_max_bytes: its size limit (None: $KWKER_CACHE_MAX or 16 GiB), least
    recently used packs removed first. A cache that cannot be used only logs a warning.
    mix_bits (int4 only): bits of the matrices int4 keeps wider (the lm_head, and the value and
    down projections of a third of the layers): 8, 6 or 4 (none); None = 6 from a billion
    parameters, 8 below. calib: calibration token ids (or a str, encoded with the model's
    tokenizer): balanced / int4 weights get activation-aware scales (AWQ) fitted to the model's
    activations on them; gptq=True adds GPTQ on top (needs calib). Both are part of the pack
    cache's key: with cache_dir the fitting runs once.
    act_bits (balanced / int4): how their matrices, the lm_head included, read activations:
    16 (None, the default) as two 8-bit halves, two int8 dot-product passes; 8 rounds them to
    8 bits, one pass as llama.cpp does: faster prompts for a few tenths of a percent higher
    perplexity. The weights are the same (one pack file serves both). ValueError for other
    values; preserve (float32 math) refuses 8 with a KwkError.
    kv_bits: the KV cache's element, 16 (IEEE half: half the bytes a generated token reads from
    the cache) or 32 (float); None = 16 for balanced / int4, 32 for preserve (whose float32
    numbers match transformers'). The decoder's choice is in .kv_bits.
    """

    def __init__(self, model, max_cache_len=2048, precision="preserve", n_threads=None,
                 weights=None, cache_dir=None, cache_max_bytes=None, max_batch=None,
                 mix_bits=None, calib=None, gptq=False, act_bits=None, kv_bits=None):
        self._engine = None
        self.max_batch = int(max_batch) if max_batch else None
        self.n_threads = n_threads
        if weights is not None:
            precision = weights
        if precision not in _PRECISIONS:
            raise ValueError("precision must be one of %s" % ", ".join(_PRECISIONS))
        L = _bind()
        self._lib = L
        self._model = self._dec = self._tokenizer = None
        self.stats = {}
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
        cache_arg = _cache_dir_arg(cache_dir)  # bytes kept alive until kwk_decoder_new returns
        if cache_max_bytes is not None and int(cache_max_bytes) < 0:
            raise ValueError("cache_max_bytes must be >= 0")
        mix, ids, n_ids, gq = _quant_args(precision, mix_bits, calib, gptq, self.model_path)
        self._quant = (mix, ids, n_ids, gq)  # an Engine over this decoder packs the same way
        self._act_bits = _act_bits_arg(act_bits)  # and reads activations the same way
        self._kv_bits = _kv_bits_arg(kv_bits)
        params = _DecoderParams(int(max_cache_len), int(n_threads or 0), _PRECISIONS[precision],
                                cache_arg, int(cache_max_bytes or 0), mix, ids, n_ids, gq,
                                self._act_bits, self._kv_bits)
        self._dec = L.kwk_decoder_new(self._model, ctypes.byref(params), ctypes.byref(err))
        if not self._dec:
            raise_err(err)
        self.max_cache_len = int(max_cache_len)
        self.precision = precision
        # the activations' width the quantized matrices run with (None: preserve, float32)
        self.act_bits = None if precision == "preserve" else self._act_bits or 16
        self.kv_bits = int(L.kwk_decoder_kv_bits(self._dec))  # 16 or 32

    def close(self):
        # engines over this decoder's model end first (generate_batch's and any Engine(self))
        for eng in list(getattr(self, "_engines", ())):
            eng.close()
        self._engine = None
        if getattr(self, "_dec", None):
            self._lib.kwk_decoder_free(self._dec)
            self._dec = None
        if getattr(self, "_model", None):
            self._lib.kwk_model_free(self._model)
            self._model = None

    def _raise(self, rc, what, err=None):
        if rc == -10005:  # KWK_ERANGE: the only range the caller controls here is token ids
            raise KwkError("token id out of range [0, %d)" % self.vocab_size, rc)
        if err is not None and err.code:
            raise_err(err, what)
        check(rc, what)

    def _eval(self, ids, mode, out):
        ptr = ids.ctypes.data_as(_I32P)
        optr = out.ctypes.data_as(_F32P) if out is not None else None
        rc = self._lib.kwk_decoder_eval(self._dec, ptr, len(ids), optr, mode)
        if rc < 0:
            self._raise(rc, "eval")

    def bits_per_weight(self):
        """Bits per weight of the matrices a token reads (every layer's and the lm_head),
        scales included: e.g. 8.5 for balanced, about 6.1 for int4 with 8-bit kept matrices,
        32 for preserve of a float32 checkpoint."""
        return float(self._lib.kwk_decoder_bits_per_weight(self._dec))

    def kernels(self):
        """Where this decoder's work runs, as `kwker bench` reports it: {"isa": the kernel
        table's instruction set ("scalar", "avx2", "avx512"), "matmul": the prompt products'
        kernels ("amx-int8", "amx-bf16" or the instruction set), "attention": attention's
        ("avx512-bf16" or the instruction set)}."""
        L = self._lib
        return {"isa": L.kwk_isa_name(L.kwk_isa()).decode(),
                "matmul": L.kwk_decoder_matmul_name(self._dec).decode(),
                "attention": L.kwk_decoder_attn_name(self._dec).decode()}

    def cached_tokens(self):
        """The token ids whose keys and values fill the KV cache (what prompt reuse matches)."""
        n = self._lib.kwk_decoder_pos(self._dec)
        ptr = self._lib.kwk_decoder_tokens(self._dec)
        return [ptr[i] for i in range(n)]

    def forward(self, input_ids):
        """Float32 logits [n, vocab] for every position of a fresh sequence (numpy)."""
        ids, _, _ = _as_ids(input_ids)
        self._lib.kwk_decoder_truncate(self._dec, 0)
        out = np.empty((len(ids), self.vocab_size), dtype=np.float32)
        self._eval(ids, 2, out)
        return out

    def _eos_list(self, eos_token_id):
        if eos_token_id is None:
            return list(self.eos_token_id)
        if isinstance(eos_token_id, (int, np.integer)):
            return [int(eos_token_id)]
        return [int(e) for e in eos_token_id]

    def tokenizer(self):
        """The tokenizer shipped with the model (loaded on first use)."""
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def generate(self, input_ids, max_new_tokens=16, min_new_tokens=0, do_sample=False,
                 temperature=1.0, top_k=50, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                 presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, seed=None,
                 generator=None, eos_token_id=None, stop=None, lookup=8, draft=None, n_draft=4,
                 streamer=None, prompt_cache=True, tokenizer=None, logprobs=False,
                 top_logprobs=0, return_dict_in_generate=False, grammar=None,
                 json_schema=None, grammar_trigger=None, preserved_ids=None, think_open=None,
                 think_close=None):
        """Generate after input_ids; returns prompt + new tokens in the same kind (list, numpy,
        torch) and shape ([n] or [1, n]) as input_ids. With logprobs=True, top_logprobs=k > 0
        or return_dict_in_generate=True it returns a GenerateOutput instead: .sequences (that
        same value), .tokens (the new ids), .logprobs (float32 numpy [n_new]: log-softmax of the
        raw logits at the chosen token, OpenAI's logprobs), .top_logprobs (per new token a list
        of k (id, logprob) pairs, most likely first, lower id first on ties; k <= 20), .text
        and .finish_reason.

        Greedy by default (Hugging Face's defaults otherwise: top_k 50 applies with
        do_sample=True). eos_token_id: an id, a list, None for the model's own, [] never stops
        early. stop: strings matched on the decoded text (the reply ends before the first).
        lookup: n-gram prompt-lookup candidates checked per step (0 off); draft: a smaller
        KwkDecoder with the same vocabulary proposing n_draft tokens a step. Both are exact: the
        tokens are those of plain decoding. prompt_cache reuses the KV cache prefix shared with the
        previous call. seed / generator (a torch.Generator: its initial seed) make sampling
        reproducible. streamer: an object with put(token_ids) and end() (transformers' streamers)
        or a callable(token_id, text). tokenizer: a kwker.Tokenizer for the text (default: the
        one shipped with the model, when it has one). After the call, self.stats holds
        prompt_reused, proposed, accepted, steps, finish_reason and text (None only when there
        is no tokenizer).

        grammar (a kwker.grammar.Grammar or GBNF text) or json_schema (a dict or JSON text)
        keeps the reply to that grammar's sentences (constrained decoding; needs the tokenizer).
        grammar_trigger makes the grammar lazy: free text until the reply contains that string,
        then the grammar (whose sentences begin with it) from the string's first byte on.
        think_close (with think_open, e.g. "<think>" and "</think>"; without it the prompt opened
        the block) keeps the trigger out of a thinking model's block: a call drafted while
        thinking does not set the grammar off (kwk_gen_params.think_open).
        preserved_ids: special tokens (a tool call's marker, e.g. [TOOL_CALLS]) whose text the
        reply keeps, which a grammar takes as that text and a trigger sees
        (kwk_gen_params.preserved_ids).
        """
        n_top = int(top_logprobs or 0)
        if not 0 <= n_top <= _TOP_MAX:
            raise ValueError("top_logprobs must be in [0, %d]" % _TOP_MAX)
        ids, kind, shape2d = _as_ids(input_ids)
        if len(ids) == 0:
            raise ValueError("input_ids is empty")
        L = self._lib
        if isinstance(stop, str):
            stop = [stop]
        from .grammar import as_grammar
        g = as_grammar(grammar, json_schema)
        tok = tokenizer or self._tokenizer_if_any()
        # a callable streamer gets text; transformers' streamers (put / end) only ids
        text_streamer = streamer is not None and not hasattr(streamer, "put")
        if tok is None and (stop or text_streamer or g is not None):
            tok = self.tokenizer()  # raises the reason the model's tokenizer did not load
        p, keep = gen_params(
            max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=do_sample,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, logit_bias=logit_bias, seed=seed,
            generator=generator, eos=self._eos_list(eos_token_id), stop=stop, tok=tok,
            prompt_cache=prompt_cache, lookup=lookup, grammar=g, grammar_trigger=grammar_trigger,
            preserved_ids=preserved_ids, think_open=think_open, think_close=think_close)
        if g is not None:
            vocab = self._grammar_vocab(tok)
            keep.append(vocab)  # the cache could drop it during the call (a re-entrant one)
            p.grammar_vocab = vocab._h
        if draft is not None:
            p.draft = draft._dec
            p.n_draft = int(n_draft)
        cb = None
        if streamer is not None:
            if hasattr(streamer, "put"):
                streamer.put(np.asarray(ids))

                def call(user, token, text, n):
                    streamer.put(np.asarray([token]))
                    return 0
            else:
                def call(user, token, text, n):
                    return int(bool(streamer(int(token), ctypes.string_at(text, n).decode(
                        "utf-8", "replace") if n else "")))
            cb = _TOKEN_FN(call)
            p.on_token = cb
        n_cap = max(int(max_new_tokens), 1)
        out_tokens = np.empty(n_cap, dtype=np.int32)
        out = _GenOutput()
        out.tokens = out_tokens.ctypes.data_as(_I32P)
        out.cap = n_cap
        out_lps = np.zeros(n_cap, dtype=np.float32)
        out.logprobs = out_lps.ctypes.data_as(_F32P)
        p.top_logprobs = n_top
        if n_top:
            top_ids = np.zeros((n_cap, n_top), dtype=np.int32)
            top_lps = np.zeros((n_cap, n_top), dtype=np.float32)
            out.top_ids = top_ids.ctypes.data_as(_I32P)
            out.top_lps = top_lps.ctypes.data_as(_F32P)
        err = KwkErr()
        rc = L.kwk_generate(self._dec, ids.ctypes.data_as(_I32P), len(ids), ctypes.byref(p),
                            ctypes.byref(out), ctypes.byref(err))
        text = ctypes.string_at(out.text, out.text_len).decode("utf-8", "replace") \
            if out.text else None
        L.kwk_gen_output_clear(ctypes.byref(out))
        if streamer is not None and hasattr(streamer, "end"):
            streamer.end()
        if rc < 0:
            self._raise(rc, "generate", err)
        self.stats = {
            "prompt_tokens": out.n_prompt, "prompt_reused": out.prompt_reused,
            "generated": out.n_tokens, "proposed": out.n_proposed,
            "accepted": out.n_accepted, "steps": out.n_steps,
            "finish_reason": _FINISH.get(out.finish_reason), "text": text,
        }
        n_new = min(out.n_tokens, n_cap)
        full = np.concatenate([ids, out_tokens[:n_new]])
        template = input_ids if kind != "list" else None
        seqs = _like(full, kind, shape2d, template)
        if not (logprobs or n_top or return_dict_in_generate):
            return seqs
        tops = None
        if n_top:
            tops = [list(zip(top_ids[i].tolist(), top_lps[i].tolist())) for i in range(n_new)]
        return GenerateOutput(seqs, out_tokens[:n_new].tolist(), out_lps[:n_new].copy(), tops,
                              text, self.stats["finish_reason"])

    def _grammar_vocab(self, tok):
        """The token bytes of tok for grammar masks, built once per tokenizer."""
        from .grammar import GrammarVocab
        cached = getattr(self, "_gvocab", None)
        if cached is None or cached[0] is not tok:
            cached = self._gvocab = (tok, GrammarVocab(tok))
        return cached[1]

    def engine(self):
        """The serving engine over this decoder's model (kwker.serve.Engine with max_batch
        slots of max_cache_len positions, made on first use; it has its own KV cache)."""
        if self._engine is None:
            from .serve import Engine
            self._engine = Engine(self, max_batch=self.max_batch or 8,
                                  n_threads=self.n_threads)
        return self._engine

    def generate_batch(self, prompts, max_new_tokens=16, **kw):
        """Generate after each prompt together, batched by the serving engine (see engine());
        up to max_batch (the constructor's, default 8) advance in one forward pass. kw are
        generate()'s sampling and stopping arguments (no draft or streamer). Returns a list with
        what generate() returns for each prompt alone: the same tokens, prompt + new ones."""
        eng = self.engine()
        reqs = []
        for prompt in prompts:
            ids, kind, shape2d = _as_ids(prompt)
            reqs.append((eng.submit(ids, max_new_tokens=max_new_tokens, **kw), ids, kind,
                         shape2d, prompt))
        outs = []
        for req, ids, kind, shape2d, prompt in reqs:
            new = np.asarray(req.result(), dtype=np.int32)
            full = np.concatenate([ids, new])
            outs.append(_like(full, kind, shape2d, prompt if kind != "list" else None))
        return outs

    def _tokenizer_if_any(self):
        """The model's own tokenizer, or None when it has none (tried once)."""
        if self._tokenizer is None and not getattr(self, "_no_tokenizer", False):
            try:
                self.tokenizer()
            except KwkError:
                self._no_tokenizer = True
        return self._tokenizer

    def generate_greedy(self, input_ids, max_new_tokens=16, eos_token_id=None):
        """Plain greedy decoding without speculation or prompt reuse (the reference path)."""
        ids, kind, shape2d = _as_ids(input_ids)
        if len(ids) == 0:
            raise ValueError("input_ids is empty")
        eos_arr = np.asarray(self._eos_list(eos_token_id), dtype=np.int32)
        out = np.empty(max(int(max_new_tokens), 1), dtype=np.int32)
        n_out = ctypes.c_int(0)
        rc = self._lib.kwk_decoder_generate_greedy(
            self._dec, ids.ctypes.data_as(_I32P), len(ids), int(max_new_tokens),
            eos_arr.ctypes.data_as(_I32P), len(eos_arr), out.ctypes.data_as(_I32P),
            ctypes.byref(n_out))
        if rc < 0:
            self._raise(rc, "generate")
        full = np.concatenate([ids, out[: n_out.value]])
        template = input_ids if kind != "list" else None
        return _like(full, kind, shape2d, template)
