"""The real agent as a process in tests: its config, its process, waiting on it."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from agentd.nvml import FAKE_ENV
from tests.processes.base import ROOT


def write_config(directory: Path, url: str, **fields) -> Path:
    """An agent.yaml in ``directory`` with its state dir beside it.

    Local model paths and adapter sources are used only under the directories
    agent.yaml names (agentd.localpaths): by default the directory above this
    one, the test's own tmp tree, where its models are written. A test of the
    refusal names ``model_dirs`` itself.
    """
    data = {
        "control_plane_url": url,
        "state_dir": str(directory / "state"),
        "heartbeat_interval_s": 1,
        "model_dirs": [str(directory.resolve().parent)],
        **fields,
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class AgentProcess:
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_agent(config: Path, nvml_file: Path | None = None, **env) -> AgentProcess:
    """``python -m agentd --config <config>``, its output in a file next to the config."""
    full_env = {k: v for k, v in os.environ.items() if k != FAKE_ENV}
    full_env.update({"PYTHONUNBUFFERED": "1", **{k: str(v) for k, v in env.items()}})
    if nvml_file is not None:
        full_env[FAKE_ENV] = str(nvml_file)
    n = len(list(config.parent.glob("agent-*.out")))
    log = config.parent / f"agent-{n}.out"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentd", "--config", str(config)],
            cwd=ROOT,
            env=full_env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    return AgentProcess(proc, log)


def wait_until(check, timeout: float = 30, what: str = "condition", proc: AgentProcess = None):
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(
                f"agent exited with {proc.proc.returncode} waiting for {what}:\n{proc.output()}"
            )
        time.sleep(0.1)
    extra = f"\nagent output:\n{proc.output()}" if proc is not None else ""
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")
