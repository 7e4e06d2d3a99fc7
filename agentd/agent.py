"""The agent's state and what it does with each message; agentd/client.py moves the bytes.

The agent outlives any one connection: the desired set it converges to, the
facts it has already told the control plane, and the messages waiting to be
sent all live here, so a reconnect resumes rather than starts over. This module
changes when the session's side of the agent changes (what it tells the control
plane, what it does with each message); its engine installs are
``agentd.provisioning``'s and the supervisor it drives is seen through
``agentd.supervised``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable

from agentd import __version__, logs, ports, protocol, weights
from agentd.config import Config
from agentd.discovery import Machine
from agentd.fetch import store as fetchstore
from agentd.gpuwatch import SLOWDOWN_POLL_S, GPUWatch
from agentd.load import LoadSampler
from agentd.notice import NoticeWatch
from agentd.nvml import Checks
from agentd.outbox import Outbox
from agentd.provisioning import EngineInstalls
from agentd.supervised import NoShards, Shards

logger = logging.getLogger(__name__)

# Weights dirs can hold thousands of files; sizing them every heartbeat is
# waste when they change a few times a day. A removal rescans at once.
WEIGHTS_RESCAN_S = 60.0
# Engines are installed by someone at a keyboard: a minute's delay in noticing
# one is invisible, while a probe may start a Python that imports vLLM.
ENGINE_REPROBE_S = 60.0
# Shard states whose engine has just given its GPU memory back.
FREES_GPU_MEMORY = frozenset({protocol.ShardState.ASLEEP, protocol.ShardState.STOPPED})


class Agent:
    def __init__(
        self,
        cfg: Config,
        shards: Shards | None = None,
        machine: Machine | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.cfg = cfg
        self.shards: Shards = shards or NoShards()
        self.machine = machine or Machine(
            state_dir=cfg.state_dir,
            weights_dirs=list(cfg.weights_dirs),
            fabric_name=cfg.fabric_name,
            checks=Checks(
                ecc_error_threshold=cfg.gpu_checks.ecc_error_threshold,
                max_temperature_c=cfg.gpu_checks.max_temperature_c,
            ),
        )
        self.sampler = LoadSampler()
        self.state_file = cfg.state_dir / "agent-state.json"
        saved = self._load_state()
        self.desired_version = saved.get("desired_version", 0)
        self.weights_rescan_s = WEIGHTS_RESCAN_S
        self.slowdown_poll_s = SLOWDOWN_POLL_S
        # What the control plane has been told, so a heartbeat carries only news.
        self._lock = threading.Lock()
        self._seq = 0
        self._sent_memory: int | None = None
        self._sent_weights: list[protocol.Weights] | None = None
        self._weights_at = 0.0
        self._weights: list[protocol.Weights] = []
        self._sent_engines: dict[str, str] = {}
        self._sent_provision: list[protocol.EngineInstall] = []
        self._reported: set[tuple[int, str]] = set()
        # The engines the control plane wants and their installs; the wanted engines
        # last heard are saved, so a restarted agent runs its verified installs from
        # the start, before the control plane says them again.
        self.installs = EngineInstalls(
            cfg,
            lambda: self.shards,
            self.machine,
            saved=[protocol.EngineWant.model_validate(w) for w in saved.get("engines", []) or []],
            save_state=self._save_state,
            clock=clock,
        )
        # Messages for the control plane, sent in order whenever a socket is up;
        # bounded by coalescing, never by dropping news (agentd/outbox.py).
        self.outbox = Outbox()
        self.outbox_ready = asyncio.Event()
        # Set when a shard gave its GPU memory back (asleep, stopped): the next
        # heartbeat goes now, so the control plane sees the room without waiting
        # out the interval (a model waiting to wake there, docs/operations.md).
        self.beat_soon = asyncio.Event()
        self._pending_desired: protocol.Desired | None = None
        self._desired_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        # The driver's critical events (a thread of their own, from start()) and the
        # notice source agent.yaml names, if any.
        self.gpuwatch: GPUWatch | None = None
        self.notices: NoticeWatch | None = None
        if cfg.notice.source:
            self.notices = NoticeWatch(
                cfg.notice.source,
                url=cfg.notice.url,
                file=cfg.notice.file,
                timeout_s=cfg.notice.timeout_s,
            )

    # ---- lifetime ------------------------------------------------------------

    async def start(self) -> None:
        """Adopt what a previous agent left running, before the first register reports it."""
        self._loop = asyncio.get_running_loop()
        await self.shards.start()
        await self.installs.restore()
        # The supervisor keeps its own record of the newest version; the larger wins.
        self.desired_version = max(self.desired_version, self.shards.desired_version)
        self._tasks = [
            asyncio.ensure_future(self._converge_loop()),
            asyncio.ensure_future(self._reprobe_loop()),
            asyncio.ensure_future(self.installs.loop()),
        ]
        await self._watch_gpus()
        if self.notices is not None:
            self._tasks.append(asyncio.ensure_future(self._notice_loop()))

    async def close(self) -> None:
        """Stop watching. The engines keep running: they outlive the agent."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.gpuwatch is not None:
            # Before NVML is shut down under its event set.
            await asyncio.to_thread(self.gpuwatch.close)
        await self.shards.close()
        self.machine.close()

    def _load_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        self.cfg.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        wants = [w.model_dump() for w in self.installs.known()]
        tmp.write_text(json.dumps({"desired_version": self.desired_version, "engines": wants}))
        os.replace(tmp, self.state_file)

    def store_credential(self, secret: str) -> None:
        """Keep the node credential from enrolment: readable by this user only, written whole."""
        path = self.cfg.credential_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secret + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        logger.info("enrolled: node credential written to %s", path)

    def send(self, msg) -> None:
        """Queue a message for the control plane. Call on the event loop's thread."""
        self.outbox.put(msg)
        self.outbox_ready.set()

    def send_threadsafe(self, msg) -> None:
        """``send`` from another thread (the GPU event thread)."""
        try:
            self._loop.call_soon_threadsafe(self.send, msg)
        except RuntimeError:  # the loop has closed: the agent is stopping
            logger.info("not sent, the agent is stopping: %s", msg.type)

    def on_registered(self) -> None:
        """After each registration, before the outbox drains: what the control plane may
        have lost or not know yet, said again (slowdowns, a notice that still holds)."""
        if self.gpuwatch is not None:
            self.gpuwatch.resend()
        if self.notices is not None and (msg := self.notices.again()) is not None:
            self.send(msg)  # replaces one queued while disconnected, whose in_s is stale

    # ---- GPU events and notices -------------------------------------------------

    async def _watch_gpus(self) -> None:
        """The driver's critical events, where there is a driver and a GPU."""
        session = await asyncio.to_thread(self.machine.gpu_session)
        if session is None or not session.devices:
            return  # a CPU node: nothing to watch
        watch = GPUWatch(session, self.send_threadsafe, poll_s=self.slowdown_poll_s)
        try:
            await asyncio.to_thread(watch.start)
        except Exception:  # noqa: BLE001 - heartbeats still report the GPUs' problems
            logger.exception("watching NVML events failed to start; heartbeats go on without")
            return
        self.gpuwatch = watch

    async def _notice_loop(self) -> None:
        notices, every = self.notices, self.cfg.notice.poll_interval_s
        logger.info("asking %s for a notice every %g s", notices.describe(), every)
        while True:
            try:
                found = await asyncio.to_thread(notices.check)
                msg = notices.update(found)
                if msg is not None:
                    self.send(msg)
            except Exception:  # noqa: BLE001 - the next round asks again
                logger.exception("checking %s for a notice failed", notices.describe())
            await asyncio.sleep(every)

    async def on_shard_event(self, msg) -> None:
        """The supervisor's shard_status and fetch_progress, passed on as they come."""
        if msg.type == "fetch_progress" and msg.bytes_total == msg.bytes_done:
            self._weights_at = 0.0  # a fetch completed: the next heartbeat reports the entry
        self.send(msg)
        if msg.type == "shard_status" and msg.state in FREES_GPU_MEMORY:
            self.beat_soon.set()

    async def _reprobe_loop(self) -> None:
        while True:
            await asyncio.sleep(ENGINE_REPROBE_S)
            try:
                await self.shards.refresh()
            except Exception:  # noqa: BLE001 - the next round tries again
                logger.exception("probing the engines failed")

    # ---- what goes to the control plane ---------------------------------------

    def gpu_memory(self) -> dict[str, tuple[int, int]]:
        """Each GPU's (total, used) MiB by UUID, as NVML says now. Blocking."""
        return {g.uuid: (g.memory_total_mb, g.memory_used_mb) for g in self.machine.gpus()}

    def gpu_indices(self) -> dict[str, int]:
        """Each GPU's NVML index by UUID. Blocking."""
        return {g.uuid: g.index for g in self.machine.gpus()}

    def shard_facts(self) -> dict:
        """What the supervisor knows, read on the event loop: its state changes there, and
        reading it from the thread that collects a heartbeat could catch it mid-change."""
        return {
            "engines": self.installs.engine_versions(),
            "provision": self.installs.provision(),
            "groups": self.shards.process_groups(),
            "running": self.shards.running(),
            "using": self.shards.weights_in_use(),
        }

    def register_message(self, mgmt_addr: str = "", facts: dict | None = None) -> protocol.Register:
        """The whole inventory. Whatever it carries is what the control plane now knows.

        Blocking (NVML, statvfs, a weights walk): call it off the event loop with
        ``facts`` from ``shard_facts()`` taken on it.
        """
        facts = facts or self.shard_facts()
        labels = dict(self.cfg.labels)
        if self.cfg.engine_port_range != ports.DEFAULT_PORT_RANGE:
            # The control plane picks each shard's port; a range of this node's own
            # (two agents on one machine) reaches it as the label, unless one is set.
            labels.setdefault(
                ports.PORTS_LABEL, ports.format_port_range(self.cfg.engine_port_range)
            )
        inv = self.machine.inventory(
            node_id=self.cfg.node_id,
            labels=labels,
            mgmt_addr=self.cfg.mgmt_addr or mgmt_addr,
            engine_versions=facts["engines"],
        )
        with self._lock:
            self._sent_memory = inv["memory_total_mb"]
            self._weights = self._sent_weights = list(inv["weights"])
            self._weights_at = time.monotonic()
            self._sent_engines = dict(inv["engine_versions"])
            provision = self._sent_provision = facts["provision"]
            self._reported = {(g.index, p) for g in inv["gpus"] for p in g.problems}
        return protocol.Register(
            type="register",
            provision=provision,
            running_shards=facts["running"],
            desired_version=self.desired_version,
            **inv,
        )

    def heartbeat_message(self, facts: dict | None = None) -> protocol.Heartbeat:
        """Cheap facts, each only as often as it means something (docs/protocol.md).

        Blocking (NVML, statvfs, a weights walk): call it off the event loop, with
        ``facts`` from ``shard_facts()`` taken on it.
        """
        facts = facts or self.shard_facts()
        m = self.machine
        mounts = m.mounts()
        storage = m.storage(mounts)
        session = m.gpu_session()
        used = session.memory_used_mb() if session else []
        problems = session.problems(m.checks) if session else {}
        now = time.monotonic()
        weights = None
        if now - self._weights_at >= self.weights_rescan_s:
            for path in facts.get("using", []):
                # What running engines use was used now (at most every TOUCH_EVERY_S).
                if entry := fetchstore.entry_of(path, m.weights_dirs):
                    fetchstore.touch(entry, every=fetchstore.TOUCH_EVERY_S)
            weights = m.weights(mounts)
            fetchstore.sweep_abandoned(m.weights_dirs)
        memory = m.memory_total_mb()
        engines, provision = facts["engines"], facts["provision"]
        load = self.sampler.sample(facts["groups"], session.process_memory() if session else None)
        with self._lock:
            self._seq += 1
            hb = {"type": "heartbeat", "seq": self._seq, "storage": storage, "load": load}
            hb["gpu_memory_used_mb"] = used
            new = [
                protocol.GPUProblem(gpu_index=i, problem=p)
                for i, found in sorted(problems.items())
                for p in found
                if (i, p) not in self._reported
            ]
            for p in new:
                logger.warning("GPU %d has a new problem: %s", p.gpu_index, p.problem)
                self._reported.add((p.gpu_index, p.problem))
            hb["new_problems"] = new
            if weights is not None:
                self._weights, self._weights_at = weights, now
                if weights != self._sent_weights:
                    hb["weights_changed"], hb["weights"] = True, weights
                    self._sent_weights = weights
            if memory is not None and memory != self._sent_memory:
                hb["memory_total_mb"] = self._sent_memory = memory
            if engines != self._sent_engines:
                hb["engines_changed"], hb["engine_versions"] = True, engines
                self._sent_engines = dict(engines)
            if provision != self._sent_provision:
                hb["provision_changed"], hb["provision"] = True, provision
                self._sent_provision = provision
            hb["desired_version"] = self.desired_version
        return protocol.Heartbeat(**hb)

    def bare_heartbeat(self) -> protocol.Heartbeat:
        """When collecting facts is stuck (a hung mount): still say the node is alive."""
        with self._lock:
            self._seq += 1
            return protocol.Heartbeat(
                type="heartbeat", seq=self._seq, desired_version=self.desired_version
            )

    # ---- what comes from the control plane ------------------------------------

    async def handle(self, msg) -> None:
        kind = msg.type
        if kind == "desired":
            self.on_desired(msg)
        elif kind == "provision":
            self.installs.on_provision(msg)
        elif kind == "remove_weights":
            self.send(await asyncio.to_thread(self.on_remove_weights, msg))
        elif kind == "logs_request":
            self.send(await asyncio.to_thread(self.logs_reply, msg))
        # ServerAck needs nothing: the client reads the register ack itself.

    def on_desired(self, msg: protocol.Desired) -> None:
        """Fencing: converge to the newest version seen; an older one is a late arrival."""
        newest = max(self.desired_version, getattr(self._pending_desired, "version", 0))
        if msg.version < newest:
            logger.info("ignoring desired set v%d: v%d is newer", msg.version, newest)
            return
        if msg.version == self.desired_version and self._pending_desired is None:
            # A repeat (a heal after a lost ack): nothing to do but say so again.
            self.send(protocol.AgentAck(type="ack", of="desired", version=msg.version))
            return
        self._pending_desired = msg
        self._desired_wakeup.set()

    async def _converge_loop(self) -> None:
        while True:
            await self._desired_wakeup.wait()
            self._desired_wakeup.clear()
            msg, self._pending_desired = self._pending_desired, None
            if msg is None or msg.version < self.desired_version:
                continue
            ok, detail = True, ""
            try:
                await self.shards.apply(msg)
            except Exception as exc:  # noqa: BLE001 - reported, and the next version retries
                logger.exception("applying desired set v%d failed", msg.version)
                ok, detail = False, f"applying desired set v{msg.version} failed: {exc}"[:4096]
            self.desired_version = msg.version
            self._save_state()
            logger.info("converged to desired set v%d (%d shards)", msg.version, len(msg.shards))
            self.send(
                protocol.AgentAck(
                    type="ack", of="desired", version=msg.version, ok=ok, detail=detail
                )
            )

    def logs_reply(self, msg: protocol.LogsRequest) -> protocol.LogsReply:
        sources = [logs.AGENT_SOURCE, *self.shards.sources()]
        error, lines = "", []
        if msg.source == logs.AGENT_SOURCE:
            try:
                lines = logs.tail(self.cfg.log_path, msg.lines)
            except OSError as exc:
                error = f"cannot read the agent log {self.cfg.log_path}: {exc.strerror or exc}"
        else:
            found = self.shards.tail(msg.source, msg.lines)
            if found is None:
                error = f"no log source '{msg.source}' on this node"
            else:
                lines = found
        return protocol.LogsReply(
            type="logs_reply",
            request_id=msg.request_id,
            lines=logs.fit_reply(lines),
            sources=sources,
            error=error,
        )

    def remove_weights(self, paths: list[str]) -> tuple[str, bool]:
        """Remove what the control plane proposed, each path checked again here."""
        out = weights.remove(paths, self.cfg.weights_dirs, self.shards.paths_in_use())
        self._weights_at = 0.0  # the next heartbeat rescans and reports the change
        return out.detail(), out.ok

    def on_remove_weights(self, msg: protocol.RemoveWeights) -> protocol.AgentAck:
        """A clean-up proposal, checked path by path against what this node knows now.

        Proposed against a desired set this node has not applied yet: everything
        is kept, since a shard of that set may need it. Otherwise a path is
        kept if a shard held here uses it or a desired one (started or not, a
        set still being applied included) wants it, an engine process holds it
        open, it is outside the weights dirs, or it changed since it was reported.
        """
        pending = self._pending_desired
        if msg.desired_version > self.desired_version:
            why = (
                f"proposed against desired set v{msg.desired_version}, "
                f"this node has applied v{self.desired_version}"
            )
            out = weights.Outcome(kept=[(p, why) for p in msg.paths])
        else:
            in_use = list(self.shards.paths_in_use())
            if pending is not None:
                in_use += [s.profile.model_path for s in pending.shards if s.state != "stopped"]
            with self._lock:
                reported = list(self._sent_weights or [])
            out = weights.remove(
                msg.paths,
                self.cfg.weights_dirs,
                in_use,
                sources={w.path: w.source for w in reported if w.source},
                reported={w.path: w.size_bytes for w in reported},
                held_open=weights.open_files(self.shards.process_groups().values()),
            )
            self._weights_at = 0.0  # the next heartbeat rescans and reports the change
        return protocol.AgentAck(
            type="ack",
            of="remove_weights",
            ok=out.ok,
            detail=out.detail(),
            request_id=msg.request_id,
            removed=out.removed,
            kept=[protocol.KeptWeights(path=p, reason=r[:4096]) for p, r in out.kept],
        )

    # ---- small things -----------------------------------------------------------

    @property
    def version(self) -> str:
        return __version__
