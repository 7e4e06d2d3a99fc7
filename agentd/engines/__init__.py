"""Engine adapters: how to run vLLM, SGLang and llama.cpp (and the fake engine) for one shard.

``make_engines(binaries)`` is the registry the supervisor uses. The fake engine
is opt-in: it exists on a node only where ``binaries`` names a Python for it.
"""

from __future__ import annotations

from agentd.engines.base import Engine, EngineUnavailable, Launch, Probe
from agentd.engines.llamacpp import LlamaCpp
from agentd.engines.sglang import SGLang
from agentd.engines.vllm import VLLM


def engine_classes() -> dict[str, type[Engine]]:
    # The fake is imported here, not at the top: `python -m agentd.engines.fake`
    # imports this package first, and must not find itself already imported.
    from agentd.engines.fake import FakeEngine

    return {cls.name: cls for cls in (VLLM, SGLang, LlamaCpp, FakeEngine)}


def make_engines(binaries: dict[str, str] | None = None) -> dict[str, Engine]:
    """The engines this agent knows, each with the binary agent.yaml names for it, if any."""
    binaries = binaries or {}
    classes = engine_classes()
    unknown = sorted(set(binaries) - set(classes))
    if unknown:
        known = ", ".join(sorted(classes))
        raise ValueError(f"unknown engine {unknown[0]!r} in binaries; known: {known}")
    return {
        name: cls(binaries.get(name))
        for name, cls in classes.items()
        if not cls.opt_in or name in binaries
    }


__all__ = ["Engine", "EngineUnavailable", "Launch", "Probe", "engine_classes", "make_engines"]
