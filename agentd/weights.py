"""Removing weights the control plane no longer needs, after checking each path here.

The control plane cannot see the disk, so its list is a proposal: a path
outside the weights dirs, a weights dir itself, weights a shard uses or wants,
a file an engine process holds open, or an entry that changed since this node
last reported it are kept whatever it says, each with its reason.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from agentd.discovery import tree_size

logger = logging.getLogger(__name__)

PROC = Path("/proc")


@dataclass
class Outcome:
    removed: list[str] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    @property
    def ok(self) -> bool:
        return not self.kept

    def detail(self) -> str:
        text = f"removed {len(self.removed)}"
        if self.kept:
            text += "; kept " + "; ".join(f"{p}: {why}" for p, why in self.kept)
        return text[:4096]


def open_files(pgids, proc: Path = PROC) -> dict[str, int]:
    """Files the processes of these process groups hold open or mapped: path -> pid.

    llama.cpp maps a GGUF rather than reading it, so the maps count as much as
    the descriptors. Processes that vanish meanwhile are skipped.
    """
    pgids = {int(g) for g in pgids if g}
    found: dict[str, int] = {}
    if not pgids:
        return found
    try:
        pids = [p.name for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            stat = (proc / pid / "stat").read_text()
            # The command name may hold spaces and parentheses: fields follow the last ")".
            pgrp = int(stat.rsplit(")", 1)[1].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if pgrp not in pgids:
            continue
        try:
            for fd in (proc / pid / "fd").iterdir():
                try:
                    found.setdefault(os.readlink(fd), int(pid))
                except OSError:
                    continue
        except OSError:
            pass
        try:
            for line in (proc / pid / "maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    found.setdefault(parts[5], int(pid))
        except OSError:
            pass
    return found


def remove(
    paths: list[str],
    weights_dirs,
    in_use: list[str],
    *,
    sources: dict[str, str] | None = None,
    reported: dict[str, int] | None = None,
    held_open: dict[str, int] | None = None,
) -> Outcome:
    """Remove each allowed path.

    ``in_use``: model paths of the shards held or wanted here; ``sources``: the
    source each reported entry was fetched from (a shard's model_path names
    its weights by source); ``reported``: the size this node last reported for
    each entry (None: do not compare); ``held_open``: files engine processes hold.
    """
    roots = [Path(os.path.realpath(d)) for d in weights_dirs]
    # Both spellings of what shards use: as configured, and with links resolved.
    local = [p for p in in_use if p and not p.startswith(("https://", "hf://"))]
    used = [Path(f(p)) for p in local for f in (os.path.abspath, os.path.realpath)]
    wanted_sources = set(in_use)
    opened = [(Path(p), pid) for p, pid in (held_open or {}).items()]
    sources = sources or {}
    out = Outcome()
    for raw in paths:
        # The directories above resolved, the last part not: a link in a
        # weights dir to a model kept elsewhere is removed, not what it names.
        given = os.path.abspath(raw)
        real = Path(os.path.realpath(os.path.dirname(given))) / os.path.basename(given)
        if not any(real != r and real.is_relative_to(r) for r in roots):
            out.kept.append((raw, "not inside a weights dir"))
            continue
        holder = next(((p, pid) for p, pid in opened if p == real or p.is_relative_to(real)), None)
        if holder is not None:
            out.kept.append((raw, f"held open by engine process {holder[1]} ({holder[0]})"))
            continue
        user = next((u for u in used if u.is_relative_to(real) or real.is_relative_to(u)), None)
        if user is not None:
            out.kept.append((raw, f"in use by a shard here ({user})"))
            continue
        source = sources.get(raw) or sources.get(given)
        if source and source in wanted_sources:
            out.kept.append((raw, f"in use by a shard here ({source})"))
            continue
        if not os.path.lexists(real):
            out.removed.append(raw)  # already gone: the wanted outcome
            continue
        if reported is not None:
            before = reported.get(raw, reported.get(given))
            if before is None:
                out.kept.append((raw, "not among the weights this node last reported"))
                continue
            now = tree_size(real)
            if now != before:
                out.kept.append(
                    (raw, f"changed since it was reported ({before} bytes then, {now} now)")
                )
                continue
        try:
            if real.is_dir() and not real.is_symlink():
                shutil.rmtree(real)
            else:
                real.unlink()
        except OSError as exc:
            out.kept.append((raw, exc.strerror or str(exc)))
            continue
        out.removed.append(raw)
        logger.info("removed weights %s", raw)
    for p, why in out.kept:
        logger.warning("kept weights %s: %s", p, why)
    return out
