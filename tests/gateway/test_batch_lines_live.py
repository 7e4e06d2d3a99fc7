"""A batch's lines take only what interactive requests leave (docs/gateway.md, "How a batch
runs"), on a real web process: a line carries its batch's credential (``lgb_``), and the
gateway refuses it while interactive requests queue for its model, never holds it for a
model to wake, and reports neither as the model's demand."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from fleet.models import Model
from fleet.services.autoscaler import load
from fleet.services.batches import credentials
from tests.factories import inference_key, ready_model
from tests.gateway.live import FAST_REFRESH, wait_until

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def ask(server, secret: str, model: str, who: str) -> tuple[int, dict]:
    body = {"model": model, "messages": [{"role": "user", "content": who}]}
    req = urllib.request.Request(
        server.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def line_credential(api_key) -> str:
    return credentials.mint(api_key.secret_hash, "batch_test")


def test_a_batch_line_waits_behind_every_interactive_request(start_gateway, upstreams):
    # given: a replica that takes one request at a time, one interactive request on it
    # and another waiting in the gateway's fair queue
    engine = upstreams("busy", mode="hang")
    ready_model("busy", [engine])
    api_key, secret = inference_key("research")
    server = start_gateway(
        **FAST_REFRESH,
        LLMGW_GATEWAY_MAX_OUTSTANDING_PER_REPLICA="1",
        LLMGW_GATEWAY_FAIR_QUEUE="20",
        LLMGW_GATEWAY_LOAD_REPORT_S="0.25",
    )
    answers = {}

    def send(who, secret=secret):
        def run():
            answers[who] = ask(server, secret, "busy", who)[0]

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    threads = [send("first")]
    wait_until(lambda: len(engine.requests) == 1, what="the first request on the replica")
    threads.append(send("second"))
    wait_until(
        lambda: (load.read().get("busy") or load.ModelLoad()).queued == 1,
        what="the gateway to report the second request queued",
    )

    # when: a batch's line of the same key asks, and then a third interactive request
    threads.append(send("line-1", line_credential(api_key)))
    time.sleep(0.3)
    threads.append(send("third"))
    wait_until(
        lambda: (load.read().get("busy") or load.ModelLoad()).queued == 2,
        what="the third request queued (the line is not: it waits apart)",
    )
    assert len(engine.requests) == 1 and "line-1" not in answers

    # then: once the replica has room, every interactive request goes before the line
    engine.release.set()
    for t in threads:
        t.join(60)
    assert answers == {"first": 200, "second": 200, "third": 200, "line-1": 200}
    served = [r["messages"][0]["content"] for r in engine.requests]
    assert served == ["first", "second", "third", "line-1"]


def test_a_batch_line_never_wakes_a_model_scaled_to_zero(start_gateway, upstreams):
    # given: a model scaled to zero, whose interactive requests wait for a replica (a name
    # of this test's own: the load reports of the worker's earlier gateways outlive them
    # by their TTL, and many of them name "tiny")
    ready_model("dormant", [])
    Model.objects.filter(name="dormant").update(min_replicas=0, max_replicas=1, max_wait_s=30)
    api_key, _ = inference_key("research")
    server = start_gateway(
        **FAST_REFRESH, LLMGW_GATEWAY_WAIT_TIMEOUT_S="30", LLMGW_GATEWAY_LOAD_REPORT_S="0.25"
    )

    # when: a batch's line asks for it
    status, body = ask(server, line_credential(api_key), "dormant", "line-1")

    # then: a 503 at once, for the runner to send it later, and no demand reported
    assert status == 503, body
    assert body["error"]["code"] == "no_ready_replica"
    metrics = urllib.request.urlopen(server.url + "/metrics").read()
    assert b'llmgw_gateway_waiting_requests{model="dormant"} 1.0' not in metrics
    wait_until(lambda: "dormant" in load.read(), what="the gateway to report the model")
    time.sleep(0.6)  # the report's interval, twice over
    figures = load.read()["dormant"]
    assert (figures.waiting, figures.last_request) == (0, None)


def test_batch_lines_fill_an_engine_but_never_its_queue(start_gateway, upstreams):
    # given: an engine that says what it queues (vLLM's gauge), running nothing yet, and
    # one that says nothing (llama-cpp-python's server answers one request at a time)
    seen = upstreams("seen")
    seen.waiting = 0
    unseen = upstreams("unseen")
    ready_model("seen", [seen])
    ready_model("unseen", [unseen])
    api_key, secret = inference_key("research")
    line = line_credential(api_key)
    server = start_gateway(**FAST_REFRESH, LLMGW_GATEWAY_FAIR_WAIT_S="1")
    wait_until(
        lambda: (
            b"llmgw_gateway_queue_depth" in urllib.request.urlopen(server.url + "/metrics").read()
            and ask(server, secret, "seen", "hi")[0] == 200
        ),
        what="the gateway to read the engines' metrics",
    )
    time.sleep(1)  # a scrape or three (LLMGW_GATEWAY_ENGINE_SCRAPE_S)
    seen.mode = unseen.mode = "hang"
    asked = []

    def send(model, n):
        t = threading.Thread(target=ask, args=(server, line, model, f"line-{n}"), daemon=True)
        t.start()
        asked.append(t)

    # when: lines go to each while the engines hold them
    for n in range(3):
        send("seen", n)
    wait_until(lambda: seen.in_flight == 3, what="three lines on the engine that is seen")
    send("unseen", 0)
    wait_until(lambda: unseen.in_flight == 1, what="a line on the engine that is not seen")

    # then: the unseen engine takes no second line; the seen one takes more until it queues
    status, body = ask(server, line, "unseen", "line-1")
    assert (status, body["error"]["code"]) == (429, "model_at_capacity"), body
    assert "its engine's queue cannot be seen" in body["error"]["message"]
    seen.waiting = 2
    wait_until(  # three in flight, two queued in the engine
        lambda: (
            b'llmgw_gateway_queue_depth{model="seen"} 5.0'
            in urllib.request.urlopen(server.url + "/metrics").read()
        ),
        what="the gateway to read the engine's queue",
    )
    status, body = ask(server, line, "seen", "line-4")
    assert "its engine queues 2 request(s)" in body["error"]["message"], body
    assert (seen.in_flight, unseen.in_flight) == (3, 1)
    seen.release.set()
    unseen.release.set()
    for t in asked:
        t.join(30)
