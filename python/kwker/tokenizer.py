"""kwker.Tokenizer: Hugging Face-identical tokenization in libkwker (include/kwker.h tokenizer
section), with an incremental decoder for streaming. A Tokenizer may be shared between threads."""
import ctypes
import os

from ._lib import KwkErr, KwkError, lib, raise_err

_c_i32_p = ctypes.POINTER(ctypes.c_int32)
_protos_done = False


def _protos():
    global _protos_done
    if _protos_done:
        return lib()
    L = lib()
    vp, sz, szp = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)
    L.kwk_tokenizer_load.restype = vp
    L.kwk_tokenizer_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(KwkErr)]
    L.kwk_tokenizer_load_json.restype = vp
    L.kwk_tokenizer_load_json.argtypes = [ctypes.c_char_p, sz, ctypes.POINTER(KwkErr)]
    L.kwk_tokenizer_free.restype = None
    L.kwk_tokenizer_free.argtypes = [vp]
    L.kwk_tokenizer_encode_alloc.restype = ctypes.c_int
    L.kwk_tokenizer_encode_alloc.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_int,
                                             ctypes.POINTER(_c_i32_p), szp]
    L.kwk_tokenizer_encode_offsets.restype = ctypes.c_int
    L.kwk_tokenizer_encode_offsets.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_int,
                                               ctypes.POINTER(_c_i32_p),
                                               ctypes.POINTER(ctypes.POINTER(ctypes.c_uint32)),
                                               szp]
    L.kwk_tokenizer_encode_pair.restype = ctypes.c_int
    L.kwk_tokenizer_encode_pair.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_char_p, sz, sz,
                                            ctypes.POINTER(_c_i32_p), ctypes.POINTER(_c_i32_p),
                                            szp]
    L.kwk_tokenizer_mem_free.restype = None
    L.kwk_tokenizer_mem_free.argtypes = [vp]
    L.kwk_tokenizer_decode_alloc.restype = ctypes.c_int
    L.kwk_tokenizer_decode_alloc.argtypes = [vp, _c_i32_p, sz, ctypes.c_int,
                                             ctypes.POINTER(ctypes.c_void_p), szp]
    L.kwk_tokenizer_n_vocab.restype = ctypes.c_int
    L.kwk_tokenizer_n_vocab.argtypes = [vp]
    L.kwk_tokenizer_id_to_piece.restype = ctypes.c_void_p
    L.kwk_tokenizer_id_to_piece.argtypes = [vp, ctypes.c_int32, szp]
    L.kwk_tokenizer_piece_to_id.restype = ctypes.c_int32
    L.kwk_tokenizer_piece_to_id.argtypes = [vp, ctypes.c_char_p, sz]
    L.kwk_tokenizer_token_bytes.restype = ctypes.c_int
    L.kwk_tokenizer_token_bytes.argtypes = [vp, ctypes.c_int32, ctypes.c_char_p, sz, szp]
    L.kwk_tokenizer_is_special.restype = ctypes.c_int
    L.kwk_tokenizer_is_special.argtypes = [vp, ctypes.c_int32]
    for name in ("bos_id", "pad_id", "unk_id"):
        f = getattr(L, "kwk_tokenizer_" + name)
        f.restype = ctypes.c_int32
        f.argtypes = [vp]
    L.kwk_tokenizer_eos_ids.restype = ctypes.c_int
    L.kwk_tokenizer_eos_ids.argtypes = [vp, _c_i32_p, ctypes.c_int]
    for name in ("bos_token", "eos_token", "chat_template"):
        f = getattr(L, "kwk_tokenizer_" + name)
        f.restype = ctypes.c_char_p
        f.argtypes = [vp]
    L.kwk_detok_new.restype = vp
    L.kwk_detok_new.argtypes = [vp, ctypes.c_int]
    L.kwk_detok_free.restype = None
    L.kwk_detok_free.argtypes = [vp]
    for name in ("kwk_detok_push",):
        f = getattr(L, name)
        f.restype = ctypes.c_int
        f.argtypes = [vp, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), szp]
    L.kwk_detok_flush.restype = ctypes.c_int
    L.kwk_detok_flush.argtypes = [vp, ctypes.POINTER(ctypes.c_void_p), szp]
    _protos_done = True
    return L


def _check(rc, what):
    if rc < 0:
        raise KwkError("%s: %s" % (what, lib().kwk_status_str(rc).decode()), rc)


def _text_bytes(text):
    if isinstance(text, bytes):
        return text
    # Lone surrogates cannot reach Rust either; encode them the way Python's replace would.
    return text.encode("utf-8", "replace")


class Tokenizer:
    """A tokenizer loaded from a folder, a tokenizer.json, a .gguf file or a local HF id:
    Tokenizer(path_or_id), the same as Tokenizer.from_pretrained(path_or_id)."""

    def __init__(self, path_or_id, _handle=None):
        self._L = _protos()
        self._h = None
        if _handle is not None:
            self._h = _handle
            return
        if not isinstance(path_or_id, (str, bytes, os.PathLike)):
            raise TypeError("Tokenizer(path_or_id): a path or a Hugging Face id, not %s"
                            % type(path_or_id).__name__)
        err = KwkErr()
        h = self._L.kwk_tokenizer_load(os.fsencode(path_or_id), ctypes.byref(err))
        if not h:
            raise_err(err, "Tokenizer")
        self._h = h

    @classmethod
    def from_pretrained(cls, path_or_id):
        return cls(path_or_id)

    @classmethod
    def from_json(cls, text):
        L = _protos()
        data = text.encode() if isinstance(text, str) else bytes(text)
        err = KwkErr()
        h = L.kwk_tokenizer_load_json(data, len(data), ctypes.byref(err))
        if not h:
            raise_err(err, "Tokenizer.from_json")
        return cls(None, _handle=h)

    def close(self):
        if getattr(self, "_h", None):
            self._L.kwk_tokenizer_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def encode(self, text, add_special_tokens=True):
        data = _text_bytes(text)
        ids = _c_i32_p()
        n = ctypes.c_size_t()
        rc = self._L.kwk_tokenizer_encode_alloc(self._h, data, len(data), int(add_special_tokens),
                                                ctypes.byref(ids), ctypes.byref(n))
        _check(rc, "encode")
        try:
            return ids[:n.value]
        finally:
            self._L.kwk_tokenizer_mem_free(ids)

    def encode_with_offsets(self, text, add_special_tokens=True):
        """(ids, offsets): offsets[i] = (start, end) byte span of ids[i] in text's UTF-8 bytes.
        Raises KwkError (code KWK_EUNSUPPORTED) when the tokenizer's normalizer or Metaspace
        rewrote the text."""
        data = _text_bytes(text)
        ids = _c_i32_p()
        offs = ctypes.POINTER(ctypes.c_uint32)()
        n = ctypes.c_size_t()
        rc = self._L.kwk_tokenizer_encode_offsets(self._h, data, len(data),
                                                  int(add_special_tokens), ctypes.byref(ids),
                                                  ctypes.byref(offs), ctypes.byref(n))
        _check(rc, "encode_with_offsets")
        try:
            flat = offs[:2 * n.value]
            return ids[:n.value], [(flat[2 * i], flat[2 * i + 1]) for i in range(n.value)]
        finally:
            self._L.kwk_tokenizer_mem_free(ids)
            self._L.kwk_tokenizer_mem_free(offs)

    def encode_pair(self, a, b, max_tokens=0):
        """(ids, type_ids) of the pair (a, b) joined by the tokenizer's pair form, as
        Hugging Face's tokenizer(a, b, truncation=True, max_length=max_tokens) gives
        input_ids and token_type_ids (max_tokens=0: no truncation). Raises KwkError with
        KWK_EUNSUPPORTED when the tokenizer has no pair form, KWK_ELIMIT when max_tokens
        cannot hold its special tokens."""
        da, db = _text_bytes(a), _text_bytes(b)
        ids, types = _c_i32_p(), _c_i32_p()
        n = ctypes.c_size_t()
        rc = self._L.kwk_tokenizer_encode_pair(self._h, da, len(da), db, len(db),
                                               int(max_tokens), ctypes.byref(ids),
                                               ctypes.byref(types), ctypes.byref(n))
        _check(rc, "encode_pair")
        try:
            return ids[:n.value], types[:n.value]
        finally:
            self._L.kwk_tokenizer_mem_free(ids)
            self._L.kwk_tokenizer_mem_free(types)

    def decode(self, ids, skip_special_tokens=False):
        ids = [int(i) for i in ids]
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        rc = self._L.kwk_tokenizer_decode_alloc(self._h, arr, len(ids), int(skip_special_tokens),
                                                ctypes.byref(out), ctypes.byref(n))
        _check(rc, "decode")
        try:
            return ctypes.string_at(out, n.value).decode("utf-8")
        finally:
            self._L.kwk_tokenizer_mem_free(out)

    @property
    def vocab_size(self):
        return self._L.kwk_tokenizer_n_vocab(self._h)

    def __len__(self):
        return self.vocab_size

    def id_to_token(self, i):
        n = ctypes.c_size_t()
        p = self._L.kwk_tokenizer_id_to_piece(self._h, int(i), ctypes.byref(n))
        return None if not p else ctypes.string_at(p, n.value).decode("utf-8", "replace")

    def token_to_id(self, piece):
        data = piece.encode()
        i = self._L.kwk_tokenizer_piece_to_id(self._h, data, len(data))
        return None if i < 0 else i

    def token_bytes(self, i):
        """The bytes token i adds in the middle of a text (what a grammar sees of it)."""
        n = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(256)
        rc = self._L.kwk_tokenizer_token_bytes(self._h, int(i), buf, len(buf), ctypes.byref(n))
        if rc == -10003:  # KWK_ELIMIT: the buffer was short; *n is the length
            buf = ctypes.create_string_buffer(n.value)
            rc = self._L.kwk_tokenizer_token_bytes(self._h, int(i), buf, len(buf),
                                                   ctypes.byref(n))
        _check(rc, "token_bytes")
        return buf.raw[:n.value]

    def is_special(self, i):
        return bool(self._L.kwk_tokenizer_is_special(self._h, int(i)))

    def _opt(self, v):
        return None if v < 0 else v

    @property
    def bos_token_id(self):
        return self._opt(self._L.kwk_tokenizer_bos_id(self._h))

    @property
    def pad_token_id(self):
        return self._opt(self._L.kwk_tokenizer_pad_id(self._h))

    @property
    def unk_token_id(self):
        return self._opt(self._L.kwk_tokenizer_unk_id(self._h))

    @property
    def eos_token_ids(self):
        buf = (ctypes.c_int32 * 8)()
        n = self._L.kwk_tokenizer_eos_ids(self._h, buf, 8)
        return list(buf[:min(n, 8)])

    @property
    def eos_token_id(self):
        ids = self.eos_token_ids
        return ids[0] if ids else None

    def _str(self, fn):
        v = fn(self._h)
        return None if v is None else v.decode("utf-8")

    @property
    def bos_token(self):
        return self._str(self._L.kwk_tokenizer_bos_token)

    @property
    def eos_token(self):
        return self._str(self._L.kwk_tokenizer_eos_token)

    @property
    def chat_template(self):
        return self._str(self._L.kwk_tokenizer_chat_template)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True,
                            tokenize=False, chat_template=None, **kwargs):
        """The conversation rendered by the model's chat template exactly as transformers'
        apply_chat_template renders it (Kwker's C Jinja engine); with tokenize=True its token
        ids (encoded without adding special tokens again, as transformers does)."""
        from .template import apply_chat_template as render
        source = chat_template or self.chat_template
        if source is None:
            raise ValueError("this tokenizer has no chat template; pass chat_template=")
        kwargs.setdefault("bos_token", self.bos_token)
        kwargs.setdefault("eos_token", self.eos_token)
        text = render(source, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                      **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def decoder(self, skip_special_tokens=False):
        """An incremental decoder: push ids one at a time, get text pieces."""
        return IncrementalDecoder(self, skip_special_tokens)


class IncrementalDecoder:
    """Streaming detokenizer: step(id) returns new text ('' while a character is unfinished);
    flush() returns the rest. The pieces concatenate to Tokenizer.decode(all ids)."""

    def __init__(self, tok, skip_special_tokens=False):
        self._tok = tok
        self._L = tok._L
        self._h = self._L.kwk_detok_new(tok._h, int(skip_special_tokens))
        if not self._h:
            raise MemoryError("kwk_detok_new")

    def step(self, token_id):
        p = ctypes.c_void_p()
        n = ctypes.c_size_t()
        _check(self._L.kwk_detok_push(self._h, int(token_id), ctypes.byref(p), ctypes.byref(n)),
               "detok push")
        return ctypes.string_at(p, n.value).decode("utf-8") if n.value else ""

    def flush(self):
        p = ctypes.c_void_p()
        n = ctypes.c_size_t()
        _check(self._L.kwk_detok_flush(self._h, ctypes.byref(p), ctypes.byref(n)), "detok flush")
        return ctypes.string_at(p, n.value).decode("utf-8") if n.value else ""

    def __del__(self):
        try:
            if self._h:
                self._L.kwk_detok_free(self._h)
                self._h = None
        except Exception:
            pass
