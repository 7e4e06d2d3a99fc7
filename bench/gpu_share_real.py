"""Two vLLM engines on one real GPU, each with a budget: what each holds against it.

    .venv/bin/python bench/gpu_share_real.py MODEL_DIR_A:GB MODEL_DIR_B:GB [--gpu 0]

For a machine with an NVIDIA GPU and vLLM installed (no network needed: the
models are local directories). Each engine is started as the agent starts it
(agentd.engines.vllm builds the argv) with the share llmgw tells it: the budget
over the GPU's total, rounded down (fleet/services/reconciler/placing.py). Once
both answer /health, the agent's own NVML reading of each engine's process
group (agentd.nvml, agentd.load) is printed against its budget, with the GPU's
total in use; then both are stopped. Exit status 1 when an engine holds more
than its budget or does not become ready.
"""

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentd import protocol  # noqa: E402
from agentd.engines.base import Probe  # noqa: E402
from agentd.engines.vllm import VLLM  # noqa: E402
from agentd.load import LoadSampler  # noqa: E402
from agentd.nvml import NVML, Checks  # noqa: E402

MIB = 2**20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs=2, help="MODEL_DIR:GB, the budget on the GPU in GB of 1,024 MiB")
    p.add_argument("--gpu", type=int, default=0, help="the GPU's index")
    p.add_argument("--ready-timeout", type=float, default=900)
    opts = p.parse_args()
    nvml = NVML.open()
    if nvml is None:
        sys.exit("no NVIDIA driver: this needs a real GPU")
    gpu = nvml.gpus(Checks())[opts.gpu]
    engine = VLLM()
    procs = {}
    for i, spec in enumerate(opts.models):
        path, _, gb = spec.rpartition(":")
        budget_mb = round(float(gb) * 1024)
        fraction = math.floor(budget_mb / gpu.memory_total_mb * 10_000) / 10_000
        port = 8100 + i
        profile = protocol.ProfileSpec(
            name="bench", engine="vllm", gpus_per_node=1, model_path=path, gpu_memory_gb=float(gb)
        )
        shard = protocol.DesiredShard(
            shard_id=f"bench-{i}",
            replica_id=f"r-{i}",
            model=Path(path).name,
            state="running",
            gpu_uuids=[gpu.uuid],
            port=port,
            gpu_memory_fraction=fraction,
            profile=profile,
        )
        launch = engine.build(profile, shard, host="127.0.0.1", port=port)
        print(f"starting {' '.join(launch.argv)}", flush=True)
        proc = subprocess.Popen(
            launch.argv, env={**os.environ, **launch.env}, start_new_session=True
        )
        procs[shard.shard_id] = (proc, port, budget_mb, fraction)
        # vLLM checks free memory when it starts: one at a time, as the agent's check does.
        if not wait_ready(engine, port, opts.ready_timeout):
            stop(procs)
            sys.exit(f"{path} was not ready within {opts.ready_timeout:.0f} s")
    try:
        load = LoadSampler().sample(
            {sid: proc.pid for sid, (proc, *_rest) in procs.items()}, nvml.process_memory()
        )
        used_total = nvml.memory_used_mb()[opts.gpu]
        print(f"GPU {opts.gpu} {gpu.name}: {gpu.memory_total_mb} MiB, {used_total} MiB in use")
        over = False
        for s in load.shards:
            _proc, _port, budget_mb, fraction = procs[s.shard_id]
            held = s.gpu_memory_mb
            print(
                f"{s.shard_id}: told {fraction:.4f} of the GPU, holds {held} MiB "
                f"of a {budget_mb} MiB budget"
            )
            over |= held is None or held > budget_mb
        return 1 if over else 0
    finally:
        stop(procs)


def wait_ready(engine: VLLM, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if asyncio.run(engine.probe("127.0.0.1", port)) is Probe.READY:
            return True
        time.sleep(2)
    return False


def stop(procs: dict) -> None:
    for proc, *_rest in procs.values():
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    for proc, *_rest in procs.values():
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
