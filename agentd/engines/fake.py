"""A fake engine for fault tests and benchmarks: ``python -m agentd.engines.fake --port P``.

An OpenAI-compatible HTTP server with no model behind it, whose faults can be
ordered on the command line: a slow load (``--load-time``), a crash
(``--crash-after``), a hang (``--hang``: it accepts connections, never answers,
and ignores SIGTERM), a 500 to every Nth completion (``--fail-every``), slow
tokens (``--token-delay``), a weight download that makes progress (``--fetch-to``),
a worker child in its process group (``--spawn-worker``), and a flood of log
lines on stdout (``--log-flood``).
Under the NVML double (``LLMGW_FAKE_NVML``) it holds GPU memory on the GPUs in
CUDA_VISIBLE_DEVICES while it runs, as vLLM does: ``--gpu-memory-utilization``
of each GPU's total, or ``--gpu-memory-bytes`` on each; where a GPU has not that
much free it fails to start as vLLM does (exit 1). It
answers /health (503 while loading), /v1/models, /v1/chat/completions and
/v1/completions (streamed or not), /v1/embeddings, /v1/rerank and /v1/score (as
vLLM serves them for a scoring model, here for any) and /metrics, and loads LoRA
adapters while it runs (/v1/load_lora_adapter and /v1/unload_lora_adapter; a
loaded adapter is listed and answers under its own name). With
VLLM_SERVER_DEV_MODE=1 it also sleeps and wakes through vLLM's endpoints
(/sleep, /wake_up, /is_sleeping, /collective_rpc), releasing its memory where
it runs with ``--enable-sleep-mode`` (``agentd.engines.fake_sleep``). Plain asyncio,
no dependencies, so it is also the gateway benchmark's stub. Use the real
llama.cpp engine wherever a real engine will do.

It speaks vLLM's dialect of what llmgw reads from an engine: the metric names
and labels (``vllm:num_requests_running{engine,model_name}`` and the rest), the
LoRA endpoints' status codes and error bodies, /v1/models' ``root`` and
``parent``, the usage objects and the stream's framing, the sleep endpoints. That dialect is held to
vLLM 0.32.0 by ``tests/engines/test_vllm_contract.py``, which sends the same
requests to both; change the two together. Its own ``fake:`` series
(``fake:requests_running``, ``fake:requests_total``,
``fake:requests_cancelled_total``, ``fake:gpu_memory_bytes``,
``fake:host_memory_bytes``) are extra, for tests.

The agent runs it only where agent.yaml names a Python for the ``fake`` engine.
Here: how the agent runs it (``FakeEngine``) and its command line; what it
answers is ``agentd.engines.fake_api``, the process and its faults
``agentd.engines.fake_process``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from agentd.engines.base import Engine, served_name, which
from agentd.engines.fake_process import FakeProcess
from agentd.engines.vllm import VLLM

_AGENTD_ROOT = str(Path(__file__).resolve().parent.parent.parent)

if TYPE_CHECKING:
    from agentd.protocol import DesiredShard, ProfileSpec


class FakeEngine(Engine):
    name = "fake"
    opt_in = True
    # It speaks vLLM's dialect (the module's docstring): read as vLLM is read.
    in_flight_series = VLLM.in_flight_series
    adapter_api = VLLM.adapter_api
    # vLLM's sleep API, with or without GPUs: the fake stands in where vLLM's sleep
    # mode cannot run (Engine.sleeps_in_place, not VLLM's, which wants GPUs).
    sleep_api = True
    sleep_call = VLLM.sleep_call
    wake_call = VLLM.wake_call
    wake_calls = VLLM.wake_calls

    def command(self) -> list[str]:
        return [which(self.binary or sys.executable), "-m", "agentd.engines.fake"]

    def version(self) -> str:
        from agentd import __version__

        which(self.binary or sys.executable)  # the Python named for it must exist
        return __version__  # the fake ships with the agent

    def env(self, profile: ProfileSpec, shard: DesiredShard) -> dict[str, str]:
        env = super().env(profile, shard)
        # The engine is a module of the agent; the agent need not be installed.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_AGENTD_ROOT, os.environ.get("PYTHONPATH", "")) if p
        )
        if self.sleeps_in_place(shard):
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int) -> list[str]:
        argv = ["--host", host, "--port", str(port)]
        argv += ["--served-model-name", served_name(profile, shard)]
        if shard.gpu_memory_fraction:
            argv += ["--gpu-memory-utilization", f"{shard.gpu_memory_fraction:.4f}"]
        if self.sleeps_in_place(shard):
            argv.append("--enable-sleep-mode")
        return argv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agentd.engines.fake", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default="fake")
    p.add_argument("--model", default="", help="listed as the model's root: there is no model")
    p.add_argument("--max-model-len", type=int, default=2048, help="listed in /v1/models")
    p.add_argument(
        "--load-time", type=float, default=0.0,
        help="seconds /health answers 503; also what reload_weights takes after a level-2 sleep",
    )  # fmt: skip
    p.add_argument("--crash-after", type=float, help="exit with --exit-code after this many s")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--hang", action="store_true", help="accept, never answer, ignore SIGTERM")
    p.add_argument("--fail-every", type=int, default=0, help="answer 500 to every Nth completion")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens")
    p.add_argument("--fetch-to", help="a directory to fill before listening, like a download")
    p.add_argument("--fetch-bytes", type=int, default=1 << 20)
    p.add_argument("--fetch-time", type=float, default=1.0)
    p.add_argument("--spawn-worker", action="store_true", help="a child in the same group")
    p.add_argument("--log-flood", type=float, default=0.0, help="log lines a second on stdout")
    p.add_argument(
        "--gpu-memory-utilization", type=float, default=0.0, help="share of each GPU to hold"
    )
    p.add_argument("--gpu-memory-bytes", type=int, default=0, help="bytes to hold on each GPU")
    p.add_argument(
        "--weights-bytes", type=int, default=0,
        help="of those, the weights' on each GPU (kept in host memory at level 1); default half",
    )  # fmt: skip
    p.add_argument(
        "--enable-sleep-mode", action="store_true",
        help="a sleep releases its GPU memory (the endpoints need VLLM_SERVER_DEV_MODE=1)",
    )  # fmt: skip
    p.add_argument(
        "--wake-time", type=float, default=0.05,
        help="seconds a level-1 sleep or wake takes to copy the weights",
    )  # fmt: skip
    p.add_argument("--log-flood-line-bytes", type=int, default=200, help="each flood line's size")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(FakeProcess(parse_args(argv)).run())


if __name__ == "__main__":
    main()
