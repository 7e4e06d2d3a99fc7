"""What a model needs in GPU memory, read from its weights' headers: GGUF and safetensors,
local, over https:// and from a hub repository, and the errors operators read."""

import json
import struct
from math import prod

import gguf
import numpy as np
import pytest

from agentd import tinygguf
from fleet.services.estimate import GIB, Estimate, EstimateError, estimate
from tests.processes.weights_server import HubRepo, WeightsServer

MIB = 1 << 20

# tinygguf's llama at these sizes, every tensor F32 (4 bytes), counted from its dimensions.
LAYERS, EMBD, FF, CTX = 3, 128, 96, 4096
VOCAB, HEADS = tinygguf.VOCAB_SIZE, tinygguf.N_HEAD
BLOCK = 4 * (4 * EMBD * EMBD + 2 * EMBD + 3 * EMBD * FF)  # attn q k v o, 2 norms, ffn ×3
WEIGHTS = 4 * (2 * VOCAB * EMBD + EMBD) + LAYERS * BLOCK  # token_embd, output, output_norm
KV_PER_TOKEN = 2 * LAYERS * HEADS * (EMBD // HEADS) * 2  # K and V, f16


def numbers(e: Estimate) -> tuple:
    """Everything but where it was read."""
    return e.weights_bytes, e.kv_bytes, e.context_tokens, e.sequences, e.layers, e.layer_bytes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return tinygguf.write(path, layers=LAYERS, embd=EMBD, ff=FF, ctx=CTX)


@pytest.fixture
def server():
    with WeightsServer() as srv:
        yield srv


# ---- GGUF ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ctx", "seqs", "text"),
    [
        (
            None,
            1,
            "needs 7.7 MiB: 1.7 MiB weights + 6.0 MiB KV cache for 4,096 tokens × 1 sequence",
        ),
        (
            8192,
            4,
            "needs 49.7 MiB: 1.7 MiB weights + 48.0 MiB KV cache for 8,192 tokens × 4 sequences",
        ),
        (
            131072,
            64,
            "needs 12.0 GB: 0.0 weights + 12.0 KV cache for 131,072 tokens × 64 sequences",
        ),
    ],
)
def test_a_gguf_file_states_its_weights_blocks_and_kv_cache(tiny, ctx, seqs, text):
    e = estimate(str(tiny), context_tokens=ctx, sequences=seqs)

    assert e.weights_bytes == WEIGHTS
    assert e.layers == LAYERS
    assert e.layer_bytes == BLOCK
    assert e.context_tokens == (ctx or CTX)  # the model's own when not given
    assert e.kv_bytes == KV_PER_TOKEN * (ctx or CTX) * seqs
    assert e.total_bytes == WEIGHTS + e.kv_bytes
    assert e.source == f"GGUF header of {tiny}"
    assert e.text() == text


def reader_sizes(path) -> tuple[int, int]:
    """Weights and largest block by gguf's own GGUFReader: the module parses headers itself."""
    blocks: dict[str, int] = {}
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        if t.name.startswith("blk."):
            block = t.name.split(".")[1]
            blocks[block] = blocks.get(block, 0) + int(t.n_bytes)
    return sum(int(t.n_bytes) for t in reader.tensors), max(blocks.values())


def test_the_header_parser_agrees_with_gguf_s_own_reader(tiny, tmp_path):
    write_gguf(tmp_path / "m.gguf", tokens=5000)
    for path in (tiny, tmp_path / "m.gguf"):
        e = estimate(str(path))
        assert (e.weights_bytes, e.layer_bytes) == reader_sizes(path), path


def test_a_directory_with_one_gguf_is_that_file(tiny):
    assert numbers(estimate(str(tiny.parent))) == numbers(estimate(str(tiny)))


def write_gguf(path, *, tokens=0, heads=4, split=0, ctx=1024):
    """A llama GGUF written by the gguf package: 2 blocks of F16 tensors, of which block 1
    has a larger FFN, optionally a large vocabulary (header) and split into parts."""
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split)
    w.add_block_count(2)
    w.add_context_length(ctx)
    w.add_embedding_length(64)
    if heads:
        w.add_head_count(heads)
    w.add_head_count_kv(2)
    if tokens:
        w.add_token_list([f"token-{i:07d}" for i in range(tokens)])
    shapes = {"token_embd.weight": (100, 64)}
    for i, ff in enumerate((64, 256)):
        shapes |= {f"blk.{i}.attn_q.weight": (64, 64), f"blk.{i}.ffn_up.weight": (ff, 64)}
    for name, shape in shapes.items():
        w.add_tensor(name, np.zeros(shape, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 2 * sum(prod(s) for s in shapes.values()), 2 * (64 * 64 + 256 * 64)


def test_a_split_gguf_counts_every_part_and_takes_its_geometry_from_the_first(tmp_path):
    weights, block = write_gguf(tmp_path / "m.gguf", split=2)  # 5 tensors: 3 parts

    e = estimate(str(tmp_path / "m-00001-of-00003.gguf"), context_tokens=100)

    assert (e.weights_bytes, e.layer_bytes, e.layers) == (weights, block, 2)
    assert e.kv_bytes == 2 * 2 * 2 * (64 // 4) * 100 * 2  # 2 KV heads of 64/4
    assert e.source == f"GGUF headers of {tmp_path / 'm-00001-of-00003.gguf'}"
    assert numbers(estimate(str(tmp_path), context_tokens=100)) == numbers(e)


# ---- safetensors --------------------------------------------------------------------

DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4}
TENSORS = {
    "model.embed_tokens.weight": ("BF16", [1000, 64]),
    "model.norm.weight": ("F32", [64]),
    "lm_head.weight": ("F16", [1000, 64]),
}
for _i in range(3):
    TENSORS |= {
        f"model.layers.{_i}.self_attn.q_proj.weight": ("BF16", [64, 64]),
        f"model.layers.{_i}.self_attn.k_proj.weight": ("BF16", [32, 64]),
        f"model.layers.{_i}.self_attn.v_proj.weight": ("BF16", [32, 64]),
        f"model.layers.{_i}.mlp.up_proj.weight": ("F16", [128, 64]),
        f"model.layers.{_i}.input_layernorm.weight": ("F32", [64]),
    }
TENSORS["model.layers.1.mlp.gate_proj.weight"] = ("F32", [128, 64])  # the largest block
ST_WEIGHTS = sum(DTYPE_BYTES[d] * prod(s) for d, s in TENSORS.values())
ST_BLOCK = 2 * (64 * 64 + 2 * 32 * 64 + 128 * 64) + 4 * 64 + 4 * 128 * 64
CONFIG = {
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
    "max_position_embeddings": 4096,
}


def safetensors(tensors: dict) -> bytes:
    """A safetensors file: 8-byte little-endian header length, the JSON header, zeros."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        size = DTYPE_BYTES[dtype] * prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def write_model(folder, config=CONFIG, shards=1):
    folder.mkdir(parents=True, exist_ok=True)
    names = list(TENSORS)
    if shards == 1:
        (folder / "model.safetensors").write_bytes(safetensors(TENSORS))
    else:
        weight_map = {}
        for n in range(shards):
            file = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: TENSORS[k] for k in names[n::shards]}
            (folder / file).write_bytes(safetensors(part))
            weight_map |= dict.fromkeys(part, file)
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("config", "kv_per_token"),
    [
        (CONFIG, 2 * 3 * 2 * 16 * 2),  # 2 KV heads of 64/4
        ({**CONFIG, "num_key_value_heads": None}, 2 * 3 * 4 * 16 * 2),  # as many as heads
        ({**CONFIG, "head_dim": 32}, 2 * 3 * 2 * 32 * 2),
        ({"model_type": "llava", "text_config": CONFIG}, 2 * 3 * 2 * 16 * 2),
    ],
)
def test_safetensors_weights_and_kv_cache_from_the_header_and_config(
    tmp_path, config, kv_per_token
):
    folder = write_model(tmp_path / "m", config)

    e = estimate(str(folder / "model.safetensors"), sequences=3)

    assert (e.weights_bytes, e.layer_bytes, e.layers) == (ST_WEIGHTS, ST_BLOCK, 3)
    assert (e.context_tokens, e.kv_bytes) == (4096, kv_per_token * 4096 * 3)
    assert numbers(estimate(str(folder), sequences=3)) == numbers(e)


def test_a_sharded_folder_counts_the_shards_its_index_names_once(tmp_path):
    folder = write_model(tmp_path / "m", shards=2)
    (folder / "consolidated.safetensors").write_bytes(safetensors(TENSORS))  # the same again

    e = estimate(str(folder), context_tokens=10)

    assert (e.weights_bytes, e.layer_bytes) == (ST_WEIGHTS, ST_BLOCK)
    assert e.source == f"safetensors headers of {folder}"


def test_the_estimate_as_operators_and_the_api_read_it():
    e = Estimate(int(14.2 * GIB), int(3.1 * GIB), 8192, 4, 32, 400 * MIB, "GGUF header of /m")

    assert e.text() == "needs 17.3 GB: 14.2 weights + 3.1 KV cache for 8,192 tokens × 4 sequences"
    assert json.loads(json.dumps(e.as_dict())) == {
        "weights_bytes": int(14.2 * GIB),
        "kv_bytes": int(3.1 * GIB),
        "context_tokens": 8192,
        "sequences": 4,
        "layers": 32,
        "layer_bytes": 400 * MIB,
        "source": "GGUF header of /m",
        "total_bytes": int(14.2 * GIB) + int(3.1 * GIB),
        "text": e.text(),
    }


# ---- remote: only the headers are read ----------------------------------------------


def test_a_gguf_url_and_hub_file_read_as_the_local_file(tiny, server):
    data = tiny.read_bytes()
    server.files["models/tiny.gguf"] = data
    server.repos["org/tiny-GGUF"] = HubRepo("org/tiny-GGUF", {"Q8/tiny.gguf": data})
    local = numbers(estimate(str(tiny), context_tokens=8192, sequences=2))

    for path, source in [
        (server.url("models/tiny.gguf"), f"GGUF header of {server.url('models/tiny.gguf')}"),
        ("hf://org/tiny-GGUF/Q8/tiny.gguf", "GGUF header of hf://org/tiny-GGUF/Q8/tiny.gguf@main"),
        ("hf://org/tiny-GGUF", "GGUF header of hf://org/tiny-GGUF/Q8/tiny.gguf@main"),
        ("hf://org/tiny-GGUF/Q8", "GGUF header of hf://org/tiny-GGUF/Q8/tiny.gguf@main"),
    ]:
        e = estimate(path, context_tokens=8192, sequences=2, hf_endpoint=server.base)
        assert (numbers(e), e.source) == (local, source), path


def test_a_large_remote_header_is_read_in_growing_prefixes_and_no_further(tmp_path, server):
    # 150,000 tokens make a header of about 3 MiB; 64 MiB of tensor data follow it.
    sizes = write_gguf(tmp_path / "big.gguf", tokens=150_000)
    data = (tmp_path / "big.gguf").read_bytes()
    server.files["big.gguf"] = data + bytes(64 * MIB)  # tensor data past the header: unread

    e = estimate(server.url("big.gguf"))

    assert (e.weights_bytes, e.layer_bytes) == sizes
    assert numbers(e) == numbers(estimate(str(tmp_path / "big.gguf")))
    assert [r for _, _, r in server.requests] == [f"bytes=0-{n * MIB - 1}" for n in (1, 2, 4)]
    assert server.sent_once_done("/big.gguf") < 8 * MIB


def test_a_split_gguf_url_reads_every_part(tmp_path, server):
    write_gguf(tmp_path / "m.gguf", split=2)
    for part in tmp_path.iterdir():
        server.files[f"x/{part.name}"] = part.read_bytes()

    e = estimate(server.url("x/m-00001-of-00003.gguf"), context_tokens=100)

    assert numbers(e) == numbers(estimate(str(tmp_path), context_tokens=100))


def test_safetensors_from_a_hub_repository_and_a_url_with_config_beside_it(tmp_path, server):
    folder = write_model(tmp_path / "m")
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    server.repos["org/tiny"] = HubRepo("org/tiny", files)
    server.files |= {f"st/{name}": data for name, data in files.items()}
    local = numbers(estimate(str(folder), context_tokens=512, sequences=2))

    for path, source in [
        ("hf://org/tiny", "safetensors header of hf://org/tiny"),
        ("hf://org/tiny@main", "safetensors header of hf://org/tiny@main"),
        (
            "hf://org/tiny/model.safetensors",
            "safetensors header of hf://org/tiny/model.safetensors@main",
        ),
        (
            server.url("st/model.safetensors"),
            f"safetensors header of {server.url('st/model.safetensors')}",
        ),
    ]:
        e = estimate(path, context_tokens=512, sequences=2, hf_endpoint=server.base)
        assert (numbers(e), e.source) == (local, source), path


def test_a_sharded_hub_repository_is_read_through_its_index(tmp_path, server):
    folder = write_model(tmp_path / "m", shards=2)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    files["original/consolidated.safetensors"] = safetensors(TENSORS)  # not what engines load
    server.repos["org/big"] = HubRepo("org/big", files)

    e = estimate("hf://org/big", context_tokens=512, hf_endpoint=server.base)

    assert (e.weights_bytes, e.layer_bytes) == (ST_WEIGHTS, ST_BLOCK)
    assert numbers(e) == numbers(estimate(str(folder), context_tokens=512))


# ---- errors name the file and the problem -------------------------------------------


def gguf_str(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def test_bad_input_raises_an_error_naming_the_file_and_the_problem(tmp_path, server, tiny):
    (tmp_path / "notes.gguf").write_text("these are not weights\n")
    server.files["notes.gguf"] = b"these are not weights\n"
    server.files["lone/model.safetensors"] = safetensors(TENSORS)
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(tiny.read_bytes())
    (two / "b.gguf").write_bytes(tiny.read_bytes())
    (tmp_path / "nohead").mkdir()
    (tmp_path / "split").mkdir()
    write_gguf(tmp_path / "split" / "m.gguf", split=2)
    write_gguf(tmp_path / "nohead" / "m.gguf", heads=0)
    write_model(tmp_path / "noconfig").joinpath("config.json").unlink()
    (tmp_path / "model.bin").write_bytes(b"")
    (tmp_path / "cut.gguf").write_bytes(tiny.read_bytes()[:100])
    # A well-formed GGUF v3 header (1 tensor, 1 key) with a tensor type gguf does not know.
    new = b"GGUF" + struct.pack("<IQQ", 3, 1, 1)
    new += gguf_str("general.architecture") + struct.pack("<I", 8) + gguf_str("llama")
    new += gguf_str("blk.0.x") + struct.pack("<IQIQ", 1, 32, 99, 0)  # 1 dim of 32, type 99
    (tmp_path / "new.gguf").write_bytes(new)
    (tmp_path / "notes.safetensors").write_text("these are not weights either\n")
    server.repos["org/tiny"] = HubRepo("org/tiny", {"model.gguf": tiny.read_bytes()})
    cases = [
        (str(tmp_path / "nope.gguf"), f"{tmp_path / 'nope.gguf'}: no such file or directory"),
        (str(tmp_path / "notes.gguf"), f"{tmp_path / 'notes.gguf'}: not a GGUF file"),
        (server.url("notes.gguf"), f"{server.url('notes.gguf')}: not a GGUF file"),
        (
            server.url("lone/model.safetensors"),
            f"{server.url('lone/model.safetensors')} has no config.json beside it: "
            "the KV cache cannot be estimated",
        ),
        (
            str(tmp_path / "noconfig"),
            f"{tmp_path / 'noconfig'} has no config.json: the KV cache cannot be estimated",
        ),
        (
            server.url("gone.gguf"),
            f"{server.url('gone.gguf')}: no such file (the server answered 404)",
        ),
        (str(tmp_path / "cut.gguf"), f"{tmp_path / 'cut.gguf'}: the file ends inside its header"),
        (
            str(tmp_path / "new.gguf"),
            f"{tmp_path / 'new.gguf'}: tensor blk.0.x has type 99, which gguf does not know",
        ),
        (str(two), f"{two}: needs .safetensors or one .gguf file (found a.gguf, b.gguf)"),
        (
            str(tmp_path / "nohead" / "m.gguf"),
            "has no llama.attention.head_count: the KV cache cannot be estimated",
        ),
        (
            str(tmp_path / "model.bin"),
            f"{tmp_path / 'model.bin'}: not a .gguf or .safetensors file",
        ),
        (
            str(tmp_path / "notes.safetensors"),
            f"{tmp_path / 'notes.safetensors'}: not a safetensors file",
        ),
        (
            str(tmp_path / "split" / "m-00002-of-00003.gguf"),
            f"{tmp_path / 'split' / 'm-00002-of-00003.gguf'} is part 2 of a split GGUF",
        ),
        (
            "hf://org/missing",
            f"hf://org/missing (hub {server.base}): no such repository, or the token may not "
            "read it",
        ),
        ("hf://org/tiny@v9", "no revision 'v9'"),
        ("hf://org/tiny/other.gguf", "no file or folder 'other.gguf' in the repository at main"),
        ("s3://bucket/m.gguf", "unknown scheme 's3://'"),
        ("http://127.0.0.1:9/m.gguf", "http://127.0.0.1:9/m.gguf: cannot reach 127.0.0.1:9"),
    ]
    for path, problem in cases:
        with pytest.raises(EstimateError) as caught:
            estimate(path, hf_endpoint=server.base, timeout=5)
        assert problem in str(caught.value), path


def test_a_model_that_states_no_context_length_needs_one_given(tmp_path):
    write_model(tmp_path / "m", {**CONFIG, "max_position_embeddings": None})

    with pytest.raises(EstimateError, match="states no context length: give one"):
        estimate(str(tmp_path / "m"))
    assert estimate(str(tmp_path / "m"), context_tokens=100).context_tokens == 100
