"""The whole stack as real processes, for tests/e2e/: a private Redis, the web process
(``llmgw_site.serve`` on uvicorn, as `make run` and production run it), a
Celery worker and beat, agentd processes and the llama.cpp engines they start.

Every control-plane process shares the test database (``subprocess_env``) and a
redis-server of the test's own (so a test may stop it), with short intervals so a
scenario takes seconds. Waits poll with generous deadlines; a deadline only bounds
a wait, it never judges speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import requests

from agentd import state
from fleet.devstack.redis import PrivateRedis
from tests.processes.agents import AgentProcess, start_agent, write_config
from tests.processes.base import port_block, wait_for
from tests.processes.servers import LiveServer, start_celery, start_web

# Short intervals for the scenarios; replacement stays far off so nothing in a
# test is replaced by accident while a process is being restarted.
FAST = {
    "LLMGW_HEARTBEAT_INTERVAL_S": "0.5",
    "LLMGW_RECONCILE_INTERVAL_S": "1",
    "LLMGW_SUSPECT_AFTER_S": "5",
    "LLMGW_REPLACE_AFTER_S": "120",
    "LLMGW_OUTAGE_GAP_S": "5",
    "LLMGW_RESTART_BACKOFF_S": "1",
    "LLMGW_DRAIN_TIMEOUT_S": "5",
    "LLMGW_GATEWAY_REFRESH_S": "1",
}
# The fleet's real clock divided by ten, for faults that play out over minutes
# (docs/reliability.md rows 3, 4, 6): on top of FAST, suspect after 5 s (50 s),
# replace after 30 s (300 s), at most one node's replicas replaced per 1 s
# (10 s), a pass every 0.5 s (5 s), and the gateway's first-byte timeout 30 s
# (300 s). FAST's heartbeat (0.5 s) and outage gap (5 s) stay: a 3 s gap would
# be crossed by a busy machine's beat and grant every node a new grace period.
# Pass it as ``Stack(tmp, **TENTH)`` (the e2e ``clock`` fixture).
TENTH = {
    "LLMGW_RECONCILE_INTERVAL_S": "0.5",
    "LLMGW_SUSPECT_AFTER_S": "5",
    "LLMGW_REPLACE_AFTER_S": "30",
    "LLMGW_REPLACE_EVERY_S": "1",
    "LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT_S": "30",
}
CELERY_WORKER = [
    "worker",
    "--loglevel",
    "INFO",
    "--concurrency",
    "1",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
]


def kill_9_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process and every process under it (a worker's pool), then reap it."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for p in [proc, *family]:
        try:
            p.kill()
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    proc.wait()


class Agent:
    """One agentd process with its own state dir and port range, as a node of the fleet."""

    def __init__(
        self,
        directory: Path,
        node_id: str,
        url: str,
        join_token: str,
        nvml: dict | None = None,
        **config,
    ):
        self.dir = directory
        self.node_id = node_id
        self.ports = port_block()
        self.state_dir = (directory / "state").resolve()
        directory.mkdir(parents=True, exist_ok=True)
        # The NVML double's file (agentd/nvml_double.py): a GPU node without a GPU. Its
        # engines inherit it, so the fake engine holds GPU memory in it.
        self.nvml_file: Path | None = None
        if nvml is not None:
            self.nvml_file = directory / "nvml.json"
            self.nvml_file.write_text(json.dumps(nvml))
        lo, hi = self.ports
        self.config = write_config(
            directory,
            url,
            node_id=node_id,
            join_token=join_token,
            engine_port_range=[lo, hi],
            # The control plane hands out this node's engine ports from the same range.
            labels={"llmgw.io/ports": f"{lo}-{hi}"},
            # llama.cpp from the test virtualenv, named by hand unless the test says
            # otherwise: nothing merely importable in the agent's Python is advertised
            # (docs/engines.md).
            **{"engines": {"binaries": {"llamacpp": sys.executable}}, **config},
        )
        self.proc: AgentProcess | None = None
        self.frozen: list[int] = []  # engine group leaders stopped with the agent

    def freeze(self) -> None:
        """Cut the node off: the agent and its engines stopped (SIGSTOP) where they stand.

        Their sockets stay open and the kernel still accepts connections for
        them, but nothing answers: a node whose network vanished, or a host
        that hangs.
        """
        self.frozen = sorted(self.engines().values())
        for pid in self.frozen:
            os.killpg(pid, signal.SIGSTOP)
        self.proc.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen node go on (SIGCONT) from where it stood; nothing if it is not frozen."""
        if self.proc is not None and self.proc.proc.poll() is None:
            self.proc.proc.send_signal(signal.SIGCONT)
        for pid in self.frozen:
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen = []

    def start(self) -> None:
        self.proc = start_agent(self.config, self.nvml_file)

    def kill_9(self) -> None:
        self.proc.proc.send_signal(signal.SIGKILL)
        self.proc.proc.wait()

    def engines(self) -> dict[str, int]:
        """Engines running with this agent's mark: shard id -> the PID of their group leader."""
        return {sid: pid for sid, (pid, _env) in state.find_marked(self.state_dir).items()}

    def kill_engines(self) -> None:
        for pid in self.engines().values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def logs(self) -> list[Path]:
        return sorted(self.dir.glob("agent-*.out"))


class Stack:
    """The processes of one scenario; ``close()`` stops all of them, engines included.

    ``database_url``: the control plane's database, when not the test database
    (a ``PrivatePostgres`` the test stops; the test process's ORM must be on it too).
    ``clock``: LLMGW_* settings over FAST for every control-plane process (``TENTH``).
    """

    def __init__(self, tmp: Path, database_url: str | None = None, **clock: str):
        bad = sorted(k for k in clock if not k.startswith("LLMGW_"))
        if bad:
            raise ValueError(f"clock settings are LLMGW_* variables, not {', '.join(bad)}")
        self.tmp = tmp
        (tmp / "redis").mkdir(parents=True, exist_ok=True)
        self.redis = PrivateRedis(tmp / "redis").start()
        self.env = {"REDIS_URL": self.redis.url, **FAST, **{k: str(v) for k, v in clock.items()}}
        if database_url:
            self.env["DATABASE_URL"] = database_url
        self.port: int | None = None
        self.web: LiveServer | None = None
        self.web_starts = 0
        self.celery: list[tuple[subprocess.Popen, Path]] = []
        self.agents: list[Agent] = []
        self.manage_key = ""
        self.inference_key = ""

    # ---- control plane ---------------------------------------------------------------

    def start_web(self) -> None:
        """The web process, on ``self.port`` once it has one: a restarted one comes back
        where the agents reconnect and the workers send batch lines. Each start after
        the first logs to a file of its own (``web-<n>-<port>.log``)."""
        self.web_starts += 1
        name = "web" if self.web_starts == 1 else f"web-{self.web_starts}"
        self.web = start_web(self.tmp, port=self.port, name=name, **self.env)
        self.port = self.web.port

    def start_celery(self) -> None:
        """A worker and beat (``worker-<n>``, ``beat-<n>``, at the end of ``self.celery``)."""
        n = len(self.celery)
        self.start_worker(f"worker-{n}")
        self.start_beat(f"beat-{n}")

    def start_worker(self, name: str = "") -> subprocess.Popen:
        """A Celery worker (its log ``<name>.log``; ``worker-<n>`` by default)."""
        name = name or f"worker-{len(self.celery)}"
        self.celery.append(start_celery(self.tmp, name, CELERY_WORKER, **self.env))
        return self.celery[-1][0]

    def start_beat(self, name: str = "") -> subprocess.Popen:
        """Celery beat, on the stack's one schedule file (``beat-<n>`` by default)."""
        name = name or f"beat-{len(self.celery)}"
        argv = ["beat", "--loglevel", "INFO", "-s", str(self.tmp / "beat-schedule")]
        self.celery.append(start_celery(self.tmp, name, argv, **self.env))
        return self.celery[-1][0]

    def celery_process(self, kind: str) -> subprocess.Popen:
        """The last started Celery process of ``kind`` ("worker" or "beat") still running."""
        for proc, log in reversed(self.celery):
            if log.stem.startswith(f"{kind}-") and proc.poll() is None:
                return proc
        raise LookupError(f"no {kind} running")

    def kill_9_worker(self) -> None:
        """SIGKILL the running worker and its pool processes, as a host's OOM killer would."""
        kill_9_tree(self.celery_process("worker"))

    def kill_9_beat(self) -> None:
        kill_9_tree(self.celery_process("beat"))

    def kill_9_web(self) -> None:
        """SIGKILL the web process (``start_web`` brings it back on the same port)."""
        kill_9_tree(self.web.proc)

    def stop_control_plane(self) -> None:
        """The web process, the worker and beat go away together (a deploy, a crash of the host)."""
        for proc, _ in self.celery:
            if proc.poll() is None:
                proc.terminate()
        if self.web is not None:
            self.web.stop()
        for proc, _ in self.celery:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def start_control_plane(self) -> None:
        self.start_web()
        self.start_celery()

    @property
    def url(self) -> str:
        return self.web.url

    # ---- agents ------------------------------------------------------------------------

    def add_agent(self, node_id: str, nvml: dict | None = None, **config) -> Agent:
        """An agent enrolled with a join token of its own; ``config``: more agent.yaml fields
        (``engines={"binaries": {"fake": sys.executable}}`` to run the fake engine).

        ``nvml``: the GPUs it sees, as a spec for the NVML double (``tests.agent.nvml_data``);
        none by default, a CPU node.
        """
        from tests.factories import join_token

        _, secret = join_token(name=f"e2e {node_id}", uses=1)
        agent = Agent(self.tmp / node_id, node_id, self.web.ws_url, secret, nvml, **config)
        agent.start()
        self.agents.append(agent)
        return agent

    # ---- clients -------------------------------------------------------------------------

    def make_keys(self) -> None:
        """A staff user's manage key for the API, and an inference key for the gateway."""
        from django.contrib.auth import get_user_model

        from fleet.models import ApiKeyScope
        from fleet.services.api_keys import create_api_key

        user = get_user_model().objects.create_user("ops", is_staff=True, is_superuser=True)
        _, self.manage_key = create_api_key("e2e ops", scope=ApiKeyScope.MANAGE, user=user)
        _, self.inference_key = create_api_key("e2e client", scope=ApiKeyScope.INFERENCE)

    def api(self, method: str, path: str, **kwargs) -> dict:
        resp = requests.request(
            method,
            f"{self.url}/api/v1/{path}",
            headers={"Authorization": f"Bearer {self.manage_key}"},
            timeout=30,
            **kwargs,
        )
        assert resp.status_code < 300, f"{method} {path}: {resp.status_code} {resp.text}"
        return resp.json() if resp.content else {}

    def openai(self, api_key: str = "", **kwargs):
        from openai import OpenAI

        return OpenAI(
            base_url=f"{self.url}/v1", api_key=api_key or self.inference_key, max_retries=0,
            **kwargs,
        )  # fmt: skip

    def logs(self) -> list[Path]:
        paths = [log for _, log in self.celery]
        if self.web is not None:
            paths += sorted(self.tmp.glob("web-*.log"))
        for agent in self.agents:
            paths += agent.logs()
        return paths

    def wait(self, check, what: str, timeout: float = 60):
        return wait_for(check, what, timeout, logs=self.logs())

    # ---- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        # Everything at once: nothing is left to care who hears of whose end.
        for agent in self.agents:
            agent.thaw()  # a stopped process would hold its SIGTERM until the wait ran out
        # A Celery worker's warm shutdown takes 2.5 s, 1.5 s of it joining its pool
        # (celery 5.5, billiard): the scenario is over and nothing reads what the
        # worker would finish, so it is killed with its pool. The others are asked.
        for proc, log in self.celery:
            if log.stem.startswith("worker-") and proc.poll() is None:
                kill_9_tree(proc)
        procs = [a.proc.proc for a in self.agents if a.proc is not None]
        procs += [proc for proc, _ in self.celery]
        if self.web is not None:
            procs.append(self.web.proc)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for agent in self.agents:
            agent.kill_engines()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.redis.stop()
