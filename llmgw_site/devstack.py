"""`make run`: the whole control plane on one machine, in the foreground.

Starts the private Redis (unless REDIS_URL names one), Daphne, a Celery worker
and Celery beat; creates an admin login and an API key once, keeping them in the
state dir; prints where everything is. Ctrl-C stops everything it started.
"""

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from llmgw_site.embedded import PrivateRedis, state_dir

ROOT = Path(__file__).resolve().parent.parent


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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{username}:{password}")
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
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret)
    return secret


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

    def stop(self, grace: float = 10) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"  {name} did not stop in {grace:g} s; killing it")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs if proc.poll() is not None]


def main() -> int:
    directory = state_dir()
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    port = int(os.environ.get("LLMGW_PORT", "8000"))
    redis = None
    env = dict(os.environ)
    if not env.get("REDIS_URL"):
        redis = PrivateRedis(directory).start()
        env["REDIS_URL"] = redis.url
    os.environ["REDIS_URL"] = env["REDIS_URL"]
    _setup_django()
    username, password = ensure_admin(directory)
    api_key = ensure_api_key(directory)

    py = sys.executable
    stack = Stack(env, logs)
    stack.start(
        "daphne",
        [py, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "llmgw_site.asgi:application"],
    )
    stack.start(
        "celery-worker",
        [
            py,
            "-m",
            "celery",
            "-A",
            "llmgw_site",
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            "2",
        ],
    )
    stack.start(
        "celery-beat",
        [
            py,
            "-m",
            "celery",
            "-A",
            "llmgw_site",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(directory / "celerybeat-schedule"),
        ],
    )
    base = f"http://127.0.0.1:{port}"
    print(
        f"\nllmgw is running (logs in {logs}):\n"
        f"  admin     {base}/admin/   login {username} / {password}\n"
        f"  API       {base}/api/v1/  (schema {base}/api/schema/)\n"
        f"  gateway   {base}/v1/      API key {api_key}\n"
        f"  database  {os.environ.get('DATABASE_URL') or 'SQLite in ' + str(directory)}\n"
        f"  redis     {env['REDIS_URL']}\n"
        "Ctrl-C stops everything.\n",
        flush=True,
    )
    code = 0
    try:
        while not (dead := stack.dead()):
            time.sleep(0.5)
        print(f"{', '.join(dead)} exited; see {logs}. Stopping the rest.", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        print("\nstopping…", flush=True)
    finally:
        stack.stop()
        if redis is not None:
            redis.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
