"""The supervisor's memory across restarts: a state file, and the marks engines carry.

The state file (``shards.json`` in the state dir) records each shard's PID, the
process's start time and its spec, written atomically so that a kill -9 at any
moment leaves either the old file or the new one. A restarted agent adopts a
recorded engine only if that PID is still the same process (same start time)
and still carries the shard's mark in its environment: PIDs are reused.

The mark (``LLMGW_SHARD_ID`` plus ``LLMGW_AGENT_STATE_DIR``) is also how an
agent whose state dir was wiped finds its engines again, so it never starts a
second copy beside one that is still running. The state dir is part of the mark
so two agents on one machine (tests do this) never take each other's engines.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

STATE_FILE = "shards.json"
MARK_SHARD = "LLMGW_SHARD_ID"
MARK_STATE_DIR = "LLMGW_AGENT_STATE_DIR"
MARK_ENGINE = "LLMGW_ENGINE"
MARK_PORT = "LLMGW_PORT"
# The shard's spec as JSON, so an agent without its state file still knows what
# it is running. Left out when it is too big for an environment variable.
MARK_SPEC = "LLMGW_SHARD_SPEC"
MAX_SPEC_ENV = 32 * 1024


@dataclass
class ShardRecord:
    """What the state file keeps about one shard."""

    shard_id: str
    engine: str
    port: int
    state: str
    target: str = "running"  # what the newest desired set asks: running, draining, stopped
    pid: int | None = None
    start_ticks: int | None = None  # /proc/<pid>/stat field 22: tells a reused PID apart
    spec: dict | None = None  # the DesiredShard it runs, as JSON
    error: str = ""
    # Its engine's LoRA adapters, so an agent that adopts it neither restarts it nor
    # loads them again: {"held": {name: status}, "paths": {name: local path}}.
    adapters: dict | None = None


def marks(state_dir: Path, shard_id: str, engine: str, port: int, spec_json: str) -> dict:
    """The environment variables that mark an engine as this agent's shard."""
    out = {
        MARK_SHARD: shard_id,
        MARK_STATE_DIR: str(state_dir),
        MARK_ENGINE: engine,
        MARK_PORT: str(port),
    }
    if len(spec_json) <= MAX_SPEC_ENV:
        out[MARK_SPEC] = spec_json
    return out


def load(state_dir: Path) -> tuple[int, dict[str, ShardRecord]]:
    """The recorded desired version and shards; nothing if the file is missing or unreadable."""
    path = state_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
        version = int(data.get("desired_version", 0))
        shards = {s["shard_id"]: ShardRecord(**s) for s in data.get("shards", [])}
    except FileNotFoundError:
        return 0, {}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        # A damaged file must not stop the agent: the marks still find the engines.
        logger.warning("state file %s is unreadable, ignoring it: %s", path, exc)
        return 0, {}
    return version, shards


def save(state_dir: Path, desired_version: int, shards: dict[str, ShardRecord]) -> None:
    """Write the state file atomically: a temporary file, fsync, rename."""
    state_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "desired_version": desired_version,
        "shards": [asdict(r) for r in sorted(shards.values(), key=lambda r: r.shard_id)],
    }
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".shards.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, state_dir / STATE_FILE)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ---- /proc --------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may contain spaces and parentheses.
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest  # rest[0] is field 3 (state)


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot); None if it is gone or a zombie."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22


def process_group(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None  # field 5


def environ(pid: int) -> dict[str, str] | None:
    """A process's environment, or None if it is gone or not ours to read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def is_marked(env: dict[str, str] | None, shard_id: str, state_dir: Path) -> bool:
    return (
        bool(env) and env.get(MARK_SHARD) == shard_id and env.get(MARK_STATE_DIR) == str(state_dir)
    )


def still_running(pid: int, ticks: int | None, shard_id: str, state_dir: Path) -> bool:
    """Whether this PID is still the engine we started for this shard."""
    now = start_ticks(pid)
    if now is None or (ticks is not None and now != ticks):
        return False
    return is_marked(environ(pid), shard_id, state_dir)


def find_marked(state_dir: Path) -> dict[str, tuple[int, dict[str, str]]]:
    """Engines carrying this agent's mark: shard id -> (pid, environment).

    Only group leaders count: an engine's workers inherit its environment, mark
    and all, but the process the agent started leads its own group.
    """
    found: dict[str, tuple[int, dict[str, str]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = environ(pid)
        if not env or env.get(MARK_STATE_DIR) != str(state_dir) or MARK_SHARD not in env:
            continue
        if process_group(pid) != pid or start_ticks(pid) is None:
            continue
        found[env[MARK_SHARD]] = (pid, env)
    return found
