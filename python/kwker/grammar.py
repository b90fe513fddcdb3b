"""Constrained decoding: GBNF grammars and JSON Schemas compiled by libkwker (src/grammar).

    g = Grammar.from_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    g.match('{"a": 5}')                      # True: a whole sentence of the grammar
    decoder.generate(ids, grammar=g)          # or json_schema={...} / grammar="root ::= ..."

`Grammar.gbnf_of(schema)` shows the GBNF a schema becomes. A `Matcher` follows one token stream
through a grammar (masks of the tokens allowed next), as generation does inside the library.
"""
import ctypes
import json

import numpy as np

from ._lib import KwkErr, KwkError, lib, raise_err

__all__ = ["Grammar", "GrammarVocab", "Matcher", "as_grammar"]

_EARG = -10004

_protos_done = False


def _l():
    global _protos_done
    L = lib()
    if _protos_done:
        return L
    vp, sz, errp = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(KwkErr)
    L.kwk_grammar_new.restype = vp
    L.kwk_grammar_new.argtypes = [ctypes.c_char_p, sz, errp]
    L.kwk_grammar_from_json_schema.restype = vp
    L.kwk_grammar_from_json_schema.argtypes = [ctypes.c_char_p, sz, errp]
    L.kwk_json_schema_to_gbnf.restype = ctypes.c_int
    L.kwk_json_schema_to_gbnf.argtypes = [ctypes.c_char_p, sz, ctypes.POINTER(vp),
                                          ctypes.POINTER(sz), errp]
    L.kwk_string_free.restype = None
    L.kwk_string_free.argtypes = [vp]
    L.kwk_grammar_free.restype = None
    L.kwk_grammar_free.argtypes = [vp]
    L.kwk_grammar_match.restype = ctypes.c_int
    L.kwk_grammar_match.argtypes = [vp, ctypes.c_char_p, sz, ctypes.POINTER(ctypes.c_int)]
    L.kwk_grammar_vocab_new.restype = vp
    L.kwk_grammar_vocab_new.argtypes = [vp, errp]
    L.kwk_grammar_vocab_from_bytes.restype = vp
    L.kwk_grammar_vocab_from_bytes.argtypes = [ctypes.POINTER(ctypes.c_char_p),
                                               ctypes.POINTER(ctypes.c_uint32), ctypes.c_int32,
                                               errp]
    L.kwk_grammar_vocab_size.restype = ctypes.c_int32
    L.kwk_grammar_vocab_size.argtypes = [vp]
    L.kwk_grammar_vocab_free.restype = None
    L.kwk_grammar_vocab_free.argtypes = [vp]
    L.kwk_matcher_new.restype = vp
    L.kwk_matcher_new.argtypes = [vp, vp, errp]
    L.kwk_matcher_free.restype = None
    L.kwk_matcher_free.argtypes = [vp]
    L.kwk_matcher_reset.restype = None
    L.kwk_matcher_reset.argtypes = [vp]
    L.kwk_matcher_mask.restype = ctypes.c_int32
    L.kwk_matcher_mask.argtypes = [vp, ctypes.POINTER(ctypes.c_uint32)]
    L.kwk_matcher_allows.restype = ctypes.c_int
    L.kwk_matcher_allows.argtypes = [vp, ctypes.c_int32]
    L.kwk_matcher_accept.restype = ctypes.c_int
    L.kwk_matcher_accept.argtypes = [vp, ctypes.c_int32]
    L.kwk_matcher_accept_bytes.restype = ctypes.c_int
    L.kwk_matcher_accept_bytes.argtypes = [vp, ctypes.c_char_p, sz]
    L.kwk_matcher_done.restype = ctypes.c_int
    L.kwk_matcher_done.argtypes = [vp]
    L.kwk_matcher_finished.restype = ctypes.c_int
    L.kwk_matcher_finished.argtypes = [vp]
    _protos_done = True
    return L


def _schema_text(schema):
    if isinstance(schema, (bytes, str)):
        return schema.encode() if isinstance(schema, str) else schema
    return json.dumps(schema).encode()


def _text(s):
    return s.encode() if isinstance(s, str) else bytes(s)


class Grammar:
    """A compiled grammar (immutable; share it freely). Errors raise KwkError with the code,
    the message and, for GBNF, err.line / err.col in the message."""

    def __init__(self, handle):
        self._L = _l()
        self._h = handle

    @classmethod
    def from_gbnf(cls, text):
        L, err, data = _l(), KwkErr(), _text(text)
        h = L.kwk_grammar_new(data, len(data), ctypes.byref(err))
        if not h:
            raise_err(err, "Grammar.from_gbnf")
        return cls(h)

    @classmethod
    def from_json_schema(cls, schema):
        """schema: a dict / bool (a JSON Schema) or its JSON text."""
        L, err, data = _l(), KwkErr(), _schema_text(schema)
        h = L.kwk_grammar_from_json_schema(data, len(data), ctypes.byref(err))
        if not h:
            raise_err(err, "Grammar.from_json_schema")
        return cls(h)

    @staticmethod
    def gbnf_of(schema):
        """The GBNF text a JSON Schema becomes."""
        L, err, data = _l(), KwkErr(), _schema_text(schema)
        out, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = L.kwk_json_schema_to_gbnf(data, len(data), ctypes.byref(out), ctypes.byref(n),
                                       ctypes.byref(err))
        if rc < 0:
            raise_err(err, "Grammar.gbnf_of")
        try:
            return ctypes.string_at(out, n.value).decode()
        finally:
            L.kwk_string_free(out)

    def match(self, text, prefix=False):
        """True when text (str or bytes) is a whole sentence; with prefix=True, when it can
        still be continued into one."""
        data = _text(text)
        pre = ctypes.c_int()
        rc = self._L.kwk_grammar_match(self._h, data, len(data), ctypes.byref(pre))
        if rc < 0:
            raise KwkError("Grammar.match: %s" % self._L.kwk_status_str(rc).decode(), rc)
        return bool(pre.value) if prefix else bool(rc)

    def close(self):
        if getattr(self, "_h", None):
            self._L.kwk_grammar_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class GrammarVocab:
    """The bytes each token adds to text, for masks: from a kwker.Tokenizer or a list of bytes
    (None or b"" for a token never allowed)."""

    def __init__(self, tokenizer=None, token_bytes=None):
        L, err = _l(), KwkErr()
        self._L = L
        if tokenizer is not None:
            self._tok = tokenizer  # the vocabulary reads it only while being built; kept anyway
            h = L.kwk_grammar_vocab_new(tokenizer._h, ctypes.byref(err))
        else:
            toks = [b"" if t is None else bytes(t) for t in token_bytes]
            arr = (ctypes.c_char_p * max(len(toks), 1))(*toks)
            lens = (ctypes.c_uint32 * max(len(toks), 1))(*[len(t) for t in toks])
            h = L.kwk_grammar_vocab_from_bytes(arr, lens, len(toks), ctypes.byref(err))
        if not h:
            raise_err(err, "GrammarVocab")
        self._h = h

    def __len__(self):
        return self._L.kwk_grammar_vocab_size(self._h)

    def close(self):
        if getattr(self, "_h", None):
            self._L.kwk_grammar_vocab_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Matcher:
    """One token stream's position in a grammar."""

    def __init__(self, grammar, vocab):
        L, err = _l(), KwkErr()
        self._L, self._g, self._v = L, grammar, vocab  # both must outlive the matcher
        self._h = L.kwk_matcher_new(grammar._h, vocab._h, ctypes.byref(err))
        if not self._h:
            raise_err(err, "Matcher")

    def mask(self):
        """A bool numpy array over the vocabulary: True for the tokens allowed next."""
        n = len(self._v)
        words = np.zeros((n + 31) // 32, dtype=np.uint32)
        rc = self._L.kwk_matcher_mask(self._h, words.ctypes.data_as(ctypes.POINTER(
            ctypes.c_uint32)))
        if rc < 0:
            raise KwkError("Matcher.mask: %s" % self._L.kwk_status_str(rc).decode(), rc)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
        return bits

    def allows(self, token):
        return self._L.kwk_matcher_allows(self._h, int(token)) == 1

    def accept(self, token):
        """Advance by token; False (state unchanged) when the grammar does not allow it."""
        rc = self._L.kwk_matcher_accept(self._h, int(token))
        if rc == _EARG:
            return False
        if rc < 0:
            raise KwkError("Matcher.accept: %s" % self._L.kwk_status_str(rc).decode(), rc)
        return True

    def accept_bytes(self, data):
        data = _text(data)
        rc = self._L.kwk_matcher_accept_bytes(self._h, data, len(data))
        if rc == _EARG:
            return False
        if rc < 0:
            raise KwkError("Matcher.accept_bytes: %s" % self._L.kwk_status_str(rc).decode(), rc)
        return True

    @property
    def done(self):
        return bool(self._L.kwk_matcher_done(self._h))

    @property
    def finished(self):
        return bool(self._L.kwk_matcher_finished(self._h))

    def reset(self):
        self._L.kwk_matcher_reset(self._h)

    def close(self):
        if getattr(self, "_h", None):
            self._L.kwk_matcher_free(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def as_grammar(grammar=None, json_schema=None):
    """generate()'s grammar= (a Grammar or GBNF text) or json_schema= (a dict, bool or JSON
    text) as a Grammar, or None; both at once is an error."""
    if grammar is not None and json_schema is not None:
        raise ValueError("give grammar= or json_schema=, not both")
    if json_schema is not None:
        return json_schema if isinstance(json_schema, Grammar) else \
            Grammar.from_json_schema(json_schema)
    if grammar is not None:
        return grammar if isinstance(grammar, Grammar) else Grammar.from_gbnf(grammar)
    return None
