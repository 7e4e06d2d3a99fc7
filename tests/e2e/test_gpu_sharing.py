"""Several models on one GPU over real processes: the API, the reconciler on Celery, agentd
under the NVML double (an H100 80GB that is not there) and fake engines that hold GPU
memory in it as vLLM holds its budget, and the gateway.

docs/operations.md, "Several models on one GPU": each share is told its budget, holds it,
is measured by its node and shown against it; one that holds more is flagged.
"""

import math
import sys

import pytest

from fleet.models import Node, NodeLoad, Shard
from tests.agent import nvml_data
from tests.e2e.helpers import answers, wait_serving
from tests.processes import Stack

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 2**20
H100_MIB = nvml_data.H100["memory_mib"]  # 81559: "80GB" as NVML counts it
DRIVER_MIB = 535  # what the driver holds on an idle H100 (nvml_data.gpu)


def shared_model(stack: Stack, name: str, gpu_memory_gb: float, args=()) -> None:
    """A fake-engine model of one replica on a share of one GPU, declared through the API."""
    model = stack.api("post", "models/", json={"name": name, "desired_replicas": 1})
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model["id"],
            "name": "shared",
            "engine": "fake",
            "model_path": "/nonexistent/fake-weights",  # the fake engine loads nothing
            "gpus_per_node": 1,
            "tp": 1,
            "gpu_memory_gb": gpu_memory_gb,
            "args": list(args),
        },
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})


def api_shard(stack: Stack, name: str) -> dict:
    """The model's one running shard as the API shows it."""
    (shard,) = stack.api("get", f"shards/?model_name={name}&desired_state=running")["results"]
    return shard


def measured(stack: Stack, name: str) -> dict:
    """The model's shard once a heartbeat has carried what its engine holds on the GPU."""
    return stack.wait(
        lambda: (s := api_shard(stack, name))["gpu_memory_used_mb"] is not None and s,
        f"a heartbeat carrying {name}'s GPU memory",
        timeout=120,
    )


def told(name: str) -> float:
    """The budget the engine of the model's shard was told, as a part of the GPU."""
    (shard,) = Shard.objects.filter(replica__model__name=name, desired_state="running")
    return shard.spec["gpu_memory_fraction"]


def next_heartbeats(stack: Stack, node_id: str, count: int = 2) -> None:
    """Wait until ``count`` more heartbeats of the node have been written."""
    for _ in range(count):
        before = NodeLoad.objects.get(node_id=node_id).sampled_at
        stack.wait(
            lambda b=before: NodeLoad.objects.get(node_id=node_id).sampled_at > b,
            f"a heartbeat of {node_id}",
        )


def chat_failures(stack: Stack, name: str, count: int = 10) -> int:
    return sum(answers(stack, name) is None for _ in range(count))


def test_two_models_share_one_gpu_within_their_budgets_and_one_over_its_budget_is_flagged(
    stack,
):
    # given: a node with one H100 80GB (the NVML double) that runs the fake engine
    spec = nvml_data.hgx(nvml_data.H100, count=1)
    (gpu,) = spec["gpus"]
    stack.add_agent("gpu-a", nvml=spec, engines={"binaries": {"fake": sys.executable}})
    stack.wait(
        lambda: Node.objects.filter(pk="gpu-a", connected=True, gpus__isnull=False).exists(),
        "the GPU node to register",
    )

    # when: two models ask for 30 and 20 GB of one GPU each
    shared_model(stack, "qwen", 30)
    shared_model(stack, "llama", 20)

    # then: both are ready on the same node, on the same GPU
    for name in ("qwen", "llama"):
        wait_serving(stack, name, timeout=180)
    qwen, llama = measured(stack, "qwen"), measured(stack, "llama")
    assert qwen["node"] == llama["node"] == "gpu-a"
    assert qwen["gpu_uuids"] == llama["gpu_uuids"] == [gpu["uuid"]]

    # and each engine holds the budget it was told, measured by the node, within it
    for name, shard, budget_gb in (("qwen", qwen, 30), ("llama", llama, 20)):
        fraction = told(name)
        # told its share of the GPU's total, rounded down so that all of it is in budget
        assert fraction == math.floor(budget_gb * 1024 / H100_MIB * 10_000) / 10_000
        assert abs(shard["gpu_memory_used_mb"] - round(fraction * H100_MIB)) <= 1, (name, shard)
        assert shard["gpu_memory_budget_gb"] == budget_gb
        assert shard["over_gpu_budget"] is False, (
            f"{name} told {fraction} of {H100_MIB} MiB holds {shard['gpu_memory_used_mb']} MiB, "
            f"over its budget of {budget_gb * 1024} MiB"
        )

    # and the node reports the GPU's memory in use: the driver's and both engines'
    next_heartbeats(stack, "gpu-a")
    (node_gpu,) = stack.api("get", "nodes/gpu-a/")["gpus"]
    both = qwen["gpu_memory_used_mb"] + llama["gpu_memory_used_mb"]
    assert node_gpu["uuid"] == gpu["uuid"] and node_gpu["memory_total_mb"] == H100_MIB
    assert abs(node_gpu["memory_used_mb"] - (DRIVER_MIB + both)) <= 1, (node_gpu, both)

    # and both answer through the gateway, every time
    assert chat_failures(stack, "qwen") == 0
    assert chat_failures(stack, "llama") == 0

    # when: a third asks for 10 GB, and its engine holds 14 GiB regardless
    shared_model(stack, "greedy", 10, args=["--gpu-memory-bytes", str(14 * 2**30)])

    # then: it fits beside them (30 + 20 + 10 promised, 1 reserved, of 79.6) and serves
    wait_serving(stack, "greedy", timeout=180)
    greedy = measured(stack, "greedy")
    assert greedy["node"] == "gpu-a" and greedy["gpu_uuids"] == [gpu["uuid"]]
    # and the API flags it: 14 GiB held against a budget of 10
    assert greedy["gpu_memory_used_mb"] == 14 * 1024
    assert greedy["gpu_memory_budget_gb"] == 10
    assert greedy["over_gpu_budget"] is True
    # while the two within their budgets still serve and are not flagged
    assert [api_shard(stack, n)["over_gpu_budget"] for n in ("qwen", "llama")] == [False, False]
    assert chat_failures(stack, "qwen") == chat_failures(stack, "llama") == 0
