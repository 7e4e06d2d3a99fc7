"""Fetched weights on disk: where each source lands, what records it, and where there is room.

Layout under a weights dir, one top-level entry per source::

    <dir>/<slug>/                  the entry: complete and verified, never written again
        <file>                     a URL's file, under its own name
        <path in repo>...          a hub repository's files
        .llmgw-weights.json        source, commit, sizes, fetched_at, last_used
    <dir>/.fetch-<slug>/           the staging dir while fetching (hidden: not weights)
        <file>.partial             a download in progress, resumed from its length
    <dir>/.fetch-<slug>.lock       held (flock) by whoever fetches it

A staging dir stays after a failed fetch, so that the next try resumes it. One
that nothing has written to for ``ABANDONED_AFTER_S`` (no retry came: the
profile changed, the model went) is removed by ``sweep_abandoned``: it is not
weights, so the control plane's clean-up never sees it.

The staging dir is renamed to the entry in one step once every file is complete
and verified, so an engine, the weights scan and a node sharing the filesystem
see either nothing or the whole entry. The slug is the same on every node, so an
entry on a shared filesystem is fetched once and found by every node.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from agentd.fetch.sources import URL, Source

logger = logging.getLogger(__name__)

META = ".llmgw-weights.json"
STAGING_PREFIX = ".fetch-"
PARTIAL = ".partial"
# last_used is rewritten at most this often while an engine keeps using an entry:
# it changes the reported inventory, and a day's retention needs no finer clock.
TOUCH_EVERY_S = 600.0
# A staging dir nothing has written to for this long is a fetch nobody will resume:
# as long as the control plane keeps unused weights by default (a day).
ABANDONED_AFTER_S = 24 * 3600.0


class NoRoom(Exception):
    """No weights dir has room for a fetch; the message names the best one."""


def human(n: float) -> str:
    """Decimal units, as disks are sold: '14.2 GB'."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def entry_dir(root: Path, source: Source) -> Path:
    return root / source.slug


def staging_dir(root: Path, source: Source) -> Path:
    return root / f"{STAGING_PREFIX}{source.slug}"


def lock_path(root: Path, source: Source) -> Path:
    return root / f"{STAGING_PREFIX}{source.slug}.lock"


def local_model_path(entry: Path, source: Source) -> Path:
    """What the engine is given: a URL's file, a repository's directory, or the file
    or folder of the repository a hub source names."""
    if source.kind == URL:
        return entry / source.file_name
    return entry / source.path if source.path else entry


def read_meta(entry: Path) -> dict | None:
    try:
        data = json.loads((entry / META).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_meta(entry: Path, data: dict) -> None:
    """Replace the metadata file in one step (a reader never sees half of it).

    The file written first is the writer's own, by process and thread: two engines of
    one source start at once and each records its use from a thread, and with one
    name for both, one could rename the file while the other still wrote into it,
    so a reader found it empty and the entry not there."""
    tmp = entry / f"{META}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, entry / META)


def find(roots: list[Path], source: Source) -> Path | None:
    """The complete entry of a source in any weights dir, or None."""
    for root in roots:
        entry = entry_dir(root, source)
        meta = read_meta(entry)
        if meta is not None and meta.get("source") == source.text:
            return entry
    return None


def partial_bytes(staging: Path) -> int:
    """Bytes already fetched into a staging dir (what a resume need not fetch again)."""
    total = 0
    for dirpath, _dirs, files in os.walk(staging):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def choose_root(roots: list[Path], source: Source, total: int | None) -> Path:
    """The weights dir to fetch into: where a partial fetch is (to resume), else the first
    with room for what is left to fetch. NoRoom names the dir with the most space."""
    if not roots:
        raise NoRoom(
            f"{source.text} must be fetched, but this node's agent.yaml names no weights_dirs"
        )
    for root in roots:
        staging = staging_dir(root, source)
        if staging.is_dir() and (total is None or _free(root) >= total - partial_bytes(staging)):
            return root
    if total is None:
        return roots[0]
    best, best_free = roots[0], -1
    for root in roots:
        free = _free(root)
        if free >= total:
            return root
        if free > best_free:
            best, best_free = root, free
    raise NoRoom(f"needs {human(total)}, {human(max(best_free, 0))} free on {best}")


def _free(root: Path) -> int:
    try:
        root.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(root).free
    except OSError:
        return 0


def touch(entry: Path, now: float | None = None, *, every: float = 0.0) -> bool:
    """Record that an engine uses the entry now; at most once per ``every`` seconds.

    True when written. An entry without metadata (not fetched by the agent) is left alone.
    """
    now = time.time() if now is None else now
    meta = read_meta(entry)
    if meta is None:
        return False
    last = meta.get("last_used")
    if isinstance(last, (int, float)) and now - last < every:
        return False
    meta["last_used"] = round(now, 3)
    try:
        write_meta(entry, meta)
    except OSError as exc:
        logger.warning("cannot record the use of %s: %s", entry, exc.strerror or exc)
        return False
    return True


def entry_of(path: str, roots: list[Path]) -> Path | None:
    """The top-level entry of a weights dir that a model path lies in, or None."""
    p = Path(os.path.abspath(path))
    for root in roots:
        r = Path(os.path.abspath(root))
        if p != r and p.is_relative_to(r):
            return r / p.relative_to(r).parts[0]
    return None


def _newest_write(path: Path) -> float:
    newest = os.lstat(path).st_mtime
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                continue
    return newest


def sweep_abandoned(
    roots: list[Path], older_than_s: float = ABANDONED_AFTER_S, now: float | None = None
) -> list[Path]:
    """Remove staging dirs nothing has written to for ``older_than_s``; returns them.

    One being fetched (its lock held, by this agent or another on a shared
    filesystem) is left alone. Blocking: a walk of each staging dir.
    """
    now = time.time() if now is None else now
    removed = []
    for root in roots:
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        for name in names:
            staging = Path(root) / name
            if not name.startswith(STAGING_PREFIX) or name.endswith(".lock"):
                continue
            try:
                if not staging.is_dir():
                    continue
                idle = now - _newest_write(staging)
                if idle < older_than_s:
                    continue
                lock = staging.with_name(f"{name}.lock")
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being fetched
                size = partial_bytes(staging)
                shutil.rmtree(staging, ignore_errors=True)
                lock.unlink(missing_ok=True)
            finally:
                os.close(fd)
            logger.info(
                "removed an abandoned partial fetch %s (%s, nothing written for %.1f h)",
                staging,
                human(size),
                idle / 3600,
            )
            removed.append(staging)
    return removed
