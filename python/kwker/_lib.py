"""Finds and loads libkwker; the ctypes prototypes live beside the Python class that uses them."""
import ctypes
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_lib = None


class KwkErr(ctypes.Structure):
    """struct kwk_err from include/kwker.h."""
    _fields_ = [
        ("code", ctypes.c_int),
        ("pos", ctypes.c_int64),
        ("line", ctypes.c_int),
        ("col", ctypes.c_int),
        ("msg", ctypes.c_char * 512),
    ]

    def text(self):
        return self.msg.decode("utf-8", "replace")


class KwkError(RuntimeError):
    """A libkwker call failed; .code is the kwk_status, str() the library's message."""

    def __init__(self, message, code=0, pos=-1):
        super().__init__(message)
        self.code = code
        self.pos = pos


class Closing:
    """A handle's owner whose close() frees it: closed as a context manager's exit and when
    collected (an error while collecting is dropped, as Python drops it anyway)."""

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _candidates():
    env = os.environ.get("KWKER_LIB")
    if env:
        yield Path(env)
    yield _HERE / "libkwker.so"
    root = _HERE.parent.parent
    for build in ("build", "build-asan"):
        yield root / build / "libkwker.so"


def lib():
    """The loaded shared library (loaded once)."""
    global _lib
    if _lib is None:
        tried = []
        for cand in _candidates():
            tried.append(str(cand))
            if cand.exists():
                _lib = ctypes.CDLL(str(cand))
                break
        if _lib is None:
            raise ImportError("libkwker.so not found (tried: %s); build it with scripts/build "
                              "or set KWKER_LIB" % ", ".join(tried))
        _lib.kwk_status_str.restype = ctypes.c_char_p
        _lib.kwk_status_str.argtypes = [ctypes.c_int]
    return _lib


def raise_err(err, what=""):
    msg = err.text() or lib().kwk_status_str(err.code).decode()
    raise KwkError((what + ": " if what else "") + msg, err.code, err.pos)


def check(rc, what=""):
    if rc < 0:
        raise KwkError("%s%s" % (what + ": " if what else "", lib().kwk_status_str(rc).decode()), rc)
    return rc


def executable():
    """Path of the kwker CLI binary shipped with the package (or the build tree's)."""
    for cand in (_HERE / "bin" / "kwker", _HERE.parent.parent / "build" / "kwker"):
        if cand.exists():
            return str(cand)
    raise FileNotFoundError("kwker binary not found")


def main():
    """Console entry point: exec the C program."""
    exe = executable()
    os.execv(exe, [exe] + sys.argv[1:])
