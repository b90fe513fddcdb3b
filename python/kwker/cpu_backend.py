"""What the CPU backend offers on this machine."""
from ._lib import lib


def decoder_available():
    """True when libkwker loads and its decoder entry points are present."""
    try:
        L = lib()
    except (ImportError, OSError):
        return False
    return all(hasattr(L, name) for name in ("kwk_model_load", "kwk_decoder_new",
                                              "kwk_decoder_eval"))


def isa():
    """The kernel instruction set in use: "scalar", "avx2" or "avx512"."""
    L = lib()
    L.kwk_isa_name.restype = __import__("ctypes").c_char_p
    return L.kwk_isa_name(L.kwk_isa()).decode()
