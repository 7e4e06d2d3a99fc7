"""A tiny llama GGUF with random weights, written with the standard library.

``python -m agentd.tinygguf OUT.gguf [--layers N --embd N --ff N --ctx N --seed N]``
``python -m agentd.tinygguf --lora OUT.gguf [--seed N --rank N]`` (a LoRA adapter for it)

What it says is noise, but real llama.cpp loads and serves it on a CPU in
milliseconds, so every byte of the path a request takes is real: the agent starts
llama.cpp's server on it to verify an install (the agent has no numpy or gguf
package), and the dev stack, the tests and the benchmarks serve it. The tokenizer is
a SentencePiece-style vocabulary with byte fallback, so any text tokenizes; the same
seed gives the same bytes. The file is the GGUF v3 layout (ggml's docs/gguf.md): a
header, key-value metadata, tensor descriptions, then each tensor's float32 data
aligned to 32 bytes. About half a megabyte at the default sizes.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
from array import array
from pathlib import Path

N_EMBD, N_HEAD, N_FF, N_LAYER, N_CTX, VOCAB_SIZE = 64, 4, 128, 2, 2048, 512
ALIGN = 32
# GGUF value types
U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, UNUSED, BYTE = 1, 2, 3, 5, 6
# Common pieces after the byte tokens; the rest of the text falls back to bytes.
WORDS = (
    "the of and to in is it you that he was for on are with as his they at be this from "
    "have or by one had not but what all were when we there can an your which their said "
    "if do will each about how up out them then she many some so these would other into "
    "has more her two like him see time could no make than first been its who now people "
    "my made over did down only way find use may water long little very after words called "
    "just where most know get through back much before go good new write our used me man "
    "too any day same right look think also around another came come work three word must "
    "because does part even place well such here take why things help put years different "
    "away again off went old number great tell men say small every found still between name "
    "should home big give air line set own under read last never us left end along while "
    "might next sound below saw something thought both few those always looked show large "
    "often together asked house don world going want school important until form food keep "
    "children feet land side without boy once animals life enough took sometimes four head "
    "above kind began almost live page got earth need far hand high year mother light parts "
    "country father let night following picture being study second eyes soon times story "
    "boys since white days ever paper hard near sentence better best across during today"
).split()


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _value(kind: int, value) -> bytes:
    if kind == STRING:
        return _str(value)
    return struct.pack({U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}[kind], value)


def _kv(key: str, kind: int, value) -> bytes:
    if isinstance(value, list):
        out = _str(key) + struct.pack("<IIQ", ARRAY, kind, len(value))
        return out + b"".join(_value(kind, v) for v in value)
    return _str(key) + struct.pack("<I", kind) + _value(kind, value)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: control tokens, 256 byte tokens, then pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * 3 + [-1000.0] * 256  # SentencePiece prefers the higher score
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["▁", *letters, *("▁" + c for c in letters), *"0123456789.,!?'\"-:;()"]
    for piece in list(dict.fromkeys(pieces + ["▁" + w for w in WORDS]))[: VOCAB_SIZE - 259]:
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(float(len(piece)))  # longer pieces first, bytes last
    while len(tokens) < VOCAB_SIZE:  # a round size; the spare ids never come up
        tokens.append(f"<unused{len(tokens)}>")
        types.append(UNUSED)
        scores.append(-1e9)
    return tokens, scores, types


def write(
    path: Path | str,
    seed: int = 0,
    *,
    layers: int = N_LAYER,
    embd: int = N_EMBD,
    ff: int = N_FF,
    ctx: int = N_CTX,
) -> Path:
    """Write the model to ``path`` (whole, then renamed into place) and return it.

    Larger sizes (bench/prefix.py takes blocks of 256) make prompt processing cost
    enough to measure.
    """
    if embd % N_HEAD:
        raise ValueError(f"the embedding length must be a multiple of {N_HEAD}, not {embd}")
    rng = random.Random(seed)
    tokens, scores, types = vocabulary()
    meta = [
        _kv("general.architecture", STRING, "llama"),
        _kv("general.name", STRING, "llmgw tiny llama"),
        _kv("general.alignment", U32, ALIGN),
        _kv("general.file_type", U32, 0),  # all F32
        _kv("llama.context_length", U32, ctx),
        _kv("llama.embedding_length", U32, embd),
        _kv("llama.block_count", U32, layers),
        _kv("llama.feed_forward_length", U32, ff),
        _kv("llama.attention.head_count", U32, N_HEAD),
        _kv("llama.attention.head_count_kv", U32, N_HEAD),
        _kv("llama.rope.dimension_count", U32, embd // N_HEAD),
        _kv("llama.rope.freq_base", F32, 10000.0),
        _kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        _kv("tokenizer.ggml.model", STRING, "llama"),
        _kv("tokenizer.ggml.tokens", STRING, tokens),
        _kv("tokenizer.ggml.scores", F32, scores),
        _kv("tokenizer.ggml.token_type", I32, types),
        _kv("tokenizer.ggml.unknown_token_id", U32, 0),
        _kv("tokenizer.ggml.bos_token_id", U32, 1),
        _kv("tokenizer.ggml.eos_token_id", U32, 2),
        _kv("tokenizer.ggml.add_bos_token", BOOL, True),
        _kv("tokenizer.ggml.add_eos_token", BOOL, False),
    ]

    def weight(cols: int, rows: int) -> tuple[tuple[int, int], array]:
        # Small values keep the activations finite through the norms: noise, not NaNs.
        return _normal(rng, cols, rows, 0.02)

    def ones(n: int) -> tuple[tuple[int], array]:
        return (n,), array("f", [1.0] * n)

    tensors = {
        "token_embd.weight": weight(embd, VOCAB_SIZE),
        "output_norm.weight": ones(embd),
        "output.weight": weight(embd, VOCAB_SIZE),
    }
    for i in range(layers):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[f"blk.{i}.{name}.weight"] = weight(embd, embd)
        tensors[f"blk.{i}.attn_norm.weight"] = ones(embd)
        tensors[f"blk.{i}.ffn_norm.weight"] = ones(embd)
        tensors[f"blk.{i}.ffn_gate.weight"] = weight(embd, ff)
        tensors[f"blk.{i}.ffn_up.weight"] = weight(embd, ff)
        tensors[f"blk.{i}.ffn_down.weight"] = weight(ff, embd)
    return _write_gguf(path, meta, tensors)


def write_lora(
    path: Path | str,
    *,
    seed: int = 1,
    rank: int = 4,
    alpha: float | None = None,
    scale: float = 0.25,
    layers: int = N_LAYER,
    embd: int = N_EMBD,
    ff: int = N_FF,
) -> Path:
    """Write a LoRA adapter for the model of these sizes to ``path`` and return it.

    Pairs for attn_q, attn_v and ffn_up in every block, ``lora_a`` [cols, rank] and
    ``lora_b`` [rank, rows] as llama.cpp's loader checks them, entries drawn with
    standard deviation ``scale``: big enough that the adapter changes what the model
    says at temperature 0, and each seed changes it differently. ``alpha`` (default
    ``rank``) is stored as ``adapter.lora.alpha``; llama.cpp scales by alpha / rank.
    """
    if rank < 1:
        raise ValueError(f"the rank must be at least 1, not {rank}")
    rng = random.Random(seed)
    meta = [
        _kv("general.architecture", STRING, "llama"),
        _kv("general.type", STRING, "adapter"),
        _kv("general.name", STRING, "llmgw tiny llama lora"),
        _kv("general.alignment", U32, ALIGN),
        _kv("adapter.type", STRING, "lora"),
        _kv("adapter.lora.alpha", F32, float(rank if alpha is None else alpha)),
    ]
    tensors = {}
    for i in range(layers):
        for name, rows in (("attn_q", embd), ("attn_v", embd), ("ffn_up", ff)):
            tensors[f"blk.{i}.{name}.weight.lora_a"] = _normal(rng, embd, rank, scale)
            tensors[f"blk.{i}.{name}.weight.lora_b"] = _normal(rng, rank, rows, scale)
    return _write_gguf(path, meta, tensors)


def _normal(rng: random.Random, cols: int, rows: int, std: float) -> tuple[tuple, array]:
    # GGUF dims are columns first (ggml's ne order).
    return (cols, rows), array("f", (rng.gauss(0.0, std) for _ in range(rows * cols)))


def _write_gguf(path: Path | str, meta: list[bytes], tensors: dict) -> Path:
    """Header, metadata, tensor infos, then float32 data: whole, then renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    infos, offset = [], 0
    for name, (dims, data) in tensors.items():
        infos.append(
            _str(name)
            + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
            + struct.pack("<IQ", 0, offset)  # type F32, offset in the data section
        )
        offset += _padded(len(data) * 4)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    body = head + b"".join(meta) + b"".join(infos)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(body.ljust(_padded(len(body)), b"\0"))
        for _dims, data in tensors.values():
            if sys.byteorder == "big":  # GGUF is little-endian
                data.byteswap()
            raw = data.tobytes()
            fh.write(raw.ljust(_padded(len(raw)), b"\0"))
    os.replace(tmp, path)
    return path


def _padded(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentd.tinygguf", description=__doc__)
    parser.add_argument("out", type=Path, nargs="?", help="where to write the .gguf file")
    parser.add_argument("--lora", type=Path, metavar="OUT", help="write a LoRA adapter")
    parser.add_argument("--seed", type=int, help="default 0 for a model, 1 for an adapter")
    parser.add_argument("--rank", type=int, default=4, help="the adapter's rank")
    parser.add_argument("--layers", type=int, default=N_LAYER, help="transformer blocks")
    parser.add_argument("--embd", type=int, default=N_EMBD, help="embedding length")
    parser.add_argument("--ff", type=int, default=N_FF, help="feed-forward length")
    parser.add_argument("--ctx", type=int, default=N_CTX, help="context length")
    args = parser.parse_args(argv)
    if (args.out is None) == (args.lora is None):
        parser.error("give either OUT or --lora OUT, not both or neither")
    sizes = {"layers": args.layers, "embd": args.embd, "ff": args.ff}
    try:
        if args.lora is not None:
            seed = 1 if args.seed is None else args.seed
            path = write_lora(args.lora, seed=seed, rank=args.rank, **sizes)
        else:
            path = write(args.out, args.seed or 0, ctx=args.ctx, **sizes)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
