"""A tiny Llama in Hugging Face's layout, random weights, written with the standard library.

``python -m agentd.tinyhf OUT_DIR [--layers N --hidden N --seed N]``
``python -m agentd.tinyhf --lora OUT_DIR [--seed N --rank N]`` (a PEFT LoRA adapter for it)

The sibling of ``agentd.tinygguf`` for the engines that load a Hugging Face directory
(vLLM, SGLang): ``config.json`` for ``LlamaForCausalLM``, ``model.safetensors``
(float32), ``generation_config.json``, and a byte-level BPE tokenizer
(``tokenizer.json``, Hugging Face ``tokenizers``' format) with a chat template in
``tokenizer_config.json``. What it says is noise, but real vLLM loads and serves it on
a CPU in seconds, so the agent verifies a vLLM install on it, and the dev stack, the
tests and the benchmarks serve it.

Its shapes are ones every engine accepts: vLLM's CPU attention takes head sizes of
32, 64, 80, 96, 112, 128, 160, 192, 224 and 256 (a head of 16 fails the first request
with "Unsupported CPU attention configuration: head_dim=16"), so the default is a
hidden size of 128 in 2 heads of 64. The tokenizer is GPT-2's byte-level scheme: 256
byte tokens, so any text tokenizes, then merges that spell common words (one token
each), then the special tokens. The same seed gives the same bytes. About 1.5 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import tempfile
from array import array
from pathlib import Path

from agentd.tinygguf import WORDS

HIDDEN, HEADS, KV_HEADS, FF, LAYERS, CTX = 128, 2, 2, 256, 2, 4096
BOS, EOS, START, END = "<|begin_of_text|>", "<|end_of_text|>", "<|start|>", "<|end|>"
# One message per turn: "<|start|>user\nHi<|end|>\n"; the reply is asked for with
# "<|start|>assistant\n" and ends at <|end|> (or the end of text).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant\\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of every byte to a printable character (byte-level BPE's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def vocabulary() -> tuple[dict[str, int], list[list[str]], list[str]]:
    """The BPE vocabulary, its merges (each a pair), and the special tokens after them."""
    alphabet = _bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    merges: list[list[str]] = []
    space = alphabet[ord(" ")]
    for word in WORDS:
        for spelled in (space + word, word):
            # Left to right, so each word's merges build on pieces already there.
            piece = spelled[0]
            for ch in spelled[1:]:
                joined = piece + ch
                if joined not in vocab:
                    merges.append([piece, ch])
                    vocab[joined] = len(vocab)
                piece = joined
    return vocab, merges, [BOS, EOS, START, END]


def tokenizer_json() -> dict:
    vocab, merges, specials = vocabulary()
    added = [
        {"id": len(vocab) + i, "content": tok, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i, tok in enumerate(specials)
    ]  # fmt: skip
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {"type": "ByteLevel", **byte_level, "trim_offsets": False},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def vocab_size() -> int:
    vocab, _merges, specials = vocabulary()
    return len(vocab) + len(specials)


def write(
    directory: Path | str,
    seed: int = 0,
    *,
    layers: int = LAYERS,
    hidden: int = HIDDEN,
    ff: int = FF,
    ctx: int = CTX,
) -> Path:
    """Write the model into ``directory`` (made whole beside it, then renamed into place)
    and return it. An existing directory is left as it is."""
    directory = Path(directory)
    if hidden % HEADS:
        raise ValueError(f"the hidden size must be a multiple of {HEADS}, not {hidden}")
    if directory.is_dir():
        return directory
    rng = random.Random(seed)
    n_vocab = vocab_size()
    ids = {tok: n_vocab - 4 + i for i, tok in enumerate((BOS, EOS, START, END))}
    head = hidden // HEADS
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_vocab,
        "hidden_size": hidden,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": head,
        "hidden_act": "silu",
        "max_position_embeddings": ctx,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": ids[BOS],
        "eos_token_id": [ids[EOS], ids[END]],
        "torch_dtype": "float32",
    }
    generation = {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids[END]]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": END,
        "pad_token": EOS,
        "add_bos_token": False,
        "model_max_length": ctx,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }

    def weight(rows: int, cols: int) -> tuple[list[int], array]:
        # Small values keep the activations finite through the norms: noise, not NaNs.
        return _normal(rng, rows, cols, 0.02)

    def ones(n: int) -> tuple[list[int], array]:
        return [n], array("f", [1.0] * n)

    kv = KV_HEADS * head
    tensors = {"model.embed_tokens.weight": weight(n_vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = ones(hidden)
        tensors[p + "post_attention_layernorm.weight"] = ones(hidden)
        tensors[p + "self_attn.q_proj.weight"] = weight(hidden, hidden)
        tensors[p + "self_attn.k_proj.weight"] = weight(kv, hidden)
        tensors[p + "self_attn.v_proj.weight"] = weight(kv, hidden)
        tensors[p + "self_attn.o_proj.weight"] = weight(hidden, hidden)
        tensors[p + "mlp.gate_proj.weight"] = weight(ff, hidden)
        tensors[p + "mlp.up_proj.weight"] = weight(ff, hidden)
        tensors[p + "mlp.down_proj.weight"] = weight(hidden, ff)
    tensors["model.norm.weight"] = ones(hidden)
    tensors["lm_head.weight"] = weight(n_vocab, hidden)
    files = {
        "config.json": _json(config),
        "generation_config.json": _json(generation),
        "tokenizer.json": _json(tokenizer_json()),
        "tokenizer_config.json": _json(tokenizer_config),
        "special_tokens_map.json": _json({"bos_token": BOS, "eos_token": END, "pad_token": EOS}),
        "model.safetensors": safetensors(tensors),
    }
    return _write_dir(directory, files)


def write_lora(
    directory: Path | str,
    *,
    seed: int = 1,
    rank: int = 8,
    scale: float = 0.25,
    layers: int = LAYERS,
    hidden: int = HIDDEN,
) -> Path:
    """A PEFT LoRA adapter for the default model: ``adapter_config.json`` and
    ``adapter_model.safetensors`` with A and B for q_proj and v_proj in every layer."""
    directory = Path(directory)
    if rank < 1:
        raise ValueError(f"the rank must be at least 1, not {rank}")
    if directory.is_dir():
        return directory
    rng = random.Random(seed)
    kv = KV_HEADS * (hidden // HEADS)
    tensors = {}
    for i in range(layers):
        for name, rows in (("q_proj", hidden), ("v_proj", kv)):
            p = f"base_model.model.model.layers.{i}.self_attn.{name}."
            tensors[p + "lora_A.weight"] = _normal(rng, rank, hidden, scale)
            tensors[p + "lora_B.weight"] = _normal(rng, rows, rank, scale)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    files = {
        "adapter_config.json": _json(config),
        "adapter_model.safetensors": safetensors(tensors),
    }
    return _write_dir(directory, files)


def safetensors(tensors: dict[str, tuple[list[int], array]]) -> bytes:
    """The safetensors layout: the header's length (u64, little-endian), the JSON header
    naming each tensor's dtype, shape and byte range, then the data."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    chunks, offset = [], 0
    for name, (shape, values) in tensors.items():
        raw = values.tobytes() if sys.byteorder == "little" else _swapped(values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def _swapped(values: array) -> bytes:
    copy = array("f", values)
    copy.byteswap()
    return copy.tobytes()


def _normal(rng: random.Random, rows: int, cols: int, std: float) -> tuple[list[int], array]:
    return [rows, cols], array("f", (rng.gauss(0.0, std) for _ in range(rows * cols)))


def _json(data: dict) -> bytes:
    return json.dumps(data, indent=1, ensure_ascii=False).encode()


def _write_dir(directory: Path, files: dict[str, bytes]) -> Path:
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; weights are read by the engine's user
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    try:
        os.rename(tmp, directory)
    except OSError:  # another writer got there first: theirs is the same bytes
        for name in files:
            (tmp / name).unlink()
        tmp.rmdir()
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentd.tinyhf", description=__doc__)
    parser.add_argument("out", type=Path, help="the directory to write (left alone if it exists)")
    parser.add_argument("--lora", action="store_true", help="write a LoRA adapter instead")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args(argv)
    sizes = {"layers": args.layers, "hidden": args.hidden}
    if args.lora:
        seed = 1 if args.seed is None else args.seed
        out = write_lora(args.out, seed=seed, rank=args.rank, **sizes)
    else:
        out = write(args.out, 0 if args.seed is None else args.seed, **sizes)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
