"""A shard's weights: fetched before its engine starts, and counted in use while it runs.

``ShardWeights`` is a mixin of ``agentd.supervisor.Supervisor``. A profile whose
``model_path`` names a URL or a hub repository has its weights fetched by the
node's fetcher (``agentd.fetch``) first, the shard ``starting`` meanwhile (the
fetch's progress pushes its startup deadline back and is not a transition);
then the engine starts on the local copy. The paths every shard uses (its
weights and its adapters' files, as the profile names them and as entries in a
weights dir) are what a clean-up must keep. This module changes when how a
shard's weights are made local or counted in use changes. It has no state of
its own: it uses the supervisor's ``_fetcher`` and ``_shards``, and its
``_start``, ``_set``, ``_fail``, ``_emit``, ``_spawn`` and ``_converge``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from agentd import protocol
from agentd.fetch import sources
from agentd.fetch.fetcher import FetchCancelled, FetchError
from agentd.protocol import ShardState
from agentd.shard import Shard

# The supervisor's name, not this module's: these lines were always the
# supervisor's in the agent's log, and operators filter that log by name.
logger = logging.getLogger("agentd.supervisor")


class ShardWeights:
    """Fetching a shard's weights before its start, and the paths shards use."""

    def paths_in_use(self) -> list[str]:
        """Model and adapter paths of every shard that runs or is wanted running, not only
        running ones: a starting engine reads them. One stopped for good, its engine gone,
        uses nothing.

        A fetched source counts twice: as the profile names it, and as its entry
        in a weights dir (blocking: a few stats; call it off the event loop).
        """
        paths = set()
        for sh in list(self._shards.values()):
            spec = sh.spec_or_want
            if spec is None:
                continue
            if not sh.alive() and sh.target in ("stopped", "absent"):
                continue
            # Its weights, and its LoRA adapters' files (agentd.adapters).
            for text in (spec.profile.model_path, *(a.source for a in spec.adapters)):
                if not text:
                    continue
                paths.add(text)
                source = _source_or_none(text)
                if source is not None and self._fetcher is not None:
                    entry = self._fetcher.entry(source)
                    if entry is not None:
                        paths.add(str(entry))
        return sorted(paths)

    def weights_in_use(self) -> list[str]:
        """Local model paths of the engines running now (for their weights' last use)."""
        out = []
        for sh in list(self._shards.values()):
            if sh.spec is None or not sh.alive():
                continue
            source = _source_or_none(sh.spec.profile.model_path)
            if source is not None and self._fetcher is not None:
                out += [str(r / source.slug) for r in self._fetcher.roots]
            elif sh.spec.profile.model_path:
                out.append(sh.spec.profile.model_path)
        return out

    async def fetch_progress(
        self, shard_id: str, bytes_done: int, bytes_total: int | None = None, source: str = ""
    ) -> None:
        """Progress of a weight fetch the agent runs itself: it pushes the startup deadline back."""
        sh = self._shards.get(shard_id)
        if sh is None:
            return
        sh.progress_at = time.monotonic()
        await self._emit(sh.progress(bytes_done, bytes_total, source))

    async def _launch(self, sh: Shard, want: protocol.DesiredShard) -> None:
        """Start the engine, once its weights are here: a source not fetched yet is fetched
        first, the shard ``starting`` meanwhile (progress is not a transition)."""
        try:
            source = sources.parse(want.profile.model_path)
        except sources.SourceError as exc:
            sh.spec = want
            return await self._fail(sh, f"model_path: {exc}")
        if source is None:
            self._release_fetch(sh)
            return await self._start(sh, want)
        if self._fetcher is None:
            sh.spec = want
            return await self._fail(sh, f"{source.text} must be fetched; this agent fetches none")
        try:
            local = await asyncio.to_thread(
                self._fetcher.ready, source, dict(want.profile.weights_sha256)
            )
        except FetchError as exc:
            self._release_fetch(sh)
            sh.spec = want
            return await self._fail(sh, str(exc))
        if local is not None:
            self._release_fetch(sh)
            await self._start(sh, want, local)
            if sh.alive():
                await asyncio.to_thread(self._fetcher.touch, source)
            return
        if sh.fetching == source.text:
            return  # under way already
        self._release_fetch(sh)
        sh.fetching = source.text
        sh.spec, sh.failed_spec, sh.error, sh.process = want, None, "", None
        sh.engine = want.profile.engine
        logger.info("shard %s: fetching %s before starting it", sh.shard_id, source.text)

        async def progress(done: int, total: int | None) -> None:
            if sh.fetching == source.text:
                await self._emit(sh.progress(done, total, source.text))

        # Joined here, under the shard's lock: a release from the next desired set counts.
        fetched = self._fetcher.want(
            source, dict(want.profile.weights_sha256), sh.shard_id, progress
        )
        await self._set(sh, ShardState.STARTING)
        self._spawn(self._fetch_then_start(sh, source, fetched))

    async def _fetch_then_start(
        self, sh: Shard, source: sources.Source, fetched: asyncio.Future
    ) -> None:
        try:
            await fetched
        except FetchCancelled:
            return
        except FetchError as exc:
            async with sh.lock:
                if sh.fetching != source.text:
                    return
                sh.fetching = None
                sh.process = None
                await self._fail(sh, f"fetching weights failed: {exc}")
            return
        async with sh.lock:
            if sh.fetching != source.text:
                return
            sh.fetching = None
        await self._converge(sh)

    def _release_fetch(self, sh: Shard) -> None:
        if sh.fetching and self._fetcher is not None:
            self._fetcher.release(sh.fetching, sh.shard_id)
        sh.fetching = None


def _source_or_none(model_path: str) -> sources.Source | None:
    try:
        return sources.parse(model_path)
    except sources.SourceError:
        return None
