"""`make run`: the whole stack on one machine, in the foreground.

Starts the private Redis (unless REDIS_URL names one), collects the static
files, then starts the web process (the whole app on uvicorn, ``python -m
llmgw_site.serve``: admin, API, agents' socket and gateway on one port), a Celery
worker and beat, and a local agentd enrolled
with a join token (its credential kept for later runs); creates an admin login
and an API key once, keeping them in the state dir; applies a demo model served
by llama.cpp on the CPU (the generated tiny model, or the GGUF file
LLMGW_DEMO_MODEL names), or with LLMGW_DEMO_ENGINE=vllm by vLLM's CPU build (which
the local agent installs first: fleet.devstack.vllm); waits for it to answer
through the gateway, showing progress; then prints how to call it.

Ctrl-C stops everything it started, engines included. The agent leaves its
engines running when it exits (an agent restart must not interrupt serving),
so the demo model's engine is stopped first, the way the fleet retires any
replica: the model is scaled to zero, the control plane drains its shard, the
engine stops and the agent reports it. The next run scales it back to one and
it starts afresh. Killing the engine behind a stopped agent's back instead
would make the next run's agent report it as crashed, and its restart would
wait out the failure backoff. Engines still there after that (another model
placed on this node, a control plane that died) are stopped by process group.
"""

import faulthandler
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from datetime import timedelta
from pathlib import Path

from agentd.ports import DEFAULT_PORT_RANGE, format_port_range
from fleet.devstack import node
from fleet.devstack.node import write_private
from fleet.devstack.redis import STOP_GRACE_S as REDIS_STOP_GRACE_S
from fleet.devstack.redis import PrivateRedis, state_dir

ROOT = Path(__file__).resolve().parents[2]
# Engines on this node listen here; the control plane hands out ports from the
# same range (the node's llmgw.io/ports label), so the two always agree.
DEFAULT_ENGINE_PORTS = format_port_range(DEFAULT_PORT_RANGE)
# How long Ctrl-C waits for the control plane to stop the demo model's engine.
RETIRE_WAIT_S = 20
# How long each process is given after SIGTERM before it is killed.
PROCESS_STOP_GRACE_S = 10
# The longest Ctrl-C can take by the waits above: past it, where it is stuck is printed.
STOP_BOUND_S = (
    RETIRE_WAIT_S + 2 * node.ENGINE_STOP_GRACE_S + 2 * PROCESS_STOP_GRACE_S + REDIS_STOP_GRACE_S
)


def _setup_django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django

    django.setup()


def ensure_admin(directory: Path) -> tuple[str, str]:
    """The admin login, created once and kept in the state dir (mode 0600)."""
    from django.contrib.auth import get_user_model

    path = directory / "admin-login"
    User = get_user_model()
    if path.exists():
        username, password = path.read_text().split(":", 1)
        if User.objects.filter(username=username).exists():
            return username, password.strip()
    username, password = "admin", secrets.token_urlsafe(12)
    user, _ = User.objects.get_or_create(username=username)
    user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save()
    write_private(path, f"{username}:{password}")
    return username, password


def ensure_api_key(directory: Path) -> str:
    """An inference key for trying the gateway, created once and kept in the state dir."""
    from fleet.models import ApiKey, ApiKeyScope

    path = directory / "demo-api-key"
    if path.exists():
        secret = path.read_text().strip()
        key = ApiKey.find(secret)
        if key is not None and key.usable() is None:
            return secret
    _, secret = ApiKey.issue(name="make run", scope=ApiKeyScope.INFERENCE)
    write_private(path, secret)
    return secret


# ---- processes -----------------------------------------------------------------


class Stack:
    """Child processes, each in its own process group so Ctrl-C reaches all of it once."""

    def __init__(self, env: dict, logs: Path):
        self.env = env
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def stop(self, names=None, grace: float = PROCESS_STOP_GRACE_S) -> None:
        procs = [(n, p) for n, p in reversed(self.procs) if names is None or n in names]
        for _, proc in procs:
            if proc.poll() is None:
                node.signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {name} did not stop in {grace:g} s; killing it")
                node.signal_group(proc.pid, signal.SIGKILL)
                proc.wait()

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs if proc.poll() is not None]


class StackDied(Exception):
    pass


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _wait_listening(stack: Stack, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _port_free(port):
        if dead := stack.dead():
            raise StackDied(", ".join(dead))
        if time.monotonic() > deadline:
            raise StackDied(f"web (nothing listened on port {port} within {timeout:g} s)")
        time.sleep(0.1)


def _follow(stack: Stack, label: str, status, t0: float) -> None:
    """Print each change of ``status()`` (a line, done) until done; a line a while otherwise."""
    last, said_at = "", 0.0
    while True:
        if dead := stack.dead():
            raise StackDied(", ".join(dead))
        line, done = status()
        now = time.monotonic()
        if line != last or now - said_at >= 15:
            still = "still " if line == last else ""
            print(f"  [{now - t0:5.0f} s] {label}: {still}{line}", flush=True)
            last, said_at = line, now
        if done:
            return
        time.sleep(0.5)


def _first_answer(stack: Stack, base: str, api_key: str, name: str, t0: float) -> str | None:
    """Wait until the gateway routes to the ready replica; its answer, or None after a minute."""
    deadline, said_at = time.monotonic() + 60, time.monotonic()
    while True:
        if dead := stack.dead():
            raise StackDied(", ".join(dead))
        try:
            reply = node.ask_gateway(base, api_key, name)
            return reply["choices"][0]["message"]["content"]
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            detail = exc.read().decode(errors="replace") if hasattr(exc, "read") else exc
            now = time.monotonic()
            if now > deadline:
                print(f"  [{now - t0:5.0f} s] the gateway still answers: {detail}", flush=True)
                return None
            if now - said_at >= 10:
                print(f"  [{now - t0:5.0f} s] waiting for the gateway: {detail}", flush=True)
                said_at = now
            time.sleep(0.5)


def _retire(directory: Path, name: str, path: Path, agent_state: Path, node_id: str) -> None:
    """Scale the demo model to zero and see its engine stopped, within RETIRE_WAIT_S."""
    try:
        node.apply_demo_model(directory, name, path, replicas=0)
    except Exception as exc:  # noqa: BLE001 - the database is gone: the engines are killed instead
        print(f"  could not scale {name} to zero ({exc}); stopping its engine by signal")
        return
    print(f"  scaled {name} to zero; stopping its engine", flush=True)
    started = time.monotonic()
    deadline = started + RETIRE_WAIT_S
    signalled: set[str] = set()
    while time.monotonic() < deadline:
        draining, done = node.retiring(name, node_id)
        if done:
            print(f"  {name} stopped in {time.monotonic() - started:.1f} s", flush=True)
            return
        # llama.cpp's server cannot count requests in flight, so the agent would
        # drain it blind for half a minute. Nothing is in flight on the way out:
        # once the control plane has it draining, stop the engine now; the agent
        # reports it, and the drained replica is retired.
        if todo := set(draining) - signalled:
            node.kill_engines(agent_state, todo)
            signalled |= todo
        time.sleep(0.2)
    print(f"  {name} still running after {RETIRE_WAIT_S} s; stopping it by signal")


def _shown(url: str | None) -> str | None:
    """A URL fit to print: any password in it masked."""
    if not url:
        return url
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main() -> int:
    # Ctrl-C and a plain kill stop everything alike; set here because a shell
    # that starts us in the background leaves SIGINT ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    directory = state_dir()
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    (directory / "models").mkdir(exist_ok=True)
    port = int(os.environ.get("LLMGW_PORT", "8000"))
    ports = node.parse_ports(os.environ.get("LLMGW_AGENT_PORTS", DEFAULT_ENGINE_PORTS))
    if not _port_free(port):
        raise SystemExit(f"port {port} is in use; set LLMGW_PORT to another one")
    t0 = time.monotonic()
    redis = None
    env = dict(os.environ)
    if not env.get("REDIS_URL"):
        redis = PrivateRedis(directory).start()
        env["REDIS_URL"] = redis.url
    os.environ["REDIS_URL"] = env["REDIS_URL"]
    env["PYTHONUNBUFFERED"] = "1"
    # The memory estimate reads the demo model's header here, as the control plane
    # reads local weights only where it is told to (docs/security.md).
    estimate_dirs = [str(directory / "models")]
    if given := os.environ.get("LLMGW_DEMO_MODEL"):
        estimate_dirs.append(str(Path(given).expanduser().resolve().parent))
    env.setdefault("LLMGW_ESTIMATE_DIRS", ",".join(estimate_dirs))
    # The app refuses to start without it unless DEBUG is on; it serves on loopback here.
    env.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
    # The workers send batch lines to this gateway (docs/gateway.md, "Batch API").
    env.setdefault("LLMGW_BATCH_GATEWAY_URL", f"http://127.0.0.1:{port}")
    _setup_django()
    from django.core.management import call_command
    from django.utils import timezone

    # The admin's and the API's CSS and JavaScript, which the web process serves itself
    # (WhiteNoise) from what this collects, as a deployment does.
    call_command("collectstatic", interactive=False, verbosity=0)

    # This process prints progress; the children's logs are in the state dir.
    logging.getLogger().setLevel(logging.WARNING)
    name, model_path = node.demo_model(directory)
    username, password = ensure_admin(directory)
    api_key = ensure_api_key(directory)
    base = f"http://127.0.0.1:{port}"
    ws_url = f"ws://127.0.0.1:{port}/ws/agent/"
    agent_yaml, node_id = node.ensure_agent_config(directory, ws_url, ports)
    agent_state = directory / "agent"

    py = sys.executable
    stack = Stack(env, logs)
    code, applied = 0, False
    try:
        stack.start(
            "web",
            [py, "-m", "llmgw_site.serve", "--host", "127.0.0.1", "--port", str(port)]
            # Requests in flight get 5 s at Ctrl-C, so the gateway's usage is
            # written well inside Stack.stop's 10 s.
            + ["--graceful-timeout", "5"],
        )
        stack.start(
            "celery-worker",
            [py, "-m", "celery", "-A", "llmgw_site", "worker", "--loglevel", "INFO"]
            + ["--concurrency", "2", "--without-gossip", "--without-mingle"],
        )
        schedule = str(directory / "celerybeat-schedule")
        stack.start(
            "celery-beat",
            [py, "-m", "celery", "-A", "llmgw_site", "beat", "--loglevel", "INFO", "-s", schedule],
        )
        _wait_listening(stack, port)
        stack.start("agent", [py, "-m", "agentd", "--config", str(agent_yaml)])
        database = _shown(os.environ.get("DATABASE_URL")) or f"SQLite in {directory}"
        print(
            f"\nllmgw is up (logs in {logs}):\n"
            f"  cluster   {base}/admin/cluster/   login {username} / {password}\n"
            f"  admin     {base}/admin/\n"
            f"  API       {base}/api/v1/  (schema {base}/api/schema/)\n"
            f"  gateway   {base}/v1/      API key {api_key}\n"
            f"  database  {database}\n"
            f"  redis     {_shown(env['REDIS_URL'])}\n"
            f"  node      {node_id} (agent config {agent_yaml})\n",
            flush=True,
        )
        since = timezone.now() - timedelta(seconds=time.monotonic() - t0)
        _follow(stack, f"node {node_id}", lambda: node.agent_status(node_id, since), t0)
        for change in node.apply_demo_model(directory, name, model_path):
            print(f"  catalog: {change}")
        applied = True
        engine = node.DEMO_ENGINES[node.demo_engine()]
        print(f"Starting {name} ({model_path}) on {engine}; Ctrl-C stops everything.", flush=True)
        _follow(stack, name, lambda: node.model_status(name, node_id, since), t0)
        text = _first_answer(stack, base, api_key, name, t0)
        curl, client = node.usage_lines(base, api_key, name)
        took = time.monotonic() - t0
        if text is None:
            head = f"{name} is ready, but the gateway has not answered for it yet (see {logs})"
        else:
            head = f"{name} answered through the gateway in {took:.0f} s: {text!r}"
        print(
            f"\n{head}\nTry it:\n  {curl}\n  {client}\n\nCtrl-C stops everything.\n",
            flush=True,
        )
        while not (dead := stack.dead()):
            time.sleep(0.5)
        raise StackDied(", ".join(dead))
    except StackDied as exc:
        print(f"{exc} exited; see {logs}. Stopping the rest.", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("\nstopping…", flush=True)
    finally:
        # The demo model's engine through the control plane, then the agent (it
        # says goodbye), then any engine left behind, then the control plane.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopping = time.monotonic()
        # Every wait below is bounded; should one hang anyway, say where.
        faulthandler.dump_traceback_later(STOP_BOUND_S)
        if applied and not stack.dead():
            _retire(directory, name, model_path, agent_state, node_id)
        stack.stop(["agent"])
        killed = node.kill_engines(agent_state)
        if killed:
            print(f"  stopped {len(killed)} engine(s) by signal")
        stack.stop()
        if redis is not None:
            redis.stop()
        faulthandler.cancel_dump_traceback_later()
        print(f"  everything stopped in {time.monotonic() - stopping:.1f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
