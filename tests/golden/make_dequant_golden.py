"""Golden data for tests/c/test_dequant.c: random blocks of each ggml type and their values as
dequantized by the gguf Python package (gguf.quants.dequantize), the reference for llama.cpp's
formats.

Each file tests/golden/dequant/<TYPE>.bin is: uint32 n (elements, little-endian), the raw
bytes of n elements of that type, then n float32 values. Run from the repository root:
    python tests/golden/make_dequant_golden.py
"""
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dequant")

# Byte offsets of the float16 scale fields inside one block of each type.
HALF_FIELDS = {
    T.Q8_0: [0], T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def random_blocks(rng, qtype, n_blocks):
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        # realistic finite scales, some negative; block 1 has a zero scale
        d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
        if off == HALF_FIELDS[qtype][0]:
            d[1] = 0
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1), block * n_blocks


def half_patterns(rng):
    special = [0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0x7c00, 0xfc00,
               0x7e00, 0x8001, 0x83ff]
    bits = np.concatenate([np.array(special, dtype=np.uint16),
                           rng.integers(0, 65536, size=243, dtype=np.uint16)])
    return bits


def write(name, raw, values):
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    with open(os.path.join(OUT, name + ".bin"), "wb") as f:
        f.write(struct.pack("<I", values.size))
        f.write(raw.tobytes())
        f.write(values.astype("<f4").tobytes())


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261129)
    for qtype in HALF_FIELDS:
        n_blocks = 3 if GGML_QUANT_SIZES[qtype][0] == 256 else 8
        raw, n = random_blocks(rng, qtype, n_blocks)
        write(qtype.name, raw, dequantize(raw.reshape(1, -1), qtype))
    h = half_patterns(rng)
    write("F16", h.view(np.uint8), dequantize(h.view(np.uint8).reshape(1, -1), T.F16))
    write("BF16", h.view(np.uint8), dequantize(h.view(np.uint8).reshape(1, -1), T.BF16))
    f = rng.standard_normal(64).astype(np.float32)
    write("F32", f.view(np.uint8), dequantize(f.view(np.uint8).reshape(1, -1), T.F32))


if __name__ == "__main__":
    main()
