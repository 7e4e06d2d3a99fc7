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
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from agentd import protocol, state
from agentd.engines import Engine, EngineUnavailable, Probe, make_engines
from agentd.protocol import DesiredShard, ShardState

logger = logging.getLogger(__name__)

Event = protocol.ShardStatus | protocol.FetchProgress
OnEvent = Callable[[Event], Awaitable[None]]

TICK_STARTING_S = 0.2  # while waiting for readiness: tests and operators both want it prompt
TICK_READY_S = 1.0  # once ready, only "is it still alive": a waitpid or a /proc read
FETCH_CHECK_S = 1.0
DRAIN_POLL_S = 0.25
DRAIN_WITHOUT_METRIC_S = 30.0  # engines that cannot count requests in flight
KILL_WAIT_S = 5.0
RING_LINES = 1000
LAST_LINES = 50  # sent with a failure
MAX_LOG_BYTES = 64 * 1024 * 1024
LIVE = (ShardState.STARTING, ShardState.LOADING, ShardState.READY, ShardState.DRAINING)


def _identity(spec: DesiredShard) -> DesiredShard:
    """The parts of a spec that decide the process; a new timeout restarts nothing."""
    return spec.model_copy(update={"state": "running", "startup_timeout_s": 1.0})


def exit_reason(code: int | None) -> str:
    if code is None:
        return "the engine exited (its exit code is unknown: the agent restarted since)"
    if code < 0:
        try:
            return f"the engine was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the engine was killed by signal {-code}"
    return f"the engine exited with code {code}"


class _Shard:
    """What the supervisor knows about one shard."""

    def __init__(self, shard_id: str, log_path: Path):
        self.shard_id = shard_id
        self.log_path = log_path
        self.spec: DesiredShard | None = None  # what the process runs
        self.want: DesiredShard | None = None  # the newest desired entry
        self.target = "running"  # running | draining | stopped | absent
        self.engine = ""
        self.port = 0
        self.state = ShardState.PENDING
        self.error = ""
        self.failed_spec: DesiredShard | None = None
        self.pid: int | None = None
        self.ticks: int | None = None
        self.proc: subprocess.Popen | None = None  # only for processes this agent started
        self.gen = 0  # one per process, so a stale monitor knows to leave
        self.stopping = False
        self.started_at = 0.0
        self.progress_at = 0.0
        self.timeout_s = 1800.0
        self.fetch_path: Path | None = None
        self.fetch_bytes = -1
        self.fetch_checked = 0.0
        self.lock = asyncio.Lock()
        self.ring: collections.deque[str] = collections.deque(maxlen=RING_LINES)
        self.log_pos = 0
        self.partial = b""

    @property
    def spec_or_want(self) -> DesiredShard | None:
        return self.spec or self.want


class Supervisor:
    """Runs this node's shards. The agent calls it; it never talks to the control plane itself.

    ``state_dir`` holds the state file and ``shards/<id>.log``. ``port_range``
    (inclusive) is where a shard without a port gets one. ``binaries`` names an
    engine's binary by hand (a Python interpreter for SGLang, llama-cpp-python
    or the fake engine); ``disabled`` engines are never run or advertised.
    ``on_event`` receives every ShardStatus and FetchProgress. ``startup_timeout_s``,
    when set, replaces each shard's own. Stop is SIGTERM to the process group,
    SIGKILL after ``stop_grace_s``; drain waits up to ``drain_timeout_s`` for
    requests in flight. Engines listen on ``host``.

    Call ``start()`` once before anything else, and ``close()`` at the end.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        port_range: tuple[int, int],
        binaries: dict[str, str] | None = None,
        disabled: list[str] | None = None,
        on_event: OnEvent | None = None,
        startup_timeout_s: float | None = None,
        stop_grace_s: float = 30,
        drain_timeout_s: float = 300,
        host: str = "0.0.0.0",
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
        self._engines: dict[str, Engine] = make_engines(binaries)
        self._disabled = set(disabled or [])
        self._on_event = on_event
        self._shards: dict[str, _Shard] = {}
        self._version = 0
        self._versions: dict[str, str] = {}
        self._unavailable: dict[str, str] = {}
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
        died: list[_Shard] = []
        for rec in records.values():
            sh = self._new_shard(rec.shard_id)
            sh.engine, sh.port, sh.target, sh.error = rec.engine, rec.port, rec.target, rec.error
            sh.spec = sh.want = self._parse_spec(rec.spec)
            if sh.want and rec.target != sh.want.state:
                sh.want = sh.want.model_copy(update={"state": rec.target})
            if rec.pid and state.still_running(
                rec.pid, rec.start_ticks, sh.shard_id, self.state_dir
            ):
                marked.pop(sh.shard_id, None)
                await self._adopt(sh, rec.pid, ShardState(rec.state))
            elif rec.state in LIVE:
                sh.state, sh.pid = ShardState.FAILED, None
                sh.error = exit_reason(None)
                sh.failed_spec = sh.spec
                died.append(sh)
            else:
                sh.state = state_from(rec.state)
        for shard_id, (pid, env) in marked.items():
            sh = self._new_shard(shard_id)
            sh.engine = env.get(state.MARK_ENGINE, "")
            sh.port = int(env.get(state.MARK_PORT) or 0)
            sh.spec = sh.want = self._parse_spec(env.get(state.MARK_SPEC))
            logger.info("adopting engine pid %s of shard %s found by its mark", pid, shard_id)
            await self._adopt(sh, pid, None)
        await self.probe_engines()
        self._save()
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
        out = []
        for sh in self._shards.values():
            if sh.state == ShardState.STOPPED:
                continue
            spec = sh.spec_or_want
            out.append(
                protocol.RunningShard(
                    shard_id=sh.shard_id,
                    replica_id=spec.replica_id if spec else "",
                    rank=spec.rank if spec else 0,
                    gpu_uuids=list(spec.gpu_uuids) if spec else [],
                    hcas=list(spec.hcas) if spec else [],
                    port=sh.port,
                    state=sh.state.value,
                    model=spec.model if spec else "",
                    profile=spec.profile.name if spec else "",
                    pid=sh.pid if self._alive(sh) else None,
                )
            )
        return out

    def process_groups(self) -> dict[str, int]:
        """Shard id -> process group id of its engine, for load sampling."""
        return {sid: sh.pid for sid, sh in self._shards.items() if sh.pid and self._alive(sh)}

    def engine_versions(self) -> dict[str, str]:
        """Probed versions of the engines that can run here (not disabled, installed)."""
        return dict(self._versions)

    def engine_problems(self) -> dict[str, str]:
        """Why each engine that cannot run here cannot, for operators."""
        return dict(self._unavailable)

    async def probe_engines(self) -> dict[str, str]:
        """Look for the engines again (versions are cached; this refreshes them)."""
        names = [n for n in self._engines if n not in self._disabled]
        results = await asyncio.gather(
            *(asyncio.to_thread(self._engines[n].version) for n in names), return_exceptions=True
        )
        versions, unavailable = {}, {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, EngineUnavailable):
                unavailable[name] = str(result)
            elif isinstance(result, BaseException):
                unavailable[name] = f"version probe failed: {result}"
            else:
                versions[name] = result
        self._versions, self._unavailable = versions, unavailable
        return dict(versions)

    def log_sources(self) -> list[str]:
        """The shards whose output can be shown."""
        return sorted(self._shards)

    def tail(self, source: str, lines: int) -> list[str]:
        """The last ``lines`` lines of a shard's output (its log file)."""
        sh = self._shards.get(source)
        if sh is None:
            known = ", ".join(self.log_sources()) or "none"
            raise KeyError(f"no log source {source!r} on this node; sources: {known}")
        return tail_file(sh.log_path, lines)

    async def fetch_progress(
        self, shard_id: str, bytes_done: int, bytes_total: int | None = None, source: str = ""
    ) -> None:
        """Progress of a weight fetch the agent runs itself: it pushes the startup deadline back."""
        sh = self._shards.get(shard_id)
        if sh is None:
            return
        sh.progress_at = time.monotonic()
        await self._emit_progress(sh, bytes_done, bytes_total, source)

    async def close(self) -> None:
        """Stop watching. The engines keep running; the next agent adopts them."""
        self._closed = True
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

    async def _converge(self, sh: _Shard) -> None:
        async with sh.lock:
            if self._closed:
                return
            alive = self._alive(sh)
            if sh.target == "running":
                await self._converge_running(sh, alive)
            elif sh.target == "draining":
                if alive:
                    await self._drain(sh)
                elif sh.state in (ShardState.PENDING, ShardState.FAILED):
                    sh.failed_spec = None
                    await self._set(sh, ShardState.STOPPED)
            else:
                if alive:
                    await self._stop(sh, ShardState.STOPPED)
                elif sh.state in (ShardState.PENDING, ShardState.FAILED):
                    sh.failed_spec = None
                    await self._set(sh, ShardState.STOPPED)
                if sh.target == "absent" and not self._alive(sh):
                    self._shards.pop(sh.shard_id, None)
                    self._save()

    async def _converge_running(self, sh: _Shard, alive: bool) -> None:
        want = sh.want
        if want is None:
            return
        if alive:
            if sh.spec is None:
                sh.spec = want  # adopted by its mark alone: now we know what it runs
            elif _identity(want) != _identity(sh.spec):
                logger.info("shard %s: spec changed, restarting its engine", sh.shard_id)
                await self._stop(sh, None)
                await self._start(sh, want)
            else:
                sh.spec = want
            return
        if sh.state in LIVE:
            return  # it just died: the monitor reports it, and nothing restarts it here
        if sh.state == ShardState.FAILED and sh.failed_spec is not None:
            if _identity(want) == _identity(sh.failed_spec):
                return
        await self._start(sh, want)

    async def _start(self, sh: _Shard, spec: DesiredShard) -> None:
        sh.spec, sh.failed_spec, sh.error = spec, None, ""
        sh.engine = name = spec.profile.engine
        engine = self._engines.get(name)
        try:
            if name in self._disabled:
                raise EngineUnavailable(f"engine {name} is disabled on this node")
            if engine is None:
                known = ", ".join(sorted(n for n in self._engines if n not in self._disabled))
                raise EngineUnavailable(f"engine {name!r} is not available here (known: {known})")
            engine.command()  # installed since the last probe, or removed?
            serves = engine.serves_http(spec)
            port = spec.port or (self._free_port(sh.shard_id) if serves else 0)
            if serves:
                self._check_port(sh.shard_id, port)
            launch = engine.build(spec.profile, spec, host=self.host, port=port)
        except EngineUnavailable as exc:
            return await self._fail(sh, str(exc))
        env = {**os.environ, **launch.env, **self._marks(sh.shard_id, name, port, spec)}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            sh.log_pos = sh.log_path.stat().st_size
        except FileNotFoundError:
            sh.log_pos = 0
        sh.partial = b""
        with open(sh.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(
                f"--- llmgw {stamp}: starting {sh.shard_id}: {shlex.join(launch.argv)}\n".encode()
            )
            log.flush()
            try:
                proc = subprocess.Popen(
                    launch.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.log_dir,
                    start_new_session=True,  # its own session and group: it outlives us
                )
            except OSError as exc:
                return await self._fail(sh, f"could not start {launch.argv[0]}: {exc}")
        sh.proc, sh.pid, sh.port = proc, proc.pid, port
        sh.ticks = state.start_ticks(proc.pid)
        sh.gen += 1
        sh.stopping = False
        sh.started_at = sh.progress_at = time.monotonic()
        sh.timeout_s = self.startup_timeout_s or spec.startup_timeout_s
        sh.fetch_path, sh.fetch_bytes, sh.fetch_checked = fetch_path(spec), -1, 0.0
        logger.info("shard %s: started %s as pid %s on port %s", sh.shard_id, name, proc.pid, port)
        await self._set(sh, ShardState.STARTING)
        self._spawn(self._monitor(sh, sh.gen))

    def _marks(self, shard_id: str, engine: str, port: int, spec: DesiredShard) -> dict[str, str]:
        marks = {
            state.MARK_SHARD: shard_id,
            state.MARK_STATE_DIR: str(self.state_dir),
            state.MARK_ENGINE: engine,
            state.MARK_PORT: str(port),
        }
        spec_json = spec.model_dump_json()
        if len(spec_json) <= state.MAX_SPEC_ENV:
            marks[state.MARK_SPEC] = spec_json
        return marks

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
            if other.shard_id != shard_id and other.port == port and self._alive(other):
                raise EngineUnavailable(f"port {port} is already in use by shard {other.shard_id}")
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            # SO_REUSEADDR as the engines' servers set it: a port in TIME_WAIT is
            # free for them, a port someone listens on is not.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((self.host or "0.0.0.0", port))
            except OSError as exc:
                raise EngineUnavailable(
                    f"port {port} is already in use by another process on this node"
                    f" ({exc.strerror})"
                ) from None

    async def _adopt(self, sh: _Shard, pid: int, recorded: ShardState | None) -> None:
        sh.pid, sh.ticks, sh.proc = pid, state.start_ticks(pid), None
        sh.gen += 1
        sh.stopping = False
        sh.started_at = sh.progress_at = time.monotonic()
        spec = sh.spec
        sh.timeout_s = self.startup_timeout_s or (spec.startup_timeout_s if spec else 1800.0)
        sh.fetch_path = fetch_path(spec) if spec else None
        sh.ring.extend(tail_file(sh.log_path, LAST_LINES))
        try:
            sh.log_pos = sh.log_path.stat().st_size
        except FileNotFoundError:
            sh.log_pos = 0
        engine = self._engines.get(sh.engine)
        if recorded == ShardState.DRAINING:
            sh.state = ShardState.DRAINING
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

    async def _monitor(self, sh: _Shard, gen: int) -> None:
        engine = self._engines.get(sh.engine)
        while sh.gen == gen and not self._closed:
            self._read_log(sh)
            if not self._alive(sh):
                if sh.stopping or sh.gen != gen:
                    return
                code = sh.proc.returncode if sh.proc else None
                return await self._fail(sh, exit_reason(code), exit_code=code)
            if sh.state in (ShardState.STARTING, ShardState.LOADING) and engine is not None:
                if await self._check_ready(sh, engine, gen):
                    return
            await asyncio.sleep(TICK_READY_S if sh.state == ShardState.READY else TICK_STARTING_S)

    async def _check_ready(self, sh: _Shard, engine: Engine, gen: int) -> bool:
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
        await self._terminate(sh)
        self._read_log(sh)
        await self._fail(sh, error, exit_code=sh.proc.returncode if sh.proc else None)
        return True

    async def _watch_fetch(self, sh: _Shard) -> None:
        now = time.monotonic()
        if sh.fetch_path is None or now - sh.fetch_checked < FETCH_CHECK_S:
            return
        sh.fetch_checked = now
        size = await asyncio.to_thread(tree_size, sh.fetch_path)
        grew = sh.fetch_bytes >= 0 and size > sh.fetch_bytes
        sh.fetch_bytes = size
        if grew:
            sh.progress_at = time.monotonic()
            await self._emit_progress(sh, size, None, str(sh.fetch_path))

    def _alive(self, sh: _Shard) -> bool:
        if sh.pid is None:
            return False
        if sh.proc is not None:
            return sh.proc.poll() is None
        ticks = state.start_ticks(sh.pid)
        return ticks is not None and (sh.ticks is None or ticks == sh.ticks)

    # ---- stopping ----------------------------------------------------------------

    async def _drain(self, sh: _Shard) -> None:
        """Wait for requests in flight to finish (the gateway already sends no more), then stop."""
        if sh.state != ShardState.DRAINING:
            await self._set(sh, ShardState.DRAINING)
        engine = self._engines.get(sh.engine)
        serves = engine is not None and (sh.spec is None or engine.serves_http(sh.spec))
        start = time.monotonic()
        deadline = start + self.drain_timeout_s
        blind = start + min(self.drain_timeout_s, DRAIN_WITHOUT_METRIC_S)
        while True:
            if sh.target == "running":
                await self._set(sh, ShardState.READY)  # drain called off
                return
            if sh.target != "draining" or not self._alive(sh):
                break
            now = time.monotonic()
            # A follower rank has no requests of its own but carries the leader's:
            # it waits the whole bound (or until told to stop).
            in_flight = await engine.in_flight(self.probe_host, sh.port) if serves else None
            if in_flight == 0:
                break
            if now >= deadline or (in_flight is None and serves and now >= blind):
                logger.info("shard %s: drain ends with %s in flight", sh.shard_id, in_flight)
                break
            await asyncio.sleep(DRAIN_POLL_S)
        if self._alive(sh):
            await self._stop(sh, ShardState.STOPPED)

    async def _stop(self, sh: _Shard, final: ShardState | None) -> None:
        sh.stopping = True
        await self._terminate(sh)
        self._read_log(sh)
        logger.info("shard %s: engine pid %s stopped", sh.shard_id, sh.pid)
        if final is not None:
            await self._set(sh, final)

    async def _terminate(self, sh: _Shard) -> None:
        """SIGTERM to the whole group, SIGKILL after the grace period."""
        pgid = sh.pid
        if pgid is None:
            return
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        killed_at = None
        while self._group_alive(sh, pgid):
            now = time.monotonic()
            if killed_at is None and now >= deadline:
                logger.warning(
                    "shard %s: still running %gs after SIGTERM, SIGKILL",
                    sh.shard_id,
                    self.stop_grace_s,
                )
                _signal_group(pgid, signal.SIGKILL)
                killed_at = now
            elif killed_at is not None and now - killed_at > KILL_WAIT_S:
                logger.error("shard %s: process group %s survived SIGKILL", sh.shard_id, pgid)
                return
            await asyncio.sleep(0.05)

    def _group_alive(self, sh: _Shard, pgid: int) -> bool:
        if sh.proc is not None:
            sh.proc.poll()  # reap our child, or it lingers as a zombie in the group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # Zombies still count for killpg; a group of zombies is a dead group.
        return any(
            state.process_group(int(e.name)) == pgid and state.start_ticks(int(e.name)) is not None
            for e in os.scandir("/proc")
            if e.name.isdigit()
        )

    # ---- reporting ---------------------------------------------------------------

    async def _set(self, sh: _Shard, new: ShardState, error: str = "", exit_code=None) -> None:
        if sh.state == new and new != ShardState.FAILED:
            return
        sh.state, sh.error = new, error
        self._save()
        level = logging.WARNING if new == ShardState.FAILED else logging.INFO
        logger.log(level, "shard %s: %s%s", sh.shard_id, new.value, f" ({error})" if error else "")
        await self._emit_status(sh, exit_code)

    async def _fail(self, sh: _Shard, error: str, exit_code: int | None = None) -> None:
        self._read_log(sh)
        sh.failed_spec = sh.spec or sh.want
        await self._set(sh, ShardState.FAILED, error, exit_code)

    async def _emit_status(self, sh: _Shard, exit_code: int | None = None) -> None:
        spec = sh.spec_or_want
        last = []
        if sh.state == ShardState.FAILED:
            # NUL cannot be stored in PostgreSQL text and the protocol refuses it.
            last = [ln.replace("\x00", "")[:4096] for ln in list(sh.ring)[-LAST_LINES:]]
        msg = protocol.ShardStatus(
            type="shard_status",
            shard_id=sh.shard_id,
            replica_id=spec.replica_id if spec else "",
            state=sh.state.value,
            error=sh.error[:4096],
            exit_code=exit_code,
            last_output=last,
        )
        await self._emit(msg)

    async def _emit_progress(self, sh, done: int, total: int | None, source: str) -> None:
        spec = sh.spec_or_want
        msg = protocol.FetchProgress(
            type="fetch_progress",
            shard_id=sh.shard_id,
            replica_id=spec.replica_id if spec else "",
            source=source[:1024],
            bytes_done=done,
            bytes_total=total,
        )
        await self._emit(msg)

    async def _emit(self, msg: Event) -> None:
        if self._on_event is None:
            return
        try:
            await self._on_event(msg)
        except Exception:
            logger.exception("on_event failed for %s", msg.type)

    # ---- bookkeeping -------------------------------------------------------------

    def _new_shard(self, shard_id: str) -> _Shard:
        sh = _Shard(shard_id, self.log_dir / f"{shard_id}.log")
        self._shards[shard_id] = sh
        return sh

    @staticmethod
    def _parse_spec(raw) -> DesiredShard | None:
        if not raw:
            return None
        try:
            if isinstance(raw, str):
                return DesiredShard.model_validate_json(raw)
            return DesiredShard.model_validate(raw, strict=False)
        except ValueError as exc:
            logger.warning("ignoring an unreadable shard spec: %s", exc)
            return None

    def _save(self) -> None:
        records = {}
        for sid, sh in self._shards.items():
            spec = sh.spec_or_want
            alive = self._alive(sh)
            records[sid] = state.ShardRecord(
                shard_id=sid,
                engine=sh.engine,
                port=sh.port,
                state=sh.state.value,
                target=sh.target if sh.target != "absent" else "stopped",
                pid=sh.pid if alive else None,
                start_ticks=sh.ticks if alive else None,
                spec=spec.model_dump(mode="json") if spec else None,
                error=sh.error,
            )
        try:
            state.save(self.state_dir, self._version, records)
        except OSError:
            logger.exception("could not write the state file in %s", self.state_dir)

    def _read_log(self, sh: _Shard) -> None:
        """Move the engine's new output into the ring; rotate the file when it grows too big."""
        try:
            size = sh.log_path.stat().st_size
        except FileNotFoundError:
            return
        if size < sh.log_pos:
            sh.log_pos, sh.partial = 0, b""  # truncated under us
        if size > sh.log_pos:
            start = max(sh.log_pos, size - 4 * 1024 * 1024)
            with open(sh.log_path, "rb") as fh:
                fh.seek(start)
                data = sh.partial + fh.read(size - start)
            sh.log_pos = size
            *lines, sh.partial = data.split(b"\n")
            sh.ring.extend(ln.decode("utf-8", "replace").rstrip("\r") for ln in lines)
        if size > MAX_LOG_BYTES:
            # The engine holds the file open in append mode, so copy and truncate:
            # its next write lands at the start of the emptied file.
            shutil.copyfile(sh.log_path, sh.log_path.with_suffix(".log.1"))
            os.truncate(sh.log_path, 0)
            sh.log_pos, sh.partial = 0, b""


def state_from(value: str) -> ShardState:
    return protocol.shard_state_from_wire(value)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def fetch_path(spec: DesiredShard) -> Path | None:
    """Where the shard's weights land while they download: the model path, or its hub cache."""
    model = spec.profile.model_path or spec.model
    if os.path.isabs(model):
        return Path(model)
    if _REPO_ID.match(model):
        env = {**os.environ, **spec.profile.env}
        hub = env.get("HF_HUB_CACHE") or os.path.join(
            env.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
        )
        return Path(hub) / ("models--" + model.replace("/", "--"))
    return None


def tree_size(path: Path) -> int:
    """Bytes in regular files under path (symlinks not followed: the hub cache links blobs)."""
    try:
        if path.is_file():
            return path.stat().st_size
    except OSError:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_size
    return total


def tail_file(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a file, read backwards in blocks."""
    if lines <= 0:
        return []
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return []
    with fh:
        end = fh.seek(0, os.SEEK_END)
        data, pos = b"", end
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    text = data.decode("utf-8", "replace").splitlines()
    return text[-lines:]
