"""Real processes for tests: a Daphne serving llmgw against the test database.

Use the ``daphne_server`` fixture (registered in conftest.py) with
``pytest.mark.django_db(transaction=True)`` so what the test writes is committed
where the server can read it.
"""

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@dataclass
class LiveServer:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/agent/"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_daphne(log_dir: Path, port: int | None = None, **env) -> LiveServer:
    # A given port lets a restarted Daphne come back where its agents reconnect.
    port = port or free_port()
    log = log_dir / f"daphne-{port}.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "llmgw_site.asgi:application",
            ],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    server = LiveServer(proc, port, log)
    try:
        wait_for_port(port, proc)
    except Exception:
        server.stop()
        raise RuntimeError(f"daphne did not start:\n{server.output()}") from None
    return server
