"""The whole stack as real processes, for tests/e2e/: a private Redis, Daphne, a Celery
worker and beat, agentd processes and the llama.cpp engines they start.

Every control-plane process shares the test database (``subprocess_env``) and a
redis-server of the test's own (so a test may stop it), with short intervals so a
scenario takes seconds. Waits poll with generous deadlines; a deadline only bounds
a wait, it never judges speed.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import requests

from agentd import state
from fleet.devstack.redis import PrivateRedis
from tests.processes.agents import AgentProcess, start_agent, write_config
from tests.processes.base import port_block, wait_for
from tests.processes.servers import LiveServer, start_celery, start_daphne

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


class Agent:
    """One agentd process with its own state dir and port range, as a node of the fleet."""

    def __init__(self, directory: Path, node_id: str, url: str, join_token: str, **config):
        self.dir = directory
        self.node_id = node_id
        self.ports = port_block()
        self.state_dir = (directory / "state").resolve()
        directory.mkdir(parents=True, exist_ok=True)
        lo, hi = self.ports
        self.config = write_config(
            directory,
            url,
            node_id=node_id,
            join_token=join_token,
            engine_port_range=[lo, hi],
            # The control plane hands out this node's engine ports from the same range.
            labels={"llmgw.io/ports": f"{lo}-{hi}"},
            **config,
        )
        self.proc: AgentProcess | None = None

    def start(self) -> None:
        self.proc = start_agent(self.config)

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
    """

    def __init__(self, tmp: Path, database_url: str | None = None):
        self.tmp = tmp
        (tmp / "redis").mkdir(parents=True, exist_ok=True)
        self.redis = PrivateRedis(tmp / "redis").start()
        self.env = {"REDIS_URL": self.redis.url, **FAST}
        if database_url:
            self.env["DATABASE_URL"] = database_url
        self.port: int | None = None
        self.daphne: LiveServer | None = None
        self.celery: list[tuple[subprocess.Popen, Path]] = []
        self.agents: list[Agent] = []
        self.manage_key = ""
        self.inference_key = ""

    # ---- control plane ---------------------------------------------------------------

    def start_daphne(self) -> None:
        self.daphne = start_daphne(self.tmp, port=self.port, **self.env)
        self.port = self.daphne.port

    def start_celery(self) -> None:
        n = len(self.celery)
        schedule = str(self.tmp / "beat-schedule")
        for name, argv in (
            (f"worker-{n}", CELERY_WORKER),
            (f"beat-{n}", ["beat", "--loglevel", "INFO", "-s", schedule]),
        ):
            self.celery.append(start_celery(self.tmp, name, argv, **self.env))

    def stop_control_plane(self) -> None:
        """Daphne, the worker and beat go away together (a deploy, a crash of the host)."""
        for proc, _ in self.celery:
            if proc.poll() is None:
                proc.terminate()
        if self.daphne is not None:
            self.daphne.stop()
        for proc, _ in self.celery:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def start_control_plane(self) -> None:
        self.start_daphne()
        self.start_celery()

    @property
    def url(self) -> str:
        return self.daphne.url

    # ---- agents ------------------------------------------------------------------------

    def add_agent(self, node_id: str, **config) -> Agent:
        """An agent enrolled with a join token of its own; ``config``: more agent.yaml fields
        (``engines={"binaries": {"fake": sys.executable}}`` to run the fake engine)."""
        from tests.factories import join_token

        _, secret = join_token(name=f"e2e {node_id}", uses=1)
        agent = Agent(self.tmp / node_id, node_id, self.daphne.ws_url, secret, **config)
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

    def openai(self, **kwargs):
        from openai import OpenAI

        return OpenAI(
            base_url=f"{self.url}/v1", api_key=self.inference_key, max_retries=0, **kwargs
        )

    def logs(self) -> list[Path]:
        paths = [log for _, log in self.celery]
        if self.daphne is not None:
            paths += sorted(self.tmp.glob("daphne-*.log"))
        for agent in self.agents:
            paths += agent.logs()
        return paths

    def wait(self, check, what: str, timeout: float = 60):
        return wait_for(check, what, timeout, logs=self.logs())

    # ---- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        # Everything at once: nothing is left to care who hears of whose end.
        procs = [a.proc.proc for a in self.agents if a.proc is not None]
        procs += [proc for proc, _ in self.celery]
        if self.daphne is not None:
            procs.append(self.daphne.proc)
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
