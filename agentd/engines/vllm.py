"""vLLM: ``vllm serve MODEL ...``.

Flags checked against vLLM's serving documentation (docs/serving/parallelism_scaling.md,
"Running vLLM with MultiProcessing"; docs/usage/metrics.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.engines.base import Engine, model_of, run_version, served_name, which

if TYPE_CHECKING:
    from agentd.protocol import DesiredShard, ProfileSpec


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

    def env(self, profile: ProfileSpec, shard: DesiredShard) -> dict[str, str]:
        env = super().env(profile, shard)
        if profile.max_adapters:
            env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
        return env

    def command(self) -> list[str]:
        return [which(self.binary or "vllm")]

    def version(self) -> str:
        return run_version(self.command() + ["--version"])

    def args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int) -> list[str]:
        argv = [
            "serve",
            model_of(profile, shard),
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
        if profile.max_adapters:
            # Ranks above vLLM's default of 16 need --max-lora-rank in the profile's args.
            argv += ["--enable-lora", "--max-loras", str(profile.max_adapters)]
        return argv
