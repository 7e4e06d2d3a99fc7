"""The tiny model (agentd/tinygguf.py): real llama.cpp loads it with the sizes asked
for, any text tokenizes and it answers; the same seed gives the same bytes."""

import subprocess
import sys

from llama_cpp import Llama

from agentd.tinygguf import N_CTX, N_EMBD, N_LAYER, VOCAB_SIZE, write
from tests.processes import ROOT


def cli(*argv) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "agentd.tinygguf", *map(str, argv)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def load(path) -> Llama:
    return Llama(str(path), n_ctx=256, seed=1, verbose=False)


def test_command_writes_a_model_llama_cpp_loads_and_answers(tmp_path):
    out = tmp_path / "models" / "tiny.gguf"
    done = cli(out)
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout
    assert 100_000 < out.stat().st_size < 1_000_000
    llm = load(out)
    assert llm.n_vocab() == VOCAB_SIZE
    assert llm.n_embd() == N_EMBD
    assert llm.metadata["general.architecture"] == "llama"
    assert llm.metadata["llama.block_count"] == str(N_LAYER)
    assert llm.metadata["llama.context_length"] == str(N_CTX)
    # any text tokenizes (byte fallback) and comes back whole
    text = "Hello, wörld ☃ — 123 {the} time\n\tend"
    tokens = llm.tokenize(text.encode())
    assert llm.detokenize(tokens).decode() == text
    answer = llm("the time", max_tokens=4, temperature=0)
    assert answer["usage"]["completion_tokens"] == 4
    assert answer["choices"][0]["text"]


def test_same_seed_same_bytes(tmp_path):
    a = write(tmp_path / "a.gguf", seed=7).read_bytes()
    b = write(tmp_path / "b.gguf", seed=7).read_bytes()
    c = write(tmp_path / "c.gguf", seed=8).read_bytes()
    assert a == b
    assert a != c


def test_a_bigger_one_for_benchmarks_has_the_layers_and_context_asked_for(tmp_path):
    out = tmp_path / "bigger.gguf"
    done = cli(out, "--layers", 3, "--embd", 128, "--ff", 256, "--ctx", 4096)
    assert done.returncode == 0, done.stderr
    llm = load(out)
    assert llm.n_embd() == 128
    assert llm.metadata["llama.block_count"] == "3"
    assert llm.metadata["llama.feed_forward_length"] == "256"
    assert llm.metadata["llama.context_length"] == "4096"
    assert llm("the", max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2
    assert out.stat().st_size > write(tmp_path / "tiny.gguf").stat().st_size


def test_an_embedding_length_the_heads_do_not_divide_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "odd.gguf"
    done = cli(out, "--embd", 30)
    assert done.returncode == 2
    assert "embedding length must be a multiple of 4, not 30" in done.stderr
    assert list(tmp_path.iterdir()) == []
