"""How one shard's engine process lives: launched or adopted, watched, drained, stopped.

``EngineLifecycle`` is a mixin of ``agentd.supervisor.Supervisor``, which decides
what should run and reports every transition; the steps that act on a single
engine process live here. It has no state of its own: it uses the supervisor's
settings (``host``, ``port_range``, ``state_dir``, ``local_roots``, the timeouts), its
``_engines``, ``_disabled``, ``_allow_env``, ``_shards`` and ``_closed``, and its ``_set``,
``_fail``, ``_emit`` and ``_spawn``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import time
from dataclasses import replace
from pathlib import Path

from agentd import protocol, state
from agentd.engineconfig import refused_env
from agentd.engines import Engine, EngineUnavailable, Probe
from agentd.engines.base import Launch, model_of, tree_size, weights_path
from agentd.protocol import DesiredShard, ShardState
from agentd.shard import LIVE, Shard
from agentd.shardproc import EngineProcess, exit_reason, port_taken

# The supervisor's name, not this module's: these lines were always the
# supervisor's in the agent's log, and operators filter that log by name.
logger = logging.getLogger("agentd.supervisor")

TICK_STARTING_S = 0.2  # while waiting for readiness: tests and operators both want it prompt
TICK_READY_S = 1.0  # once ready, only "is it still alive": a waitpid or a /proc read
FETCH_CHECK_S = 1.0
DRAIN_POLL_S = 0.25
DRAIN_WITHOUT_METRIC_S = 30.0  # engines that cannot count requests in flight


class EngineLifecycle:
    """Starting, adopting, watching, draining and stopping one shard's engine."""

    # ---- starting and adopting -------------------------------------------------

    async def _start(self, sh: Shard, spec: DesiredShard, model_path: Path | None = None) -> None:
        """Launch the engine; ``model_path``, when given, is the fetched local copy of the
        profile's source, and the engine gets it instead of the URL."""
        sh.spec, sh.failed_spec, sh.error = spec, None, ""
        sh.engine = name = spec.profile.engine
        engine = self._engines.get(name)
        short = await self._gpu_room(spec) if spec.profile.gpu_memory_gb else ""
        try:
            if model_path is None:  # a local path, or a hub id: only under this node's roots
                what = "model_path" if spec.profile.model_path else "the model name"
                problem = await asyncio.to_thread(
                    self.local_roots.problem, model_of(spec.profile, spec), what
                )
                if problem:
                    raise EngineUnavailable(problem)
            if short:
                raise EngineUnavailable(short)
            if name in self._disabled:
                raise EngineUnavailable(f"engine {name} is disabled on this node")
            if engine is None:
                known = ", ".join(sorted(n for n in self._engines if n not in self._disabled))
                raise EngineUnavailable(f"engine {name!r} is not available here (known: {known})")
            if refused := refused_env(spec.profile.env, self._allow_env):
                raise EngineUnavailable(
                    f"profile '{spec.profile.name}' sets {', '.join(refused)} in its env, which "
                    "changes what code the engine loads; this node's agent.yaml does not allow "
                    "it (engines.allow_env)"
                )
            engine.command()  # installed since the last probe, or removed?
            # Followers of a multi-node replica serve no HTTP, but engines derive
            # internal ports from --port, so every shard gets a free one.
            port = spec.port or self._free_port(sh.shard_id)
            self._check_port(sh.shard_id, port)
            profile = spec.profile
            if model_path is not None:
                profile = profile.model_copy(update={"model_path": str(model_path)})
            loaded = []
            if engine.adapters_at_start and engine.serves_http(spec):
                loaded = await self._start_adapters(sh, spec)
            local = [protocol.AdapterSpec(name=n, source=p) for n, p in loaded]
            launch = engine.build(
                profile, spec.model_copy(update={"adapters": local}), host=self.host, port=port
            )
            if engine.gpus_by_index and spec.gpu_uuids:
                launch = await self._by_index(launch, spec)
        except EngineUnavailable as exc:
            return await self._fail(sh, str(exc))
        env = {
            **os.environ,
            **launch.env,
            **state.marks(self.state_dir, sh.shard_id, name, port, spec.model_dump_json()),
        }
        self.log_dir.mkdir(parents=True, exist_ok=True)
        sh.log.skip_to_end()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(sh.log.path, "ab") as log:
            log.write(
                f"--- llmgw {stamp}: starting {sh.shard_id}: {shlex.join(launch.argv)}\n".encode()
            )
        try:
            sh.process = EngineProcess.spawn(launch.argv, env, sh.log.path, self.log_dir)
        except OSError as exc:
            return await self._fail(sh, f"could not start {launch.argv[0]}: {exc}")
        sh.port = port
        sh.model_local = model_path
        if engine.adapters_at_start:
            self._started_with(sh, loaded)
        sh.gen += 1
        sh.stopping = False
        sh.started_at = sh.progress_at = time.monotonic()
        sh.timeout_s = self.startup_timeout_s or spec.startup_timeout_s
        sh.fetch_path, sh.fetch_bytes, sh.fetch_checked = weights_path(spec), -1, 0.0
        logger.info("shard %s: started %s as pid %s on port %s", sh.shard_id, name, sh.pid, port)
        await self._set(sh, ShardState.STARTING)
        self._spawn(self._monitor(sh, sh.gen))

    async def _by_index(self, launch: Launch, spec: DesiredShard) -> Launch:
        """The shard's GPUs as NVML indices, CUDA counting in the same (PCI bus) order:
        for an engine that reads CUDA_VISIBLE_DEVICES as integers."""
        if self._gpu_indices is None:
            return launch
        try:
            indices = await asyncio.to_thread(self._gpu_indices)
        except Exception as exc:  # noqa: BLE001 - NVML's own errors
            raise EngineUnavailable(f"could not read this node's GPUs: {exc}") from None
        missing = [u for u in spec.gpu_uuids if u not in indices]
        if missing:
            raise EngineUnavailable(f"GPU {missing[0]} is not on this node")
        visible = ",".join(str(indices[u]) for u in spec.gpu_uuids)
        env = {**launch.env, "CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        return replace(launch, env=env)

    async def _gpu_room(self, spec: DesiredShard) -> str:
        """Why the shard's GPUs do not have its budget free now, or "" (a share of GPUs:
        the engine would otherwise fail on its own, later, and less clearly)."""
        if self._gpu_memory is None:
            return ""
        try:
            now = await asyncio.to_thread(self._gpu_memory)
        except Exception as exc:  # noqa: BLE001 - NVML's own errors; the engine will say
            logger.warning("shard %s: could not read GPU memory: %s", spec.shard_id, exc)
            return ""
        budget = spec.profile.gpu_memory_gb
        for uuid in spec.gpu_uuids:
            total, used = now.get(uuid, (0, 0))
            if total and (total - used) < budget * 1024:
                return (
                    f"GPU {uuid} has {(total - used) / 1024:.1f} GB free of "
                    f"{total / 1024:.1f}; this shard's budget is {budget:g} GB"
                )
        return ""

    def _free_port(self, shard_id: str) -> int:
        lo, hi = self.port_range
        for port in range(lo, hi + 1):
            try:
                self._check_port(shard_id, port)
            except EngineUnavailable:
                continue
            return port
        raise EngineUnavailable(f"no free port in the engine port range {lo}-{hi}")

    def _check_port(self, shard_id: str, port: int) -> None:
        """Refuse a port another shard holds or another process listens on: never share one."""
        for other in self._shards.values():
            if other.shard_id != shard_id and other.port == port and other.alive():
                raise EngineUnavailable(f"port {port} is already in use by shard {other.shard_id}")
        problem = port_taken(self.host, port)
        if problem:
            raise EngineUnavailable(problem)

    async def _adopt(self, sh: Shard, pid: int, recorded: ShardState | None) -> None:
        sh.process = EngineProcess(pid)
        sh.gen += 1
        sh.stopping = False
        sh.started_at = sh.progress_at = time.monotonic()
        spec = sh.spec
        sh.timeout_s = self.startup_timeout_s or (spec.startup_timeout_s if spec else 1800.0)
        sh.fetch_path = weights_path(spec) if spec else None
        sh.log.skip_to_end()
        engine = self._engines.get(sh.engine)
        if recorded in (ShardState.DRAINING, ShardState.ASLEEP):
            sh.state = recorded  # an asleep engine may still answer its health check
        elif engine is None or (spec is not None and not engine.serves_http(spec)):
            sh.state = recorded if recorded in LIVE else ShardState.READY
        else:
            probe = await engine.probe(self.probe_host, sh.port)
            sh.state = {
                Probe.READY: ShardState.READY,
                Probe.LOADING: ShardState.LOADING,
                Probe.DOWN: ShardState.STARTING,
            }[probe]
        logger.info("shard %s: adopted pid %s, %s", sh.shard_id, pid, sh.state.value)
        self._spawn(self._monitor(sh, sh.gen))

    # ---- watching ----------------------------------------------------------------

    async def _monitor(self, sh: Shard, gen: int) -> None:
        engine = self._engines.get(sh.engine)
        while sh.gen == gen and not self._closed:
            sh.log.read_new()
            if not sh.alive():
                if sh.stopping or sh.gen != gen:
                    return
                if sh.state != ShardState.READY and self.adapter_start_failed(sh):
                    # An adapter it could not load: reported, and it starts without it.
                    sh.process, sh.state = None, ShardState.STARTING
                    await self._emit_status(sh)
                    self._spawn(self._converge(sh))
                    return
                code = sh.process.returncode
                return await self._fail(sh, exit_reason(code), exit_code=code)
            if sh.state in (ShardState.STARTING, ShardState.LOADING) and engine is not None:
                if await self._check_ready(sh, engine, gen):
                    return
            idle = sh.state in (ShardState.READY, ShardState.ASLEEP)
            try:
                await asyncio.wait_for(sh.nudge.wait(), TICK_READY_S if idle else TICK_STARTING_S)
            except TimeoutError:
                pass
            sh.nudge.clear()

    async def _check_ready(self, sh: Shard, engine: Engine, gen: int) -> bool:
        """One readiness step; True when the monitor is done (the shard failed)."""
        if sh.spec is not None and not engine.serves_http(sh.spec):
            # A multi-node follower has no endpoint; rank 0 cannot be ready until it joined.
            await self._set(sh, ShardState.READY)
            return False
        probe = await engine.probe(self.probe_host, sh.port)
        if sh.gen != gen or sh.stopping:
            return True
        if probe is Probe.READY:
            await self._set(sh, ShardState.READY)
            return False
        if probe is Probe.LOADING and sh.state == ShardState.STARTING:
            await self._set(sh, ShardState.LOADING)
        await self._watch_fetch(sh)
        if time.monotonic() < max(sh.started_at, sh.progress_at) + sh.timeout_s:
            return False
        error = f"the engine did not become ready within {sh.timeout_s:g} s"
        logger.warning("shard %s: %s; stopping it", sh.shard_id, error)
        sh.stopping = True
        await sh.process.terminate(self.stop_grace_s, f"shard {sh.shard_id}")
        await self._fail(sh, error, exit_code=sh.process.returncode)
        return True

    async def _watch_fetch(self, sh: Shard) -> None:
        now = time.monotonic()
        if sh.fetch_path is None or now - sh.fetch_checked < FETCH_CHECK_S:
            return
        sh.fetch_checked = now
        size = await asyncio.to_thread(tree_size, sh.fetch_path)
        grew = sh.fetch_bytes >= 0 and size > sh.fetch_bytes
        sh.fetch_bytes = size
        if grew:
            sh.progress_at = time.monotonic()
            await self._emit(sh.progress(size, None, str(sh.fetch_path)))

    # ---- stopping ----------------------------------------------------------------

    async def _drain(self, sh: Shard) -> None:
        """Wait for requests in flight to finish (the gateway already sends no more), then stop."""
        if sh.state != ShardState.DRAINING:
            await self._set(sh, ShardState.DRAINING)
        if not await self._finish_in_flight(sh, "draining"):
            await self._set(sh, ShardState.READY)  # drain called off
            return
        if sh.alive():
            await self._stop(sh, ShardState.STOPPED)

    async def _finish_in_flight(self, sh: Shard, target: str) -> bool:
        """Wait until the engine has nothing in flight, within the drain bound, while the
        target stays ``target``. False when the target went back to running (called off)."""
        engine = self._engines.get(sh.engine)
        serves = engine is not None and (sh.spec is None or engine.serves_http(sh.spec))
        start = time.monotonic()
        deadline = start + self.drain_timeout_s
        blind = start + min(self.drain_timeout_s, DRAIN_WITHOUT_METRIC_S)
        counted = False  # once the engine has counted, a probe it misses is not blindness
        while True:
            if sh.target == "running":
                return False
            if sh.target != target or not sh.alive():
                return True
            now = time.monotonic()
            # A follower rank has no requests of its own but carries the leader's:
            # it waits the whole bound (or until told to stop).
            in_flight = await engine.in_flight(self.probe_host, sh.port) if serves else None
            if in_flight == 0:
                return True
            counted = counted or in_flight is not None
            # An engine busy answering may miss a probe of its metrics (2 s): that says
            # nothing about what it has in flight, so only one that never counted waits
            # out the shorter bound.
            blind_now = in_flight is None and serves and not counted and now >= blind
            if now >= deadline or blind_now:
                logger.info("shard %s: %s ends with %s in flight", sh.shard_id, target, in_flight)
                return True
            await asyncio.sleep(DRAIN_POLL_S)

    # ---- sleeping and waking (docs/engines.md, "Sleep and wake") -----------------

    async def _converge_asleep(self, sh: Shard, alive: bool) -> None:
        """Put the engine to sleep once what is in flight is done: through its API where
        it has one (the process stays, its GPU memory released), else by stopping it
        (its weights stay in the page cache; a wake starts it again)."""
        if sh.state == ShardState.ASLEEP:
            return
        if not alive:
            # Never started, or gone: a wake starts it, as a sleep by stopping would.
            if sh.state != ShardState.FAILED or sh.before_launch:
                await self._set(sh, ShardState.ASLEEP)
            return
        if sh.state not in (ShardState.READY, ShardState.DRAINING):
            return  # still starting: it sleeps once it is ready (the transition converges)
        if not await self._finish_in_flight(sh, "asleep"):
            return  # woken before it slept
        if sh.target != "asleep" or not sh.alive():
            return
        engine = self._engines.get(sh.engine)
        spec = sh.spec or sh.want
        if engine is not None and spec is not None and engine.sleeps_in_place(spec):
            if not engine.serves_http(spec):
                await self._set(sh, ShardState.ASLEEP)  # rank 0 sleeps the whole engine
                return
            began = time.monotonic()
            problem = await engine.sleep(self.probe_host, sh.port, spec.sleep_level)
            if problem:
                logger.warning("shard %s: could not sleep: %s; stopping it", sh.shard_id, problem)
                await self._stop(sh, None)
                return await self._fail(sh, f"could not sleep: {problem}")
            logger.info(
                "shard %s: asleep (level %s) in %.2f s",
                sh.shard_id,
                spec.sleep_level,
                time.monotonic() - began,
            )
            await self._set(sh, ShardState.ASLEEP)
            return
        await self._stop(sh, ShardState.ASLEEP)
        if spec is not None:
            self._spawn(asyncio.to_thread(keep_cached, sh.model_local or weights_path(spec)))

    async def _wake(self, sh: Shard) -> None:
        """Wake an engine that sleeps through its API; ready once it answers its health check."""
        engine = self._engines.get(sh.engine)
        spec = sh.spec
        if engine is None or spec is None or not engine.serves_http(spec):
            await self._set(sh, ShardState.READY)
            return
        began = time.monotonic()
        problem = await engine.wake(self.probe_host, sh.port, spec)
        if problem:
            logger.warning("shard %s: could not wake: %s; stopping it", sh.shard_id, problem)
            await self._stop(sh, None)
            return await self._fail(sh, f"could not wake: {problem}")
        sh.started_at = sh.progress_at = time.monotonic()
        await self._set(sh, ShardState.LOADING)
        sh.nudge.set()  # its monitor checks readiness now, not at its idle tick's end
        logger.info("shard %s: woken in %.2f s", sh.shard_id, time.monotonic() - began)

    async def _stop(self, sh: Shard, final: ShardState | None) -> None:
        sh.stopping = True
        if sh.process is not None:
            await sh.process.terminate(self.stop_grace_s, f"shard {sh.shard_id}")
        sh.log.read_new()
        logger.info("shard %s: engine pid %s stopped", sh.shard_id, sh.pid)
        if final is not None:
            await self._set(sh, final)


def keep_cached(path: Path | None) -> None:
    """Ask the kernel to keep a stopped engine's weights in the page cache
    (POSIX_FADV_WILLNEED on each file), so its wake reads no disk where memory allows."""
    if path is None:
        return
    try:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    except OSError:
        return
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
