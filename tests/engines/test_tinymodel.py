"""The generated tiny model is a llama GGUF a few hundred KB big, the same for the same seed."""

import subprocess
import sys

import gguf

from fleet.devstack.tinymodel import N_LAYER, VOCAB_SIZE, write_tiny_model
from tests.processes import ROOT


def test_command_writes_a_llama_gguf(tmp_path):
    out = tmp_path / "models" / "tiny.gguf"
    done = subprocess.run(
        [sys.executable, "-m", "fleet.devstack.tinymodel", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(out) in done.stdout
    assert 100_000 < out.stat().st_size < 1_000_000
    reader = gguf.GGUFReader(out)
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == VOCAB_SIZE
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", f"blk.{N_LAYER - 1}.ffn_down.weight"} <= names


def test_same_seed_same_bytes(tmp_path):
    a = write_tiny_model(tmp_path / "a.gguf", seed=7).read_bytes()
    b = write_tiny_model(tmp_path / "b.gguf", seed=7).read_bytes()
    c = write_tiny_model(tmp_path / "c.gguf", seed=8).read_bytes()
    assert a == b
    assert a != c


def test_a_bigger_one_for_benchmarks_has_the_layers_and_context_asked_for(tmp_path):
    out = tmp_path / "bigger.gguf"
    argv = ["--layers", "3", "--embd", "128", "--ff", "256", "--ctx", "4096"]
    subprocess.run(
        [sys.executable, "-m", "fleet.devstack.tinymodel", str(out), *argv], cwd=ROOT, check=True
    )
    reader = gguf.GGUFReader(out)

    def value(name):
        field = reader.fields[name]
        return int(field.parts[field.data[0]][0])

    assert value("llama.block_count") == 3
    assert value("llama.embedding_length") == 128
    assert value("llama.context_length") == 4096
    assert "blk.2.ffn_down.weight" in {t.name for t in reader.tensors}
    assert out.stat().st_size > write_tiny_model(tmp_path / "tiny.gguf").stat().st_size
