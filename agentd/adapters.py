"""LoRA adapters on a running shard: fetched like weights, then held by its engine.

``AdapterLifecycle`` is a mixin of ``agentd.supervisor.Supervisor``. A shard's
desired entry lists the adapters its engine should hold (``DesiredShard.adapters``,
at most the profile's ``max_adapters``, most recently asked for first). Each one's
files are made local first: a path is used as it is, a URL or hub source is
fetched and verified by the node's fetcher. A local path is used only under the
roots this node's agent.yaml names (``agentd.localpaths``); outside them the
adapter is failed with the reason and the engine never hears of it. Then:

- vLLM and SGLang load and unload adapters through their own HTTP API while they
  serve (``Engine.load_adapter``): nothing restarts.
- llama.cpp's server loads adapters only at start (``--lora``; a request then
  picks one by number), so a changed set restarts its engine once the requests
  in flight have finished. An adapter the engine cannot load makes it exit; the
  supervisor reads the engine's reason from its output, marks that adapter failed
  with it and starts again without it (``adapter_start_failed``).

What each engine holds is reported with every shard status (``Shard.status``).
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
from agentd.shardlog import bounded, clean_line

logger = logging.getLogger("agentd.supervisor")

LOADING, LOADED, FAILED = "loading", "loaded", "failed"
# A restart to change llama.cpp's adapters waits this long for requests in flight.
RESTART_WAIT_S = 60.0


class AdapterLifecycle:
    """Fetching, loading and unloading one shard's LoRA adapters."""

    async def _adapter_files(self, sh: Shard, want: protocol.DesiredShard) -> dict[str, str]:
        """name -> local path of each wanted adapter whose files are here. The others are
        fetched (the shard converges again when one arrives) or marked failed."""
        local: dict[str, str] = {}
        for spec in want.adapters:
            held = sh.adapters.get(spec.name)
            if held and held["state"] == FAILED and held.get("source") == spec.source:
                continue  # the same again fails the same way
            try:
                source = sources.parse(spec.source)
            except sources.SourceError as exc:
                self._adapter_failed(sh, spec, f"source: {exc}")
                continue
            if source is None:
                # A local path: only under this node's roots, checked before the engine
                # hears of it (agentd.localpaths).
                problem = await asyncio.to_thread(
                    self.local_roots.problem, spec.source, f"adapter {spec.name}'s source"
                )
                if problem:
                    self._adapter_failed(sh, spec, problem)
                else:
                    local[spec.name] = spec.source
                continue
            if self._fetcher is None:
                self._adapter_failed(sh, spec, "this agent fetches nothing")
                continue
            try:
                path = await asyncio.to_thread(self._fetcher.ready, source, dict(spec.sha256))
            except FetchError as exc:
                self._adapter_failed(sh, spec, str(exc))
                continue
            if path is not None:
                local[spec.name] = str(path)
            elif spec.name not in sh.adapter_fetches:
                sh.adapter_fetches[spec.name] = spec.source
                sh.adapters[spec.name] = {"name": spec.name, "state": LOADING, "error": ""}
                who = _wanter(sh, spec.name)
                fetched = self._fetcher.want(source, dict(spec.sha256), who, _quiet)
                self._spawn(self._fetch_adapter(sh, spec, fetched))
        return local

    async def _fetch_adapter(self, sh: Shard, spec: protocol.AdapterSpec, fetched) -> None:
        try:
            await fetched
        except FetchCancelled:
            return
        except FetchError as exc:
            self._adapter_failed(sh, spec, f"fetching it failed: {exc}")
            await self._emit_status(sh)
        finally:
            sh.adapter_fetches.pop(spec.name, None)
        await self._converge(sh)

    def _adapter_failed(self, sh: Shard, spec: protocol.AdapterSpec, error: str) -> None:
        logger.warning("shard %s: adapter %s failed: %s", sh.shard_id, spec.name, error)
        sh.adapters[spec.name] = {
            "name": spec.name,
            "state": FAILED,
            # Often the engine's own words: bounded and cleaned before they travel.
            "error": bounded(error),
            "source": spec.source,
        }

    def _release_adapters(self, sh: Shard, keep=()) -> None:
        """Stop fetching adapters no longer wanted (the desired entry has dropped them)."""
        if self._fetcher is None:
            return
        for name, source in list(sh.adapter_fetches.items()):
            if name not in keep:
                self._fetcher.release(source, _wanter(sh, name))
                del sh.adapter_fetches[name]

    # ---- at start (llama.cpp) -------------------------------------------------------

    async def _start_adapters(self, sh: Shard, want: protocol.DesiredShard) -> list[tuple]:
        """(name, local path) of the adapters to start llama.cpp with, in the order that
        numbers them; what is not here yet is fetched and added by a later restart."""
        if not want.profile.max_adapters:
            return []
        local = await self._adapter_files(sh, want)
        return sorted(local.items())[: want.profile.max_adapters]

    def _started_with(self, sh: Shard, loaded: list[tuple]) -> None:
        # Those that failed stay reported, those still fetching stay loading.
        sh.adapters = {n: a for n, a in sh.adapters.items() if a["state"] in (FAILED, LOADING)}
        for number, (name, _path) in enumerate(loaded):
            sh.adapters[name] = {"name": name, "state": LOADED, "error": "", "id": number}
        sh.adapter_paths = dict(loaded)

    async def _restart_for_adapters(self, sh: Shard, want: protocol.DesiredShard) -> bool:
        """llama.cpp: restart when the adapters it should start with differ from those it
        has. True when it was restarted."""
        wanted = dict(await self._start_adapters(sh, want))
        if wanted == sh.adapter_paths:
            return False
        logger.info(
            "shard %s: restarting its engine to hold adapters %s",
            sh.shard_id,
            ", ".join(sorted(wanted)) or "none",
        )
        await self._wait_idle(sh)
        await self._stop(sh, None)
        await self._start(sh, want, sh.model_local)
        return True

    async def _wait_idle(self, sh: Shard) -> None:
        engine = self._engines.get(sh.engine)
        deadline = time.monotonic() + RESTART_WAIT_S
        while engine is not None and time.monotonic() < deadline and sh.alive():
            if (await engine.in_flight(self.probe_host, sh.port)) in (0, None):
                return
            await asyncio.sleep(0.25)

    def adapter_start_failed(self, sh: Shard) -> bool:
        """After llama.cpp exited before it was ready: whether an adapter was the cause (its
        output names one it failed on). That adapter is marked failed with the engine's
        words, and the shard is to start again without it."""
        if not sh.adapter_paths:
            return False
        sh.log.read_new()  # what it printed as it exited
        lines = sh.log.recent(80)
        starts = [i for i, line in enumerate(lines) if line.startswith("--- llmgw ")]
        lines = lines[starts[-1] + 1 :] if starts else lines  # this start's output only
        culprit, reason = None, []
        for line in lines:
            low = line.lower()
            named = [n for n, p in sh.adapter_paths.items() if p in line and "lora" in low]
            if named:
                culprit = named[0]
            if ("lora" in low or "gguf" in low) and ("error" in low or "failed" in low):
                reason.append(clean_line(line))
        if culprit is None or not reason:
            return False
        spec = next((a for a in (sh.want.adapters if sh.want else []) if a.name == culprit), None)
        if spec is None:
            return False
        self._adapter_failed(sh, spec, "; ".join(reason[:3]))  # at most 3 lines, 1 KiB
        sh.adapter_paths.pop(culprit, None)
        return True

    # ---- at runtime (vLLM, SGLang) --------------------------------------------------

    async def _runtime_adapters(self, sh: Shard, want: protocol.DesiredShard) -> None:
        """Load and unload through the engine's API until it holds what is wanted."""
        engine = self._engines.get(sh.engine)
        if engine is None or engine.adapters_at_start or sh.state != ShardState.READY:
            return
        local = await self._adapter_files(sh, want)
        before = {n: dict(a) for n, a in sh.adapters.items()}
        for name in [n for n, a in sh.adapters.items() if a["state"] == LOADED]:
            if name not in local:
                problem = await engine.unload_adapter(self.probe_host, sh.port, name)
                if problem:
                    logger.warning("shard %s: unloading %s: %s", sh.shard_id, name, problem)
                sh.adapters.pop(name, None)
        for name, path in local.items():
            if sh.adapters.get(name, {}).get("state") == LOADED:
                continue
            problem = await engine.load_adapter(self.probe_host, sh.port, name, path)
            spec = next(a for a in want.adapters if a.name == name)
            if problem:
                self._adapter_failed(sh, spec, problem)
            else:
                sh.adapters[name] = {"name": name, "state": LOADED, "error": ""}
        for name in [n for n in sh.adapters if n not in {a.name for a in want.adapters}]:
            sh.adapters.pop(name)
        if sh.adapters != before:
            await self._emit_status(sh)


def _wanter(sh: Shard, name: str) -> str:
    return f"{sh.shard_id}:lora:{name}"


async def _quiet(done: int, total: int | None) -> None:
    """An adapter's fetch moves no startup deadline: the engine serves meanwhile."""
