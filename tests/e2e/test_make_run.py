"""`make run`'s orchestrator as a user runs it: the lines it prints work as printed, a second
run comes back on the agent's credential, and Ctrl-C stops everything, engines included."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from agentd import state
from agentd.tinygguf import write as write_tiny_model
from fleet.devstack import stack as devstack_stack
from fleet.devstack.redis import ping
from fleet.models import Model
from tests.processes import ROOT, free_port, port_block, subprocess_env
from tests.processes.stack import kill_9_tree

pytestmark = pytest.mark.django_db(transaction=True)

# fleet/devstack/stack.py's own bound on a Ctrl-C, with room for a busy machine:
# past its bound the devstack prints where it is stuck, which this reports.
STOP_WAIT_S = devstack_stack.STOP_BOUND_S + 15


class Devstack:
    """``python -m fleet.devstack`` (what `make run` runs after migrating), read live."""

    def __init__(self, env):
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleet.devstack"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def read_until(self, pattern: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r}; it printed:\n" + self.output())

    def output(self) -> str:
        return "\n".join(self.lines)

    def ctrl_c(self, timeout: float = STOP_WAIT_S) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._drain()
            raise AssertionError(
                f"still stopping {timeout:g} s after Ctrl-C; it printed:\n{self.output()}\n"
                + self.log_tails()
            ) from None
        self._drain(until_end=True)
        return code

    def _drain(self, until_end: bool = False) -> None:
        while True:
            try:
                line = self._q.get(timeout=5 if until_end else 0)
            except queue.Empty:
                return
            if line is None:
                return
            self.lines.append(line)

    def log_tails(self, lines: int = 15) -> str:
        logs = sorted((Path(self.env["LLMGW_STATE_DIR"]) / "logs").glob("*.log"))
        return "".join(
            f"--- {log.name} (last {lines} lines)\n"
            + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            + "\n"
            for log in logs
        )

    def kill(self):
        """Kill it if it is still running, and everything it started (each in a session
        of its own, so a kill of its group would miss them): nothing outlives a failure."""
        if self.proc.poll() is None:
            kill_9_tree(self.proc)


def _run_printed(line: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        line, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_make_run_prints_a_curl_and_a_client_line_that_work_and_ctrl_c_stops_everything(
    transactional_db, tmp_path
):
    # given: the embedded defaults on the test database, with no Redis named
    var = tmp_path / "var"
    port = free_port()
    lo, hi = port_block()
    env = subprocess_env(
        LLMGW_STATE_DIR=var, LLMGW_PORT=port, LLMGW_AGENT_PORTS=f"{lo}-{hi}", LLMGW_NODE_ID="demo"
    )
    del env["REDIS_URL"]
    agent_state = var / "agent"

    run = Devstack(env)
    try:
        # when: it is up
        run.read_until(r"^Try it:")
        curl = run.read_until(r"^\s+curl ").strip()
        client = run.read_until(r" -c ").strip()

        # then: the printed curl returns a chat completion from llama.cpp through the gateway
        assert f"http://127.0.0.1:{port}/v1/chat/completions" in curl
        done = _run_printed(curl)
        assert done.returncode == 0, done.stderr
        reply = json.loads(done.stdout)
        assert reply["object"] == "chat.completion" and reply["model"] == "tiny-llama"
        assert reply["choices"][0]["finish_reason"] in ("length", "stop")
        # and the printed openai-client line runs as printed
        done = _run_printed(client)
        assert done.returncode == 0, done.stderr

        # the agent enrolled on a join token, kept its credential, and serves the model
        assert (agent_state / "credential").exists()
        (engine_pid,) = [pid for pid, _ in state.find_marked(agent_state).values()]
        out = run.output()
        assert "login admin / " in out and "redis     unix://" in out
        # and the printed admin comes with its stylesheet, collected and served by the web process
        login = urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/").read().decode()
        css = re.search(r'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', login)[1]
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}{css}").status == 200

        # when: Ctrl-C
        code = run.ctrl_c()
    finally:
        run.kill()

    # then: everything stopped cleanly, the engine included
    # (through the control plane: scaled to zero, its engine stopped and reported)
    assert code == 0, run.output()
    assert "tiny-llama stopped" in run.output(), run.output()
    assert state.find_marked(agent_state) == {}
    assert state.start_ticks(engine_pid) is None
    # the agent let go of it, so the next run's agent has no crash to report
    assert state.load(agent_state)[1] == {}
    assert not ping(var / "redis.sock")

    # when: it runs again, asked to serve a GGUF file of the user's
    own = write_tiny_model(tmp_path / "models" / "My Model.Q4.gguf", seed=1)
    again = Devstack({**env, "LLMGW_DEMO_MODEL": str(own)})
    try:
        again.read_until(r"^Try it:")
        curl = again.read_until(r"^\s+curl ").strip()
        # then: the agent came back on its credential (no join token this time)
        config = yaml.safe_load((var / "agent.yaml").read_text())
        assert "join_token" not in config
        # and the printed curl gets that file's model, the tiny one no longer wanted
        assert json.loads(_run_printed(curl).stdout)["model"] == "my-model.q4"
        assert Model.objects.get(name="tiny-llama").desired_replicas == 0
        assert "my-model.q4: failed" not in again.output(), again.output()
        (spec,) = [env_["LLMGW_SHARD_SPEC"] for _, env_ in state.find_marked(agent_state).values()]
        assert json.loads(spec)["profile"]["model_path"] == str(own)
        assert again.ctrl_c() == 0
    finally:
        again.kill()
    assert "my-model.q4 stopped" in again.output(), again.output()
    assert state.find_marked(agent_state) == {}
    assert os.stat(var / "agent.yaml").st_mode & 0o077 == 0
