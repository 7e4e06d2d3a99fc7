"""One request cannot switch limits off for the others (issue 29): a check Redis does not
answer fails only its own request, closed unless the operator chose fail-open, and a
reply read late because the event loop was busy is still a reply. On a real Redis."""

import asyncio
import dataclasses
import logging
import time

import pytest
import uvloop

from fleet.devstack.redis import PrivateRedis
from fleet.gateway import resp
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
    busy = resp.Client(redis.url, timeout=5)
    unavailable = UNAVAILABLE._value.get()
    try:
        for _ in range(3):
            await lim.check(spent, now)
        # when Redis is busy for a moment and the other key's check gets no answer in time
        slow = asyncio.ensure_future(busy.call("EVAL", _BUSY, 0))
        await asyncio.sleep(0.05)
        with pytest.raises(GatewayError) as refused:
            await lim.check(other, now)
        await slow
        # then the spent key's next request is still checked, and refused
        with pytest.raises(GatewayError) as over:
            await lim.check(spent, now)
        counted = as_dict(await lim.check(other, now))
    finally:
        busy.close()
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
    async def go():
        client = resp.Client(redis.url, timeout=0.25)
        try:
            await client.call("PING")
            pending = asyncio.ensure_future(client.call("INCR", "busy-loop"))
            await asyncio.sleep(0)  # the command goes out
            time.sleep(0.5)  # the loop busy past the deadline; Redis answers meanwhile
            first = await pending
            second = await client.call("INCR", "busy-loop")  # the connection kept
            return first, second
        finally:
            client.close()

    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(go()) == (1, 2)
    finally:
        loop.close()


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
