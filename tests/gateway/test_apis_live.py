"""/v1/messages and /v1/responses on a real web process, driven by the official anthropic
and openai clients, unmodified: translated for an engine that speaks only chat
completions, passed through to one that serves the API (vLLM), refused in the API's
own error shape, and counted."""

import threading
import time
import urllib.request

import anthropic
import openai
import pytest

from fleet.models import (
    DesiredState,
    EngineProfile,
    Model,
    Node,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)
from tests.factories import inference_key, ready_model
from tests.gateway.live import FAST_REFRESH, client, post, wait_until

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

HI = [{"role": "user", "content": "hi"}]


def claude(server, secret, **kw) -> anthropic.Anthropic:
    """The unmodified anthropic client on the gateway; its key as it sends it (x-api-key)."""
    return anthropic.Anthropic(base_url=server.url, api_key=secret, max_retries=0, **kw)


def tokens(server, model: str) -> tuple[float, float]:
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()

    def value(kind):
        line = f'llmgw_gateway_tokens_total{{kind="{kind}",model="{model}"}} '
        found = [x for x in text.splitlines() if x.startswith(line)]
        return float(found[0].split()[-1]) if found else 0.0

    return value("prompt"), value("completion")


def test_messages_through_an_engine_that_speaks_only_chat(gateway_server, upstreams):
    # given a model whose engine serves chat completions only, under another name
    up = upstreams("a")
    ready_model("tiny", [up], served_name="tiny-served")
    _, secret = inference_key()
    c = claude(gateway_server, secret)

    # when the anthropic client asks, whole and streamed
    message = c.messages.create(model="tiny", max_tokens=16, system="be brief", messages=HI)
    with c.messages.stream(model="tiny", max_tokens=16, messages=HI) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()

    # then the engine was asked a chat completion, under its served name
    assert up.paths == ["/v1/chat/completions"] * 2
    assert up.requests[0]["model"] == "tiny-served"
    assert up.requests[0]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert up.requests[1]["stream_options"] == {"include_usage": True}
    # and the client got Anthropic's message, whole and as its stream of events
    assert message.content[0].text == streamed == final.content[0].text == "Hello, fleet!"
    assert message.stop_reason == final.stop_reason == "end_turn"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 4)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 4)
    # and the gateway counted the tokens it reported
    assert tokens(gateway_server, "tiny") == (6.0, 8.0)


def test_responses_through_an_engine_that_speaks_only_chat(gateway_server, upstreams):
    up = upstreams("a")
    ready_model("tiny", [up])
    _, secret = inference_key()
    c = client(gateway_server, secret)

    # when the openai client asks, whole and streamed
    whole = c.responses.create(model="tiny", input="hi", instructions="be brief", store=False)
    with c.responses.stream(model="tiny", input=[{"role": "user", "content": "hi"}]) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()

    # then the engine was asked chat completions, and the client got response objects
    assert up.paths == ["/v1/chat/completions"] * 2
    assert up.requests[0]["messages"][0] == {"role": "system", "content": "be brief"}
    assert whole.output_text == "".join(deltas) == final.output_text == "Hello, fleet!"
    assert whole.status == final.status == "completed"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (3, 4)
    assert whole.store is False and whole.model == "tiny"
    assert tokens(gateway_server, "tiny") == (6.0, 8.0)


def test_both_pass_through_to_an_engine_that_serves_them(gateway_server, upstreams):
    # given a model served by vLLM, which serves both APIs itself
    up = upstreams("v")
    _, (replica,) = ready_model("tiny", [up], served_name="tiny-served")
    EngineProfile.objects.filter(pk=replica.profile_id).update(engine="vllm")
    _, secret = inference_key()
    c, o = claude(gateway_server, secret), client(gateway_server, secret)

    # when each client asks, whole and streamed
    message = c.messages.create(model="tiny", max_tokens=16, messages=HI)
    with c.messages.stream(model="tiny", max_tokens=16, messages=HI) as s:
        final = s.get_final_message()
    response = o.responses.create(model="tiny", input="hi")
    with o.responses.stream(model="tiny", input="hi") as s:
        streamed = s.get_final_response()

    # then the engine got each request at its own path, the model renamed, the rest as sent
    assert up.paths == ["/v1/messages"] * 2 + ["/v1/responses"] * 2
    assert up.requests[0] == {"model": "tiny-served", "max_tokens": 16, "messages": HI}
    # and its answers came back as they were
    assert message.id == final.id == "msg_v" and final.content[0].text == "Hello, fleet!"
    assert response.id == streamed.id == "resp_v" and streamed.output_text == "Hello, fleet!"
    # and their tokens were read from each API's own usage: 3 in and 4 out, four times
    assert tokens(gateway_server, "tiny") == (12.0, 16.0)


def test_errors_come_in_each_apis_own_shape(gateway_server, upstreams):
    ready_model("tiny", [upstreams("a")])
    ready_model("gone", [])
    _, secret = inference_key("ci-bot", allowed_models=["tiny", "gone"])
    anyone = claude(gateway_server, "")

    # no key, a wrong key: 401 in Anthropic's shape, raised by its client as such
    with pytest.raises(anthropic.AuthenticationError) as err:
        anyone.with_options(api_key="lgk_nope_nope").messages.create(
            model="tiny", max_tokens=4, messages=HI
        )
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "authentication_error"
    status, _, body = post(gateway_server, "/v1/messages", {"model": "tiny"})
    assert status == 401 and b'"authentication_error"' in body and b"x-api-key" in body

    c = claude(gateway_server, secret)
    # a model the key may not use: 403; one that does not exist: 404
    with pytest.raises(anthropic.PermissionDeniedError) as err:
        c.messages.create(model="other", max_tokens=4, messages=HI)
    assert "may not use model 'other'" in err.value.message
    ready_model("other", [])
    _, admin = inference_key("admin")
    with pytest.raises(anthropic.NotFoundError):
        claude(gateway_server, admin).messages.create(model="nope", max_tokens=4, messages=HI)
    # a model with no ready replica: 503, Anthropic's overloaded_error
    with pytest.raises(anthropic.InternalServerError) as err:
        c.messages.create(model="gone", max_tokens=4, messages=HI)
    assert err.value.status_code == 503
    assert err.value.body["error"] == {
        "type": "overloaded_error",
        "message": "model 'gone' has no ready replica: it is scaled to 0 replicas",
    }
    # a body the gateway refuses: 400 naming the field
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(model="tiny", max_tokens=0, messages=HI)
    assert "'max_tokens' must be at least 1" in err.value.message

    # the same on /v1/responses, in OpenAI's shape
    o = client(gateway_server, secret)
    with pytest.raises(openai.PermissionDeniedError):
        o.responses.create(model="other", input="hi")
    with pytest.raises(openai.InternalServerError) as err:
        o.responses.create(model="gone", input="hi")
    assert err.value.status_code == 503 and err.value.code == "no_ready_replica"
    # and an unknown path names the new ones
    status, _, body = post(gateway_server, "/v1/messages/batches", {}, secret)
    assert status == 404 and b"/v1/responses, /v1/messages" in body
    assert b'"not_found_error"' in body


def test_the_key_limits_apply_and_refuse_in_anthropics_shape(gateway_server, upstreams):
    ready_model("tiny", [upstreams("a")])
    _, secret = inference_key("team-a", requests_per_minute=2)
    c = claude(gateway_server, secret)
    c.messages.create(model="tiny", max_tokens=4, messages=HI)
    client(gateway_server, secret).responses.create(model="tiny", input="hi")

    # the third request in the minute, whichever API asked the first two
    with pytest.raises(anthropic.RateLimitError) as err:
        c.messages.create(model="tiny", max_tokens=4, messages=HI)
    assert err.value.body["error"]["type"] == "rate_limit_error"
    assert int(err.value.response.headers["retry-after"]) >= 1


def test_state_llmgw_cannot_keep_is_refused_before_any_engine_is_asked(gateway_server, upstreams):
    up = upstreams("v")
    _, (replica,) = ready_model("tiny", [up])
    EngineProfile.objects.filter(pk=replica.profile_id).update(engine="vllm")
    _, secret = inference_key()
    o = client(gateway_server, secret)

    for field, value in [
        ("previous_response_id", "resp_123"),
        ("store", True),
        ("background", True),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            o.responses.create(model="tiny", input="hi", **{field: value})
        assert err.value.param == field and f"'{field}'" in err.value.message
    # even where the engine (vLLM) would have taken them
    assert up.requests == []


def test_a_stream_cut_off_by_the_engine_ends_with_each_apis_error_event(gateway_server, upstreams):
    ready_model("tiny", [upstreams("a", mode="close_early")])
    _, secret = inference_key()

    # Anthropic's client raises the error event it reads
    with pytest.raises(anthropic.APIStatusError) as err:
        with claude(gateway_server, secret).messages.stream(
            model="tiny", max_tokens=8, messages=HI
        ) as s:
            list(s)
    assert err.value.body["error"]["type"] == "api_error"
    assert "closed the stream before it finished" in err.value.body["error"]["message"]

    # the Responses stream says it failed: an error event, then response.failed
    with client(gateway_server, secret).responses.stream(model="tiny", input="hi") as s:
        events = list(s)
    error, failed = events[-2:]
    assert error.type == "error" and "closed the stream" in error.message
    assert failed.type == "response.failed" and failed.response.status == "failed"


@pytest.fixture
def gateway_settings():
    return {
        **FAST_REFRESH,
        "LLMGW_GATEWAY_WAIT_COMMENT_S": "0.2",
        "LLMGW_GATEWAY_WAIT_TIMEOUT_S": "30",
    }


def scaled_to_zero(name: str, up) -> tuple[Model, EngineProfile]:
    model, _ = ready_model(name, [])
    Model.objects.filter(pk=model.pk).update(min_replicas=0, max_replicas=1, max_wait_s=30)
    return model, EngineProfile.objects.get(model=model)


def add_ready_replica(model, profile, up) -> None:
    node, _ = Node.objects.get_or_create(
        pk=f"gw-{model.name}-late", defaults={"mgmt_addr": "127.0.0.1", "connected": True}
    )
    replica = Replica.objects.create(model=model, profile=profile, state=ReplicaState.READY)
    Shard.objects.create(
        replica=replica,
        node=node,
        rank=0,
        port=up.port,
        state=ShardState.READY,
        desired_state=DesiredState.RUNNING,
    )


def test_a_streamed_request_waits_for_a_replica_and_then_streams(gateway_server, upstreams):
    # given a model scaled to zero: a request waits for a replica
    up = upstreams("a")
    model, profile = scaled_to_zero("tiny", up)
    _, secret = inference_key()
    got = {}

    def ask():
        with claude(gateway_server, secret).messages.stream(
            model="tiny", max_tokens=8, messages=HI
        ) as s:
            got["text"] = "".join(s.text_stream)
            got["final"] = s.get_final_message()

    # when a streamed Messages request waits, and a replica becomes ready meanwhile
    asker = threading.Thread(target=ask)
    asker.start()
    wait_until(
        lambda: (
            b'llmgw_gateway_waiting_requests{model="tiny"} 1.0'
            in urllib.request.urlopen(gateway_server.url + "/metrics").read()
        ),
        what="the request to wait",
    )
    time.sleep(0.5)  # long enough for its 200 and a comment or two
    add_ready_replica(model, profile, up)
    asker.join(30)

    # then it is answered from the new replica, its stream whole after the wait's comments
    assert got["text"] == "Hello, fleet!" and got["final"].stop_reason == "end_turn"
    assert up.paths == ["/v1/chat/completions"]


def test_a_streamed_wait_that_ends_unserved_ends_with_each_apis_error_event(
    gateway_server, upstreams
):
    model, _ = scaled_to_zero("tiny", upstreams("a"))
    Model.objects.filter(pk=model.pk).update(max_wait_s=1)
    _, secret = inference_key()

    # Anthropic's: its 200 went out while it waited; the error event follows
    with pytest.raises(anthropic.APIStatusError) as err:
        with claude(gateway_server, secret).messages.stream(
            model="tiny", max_tokens=8, messages=HI
        ) as s:
            list(s)
    assert err.value.response.status_code == 200
    assert err.value.body["error"]["type"] == "overloaded_error"
    assert "waited 1 s" in err.value.body["error"]["message"]

    # the Responses API's: the response fails, saying why
    with client(gateway_server, secret).responses.stream(model="tiny", input="hi") as s:
        events = list(s)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert events[2].code == "no_ready_replica" and "waited 1 s" in events[2].message
