"""The supervisor: starts, watches, drains and stops the engine processes of a node's shards.

Each shard's engine runs in a session and process group of its own, writing to
a log file of its own, so it outlives the agent: an agent upgrade or crash must
not take the models down with it. A restarted agent adopts what is still
running (see ``agentd.state``) and restarts none of it.

States (the seed's): pending -> starting (process launched) -> loading (it
answers HTTP but is not ready) -> ready -> draining -> stopped, or failed with
the exit code and the last lines of output. Every transition goes to
``on_event`` as a ``protocol.ShardStatus``; a weight download's progress goes
as ``protocol.FetchProgress`` and pushes the startup deadline back, because a
slow download that is moving is not a hung start.

The supervisor restarts nothing by itself: restarts, with their backoff, are
the control plane's decision. A failed shard stays failed while the desired
set keeps asking for the same thing; a changed spec, or a stop and a start, or
a new shard id starts it again.

This module decides what runs and reports it; the steps that act on one
engine process (launch, adopt, watch, drain, stop) are in ``agentd.lifecycle``,
a shard's LoRA adapters in ``agentd.adapters``, and its weights (fetched before
the start, counted in use) in ``agentd.shardweights``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from agentd import protocol, state
from agentd.adapters import AdapterLifecycle
from agentd.engines import Engine, EngineUnavailable, engine_classes, make_engines
from agentd.fetch.fetcher import Fetcher
from agentd.lifecycle import EngineLifecycle
from agentd.localpaths import LocalRoots
from agentd.protocol import ShardState
from agentd.shard import LIVE, Shard, identity, parse_spec
from agentd.shardproc import exit_reason
from agentd.shardweights import ShardWeights

logger = logging.getLogger(__name__)

# A configured engine's version probe may take this long before it counts as not
# answering (SGLang's imports the package); probes run off the heartbeat's path.
PROBE_BOUND_S = 30.0

Event = protocol.ShardStatus | protocol.FetchProgress
OnEvent = Callable[[Event], Awaitable[None]]


class Supervisor(EngineLifecycle, AdapterLifecycle, ShardWeights):
    """Runs this node's shards. The agent calls it; it never talks to the control plane itself.

    ``state_dir`` holds the state file and ``shards/<id>.log``. ``port_range``
    (inclusive) is where a shard without a port gets one. ``binaries`` names an
    engine's binary by hand (a Python interpreter for SGLang, llama-cpp-python
    or the fake engine); ``disabled`` engines are never run or advertised.
    ``allow_env`` names the loader-changing variables (``agentd.engineconfig.LOADER_ENV``)
    a profile's env may set here; a shard whose profile sets another fails.
    ``on_event`` receives every ShardStatus and FetchProgress. ``startup_timeout_s``,
    when set, replaces each shard's own. Stop is SIGTERM to the process group,
    SIGKILL after ``stop_grace_s``; drain waits up to ``drain_timeout_s`` for
    requests in flight. Engines listen on ``host``. ``fetcher`` fetches weights
    that profiles name by URL or hub repository (``agentd.fetch``); without
    one, such a shard fails saying so. ``gpu_memory`` says each GPU's (total,
    used) MiB by UUID, now (NVML; blocking): a shard with a share of its GPUs
    starts only where each has its budget free. ``gpu_indices`` maps each GPU's
    UUID to its NVML index, for engines that take GPUs by index only.
    ``model_dirs`` (agent.yaml's ``weights_dirs`` and ``model_dirs``) are where a
    local model path or adapter source may point; ``private_paths`` (the agent's
    own files) are never handed to an engine (``agentd.localpaths``). Without
    them, no local path is used; a hub id the engine resolves itself still is.

    Call ``start()`` once before anything else, and ``close()`` at the end.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        port_range: tuple[int, int],
        binaries: dict[str, str] | None = None,
        disabled: list[str] | None = None,
        allow_env: list[str] | None = None,
        on_event: OnEvent | None = None,
        startup_timeout_s: float | None = None,
        stop_grace_s: float = 30,
        drain_timeout_s: float = 300,
        host: str = "0.0.0.0",
        fetcher: Fetcher | None = None,
        gpu_memory: Callable[[], dict[str, tuple[int, int]]] | None = None,
        gpu_indices: Callable[[], dict[str, int]] | None = None,
        model_dirs: list[Path] | None = None,
        private_paths: list[Path] | None = None,
    ):
        lo, hi = port_range
        if not (1 <= lo <= hi <= 65535):
            raise ValueError(f"port_range {lo}-{hi} is not a range of TCP ports")
        self.state_dir = Path(state_dir).resolve()
        self.log_dir = self.state_dir / "shards"
        self.port_range = (lo, hi)
        self.host = host
        self.probe_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.drain_timeout_s = drain_timeout_s
        self._binaries = dict(binaries or {})
        self._engines: dict[str, Engine] = make_engines(binaries)
        self._disabled = set(disabled or [])
        self._allow_env = frozenset(allow_env or [])
        self._on_event = on_event
        self._fetcher = fetcher
        self._gpu_memory = gpu_memory
        self._gpu_indices = gpu_indices
        # Engines start in log_dir (agentd.shardproc), where a relative path resolves.
        self.local_roots = LocalRoots(
            roots=[Path(p) for p in model_dirs or []],
            private=[self.state_dir, *(Path(p) for p in private_paths or [])],
            cwd=self.log_dir,
        )
        self._shards: dict[str, Shard] = {}
        self._version = 0
        self._versions: dict[str, str] = {}
        self._unavailable: dict[str, str] = {}
        self._probed = False
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # ---- the interface the agent uses ----------------------------------------

    @property
    def desired_version(self) -> int:
        """The newest desired-set version seen (and persisted across restarts)."""
        return self._version

    async def start(self) -> None:
        """Adopt the engines a previous agent left running, and start watching them.

        A recorded engine is adopted only if its PID is still that process and
        carries the shard's mark; one that died meanwhile is reported failed.
        Engines with the mark but no record (a wiped state dir) are adopted too.
        Nothing is started or restarted here.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        version, records = state.load(self.state_dir)
        self._version = version
        marked = await asyncio.to_thread(state.find_marked, self.state_dir)
        died: list[Shard] = []
        for rec in records.values():
            sh = self._new_shard(rec.shard_id)
            sh.restore(rec)
            found = marked.pop(sh.shard_id, None)
            recorded = protocol.shard_state_from_wire(rec.state)
            if rec.pid and state.still_running(
                rec.pid, rec.start_ticks, sh.shard_id, self.state_dir
            ):
                await self._adopt(sh, rec.pid, recorded)
            elif found is not None:
                await self._adopt(sh, found[0], recorded)  # another PID carries the mark
            elif recorded == ShardState.STARTING and not rec.pid:
                # It was fetching its weights: the desired set continues the fetch
                # from the partial files, which is not a failure.
                sh.state, sh.process = ShardState.STARTING, None
            elif rec.state in LIVE:
                sh.state, sh.process = ShardState.FAILED, None
                sh.error = exit_reason(None)
                sh.failed_spec = sh.spec
                died.append(sh)
            else:
                sh.state = recorded
        for shard_id, (pid, env) in marked.items():
            sh = self._new_shard(shard_id)
            sh.engine = env.get(state.MARK_ENGINE, "")
            sh.port = int(env.get(state.MARK_PORT) or 0)
            sh.spec = sh.want = parse_spec(env.get(state.MARK_SPEC))
            logger.info("adopting engine pid %s of shard %s found by its mark", pid, shard_id)
            await self._adopt(sh, pid, None)
        await self.probe_engines()
        self._save()
        for sh in self._shards.values():
            if sh.before_launch and sh.target == "running":
                # Continue the fetch now: the control plane's desired set may be one
                # this agent has already applied, and then it is not applied again.
                self._spawn(self._converge(sh))
        for sh in died:
            logger.warning("shard %s: its engine died while the agent was down", sh.shard_id)
            await self._emit_status(sh)

    async def apply(self, desired: protocol.Desired) -> bool:
        """Converge to a desired set. An older version than the newest seen is ignored (False).

        The same version again is harmless: what already matches is left alone.
        Returns once every change is under way; stops and drains go on in the background.
        """
        if desired.version < self._version:
            logger.info("ignoring desired version %s: %s seen", desired.version, self._version)
            return False
        self._version = desired.version
        wanted = {s.shard_id: s for s in desired.shards}
        for shard_id, spec in wanted.items():
            sh = self._shards.get(shard_id)
            if sh is None:
                sh = self._new_shard(shard_id)
                sh.engine, sh.port = spec.profile.engine, spec.port
                await self._emit_status(sh)  # pending
            sh.want, sh.target = spec, spec.state
        for shard_id, sh in self._shards.items():
            if shard_id not in wanted:
                sh.target = "absent"
        self._save()
        for sh in list(self._shards.values()):
            self._spawn(self._converge(sh))
        return True

    def running_shards(self) -> list[protocol.RunningShard]:
        """Every shard not stopped, for register: the control plane adopts these."""
        return [sh.running() for sh in self._shards.values() if sh.state != ShardState.STOPPED]

    def process_groups(self) -> dict[str, int]:
        """Shard id -> process group id of its engine, for load sampling."""
        return {sid: sh.pid for sid, sh in self._shards.items() if sh.pid and sh.alive()}

    def engine_versions(self) -> dict[str, str]:
        """Probed versions of the engines that can run here (not disabled, installed)."""
        return dict(self._versions)

    def engine_problems(self) -> dict[str, str]:
        """Why each engine that cannot run here cannot, for operators."""
        return dict(self._unavailable)

    async def probe_engines(self) -> dict[str, str]:
        """Probe the engines agent.yaml names again; each probe bounded by ``PROBE_BOUND_S``.

        Only those: an engine merely found on PATH, or importable in the agent's
        own Python, is somebody's, not necessarily one that works, and placing on
        it is how a replica fails on a node nobody watches. Installed engines are
        the install loop's to report (agentd.install).
        """
        names = [n for n in self._binaries if n in self._engines and n not in self._disabled]
        tasks = [asyncio.ensure_future(asyncio.to_thread(self._engines[n].version)) for n in names]
        if tasks:
            await asyncio.wait(tasks, timeout=PROBE_BOUND_S)
        versions, unavailable = {}, {}
        for name, task in zip(names, tasks, strict=True):
            if not task.done():
                task.cancel()  # the thread finishes on its own; its answer is not waited for
                unavailable[name] = f"its version probe took longer than {PROBE_BOUND_S:g} s"
            elif isinstance(task.exception(), EngineUnavailable):
                unavailable[name] = str(task.exception())
            elif task.exception() is not None:
                unavailable[name] = f"version probe failed: {task.exception()}"
            else:
                versions[name] = task.result()
        if versions != self._versions and self._probed:
            logger.info(
                "engines named in the configuration changed: %s",
                ", ".join(f"{n} {v}" for n, v in sorted(versions.items())) or "none answers",
            )
        elif versions and not self._probed:
            logger.info(
                "engines named in the configuration: %s",
                ", ".join(f"{n} {v}" for n, v in sorted(versions.items())),
            )
        self._probed = True
        self._versions, self._unavailable = versions, unavailable
        return dict(versions)

    def use_installed(self, name: str, binary: str | None) -> None:
        """Run ``name`` from an installed build (its binary), or, with None, as agent.yaml says.

        An installed build is used first: it is the one that was seen to run here.
        Shards already running keep the process they have.
        """
        cls = engine_classes().get(name)
        if cls is None:
            return
        self._engines[name] = cls(binary or self._binaries.get(name))

    def log_sources(self) -> list[str]:
        """The shards whose output can be shown."""
        return sorted(self._shards)

    def tail(self, source: str, lines: int) -> list[str]:
        """The last ``lines`` lines of a shard's output (its log file)."""
        sh = self._shards.get(source)
        if sh is None:
            known = ", ".join(self.log_sources()) or "none"
            raise KeyError(f"no log source {source!r} on this node; sources: {known}")
        return sh.log.tail(lines)

    async def close(self) -> None:
        """Stop watching. The engines keep running; the next agent adopts them."""
        self._closed = True
        if self._fetcher is not None:
            await self._fetcher.close()  # partial files stay: the next agent continues them
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._save()

    # ---- converging ------------------------------------------------------------

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("supervisor task failed", exc_info=task.exception())

    async def _converge(self, sh: Shard) -> None:
        async with sh.lock:
            if self._closed:
                return
            alive = sh.alive()
            if sh.target != "running":
                self._release_fetch(sh)
            if sh.target == "running":
                await self._converge_running(sh, alive)
            elif sh.target == "asleep":
                await self._converge_asleep(sh, alive)
            elif sh.target == "draining":
                if alive:
                    await self._drain(sh)
                elif sh.state in (ShardState.PENDING, ShardState.FAILED) or sh.before_launch:
                    sh.failed_spec = None
                    await self._set(sh, ShardState.STOPPED)
            else:
                if alive:
                    await self._stop(sh, ShardState.STOPPED)
                elif sh.state in (ShardState.PENDING, ShardState.FAILED) or sh.before_launch:
                    sh.failed_spec = None
                    await self._set(sh, ShardState.STOPPED)
                if sh.target == "absent" and not sh.alive():
                    self._shards.pop(sh.shard_id, None)
                    self._save()

    async def _converge_running(self, sh: Shard, alive: bool) -> None:
        want = sh.want
        if want is None:
            return
        if alive:
            if sh.spec is None:
                sh.spec = want  # adopted by its mark alone: now we know what it runs
            elif sh.state == ShardState.ASLEEP and identity(want) == identity(sh.spec):
                await self._wake(sh)
                return
            elif identity(want) != identity(sh.spec):
                logger.info("shard %s: spec changed, restarting its engine", sh.shard_id)
                await self._stop(sh, None)
                await self._launch(sh, want)
                return
            else:
                sh.spec = want
            await self._converge_adapters(sh, want)
            return
        if sh.state in LIVE and not sh.before_launch:
            return  # it just died: the monitor reports it, and nothing restarts it here
        if sh.state == ShardState.FAILED and sh.failed_spec is not None:
            if identity(want) == identity(sh.failed_spec):
                return
        await self._launch(sh, want)

    async def _converge_adapters(self, sh: Shard, want: protocol.DesiredShard) -> None:
        """A serving engine's adapters, to match its desired entry (agentd.adapters)."""
        engine = self._engines.get(sh.engine)
        if engine is None or sh.state != ShardState.READY or not engine.serves_http(want):
            return  # once ready (the transition converges again)
        if not want.profile.max_adapters and not sh.adapters:
            return  # LoRA off, and nothing held
        self._release_adapters(sh, keep={a.name for a in want.adapters})
        if engine.adapters_at_start:
            await self._restart_for_adapters(sh, want)
        else:
            await self._runtime_adapters(sh, want)

    # ---- reporting ---------------------------------------------------------------

    async def _set(self, sh: Shard, new: ShardState, error: str = "", exit_code=None) -> None:
        if sh.state == new and new != ShardState.FAILED:
            return
        sh.state, sh.error = new, error
        self._save()
        if new == ShardState.READY and sh.want is not None and sh.want.profile.max_adapters:
            self._spawn(self._converge(sh))  # its adapters, now that it serves
        elif new == ShardState.READY and sh.target == "asleep":
            self._spawn(self._converge(sh))  # asked to sleep while it started
        level = logging.WARNING if new == ShardState.FAILED else logging.INFO
        logger.log(level, "shard %s: %s%s", sh.shard_id, new.value, f" ({error})" if error else "")
        await self._emit_status(sh, exit_code)

    async def _fail(self, sh: Shard, error: str, exit_code: int | None = None) -> None:
        sh.log.read_new()
        sh.failed_spec = sh.spec or sh.want
        await self._set(sh, ShardState.FAILED, error, exit_code)

    async def _emit_status(self, sh: Shard, exit_code: int | None = None) -> None:
        await self._emit(sh.status(exit_code))

    async def _emit(self, msg: Event) -> None:
        if self._on_event is None:
            return
        try:
            await self._on_event(msg)
        except Exception:
            logger.exception("on_event failed for %s", msg.type)

    # ---- bookkeeping -------------------------------------------------------------

    def _new_shard(self, shard_id: str) -> Shard:
        sh = Shard(shard_id, self.log_dir / f"{shard_id}.log")
        self._shards[shard_id] = sh
        return sh

    def _save(self) -> None:
        records = {sid: sh.record() for sid, sh in self._shards.items()}
        try:
            state.save(self.state_dir, self._version, records)
        except OSError:
            logger.exception("could not write the state file in %s", self.state_dir)
