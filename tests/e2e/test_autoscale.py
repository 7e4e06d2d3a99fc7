"""Scale to zero and back on demand, and autoscaling on load, over real processes: the API,
the reconciler on Celery, agentd, llama.cpp (or the fake engine, to hold requests in
flight) and the gateway on Daphne.

The cool-downs and the idle time are seconds here rather than minutes (this module's
``clock``); the rules are the same.
"""

import json
import sys
import threading

import pytest
import requests

from fleet.models import Event, Model, Node, Replica
from tests.e2e.helpers import apply_model, live_shards, wait_passes, wait_serving
from tests.processes import Load

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock():
    return {
        "LLMGW_AUTOSCALE_UP_COOLDOWN_S": "2",
        "LLMGW_AUTOSCALE_DOWN_COOLDOWN_S": "3",
        "LLMGW_GATEWAY_WAIT_COMMENT_S": "0.2",
        "LLMGW_GATEWAY_LOAD_REPORT_S": "0.5",
    }


def registered(node_id):
    return Node.objects.filter(pk=node_id, connected=True, registered_at__isnull=False).exists()


def chat(stack, model, *, stream=False, max_tokens=4, timeout=60) -> requests.Response:
    return requests.post(
        f"{stack.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {stack.inference_key}"},
        json={
            "model": model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": max_tokens,
            "stream": stream,
        },
        timeout=timeout,
    )


def in_threads(*calls):
    """Run each call in a thread of its own; their results, in order, once all have ended."""
    results = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - kept for the assertion to show
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    return threads, results


def scaling(stack, name) -> str:
    (model,) = stack.api("get", "models/", params={"name": name})["results"]
    return model["scaling"]


def autoscale_events(name):
    return [
        (e.from_replicas, e.to_replicas, e.direction, e.reason)
        for e in Event.objects.filter(model_name=name).order_by("created_at", "id")
    ]


def test_a_model_at_zero_starts_for_waiting_requests_serves_them_all_and_idles_back_to_zero(
    stack, tiny_model
):
    # given: one CPU node and a model that may scale to zero, at zero
    stack.add_agent("cpu-a")
    stack.wait(lambda: registered("cpu-a"), "the agent to register")
    apply_model(
        stack, tiny_model, replicas=0, min_replicas=0, max_replicas=2, scale_to_zero_after_s=3
    )
    wait_passes(stack, 2)
    assert live_shards() == []
    assert scaling(stack, "tiny-llama") == "scaled to zero"

    # when: four clients ask for it at once, two of them streaming
    threads, results = in_threads(
        lambda: chat(stack, "tiny-llama"),
        lambda: chat(stack, "tiny-llama"),
        lambda: chat(stack, "tiny-llama", stream=True),
        lambda: chat(stack, "tiny-llama", stream=True),
    )
    for t in threads:
        t.join(120)

    # then: a replica was started for them, and every one of them got its answer
    assert [r.status_code for r in results] == [200, 200, 200, 200], results
    for r in results[:2]:
        assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    for r in results[2:]:
        text = r.text
        # kept alive while it waited, then the engine's events, ended properly
        assert text.startswith(": waiting for a replica\n\n")
        events = [line for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["object"] == "chat.completion.chunk"
    (woke, *_) = autoscale_events("tiny-llama")
    assert woke[:3] == (0, 1, "up") and "waiting" in woke[3]

    # when: nobody asks for 3 s
    stack.wait(
        lambda: Model.objects.get(name="tiny-llama").desired_replicas == 0 and not live_shards(),
        "the idle model to be scaled to zero",
    )
    # (and its drained replica stopped: until then a gateway whose table is a moment
    # old may still send it a request, which it answers)
    stack.wait(
        lambda: (
            not Replica.objects.filter(model__name="tiny-llama").exclude(state="stopped").exists()
        ),
        "the drained replica to stop",
    )
    # then: the decision says why
    last = autoscale_events("tiny-llama")[-1]
    assert last[:3] == (1, 0, "down") and "no request for" in last[3]
    assert scaling(stack, "tiny-llama") == "scaled to zero"

    # and: the next request starts it again and is answered
    again = chat(stack, "tiny-llama")
    assert again.status_code == 200, again.text
    assert [e[:3] for e in autoscale_events("tiny-llama")] == [
        (0, 1, "up"),
        (1, 0, "down"),
        (0, 1, "up"),
    ]


def test_past_the_queue_bound_503_with_retry_after_and_a_wait_ends_at_its_bound(stack):
    # given: a model at zero that cannot be placed (no node), which holds at most 2
    # waiting requests for at most 8 s
    wait_passes(stack, 1)  # the reconciler is up
    model = stack.api(
        "post",
        "models/",
        json={
            "name": "nowhere",
            "desired_replicas": 0,
            "min_replicas": 0,
            "max_replicas": 1,
            "scale_to_zero_after_s": 60,
            "max_waiting": 2,
            "max_wait_s": 8,
        },
    )
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={"model": model["id"], "name": "cpu", "engine": "llamacpp", "model_path": "/x"},
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})

    # when: two requests wait, one of them streaming
    threads, results = in_threads(
        lambda: chat(stack, "nowhere"), lambda: chat(stack, "nowhere", stream=True)
    )
    # then: operators see why a replica is being started
    stack.wait(
        lambda: scaling(stack, "nowhere") == "starting for 2 waiting requests",
        "the API to show the waiting requests",
    )
    metrics = requests.get(f"{stack.url}/metrics", timeout=30).text
    assert 'llmgw_gateway_waiting_requests{model="nowhere"} 2.0' in metrics
    assert 'llmgw_autoscaler_decisions_total{direction="up",model="nowhere"} 1.0' in metrics

    # when: a third one comes while two wait
    third = chat(stack, "nowhere")
    # then: 503 at once, in OpenAI's shape, saying when to come back
    assert third.status_code == 503
    assert int(third.headers["Retry-After"]) > 0
    error = third.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "too_many_waiting")
    assert "2 requests are waiting" in error["message"]

    # and: the two waiting ones end at the wait bound, without a replica
    for t in threads:
        t.join(60)
    plain, streamed = results
    assert plain.status_code == 503 and int(plain.headers["Retry-After"]) > 0
    error = plain.json()["error"]
    assert error["code"] == "no_ready_replica" and "waited 8 s" in error["message"]
    # the streamed one got its 200 and comments while it waited, then an error event
    assert streamed.status_code == 200
    assert streamed.text.startswith(": waiting for a replica\n\n")
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["error"]["code"] == "no_ready_replica"


def fake_model(stack, name, **fields) -> None:
    model = stack.api("post", "models/", json={"name": name, **fields})
    profile = stack.api(
        "post",
        "engine-profiles/",
        json={
            "model": model["id"],
            "name": "fake",
            "engine": "fake",
            "model_path": str(stack.tmp / "fake-weights"),  # the fake engine loads nothing
            "args": ["--token-delay", "0.05"],  # 40 tokens: 2 s in flight
        },
    )
    stack.api("patch", f"models/{model['id']}/", json={"active_profile": profile["id"]})


def test_a_load_step_scales_up_holds_and_after_it_scales_down_without_flapping(stack):
    # given: a node with the fake engine; a model of 1 to 3 replicas aiming at 2 in flight each
    stack.add_agent("cpu-a", engines={"binaries": {"fake": sys.executable}})
    stack.wait(lambda: registered("cpu-a"), "the agent to register")
    fake_model(
        stack, "steps", desired_replicas=1, min_replicas=1, max_replicas=3, target_outstanding=2
    )
    wait_serving(stack, "steps", count=1)

    # when: the load steps from nothing to 6 requests in flight at all times
    with Load(
        stack.url, stack.inference_key, model="steps", clients=6, max_tokens=40, rate_per_s=None
    ) as load:
        # then: it scales up to 3 replicas, all ready
        wait_serving(stack, "steps", count=3)
        # and holds 3 while the load holds (2 in flight each: inside the band)
        wait_passes(stack, 6)
        assert Model.objects.get(name="steps").desired_replicas == 3
    summary = load.summary()

    # when: the load is gone
    stack.wait(
        lambda: Model.objects.get(name="steps").desired_replicas == 1,
        "the model to scale back down to 1",
    )
    wait_passes(stack, 4)

    # then: every request was answered while replicas came and went
    assert summary["failed"] == summary["broken"] == 0, summary
    # and the decisions went up, then down one step at a time, never back and forth
    steps = autoscale_events("steps")
    directions = [d for _, _, d, _ in steps]
    assert directions == sorted(directions, key=lambda d: d != "up"), steps
    assert steps[-1][:2] == (2, 1) and steps[-2][:2] == (3, 2)
    assert max(to for _, to, _, _ in steps) == 3
    assert all("outstanding on" in reason for *_, reason in steps)
    assert Model.objects.get(name="steps").desired_replicas == 1
