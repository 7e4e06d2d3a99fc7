"""Pieces the benchmarks share: scratch databases, levels run in child processes,
a web process, CPU/RSS sampling, and the gateway benchmarks' processes,
environment and wrk runs.

Benchmarks run the real control plane as a subprocess, never in-process, so
what they measure is what an operator would run. Nothing here imports Django at
import time; ``django_child`` and ``setup_django`` set it up inside a
benchmark's child process.
"""

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
OUT = ROOT / "bench" / "out"

# Thousands of sockets need thousands of file descriptors, on both ends.
NOFILE_WANTED = 65536


def raise_nofile(wanted: int = NOFILE_WANTED) -> int:
    """Raise this process's open-file limit as far as the hard limit allows; returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0-100), nearest-rank. NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def commit() -> str:
    """The checkout's commit, short, as the figures in docs/benchmarks.md name it."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip()


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = psutil.virtual_memory().total / 2**30
    return (
        f"{psutil.cpu_count()} CPU ({cpu}), {mem_gb:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


# ---- databases ---------------------------------------------------------------


def _pg_admin(pg_url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(pg_url + "/postgres", autocommit=True) as conn:
        conn.execute(sql)


def migrate(database_url: str, log: Path) -> None:
    env = {**os.environ, "DATABASE_URL": database_url}
    with open(log, "ab") as fh:
        subprocess.run(
            [PY, "manage.py", "migrate", "--no-input"],
            cwd=ROOT,
            # llmgw_site.asgi refuses to start without ALLOWED_HOSTS unless DEBUG is on.
            env={"ALLOWED_HOSTS": "127.0.0.1,localhost", **env},
            stdout=fh,
            stderr=subprocess.STDOUT,
            check=True,
        )


class ScratchDatabases:
    """A migrated template, copied for each level so every level starts empty and fast.

    ``pg_url`` is a server URL without a database name (postgres://user@host:port).
    """

    def __init__(self, kind: str, *, pg_url: str, name: str, workdir: Path):
        self.kind, self.pg_url, self.name, self.workdir = kind, pg_url, name, workdir
        self.template = f"{name}_tpl"

    def _url(self, db: str) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.workdir / (db + '.sqlite3')}"
        return f"{self.pg_url}/{db}"

    def prepare_template(self, log: Path) -> None:
        if self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                (self.workdir / f"{self.template}.sqlite3{suffix}").unlink(missing_ok=True)
        else:
            _pg_admin(self.pg_url, f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
            _pg_admin(self.pg_url, f'CREATE DATABASE "{self.template}"')
        migrate(self._url(self.template), log)

    def fresh(self, level: str) -> str:
        """A new database for one level, copied from the template; returns its URL."""
        db = f"{self.name}_{level}"
        if self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                (self.workdir / f"{db}.sqlite3{suffix}").unlink(missing_ok=True)
            shutil.copyfile(
                self.workdir / f"{self.template}.sqlite3", self.workdir / f"{db}.sqlite3"
            )
        else:
            _pg_admin(self.pg_url, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            _pg_admin(self.pg_url, f'CREATE DATABASE "{db}" TEMPLATE "{self.template}"')
        return self._url(db)

    def drop(self, url: str) -> None:
        if self.kind == "sqlite":
            path = url[len("sqlite:///") :]
            for suffix in ("", "-wal", "-shm"):
                Path(path + suffix).unlink(missing_ok=True)
        else:
            db = url.rsplit("/", 1)[1]
            _pg_admin(self.pg_url, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def drop_template(self) -> None:
        if self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                (self.workdir / f"{self.template}.sqlite3{suffix}").unlink(missing_ok=True)
        else:
            _pg_admin(self.pg_url, f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')


# ---- levels, each in a database and a process of its own ---------------------


def level_args(doc: str, levels: list[str], what: str) -> argparse.ArgumentParser:
    """The command line of a benchmark run by levels (``--pg``, ``--levels``, ``--json``),
    with the hidden ``--child LEVEL`` its parent runs each level as."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--pg", help="PostgreSQL server URL without a database name")
    parser.add_argument("--levels", nargs="+", default=levels, help=f"{what} ...")
    parser.add_argument("--json", help="Also write the figures to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


class Levels:
    """A benchmark's levels: each in a fresh database copied from a migrated template,
    measured by ``script --child LEVEL`` in a process of its own, which prints its
    figures as JSON on its last line.

    A fresh process per level keeps one level's caches and memory out of the
    next one's figures. Use as a context manager: the scratch databases go at
    the end, whether the levels ran or not.
    """

    def __init__(self, script: str, *, pg: str | None, name: str):
        self.script = script
        self.kind = "postgresql" if pg else "sqlite"
        self.work = Path(tempfile.mkdtemp(prefix=f"{name.replace('_', '-')}-"))
        self.dbs = ScratchDatabases(self.kind, pg_url=pg or "", name=name, workdir=self.work)

    def __enter__(self) -> "Levels":
        self.dbs.prepare_template(self.work / "migrate.log")
        return self

    def __exit__(self, *exc) -> None:
        self.dbs.drop_template()

    def run(self, level: str, **env) -> dict:
        """One level's figures; ``env`` is added to the child's environment. A child
        that fails ends the benchmark with its exit status, its output shown."""
        url = self.dbs.fresh(level.replace("x", "_"))
        child_env = {
            **os.environ,
            "DATABASE_URL": url,
            "LLMGW_STATE_DIR": str(self.work),
            "LOG_LEVEL": "WARNING",
            **env,
        }
        try:
            out = subprocess.run(
                [PY, self.script, "--child", level],
                cwd=ROOT,
                env=child_env,
                capture_output=True,
                text=True,
            )
        finally:
            self.dbs.drop(url)
        if out.returncode:
            print(out.stdout, out.stderr, file=sys.stderr)
            raise SystemExit(out.returncode)
        return json.loads(out.stdout.strip().splitlines()[-1])


def write_json(path: str | None, results: list[dict]) -> None:
    """``--json``: the figures, also as a file."""
    if path:
        Path(path).write_text(json.dumps(results, indent=2))


def django_child() -> None:
    """Set Django up in a benchmark's child process (the level's database is in its environment)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    django.setup()


def timed(fn) -> tuple[float, float, object]:
    """(wall ms, CPU ms of this process, what ``fn`` returned)."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000, value


# ---- the control plane under test --------------------------------------------


def _child_nofile():
    raise_nofile()


# The web servers the agents' socket is measured under: the same ASGI application
# (llmgw_site.asgi), as an operator would start each. ``serve`` is the default
# (`make run`, production: uvicorn with llmgw's settings, llmgw_site/serve.py);
# ``uvicorn`` is uvicorn's own command line with its defaults (per-message
# deflate on, uvicorn's ping interval, no gc.freeze), as the figures before
# 2026-12-01 evening were measured.
SERVERS = ("serve", "daphne", "uvicorn")


def web_argv(server: str, port: int) -> list[str]:
    if server == "serve":
        return ["-m", "llmgw_site.serve", "--host", "127.0.0.1", "--port", str(port)]
    if server == "daphne":
        return ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "llmgw_site.asgi:application"]
    if server == "uvicorn":
        return [
            "-m",
            "uvicorn",
            "llmgw_site.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--lifespan",
            "off",
            "--no-access-log",
        ]
    raise ValueError(f"unknown web server '{server}': one of {', '.join(SERVERS)}")


@dataclass
class Web:
    """One web process (Daphne or uvicorn) serving llmgw_site.asgi on loopback."""

    proc: subprocess.Popen
    port: int
    log: Path
    server: str = "daphne"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/agent/"

    def stop(self, timeout: float = 15) -> float:
        """SIGTERM, then SIGKILL after ``timeout``; returns the seconds it took to go."""
        t = time.monotonic()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - t


Daphne = Web  # the name the other benchmarks use


_collected: set[str] = set()


def collect_static(env: dict) -> None:
    """``manage.py collectstatic`` into the state dir ``env`` names, once: the web
    process refuses to start without the manifest it writes (llmgw_site/asgi.py)."""
    state_dir = env.get("LLMGW_STATE_DIR", "")
    if state_dir in _collected:
        return
    subprocess.run(
        [PY, "manage.py", "collectstatic", "--no-input", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    _collected.add(state_dir)


def start_web(
    server: str, env: dict, log: Path, timeout: float = 60, port: int | None = None
) -> Web:
    """One web process on a loopback port (a free one unless given), with a raised
    open-file limit; returns once it accepts connections."""
    port = port or free_port()
    collect_static(env)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [PY, *web_argv(server, port)],
            cwd=ROOT,
            # llmgw_site.asgi refuses to start without ALLOWED_HOSTS unless DEBUG is on.
            env={"ALLOWED_HOSTS": "127.0.0.1,localhost", **env},
            stdout=fh,
            stderr=subprocess.STDOUT,
            preexec_fn=_child_nofile,
        )
    web = Web(proc, port, log, server)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{server} exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return web
        time.sleep(0.1)
    web.stop()
    raise RuntimeError(f"{server} did not listen within {timeout:g} s:\n{log.read_text()[-3000:]}")


def start_daphne(env: dict, log: Path, timeout: float = 60) -> Web:
    """One Daphne process on a free loopback port, with a raised open-file limit."""
    return start_web("daphne", env, log, timeout)


def start_celery(env: dict, log: Path, argv: list[str]) -> subprocess.Popen:
    """``celery -A llmgw_site <argv>`` (a worker or beat), its output appended to ``log``."""
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [PY, "-m", "celery", "-A", "llmgw_site", *argv],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )


@dataclass
class CpuWindow:
    """CPU % (of one core) and RSS of a set of processes over a window."""

    procs: list[psutil.Process]
    start_cpu: float = 0.0
    start_wall: float = 0.0
    rss_peak: int = 0
    samples: list[float] = field(default_factory=list)

    @staticmethod
    def _cpu(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.NoSuchProcess:
            return 0.0

    def begin(self) -> None:
        self.start_cpu = sum(self._cpu(p) for p in self.procs)
        self.start_wall = time.monotonic()
        self.sample()

    def sample(self) -> None:
        rss = 0
        for p in self.procs:
            try:
                rss += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        self.rss_peak = max(self.rss_peak, rss)

    def end(self) -> tuple[float, int]:
        """(CPU % over the window, peak RSS in bytes)."""
        self.sample()
        wall = time.monotonic() - self.start_wall
        used = sum(self._cpu(p) for p in self.procs) - self.start_cpu
        return (100.0 * used / wall if wall > 0 else float("nan")), self.rss_peak


class DbProbe:
    """`SELECT 1` round trips to the level's database, timed: the baseline of a DB write.

    Every heartbeat write is a handful of such round trips, each needing the
    database server to get a CPU; on a busy machine this is where latency hides.
    """

    def __init__(self, database_url: str):
        if database_url.startswith("sqlite:///"):
            import sqlite3

            self.conn = sqlite3.connect(database_url[len("sqlite:///") :])
        else:
            import psycopg

            self.conn = psycopg.connect(database_url, autocommit=True)
        self.rtt: list[float] = []

    def once(self) -> None:
        t = time.perf_counter()
        self.conn.execute("SELECT 1").fetchall()
        self.rtt.append(time.perf_counter() - t)

    def close(self) -> None:
        self.conn.close()


# ---- the gateway benchmarks (bench/gateway.py, bench/prefix.py) -------------------


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Return once ``url`` answers anything (a 401 or 404 is an answer)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:g} s")


class Procs:
    """Processes a benchmark started, each in its own session with its log in ``logdir``."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str], env: dict, cwd: Path = ROOT) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def gateway_env(work: Path, tag: str) -> tuple[dict, object]:
    """The environment of a gateway benchmark's processes, and its private Redis (None
    when REDIS_URL names one): state in ``work``, its own SQLite and channel prefix."""
    env = {
        "ALLOWED_HOSTS": "127.0.0.1,localhost",  # llmgw_site.asgi refuses to start without
        **os.environ,
        "LLMGW_STATE_DIR": str(work / "state"),
        "LLMGW_CHANNEL_PREFIX": f"bench-{os.getpid()}-{tag}",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DATABASE_URL", None)  # its own SQLite: the request path never reads it
    redis = None
    if not env.get("REDIS_URL"):
        from fleet.devstack.redis import PrivateRedis

        (work / "redis").mkdir(exist_ok=True)
        redis = PrivateRedis(work / "redis").start()
        env["REDIS_URL"] = redis.url
    return env, redis


def setup_django() -> None:
    """In a benchmark's database-filling subprocess: Django set up, the database migrated."""
    django_child()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def stack_django(work: Path):
    """Django in a benchmark that drives a ``tests.processes.Stack``: a scratch SQLite in
    ``work``, migrated, and a private Redis of this process's own (signals ask for passes
    through it; the stack has another). Returns that Redis, to stop at the end."""
    os.environ["LLMGW_STATE_DIR"] = str(work)
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
    from fleet.devstack.redis import PrivateRedis

    (work / "redis-bench").mkdir()
    redis = PrivateRedis(work / "redis-bench").start()
    os.environ["REDIS_URL"] = redis.url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return redis


def run_setup(script: str, arg: str, env: dict) -> list[str]:
    """``script --setup-db arg`` in a subprocess with ``env``; the lines it printed."""
    done = subprocess.run(
        [PY, script, "--setup-db", arg], env=env, cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"setting up the bench database failed:\n{done.stderr}")
    return done.stdout.strip().splitlines()


def start_engine(procs: Procs, env: dict, name: str, model: str) -> tuple[int, subprocess.Popen]:
    """A fake engine (``agentd.engines.fake``) serving ``model``; (its port, its process)."""
    port = free_port()
    proc = procs.start(
        name,
        [PY, "-m", "agentd.engines.fake", "--port", str(port), "--served-model-name", model],
        env,
    )
    wait_http(f"http://127.0.0.1:{port}/health", proc)
    return port, proc


def start_litellm(
    procs: Procs, env: dict, engine_port: int, model: str, venv: Path, work: Path
) -> tuple[int, subprocess.Popen]:
    """LiteLLM's proxy (one process, master key ``sk-bench-master``, no database) in front
    of the engine on ``engine_port``, from the virtualenv ``venv``; (its port, its process).
    FileNotFoundError where ``venv`` has no LiteLLM."""
    litellm = venv / "bin" / "litellm"
    if not litellm.exists():
        raise FileNotFoundError(f"no LiteLLM at {litellm}: pip install 'litellm[proxy]' there")
    port = free_port()
    cfg = work / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: http://127.0.0.1:{engine_port}/v1\n"
        "      api_key: none\n"
        "general_settings:\n"
        "  master_key: sk-bench-master\n"
    )
    lenv = {k: v for k, v in env.items() if not k.startswith(("DATABASE_URL", "REDIS"))}
    proc = procs.start(
        f"litellm-{port}",
        [str(litellm), "--config", str(cfg), "--port", str(port), "--num_workers", "1"],
        # No network here: its model price map ships with it.
        {**lenv, "LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, timeout=300)
    return port, proc


# How each server arrangement serves llmgw's gateway, as an operator starts it.
GATEWAY_SERVERS = {
    # The whole app on uvicorn (uvloop, httptools): `make run` and production.
    "serve": ["-m", "llmgw_site.serve", "--host", "127.0.0.1"],
    # The whole app on Daphne (supported, the old default).
    "daphne": ["-m", "daphne", "-b", "127.0.0.1", "llmgw_site.asgi:application"],
    # The gateway alone on uvicorn.
    "gateway-only": ["-m", "uvicorn", "llmgw_site.gateway_asgi:application"]
    + ["--host", "127.0.0.1", "--no-access-log", "--loop", "uvloop", "--http", "httptools"]
    + ["--log-level", "warning"],
    # No llmgw at all: a trivial app on the same uvicorn (bench/_asgi_floor.py).
    "asgi-floor": ["-m", "uvicorn", "bench._asgi_floor:app"]
    + ["--host", "127.0.0.1", "--no-access-log", "--loop", "uvloop", "--http", "httptools"]
    + ["--lifespan", "off", "--log-level", "warning"],
    # The whole app on uvicorn's pure-Python loop and parser.
    "plain-uvicorn": ["-m", "uvicorn", "llmgw_site.asgi:application"]
    + ["--host", "127.0.0.1", "--no-access-log", "--loop", "asyncio", "--http", "h11"]
    + ["--ws", "websockets-sansio", "--lifespan", "on", "--log-level", "warning"],
}


def start_gateway(
    procs: Procs,
    env: dict,
    server: str = "serve",
    extra: tuple = (),
    timeout: float = 120,
    tree: Path | None = None,
) -> tuple[int, subprocess.Popen]:
    """llmgw as ``server`` (a GATEWAY_SERVERS name) on a free port; (its port, its process).

    ``tree``: another checkout of llmgw (an earlier commit, say) to run instead of
    this one, on the same database, to compare the two in one run."""
    port = free_port()
    collect_static(env)
    argv = GATEWAY_SERVERS[server]
    port_args = ["-p", str(port)] if server == "daphne" else ["--port", str(port)]
    cwd = ROOT
    if tree is not None:
        cwd, env = tree, {**env, "PYTHONPATH": str(tree)}
    proc = procs.start(f"{server}-{port}", [PY, *argv, *port_args, *extra], env, cwd)
    wait_http(f"http://127.0.0.1:{port}/metrics", proc, timeout)
    return port, proc


def cpu_seconds(pgid: int) -> float:
    """User and system CPU of every process in a process group, from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def wrk(
    url: str, payload: dict, key: str, conc: int, duration: float, workdir: Path, pgid=None
) -> dict:
    """POST ``payload`` with wrk (one thread, ``conc`` connections) for ``duration`` s.

    p50/p99 in ms, req/s, and with ``pgid`` the CPU ms per request of that process
    group (from /proc); the 1-minute load average when it ended."""
    script = workdir / "post.lua"
    script.write_text(
        "wrk.method = 'POST'\n"
        f"wrk.body = {json.dumps(json.dumps(payload))}\n"
        "wrk.headers['Content-Type'] = 'application/json'\n"
        f"wrk.headers['Authorization'] = 'Bearer {key}'\n"
    )
    cpu0 = cpu_seconds(pgid) if pgid else 0.0
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conc}", f"-d{duration:g}s", "--timeout", "30s", "--latency"]
        + ["-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pct = {
        m.group(1): float(m.group(2)) * _UNIT[m.group(3)]
        for m in re.finditer(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    }
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    done = int(re.search(r"(\d+) requests in", out).group(1))
    cpu_ms = (cpu_seconds(pgid) - cpu0) * 1000 / done if pgid and done else None
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "load1": os.getloadavg()[0],
        "p50_ms": pct["50"],
        "p99_ms": pct["99"],
        "rps": rps,
        "cpu_ms_per_request": cpu_ms,
        "non_2xx": int(bad.group(1)) if bad else 0,
        "socket_errors": errors.group(1) if errors else "",
    }


def one_ready_replica(model_name: str, engine: str, engine_port: int) -> None:
    """The fleet rows a gateway benchmark routes by: ``model_name`` with one ready replica
    whose shard is ``engine`` on 127.0.0.1:``engine_port`` (Django set up by the caller)."""
    from fleet.models import EngineProfile, Model, Node, Replica, ReplicaState, Shard, ShardState

    model = Model.objects.create(name=model_name, desired_replicas=1)
    profile = EngineProfile.objects.create(
        model=model, name="bench", engine=engine, model_path="/none"
    )
    node = Node.objects.create(pk="bench-01", mgmt_addr="127.0.0.1", connected=True)
    replica = Replica.objects.create(model=model, profile=profile, state=ReplicaState.READY)
    Shard.objects.create(replica=replica, node=node, port=engine_port, state=ShardState.READY)
