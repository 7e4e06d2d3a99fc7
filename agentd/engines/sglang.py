"""SGLang: ``python -m sglang.launch_server --model-path MODEL ...``.

Flags checked against SGLang's server arguments page (docs.sglang.io,
advanced_features/server_arguments) and its production metrics page; the sleep
endpoints against its source (sglang 0.5.5: srt/entrypoints/http_server.py,
srt/managers/scheduler_update_weights_mixin.py, srt/server_args.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.engines.base import (
    Engine,
    EngineUnavailable,
    model_of,
    python_dist_version,
    served_name,
    which,
)

if TYPE_CHECKING:
    from agentd.protocol import DesiredShard, ProfileSpec


class SGLang(Engine):
    name = "sglang"
    # Only exported with --enable-metrics, which every launch here passes.
    in_flight_series = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
    # docs.sglang.io, advanced_features/lora: "Dynamic LoRA loading"; a request names
    # the adapter in lora_path.
    adapter_api = ("/load_lora_adapter", "/unload_lora_adapter")
    # Sleep: /release_memory_occupation and /resume_memory_occupation (POST, a JSON
    # body whose "tags" default to every region: weights, kv_cache, cuda_graph),
    # which release nothing unless it started with --enable-memory-saver. Level 1
    # also starts it with --enable-weights-cpu-backup, so the weights wait in host
    # memory; without it a release drops them.
    sleep_api = True

    def python(self) -> str:
        # SGLang is usually installed into a Python of its own (an image's
        # system Python or a venv named in agent.yaml), rarely the agent's.
        try:
            return which(self.binary or "python3")
        except EngineUnavailable:
            raise EngineUnavailable(
                f"no Python to run SGLang with: {self.binary or 'python3'} is not on PATH"
            ) from None

    def command(self) -> list[str]:
        return [self.python(), "-m", "sglang.launch_server"]

    def sleeps_in_place(self, shard: DesiredShard) -> bool:
        # The memory saver (torch_memory_saver) manages CUDA memory only.
        return super().sleeps_in_place(shard) and bool(shard.gpu_uuids)

    def sleep_call(self, level: int) -> tuple[str, dict | None]:
        # The same release at both levels: the start flags decide whether the
        # weights are kept. The scheduler asserts nothing is in flight, so this
        # comes after the drain.
        return "/release_memory_occupation", {}

    def wake_call(self) -> tuple[str, dict | None]:
        return "/resume_memory_occupation", {}

    def wake_calls(self, shard: DesiredShard) -> list[tuple[str, dict | None]]:
        """The POSTs that wake a shard, in order. After level 2 the weights' memory
        comes back empty: they are read again from the model's files before the KV
        cache returns."""
        if shard.sleep_level < 2:
            return [self.wake_call()]
        return [
            ("/resume_memory_occupation", {"tags": ["weights"]}),
            ("/update_weights_from_disk", {"model_path": model_of(shard.profile, shard)}),
            ("/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]}),
        ]

    def version(self) -> str:
        return python_dist_version(self.python(), "sglang")

    def args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int) -> list[str]:
        argv = [
            "--model-path",
            model_of(profile, shard),
            "--host",
            host,
            "--port",
            str(port),
            "--served-model-name",
            served_name(profile, shard),
            "--tp-size",
            str(profile.tp),
            "--enable-metrics",
        ]
        if profile.pp > 1:
            argv += ["--pp-size", str(profile.pp)]
        if shard.gpu_memory_fraction:
            # A share of the GPU: weights and the KV cache pool within it.
            argv += ["--mem-fraction-static", f"{shard.gpu_memory_fraction:.4f}"]
        if shard.nnodes > 1:
            # Every node gets the same tp/pp and the leader's host:port, where
            # torch.distributed meets; --node-rank says which part of the model is ours.
            argv += ["--nnodes", str(shard.nnodes), "--node-rank", str(shard.rank)]
            argv += ["--dist-init-addr", f"{shard.leader_addr}:{shard.leader_port}"]
        if self.sleeps_in_place(shard):
            argv.append("--enable-memory-saver")
            if shard.sleep_level == 1:
                argv.append("--enable-weights-cpu-backup")
        if profile.max_adapters:
            # Started with no adapter, SGLang needs the rank and target modules up front;
            # the profile's args (they come last) may say otherwise.
            argv += ["--enable-lora", "--max-loras-per-batch", str(profile.max_adapters)]
            argv += ["--max-lora-rank", "16", "--lora-target-modules", "all"]
        return argv
