"""Copied by the agent into vLLM's CPU environment (``llmgw_xtile.py`` with a ``.pth`` line
that imports it), so every Python started from that environment asks Linux for the AMX
tile state before it computes.

On x86 CPUs with AMX, Linux gives a process the tile registers only once it asks
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; the kernel's
Documentation/arch/x86/xstate.rst); an AMX instruction before that is an illegal
instruction. vLLM 0.32.0's CPU build picks its AMX attention kernel for bfloat16
(vllm/v1/attention/backends/cpu_attn.py, ``_get_attn_isa``) and its workers do not ask:
the worker dies with exit code -4 at its first completion unless something else in
the process (oneDNN) happened to ask first. Asking costs one system call; on a CPU
without AMX, or elsewhere than x86-64 Linux, nothing is asked and nothing changes.
"""

import platform
import sys

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def ask() -> int | None:
    """The system call's result (0: granted), or None where it does not apply."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        with open("/proc/cpuinfo") as fh:
            if " amx_tile" not in fh.read(65536):
                return None
        import ctypes

        return ctypes.CDLL(None, use_errno=True).syscall(
            SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        )
    except (OSError, AttributeError):
        return None


ask()
