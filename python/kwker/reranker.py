"""kwker.Reranker: scores of text pairs from a cross-encoder (a *ForSequenceClassification BERT,
RoBERTa or XLM-RoBERTa checkpoint, or a GGUF with llama.cpp's rank head) with libkwker
(include/kwker.h, kwk_encoder_classify), used as sentence-transformers' CrossEncoder is:
predict() scores pairs, rank() orders documents for a query. numpy only: no torch.

A Reranker is used by one thread at a time (its encoder owns a thread pool and scratch); make
one per thread to score from several.
"""
import ctypes
import json
import os

import numpy as np

from ._lib import Closing, KwkErr, KwkError, lib
from .encoder import Encoder

KWK_EUNSUPPORTED = -10002
# enum kwk_score_act
SCORE_ACTS = {0: "identity", 1: "sigmoid"}

_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
_bound = False


def _bind():
    global _bound
    L = lib()
    if _bound:
        return L
    vp = ctypes.c_void_p
    L.kwk_encoder_n_labels.restype = ctypes.c_int
    L.kwk_encoder_n_labels.argtypes = [vp]
    L.kwk_encoder_classify.restype = ctypes.c_int
    L.kwk_encoder_classify.argtypes = [vp, _I32P, _I32P, _I32P, ctypes.c_int, _F32P,
                                       ctypes.POINTER(KwkErr)]
    _bound = True
    return L


def _sigmoid(x):
    """1 / (1 + exp(-x)) in float64 without overflow, returned as float32."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def _is_pair(x):
    return isinstance(x, (list, tuple)) and len(x) == 2 and \
        all(isinstance(t, (str, bytes)) for t in x)


def _labels_of(path, n_labels):
    """config.json's id2label of a model folder as a list by id, or None (a GGUF, a Hugging
    Face id, a folder without the key, or one whose ids are not those of the n_labels outputs:
    the file is untrusted, so no list is sized by its numbers)."""
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return None
    try:
        with open(cfg, encoding="utf-8") as f:
            id2label = json.load(f).get("id2label")
        if not isinstance(id2label, dict) or not id2label:
            return None
        byid = {int(k): str(v) for k, v in id2label.items()}
    except (ValueError, OSError, TypeError):
        return None
    if len(byid) != n_labels or any(not 0 <= i < n_labels for i in byid):
        return None
    return [byid[i] for i in range(n_labels)]


class Reranker(Closing):
    """A cross-encoder loaded with libkwker, scoring (query, document) pairs as
    sentence-transformers' CrossEncoder does.

    model: a folder (config.json naming BertForSequenceClassification,
    RobertaForSequenceClassification or XLMRobertaForSequenceClassification + safetensors, the
    tokenizer beside them), a .gguf file with llama.cpp's rank head (pooling_type 4, tensors cls
    and cls.output), or a Hugging Face id found offline in the local Hugging Face cache.
    precision: "preserve" (the checkpoint's numbers, float32 math: transformers' float32
    logits), "balanced" (8-bit matrices) or "int4"; act_bits (balanced / int4): 16 (0, the
    default) or 8. batch_tokens: tokens one forward pass may hold (0: 2048, raised to the
    model's positions). threads: 0 for every core.
    max_length: tokens a pair may hold, special tokens included; longer pairs are truncated
    as Hugging Face's tokenizer(a, b, truncation=True, max_length=...) does, as
    CrossEncoder(max_length=...) does. None: the model's max_tokens, CrossEncoder's default (the
    tokenizer's model_max_length, or a sentence-transformers folder's max_seq_length); either
    at most the model's positions (a larger value is cut to them).

    An encoder without a classification head (an embedding model) and a decoder raise
    KwkError (KWK_EUNSUPPORTED). Not thread-safe: one Reranker per thread.
    """

    def __init__(self, model, precision="preserve", threads=0, act_bits=0, batch_tokens=0,
                 max_length=None):
        self._encoder = None
        if max_length is not None and (isinstance(max_length, bool) or int(max_length) < 1):
            raise ValueError("max_length must be a positive token count or None")
        self._L = _bind()
        self._encoder = Encoder(model, precision=precision, threads=threads, act_bits=act_bits,
                                batch_tokens=batch_tokens, max_tokens=max_length)
        self.model_path = self._encoder.model_path
        self.precision = precision
        self.info = self._encoder.info
        if self.n_labels < 1:
            path = self.model_path
            self.close()
            raise KwkError("Reranker: %s has no classification head (an embedding model: "
                           "use kwker.Encoder; a reranker is a *ForSequenceClassification "
                           "checkpoint or a GGUF of pooling_type 4 with cls.output)" % path,
                           KWK_EUNSUPPORTED)
        self.max_length = self._encoder.max_tokens
        self.labels = (_labels_of(self.model_path, self.n_labels)
                       if os.path.isdir(self.model_path) else None)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self):
        enc = getattr(self, "_encoder", None)
        if enc is not None:
            enc.close()
            self._encoder = None

    def _handle(self):
        if self._encoder is None:
            raise ValueError("the Reranker is closed")
        return self._encoder._handle()

    # -- properties -------------------------------------------------------------------------

    @property
    def n_labels(self):
        """Outputs of the classification head: 1 for a reranker, the classes for a classifier."""
        return int(self._L.kwk_encoder_n_labels(self._handle()))

    @property
    def score_activation(self):
        """What predict() applies to the logits by default: "sigmoid" or "identity"
        (sentence-transformers' activation_fn in config.json; without it sigmoid for one label,
        identity for more, as CrossEncoder chooses)."""
        return SCORE_ACTS.get(self.info.score_act, str(self.info.score_act))

    @property
    def id2label(self):
        """{label id: name} from config.json, or None when the model does not say."""
        return None if self.labels is None else dict(enumerate(self.labels))

    def tokenizer(self):
        """The model's own kwker.Tokenizer."""
        if self._encoder is None:
            raise ValueError("the Reranker is closed")
        return self._encoder.tokenizer()

    # -- tokens -----------------------------------------------------------------------------

    def tokenize(self, a, b):
        """(ids, token type ids) of the pair (a, b) as the model sees it: Hugging Face's
        tokenizer(a, b, truncation=True, max_length=self.max_length)."""
        ids, types = self.tokenizer().encode_pair(a, b, max_tokens=self.max_length)
        return list(ids), list(types)

    # -- compute ----------------------------------------------------------------------------

    def logits(self, seqs, types=None):
        """The head's raw logits, float32 [n, n_labels], of token-id sequences as tokenize()
        gives them (special tokens included). types: each sequence's token type ids (None:
        all 0). Each row is bitwise the same whatever it is batched with."""
        seqs = [np.asarray(s, dtype=np.int64).ravel() for s in seqs]
        n_labels = self.n_labels
        out = np.empty((len(seqs), n_labels), dtype=np.float32)
        if not seqs:
            return out
        lens = [len(s) for s in seqs]
        offs = np.zeros(len(seqs) + 1, dtype=np.int64)
        offs[1:] = np.cumsum(lens)
        if offs[-1] >= 1 << 31:
            raise ValueError("too many tokens in one call (%d)" % offs[-1])
        flat = np.concatenate(seqs)
        if flat.size and (flat.min() < -(1 << 31) or flat.max() >= 1 << 31):
            raise KwkError("token id out of range [0, %d)" % self.info.n_vocab, -10005)
        ids = np.ascontiguousarray(flat, dtype=np.int32)
        tp = None
        if types is not None:
            if len(types) != len(seqs):
                raise ValueError("types must hold one sequence per sequence of ids")
            tflat = np.concatenate([np.asarray(t, dtype=np.int64).ravel() for t in types])
            if [len(t) for t in types] != lens:
                raise ValueError("each sequence's types must be as long as its ids")
            if tflat.size and (tflat.min() < 0 or tflat.max() >= 1 << 31):
                raise KwkError("token type id out of range", -10005)
            tp = np.ascontiguousarray(tflat, dtype=np.int32)
        offs32 = np.ascontiguousarray(offs, dtype=np.int32)
        err = KwkErr()
        rc = self._L.kwk_encoder_classify(
            self._handle(), ids.ctypes.data_as(_I32P),
            tp.ctypes.data_as(_I32P) if tp is not None else None,
            offs32.ctypes.data_as(_I32P), len(seqs), out.ctypes.data_as(_F32P),
            ctypes.byref(err))
        if rc < 0:
            self._encoder._raise(rc, err, "classify")
        return out

    def _activate(self, logits, activation, apply_softmax):
        if activation is None or activation is True:
            act = self.score_activation
        elif activation is False:
            act = "identity"
        elif activation in ("sigmoid", "identity"):
            act = activation
        else:
            raise ValueError("activation must be True / None (the model's: %s), False (the "
                             "logits), \"sigmoid\" or \"identity\", not %r"
                             % (self.score_activation, activation))
        scores = _sigmoid(logits) if act == "sigmoid" else logits
        if apply_softmax and scores.shape[1] > 1:
            scores = _softmax(scores)
        return scores

    def predict(self, pairs, batch_size=32, activation=True, apply_softmax=False):
        """Scores of (a, b) text pairs, as CrossEncoder.predict gives them.

        pairs: a list of pairs (a list / tuple of two strings each; a [n, 2] string array), or
        one pair. Each pair is tokenized as tokenize() does (truncated to max_length).
        activation: True or None applies the model's score activation (score_activation:
        sigmoid or identity); False gives the raw logits; "sigmoid" / "identity" choose.
        apply_softmax: with more than one label, a softmax over the labels after the
        activation. batch_size: pairs per call into the library (scores do not depend on it).
        Returns float32 numpy: [n] for one label, [n, n_labels] for more ([0] / [0, n_labels]
        for no pairs); one pair gives a scalar ([n_labels] for more labels).
        A pair's score is bitwise the same whatever it is batched with.
        """
        if isinstance(pairs, np.ndarray):  # a 1-D array of two strings is one pair
            pairs = pairs.tolist()
        single = _is_pair(pairs)
        items = [pairs] if single else list(pairs)
        if batch_size is None or int(batch_size) < 1:
            raise ValueError("batch_size must be >= 1")
        for p in items:
            if not _is_pair(p):
                raise TypeError("a pair must be two strings (a list or tuple), not %r"
                                % (p if isinstance(p, (list, tuple)) else type(p).__name__,))
        parts = []
        for start in range(0, len(items), int(batch_size)):
            enc = [self.tokenize(a, b) for a, b in items[start:start + int(batch_size)]]
            parts.append(self.logits([e[0] for e in enc], [e[1] for e in enc]))
        logits = np.concatenate(parts) if parts else \
            np.empty((0, self.n_labels), dtype=np.float32)
        scores = self._activate(logits, activation, apply_softmax)
        if scores.shape[1] == 1:
            scores = scores[:, 0]
        return scores[0] if single else scores

    def rank(self, query, documents, top_k=None, return_documents=False, batch_size=32,
             activation=True):
        """The documents ordered by their score for query, highest first, as CrossEncoder.rank
        gives them: a list of {"corpus_id": index in documents, "score": float} (and "text":
        the document when return_documents), top_k of them (None: all). Equal scores keep the
        documents' order. Only for one-label models (KwkError KWK_EUNSUPPORTED otherwise, as
        CrossEncoder refuses)."""
        if self.n_labels != 1:
            raise KwkError("rank() needs a one-label model (this one has %d labels: use "
                           "predict())" % self.n_labels, KWK_EUNSUPPORTED)
        if isinstance(documents, (str, bytes)):
            raise TypeError("documents must be a list of strings, not one string")
        documents = list(documents)
        scores = self.predict([[query, d] for d in documents], batch_size=batch_size,
                              activation=activation)
        order = np.argsort(-scores.astype(np.float64), kind="stable")
        if top_k is not None:
            order = order[:max(int(top_k), 0)]
        out = []
        for i in order:
            row = {"corpus_id": int(i), "score": float(scores[i])}
            if return_documents:
                row["text"] = documents[i]
            out.append(row)
        return out

    def __repr__(self):
        if self._encoder is None:
            return "Reranker(%r, closed)" % self.model_path
        return "Reranker(%r, precision=%r, n_labels=%d, max_length=%d, activation=%r)" % (
            self.model_path, self.precision, self.n_labels, self.max_length,
            self.score_activation)
