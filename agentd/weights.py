"""Removing weights the control plane no longer needs, after checking each path here.

The control plane cannot see the disk, so its list is a proposal: a path
outside the weights dirs, a weights dir itself, or weights a shard uses are
kept whatever it says.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)


def remove(paths: list[str], weights_dirs, in_use: list[str]) -> tuple[str, bool]:
    """Remove each allowed path. Returns (what was removed and kept, and why; all removed)."""
    roots = [Path(os.path.realpath(d)) for d in weights_dirs]
    # Both spellings of what shards use: as configured, and with links resolved.
    used = [Path(f(p)) for p in in_use if p for f in (os.path.abspath, os.path.realpath)]
    removed, kept = [], []
    for raw in paths:
        # The directories above resolved, the last part not: a link in a
        # weights dir to a model kept elsewhere is removed, not what it names.
        given = os.path.abspath(raw)
        real = Path(os.path.realpath(os.path.dirname(given))) / os.path.basename(given)
        if not any(real != r and real.is_relative_to(r) for r in roots):
            kept.append(f"{raw}: not inside a weights dir")
            continue
        user = next((u for u in used if u.is_relative_to(real) or real.is_relative_to(u)), None)
        if user is not None:
            kept.append(f"{raw}: in use by a running shard ({user})")
            continue
        if not os.path.lexists(real):
            removed.append(raw)  # already gone: the wanted outcome
            continue
        try:
            if real.is_dir() and not real.is_symlink():
                shutil.rmtree(real)
            else:
                real.unlink()
        except OSError as exc:
            kept.append(f"{raw}: {exc.strerror or exc}")
            continue
        removed.append(raw)
        logger.info("removed weights %s", raw)
    for k in kept:
        logger.warning("kept weights %s", k)
    detail = f"removed {len(removed)}" + (f"; kept {'; '.join(kept)}" if kept else "")
    return detail[:4096], not kept
