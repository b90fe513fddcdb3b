"""Kwker: fast, exact language-model inference on CPUs.

A thin binding over libkwker's public C header (include/kwker.h). Importing kwker never needs
torch; torch tensors are accepted and returned where a caller passes them.
"""
import importlib

from ._lib import KwkError

__version__ = "0.1.0"

# Public names and the submodule that defines each; loaded on first use so `import kwker` stays
# cheap and a missing optional piece fails only when it is used.
_EXPORTS = {
    "KwkDecoder": "decode",
    "Encoder": "encoder",
    "Reranker": "reranker",
    "Tokenizer": "tokenizer",
    "ChatTemplate": "template",
    "Grammar": "grammar",
    "Engine": "serve",
    "install": "hf",
    "uninstall": "hf",
}
_SUBMODULES = ("decode", "encoder", "reranker", "cpu_backend", "tokenizer", "template", "grammar",
               "serve", "hf")


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module("." + _EXPORTS[name], __name__), name)
    if name in _SUBMODULES:
        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'kwker' has no attribute %r" % name)


__all__ = ["KwkError", "__version__"] + list(_EXPORTS)
