"""What the supervisor knows about one shard, and how it is told to others.

The control plane hears of a shard as a ``ShardStatus`` (every transition) or a
``RunningShard`` (on register); the next agent hears of it through the state file.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from agentd import protocol, state
from agentd.protocol import DesiredShard, ShardState
from agentd.shardlog import ShardLog, bounded, reportable
from agentd.shardproc import EngineProcess

logger = logging.getLogger(__name__)

LAST_LINES = 50  # looked at for a failure report; what fits is sent (shardlog.reportable)
LIVE = (ShardState.STARTING, ShardState.LOADING, ShardState.READY, ShardState.DRAINING)


def identity(spec: DesiredShard) -> DesiredShard:
    """The parts of a spec that decide the process; a new timeout restarts nothing, and
    adapters are loaded and unloaded apart (``agentd.adapters``)."""
    return spec.model_copy(update={"state": "running", "startup_timeout_s": 1.0, "adapters": []})


def parse_spec(raw) -> DesiredShard | None:
    """A spec from the state file or an engine's mark; None if it no longer validates."""
    if not raw:
        return None
    try:
        if isinstance(raw, str):
            return DesiredShard.model_validate_json(raw)
        return DesiredShard.model_validate(raw, strict=False)
    except ValueError as exc:
        logger.warning("ignoring an unreadable shard spec: %s", exc)
        return None


class Shard:
    def __init__(self, shard_id: str, log_path: Path):
        self.shard_id = shard_id
        self.spec: DesiredShard | None = None  # what the process runs
        self.want: DesiredShard | None = None  # the newest desired entry
        self.target = "running"  # running | draining | asleep | stopped | absent
        self.engine = ""
        self.port = 0
        self.state = ShardState.PENDING
        self.error = ""
        self.failed_spec: DesiredShard | None = None  # what failed: the same again is no restart
        self.process: EngineProcess | None = None
        self.gen = 0  # one per process, so a stale monitor knows to leave
        self.stopping = False  # an exit now is ours, not a failure
        self.started_at = 0.0
        self.progress_at = 0.0
        self.timeout_s = 1800.0
        self.fetch_path: Path | None = None
        self.fetch_bytes = -1
        self.fetch_checked = 0.0
        self.fetching: str | None = None  # the source whose fetch this shard waits for
        self.model_local: Path | None = None  # the fetched weights it was started with
        # LoRA adapters (agentd.adapters): name -> {"name", "state", "error", "id"?}; the
        # local paths llama.cpp was started with; adapters being fetched.
        self.adapters: dict[str, dict] = {}
        self.adapter_paths: dict[str, str] = {}
        self.adapter_fetches: dict[str, str] = {}  # name -> source, while it is fetched
        self.lock = asyncio.Lock()  # one change at a time: start, stop, drain
        # Set to have the monitor look now rather than at its next tick (a wake).
        self.nudge = asyncio.Event()
        self.log = ShardLog(log_path)

    @property
    def spec_or_want(self) -> DesiredShard | None:
        return self.spec or self.want

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    @property
    def before_launch(self) -> bool:
        """Starting, with no engine process yet: its weights are being fetched."""
        return self.state == ShardState.STARTING and self.process is None

    def status(self, exit_code: int | None = None) -> protocol.ShardStatus:
        spec = self.spec_or_want
        failed = self.state == ShardState.FAILED
        return protocol.ShardStatus(
            type="shard_status",
            shard_id=self.shard_id,
            replica_id=spec.replica_id if spec else "",
            state=self.state.value,
            error=bounded(self.error),
            exit_code=exit_code,
            # Bounded and cleaned (agentd.shardlog.reportable): the log file has the rest.
            last_output=reportable(self.log.recent(LAST_LINES)) if failed else [],
            adapters=[
                protocol.AdapterStatus(
                    name=a["name"], state=a["state"], error=a.get("error", ""), id=a.get("id")
                )
                for a in sorted(self.adapters.values(), key=lambda a: a["name"])
            ],
        )

    def progress(self, done: int, total: int | None, source: str) -> protocol.FetchProgress:
        spec = self.spec_or_want
        return protocol.FetchProgress(
            type="fetch_progress",
            shard_id=self.shard_id,
            replica_id=spec.replica_id if spec else "",
            source=source[:1024],
            bytes_done=done,
            bytes_total=total,
        )

    def running(self) -> protocol.RunningShard:
        spec = self.spec_or_want
        return protocol.RunningShard(
            shard_id=self.shard_id,
            replica_id=spec.replica_id if spec else "",
            rank=spec.rank if spec else 0,
            gpu_uuids=list(spec.gpu_uuids) if spec else [],
            hcas=list(spec.hcas) if spec else [],
            nnodes=spec.nnodes if spec else 1,
            fabric=spec.fabric if spec else "",
            port=self.port,
            state=self.state.value,
            model=spec.model if spec else "",
            profile=spec.profile.name if spec else "",
            pid=self.pid if self.alive() else None,
        )

    def record(self) -> state.ShardRecord:
        spec = self.spec_or_want
        alive = self.alive()
        return state.ShardRecord(
            shard_id=self.shard_id,
            engine=self.engine,
            port=self.port,
            state=self.state.value,
            target=self.target if self.target != "absent" else "stopped",
            pid=self.pid if alive else None,
            start_ticks=self.process.ticks if alive else None,
            spec=spec.model_dump(mode="json") if spec else None,
            error=self.error,
            adapters={"held": self.adapters, "paths": self.adapter_paths}
            if self.adapters
            else None,
        )

    def restore(self, rec: state.ShardRecord) -> None:
        """Take back what the state file says (the process is adopted separately)."""
        self.engine, self.port, self.target, self.error = (
            rec.engine,
            rec.port,
            rec.target,
            rec.error,
        )
        self.spec = self.want = parse_spec(rec.spec)
        adapters = rec.adapters or {}
        self.adapters = {
            n: a for n, a in (adapters.get("held") or {}).items() if a.get("state") != "loading"
        }
        self.adapter_paths = dict(adapters.get("paths") or {})
        if self.want and rec.target != self.want.state:
            self.want = self.want.model_copy(update={"state": rec.target})
