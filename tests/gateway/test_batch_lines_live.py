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


def test_a_batch_line_gives_way_to_interactive_requests_queued(start_gateway, upstreams):
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

    def interactive(who):
        answers[who] = ask(server, secret, "busy", who)[0]

    threads = [threading.Thread(target=interactive, args=(w,)) for w in ("first", "second")]
    threads[0].start()
    wait_until(lambda: len(engine.requests) == 1, what="the first request on the replica")
    threads[1].start()
    wait_until(
        lambda: (load.read().get("busy") or load.ModelLoad()).queued == 1,
        what="the gateway to report the second request queued",
    )

    # when: a batch's line of the same key asks
    status, body = ask(server, line_credential(api_key), "busy", "line-1")

    # then: it is refused as "not now", the interactive one keeps its turn
    assert status == 429, body
    assert body["error"]["code"] == "model_at_capacity"
    assert "1 interactive request(s) waiting" in body["error"]["message"]
    assert len(engine.requests) == 1

    # when: the interactive requests are answered, the line goes through
    engine.release.set()
    for t in threads:
        t.join(60)
    assert answers == {"first": 200, "second": 200}
    status, body = ask(server, line_credential(api_key), "busy", "line-1")
    assert status == 200, body
    assert [r["messages"][0]["content"] for r in engine.requests] == ["first", "second", "line-1"]


def test_a_batch_line_never_wakes_a_model_scaled_to_zero(start_gateway, upstreams):
    # given: a model scaled to zero, whose interactive requests wait for a replica
    ready_model("tiny", [])
    Model.objects.filter(name="tiny").update(min_replicas=0, max_replicas=1, max_wait_s=30)
    api_key, _ = inference_key("research")
    server = start_gateway(
        **FAST_REFRESH, LLMGW_GATEWAY_WAIT_TIMEOUT_S="30", LLMGW_GATEWAY_LOAD_REPORT_S="0.25"
    )

    # when: a batch's line asks for it
    status, body = ask(server, line_credential(api_key), "tiny", "line-1")

    # then: a 503 at once, for the runner to send it later, and no demand reported
    assert status == 503, body
    assert body["error"]["code"] == "no_ready_replica"
    metrics = urllib.request.urlopen(server.url + "/metrics").read()
    assert b'llmgw_gateway_waiting_requests{model="tiny"} 1.0' not in metrics
    wait_until(lambda: "tiny" in load.read(), what="the gateway to report the model")
    time.sleep(0.6)  # the report's interval, twice over
    figures = load.read()["tiny"]
    assert (figures.waiting, figures.last_request) == (0, None)
