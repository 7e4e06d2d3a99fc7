"""A tiny llama GGUF with random weights: ``python -m fleet.devstack.tinymodel OUT.gguf``.

About half a megabyte, written in a fraction of a second, and loaded and served by
real llama.cpp on a CPU in milliseconds. What it says is noise, but every byte of
the path a request takes (gateway, agent, engine process, health, streaming) is
real, which is what the tests and the embedded demo need. The tokenizer is a
SentencePiece-style vocabulary with byte fallback, so any text tokenizes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
N_LAYER = 2
N_CTX = 2048
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
VOCAB_SIZE = 512


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: control tokens, 256 byte tokens, then pieces."""
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [T.BYTE] * 256
    pieces = ["▁"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["▁" + chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += [str(d) for d in range(10)] + list(".,!?'\"-:;()")
    pieces += ["▁" + w for w in WORDS]
    seen: set[str] = set()
    for piece in pieces:
        if piece not in seen and len(tokens) < VOCAB_SIZE:
            seen.add(piece)
            tokens.append(piece)
            types.append(T.NORMAL)
    while len(tokens) < VOCAB_SIZE:  # a round size; the spare ids never come up
        tokens.append(f"<unused{len(tokens)}>")
        types.append(T.UNUSED)
    # SentencePiece prefers the higher score: longer pieces first, bytes last.
    scores = [0.0] * 3 + [-1000.0] * 256
    scores += [
        float(len(t)) if ty == T.NORMAL else -1e9
        for t, ty in zip(tokens[259:], types[259:], strict=True)
    ]
    return tokens, scores, [int(t) for t in types]


def write_tiny_model(
    path: Path | str,
    seed: int = 0,
    *,
    layers: int = N_LAYER,
    embd: int = N_EMBD,
    ff: int = N_FF,
    ctx: int = N_CTX,
) -> Path:
    """Write the model to ``path`` and return it.

    The sizes default to the tiny model the tests use; larger ones (bench/prefix.py
    takes 8 layers of 256) make prompt processing cost enough to measure.
    """
    if embd % N_HEAD:
        raise ValueError(f"the embedding length must be a multiple of {N_HEAD}, not {embd}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()

    def weight(*shape: int) -> np.ndarray:
        # Small values keep the activations finite through the norms: noise, not NaNs.
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llmgw tiny llama")
    w.add_context_length(ctx)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(embd // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    # numpy shapes are (rows, columns) = (out, in); GGUF stores them reversed.
    w.add_tensor("token_embd.weight", weight(VOCAB_SIZE, embd))
    w.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
    w.add_tensor("output.weight", weight(VOCAB_SIZE, embd))
    kv = embd // N_HEAD * N_HEAD_KV
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(embd, embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(kv, embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(kv, embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(embd, embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(ff, embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(ff, embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(embd, ff))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet.devstack.tinymodel", description=__doc__)
    parser.add_argument("out", type=Path, help="where to write the .gguf file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=N_LAYER, help="transformer blocks")
    parser.add_argument("--embd", type=int, default=N_EMBD, help="embedding length")
    parser.add_argument("--ff", type=int, default=N_FF, help="feed-forward length")
    parser.add_argument("--ctx", type=int, default=N_CTX, help="context length")
    args = parser.parse_args(argv)
    path = write_tiny_model(
        args.out, args.seed, layers=args.layers, embd=args.embd, ff=args.ff, ctx=args.ctx
    )
    print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
