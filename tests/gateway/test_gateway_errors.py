"""What a client sees when something is wrong: its request, its key, the model, or the engine."""

import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from tests.factories import inference_key, ready_model

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def gateway_settings():
    # Small limits to test 413, 429 and 504 cheaply; refreshes a minute apart,
    # so anything seen sooner came through the doorbell.
    return {
        "LLMGW_GATEWAY_MAX_BODY_BYTES": "4096",
        "LLMGW_GATEWAY_MAX_OUTSTANDING_PER_REPLICA": "2",
        "LLMGW_GATEWAY_FIRST_BYTE_TIMEOUT_S": "2",
        "LLMGW_GATEWAY_REFRESH_S": "60",
        "LLMGW_GATEWAY_KEYS_REFRESH_S": "60",
    }


def post(server, path, body, secret=None, raw=False, method="POST"):
    data = body if raw else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    req = urllib.request.Request(server.url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def assert_openai_error(body, status_type, *, contains, param=None):
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == status_type
    assert contains in err["message"], err["message"]
    if param is not None:
        assert err["param"] == param


def test_bad_requests_get_a_clear_4xx_in_openais_shape(gateway_server, upstreams):
    ready_model("tiny", [upstreams()])
    ready_model("secret-model", [upstreams()])
    _, secret = inference_key(allowed_models=["tiny"])
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    types = {400: "invalid_request_error", 403: "permission_error", 413: "invalid_request_error"}
    # (body: bytes as sent, or an object to send as JSON; status; message fragment; param)
    cases = [
        (b"{not json", 400, "not valid JSON", None),
        (b"", 400, "body is empty", None),
        (b" \r\n\t", 400, "body is empty", None),
        (b"[1, 2]", 400, "must be a JSON object, not an array", None),
        ({"messages": msgs}, 400, "'model' is required", "model"),
        ({"model": 7, "messages": msgs}, 400, "'model' must be a string, not a number", "model"),
        ({"model": "tiny", "messages": "hi"}, 400, "'messages' must be an array", "messages"),
        (
            {"model": "tiny", "messages": msgs, "max_tokens": "ten"},
            400,
            "'max_tokens' must be an integer, not a string",
            "max_tokens",
        ),
        (
            {"model": "tiny", "messages": msgs, "stream": "yes"},
            400,
            "'stream' must be a boolean",
            "stream",
        ),
        (
            {"model": "tiny", "messages": [{"content": "x"}]},
            400,
            "'messages[0]' must be an object with a string 'role'",
            "messages[0]",
        ),
        ({"model": "tiny", "messages": msgs, "pad": "x" * 5000}, 413, "the limit is 4096", None),
        ({"model": "nope", "messages": msgs}, 403, "may not use model 'nope'", "model"),
        ({"model": "secret-model", "messages": msgs}, 403, "may not use model 'secret-", "model"),
    ]
    for body, status, fragment, param in cases:
        got, _, answer = post(gateway_server, chat, body, secret, raw=isinstance(body, bytes))
        assert got == status, (body, answer)
        assert_openai_error(answer, types[status], contains=fragment, param=param)
    # the wrong endpoint's fields, a wrong method, an unknown path
    got, _, answer = post(gateway_server, "/v1/embeddings", {"model": "tiny"}, secret)
    assert got == 400 and "'input' is required" in answer["error"]["message"]
    got, _, answer = post(gateway_server, chat, None, secret, raw=True, method="GET")
    assert got == 405 and "takes POST" in answer["error"]["message"]
    got, _, answer = post(gateway_server, "/v1/images/generations", {}, secret)
    assert got == 404 and "unknown path /v1/images/generations" in answer["error"]["message"]


def test_a_model_nobody_has_is_404_and_keys_are_checked(gateway_server, upstreams):
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import ApiKey

    ready_model("tiny", [upstreams()])
    _, ok = inference_key()
    _, expired = inference_key("old", expires_at=timezone.now() - timedelta(minutes=1))
    _, manage = ApiKey.issue(name="ops", scope="manage")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}

    got, _, answer = post(gateway_server, "/v1/chat/completions", {**body, "model": "nope"}, ok)
    assert got == 404
    assert_openai_error(answer, "not_found_error", contains="model 'nope' does not exist")
    got, headers, answer = post(gateway_server, "/v1/chat/completions", body)
    assert got == 401 and headers["www-authenticate"] == "Bearer"
    assert_openai_error(answer, "authentication_error", contains="no API key")
    got, _, answer = post(gateway_server, "/v1/chat/completions", body, "lgk_00000000_madeup")
    assert got == 401 and "invalid API key" in answer["error"]["message"]
    got, _, answer = post(gateway_server, "/v1/chat/completions", body, expired)
    assert got == 401 and "API key 'old'" in answer["error"]["message"]
    assert "expired" in answer["error"]["message"]
    got, _, answer = post(gateway_server, "/v1/chat/completions", body, manage)
    assert got == 403 and "needs an inference key" in answer["error"]["message"]
    # A key made after the gateway loaded its cache works at once.
    _, fresh = inference_key("new")
    assert post(gateway_server, "/v1/chat/completions", body, fresh)[0] == 200


def test_no_ready_replica_is_503_with_the_reason_until_a_shard_reports_ready(
    gateway_server, upstreams
):
    from agentd import protocol
    from fleet.models import Replica, ReplicaState, Shard, ShardState
    from fleet.services import inventory

    # given a model with one replica loading and one that cannot be placed
    up = upstreams()
    model, (replica,) = ready_model("qwen", [up])
    shard = Shard.objects.get(replica=replica)
    Shard.objects.filter(pk=shard.pk).update(state=ShardState.LOADING)
    Replica.objects.create(
        model=model,
        profile=replica.profile,
        state=ReplicaState.PENDING,
        reason="gpu-07: has 8 GB of memory, needs 24",
    )
    _, secret = inference_key()
    c = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=secret, max_retries=0)

    # then the client hears which and why, and when to come back
    with pytest.raises(openai.InternalServerError) as err:
        c.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 503
    assert err.value.body["message"] == (
        "model 'qwen' has no ready replica: 1 loading; 1 pending: gpu-07: has 8 GB of memory, "
        "needs 24"
    )
    assert err.value.response.headers["retry-after"] == "5"

    # when the agent reports the shard ready, the gateway hears of it at once
    msg = protocol.ShardStatus(type="shard_status", v=1, shard_id=shard.pk, state="ready")
    assert inventory.apply_shard_status(shard.node_id, msg)
    deadline = time.monotonic() + 10
    while True:
        try:
            c.chat.completions.create(model="qwen", messages=[{"role": "user", "content": "x"}])
            break
        except openai.InternalServerError:
            assert time.monotonic() < deadline, "the gateway never heard the shard was ready"
            time.sleep(0.05)
    assert up.served == 1


def test_an_engine_that_breaks_mid_stream_gives_a_clean_error_event(gateway_server, upstreams):
    _, secret = inference_key()
    c = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key=secret, max_retries=0)
    for mode in ("garbage", "close_early"):
        ready_model(mode.replace("_", "-"), [upstreams(mode=mode)])
    for mode, fragment in (
        ("garbage", "a line that is not server-sent events"),
        ("close_early", "closed the stream before it finished"),
    ):
        stream = c.chat.completions.create(
            model=mode.replace("_", "-"), messages=[{"role": "user", "content": "x"}], stream=True
        )
        got = []
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                got.append(chunk.choices[0].delta.content)
        # what came before the fault arrived intact; then one error the client can read
        assert got == ["Hello", ","]
        assert fragment in err.value.message


def test_an_engine_that_answers_503_is_retried_on_another_replica(gateway_server, upstreams):
    bad, good = upstreams(mode="status503"), upstreams()
    ready_model("tiny", [bad, good])
    _, secret = inference_key()
    # Between two idle replicas the gateway picks at random, so six requests missed
    # the bad one once in 64 runs: ask until it has been tried (2**-40 that it never is).
    sent = 0
    while not bad.requests and sent < 40:
        got, _, answer = post(
            gateway_server,
            "/v1/chat/completions",
            {"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
            secret,
        )
        assert got == 200, answer
        sent += 1
    assert bad.requests, f"{sent} requests and the replica answering 503 was never tried"
    # then every request was answered, the ones the bad replica refused by the good one
    assert good.served == sent


def test_a_full_replica_is_429_and_a_silent_engine_504(gateway_server, upstreams):
    from concurrent.futures import ThreadPoolExecutor

    # given the only replica holding its limit of two requests, never answering
    up = upstreams(mode="hang")
    ready_model("tiny", [up])
    _, secret = inference_key()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    with ThreadPoolExecutor(2) as pool:
        held = [
            pool.submit(post, gateway_server, "/v1/chat/completions", body, secret)
            for _ in range(2)
        ]
        deadline = time.monotonic() + 10
        while up.in_flight < 2:
            assert time.monotonic() < deadline, "the two requests never reached the engine"
            time.sleep(0.02)

        # then a third is turned away at once, and told when to come back
        got, headers, answer = post(gateway_server, "/v1/chat/completions", body, secret)
        assert got == 429 and headers["retry-after"] == "1"
        assert_openai_error(answer, "rate_limit_error", contains="model 'tiny' is at capacity")

        # and the two held ones end after the first-byte timeout, with the engine told
        for f in held:
            got, _, answer = f.result(timeout=30)
            assert got == 504
            assert "sent no answer within 2 s" in answer["error"]["message"]
    deadline = time.monotonic() + 10
    while up.in_flight:
        assert time.monotonic() < deadline, "the engine still holds the timed-out requests"
        time.sleep(0.05)
    assert up.cancelled == 2


def chat_replica(server, secret) -> tuple[int, str]:
    """One chat completion: its status, and the replica that answered (or the error)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    got, headers, answer = post(server, "/v1/chat/completions", body, secret)
    return got, headers.get("x-llmgw-replica") or answer["error"]["message"]


def test_a_replica_that_timed_out_is_set_aside_for_the_cooldown(gateway_server, upstreams):
    # given: two replicas, one of them accepting requests and never answering
    silent, good = upstreams(mode="hang"), upstreams()
    _, (rs, rg) = ready_model("tiny", [silent, good])
    _, secret = inference_key()

    # when: a request lands on the silent one and times out (2 s here)
    for _ in range(20):
        got, by = chat_replica(gateway_server, secret)
        if got == 504:
            break
        assert (got, by) == (200, rg.pk)
    assert got == 504 and f"replica {rs.pk} of model 'tiny' sent no answer within 2 s" in by

    # then: for the cooldown (5 s) every request goes to the other, though the
    # silent one has nothing outstanding any more (answers sent later may go either way)
    timed_out = time.monotonic()
    answered = [
        (time.monotonic() - timed_out, chat_replica(gateway_server, secret)) for _ in range(10)
    ]
    within = [answer for sent, answer in answered if sent < 5]
    assert within and within == [(200, rg.pk)] * len(within), answered
    metrics = urllib.request.urlopen(gateway_server.url + "/metrics").read().decode()
    assert f'llmgw_gateway_cooldowns_total{{model="tiny",replica="{rs.pk}"}} 1.0' in metrics


def test_a_node_turning_suspect_makes_its_replicas_a_last_resort_at_once(gateway_server, upstreams):
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import FleetStatus, Node, Shard
    from fleet.services.reconciler.passes import run_pass

    # given: two replicas in use, on two nodes the reconciler has been hearing from
    a, b = upstreams(), upstreams()
    _, (ra, rb) = ready_model("tiny", [a, b])
    _, secret = inference_key()
    assert {chat_replica(gateway_server, secret) for _ in range(12)} == {(200, ra.pk), (200, rb.pk)}
    now = timezone.now()
    FleetStatus.objects.create(pk=1, last_pass_at=now - timedelta(seconds=1))
    silent = Shard.objects.get(replica=ra).node_id
    Node.objects.filter(pk=silent).update(last_seen=now - timedelta(seconds=55))
    Node.objects.exclude(pk=silent).update(last_seen=now)

    # when: a reconciler pass finds a's node silent past the grace period
    run_pass(now)
    assert Node.objects.get(pk=silent).state == "suspect"

    # then: the gateway hears of it through its doorbell (its refresh is a minute
    # off) and sends every request to b, a only once b cannot take them
    def ten_to_b() -> bool:
        return all(chat_replica(gateway_server, secret) == (200, rb.pk) for _ in range(10))

    deadline = time.monotonic() + 10
    while not ten_to_b():
        assert time.monotonic() < deadline, "requests still go to the suspect node's replica"
    b.stop()
    assert chat_replica(gateway_server, secret) == (200, ra.pk)
