"""Limits and usage through real gateways sharing one Redis, with the openai client."""

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.factories import inference_key, ready_model
from tests.gateway.helpers import Upstream
from tests.gateway.live import client, wait_until
from tests.gateway.test_limits import OPENAI_HEADERS
from tests.processes import start_web

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

FAST = {
    "LLMGW_GATEWAY_KEYS_REFRESH_S": "0.5",
    "LLMGW_GATEWAY_REFRESH_S": "0.5",
    "LLMGW_GATEWAY_USAGE_FLUSH_S": "0.3",
}


@pytest.fixture
def upstream():
    up = Upstream("a")
    yield up
    up.stop()


def post(url, secret, body) -> tuple[int, dict, dict]:
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, lower(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, lower(exc.headers), json.loads(exc.read())


def lower(headers) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def test_two_gateways_on_one_redis_let_through_no_more_than_the_limit(
    transactional_db, tmp_path, upstream
):
    # given two gateway processes and a key allowed 6 requests a minute
    a = start_web(tmp_path, **FAST)
    b = start_web(tmp_path, **FAST)
    try:
        ready_model("tiny", [upstream])
        _, secret = inference_key("team-a", requests_per_minute=6)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}

        # when 30 requests arrive at both at once
        t0 = time.time()
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: post((a, b)[i % 2].url, secret, body), range(30)))
        minutes = int(time.time() // 60) - int(t0 // 60) + 1
    finally:
        a.stop()
        b.stop()

    # then together they let through at most the limit in each minute they spanned
    ok = [h for s, h, _ in answers if s == 200]
    refused = [(h, e) for s, h, e in answers if s == 429]
    assert len(ok) + len(refused) == 30
    assert 6 <= len(ok) <= 6 * minutes
    assert upstream.served == len(ok)
    # every answer carries OpenAI's headers; a refusal says why, and when to retry
    for headers in ok + [h for h, _ in refused]:
        assert {n for n in headers if n.startswith("x-ratelimit-")} == {
            n for n in OPENAI_HEADERS if n.endswith("-requests")
        }
        assert headers["x-ratelimit-limit-requests"] == "6"
    headers, err = refused[0]
    assert err["error"]["code"] == "rate_limit_exceeded"
    assert err["error"]["type"] == "rate_limit_error"
    assert 1 <= int(headers["retry-after"]) <= 60
    assert headers["x-ratelimit-remaining-requests"] == "0"


def test_a_stream_s_usage_is_counted_once_and_the_client_sees_what_it_asked_for(
    transactional_db, tmp_path, upstream
):
    from fleet.models import KeyUsage

    server = start_web(tmp_path, **FAST)
    try:
        ready_model("tiny", [upstream])
        key, secret = inference_key("team-a", tokens_per_minute=1000)
        c = client(server, secret)
        msgs = [{"role": "user", "content": "hi"}]

        # when a client streams without asking for usage
        plain = list(c.chat.completions.create(model="tiny", messages=msgs, stream=True))
        # and another asks for it, and a third does not stream
        asked = list(
            c.chat.completions.create(
                model="tiny", messages=msgs, stream=True, stream_options={"include_usage": True}
            )
        )
        whole = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs)

        # then the engine was asked for usage each time it streamed
        assert [r.get("stream_options") for r in upstream.requests] == [
            {"include_usage": True},
            {"include_usage": True},
            None,
        ]
        # the first client saw no usage event, the second its own
        assert all(ch.choices for ch in plain) and all(ch.usage is None for ch in plain)
        assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 4
        assert "".join(ch.choices[0].delta.content or "" for ch in plain) == "Hello, fleet!"
        # the tokens were charged: 3 answers of 7 tokens each
        remaining = whole.headers["x-ratelimit-remaining-tokens"]
        assert remaining == str(1000 - 14)  # the third's own tokens come after its headers

        # and the usage, written in a batch, counts each answer once
        def rows():
            r = list(
                KeyUsage.objects.filter(key=key).values(
                    "model", "requests", "prompt_tokens", "completion_tokens"
                )
            )
            return r if r and r[0]["requests"] == 3 else None

        usage = wait_until(rows, what="the usage flush")
    finally:
        server.stop()
    assert usage == [{"model": "tiny", "requests": 3, "prompt_tokens": 9, "completion_tokens": 12}]


def test_over_a_token_budget_the_openai_client_sees_a_rate_limit_error(
    transactional_db, tmp_path, upstream
):
    server = start_web(tmp_path, **FAST)
    try:
        ready_model("tiny", [upstream])
        _, secret = inference_key("small", tokens_per_day=10)
        c = client(server, secret)
        msgs = [{"role": "user", "content": "hi"}]
        c.chat.completions.create(model="tiny", messages=msgs)  # 7 tokens
        c.chat.completions.create(model="tiny", messages=msgs)  # 14: over, reported after
        with pytest.raises(openai.RateLimitError) as refused:
            c.chat.completions.create(model="tiny", messages=msgs)
    finally:
        server.stop()
    assert "budget of 10 tokens for today" in refused.value.message
    assert refused.value.code == "insufficient_quota"
    assert upstream.served == 2


def test_a_gateway_stopped_cleanly_writes_the_usage_it_had_not_flushed_yet(
    transactional_db, tmp_path, upstream
):
    from fleet.models import KeyUsage

    # given a gateway that would write usage only once a minute (written through
    # the ASGI lifespan's shutdown)
    env = {**FAST, "LLMGW_GATEWAY_USAGE_FLUSH_S": "60"}
    server = start_web(tmp_path, **env)
    try:
        ready_model("tiny", [upstream])
        key, secret = inference_key("team-a")
        c = client(server, secret)
        for _ in range(2):
            c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert not KeyUsage.objects.exists()
    finally:
        # when it is stopped (SIGTERM)
        server.stop()
    # then what it counted is in the database
    row = KeyUsage.objects.get(key=key)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (2, 6, 8)


def test_redis_away_keys_with_limits_get_503_others_are_served_and_counting_resumes(
    transactional_db, tmp_path, upstream
):
    from fleet.devstack.redis import PrivateRedis

    # given a gateway on a Redis of its own, a key allowed 100 requests a minute, and
    # a key without limits
    (tmp_path / "r").mkdir()
    redis = PrivateRedis(tmp_path / "r").start()
    server = start_web(tmp_path, REDIS_URL=redis.url, **FAST)
    try:
        ready_model("tiny", [upstream])
        _, secret = inference_key("team-a", requests_per_minute=100)
        _, free = inference_key("team-free")
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        before = post(server.url, secret, body)

        # when Redis goes away
        redis.stop()
        during = [post(server.url, secret, body) for _ in range(3)]
        unlimited = post(server.url, free, body)

        # and comes back
        redis.start()
        back = wait_until(
            lambda: (a := post(server.url, secret, body))[0] == 200 and a,
            what="limits checked again",
        )
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    finally:
        server.stop()
        redis.stop()

    assert before[0] == 200 and before[1]["x-ratelimit-remaining-requests"] == "99"
    # then each request of the key with limits is refused, saying why and when to retry
    assert [s for s, _, _ in during] == [503, 503, 503]
    _, headers, err = during[0]
    assert err["error"]["code"] == "limits_unavailable"
    assert err["error"]["type"] == "service_unavailable"
    assert headers["retry-after"] == "2"
    # the key without limits never needed Redis
    assert unlimited[0] == 200
    assert server.output().count("Redis did not answer") == 1
    assert "Redis answers again" in server.output()
    refused = [
        line
        for line in metrics.splitlines()
        if line.startswith("llmgw_gateway_limits_unavailable_total")
    ]
    assert refused and float(refused[0].split()[-1]) >= 3
    # and counting resumed (a fresh Redis: the minute starts over)
    assert int(back[1]["x-ratelimit-remaining-requests"]) < 100
