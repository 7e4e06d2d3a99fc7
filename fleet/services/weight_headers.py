"""The headers of weights files, parsed from their first bytes: GGUF and safetensors.

Pure: bytes in, tensor sizes (and a GGUF's metadata) out. A header longer than
the bytes given raises ``Short`` (the caller reads a longer prefix), one newer
than this reader knows ``Unknown``. GGUF is parsed here rather than with gguf's
GGUFReader, which maps the whole file and takes seconds over a 150,000-token
vocabulary; the tests check this parser against it. This changes with the file
formats; what is read where, and what a model needs, is ``estimate``'s.
"""

import json
import struct
from math import prod

# The largest header read: a file whose header says it is longer is refused.
MAX_HEADER = 64 << 20
# GGUF metadata value types (ggml's docs/gguf.md): struct formats of the scalars.
_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))
_STRING, _ARRAY = 8, 9


class Short(Exception):
    """The bytes read so far end inside the header: read more."""


class Unknown(Exception):
    """A well-formed header with something newer than this reader knows."""


def safetensors(buf: bytes) -> list[tuple[str, int]]:
    """Tensor sizes from a safetensors header: 8 bytes little-endian length, then JSON."""
    if len(buf) < 8:
        raise Short()
    (length,) = struct.unpack("<Q", buf[:8])
    if length > MAX_HEADER:
        raise ValueError(f"its header says it is {length:,} bytes long")
    if len(buf) < 8 + length:
        raise Short()
    header = json.loads(buf[8 : 8 + length])
    return [
        (k, v["data_offsets"][1] - v["data_offsets"][0])
        for k, v in header.items()
        if k != "__metadata__"
    ]


def gguf(buf: bytes) -> tuple[dict, list[tuple[str, int]]]:
    """A GGUF header's metadata (arrays of over 1,024 items left out) and tensor sizes."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(buf):
            raise Short()
        pos += n
        return buf[pos - n : pos]

    def num(fmt: str):
        return struct.unpack("<" + fmt, take(struct.calcsize("<" + fmt)))[0]

    def value(kind: int):
        if kind == _STRING:
            return take(num("Q")).decode("utf-8", "replace")
        if kind == _ARRAY:
            sub, n = num("I"), num("Q")
            if n > 1024 and sub in _SCALARS:  # token scores and types: skipped unread
                take(n * struct.calcsize("<" + _SCALARS[sub]))
                return None
            items = [value(sub) for _ in range(n)]
            return items if n <= 1024 else None
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata type {kind}")
        return num(_SCALARS[kind])

    if take(4) != b"GGUF":
        raise ValueError("no GGUF magic at its start")
    if (version := num("I")) not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = num("Q"), num("Q")
    meta = {}
    for _ in range(n_kv):
        key = take(num("Q")).decode("utf-8", "replace")
        meta[key] = value(num("I"))
    tensors = []
    for _ in range(n_tensors):
        name = take(num("Q")).decode("utf-8", "replace")
        dims = [num("Q") for _ in range(num("I"))]
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind := num("I"))]
        except (ValueError, KeyError):
            raise Unknown(f"tensor {name} has type {kind}, which gguf does not know") from None
        num("Q")  # the data's offset
        tensors.append((name, prod(dims) // block * size))
    return meta, tensors
