"""One request cannot switch limits off for the others (issue 29): a check Redis does not
answer fails only its own request, closed unless the operator chose fail-open, and a
reply read late because the event loop was busy is still a reply. On a real Redis."""

import asyncio
import dataclasses
import json
import logging
import time

import pytest
import uvloop
from redis import asyncio as aioredis

from fleet.devstack.redis import PrivateRedis
from fleet.gateway.errors import GatewayError
from fleet.gateway.ratelimit import UNAVAILABLE, UNCHECKED
from tests.gateway.test_limits import as_dict, at, entry, limiter

# Keeps Redis busy (a script runs alone) for about 600 ms: a Redis that is slow.
_BUSY = """
local t0 = redis.call('TIME')
while true do
  local t = redis.call('TIME')
  if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 600000 then return 0 end
end
"""


@pytest.fixture
def redis(tmp_path):
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


async def test_a_check_redis_does_not_answer_fails_only_its_own_request(redis):
    # given a key that has used its 3 requests this minute, and another key
    lim = limiter(url=redis.url)
    spent, other = entry(requests_per_minute=3), entry(requests_per_minute=100)
    other = dataclasses.replace(other, id=8, name="team-b")
    now = at(2026, 5, 4, 12, 0, 1)
    busy = aioredis.from_url(redis.url)
    unavailable = UNAVAILABLE._value.get()
    try:
        for _ in range(3):
            await lim.check(spent, now)
        # when Redis is busy for a moment and the other key's check gets no answer in time
        slow = asyncio.ensure_future(busy.eval(_BUSY, 0))
        await asyncio.sleep(0.05)
        with pytest.raises(GatewayError) as refused:
            await lim.check(other, now)
        await slow
        # then the spent key's next request is still checked, and refused
        with pytest.raises(GatewayError) as over:
            await lim.check(spent, now)
        counted = as_dict(await lim.check(other, now))
    finally:
        await busy.aclose()
        await lim.close()
    err = refused.value
    assert err.status == 503 and err.code == "limits_unavailable"
    assert err.retry_after == 2
    assert "could not be checked" in err.message and "team-b" in err.message
    assert as_dict(err.headers())["retry-after"] == "2"
    assert UNAVAILABLE._value.get() - unavailable == 1
    assert over.value.status == 429 and "3 requests per minute" in over.value.message
    # Redis ran the late check when it could: the refused request counted, the safe side.
    assert counted["x-ratelimit-remaining-requests"] == "98"


async def test_redis_away_each_request_of_a_key_with_limits_gets_a_503_logged_once(redis, caplog):
    lim = limiter(url=redis.url)
    key = entry(requests_per_minute=5)
    now = at(2026, 5, 4, 12, 0, 1)
    try:
        first = as_dict(await lim.check(key, now))
        redis.stop()
        with caplog.at_level(logging.WARNING, logger="fleet.gateway.ratelimit"):
            statuses = []
            for _ in range(8):  # over the limit of 5: none may pass unchecked
                try:
                    await lim.check(key, now)
                    statuses.append(200)
                except GatewayError as exc:
                    statuses.append(exc.status)
            # a key without limits never asks Redis: it is served
            assert await lim.check(entry(), now) == []
            redis.start()
            again = [as_dict(await lim.check(key, now)) for _ in range(2)]
    finally:
        await lim.close()
    assert first["x-ratelimit-remaining-requests"] == "4"
    assert statuses == [503] * 8
    assert len([r for r in caplog.records if "did not answer" in r.message]) == 1
    assert "refused with 503" in caplog.text
    assert any("answers again" in r.message for r in caplog.records)
    # The restarted Redis kept nothing: counting starts over at once, no pause.
    assert [h["x-ratelimit-remaining-requests"] for h in again] == ["4", "3"]


async def test_failing_open_is_the_operator_s_choice_and_lets_each_request_through_counted(
    redis,
):
    lim = limiter(url=redis.url)
    lim.fail_open = True
    key = entry(requests_per_minute=5)
    now = at(2026, 5, 4, 12, 0, 1)
    unchecked = UNCHECKED._value.get()
    try:
        await lim.check(key, now)
        redis.stop()
        during = [await lim.check(key, now) for _ in range(8)]
        redis.start()
        again = as_dict(await lim.check(key, now))
    finally:
        await lim.close()
    assert during == [[]] * 8
    assert UNCHECKED._value.get() - unchecked == 8
    assert again["x-ratelimit-remaining-requests"] == "4"


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_reply_that_came_while_the_loop_was_busy_is_a_reply_not_a_timeout(redis, loop_kind):
    # given a key allowed 100 requests a minute, checked once already
    key = entry(requests_per_minute=100)
    now = at(2026, 5, 4, 12, 0, 1)

    async def go():
        lim = limiter(url=redis.url)
        try:
            await lim.check(key, now)
            # when the event loop is busy elsewhere (a large body parsed, say) for twice
            # the check's deadline while the check is under way
            pending = asyncio.ensure_future(lim.check(key, now))
            await asyncio.sleep(0)
            time.sleep(2 * lim.timeout)
            late = as_dict(await pending)
            after = as_dict(await lim.check(key, now))
            return late, after
        finally:
            await lim.close()

    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        late, after = loop.run_until_complete(go())
    finally:
        loop.close()
    # then Redis, which was not slow, answered it: counted, not refused with a 503
    assert late["x-ratelimit-remaining-requests"] == "98"
    assert after["x-ratelimit-remaining-requests"] == "97"


@pytest.mark.parametrize(
    "text, value", [("false", False), ("0", False), ("off", False), ("TRUE", True), ("yes", True)]
)
def test_failing_open_is_a_yes_or_no_setting(text, value):
    from fleet.conf import from_environ

    assert (
        from_environ({"LLMGW_GATEWAY_LIMITS_FAIL_OPEN": text})["GATEWAY_LIMITS_FAIL_OPEN"] is value
    )
    assert from_environ({})["GATEWAY_LIMITS_FAIL_OPEN"] is False


def test_a_fail_open_setting_that_is_not_yes_or_no_is_refused_naming_it():
    from fleet.conf import from_environ

    with pytest.raises(ValueError, match="LLMGW_GATEWAY_LIMITS_FAIL_OPEN='maybe'.*true or false"):
        from_environ({"LLMGW_GATEWAY_LIMITS_FAIL_OPEN": "maybe"})


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_a_large_body_does_not_let_another_key_past_its_limit(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from tests.factories import inference_key, ready_model
    from tests.gateway.helpers import Upstream
    from tests.gateway.test_limits_live import FAST, post
    from tests.processes import start_web

    # given a gateway as `make run` serves it, a key allowed 5 requests a minute, and
    # another key's bodies of 15 MiB: one that is only brackets (5 million arrays, which
    # took the event loop a second to parse), one that is a long prompt
    up = Upstream("a")
    server = start_web(tmp_path, **FAST)
    msgs = [{"role": "user", "content": "hi"}]
    brackets = {"model": "tiny", "messages": msgs, "x": [[]] * 5_000_000}
    brackets = json.dumps(brackets, separators=(",", ":")).encode()
    long = [{"role": "user", "content": "word " * 3_000_000}]
    prompt = json.dumps({"model": "tiny", "messages": long}).encode()
    try:
        ready_model("tiny", [up])
        _, limited = inference_key("limited", requests_per_minute=5)
        _, big = inference_key("big-bodies")
        t0 = time.time()
        results = []

        def hammer():
            while not done:
                results.append(post(server.url, limited, {"model": "tiny", "messages": msgs}))

        # when the limited key asks again and again while the large bodies arrive
        done = False
        bodies = [brackets, prompt, brackets, brackets, brackets, brackets]
        with ThreadPoolExecutor(6) as pool:
            hammers = [pool.submit(hammer) for _ in range(6)]
            try:
                answers = [_post_raw(server.url, big, b) for b in bodies]
            finally:
                done = True
            for h in hammers:
                h.result()
        minutes = int(time.time() // 60) - int(t0 // 60) + 1
    finally:
        server.stop()
        up.stop()

    # then the limited key got no more than its limit in each minute, the rest refused
    statuses = [s for s, _, _ in results]
    assert statuses.count(200) <= 5 * minutes
    assert set(statuses) <= {200, 429}
    # and the large bodies were answered: the brackets refused naming why, the prompt served
    assert [s for s, _ in answers] == [400, 200, 400, 400, 400, 400]
    assert "more than 100000 arrays and objects" in answers[0][1]


def _post_raw(url: str, secret: str, body: bytes) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_body_with_more_arrays_and_objects_than_any_request_is_refused_naming_the_bound():
    from fleet.gateway import validate

    many = b'{"model": "m", "messages": [{"role": "user"}], "x": [' + b"[]," * 100_000 + b"[]]}"
    with pytest.raises(GatewayError) as err:
        validate.parse("chat/completions", many)
    assert err.value.status == 400
    assert "more than 100000 arrays and objects" in err.value.message


def test_brackets_inside_strings_are_text_not_arrays():
    from fleet.gateway import validate

    # Code with brackets, escaped quotes and backslashes: one message, a few objects.
    code = 'x = [{"a": [1]}] \\ "q" \\\\' * 40_000
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": code}]}).encode()
    assert raw.count(b"[") + raw.count(b"{") > validate.MAX_CONTAINERS
    req = validate.parse("chat/completions", raw)
    assert req.body["messages"][0]["content"] == code


async def test_a_large_body_reads_as_a_small_one_does():
    from fleet.gateway import validate

    body = {
        "model": "m",
        "prompt": [[7, 8.5, -1]] * 30_000,
        "logit_bias": {"12": -100},
        "stream": False,
    }
    raw = json.dumps(body).encode()
    assert not validate.on_loop(raw)
    assert (await validate.read("completions", raw)).body == body
    with pytest.raises(GatewayError, match="not valid JSON"):
        await validate.read("completions", raw[:-1])
