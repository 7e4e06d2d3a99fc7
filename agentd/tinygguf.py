"""A tiny llama GGUF written with the standard library, to verify a llama.cpp install.

The agent has no numpy or gguf package (agentd/requirements.txt), yet a llama.cpp
server only starts with a model, so verification needs one. This writes the same
kind of model as fleet/devstack/tinymodel.py (random weights, a SentencePiece-style
vocabulary with byte fallback) straight in the GGUF v3 layout: a header, key-value
metadata, tensor descriptions, then each tensor's float32 data aligned to 32 bytes
(ggml's docs/gguf.md). About 150 KB; llama.cpp loads it in milliseconds.
"""

from __future__ import annotations

import os
import random
import struct
import sys
from array import array
from pathlib import Path

N_EMBD, N_HEAD, N_FF, N_LAYER, N_CTX = 32, 4, 64, 1, 512
ALIGN = 32
# GGUF value types
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, value) -> bytes:
    if kind == U32:
        return struct.pack("<I", value)
    if kind == I32:
        return struct.pack("<i", value)
    if kind == F32:
        return struct.pack("<f", value)
    if kind == BOOL:
        return struct.pack("<?", value)
    if kind == STRING:
        return _str(value)
    raise ValueError(kind)


def _kv(key: str, kind: int, value) -> bytes:
    return _str(key) + struct.pack("<I", kind) + _value(kind, value)


def _kv_array(key: str, kind: int, values: list) -> bytes:
    out = _str(key) + struct.pack("<IIQ", ARRAY, kind, len(values))
    return out + b"".join(_value(kind, v) for v in values)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    pieces = ["▁"] + [chr(c) for c in range(97, 123)] + ["▁" + chr(c) for c in range(97, 123)]
    tokens += pieces
    types += [NORMAL] * len(pieces)
    scores = [0.0] * 3 + [-1000.0] * 256 + [float(len(p)) for p in pieces]
    return tokens, scores, types


def write(path: Path | str, seed: int = 0) -> Path:
    """Write the model to ``path`` (whole, then renamed into place) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    tokens, scores, types = vocabulary()
    vocab = len(tokens)
    meta = [
        _kv("general.architecture", STRING, "llama"),
        _kv("general.name", STRING, "llmgw verification model"),
        _kv("general.alignment", U32, ALIGN),
        _kv("general.file_type", U32, 0),  # all F32
        _kv("llama.context_length", U32, N_CTX),
        _kv("llama.embedding_length", U32, N_EMBD),
        _kv("llama.block_count", U32, N_LAYER),
        _kv("llama.feed_forward_length", U32, N_FF),
        _kv("llama.attention.head_count", U32, N_HEAD),
        _kv("llama.attention.head_count_kv", U32, N_HEAD),
        _kv("llama.rope.dimension_count", U32, N_EMBD // N_HEAD),
        _kv("llama.rope.freq_base", F32, 10000.0),
        _kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        _kv("tokenizer.ggml.model", STRING, "llama"),
        _kv_array("tokenizer.ggml.tokens", STRING, tokens),
        _kv_array("tokenizer.ggml.scores", F32, scores),
        _kv_array("tokenizer.ggml.token_type", I32, types),
        _kv("tokenizer.ggml.unknown_token_id", U32, 0),
        _kv("tokenizer.ggml.bos_token_id", U32, 1),
        _kv("tokenizer.ggml.eos_token_id", U32, 2),
        _kv("tokenizer.ggml.add_bos_token", BOOL, True),
        _kv("tokenizer.ggml.add_eos_token", BOOL, False),
    ]

    def weight(rows: int, cols: int) -> array:
        return array("f", (rng.gauss(0.0, 0.02) for _ in range(rows * cols)))

    def ones(n: int) -> array:
        return array("f", [1.0] * n)

    # (name, GGUF dims: columns first, data)
    tensors = [
        ("token_embd.weight", (N_EMBD, vocab), weight(vocab, N_EMBD)),
        ("output_norm.weight", (N_EMBD,), ones(N_EMBD)),
        ("output.weight", (N_EMBD, vocab), weight(vocab, N_EMBD)),
    ]
    for i in range(N_LAYER):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (N_EMBD,), ones(N_EMBD)),
            (f"blk.{i}.attn_q.weight", (N_EMBD, N_EMBD), weight(N_EMBD, N_EMBD)),
            (f"blk.{i}.attn_k.weight", (N_EMBD, N_EMBD), weight(N_EMBD, N_EMBD)),
            (f"blk.{i}.attn_v.weight", (N_EMBD, N_EMBD), weight(N_EMBD, N_EMBD)),
            (f"blk.{i}.attn_output.weight", (N_EMBD, N_EMBD), weight(N_EMBD, N_EMBD)),
            (f"blk.{i}.ffn_norm.weight", (N_EMBD,), ones(N_EMBD)),
            (f"blk.{i}.ffn_gate.weight", (N_EMBD, N_FF), weight(N_FF, N_EMBD)),
            (f"blk.{i}.ffn_up.weight", (N_EMBD, N_FF), weight(N_FF, N_EMBD)),
            (f"blk.{i}.ffn_down.weight", (N_FF, N_EMBD), weight(N_EMBD, N_FF)),
        ]
    infos, offset = [], 0
    for name, dims, data in tensors:
        infos.append(
            _str(name)
            + struct.pack("<I", len(dims))
            + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", 0, offset)  # type F32, offset in the data section
        )
        offset += _padded(len(data) * 4)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    body = head + b"".join(meta) + b"".join(infos)
    body += b"\0" * (_padded(len(body)) - len(body))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(body)
        for _name, _dims, data in tensors:
            if sys.byteorder == "big":  # GGUF is little-endian
                data.byteswap()
            raw = data.tobytes()
            fh.write(raw + b"\0" * (_padded(len(raw)) - len(raw)))
    os.replace(tmp, path)
    return path


def _padded(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
