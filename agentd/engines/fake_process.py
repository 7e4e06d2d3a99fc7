"""The fake engine as a process: the faults it is ordered to show, and its life.

``FakeProcess`` is what ``python -m agentd.engines.fake`` runs: a weight download
before it listens (``--fetch-to``), a worker child in its process group, a load
that takes ``--load-time`` while /health answers 503, the GPU memory it holds in
the NVML double (failing to start as vLLM does where there is no room), a crash,
a hang that ignores SIGTERM, a flood of log lines. This module changes when
what the fake engine simulates as a process changes; what it answers over HTTP
is ``agentd.engines.fake_api``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agentd import gpuclaims
from agentd.engines import fake_sleep
from agentd.engines.fake_api import FakeApi


class FakeProcess:
    """One fake engine process, serving ``api`` once it has loaded."""

    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.api = FakeApi(opts)

    async def fetch(self) -> None:
        """Write --fetch-bytes into --fetch-to over --fetch-time, as a weight download would."""
        target = Path(self.opts.fetch_to)
        target.mkdir(parents=True, exist_ok=True)
        steps = 20
        with open(target / "weights.bin", "wb") as fh:
            for _ in range(steps):
                fh.write(b"\0" * (self.opts.fetch_bytes // steps))
                fh.flush()
                await asyncio.sleep(self.opts.fetch_time / steps)
        print(f"fake engine: fetched {self.opts.fetch_bytes} bytes into {target}", flush=True)

    def hold_gpu_memory(self) -> None:
        """Take GPU memory in the NVML double, as an engine allocates its budget on load;
        where a GPU has not that much free, fail as vLLM does (exit 1)."""
        nvml_file = os.environ.get("LLMGW_FAKE_NVML")
        uuids = [u for u in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
        share, fixed = self.opts.gpu_memory_utilization, self.opts.gpu_memory_bytes
        if not nvml_file or not uuids or not (share or fixed):
            return
        totals = {
            g.get("uuid"): g.get("memory_total_bytes", 0)
            for g in json.loads(Path(nvml_file).read_text()).get("gpus", [])
        }
        held = {u: fixed or int(share * totals.get(u, 0)) for u in uuids}
        # The weights' part of each GPU's share: what a level-1 sleep keeps in host memory.
        weights = {u: min(b, self.opts.weights_bytes or b // 2) for u, b in held.items()}
        parts = {"weights": weights, "kv_cache": {u: b - weights[u] for u, b in held.items()}}
        memory = fake_sleep.Memory(Path(nvml_file), parts)
        try:
            memory.take(set(fake_sleep.TAGS))
        except gpuclaims.OutOfMemory as exc:
            print(self.out_of_memory(exc, uuids.index(exc.uuid)), flush=True)
            os._exit(1)
        self.api.sleep.memory = memory
        print(f"fake engine: holding {held} bytes of GPU memory", flush=True)

    def out_of_memory(self, exc, device: int) -> str:
        """What vLLM prints as it fails to start on a GPU without room: its own check of
        --gpu-memory-utilization (vllm/v1/worker/utils.py), else PyTorch's failed allocation."""
        gib = 2**30
        if not self.opts.gpu_memory_bytes:
            return (
                f"ValueError: Free memory on device cuda:{device} "
                f"({round(exc.free / gib, 2)}/{round(exc.total / gib, 2)} GiB) on startup is "
                f"less than desired GPU memory utilization ({self.opts.gpu_memory_utilization}, "
                f"{round(exc.wanted / gib, 2)} GiB). Decrease GPU memory utilization or reduce "
                "GPU memory used by other processes."
            )
        return (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{exc.wanted / gib:.2f} GiB. GPU {device} has a total capacity of "
            f"{exc.total / gib:.2f} GiB of which {max(exc.free, 0) / gib:.2f} GiB is free."
        )

    async def run(self) -> None:
        opts = self.opts
        loop = asyncio.get_running_loop()
        if opts.hang:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            loop.add_signal_handler(signal.SIGTERM, lambda: os._exit(0))
        if opts.spawn_worker:
            worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10**6)"])
            print(f"fake engine: worker pid {worker.pid}", flush=True)
        if opts.crash_after is not None:
            loop.call_later(opts.crash_after, self.crash)
        if opts.fetch_to:
            await self.fetch()
        if opts.log_flood > 0:
            self.flooding = asyncio.ensure_future(self.flood_logs())  # kept: a task needs a holder
        server = await asyncio.start_server(self.api.handle, opts.host, opts.port)
        print(f"fake engine: pid {os.getpid()} listening on {opts.host}:{opts.port}", flush=True)
        if opts.hang:
            print("fake engine: hanging", flush=True)
        else:
            print(f"fake engine: loading for {opts.load_time:g} s", flush=True)
            self.hold_gpu_memory()
            await asyncio.sleep(opts.load_time)
            self.api.ready = True
            print(f"fake engine: ready, serving {opts.served_model_name}", flush=True)
        async with server:
            await server.serve_forever()

    async def flood_logs(self) -> None:
        """``--log-flood`` lines a second on stdout, as an engine logging every token would."""
        rate, written, started = self.opts.log_flood, 0, time.monotonic()
        # Each line --log-flood-line-bytes long, its newline included.
        filler = b"x" * max(0, self.opts.log_flood_line_bytes - 35)
        out = sys.stdout.buffer
        while True:
            due = int((time.monotonic() - started) * rate)
            if due > written:
                out.write(
                    b"".join(
                        b"fake engine: flood line %09d %s\n" % (i, filler)
                        for i in range(written, due)
                    )
                )
                out.flush()
                written = due
            await asyncio.sleep(0.05)

    def crash(self) -> None:
        print(f"fake engine: crashing with exit code {self.opts.exit_code}", flush=True)
        os._exit(self.opts.exit_code)
