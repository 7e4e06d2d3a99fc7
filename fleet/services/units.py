"""Megabytes and gigabytes: one divisor for every comparison and every message.

Memory is compared in decimal GB: a machine's MemTotal is a little under its
nominal size, and "a 32 GB node" should still hold a profile that needs 32.
Messages use the same divisor and never round up, so a node refused for
memory never reads as if it had enough: 7,900 MB asked for 8 GB reads
"has 7.9 GB of memory, needs 8", not "has 8 GB, needs 8".

Bytes measured on a machine (resident memory, disks, what is in use) are shown
in binary units, as the kernel counts them: ``bytes_text``, for the admin and
the console alike.
"""

import math

MB_PER_GB = 1000
# GPU memory is counted as NVML and the engines count it: MiB, and GiB of 1,024.
MIB_PER_GIB = 1024


def gb_text(mb: int) -> str:
    """``mb`` in GB for people: whole when exact, else rounded down to a tenth ("7.9")."""
    if mb % MB_PER_GB == 0:
        return str(mb // MB_PER_GB)
    tenths = math.floor(mb * 10 / MB_PER_GB)
    return f"{tenths // 10}.{tenths % 10}"


def over_gpu_budget(used_mb: int | None, budget_gb: float | None) -> bool:
    """Whether a shard holds more GPU memory than its profile's share (never for whole GPUs)."""
    return bool(budget_gb and used_mb is not None and used_mb > budget_gb * MIB_PER_GIB)


def gpu_use_text(used_mb: int | None, budget_gb: float | None) -> str:
    """A shard's GPU memory against its budget: "28.1 of 30 GB", "31.2 of 30 GB: over its
    budget", "28.1 GB" on whole GPUs, "-" when not measured."""
    if used_mb is None:
        return "-" if not budget_gb else f"- of {budget_gb:g} GB"
    used = f"{used_mb / MIB_PER_GIB:.1f}"
    if not budget_gb:
        return f"{used} GB"
    text = f"{used} of {budget_gb:g} GB"
    return text + ": over its budget" if over_gpu_budget(used_mb, budget_gb) else text


BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def bytes_text(n: float | None) -> str:
    """Bytes for people in binary units ("412.0 GiB", "512 B"); "-" when unknown (never 0)."""
    if n is None:
        return "-"
    step = 0
    while abs(n) >= 1024 and step < len(BINARY_UNITS) - 1:
        n /= 1024
        step += 1
    return f"{n:.0f} B" if step == 0 else f"{n:.1f} {BINARY_UNITS[step]}"


def size_text(n: int) -> str:
    """A download's size in decimal units, as disks and hubs state them: "14.2 GB", "312 MB"."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"


def share_mb(gpu_memory_gb: float | None) -> int:
    """A profile's share of each GPU in MiB, as NVML counts GPU memory; 0: whole GPUs.

    GPU memory is in binary units, as drivers and engines report it: an "80 GB"
    H100 has 81,559 MiB, 79.6 GB here."""
    return round(gpu_memory_gb * MIB_PER_GIB) if gpu_memory_gb else 0
