"""Models that take turns on one GPU by sleeping, over real processes: the API, the
reconciler on Celery, agentd under the NVML double (an H100 80GB that is not there), fake
engines that speak vLLM's sleep API and hold GPU memory in the double as vLLM does, and
the gateway.

docs/operations.md, "Sleep and wake": four models whose shares fit one awake at a time
answer every request of a cycle over them, the least recently used asleep; the double
checks that what is held awake never passed the GPU; a model of higher priority never
sleeps for one of lower; an asleep replica whose engine died is replaced.
"""

import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import pytest
import requests

from fleet.models import Event, EventKind, Node, Replica, Shard
from tests.agent import nvml_data
from tests.e2e.helpers import wait_serving

pytestmark = pytest.mark.django_db(transaction=True)

SHARE_GB = 50  # of an H100's 79.6: one awake at a time
NAMES = ("m1", "m2", "m3", "m4")
REQUESTS = 100


@pytest.fixture
def clock():
    return {"LLMGW_GATEWAY_WAIT_COMMENT_S": "0.2", "LLMGW_GATEWAY_LOAD_REPORT_S": "0.5"}


def gpu_node(stack):
    """Agent gpu-a with one H100 80GB (the NVML double), running the fake engine; the agent
    and its GPU."""
    spec = nvml_data.hgx(nvml_data.H100, count=1)
    agent = stack.add_agent("gpu-a", nvml=spec, engines={"binaries": {"fake": sys.executable}})
    stack.wait(
        lambda: Node.objects.filter(pk="gpu-a", connected=True, gpus__isnull=False).exists(),
        "the GPU node to register",
    )
    return agent, spec["gpus"][0]


def sleeping_model(stack, name: str, priority: int = 0, **fields) -> int:
    """A fake-engine model on a 50 GB share of one GPU that sleeps (level 1) after an
    hour idle: here it sleeps only to make way for another."""
    model = stack.api(
        "post",
        "models/",
        json={
            "name": name,
            "desired_replicas": 1,
            "sleep_after_s": 3600,
            "sleep_level": 1,
            "priority": priority,
            **fields,
        },
    )
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model["id"],
            "name": "shared",
            "engine": "fake",
            "model_path": str(stack.tmp / "fake-weights"),
            "gpus_per_node": 1,
            "tp": 1,
            "gpu_memory_gb": SHARE_GB,
            "args": ["--wake-time", "0.3"],
        },
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})
    return model["id"]


def states(name: str) -> list[str]:
    return sorted(
        Replica.objects.filter(model__name=name)
        .exclude(state="stopped")
        .values_list("state", flat=True)
    )


def chat(stack, name: str, timeout: float = 60) -> requests.Response:
    return requests.post(
        f"{stack.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {stack.inference_key}"},
        json={"model": name, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
        timeout=timeout,
    )


def peak(agent, gpu: dict) -> int:
    """The most GPU memory the double saw held at once on the GPU: the driver's and every
    engine's claims together."""
    found = json.loads(Path(f"{agent.nvml_file}.peak.json").read_text())
    return gpu["memory_used_bytes"] + found[gpu["uuid"]]


def test_four_models_take_turns_on_one_gpu_and_an_asleep_replica_that_died_is_replaced(
    stack, record
):
    # given: one H100 80GB and four models of 50 GB each that sleep: one fits awake
    agent, gpu = gpu_node(stack)
    for name in NAMES:
        sleeping_model(stack, name)
    # each placed in turn: the one awake sleeps to make way for the next
    stack.wait(
        lambda: sorted(s for n in NAMES for s in states(n)) == ["asleep"] * 3 + ["ready"],
        "one of the four ready and three asleep",
        timeout=180,
    )

    # when: 100 requests cycle over them, one at a time
    failed, woke, wake_s = [], 0, []
    for i in range(REQUESTS):
        name = NAMES[i % len(NAMES)]
        began = time.monotonic()
        resp = chat(stack, name)
        took = time.monotonic() - began
        if resp.status_code != 200:
            failed.append((i, name, resp.status_code, resp.text[:200]))
            continue
        if resp.headers.get("x-llmgw-woke"):
            # the header names the replica that woke and answered
            assert resp.headers["x-llmgw-woke"] == resp.headers["x-llmgw-replica"]
            woke += 1
            wake_s.append(took)

    # then: every one answered, most by a replica woken for it
    assert failed == []
    assert woke >= REQUESTS - len(NAMES)
    # and never more GPU memory held awake than the GPU has (the double's own record)
    assert peak(agent, gpu) <= gpu["memory_total_bytes"]
    # and the gateway counted the wakes and their time
    metrics = requests.get(f"{stack.url}/metrics", timeout=10).text
    assert 'llmgw_gateway_woken_requests_total{model="m1"}' in metrics

    # when: the engine of one asleep replica dies
    victim = next(n for n in NAMES if states(n) == ["asleep"])
    [shard] = Shard.objects.filter(replica__model__name=victim, desired_state="asleep")
    killed = time.monotonic()
    os.kill(agent.engines()[shard.pk], signal.SIGKILL)

    # then: it is replaced, and answers again
    stack.wait(
        lambda: Shard.objects.filter(replica__model__name=victim).exclude(pk=shard.pk).exists(),
        f"a new shard for {victim}",
        timeout=120,
    )
    assert chat(stack, victim).status_code == 200
    replaced_s = time.monotonic() - killed
    most = peak(agent, gpu)
    assert most <= gpu["memory_total_bytes"]
    record(
        "19",
        models=len(NAMES),
        share_gb=SHARE_GB,
        gpu_gb=round(gpu["memory_total_bytes"] / 2**30, 1),
        requests=REQUESTS,
        failed=len(failed),
        woken=woke,
        wake_median_s=round(statistics.median(wake_s), 2),
        wake_max_s=round(max(wake_s), 2),
        peak_gb=round(most / 2**30, 1),
        replaced_s=round(replaced_s, 1),
    )


def test_a_higher_priority_model_is_never_put_to_sleep_for_a_lower_one(stack):
    # given: "low" (priority 10) placed first, then "high" (priority 50): low makes way
    gpu_node(stack)
    sleeping_model(stack, "low", priority=10, max_wait_s=3)
    wait_serving(stack, "low", timeout=180)
    sleeping_model(stack, "high", priority=50)
    wait_serving(stack, "high", timeout=180)
    assert states("low") == ["asleep"]

    # when: a request asks for low
    resp = chat(stack, "low")

    # then: it is refused once its wait is over, saying why; high was never put to sleep
    assert resp.status_code == 503
    assert "asleep" in resp.json()["error"]["message"]
    assert states("high") == ["ready"]
    assert not Event.objects.filter(kind=EventKind.SLEEP, model_name="high").exists()
    assert chat(stack, "high").status_code == 200
    reason = Replica.objects.get(model__name="low").reason
    assert reason.startswith("asleep: cannot wake: gpu-a: GPU 0 has"), reason
