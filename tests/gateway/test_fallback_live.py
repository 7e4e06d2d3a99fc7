"""Fallback models on a real web process (docs/gateway.md, "Fallbacks"): a model with no
ready replica, or whose replicas fail every try, is answered by the next fallback the
key may use, and the answer says so."""

import json
import urllib.request

import pytest

from fleet.models import Model
from tests.factories import inference_key, ready_model
from tests.gateway.live import client, post

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

ASK = {"model": "big", "messages": [{"role": "user", "content": "hi"}]}


def metrics(server) -> str:
    return urllib.request.urlopen(server.url + "/metrics").read().decode()


def test_a_model_with_no_ready_replica_is_answered_by_its_fallback(gateway_server, upstreams):
    # given: big has no replica at all, and names small (ready) as its fallback
    small = upstreams("small")
    ready_model("small", [small], served_name="Qwen/small")
    Model.objects.create(name="big", desired_replicas=0, fallbacks=["gone", "small"])
    _, secret = inference_key()

    # when: a client asks for big
    status, headers, body = post(gateway_server, "/v1/chat/completions", ASK, secret)

    # then: small answers, the answer says so, and small's engine saw its own name
    assert status == 200, body
    assert headers["x-llmgw-fallback"] == "small"
    assert json.loads(body)["choices"][0]["message"]["content"] == "Hello, fleet!"
    assert small.requests[-1]["model"] == "Qwen/small"

    # and a stream falls back the same way, before its first byte
    stream = client(gateway_server, secret).chat.completions.with_raw_response.create(
        model="big", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert stream.headers["x-llmgw-fallback"] == "small"
    assert "".join(c.choices[0].delta.content or "" for c in stream.parse()) == "Hello, fleet!"
    said = metrics(gateway_server)
    assert (
        'llmgw_gateway_fallbacks_total{fallback="small",model="big",why="no_ready_replica"} 2.0'
        in said
    )


def test_a_key_that_may_not_use_the_fallback_gets_the_models_own_answer(gateway_server, upstreams):
    ready_model("small", [upstreams("small")])
    Model.objects.create(name="big", desired_replicas=0, fallbacks=["small"])
    _, secret = inference_key(allowed_models=["big"])

    status, headers, body = post(gateway_server, "/v1/chat/completions", ASK, secret)

    assert status == 503 and "x-llmgw-fallback" not in headers
    assert json.loads(body)["error"]["code"] == "no_ready_replica"


def test_replicas_that_fail_every_try_fall_back_and_a_client_error_does_not(
    gateway_server, upstreams
):
    small = upstreams("small")
    ready_model("small", [small])
    broken = [upstreams("b1", mode="status503"), upstreams("b2", mode="status503")]
    model, _ = ready_model("big", broken)
    Model.objects.filter(pk=model.pk).update(fallbacks=["small"])
    _, secret = inference_key()

    status, headers, _ = post(gateway_server, "/v1/chat/completions", ASK, secret)

    assert status == 200 and headers["x-llmgw-fallback"] == "small"
    assert sum(len(b.requests) for b in broken) == 2, "both of big's replicas were tried first"
    assert (
        'llmgw_gateway_fallbacks_total{fallback="small",model="big",why="upstream_failed"} 1.0'
        in metrics(gateway_server)
    )

    # a bad request is the client's: it is answered, not sent elsewhere
    served = small.served
    status, headers, _ = post(gateway_server, "/v1/chat/completions", {"model": "big"}, secret)
    assert status == 400 and "x-llmgw-fallback" not in headers
    assert small.served == served


def test_a_keys_fallbacks_answer_after_the_models_own_in_order(gateway_server, upstreams):
    # given: big names small (down too); the key names tiny and small after it
    tiny, small = upstreams("tiny"), upstreams("small")
    ready_model("tiny", [tiny])
    ready_model("small", [small])
    Model.objects.create(name="big", desired_replicas=0, fallbacks=["small"])
    Model.objects.create(name="idle", desired_replicas=0)
    _, plain = inference_key("plain")
    _, keyed = inference_key("keyed", fallbacks=["idle", "tiny", "small"])

    # when: small answers for big through either key, the model's own fallback first
    for secret in (plain, keyed):
        status, headers, _ = post(gateway_server, "/v1/chat/completions", ASK, secret)
        assert status == 200 and headers["x-llmgw-fallback"] == "small"

    # and a model with no fallbacks of its own: only the key that names some is answered
    ask = {**ASK, "model": "idle"}
    status, headers, body = post(gateway_server, "/v1/chat/completions", ask, plain)
    assert status == 503 and json.loads(body)["error"]["code"] == "no_ready_replica"
    status, headers, _ = post(gateway_server, "/v1/chat/completions", ask, keyed)

    # then: the key's first fallback with a ready replica answers (idle is itself)
    assert status == 200 and headers["x-llmgw-fallback"] == "tiny"
    assert len(tiny.requests) == 1 and len(small.requests) == 2
    assert (
        'llmgw_gateway_fallbacks_total{fallback="tiny",model="idle",why="no_ready_replica"} 1.0'
        in metrics(gateway_server)
    )
