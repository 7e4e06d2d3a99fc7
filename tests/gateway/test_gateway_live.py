"""The gateway on a real web process, driven by the official openai client."""

import urllib.request

import openai
import pytest

from tests.factories import inference_key, ready_model
from tests.gateway.live import FAST_REFRESH, client, wait_until

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def test_openai_client_chat_completions_embeddings_and_models(gateway_server, upstreams):
    # given a model with one ready replica and an inference key
    up = upstreams("a")
    ready_model("tiny", [up])
    _, secret = inference_key()
    c = client(gateway_server, secret)

    # when the unmodified openai client uses every endpoint
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    stream = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in stream)
    completion = c.completions.create(model="tiny", prompt="say hi")
    streamed_completion = "".join(
        ch.choices[0].text for ch in c.completions.create(model="tiny", prompt="hi", stream=True)
    )
    emb = c.embeddings.create(model="tiny", input=["a", "b"])
    models = c.models.list()

    # then each answer is the engine's, passed through
    assert chat.choices[0].message.content == "Hello, fleet!"
    assert streamed == "Hello, fleet!"
    assert completion.choices[0].text == "Hello, fleet!"
    assert streamed_completion == "Hello, fleet!"
    assert [d.embedding for d in emb.data] == [[0.25, -0.5, 0.0], [0.25, -0.5, 1.0]]
    assert [m.id for m in models.data] == ["tiny"]
    assert c.models.retrieve("tiny").id == "tiny"
    assert up.served == 5


def chat(c, model="tiny", **kw):
    return c.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], **kw
    )


def test_a_revoked_key_is_refused_within_seconds_without_a_doorbell(gateway_server, upstreams):
    from django.utils import timezone

    from fleet.models import ApiKey

    # given a key in use
    ready_model("tiny", [upstreams("a")])
    key, secret = inference_key("ci-bot")
    c = client(gateway_server, secret)
    assert chat(c).status_code == 200

    # when an operator revokes it (a plain update: no signal, no doorbell)
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())

    # then the periodic refresh alone shuts it out, with a message saying why
    def refused():
        try:
            chat(c)
        except openai.AuthenticationError as exc:
            return exc
        return None

    exc = wait_until(refused, what="the revocation")
    assert "'ci-bot'" in exc.message and "revoked" in exc.message
    # and its use was recorded, in a batch, without a query per request
    wait_until(
        lambda: ApiKey.objects.get(pk=key.pk).last_used_at is not None,
        timeout=15,
        what="last_used_at",
    )


def test_a_revocation_doorbell_reaches_the_gateway_before_its_safety_refresh(
    start_gateway, upstreams
):
    from fleet.services.api_keys import revoke_api_key

    # given a gateway whose safety refresh is a minute away
    server = start_gateway(LLMGW_GATEWAY_KEYS_REFRESH_S="60", LLMGW_GATEWAY_REFRESH_S="60")
    ready_model("tiny", [upstreams("a")])
    key, secret = inference_key()
    c = client(server, secret)
    assert chat(c).status_code == 200
    # when an operator revokes the key (the service rings the gateways)
    assert revoke_api_key(key)

    # then it is refused well before the minute is up
    def refused():
        try:
            chat(c)
        except openai.AuthenticationError:
            return True
        return False

    wait_until(refused, timeout=10, what="the revocation through the doorbell")


def test_load_goes_to_the_replica_with_fewer_outstanding_requests(gateway_server, upstreams):
    from concurrent.futures import ThreadPoolExecutor

    # given two replicas that hold every request until released
    a, b = upstreams("a", mode="hang"), upstreams("b", mode="hang")
    ready_model("tiny", [a, b])
    _, secret = inference_key()
    c = client(gateway_server, secret, timeout=30)
    pool = ThreadPoolExecutor(8)
    held = [pool.submit(chat, c) for _ in range(4)]

    # then four concurrent requests are split two and two
    wait_until(lambda: a.in_flight + b.in_flight == 4, what="4 requests in flight")
    assert (a.in_flight, b.in_flight) == (2, 2)

    # when b frees up while a still holds two
    b.mode = "ok"
    b.release.set()
    wait_until(lambda: b.in_flight == 0, what="b to finish")
    for _ in range(5):
        assert chat(c).status_code == 200

    # then every new request went to b, the replica with nothing outstanding
    assert len(a.requests) == 2 and a.in_flight == 2
    assert len(b.requests) == 7
    a.release.set()
    assert all(f.result(timeout=10).status_code == 200 for f in held)
    pool.shutdown()


def test_a_draining_replica_takes_no_new_request_and_finishes_its_stream(gateway_server, upstreams):
    from fleet.models import DesiredState, Shard, ShardState
    from fleet.services import doorbells

    # given a slow stream in flight on the only ready replica, and another loading
    a, b = upstreams("a", token_delay=0.4), upstreams("b")
    _, (ra,) = ready_model("tiny", [a])
    _, (rb,) = ready_model("other", [b])
    _, secret = inference_key()
    c = client(gateway_server, secret, timeout=30)
    stream = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].delta.content == "Hello"

    # when a drains and b (moved to this model) becomes ready
    Shard.objects.filter(replica=ra).update(
        desired_state=DesiredState.DRAINING, state=ShardState.DRAINING
    )
    rb.model_id = ra.model_id
    rb.save(update_fields=["model"])
    doorbells.ring_gateways("routes")

    # then, once the gateway has heard, new requests go to b only
    wait_until(lambda: chat(c).headers["x-llmgw-replica"] == rb.pk, what="b taking requests")
    seen_by_a = len(a.requests)
    for _ in range(5):
        assert chat(c).headers["x-llmgw-replica"] == rb.pk
    assert len(a.requests) == seen_by_a
    # and a's stream runs to its end
    rest = "".join(ch.choices[0].delta.content or "" for ch in stream)
    assert "Hello" + rest == "Hello, fleet!"
    assert a.served == seen_by_a


def test_served_model_name_is_what_the_engine_sees(gateway_server, upstreams):
    up = upstreams("a")
    ready_model("qwen-coder", [up], served_name="Qwen/Qwen2.5-Coder-14B")
    _, secret = inference_key()
    resp = chat(client(gateway_server, secret), model="qwen-coder")
    assert resp.status_code == 200
    assert up.requests[-1]["model"] == "Qwen/Qwen2.5-Coder-14B"


def test_metrics_count_requests_time_to_first_token_and_in_flight(gateway_server, upstreams):
    ready_model("tiny", [upstreams("a")])
    _, secret = inference_key()
    c = client(gateway_server, secret)
    assert chat(c).status_code == 200
    list(
        c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    with pytest.raises(openai.NotFoundError):
        chat(c, model="nope")
    text = urllib.request.urlopen(gateway_server.url + "/metrics").read().decode()
    assert 'llmgw_gateway_requests_total{adapter="",model="tiny",status="200"} 2.0' in text
    assert 'llmgw_gateway_requests_total{adapter="",model="-",status="404"} 1.0' in text
    assert 'llmgw_gateway_time_to_first_token_seconds_count{model="tiny"} 1.0' in text
    assert 'llmgw_gateway_request_duration_seconds_count{model="tiny"} 2.0' in text
    assert "llmgw_gateway_in_flight_requests{" in text
    assert 'llmgw_gateway_queue_depth{model="tiny"} 0.0' in text


def test_queue_depth_adds_what_the_engines_hold_waiting(gateway_server, upstreams):
    # given two replicas whose engines report 7 and 2 requests queued inside them
    a, b = upstreams("a"), upstreams("b")
    a.waiting, b.waiting = 7, 2
    ready_model("tiny", [a, b])
    _, secret = inference_key()
    assert chat(client(gateway_server, secret)).status_code == 200

    # then the gateway's queue depth for the model counts them
    def depth():
        text = urllib.request.urlopen(gateway_server.url + "/metrics").read().decode()
        return 'llmgw_gateway_queue_depth{model="tiny"} 9.0' in text

    wait_until(depth, what="the engines' queues in the queue depth")


def test_without_redis_the_gateway_serves_and_still_hears_revocations(start_gateway, upstreams):
    from django.utils import timezone

    from fleet.models import ApiKey

    # given a gateway whose channel layer points at nothing
    server = start_gateway(REDIS_URL="redis://127.0.0.1:9/0", LLMGW_GATEWAY_KEYS_REFRESH_S="0.5")
    ready_model("tiny", [upstreams("a")])
    key, secret = inference_key()
    c = client(server, secret)
    # then requests are served from the database's table all the same
    assert chat(c).status_code == 200
    # and a revocation still arrives, through the periodic refresh
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())

    def refused():
        try:
            chat(c)
        except openai.AuthenticationError:
            return True
        return False

    wait_until(refused, what="the revocation without Redis")
    # and the operator is told once, not on every retry
    assert server.output().count("gateway cannot hear the channel layer") == 1


def test_an_exchange_past_the_total_timeout_is_cut_with_the_reason(start_gateway, upstreams):
    # given a gateway whose exchanges may last 1 s, and an engine that takes 2.4 s
    server = start_gateway(**FAST_REFRESH, LLMGW_GATEWAY_TOTAL_TIMEOUT_S="1")
    up = upstreams("a", token_delay=0.6)
    ready_model("tiny", [up])
    _, secret = inference_key()
    c = client(server, secret, timeout=30)
    # when a whole answer is asked for, then it is a 504 that says why
    with pytest.raises(openai.APIStatusError) as whole:
        chat(c)
    assert whole.value.status_code == 504
    assert whole.value.body["code"] == "upstream_timeout"
    assert "no complete answer within 1 s" in whole.value.body["message"]
    # when a stream is asked for, then what came in time is kept and it ends with the reason
    stream = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].delta.content == "Hello"
    with pytest.raises(openai.APIError, match="no complete answer within 1 s"):
        for _ in stream:
            pass
