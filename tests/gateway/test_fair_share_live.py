"""Fair share on a busy model (fleet/gateway/fair.py; docs/gateway.md, "Fair share"), on a
real web process: a replica that takes one request at a time, a heavy key with six
requests waiting, and a light key's one request that arrives after them."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.factories import inference_key, ready_model

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def ask(server, secret, who: str, answers: dict) -> None:
    body = {"model": "busy", "messages": [{"role": "user", "content": who}]}
    req = urllib.request.Request(
        server.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            answers[who] = resp.status
    except urllib.error.HTTPError as exc:
        answers[who] = exc.code


def served_order(start_gateway, upstreams, fair: bool) -> list[str]:
    engine = upstreams("busy", mode="hang")  # holds each request until released
    ready_model("busy", [engine])
    _, heavy = inference_key("heavy")
    _, light = inference_key("light", share_weight=1)
    server = start_gateway(
        LLMGW_GATEWAY_MAX_OUTSTANDING_PER_REPLICA="1",
        LLMGW_GATEWAY_FAIR_QUEUE="20",
        LLMGW_GATEWAY_FAIR_SHARE="true" if fair else "false",
    )
    answers: dict[str, int] = {}
    threads = []

    def send(secret, who):
        t = threading.Thread(target=ask, args=(server, secret, who, answers), daemon=True)
        t.start()
        threads.append(t)

    send(heavy, "heavy-0")
    deadline = time.monotonic() + 30
    while len(engine.requests) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    for i in range(1, 7):
        send(heavy, f"heavy-{i}")
        time.sleep(0.05)  # in this order into the gateway's queue
    time.sleep(0.3)
    send(light, "light")
    time.sleep(0.3)
    assert len(engine.requests) == 1, "the replica holds one; the rest wait in the gateway"

    engine.release.set()
    for t in threads:
        t.join(60)
    assert set(answers.values()) == {200}, answers
    return [r["messages"][0]["content"] for r in engine.requests]


def test_a_light_key_is_served_before_a_heavy_keys_queue_drains(start_gateway, upstreams):
    order = served_order(start_gateway, upstreams, fair=True)
    # heavy-0 held the replica, heavy-1 had waited first; then it is light's turn
    assert order.index("light") == 2, order
    assert [o for o in order if o != "light"] == [f"heavy-{i}" for i in range(7)]


def test_first_come_first_served_when_fair_share_is_off(start_gateway, upstreams):
    order = served_order(start_gateway, upstreams, fair=False)
    assert order == [*(f"heavy-{i}" for i in range(7)), "light"], order
