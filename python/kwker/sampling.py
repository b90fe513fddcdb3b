"""Sampler: the C sampler (include/kwker.h, "Sampling") over ctypes.

Processing follows transformers' generate() order: logit_bias, repetition_penalty (prompt and
output), min_new_tokens eos suppression, OpenAI presence/frequency penalties (generated tokens
only), then for sampling temperature, top_k, top_p, min_p. Greedy (do_sample=False or
temperature=0) is the argmax after the first four. Draws are a pure function of (seed, number of
generated tokens accepted so far). Logprobs are of the raw logits (OpenAI's semantics).

Not thread-safe: one Sampler per thread.
"""
import ctypes
import os

import numpy as np

from ._lib import Closing, KwkErr, KwkError, lib, raise_err

TOP_MAX = 20


class SamplerParams(ctypes.Structure):
    """struct kwk_sampler_params."""
    _fields_ = [
        ("do_sample", ctypes.c_int),
        ("temperature", ctypes.c_double),
        ("top_k", ctypes.c_int),
        ("top_p", ctypes.c_double),
        ("min_p", ctypes.c_double),
        ("repetition_penalty", ctypes.c_double),
        ("presence_penalty", ctypes.c_double),
        ("frequency_penalty", ctypes.c_double),
        ("min_new_tokens", ctypes.c_int),
        ("seed", ctypes.c_uint64),
    ]


_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
_bound = None


def _bind():
    global _bound
    if _bound is not None:
        return _bound
    L = lib()
    P = ctypes.POINTER(SamplerParams)
    L.kwk_sampler_params_init.argtypes = [P]
    L.kwk_sampler_params_init.restype = None
    L.kwk_sampler_new.argtypes = [ctypes.c_int, P, ctypes.POINTER(KwkErr)]
    L.kwk_sampler_new.restype = ctypes.c_void_p
    L.kwk_sampler_free.argtypes = [ctypes.c_void_p]
    L.kwk_sampler_free.restype = None
    L.kwk_sampler_set_logit_bias.argtypes = [ctypes.c_void_p, _I32P, _F32P, ctypes.c_int,
                                             ctypes.POINTER(KwkErr)]
    L.kwk_sampler_set_eos.argtypes = [ctypes.c_void_p, _I32P, ctypes.c_int]
    L.kwk_sampler_accept.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
    L.kwk_sampler_unaccept.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
    L.kwk_sampler_reset.argtypes = [ctypes.c_void_p]
    L.kwk_sampler_reset.restype = None
    L.kwk_sampler_n_generated.argtypes = [ctypes.c_void_p]
    L.kwk_sampler_n_generated.restype = ctypes.c_int64
    L.kwk_sampler_process.argtypes = [ctypes.c_void_p, _F32P, _F32P]
    L.kwk_sampler_sample.argtypes = [ctypes.c_void_p, _F32P, _I32P, _F32P, _I32P, _F32P,
                                     ctypes.c_int]
    L.kwk_sample_draw.argtypes = [_F32P, ctypes.c_int, ctypes.c_double]
    L.kwk_rng_u01.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    L.kwk_rng_u01.restype = ctypes.c_double
    _bound = L
    return L


def _check(rc, what):
    if rc < 0:
        raise KwkError("%s: %s" % (what, lib().kwk_status_str(rc).decode()), rc)
    return rc


def _row(logits, n_vocab):
    a = np.ascontiguousarray(np.asarray(logits, dtype=np.float32).reshape(-1))
    if a.shape[0] != n_vocab:
        raise ValueError("logits has %d entries, the sampler %d" % (a.shape[0], n_vocab))
    return a


def rng_u01(seed, stream, counter):
    """The uniform in [0, 1) that Philox4x32-10 gives for (seed, stream, counter)."""
    return _bind().kwk_rng_u01(seed, stream, counter)


def draw(probs, u):
    """Index drawn from probs by inverse CDF in index order with u in [0, 1)."""
    a = np.ascontiguousarray(np.asarray(probs, dtype=np.float32).reshape(-1))
    return _bind().kwk_sample_draw(a.ctypes.data_as(_F32P), a.shape[0], float(u))


class Sampler(Closing):
    """A sampler for rows of n_vocab logits.

    Parameters (transformers' generate() names and defaults; top_k defaults to 50 as there):
    do_sample, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
    frequency_penalty, min_new_tokens, seed (None: a random one), eos_token_id (int or list),
    logit_bias ({token id: bias}).
    """

    def __init__(self, n_vocab, do_sample=False, temperature=1.0, top_k=50, top_p=1.0,
                 min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                 frequency_penalty=0.0, min_new_tokens=0, seed=None, eos_token_id=None,
                 logit_bias=None):
        L = _bind()
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
        p = SamplerParams()
        L.kwk_sampler_params_init(ctypes.byref(p))
        p.do_sample = 1 if do_sample else 0
        p.temperature = float(temperature if temperature is not None else 1.0)
        p.top_k = int(top_k if top_k is not None else 0)
        p.top_p = float(top_p if top_p is not None else 1.0)
        p.min_p = float(min_p if min_p is not None else 0.0)
        p.repetition_penalty = float(repetition_penalty if repetition_penalty is not None else 1.0)
        p.presence_penalty = float(presence_penalty or 0.0)
        p.frequency_penalty = float(frequency_penalty or 0.0)
        p.min_new_tokens = int(min_new_tokens or 0)
        p.seed = int(seed) & (2 ** 64 - 1)
        self.params = p
        self.n_vocab = int(n_vocab)
        self._h = None
        err = KwkErr()
        h = L.kwk_sampler_new(self.n_vocab, ctypes.byref(p), ctypes.byref(err))
        if not h:
            raise_err(err, "Sampler")
        self._h = h
        self._lib = L
        self._probs = np.empty(self.n_vocab, dtype=np.float32)
        if eos_token_id is not None:
            self.set_eos(eos_token_id)
        if logit_bias:
            self.set_logit_bias(logit_bias)

    def close(self):
        if self._h:
            self._lib.kwk_sampler_free(self._h)
            self._h = None

    @property
    def seed(self):
        return self.params.seed

    @property
    def n_generated(self):
        return self._lib.kwk_sampler_n_generated(self._h)

    def set_logit_bias(self, bias):
        """Replace the logit bias: a {token id: bias} mapping (OpenAI's logit_bias)."""
        items = list(dict(bias or {}).items())
        ids = np.array([int(k) for k, _ in items], dtype=np.int32)
        vals = np.array([float(v) for _, v in items], dtype=np.float32)
        err = KwkErr()
        rc = self._lib.kwk_sampler_set_logit_bias(self._h, ids.ctypes.data_as(_I32P),
                                                  vals.ctypes.data_as(_F32P), len(items),
                                                  ctypes.byref(err))
        if rc < 0:
            raise_err(err, "logit_bias")

    def set_eos(self, eos_token_id):
        """The eos ids min_new_tokens suppresses: one id or a list."""
        if isinstance(eos_token_id, (int, np.integer)):
            eos_token_id = [eos_token_id]
        ids = np.array([int(t) for t in eos_token_id], dtype=np.int32)
        _check(self._lib.kwk_sampler_set_eos(self._h, ids.ctypes.data_as(_I32P), len(ids)),
               "eos_token_id")

    def accept(self, token, prompt=False):
        """Record one token: prompt tokens with prompt=True, then each generated token."""
        _check(self._lib.kwk_sampler_accept(self._h, int(token), 1 if prompt else 0), "accept")

    def unaccept(self, token, prompt=False):
        _check(self._lib.kwk_sampler_unaccept(self._h, int(token), 1 if prompt else 0),
               "unaccept")

    def reset(self):
        """Forget the history; parameters, bias and eos ids stay."""
        self._lib.kwk_sampler_reset(self._h)

    def set_history(self, prompt_ids=(), output_ids=()):
        """Reset, then accept prompt_ids as prompt and output_ids as generated tokens."""
        self.reset()
        for t in np.asarray(prompt_ids, dtype=np.int64).reshape(-1):
            self.accept(t, prompt=True)
        for t in np.asarray(output_ids, dtype=np.int64).reshape(-1):
            self.accept(t, prompt=False)

    def process(self, logits, prompt_ids=None, output_ids=None):
        """The probability vector the next token is drawn from (float32[n_vocab]); one-hot at
        the argmax for greedy. Passing prompt_ids/output_ids first replaces the history."""
        if prompt_ids is not None or output_ids is not None:
            self.set_history(prompt_ids if prompt_ids is not None else (),
                             output_ids if output_ids is not None else ())
        row = _row(logits, self.n_vocab)
        out = np.empty(self.n_vocab, dtype=np.float32)
        _check(self._lib.kwk_sampler_process(self._h, row.ctypes.data_as(_F32P),
                                             out.ctypes.data_as(_F32P)), "process")
        return out

    def sample(self, logits, top_logprobs=0, accept=False):
        """Choose the next token: (token, logprob, [(id, logprob), ...] best first).

        logprob is of the raw logits. With accept=True the token is also recorded as
        generated (advancing the draw counter)."""
        n_top = int(top_logprobs or 0)
        if n_top < 0 or n_top > TOP_MAX:
            raise ValueError("top_logprobs must be in [0, %d]" % TOP_MAX)
        row = _row(logits, self.n_vocab)
        tok = ctypes.c_int32(-1)
        lp = ctypes.c_float(0.0)
        ids = (ctypes.c_int32 * max(n_top, 1))()
        lps = (ctypes.c_float * max(n_top, 1))()
        _check(self._lib.kwk_sampler_sample(self._h, row.ctypes.data_as(_F32P), ctypes.byref(tok),
                                            ctypes.byref(lp), ids, lps, n_top), "sample")
        if accept:
            self.accept(tok.value)
        return tok.value, lp.value, [(ids[i], lps[i]) for i in range(n_top)]
