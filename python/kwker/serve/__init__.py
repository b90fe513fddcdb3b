"""kwker.serve: the serving engine (continuous batching, include/kwker.h "Serving engine") from
Python, and `python -m kwker.serve` (the HTTP server, see __main__.py).

    eng = Engine("model.gguf", max_batch=8)        # or Engine(a_kwk_decoder)
    reqs = [eng.submit(ids, max_new_tokens=64) for ids in prompts]
    eng.run_until_done()                            # steps on this thread
    print([r.tokens for r in reqs])

    eng.start()                                     # or: a background stepping thread
    for tok in eng.submit(ids, max_new_tokens=64):  # streams token ids as they are made
        ...
    text = await eng.submit(ids).aresult()          # asyncio (starts the thread if needed)

Each request gets exactly the tokens KwkDecoder.generate gives it alone (the kernels are batch
invariant), whatever else is in flight.

Threads: the engine's events arrive through one ctypes callback on the stepping thread (the
engine's own after start(), else the thread calling step / run_until_done / a blocking wait);
it only copies the event into the request under the request's lock and wakes its waiters
(threading.Condition, and asyncio loops through call_soon_threadsafe). submit, cancel and
stats may be called from any thread. Steps never run on two threads at once: blocking waits
on a request step the engine themselves only while no background thread runs.
"""
import asyncio
import ctypes
import itertools
import os
import sys
import threading
import weakref

import numpy as np

from .._lib import Closing, KwkErr, KwkError, lib, raise_err
from ..decode import (_FINISH, _PRECISIONS, _TOP_MAX, KwkDecoder, _ModelInfo, _as_ids,
                      gen_params)
from ..decode import _bind as _dec_bind
from ..decode import _act_bits_arg, _cache_dir_arg, _kv_bits_arg, _quant_args
from ..tokenizer import Tokenizer

_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)

_EVENT_TOKEN, _EVENT_DONE, _EVENT_PROMPT = 1, 2, 3


class _EngineParams(ctypes.Structure):
    """struct kwk_engine_params."""
    _fields_ = [
        ("max_batch", ctypes.c_int),
        ("max_cache_len", ctypes.c_int),
        ("n_threads", ctypes.c_int),
        ("precision", ctypes.c_int),
        ("prefill_chunk", ctypes.c_int),
        ("max_queue", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
        ("mix_bits", ctypes.c_int),
        ("calib", ctypes.POINTER(ctypes.c_int32)),
        ("n_calib", ctypes.c_int64),
        ("gptq", ctypes.c_int),
        ("act_bits", ctypes.c_int),
        ("kv_bits", ctypes.c_int),
    ]


class _Event(ctypes.Structure):
    """struct kwk_event."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("id", ctypes.c_uint64),
        ("token", ctypes.c_int32),
        ("logprob", ctypes.c_float),
        ("n_top", ctypes.c_int),
        ("top_ids", _I32P),
        ("top_lps", _F32P),
        ("text", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("finish_reason", ctypes.c_int),
        ("status", ctypes.c_int),
        ("err_msg", ctypes.c_char_p),
        ("n_prompt", ctypes.c_int),
        ("prompt_reused", ctypes.c_int),
        ("n_tokens", ctypes.c_int),
        ("queue_s", ctypes.c_double),
        ("ttft_s", ctypes.c_double),
        ("total_s", ctypes.c_double),
        ("prompt_lps", _F32P),
    ]


class _EngineStats(ctypes.Structure):
    """struct kwk_engine_stats."""
    _fields_ = [
        ("submitted", ctypes.c_uint64),
        ("completed", ctypes.c_uint64),
        ("canceled", ctypes.c_uint64),
        ("failed", ctypes.c_uint64),
        ("prompt_tokens", ctypes.c_uint64),
        ("prompt_reused", ctypes.c_uint64),
        ("generated_tokens", ctypes.c_uint64),
        ("steps", ctypes.c_uint64),
        ("batch_rows", ctypes.c_uint64),
        ("queued", ctypes.c_int),
        ("running", ctypes.c_int),
        ("max_batch", ctypes.c_int),
        ("max_cache_len", ctypes.c_int),
        ("ttft_sum_s", ctypes.c_double),
        ("ttft_count", ctypes.c_uint64),
        ("busy_s", ctypes.c_double),
    ]


_EVENT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Event))
_bound = None


def _bind():
    global _bound
    if _bound is not None:
        return _bound
    L = lib()
    L.kwk_engine_params_init.argtypes = [ctypes.POINTER(_EngineParams)]
    L.kwk_engine_params_init.restype = None
    L.kwk_engine_new.argtypes = [ctypes.c_void_p, ctypes.POINTER(_EngineParams),
                                 ctypes.POINTER(KwkErr)]
    L.kwk_engine_new.restype = ctypes.c_void_p
    L.kwk_engine_free.argtypes = [ctypes.c_void_p]
    L.kwk_engine_free.restype = None
    L.kwk_engine_submit.argtypes = [ctypes.c_void_p, _I32P, ctypes.c_int, ctypes.c_void_p,
                                    _EVENT_FN, ctypes.c_void_p, ctypes.POINTER(KwkErr)]
    L.kwk_engine_submit.restype = ctypes.c_uint64
    L.kwk_engine_cancel.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    L.kwk_engine_cancel.restype = ctypes.c_int
    L.kwk_engine_step.argtypes = [ctypes.c_void_p]
    L.kwk_engine_step.restype = ctypes.c_int
    L.kwk_engine_start.argtypes = [ctypes.c_void_p, ctypes.POINTER(KwkErr)]
    L.kwk_engine_start.restype = ctypes.c_int
    L.kwk_engine_stop.argtypes = [ctypes.c_void_p]
    L.kwk_engine_stop.restype = None
    L.kwk_engine_get_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(_EngineStats)]
    L.kwk_engine_get_stats.restype = None
    _bound = L
    return L


class Request:
    """One submitted generation. Iterate it for token ids as they are made (blocking), or
    `async for`; result() / await aresult() wait for the end and return the new token ids.

    Attributes (filled as events arrive): id, prompt (list of ids), tokens (new ids),
    logprobs (floats), top_logprobs (per token a list of (id, logprob), when asked for),
    text (the reply's text with a tokenizer, else None), finish_reason ("stop", "length",
    "canceled", or None while running), done, error (a KwkError when the request failed),
    prompt_reused, queue_s, ttft_s, total_s; with submit(prompt_logprobs=True),
    prompt_logprobs (each prompt token's logprob given those before it; None for the first) and
    prompt_top_logprobs (per prompt token a list of (id, logprob), when top_logprobs asked; None
    for the first), set before the first token.
    """

    def __init__(self, engine, prompt, has_text):
        self._engine = engine
        self._cond = threading.Condition()
        self._loops = []  # asyncio (loop, Event) pairs waiting for news
        self.id = 0
        self.prompt = prompt
        self.tokens = []
        self.logprobs = []
        self.top_logprobs = None
        self.prompt_logprobs = self.prompt_top_logprobs = None
        self._text = [] if has_text else None
        self.done = False
        self.finish_reason = None
        self.error = None
        self.prompt_reused = 0
        self.queue_s = self.ttft_s = self.total_s = 0.0

    @property
    def text(self):
        with self._cond:
            return None if self._text is None else "".join(self._text)

    def __repr__(self):
        return "Request(id=%d, tokens=%d, finish_reason=%r)" % (self.id, len(self.tokens),
                                                              self.finish_reason)

    # --- called on the stepping thread (through Engine._on_event) ---
    def _event(self, ev):
        with self._cond:
            if ev.type == _EVENT_TOKEN:
                self.tokens.append(int(ev.token))
                self.logprobs.append(float(ev.logprob))
                if ev.n_top:
                    if self.top_logprobs is None:
                        self.top_logprobs = []
                    self.top_logprobs.append([(int(ev.top_ids[i]), float(ev.top_lps[i]))
                                              for i in range(ev.n_top)])
                if self._text is not None and ev.len:
                    self._text.append(ctypes.string_at(ev.text, ev.len).decode("utf-8",
                                                                               "replace"))
            elif ev.type == _EVENT_PROMPT:
                n, nt = ev.n_prompt, ev.n_top
                self.prompt_logprobs = [None] + [float(ev.prompt_lps[i]) for i in range(1, n)]
                if nt:
                    self.prompt_top_logprobs = [None] + [
                        [(int(ev.top_ids[i * nt + k]), float(ev.top_lps[i * nt + k]))
                         for k in range(nt)] for i in range(1, n)]
            elif ev.type == _EVENT_DONE:
                self.finish_reason = _FINISH.get(ev.finish_reason)
                if ev.status < 0:
                    msg = ev.err_msg.decode("utf-8", "replace") if ev.err_msg else ""
                    self.error = KwkError("request %d: %s" % (self.id, msg), ev.status)
                self.prompt_reused = ev.prompt_reused
                self.queue_s, self.ttft_s, self.total_s = ev.queue_s, ev.ttft_s, ev.total_s
                self.done = True
            self._cond.notify_all()
            loops = list(self._loops)
        for loop, aev in loops:
            try:
                loop.call_soon_threadsafe(aev.set)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    # --- blocking use ---
    def _wait_news(self, seen):
        """Block until more than `seen` tokens arrived or the request ended."""
        while True:
            with self._cond:
                if len(self.tokens) > seen or self.done:
                    return
                if self._engine._thread_on:
                    self._cond.wait(0.5)
                    continue
            if self._engine._step_here() == 0 and not self.done:
                # idle with this request not ended: its DONE event was lost (an engine bug)
                raise KwkError("request %d: the engine is idle but the request did not end"
                               % self.id)

    def __iter__(self):
        i = 0
        while True:
            self._wait_news(i)
            with self._cond:
                new = self.tokens[i:]
                done = self.done
            for t in new:
                yield t
            i += len(new)
            if done and i >= len(self.tokens):
                if self.error is not None:
                    raise self.error
                return

    def result(self, timeout=None):
        """Wait for the end (stepping the engine on this thread unless its own thread runs);
        return the new token ids. Raises the request's KwkError when it failed. timeout (s)
        applies while the engine's own thread runs: TimeoutError after it."""
        if timeout is not None and self._engine._thread_on:
            with self._cond:
                if not self._cond.wait_for(lambda: self.done, timeout):
                    raise TimeoutError("request %d still running" % self.id)
        for _ in self:
            pass
        return list(self.tokens)

    def cancel(self):
        """Ask the engine to end this request (finish_reason "canceled"); False when it had
        already ended."""
        return self._engine.cancel(self)

    # --- asyncio ---
    async def _anews(self, seen):
        self._engine._ensure_thread()
        loop = asyncio.get_running_loop()
        aev = asyncio.Event()
        pair = (loop, aev)
        with self._cond:
            self._loops.append(pair)
        try:
            while True:
                aev.clear()
                with self._cond:
                    if len(self.tokens) > seen or self.done:
                        return
                await aev.wait()
        finally:
            with self._cond:
                self._loops.remove(pair)

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        i = 0
        while True:
            await self._anews(i)
            with self._cond:
                new = self.tokens[i:]
                done = self.done
            for t in new:
                yield t
            i += len(new)
            if done and i >= len(self.tokens):
                if self.error is not None:
                    raise self.error
                return

    async def aresult(self):
        """await: the new token ids once the request ended (starts the engine's thread when
        it is not running, so the event loop never blocks on a step)."""
        async for _ in self:
            pass
        return list(self.tokens)


class Engine(Closing):
    """Continuous batching over one model: up to max_batch requests advance together in one
    batched forward pass a step.

    model: a KwkDecoder (its model, precision, thread count and cache length are used; the
    decoder must stay open while the engine lives) or a path as KwkDecoder takes.
    max_cache_len: positions per request (prompt + reply); prefill_chunk: prompt tokens read
    per step; max_queue: requests waiting for a slot. tokenizer: for text and stop strings
    (default: the model's own, when it ships one). cache_dir: the packed-weight cache for
    balanced / int4, as KwkDecoder's (None: none; True: $KWKER_CACHE or ~/.cache/kwker/packs).
    mix_bits, calib, gptq: as KwkDecoder's (taken from the decoder when it is one of the same
    precision). act_bits: as KwkDecoder's (8 or 16); None takes the decoder's when it is one of
    the same precision, else 16. kv_bits: as KwkDecoder's (16 or 32); None takes the decoder's
    when it is one of the same precision, else the precision's default.
    """

    def __init__(self, model, max_batch=8, max_cache_len=None, precision=None, n_threads=None,
                 prefill_chunk=0, max_queue=0, tokenizer=None, cache_dir=None, mix_bits=None,
                 calib=None, gptq=False, act_bits=None, kv_bits=None):
        L = _bind()
        self._lib = L
        self._e = None
        self._thread_on = False
        self._step_lock = threading.Lock()
        self._reqs = {}
        self._reqs_lock = threading.Lock()
        self._keys = itertools.count(1)
        self._decoder = self._model = None
        quant = None
        if isinstance(model, KwkDecoder):
            self._decoder = model  # holds the model (and its tokenizer) open
            if not model._model:
                raise KwkError("the decoder is closed")
            if getattr(model, "_engines", None) is None:
                model._engines = weakref.WeakSet()
            model._engines.add(self)  # model.close() closes this engine first
            handle = model._model
            precision = precision or model.precision
            max_cache_len = model.max_cache_len if max_cache_len is None else max_cache_len
            info = model.info
            tok = tokenizer or model._tokenizer_if_any()
            if precision == model.precision:  # the decoder's packing, fitted the same way
                quant = model._quant
                if act_bits is None:
                    act_bits = model._act_bits or None
                if kv_bits is None:
                    kv_bits = model._kv_bits or None
        else:
            D = _dec_bind()
            err = KwkErr()
            self._model = handle = D.kwk_model_load(os.fsencode(os.fspath(model)),
                                                    ctypes.byref(err))
            if not handle:
                raise_err(err, "Engine")
            info = _ModelInfo()
            D.kwk_model_get_info(handle, ctypes.byref(info))
            tok = tokenizer
            if tok is None:
                try:
                    tok = Tokenizer.from_pretrained(os.fspath(model))
                except KwkError:
                    tok = None
        precision = precision or "preserve"
        if quant is None:
            quant = _quant_args(precision, mix_bits, calib, gptq,
                                self._decoder.model_path if self._decoder is not None
                                else os.fspath(model))
        if precision not in _PRECISIONS:
            raise ValueError("precision must be one of %s" % ", ".join(_PRECISIONS))
        p = _EngineParams()
        L.kwk_engine_params_init(ctypes.byref(p))
        p.max_batch = int(max_batch)
        p.max_cache_len = int(max_cache_len or 0)
        p.n_threads = int(n_threads or 0)
        p.precision = _PRECISIONS[precision]
        p.prefill_chunk = int(prefill_chunk or 0)
        p.max_queue = int(max_queue or 0)
        cache = _cache_dir_arg(cache_dir)
        p.cache_dir = cache  # borrowed by kwk_engine_new only; `cache` outlives the call
        p.mix_bits, p.calib, p.n_calib, p.gptq = quant  # quant[1] outlives the call too
        p.act_bits = _act_bits_arg(act_bits)
        p.kv_bits = _kv_bits_arg(kv_bits)
        self.vocab_size = info.n_vocab
        self.eos_token_id = [info.eos_ids[i] for i in range(info.n_eos)]
        self._tokenizer = tok
        self._cb = _EVENT_FN(self._on_event)  # kept alive as long as the engine
        err = KwkErr()
        self._e = L.kwk_engine_new(handle, ctypes.byref(p), ctypes.byref(err))
        if not self._e:
            raise_err(err, "Engine")
        st = self.stats
        self.max_batch = st["max_batch"]
        self.max_cache_len = st["max_cache_len"]

    # --- lifetime ---
    def close(self):
        """Stop the thread, end every request still held (canceled) and free the engine."""
        if getattr(self, "_e", None):
            self._lib.kwk_engine_free(self._e)  # DONE events for what was left, here
            self._e = None
            self._thread_on = False
        if getattr(self, "_model", None):
            _dec_bind().kwk_model_free(self._model)
            self._model = None
        self._decoder = None

    def _handle(self):
        if not self._e:
            raise KwkError("the engine is closed")
        return self._e

    # --- events (stepping thread) ---
    def _on_event(self, user, ev_p):
        try:
            ev = ev_p.contents
            with self._reqs_lock:
                req = self._reqs.get(user or 0)
                if ev.type == _EVENT_DONE:
                    self._reqs.pop(user or 0, None)
            if req is not None:
                req._event(ev)
        except Exception as exc:  # never let an exception unwind into C
            print("kwker.serve: event callback failed: %r" % (exc,), file=sys.stderr)

    # --- requests ---
    def submit(self, input_ids, max_new_tokens=16, min_new_tokens=0, do_sample=False,
               temperature=1.0, top_k=50, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
               presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None, seed=None,
               generator=None, eos_token_id=None, stop=None, lookup=8, top_logprobs=0,
               prompt_cache=True, grammar=None, json_schema=None, grammar_trigger=None,
               think_open=None, think_close=None, prompt_logprobs=False):
        """Queue a generation; the arguments are KwkDecoder.generate's (no draft, no
        streamer: iterate the returned Request instead), and prompt_logprobs (the prompt
        tokens' logprobs into Request.prompt_logprobs: the prompt is then read in full).
        Thread-safe. Raises KwkError
        (a prompt plus max_new_tokens beyond max_cache_len, a full queue, bad parameters)."""
        from ..grammar import as_grammar
        g = as_grammar(grammar, json_schema)
        if g is not None and self._tokenizer is None:
            raise KwkError("a grammar needs a tokenizer (the model has none: pass "
                           "tokenizer= to Engine)")
        ids, _, _ = _as_ids(input_ids)
        if len(ids) == 0:
            raise ValueError("input_ids is empty")
        if not 0 <= int(top_logprobs or 0) <= _TOP_MAX:
            raise ValueError("top_logprobs must be in [0, %d]" % _TOP_MAX)
        if isinstance(stop, str):
            stop = [stop]
        if stop and self._tokenizer is None:
            raise KwkError("stop strings need a tokenizer (the model has none: pass "
                           "tokenizer= to Engine)")
        if eos_token_id is None:
            eos = self.eos_token_id
        elif isinstance(eos_token_id, (int, np.integer)):
            eos = [int(eos_token_id)]
        else:
            eos = [int(e) for e in eos_token_id]
        p, keep = gen_params(
            max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, do_sample=do_sample,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, logit_bias=logit_bias, seed=seed,
            generator=generator, eos=eos, stop=stop, tok=self._tokenizer,
            prompt_cache=prompt_cache, lookup=lookup, top_logprobs=top_logprobs, grammar=g,
            grammar_trigger=grammar_trigger, think_open=think_open, think_close=think_close,
            prompt_logprobs=prompt_logprobs)
        req = Request(self, ids.tolist(), self._tokenizer is not None)
        req._grammar = g  # the engine reads it until the request's DONE event
        key = next(self._keys)
        # registered before submit: the engine's thread may send events before it returns
        with self._reqs_lock:
            self._reqs[key] = req
        err = KwkErr()
        rid = self._lib.kwk_engine_submit(self._handle(), ids.ctypes.data_as(_I32P), len(ids),
                                          ctypes.byref(p), self._cb, ctypes.c_void_p(key),
                                          ctypes.byref(err))
        del keep  # the engine copied everything
        if rid == 0:
            with self._reqs_lock:
                self._reqs.pop(key, None)
            raise_err(err, "submit")
        req.id = int(rid)
        return req

    def cancel(self, req):
        """End a request (a Request or its id) at the next step; False when unknown or done."""
        rid = req.id if isinstance(req, Request) else int(req)
        return self._lib.kwk_engine_cancel(self._handle(), rid) == 0

    # --- stepping ---
    def step(self):
        """One step on this thread; returns the requests still queued or running. Not while
        the engine's own thread runs."""
        if self._thread_on:
            raise RuntimeError("the engine's thread is running: stop() it first")
        return self._step_here()

    def _step_here(self):
        with self._step_lock:
            rc = self._lib.kwk_engine_step(self._handle())
        if rc < 0:
            raise KwkError("engine step: %s" % self._lib.kwk_status_str(rc).decode(), rc)
        return rc

    def run_until_done(self):
        """Step on this thread until nothing is queued or running."""
        while self.step() > 0:
            pass

    def start(self):
        """Start the engine's own stepping thread (it sleeps while idle)."""
        with self._step_lock:
            if self._thread_on:
                return
            err = KwkErr()
            if self._lib.kwk_engine_start(self._handle(), ctypes.byref(err)) < 0:
                raise_err(err, "start")
            self._thread_on = True

    def stop(self):
        """Stop that thread after its current step; requests stay queued or running."""
        if self._e:
            self._lib.kwk_engine_stop(self._e)
        self._thread_on = False

    def _ensure_thread(self):
        if not self._thread_on:
            self.start()

    @property
    def running(self):
        """True while the engine's own thread runs."""
        return self._thread_on

    @property
    def stats(self):
        """Counters since the engine was made, and what is queued and running now."""
        s = _EngineStats()
        self._lib.kwk_engine_get_stats(self._handle(), ctypes.byref(s))
        d = {name: getattr(s, name) for name, _ in _EngineStats._fields_}
        d["ttft_mean_s"] = s.ttft_sum_s / s.ttft_count if s.ttft_count else None
        d["mean_batch_rows"] = s.batch_rows / s.steps if s.steps else None
        return d

    def generate(self, prompts, max_new_tokens=16, **kw):
        """Submit every prompt, run to the end (on this thread unless the engine's own runs)
        and return each request's new token ids, in order."""
        reqs = [self.submit(p, max_new_tokens=max_new_tokens, **kw) for p in prompts]
        return [r.result() for r in reqs]


__all__ = ["Engine", "Request"]
