"""One engine process: started in a session of its own, watched, and stopped as a group.

A process this agent started is its child (its exit code is known); one adopted
from an earlier agent is not, and is watched through /proc, its start time
guarding against a reused PID.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
from pathlib import Path

from agentd import state

logger = logging.getLogger(__name__)

KILL_WAIT_S = 5.0


class EngineProcess:
    def __init__(self, pid: int, proc: subprocess.Popen | None = None):
        self.pid = pid  # also the process group id: it leads its own group
        self.proc = proc
        self.ticks = state.start_ticks(pid)

    @classmethod
    def spawn(cls, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path):
        """Start it detached: own session and group, output to the log file, no stdin."""
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,  # SIGINT to the agent's terminal does not reach it
            )
        return cls(proc.pid, proc)

    @property
    def returncode(self) -> int | None:
        """The exit status when it is our child (negative: the signal); None when unknown."""
        return self.proc.returncode if self.proc is not None else None

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        ticks = state.start_ticks(self.pid)
        return ticks is not None and (self.ticks is None or ticks == self.ticks)

    async def terminate(self, grace_s: float, label: str) -> None:
        """SIGTERM to the whole group, SIGKILL after the grace period."""
        signal_group(self.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        killed_at = None
        while self.group_alive():
            now = loop.time()
            if killed_at is None and now >= deadline:
                logger.warning("%s: still running %g s after SIGTERM, SIGKILL", label, grace_s)
                signal_group(self.pid, signal.SIGKILL)
                killed_at = now
            elif killed_at is not None and now - killed_at > KILL_WAIT_S:
                logger.error("%s: process group %s survived SIGKILL", label, self.pid)
                return
            await asyncio.sleep(0.05)

    def group_alive(self) -> bool:
        if self.proc is not None:
            self.proc.poll()  # reap our child, or it lingers as a zombie in the group
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # Zombies still count for killpg; a group of zombies is a dead group.
        return any(
            state.process_group(int(e.name)) == self.pid
            and state.start_ticks(int(e.name)) is not None
            for e in os.scandir("/proc")
            if e.name.isdigit()
        )


def port_taken(host: str, port: int) -> str | None:
    """Why the port cannot be listened on here, or None when it is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as the engines' servers set it: a port in TIME_WAIT is
        # free for them, a port someone listens on is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host or "0.0.0.0", port))
        except OSError as exc:
            return f"port {port} is already in use by another process on this node ({exc.strerror})"
    return None


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exit_reason(code: int | None) -> str:
    if code is None:
        return "the engine exited (its exit code is unknown: the agent restarted since)"
    if code < 0:
        try:
            return f"the engine was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the engine was killed by signal {-code}"
    return f"the engine exited with code {code}"
