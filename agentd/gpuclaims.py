"""Memory that programs claim in the NVML double, and the check that refuses what is not free.

Processes hold GPU memory as a driver lists them: ``processes`` in the file
(someone else's job, say), and claims that running programs write as
``<file>.processes/<pid>.json`` (``{"GPU-uuid": bytes}``; ``claim()`` below).
A claim counts while its process lives, as the driver frees a process's memory
when it exits; each GPU's memory used is ``memory_used_bytes`` plus what its
processes hold.

The fake engine claims through ``take()``, which refuses, as CUDA does, memory
the GPU does not have free: the check and the claim happen under one lock
(``<file>.lock``), so fake engines starting or waking together on one GPU
cannot both take its last gigabytes. Every claim written also raises
``<file>.peak.json`` (``{"GPU-uuid": bytes}``) to the most bytes the claims
held at once on each GPU, so a test can say afterwards that no moment had
more memory awake than the GPU has.

This module changes when how programs claim memory in the double changes; the
double itself (pynvml's functions, reading the file) is ``agentd.nvml_double``,
which counts these claims in each GPU's memory used. It needs no pynvml.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path


def claims_dir(path: Path) -> Path:
    return Path(f"{path}.processes")


def peak_path(path: Path) -> Path:
    return Path(f"{path}.peak.json")


class OutOfMemory(Exception):
    """A claim the GPU has no room for: nothing was claimed."""

    def __init__(self, uuid: str, wanted: int, free: int, total: int):
        super().__init__(f"{uuid}: {wanted} bytes wanted, {free} of {total} free")
        self.uuid, self.wanted, self.free, self.total = uuid, wanted, free, total


def claim(path: Path, pid: int, by_uuid: dict[str, int]) -> None:
    """Record that process ``pid`` holds ``by_uuid`` bytes on those GPUs (replaces its
    claim; ``{}`` releases it), whether or not they fit."""
    with _locked(path):
        _write_claim(path, pid, by_uuid)


def take(path: Path, pid: int, by_uuid: dict[str, int]) -> None:
    """Claim as ``claim()`` does where every GPU has that much free beside what the others
    hold (``memory_used_bytes``, the file's processes, live claims); else raise OutOfMemory
    for the first that has not, and claim nothing. A GPU the file does not list is not
    checked."""
    with _locked(path):
        spec = json.loads(Path(path).read_text())
        gpus = spec.get("gpus", [])
        for uuid, wanted in by_uuid.items():
            index = next((i for i, g in enumerate(gpus) if g.get("uuid") == uuid), None)
            if index is None or not wanted:
                continue
            gpu = gpus[index]
            others = sum(b for p, b in held_on(path, spec, index) if p != pid)
            total = int(gpu.get("memory_total_bytes", 0))
            free = total - int(gpu.get("memory_used_bytes", 0)) - others
            if wanted > free:
                raise OutOfMemory(uuid, wanted, free, total)
        _write_claim(path, pid, by_uuid)


def peak(path: Path) -> dict[str, int]:
    """The most bytes the claims held at once on each GPU (``<file>.peak.json``)."""
    try:
        return json.loads(peak_path(path).read_text())
    except FileNotFoundError:
        return {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # flock, not a lock file's existence: the kernel drops it when a holder dies.
    with open(f"{path}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_claim(path: Path, pid: int, by_uuid: dict[str, int]) -> None:
    """Write a claim and raise the peak record; the caller holds the lock."""
    folder = claims_dir(path)
    folder.mkdir(parents=True, exist_ok=True)
    _replace(folder / f"{pid}.json", by_uuid)
    now: dict[str, int] = {}
    for claimed in _claims(path).values():
        for uuid, held in claimed.items():
            now[uuid] = now.get(uuid, 0) + held
    record = peak(path)
    if any(held > record.get(uuid, 0) for uuid, held in now.items()):
        _replace(peak_path(path), {u: max(b, now.get(u, 0)) for u, b in {**now, **record}.items()})


def _replace(target: Path, data: dict) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(target)  # whole or not at all, for a reader mid-write


def _claims(path: Path) -> dict[int, dict[str, int]]:
    """The claims of live processes, by pid."""
    folder = claims_dir(path)
    out = {}
    for entry in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        pid = int(entry.stem)
        if not _alive(pid):
            continue
        try:
            out[pid] = {str(k): int(v) for k, v in json.loads(entry.read_text()).items()}
        except (OSError, ValueError):
            continue  # gone between listing and reading
    return out


def held_on(path: Path, spec: dict, index: int) -> list[tuple[int, int]]:
    """(pid, bytes) of every process holding memory on the GPU at ``index`` of ``spec``:
    the file's processes, then live claims."""
    gpu = spec["gpus"][index]
    out = [
        (int(p["pid"]), int(p["used_bytes"]))
        for p in spec.get("processes", [])
        if p.get("gpu") in (index, gpu.get("uuid"))
    ]
    for pid, claimed in _claims(path).items():
        if claimed.get(gpu.get("uuid"), 0):
            out.append((pid, claimed[gpu.get("uuid")]))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
