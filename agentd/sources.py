"""Where each engine comes from: the pip arguments per engine and variant, and where it goes.

Every URL, index and extra argument comes from agent.yaml's ``install``
(``agentd.config.InstallConfig``), so a mirror or an air-gapped site changes
configuration, not code. The sources, per the engines' own install pages, are
listed in docs/engines.md.
"""

from __future__ import annotations

import json
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from agentd import builds
from agentd.config import InstallConfig


@dataclass(frozen=True)
class Plan:
    """What pip is asked for one engine and variant: ``pip install <args>`` with ``env``."""

    engine: str
    version: str
    variant: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    dist: str = ""  # the distribution whose version is the engine's
    # llama.cpp: also build llama-server and ggml-rpc-server (agentd.llamatools)
    # with these cmake arguments; None builds nothing.
    tools: str | None = None

    def fingerprint(self) -> str:
        extra = [] if self.tools is None else [self.tools]
        return json.dumps([self.args, self.env, *extra], sort_keys=True)


class PlanError(ValueError):
    """No install is possible as asked (a cu129 build without a version)."""


def pip_plan(
    engine: str, version: str, variant: str, cfg: InstallConfig, arch: str | None = None
) -> Plan:
    """The pip arguments for one engine and variant. Everything site-specific comes from cfg."""
    arch = arch or platform.machine()
    common: list[str] = []
    if cfg.index_url:
        common += ["--index-url", cfg.index_url]
    for url in cfg.extra_index_urls:
        common += ["--extra-index-url", url]
    common += list(cfg.pip_args) + list(cfg.engine_pip_args.get(engine, []))
    pin = f"=={version}" if version else ""
    if engine == "vllm":
        if variant == builds.CU129:
            if not version:
                raise PlanError("vLLM's CUDA 12.9 build needs a version: its wheel URL names one")
            wheel = cfg.vllm_cu129_wheel.format(version=version, arch=arch)
            # torch (and the rest of vLLM's CUDA 12.9 stack) from PyTorch's cu129 index.
            args = [wheel, "--extra-index-url", cfg.torch_cu129_index]
            return Plan(engine, version, variant, [*args, *common], dist="vllm")
        return Plan(engine, version, variant, [f"vllm{pin}", *common], dist="vllm")
    if engine == "llamacpp":
        spec = f"llama-cpp-python[server]{pin}"
        if variant == builds.CUDA:
            # llama-cpp-python compiles llama.cpp; CMAKE_ARGS turns on its CUDA backend
            # (llama-cpp-python's README). A CPU build in pip's wheel cache was built
            # from the same source file and would be reused: not for this one.
            env = {"CMAKE_ARGS": cfg.llamacpp_cuda_cmake_args, "FORCE_CMAKE": "1"}
            args = [spec, "--no-cache-dir", *common]
            tools = cfg.llamacpp_cuda_cmake_args if cfg.llamacpp_multinode else None
            return Plan(engine, version, variant, args, env, "llama-cpp-python", tools)
        tools = "" if cfg.llamacpp_multinode else None
        return Plan(engine, version, variant, [spec, *common], {}, "llama-cpp-python", tools)
    if engine == "sglang":
        # SGLang's install page: `pip install sglang` (its default wheels are for CUDA).
        return Plan(engine, version, variant, [f"sglang{pin}", *common], dist="sglang")
    raise PlanError(f"this agent does not install engine '{engine}'")


def env_dir(root: Path, engine: str, version: str, variant: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", f"{engine}-{version or 'latest'}-{variant}")
    return root / safe


def describe(
    engine: str, version: str, variant: str, state: str, detail: str, progress: int | None
) -> str:
    """One engine's install as operators read it, in every listing:
    "vllm 0.11.2 cu129 installing (downloading, 42 %)", "vllm 0.11.2 cu13 failed: …"."""
    text = " ".join(p for p in (engine, version, variant, state) if p)
    first = detail.splitlines()[0] if detail else ""
    if state == "installing":
        extra = [first] if first else []
        if progress is not None:
            extra.append(f"{progress} %")
        if extra:
            text += f" ({', '.join(extra)})"
    elif state in ("failed", "unsupported") and first:
        text += f": {first}"
    elif state == "installed" and first:
        text += f" ({first})"  # e.g. the build auto settled on, and why
    return text
