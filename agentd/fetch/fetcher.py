"""The node's fetches: one per source however many shards want it, a few at a time.

``Fetcher.fetch`` returns the local path an engine is given once the source is
complete and verified in a weights dir. Shards that want the same source share
one fetch; ``release`` says a shard no longer wants it, and a fetch nobody
wants is stopped and its partial files removed. At most ``max_concurrent``
fetches move at once; the rest wait their turn (still reported, so nobody
mistakes waiting for hanging). Progress goes to every wanter at most once a
second. An agent that stops (``close``) keeps its partial files: the next one
continues from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentd.fetch import http, hub, store
from agentd.fetch.http import Cancelled, FetchError
from agentd.fetch.sources import HUB, Source, name_problem

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 1.0  # the most often progress is sent
WAITING_EVERY_S = 10.0  # how often a fetch that waits (its turn, another node) says so
LOCK_POLL_S = 1.0

OnProgress = Callable[[int, int | None], Awaitable[None]]


class FetchCancelled(Exception):
    """The fetch was stopped because no shard wants it any more."""


def _inside(entry: Path, name: str, source: Source) -> Path:
    """``entry / name``, or FetchError when ``name`` (from a profile's weights_sha256, or a
    hub's file list) would lead outside the entry. The control plane refuses such names
    too; the agent checks them itself, since it is the one that reads the files."""
    if (problem := name_problem(name)) is not None:
        raise FetchError(f"{source.text}: {problem}; nothing outside {entry} is read")
    path = entry / name
    if path.exists() and not path.resolve().is_relative_to(entry.resolve()):
        raise FetchError(f"{source.text}: {name!r} leads outside {entry}; it is not read")
    return path


@dataclass(frozen=True)
class FetchSettings:
    roots: list[Path]
    max_concurrent: int = 2
    stall_s: float = 60.0
    ca_file: str | None = None
    hf_endpoint: str = "https://huggingface.co"
    hf_token: str = ""
    # URL sources (https://, http://) from internal addresses: every one, or these
    # networks (agent.yaml's fetch.allow_private_addresses, fetch.allow_networks).
    # hf:// goes to the hub endpoint the node itself names, which is not checked.
    allow_private_addresses: bool = False
    allow_networks: tuple[str, ...] = ()


@dataclass
class _Job:
    source: Source
    sha256: dict[str, str]
    wanters: dict[str, OnProgress] = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)
    released: bool = False
    task: asyncio.Task | None = None
    done: int = 0
    total: int | None = None
    moving: bool = False  # holding a slot and the lock, bytes may flow


class Fetcher:
    def __init__(self, settings: FetchSettings):
        self.settings = settings
        self.roots = [Path(r) for r in settings.roots]
        self.guard = http.AddressGuard.of(settings.allow_private_addresses, settings.allow_networks)
        self._jobs: dict[str, _Job] = {}
        self._slots: asyncio.Semaphore | None = None

    # ---- what the supervisor uses ------------------------------------------------

    def ready(self, source: Source, sha256: dict[str, str] | None = None) -> Path | None:
        """The local model path when the source is already complete here; None if not.

        Blocking (a few stats; with checksums the profile added after the fetch,
        a hash of those files, once). FetchError when a complete copy does not
        match a checksum the profile gives.
        """
        entry = store.find(self.roots, source)
        if entry is None:
            return None
        if sha256:
            self._check_entry(entry, source, sha256)
        return store.local_model_path(entry, source)

    def _check_entry(self, entry: Path, source: Source, sha256: dict[str, str]) -> None:
        meta = store.read_meta(entry) or {}
        known = dict(meta.get("sha256") or {})
        for name, want in sorted(sha256.items()):
            path = _inside(entry, name, source)
            if known.get(name) == want:
                continue
            if not path.is_file():
                raise FetchError(f"weights_sha256 names {name}, which {entry} does not have")
            got = http.sha256_of(path)
            if got != want:
                raise FetchError(
                    f"{source.text}: the fetched copy {path} has sha256 {got}, the profile "
                    f"expects {want}; fix the checksum, or remove the copy to fetch it again"
                )
            known[name] = got
        if known != meta.get("sha256"):
            try:
                store.write_meta(entry, {**meta, "sha256": known})
            except OSError:
                pass  # checked again next time

    def entry(self, source: Source) -> Path | None:
        return store.find(self.roots, source)

    def touch(self, source: Source) -> None:
        """An engine starts on the source's entry: its last use is now (blocking)."""
        entry = store.find(self.roots, source)
        if entry is not None:
            store.touch(entry)

    def fetching(self) -> list[str]:
        return sorted(s for s, j in self._jobs.items() if not j.task.done())

    def want(
        self, source: Source, sha256: dict[str, str], wanter: str, on_progress: OnProgress
    ) -> asyncio.Future:
        """Join the fetch of a source (starting one if none runs), at once: a ``release``
        from now on counts. Await the result for the local model path when complete;
        it raises FetchError (the reason, for the shard's error) or FetchCancelled."""
        job = self._jobs.get(source.text)
        if job is None or job.released or job.task.done():
            # One being stopped finishes removing its files before the new one starts.
            previous = job.task if job is not None and job.released else None
            job = _Job(source=source, sha256=dict(sha256))
            self._jobs[source.text] = job
            job.task = asyncio.get_running_loop().create_task(self._run(job, previous))
        job.wanters[wanter] = on_progress
        return asyncio.shield(job.task)

    async def fetch(
        self, source: Source, sha256: dict[str, str], wanter: str, on_progress: OnProgress
    ) -> Path:
        """``want`` and wait: the local model path when complete."""
        return await self.want(source, sha256, wanter, on_progress)

    def release(self, source_text: str, wanter: str) -> None:
        """``wanter`` no longer needs the source; the last one out stops the fetch."""
        job = self._jobs.get(source_text)
        if job is None or wanter not in job.wanters:
            return
        del job.wanters[wanter]
        if job.wanters or job.task.done():
            return
        logger.info("fetch of %s cancelled: no shard wants it", source_text)
        job.released = True
        job.cancel.set()
        if not job.moving:
            job.task.cancel()  # waiting for a slot: nothing runs in a thread yet

    async def close(self) -> None:
        """Stop every fetch, keeping partial files for the next agent."""
        for job in self._jobs.values():
            job.cancel.set()
        tasks = [j.task for j in self._jobs.values() if j.task]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- one job --------------------------------------------------------------------

    async def _run(self, job: _Job, previous: asyncio.Task | None = None) -> Path:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.max_concurrent)
        reporter = asyncio.get_running_loop().create_task(self._report(job))
        try:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            async with self._slots:
                job.moving = True
                if job.cancel.is_set():
                    raise Cancelled()
                path = await asyncio.to_thread(self._fetch, job)
            logger.info("fetched %s into %s", job.source.text, path)
            await self._send(job)
            return path
        except (Cancelled, asyncio.CancelledError):
            if not job.released:
                # The agent is stopping: what was fetched stays for the next one.
                raise FetchCancelled(f"fetch of {job.source.text} stopped with the agent") from None
            await asyncio.to_thread(self._discard, job)
            raise FetchCancelled(f"fetch of {job.source.text} cancelled") from None
        except FetchError as exc:
            logger.warning("fetch failed: %s", exc)
            raise
        except store.NoRoom as exc:
            logger.warning("fetch of %s refused: %s", job.source.text, exc)
            raise FetchError(str(exc)) from None
        except OSError as exc:
            raise FetchError(f"{job.source.text}: {exc.strerror or exc}") from None
        finally:
            reporter.cancel()
            if self._jobs.get(job.source.text) is job:
                del self._jobs[job.source.text]

    async def _report(self, job: _Job) -> None:
        """Progress to every wanter: when bytes moved (at most once a second), and every
        ``WAITING_EVERY_S`` while nothing moves, so a fetch waiting its turn reads as alive.
        A fetch that hangs mid-download is ended by the stall timeout, not hidden by this."""
        sent, sent_at = None, 0.0
        while True:
            now = time.monotonic()
            state = (job.done, job.total)
            waiting = not job.moving or job.done == 0
            if state != sent or (waiting and now - sent_at >= WAITING_EVERY_S):
                await self._send(job)
                sent, sent_at = state, now
            await asyncio.sleep(PROGRESS_EVERY_S)

    async def _send(self, job: _Job) -> None:
        for on_progress in list(job.wanters.values()):
            try:
                await on_progress(job.done, job.total)
            except Exception:  # noqa: BLE001 - one wanter's trouble is not the fetch's
                logger.exception("reporting fetch progress failed")

    # ---- in a worker thread ------------------------------------------------------------

    def _fetch(self, job: _Job) -> Path:
        src, s = job.source, self.settings
        for name in sorted(job.sha256):
            # A profile's checksum naming a file outside the entry (an older control
            # plane saved such names); the hub's own names are checked in hub.plan.
            if (problem := name_problem(name)) is not None:
                raise FetchError(f"{src.text}: {problem}; nothing was fetched")
        found = store.find(self.roots, src)
        if found is not None:
            return store.local_model_path(found, src)
        # A URL names any host; the hub is the endpoint this node's agent.yaml names.
        op = http.opener(s.ca_file, guard=None if src.kind == HUB else self.guard)
        if src.kind == HUB:
            plan = hub.plan(src, endpoint=s.hf_endpoint, token=s.hf_token, timeout_s=s.stall_s)
            files = [(f.name, f.url, f.size, f.sha256, f.git_sha1) for f in plan.files]
            headers, total, extra = plan.headers, plan.total, {"commit": plan.commit}
        else:
            size = http.size_of(src.url, {}, op=op, stall_s=s.stall_s)
            files = [(src.file_name, src.url, size, None, None)]
            headers, total, extra = {}, size, {}
        names = {f[0] for f in files}
        unknown = sorted(set(job.sha256) - names)
        if unknown:
            raise FetchError(
                f"weights_sha256 names {', '.join(unknown)}, which {src.text} does not have "
                f"(it has: {', '.join(sorted(names)[:10]) or 'nothing'})"
            )
        job.total = total
        root = store.choose_root(self.roots, src, total)
        root.mkdir(parents=True, exist_ok=True)
        with self._locked(job, root) as got:
            if got is not None:
                return got
            staging = store.staging_dir(root, src)
            staging.mkdir(exist_ok=True)
            job.done = store.partial_bytes(staging)
            done_before, sizes, hashes = 0, {}, {}
            for name, url, size, sha256, git_sha1 in files:
                final = staging / name
                if final.is_file() and (size is None or final.stat().st_size == size):
                    done_before += final.stat().st_size  # verified on an earlier run
                    sizes[name] = final.stat().st_size
                    continue
                partial = staging / f"{name}{store.PARTIAL}"
                base = done_before

                def moved(n: int, base: int = base) -> None:
                    job.done = base + n

                want_sha = job.sha256.get(name) or sha256
                got_size, digest = http.download(
                    url,
                    partial,
                    headers=headers,
                    expected_size=size,
                    op=op,
                    stall_s=s.stall_s,
                    cancel=job.cancel,
                    on_bytes=moved,
                    sha256=bool(want_sha),
                )
                self._verify(job, partial, name, want_sha, digest, git_sha1)
                if digest:
                    hashes[name] = digest
                os.replace(partial, final)
                done_before += got_size
                sizes[name] = got_size
            job.done = done_before
            meta = {
                "source": src.text,
                "kind": src.kind,
                "files": sizes,
                "sha256": hashes,
                **extra,
                "fetched_at": round(time.time(), 3),
                "last_used": None,
            }
            store.write_meta(staging, meta)
            entry = store.entry_dir(root, src)
            if entry.exists():
                # Not one of ours (it has no metadata): somebody's, and not ours to delete.
                raise FetchError(
                    f"{src.text}: {entry} exists and is not a fetched copy of it; move it away"
                )
            os.rename(staging, entry)
            return store.local_model_path(entry, src)

    def _verify(
        self, job: _Job, partial: Path, name: str, sha256: str | None, got256: str, git_sha1
    ) -> None:
        """Check a downloaded file against its sha256 (``got256``: what the download
        computed), else the git object id a hub gives; remove it if it does not match."""
        what, want, got = "", None, None
        if sha256:
            what, want, got = "sha256", sha256, got256
        elif git_sha1:
            what, want, got = "git object id", git_sha1, http.git_blob_sha1_of(partial, job.cancel)
        if want is not None and got != want:
            partial.unlink(missing_ok=True)
            raise FetchError(
                f"{job.source.text}: {what} mismatch for {name}: expected {want}, got {got}; "
                "the file was removed"
            )

    @contextlib.contextmanager
    def _locked(self, job: _Job, root: Path):
        """Hold the source's lock in this weights dir, so agents sharing a filesystem fetch a
        source once. Yields the finished local path if another agent finished it meanwhile."""
        path = store.lock_path(root, job.source)
        staging = store.staging_dir(root, job.source)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if job.cancel.is_set():
                        raise Cancelled() from None
                    job.done = store.partial_bytes(staging) if staging.is_dir() else 0
                    time.sleep(LOCK_POLL_S)
            found = store.find(self.roots, job.source)
            try:
                yield store.local_model_path(found, job.source) if found else None
            except Cancelled:
                if job.released:
                    shutil.rmtree(staging, ignore_errors=True)
                    path.unlink(missing_ok=True)
                raise
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def _discard(self, job: _Job) -> None:
        """Partial files of a cancelled fetch that never started moving (waiting its turn)."""
        for root in self.roots:
            staging = store.staging_dir(root, job.source)
            lock = store.lock_path(root, job.source)
            if not staging.exists():
                continue
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another agent is fetching it: its files, not ours
            shutil.rmtree(staging, ignore_errors=True)
            lock.unlink(missing_ok=True)
            os.close(fd)
