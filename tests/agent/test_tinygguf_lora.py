"""The tiny model's LoRA adapter (agentd/tinygguf.py): the gguf package reads it with the
keys and the tensor shapes llama.cpp's adapter loader checks, and the same seed gives the
same bytes."""

from gguf import GGMLQuantizationType, GGUFReader

from agentd.tinygguf import N_EMBD, N_FF, N_LAYER, main, write_lora


def fields(reader: GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


def test_the_adapter_has_the_keys_and_the_shapes_llama_cpp_checks(tmp_path):
    reader = GGUFReader(write_lora(tmp_path / "lora.gguf"))
    meta = fields(reader)
    assert meta["GGUF.version"] == 3
    assert meta["general.architecture"] == "llama"
    assert meta["general.type"] == "adapter"
    assert meta["adapter.type"] == "lora"
    assert meta["adapter.lora.alpha"] == 4.0  # the rank, so llama.cpp scales by 1
    shapes = {t.name: t.shape.tolist() for t in reader.tensors}
    expected = {}
    for i in range(N_LAYER):
        # a model tensor ne=[ne0, ne1]: lora_a ne=[ne0, rank], lora_b ne=[rank, ne1]
        for name, rows in (("attn_q", N_EMBD), ("attn_v", N_EMBD), ("ffn_up", N_FF)):
            expected[f"blk.{i}.{name}.weight.lora_a"] = [N_EMBD, 4]
            expected[f"blk.{i}.{name}.weight.lora_b"] = [4, rows]
    assert shapes == expected
    for tensor in reader.tensors:
        assert tensor.tensor_type == GGMLQuantizationType.F32
        assert tensor.data_offset % 32 == 0
        assert abs(tensor.data).max() > 0.1  # big enough to change what the model says


def test_the_command_writes_one_with_the_rank_and_sizes_asked_for(tmp_path, capsys):
    out = tmp_path / "loras" / "a.gguf"
    assert main(["--lora", str(out), "--seed", "2", "--rank", "8", "--embd", "32"]) == 0
    assert str(out) in capsys.readouterr().out
    reader = GGUFReader(out)
    assert fields(reader)["adapter.lora.alpha"] == 8.0
    shapes = {t.name: t.shape.tolist() for t in reader.tensors}
    assert shapes["blk.0.attn_q.weight.lora_a"] == [32, 8]
    assert shapes["blk.1.ffn_up.weight.lora_b"] == [8, N_FF]
    assert out.read_bytes() == write_lora(tmp_path / "b.gguf", seed=2, rank=8, embd=32).read_bytes()


def test_same_seed_same_bytes(tmp_path):
    a = write_lora(tmp_path / "a.gguf", seed=3).read_bytes()
    b = write_lora(tmp_path / "b.gguf", seed=3).read_bytes()
    c = write_lora(tmp_path / "c.gguf", seed=4).read_bytes()
    assert a == b
    assert a != c
    assert len(a) == len(c)
