"""Several models on one GPU over real processes: the API, the reconciler on Celery, agentd
under the NVML double (an H100 80GB that is not there) and fake engines that hold GPU
memory in it as vLLM holds its budget, and the gateway.

docs/operations.md, "Several models on one GPU": each share is told its budget, holds it,
is measured by its node and shown against it; one that holds more is flagged. And
"Priorities": a model of higher priority that does not fit drains one of lower priority
(its requests in flight finish), takes its room, and gives it back when it scales down.
"""

import json
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

import pytest
import requests

from fleet.models import Node, NodeLoad, Shard
from tests.agent import nvml_data
from tests.e2e.helpers import answers, wait_serving
from tests.processes import Load, Stack

pytestmark = pytest.mark.django_db(transaction=True)

# Preempted replicas drain for at most this long: far past the 4 s streams below, so
# nothing but the engine's own count of requests in flight ends the drain (the stack's
# 5 s would race the streams on a busy machine).
DRAIN_TIMEOUT_S = 60


@pytest.fixture
def clock():
    return {"LLMGW_DRAIN_TIMEOUT_S": str(DRAIN_TIMEOUT_S)}


MIB = 2**20
H100_MIB = nvml_data.H100["memory_mib"]  # 81559: "80GB" as NVML counts it
DRIVER_MIB = 535  # what the driver holds on an idle H100 (nvml_data.gpu)


def shared_model(stack: Stack, name: str, gpu_memory_gb: float, args=(), **fields) -> int:
    """A fake-engine model of one replica on a share of one GPU, declared through the API;
    ``fields``: more of the model's (``priority=90``). Returns its id."""
    model = stack.api("post", "models/", json={"name": name, "desired_replicas": 1, **fields})
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model["id"],
            "name": "shared",
            "engine": "fake",
            "model_path": str(stack.tmp / "fake-weights"),  # the fake engine loads nothing
            "gpus_per_node": 1,
            "tp": 1,
            "gpu_memory_gb": gpu_memory_gb,
            "args": list(args),
        },
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})
    return model["id"]


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


def api_replicas(stack: Stack, name: str, state: str) -> list[dict]:
    return stack.api("get", f"replicas/?model_name={name}&state={state}")["results"]


@dataclass
class Stream:
    """One streamed chat completion through the gateway: the words that came, how it ended."""

    text: str = ""
    finish_reason: str | None = None
    done: bool = False  # ended by ``data: [DONE]``
    error: str = ""
    ended_at: float | None = None  # time.time(), to set beside the control plane's clock
    first_chunk: threading.Event = field(default_factory=threading.Event)

    def complete(self, words: int) -> bool:
        return (
            self.done
            and not self.error
            and self.finish_reason == "length"
            and len(self.text.split()) == words
        )


def stream_chat(stack: Stack, name: str, max_tokens: int, out: Stream) -> None:
    """Read a streamed chat completion to its end into ``out`` (run in a thread)."""
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    try:
        with requests.post(
            f"{stack.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {stack.inference_key}"},
            stream=True,
            timeout=60,
        ) as resp:
            if resp.status_code != 200:
                out.error = f"{resp.status_code} {resp.text[:200]}"
                return
            for line in resp.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    out.done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    out.error = f"error event: {event['error']}"
                    return
                for choice in event["choices"]:
                    out.text += (choice.get("delta") or {}).get("content") or ""
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
                out.first_chunk.set()
    except (requests.RequestException, ValueError) as exc:
        out.error = f"{type(exc).__name__} after {len(out.text.split())} words"
    finally:
        out.ended_at = time.time()


def gpu_node(stack) -> dict:
    """Agent gpu-a with one H100 80GB (the NVML double), running the fake engine; its GPU."""
    spec = nvml_data.hgx(nvml_data.H100, count=1)
    stack.add_agent("gpu-a", nvml=spec, engines={"binaries": {"fake": sys.executable}})
    stack.wait(
        lambda: Node.objects.filter(pk="gpu-a", connected=True, gpus__isnull=False).exists(),
        "the GPU node to register",
    )
    return spec["gpus"][0]


def test_two_models_share_one_gpu_within_their_budgets_and_one_over_its_budget_is_flagged(
    stack,
):
    # given: a node with one H100 80GB (the NVML double) that runs the fake engine
    gpu = gpu_node(stack)

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


STREAMS = 4
STREAM_TOKENS = 20  # at 0.2 s a token: ~4 s each


def test_a_higher_priority_model_preempts_a_lower_one_after_its_requests_finish_and_it_returns(
    stack,
):
    # given: one H100 80GB shared by "low" (priority 10, 40 GB, slow tokens) and "mid"
    # (priority 20, 30 GB), both ready: 70 of its 79.6 GB promised
    gpu = gpu_node(stack)
    shared_model(stack, "low", 40, args=["--token-delay", "0.2"], priority=10)
    shared_model(stack, "mid", 30, priority=20)
    for name in ("low", "mid"):
        wait_serving(stack, name, timeout=180)
    low, mid = api_shard(stack, "low"), api_shard(stack, "mid")
    assert low["gpu_uuids"] == mid["gpu_uuids"] == [gpu["uuid"]]

    on_mid = Load(
        stack.url,
        stack.inference_key,
        "mid",
        clients=1,
        stream_every=0,
        rate_per_s=None,
        pause_s=0.2,
    )
    with on_mid:
        on_mid.wait_requests(5)
        # and: streamed answers to low in flight
        streams = [Stream() for _ in range(STREAMS)]
        threads = [
            threading.Thread(target=stream_chat, args=(stack, "low", STREAM_TOKENS, s))
            for s in streams
        ]
        for t in threads:
            t.start()
        stack.wait(
            lambda: all(s.first_chunk.is_set() or s.ended_at for s in streams),
            "the first chunk of every stream to low",
        )

        # when: a model of priority 90 asks for 45 GB of the GPU, which has 9.6 free
        high_id = shared_model(stack, "high", 45, priority=90)

        # then: every request in flight to low ends with its whole answer
        for t in threads:
            t.join(180)
        assert not any(t.is_alive() for t in threads)
        failed = [s for s in streams if not s.complete(STREAM_TOKENS)]
        assert not failed, failed
        # and high takes low's room on the same GPU, and answers
        wait_serving(stack, "high", timeout=180)
        high = api_shard(stack, "high")
        assert high["node"] == "gpu-a" and high["gpu_uuids"] == [gpu["uuid"]]
        # and one preemption: low's replica, for high
        (event,) = stack.api("get", "events/?kind=preempt")["results"]
        assert event["model_name"] == "low"
        assert f"replica {low['replica']} on gpu-a" in event["reason"], event
        assert event["reason"].endswith("to make room for high (priority 90)"), event
        # which began while the streams were still coming: the drain waited for them
        preempted_at = datetime.fromisoformat(event["created_at"]).timestamp()
        assert all(s.ended_at > preempted_at for s in streams), (
            "the streams ended before low was preempted, so no drain waited for them: "
            "make them longer",
            preempted_at,
            [s.ended_at for s in streams],
        )
        # and low keeps its count: its drained replica is gone, and one in its place waits
        # for room, saying by whom
        (waiting,) = stack.wait(
            lambda: (
                (r := stack.api("get", "replicas/?model_name=low")["results"])
                and all(x["id"] != low["replica"] for x in r)
                and r
            ),
            "low's drained replica to be gone",
        )
        assert waiting["state"] == "pending", waiting
        assert waiting["preempted_by"] == "high (priority 90)"
        assert waiting["reason"].startswith("preempted by high (priority 90)"), waiting
        # and mid is untouched: the same engine, ready
        assert api_shard(stack, "mid")["id"] == mid["id"]
        assert [r["id"] for r in api_replicas(stack, "mid", "ready")] == [mid["replica"]]
        on_mid.wait_requests(5)

        # when: high scales to zero
        stack.api("patch", f"models/{high_id}/", json={"desired_replicas": 0})

        # then: low comes back on the GPU it left, and answers
        wait_serving(stack, "low", timeout=180)
        back = api_shard(stack, "low")
        assert back["replica"] == waiting["id"]
        assert back["node"] == "gpu-a" and back["gpu_uuids"] == [gpu["uuid"]]
        (ready,) = api_replicas(stack, "low", "ready")
        assert ready["id"] == waiting["id"] and ready["preempted_by"] == ""
        stack.wait(
            lambda: (
                not stack.api("get", "shards/?model_name=high&desired_state=running")["results"]
            ),
            "high's shard to be retired",
        )
        on_mid.wait_requests(5)
    # and mid answered every request throughout, from the engine it started with
    figures = on_mid.summary()
    assert figures["failed"] == figures["broken"] == 0, figures
    assert api_shard(stack, "mid")["id"] == mid["id"]
    # and nothing else was preempted
    assert stack.api("get", "events/?kind=preempt")["count"] == 1
