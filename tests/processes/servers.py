"""Control-plane processes and engines for tests: the web process (uvicorn through
``llmgw_site.serve``, as `make run` and production run it), a Celery worker
and beat, and the project's fake engine, each on the test database and Redis.

Use the ``live_web`` fixture (registered in conftest.py) with
``pytest.mark.django_db(transaction=True)`` so what the test writes is committed
where the server can read it.
"""

import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.processes.base import ROOT, free_port, subprocess_env, wait_for_port


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


def start_asgi(log_dir: Path, name: str, argv: list[str], port: int, **env) -> LiveServer:
    """An ASGI server (``python -m <argv>``) on ``port``, waited for until it listens."""
    log = log_dir / f"{name}-{port}.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv],
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
        raise RuntimeError(f"{name} did not start:\n{server.output()}") from None
    return server


_collected: set[str] = set()


def collect_static(**env) -> None:
    """``manage.py collectstatic`` into the state dir ``env`` names (else the run's), once.

    The web process runs the production settings: a page naming a static file needs the
    manifest collectstatic writes, or it is a 500, as at a deploy that skipped it.
    """
    state_dir = str(subprocess_env(**env).get("LLMGW_STATE_DIR", ""))
    if state_dir in _collected:
        return
    done = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--no-input", "--verbosity", "0"],
        cwd=ROOT,
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"collectstatic failed:\n{done.stdout}{done.stderr}")
    _collected.add(state_dir)


def start_web(
    log_dir: Path, port: int | None = None, args=(), name: str = "web", **env
) -> LiveServer:
    """The whole app as users run it: ``python -m llmgw_site.serve`` (uvicorn).

    ``args`` go to its command line (``--forwarded-allow-ips 127.0.0.5``). A given
    ``port`` lets a restarted web process come back where its agents reconnect;
    ``name`` begins its log's (``<name>-<port>.log``).
    """
    port = port or free_port()
    collect_static(**env)
    argv = ["llmgw_site.serve", "--host", "127.0.0.1", "--port", str(port), *args]
    return start_asgi(log_dir, name, argv, port, **env)


def start_uvicorn(log_dir: Path, **env) -> LiveServer:
    """The gateway alone on uvicorn (llmgw_site.gateway_asgi), as bench/gateway.py runs it."""
    port = free_port()
    argv = ["uvicorn", "llmgw_site.gateway_asgi:application", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--loop", "uvloop", "--http", "httptools"]
    return start_asgi(log_dir, "uvicorn", argv, port, **env)


def start_celery(log_dir: Path, name: str, argv: list[str], **env) -> tuple[subprocess.Popen, Path]:
    """``celery -A llmgw_site <argv>`` (a worker or beat), its output in ``<name>.log``."""
    log = log_dir / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "llmgw_site", *argv],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def stop_all(procs, timeout: float = 20) -> None:
    """Terminate every process at once, then wait for each; kill one that does not go."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class FakeEngine:
    """The project's fake engine (``python -m agentd.engines.fake``) as a real process."""

    def __init__(self, tmp_path, name: str = "tiny", *extra: str):
        self.port = free_port()
        self.log = tmp_path / f"engine-{self.port}.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentd.engines.fake", "--port", str(self.port)]
                + ["--served-model-name", name, *extra],
                cwd=ROOT,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        wait_for_port(self.port, self.proc)

    def metrics(self) -> dict[str, float]:
        """Each series (its labels included, as written) and its value."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics").read().decode()
        samples = (line.rsplit(" ", 1) for line in text.splitlines() if line[:1] not in "#")
        return {k: float(v) for k, v in samples}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
