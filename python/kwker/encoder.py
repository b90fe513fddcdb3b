"""kwker.Encoder: embeddings of whole sequences from an encoder model (BERT: all-MiniLM-L6-v2,
bge-small, ...) with libkwker (include/kwker.h, section "Encoders"). numpy only: no torch.

An Encoder is used by one thread at a time (its C handle owns a thread pool and scratch); make
one per thread to embed from several.
"""
import ctypes
import os

import numpy as np

from ._lib import Closing, KwkErr, KwkError, check, lib, raise_err

_PRECISIONS = {"preserve": 0, "balanced": 1, "int8": 1, "int4": 2}
# enum kwk_pooling, by the names sentence-transformers' Pooling modes go by
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "max", 5: "mean_sqrt_len"}
_POOLING_IDS = {v: k for k, v in POOLING_NAMES.items()}
_POOLING_IDS.update({"lasttoken": 3, "mean_tokens": 1, "cls_token": 2, "max_tokens": 4,
                     "mean_sqrt_len_tokens": 5})

_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
_bound = False


class _EncoderParams(ctypes.Structure):
    """struct kwk_encoder_params."""
    _fields_ = [
        ("n_threads", ctypes.c_int),
        ("precision", ctypes.c_int),
        ("act_bits", ctypes.c_int),
        ("pooling", ctypes.c_int),
        ("normalize", ctypes.c_int),
        ("batch_tokens", ctypes.c_int),
        ("max_tokens", ctypes.c_int),
    ]


def _bind():
    global _bound
    L = lib()
    if _bound:
        return L
    from .decode import _ModelInfo
    vp = ctypes.c_void_p
    L.kwk_model_load.restype = vp
    L.kwk_model_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(KwkErr)]
    L.kwk_model_free.argtypes = [vp]
    L.kwk_model_get_info.argtypes = [vp, ctypes.POINTER(_ModelInfo)]
    L.kwk_encoder_params_init.restype = None
    L.kwk_encoder_params_init.argtypes = [ctypes.POINTER(_EncoderParams)]
    L.kwk_encoder_new.restype = vp
    L.kwk_encoder_new.argtypes = [vp, ctypes.POINTER(_EncoderParams), ctypes.POINTER(KwkErr)]
    L.kwk_encoder_free.restype = None
    L.kwk_encoder_free.argtypes = [vp]
    for name in ("dim", "max_tokens", "pooling", "normalize"):
        f = getattr(L, "kwk_encoder_" + name)
        f.restype = ctypes.c_int
        f.argtypes = [vp]
    L.kwk_encoder_embed.restype = ctypes.c_int
    L.kwk_encoder_embed.argtypes = [vp, _I32P, _I32P, ctypes.c_int, _F32P,
                                    ctypes.POINTER(KwkErr)]
    L.kwk_encoder_states.restype = ctypes.c_int
    L.kwk_encoder_states.argtypes = [vp, _I32P, ctypes.c_int, _F32P, ctypes.POINTER(KwkErr)]
    _bound = True
    return L


def _pooling_arg(pooling):
    if pooling is None:
        return -1
    if isinstance(pooling, str):
        key = pooling.lower()
        if key in _POOLING_IDS:
            return _POOLING_IDS[key]
    raise ValueError("pooling must be one of %s (or None: the model's), not %r"
                     % (", ".join(POOLING_NAMES.values()), pooling))


def _act_bits_arg(act_bits):
    if act_bits is None:
        return 0
    if isinstance(act_bits, (bool, str)) or act_bits not in (0, 8, 16):
        raise ValueError("act_bits must be 8 or 16 (or 0 / None: 16), not %r" % (act_bits,))
    return int(act_bits)


def _is_ids(x):
    """A sequence of token ids (a list / tuple of ints or a 1-D integer numpy array)."""
    if isinstance(x, np.ndarray):
        return x.ndim == 1 and (x.size == 0 or np.issubdtype(x.dtype, np.integer))
    if isinstance(x, (list, tuple)):
        return all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in x)
    return False


class Encoder(Closing):
    """An encoder model (BERT) loaded with libkwker, giving embeddings of whole sequences.

    model: a folder (config.json + safetensors, the tokenizer beside them; sentence-transformers'
    modules.json and 1_Pooling/config.json say how it pools), a .gguf file, or a Hugging Face id
    found offline in the local Hugging Face cache. The tokenizer is loaded from the same place,
    when first needed.
    precision: "preserve" (the checkpoint's numbers, float32 math: transformers' float32 states),
    "balanced" (8-bit matrices) or "int4". act_bits (balanced / int4): 16 (0, the default) or 8.
    pooling: None (the model's) or "mean", "cls", "last", "max", "mean_sqrt_len";
    normalize: None (the model's), True or False (unit L2 length).
    batch_tokens: tokens one forward pass may hold, whole sequences packed together (0: 2048,
    raised to the model's positions). threads: 0 for every core.
    max_tokens: None for the model's limit (sentence-transformers': sentence_bert_config.json's
    max_seq_length, else the tokenizer's model_max_length, at most the positions); a number for
    another, as setting SentenceTransformer.max_seq_length does (at most the positions: a larger
    one is cut to them).

    A decoder model raises KwkError (KWK_EUNSUPPORTED); so does an encoder given to KwkDecoder.
    Not thread-safe: one Encoder per thread.
    """

    def __init__(self, model, precision="preserve", threads=0, act_bits=0, pooling=None,
                 normalize=None, batch_tokens=0, max_tokens=None):
        self._model = self._enc = self._tokenizer = None
        if precision not in _PRECISIONS:
            raise ValueError("precision must be one of %s" % ", ".join(_PRECISIONS))
        if batch_tokens is None or int(batch_tokens) < 0:
            raise ValueError("batch_tokens must be >= 0")
        if max_tokens is not None and (isinstance(max_tokens, bool) or int(max_tokens) < 1):
            raise ValueError("max_tokens must be a positive token count or None")
        L = _bind()
        self._L = L
        self.model_path = os.fspath(model)
        self.precision = precision
        from .decode import _ModelInfo
        err = KwkErr()
        self._model = L.kwk_model_load(os.fsencode(self.model_path), ctypes.byref(err))
        if not self._model:
            raise_err(err, "Encoder")
        info = _ModelInfo()
        L.kwk_model_get_info(self._model, ctypes.byref(info))
        self.info = info
        self.vocab_size = info.n_vocab
        p = _EncoderParams()
        L.kwk_encoder_params_init(ctypes.byref(p))
        p.n_threads = int(threads or 0)
        p.precision = _PRECISIONS[precision]
        p.act_bits = _act_bits_arg(act_bits)
        p.pooling = _pooling_arg(pooling)
        p.normalize = -1 if normalize is None else int(bool(normalize))
        p.batch_tokens = int(batch_tokens)
        p.max_tokens = 0 if max_tokens is None else min(int(max_tokens), info.max_position)
        self._enc = L.kwk_encoder_new(self._model, ctypes.byref(p), ctypes.byref(err))
        if not self._enc:
            self.close()
            raise_err(err, "Encoder")

    # -- lifetime ---------------------------------------------------------------------------

    def close(self):
        if getattr(self, "_enc", None):
            self._L.kwk_encoder_free(self._enc)
            self._enc = None
        if getattr(self, "_model", None):
            self._L.kwk_model_free(self._model)
            self._model = None
        tok = getattr(self, "_tokenizer", None)
        if tok is not None:
            tok.close()
            self._tokenizer = None

    def _handle(self):
        if not self._enc:
            raise ValueError("the Encoder is closed")
        return self._enc

    # -- properties -------------------------------------------------------------------------

    @property
    def dim(self):
        """Floats of one embedding (the model's hidden size)."""
        return int(self._L.kwk_encoder_dim(self._handle()))

    @property
    def max_tokens(self):
        """Tokens one sequence may hold, special tokens included, as sentence-transformers
        truncates: sentence_bert_config.json's max_seq_length, else the tokenizer's
        model_max_length, never above the model's positions (a GGUF: its positions). The
        values read are in info (max_seq_length, model_max_length: 0 when absent)."""
        return int(self._L.kwk_encoder_max_tokens(self._handle()))

    @property
    def pooling(self):
        """How embed() pools token states: "mean", "cls", "last", "max", "mean_sqrt_len"."""
        v = int(self._L.kwk_encoder_pooling(self._handle()))
        return POOLING_NAMES.get(v, str(v))

    @property
    def normalize(self):
        """Whether embed() scales each embedding to unit L2 length."""
        return bool(self._L.kwk_encoder_normalize(self._handle()))

    # -- tokens -----------------------------------------------------------------------------

    def tokenizer(self):
        """The model's own kwker.Tokenizer (loaded from the model's place on first use)."""
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def tokenize(self, text):
        """The token ids of text as the model sees them: special tokens added ([CLS] ... [SEP]),
        exactly as the Hugging Face tokenizer gives them."""
        return self.tokenizer().encode(text, add_special_tokens=True)

    def _truncated(self, ids, text=None):
        """ids cut to max_tokens as Hugging Face's truncation cuts them: the text's own tokens
        are cut at the end, then the special tokens (for BERT [CLS] and [SEP]) are around them
        again. For ids given by the caller, the first max_tokens - 1 and the last one (the
        [SEP]) are kept."""
        limit = self.max_tokens
        if len(ids) <= limit:
            return ids
        if text is None:
            return list(ids[:limit - 1]) + [ids[-1]]
        inner = self.tokenizer().encode(text, add_special_tokens=False)
        n_added = len(ids) - len(inner)
        for k in range(max(n_added, 0) + 1):  # where the text's tokens sit among the specials
            if list(ids[k:k + len(inner)]) == list(inner):
                break
        else:
            raise KwkError("cannot truncate: the tokenizer's special tokens do not surround "
                           "the text's tokens")
        keep = limit - n_added
        if keep < 0:
            raise KwkError("cannot truncate to %d tokens: the tokenizer adds %d" % (limit, n_added))
        return list(ids[:k]) + list(inner[:keep]) + list(ids[k + len(inner):])

    def _ids_of(self, item, truncate):
        if isinstance(item, (str, bytes)):
            ids = self.tokenize(item)
            return self._truncated(ids, item) if truncate else ids
        if not _is_ids(item):
            raise TypeError("an input must be a string or a sequence of token ids, not %r"
                            % type(item).__name__)
        ids = [int(t) for t in item]
        return self._truncated(ids) if truncate else ids

    # -- compute ----------------------------------------------------------------------------

    def _raise(self, rc, err, what):
        if err.code:
            raise_err(err, what)
        check(rc, what)

    def embed(self, inputs, truncate=False):
        """Embeddings of inputs as float32 numpy, pooled (and normalized) as .pooling and
        .normalize say.

        inputs: a string, or one sequence of token ids -> a 1-D array [dim] (as
        sentence-transformers' encode gives for one string); a list of strings or of token-id
        sequences (a 2-D integer array too) -> [n, dim], row i for input i ([0, dim] for an
        empty list). Token ids include the special tokens, as tokenize() gives them; strings
        are tokenized with the model's tokenizer.
        truncate: False raises KwkError (KWK_ELIMIT) for a sequence longer than max_tokens;
        True cuts it as Hugging Face's tokenizer with truncation=True, max_length=max_tokens
        would (a string's text tokens cut, [CLS] / [SEP] kept; token ids keep their first
        max_tokens - 1 and their last). Ids outside the vocabulary raise KwkError (KWK_ERANGE),
        an empty sequence KwkError (KWK_EARG).
        A sequence's embedding is bitwise the same whatever it is batched with.
        """
        single = isinstance(inputs, (str, bytes)) or (_is_ids(inputs) and len(inputs) > 0)
        items = [inputs] if single else list(inputs)
        seqs = [self._ids_of(it, truncate) for it in items]
        out = self._embed_ids(seqs)
        return out[0] if single else out

    def _embed_ids(self, seqs):
        dim = self.dim
        out = np.empty((len(seqs), dim), dtype=np.float32)
        if not seqs:
            return out
        offs = np.zeros(len(seqs) + 1, dtype=np.int64)
        offs[1:] = np.cumsum([len(s) for s in seqs])
        if offs[-1] >= 1 << 31:
            raise ValueError("too many tokens in one call (%d)" % offs[-1])
        flat = np.fromiter((t for s in seqs for t in s), dtype=np.int64, count=int(offs[-1]))
        if flat.size and (flat.min() < -(1 << 31) or flat.max() >= 1 << 31):
            raise KwkError("token id out of range [0, %d)" % self.vocab_size, -10005)
        ids = np.ascontiguousarray(flat, dtype=np.int32)
        offs32 = np.ascontiguousarray(offs, dtype=np.int32)
        err = KwkErr()
        rc = self._L.kwk_encoder_embed(self._handle(), ids.ctypes.data_as(_I32P),
                                       offs32.ctypes.data_as(_I32P), len(seqs),
                                       out.ctypes.data_as(_F32P), ctypes.byref(err))
        if rc < 0:
            self._raise(rc, err, "embed")
        return out

    def states(self, text_or_ids, truncate=False):
        """The last layer's state of every token of one sequence, unpooled: float32 [n, dim]
        (transformers' last_hidden_state[0]). text_or_ids: a string (tokenized with special
        tokens) or token ids; truncate as in embed()."""
        ids = np.asarray(self._ids_of(text_or_ids, truncate), dtype=np.int64)
        if ids.size and (ids.min() < -(1 << 31) or ids.max() >= 1 << 31):
            raise KwkError("token id out of range [0, %d)" % self.vocab_size, -10005)
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        err = KwkErr()
        rc = self._L.kwk_encoder_states(self._handle(), ids.ctypes.data_as(_I32P), len(ids),
                                        out.ctypes.data_as(_F32P), ctypes.byref(err))
        if rc < 0:
            self._raise(rc, err, "states")
        return out

    def __repr__(self):
        if not self._enc:
            return "Encoder(%r, closed)" % self.model_path
        return "Encoder(%r, precision=%r, dim=%d, max_tokens=%d, pooling=%r, normalize=%r)" % (
            self.model_path, self.precision, self.dim, self.max_tokens, self.pooling,
            self.normalize)
