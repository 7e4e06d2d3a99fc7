"""What every process a test starts needs: the repository root, the test database's
environment, free ports, and waits that fail naming what they waited for."""

import fcntl
import os
import socket
import subprocess
import time
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def subprocess_env(**extra) -> dict:
    """The environment a control-plane subprocess needs to share the test database and Redis."""
    from django.conf import settings

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{db['NAME']}"
    else:
        user = db.get("USER") or ""
        auth = f"{user}:{db['PASSWORD']}@" if db.get("PASSWORD") else (f"{user}@" if user else "")
        host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
        url = f"postgres://{auth}{host}:{port}/{db['NAME']}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "REDIS_URL": settings.REDIS_URL,
        "LLMGW_CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        "PYTHONUNBUFFERED": "1",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def free_port() -> int:
    """A port nothing listens on, for a server a test is about to start.

    Taken from a block ``port_block`` claimed for this process, not from the
    kernel's ephemeral range: a port that was free there a moment ago can be
    taken by any outgoing connection before the server binds it, which failed a
    CI run with "address already in use".
    """
    while True:
        if not _spare:
            lo, hi = port_block(UNIT)
            _spare.extend(range(hi, lo - 1, -1))
        port = _spare.pop()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # something outside the tests took it since the block was claimed
        return port


_handed_out: set[int] = set()
_spare: list[int] = []  # ports of this process's blocks that free_port has not handed out yet
# Blocks this process holds: an open file each, under an exclusive lock that other
# test processes (pytest-xdist's workers, another run on the machine) respect and
# the kernel drops when this process ends, however it ends.
_held: list = []
LOCK_DIR = Path(os.environ.get("TMPDIR") or "/tmp") / "llmgw-test-ports"
UNIT = 10  # ports per lock file; a block is claimed a unit at a time


def _claim(lo: int, size: int) -> bool:
    """Take the ports from ``lo`` for this process unless another test process holds one."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    taken = []
    for unit in range(lo - lo % UNIT, lo + size, UNIT):
        fh = open(LOCK_DIR / f"{unit}.lock", "a")  # noqa: SIM115 (held until the process ends)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            for other in taken:
                other.close()  # closing the file drops its lock
            return False
        taken.append(fh)
    _held.extend(taken)
    return True


def port_block(size: int = 10) -> tuple[int, int]:
    """A range of ports nothing listens on now, apart per process and per call.

    Below 32000, out of the kernel's ephemeral range, so no outgoing connection
    takes one of them between this check and the engine's bind. A block is
    claimed under a file lock, so test processes running side by side never hand
    out the same one, even before anything listens on it.
    """
    base = 20000 + (os.getpid() * 37) % 10000
    base -= (base - 20000) % UNIT
    for lo in [*range(base, 32000, size), *range(20000, base, size)]:
        ports = range(lo, lo + size)
        if _handed_out.intersection(ports):
            continue
        free = True
        for port in ports:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    free = False
                    break
        if free and _claim(lo, size):
            _handed_out.update(ports)
            return lo, lo + size - 1
    raise RuntimeError(f"no free block of {size} ports below 32000")


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout:g} s")


def wait_for(check, what: str, timeout: float = 60, logs=(), interval: float = 0.2):
    """Poll ``check`` until it returns something truthy; fail naming ``what``, with the logs."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{tails(logs)}")
        time.sleep(interval)


def tails(paths, chars: int = 3000) -> str:
    out = []
    for p in paths:
        p = Path(p)
        if p.exists():
            out.append(f"\n--- {p.name}\n{p.read_text(errors='replace')[-chars:]}")
    return "".join(out)


def pid_alive(pid: int) -> bool:
    from agentd import state

    return state.start_ticks(pid) is not None
