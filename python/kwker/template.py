"""Chat templates: Kwker's C Jinja engine, rendering what transformers' apply_chat_template renders.

    t = ChatTemplate(source)                   # compile once (SyntaxError-like errors raise here)
    t.render({"messages": [...], "add_generation_prompt": True}, now=datetime(2025, 7, 10, 12))

`apply_chat_template(source, messages, tools=None, ...)` builds the context exactly as transformers
does (None-valued message keys dropped, reasoning fields aliased, tools and documents always
defined) and renders it.
"""
import calendar
import ctypes
import json

from ._lib import KwkErr, KwkError, lib, raise_err

__all__ = ["ChatTemplate", "TemplateError", "apply_chat_template"]

_JINJA2 = 0
_HFJS = 1
_EFORMAT = -10001
_ELIMIT = -10003
_ESYNTAX = -10006
_ERUNTIME = -10007


class TemplateError(KwkError):
    """A template failed to compile (code KWK_ESYNTAX) or to render (KWK_ERUNTIME for an error the
    template raised or hit, KWK_ELIMIT for a limit). `.line` / `.col` locate it when known."""

    def __init__(self, message, code=0, pos=-1, line=0, col=0):
        super().__init__(message, code, pos)
        self.line = line
        self.col = col


class _TemplateOpts(ctypes.Structure):
    _fields_ = [("trim_blocks", ctypes.c_int), ("lstrip_blocks", ctypes.c_int),
                ("dialect", ctypes.c_int)]


class _RenderOpts(ctypes.Structure):
    _fields_ = [("now", ctypes.c_int64), ("have_now", ctypes.c_int),
                ("max_steps", ctypes.c_uint64), ("max_depth", ctypes.c_int),
                ("max_output", ctypes.c_size_t), ("max_memory", ctypes.c_size_t)]


_protos_done = False


def _l():
    global _protos_done
    L = lib()
    if not _protos_done:
        L.kwk_template_new.restype = ctypes.c_void_p
        L.kwk_template_new.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.POINTER(_TemplateOpts), ctypes.POINTER(KwkErr)]
        L.kwk_template_free.restype = None
        L.kwk_template_free.argtypes = [ctypes.c_void_p]
        L.kwk_template_render.restype = ctypes.c_int
        L.kwk_template_render.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                          ctypes.POINTER(_RenderOpts),
                                          ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(KwkErr)]
        L.kwk_string_free.restype = None
        L.kwk_string_free.argtypes = [ctypes.c_void_p]
        _protos_done = True
    return L


def _raise(err, what):
    try:
        raise_err(err, what)
    except KwkError as e:
        raise TemplateError(str(e), err.code, err.pos, err.line, err.col) from None


def _json_default(x):
    # transformers replaces anything that is not plain data with a "<TypeName>" placeholder.
    if isinstance(x, tuple):
        return list(x)
    if hasattr(x, "item") and callable(x.item):
        return x.item()
    if hasattr(x, "model_dump") and callable(x.model_dump):
        return x.model_dump()
    return "<%s>" % type(x).__name__


class ChatTemplate:
    """A compiled chat template (thread-safe to render from several threads)."""

    def __init__(self, source, trim_blocks=True, lstrip_blocks=True, dialect="jinja2"):
        if isinstance(source, bytes):
            src = source
        else:
            src = str(source).encode("utf-8", "surrogatepass")
        opts = _TemplateOpts(1 if trim_blocks else 0, 1 if lstrip_blocks else 0,
                             _HFJS if dialect == "hfjs" else _JINJA2)
        err = KwkErr()
        L = _l()
        self._h = L.kwk_template_new(src, len(src), ctypes.byref(opts), ctypes.byref(err))
        if not self._h:
            _raise(err, "chat template")
        self.source = source

    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            _l().kwk_template_free(h)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def render(self, context=None, now=None, max_steps=0, max_depth=0, max_output=0,
               max_memory=0, **kwargs):
        """Render with `context` (a dict; keyword arguments are merged in). `now` (a datetime)
        fixes the wall clock strftime_now reads. Returns the text; raises TemplateError."""
        if not self._h:
            raise ValueError("template is closed")
        ctx = dict(context or {})
        ctx.update(kwargs)
        data = json.dumps(ctx, ensure_ascii=False, default=_json_default).encode("utf-8",
                                                                                 "surrogatepass")
        opts = _RenderOpts()
        if now is not None:
            opts.now = calendar.timegm(now.timetuple())
            opts.have_now = 1
        opts.max_steps = max_steps
        opts.max_depth = max_depth
        opts.max_output = max_output
        opts.max_memory = max_memory
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        err = KwkErr()
        L = _l()
        rc = L.kwk_template_render(self._h, data, len(data), ctypes.byref(opts), ctypes.byref(out),
                                   ctypes.byref(n), ctypes.byref(err))
        if rc < 0:
            _raise(err, "chat template")
        try:
            return ctypes.string_at(out.value, n.value).decode("utf-8", "surrogateescape")
        finally:
            L.kwk_string_free(out.value)


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _normalize_messages(messages):
    out = []
    for m in getattr(messages, "messages", messages):
        if hasattr(m, "model_dump"):
            m = m.model_dump()
        if not isinstance(m, dict):
            raise TypeError("Chat messages should be dicts, but got %r." % (m,))
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


_cache = {}


def _compiled(source):
    t = _cache.get(source)
    if t is None:
        if len(_cache) > 32:
            _cache.clear()
        t = _cache[source] = ChatTemplate(source)
    return t


def apply_chat_template(template_source, messages, tools=None, add_generation_prompt=True,
                        bos_token=None, eos_token=None, **kwargs):
    """Render a conversation the way transformers' tokenizer.apply_chat_template(tokenize=False)
    does: `tools` and `documents` are always defined (None when absent), message keys whose value
    is None are dropped, bos_token / eos_token are passed when given, and any other keyword
    (documents, enable_thinking, now=datetime for strftime_now, ...) reaches the template."""
    now = kwargs.pop("now", None)
    if not messages:
        raise ValueError("Cannot apply chat template to an empty conversation.")
    ctx = {}
    if bos_token is not None:
        ctx["bos_token"] = bos_token
    if eos_token is not None:
        ctx["eos_token"] = eos_token
    ctx.update(kwargs)
    ctx["messages"] = _normalize_messages(messages)
    ctx["tools"] = tools
    ctx.setdefault("documents", None)
    ctx["add_generation_prompt"] = bool(add_generation_prompt)
    return _compiled(template_source).render(ctx, now=now)
