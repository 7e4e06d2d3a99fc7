"""Per-key limits on a real Redis: windows, budgets at their boundaries (the clock passed
in), OpenAI's headers, and a Redis outage."""

import uuid
from datetime import UTC, datetime

import pytest

from fleet.gateway import answers
from fleet.gateway.errors import GatewayError
from fleet.gateway.keys import KeyEntry
from fleet.gateway.limit_answers import KeyLimits, reset_text
from fleet.gateway.ratelimit import UNCHECKED, Limiter

OPENAI_HEADERS = {
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
}


def entry(**limits) -> KeyEntry:
    return KeyEntry(
        7, "team-a", "abcd1234", "inference", frozenset(), None, False, KeyLimits(**limits)
    )


def limiter(url=None, retry_s=2.0) -> Limiter:
    # A prefix of its own: tests never see each other's counters.
    return Limiter(url=url, prefix=f"test-{uuid.uuid4().hex[:8]}", retry_s=retry_s)


def at(*parts) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()


def as_dict(headers) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in headers}


@pytest.mark.parametrize(
    "seconds, text", [(0.012, "12ms"), (1, "1s"), (59.2, "1m0s"), (360, "6m0s"), (7380, "2h3m0s")]
)
def test_reset_times_are_written_as_openai_writes_them(seconds, text):
    assert reset_text(seconds) == text


async def test_requests_per_minute_are_counted_and_refused_with_openai_s_headers():
    lim = limiter()
    key = entry(requests_per_minute=3, tokens_per_minute=100)
    now = at(2026, 5, 4, 12, 30, 50)
    try:
        remaining = [
            as_dict(await lim.check(key, now))["x-ratelimit-remaining-requests"] for _ in range(3)
        ]
        with pytest.raises(GatewayError) as refused:
            await lim.check(key, now)
        after_the_minute = as_dict(await lim.check(key, now + 10))
    finally:
        await lim.close()
    assert remaining == ["2", "1", "0"]
    err = refused.value
    assert err.status == 429 and err.code == "rate_limit_exceeded"
    assert "3 requests per minute" in err.message
    headers = as_dict(err.headers())
    assert headers["retry-after"] == "10"
    assert set(headers) >= OPENAI_HEADERS
    assert headers["x-ratelimit-reset-requests"] == "10s"
    assert headers["x-ratelimit-limit-tokens"] == "100"
    assert after_the_minute["x-ratelimit-remaining-requests"] == "2"


async def test_a_day_budget_runs_out_and_comes_back_at_midnight_utc():
    lim = limiter()
    key = entry(tokens_per_day=1000)
    before = at(2026, 5, 4, 23, 59, 0)
    try:
        await lim.check(key, before)
        await lim.charge(key, 600, before)
        second = as_dict(await lim.check(key, before + 1))
        await lim.charge(key, 500, before + 1)  # reported after the answer: may go over
        with pytest.raises(GatewayError) as spent:
            await lim.check(key, before + 30)
        next_day = as_dict(await lim.check(key, at(2026, 5, 5, 0, 0, 0)))
    finally:
        await lim.close()
    assert second["x-ratelimit-remaining-tokens"] == "400"
    assert second["x-ratelimit-reset-tokens"] == "59s"
    assert spent.value.code == "insufficient_quota"
    assert spent.value.retry_after == 30
    assert "1000 tokens for today" in spent.value.message
    assert next_day["x-ratelimit-remaining-tokens"] == "1000"


async def test_a_month_budget_resets_on_the_first_even_across_a_year():
    lim = limiter()
    key = entry(tokens_per_month=50, tokens_per_minute=10_000)
    last_second = at(2026, 12, 31, 23, 59, 59)
    try:
        await lim.charge(key, 50, at(2026, 12, 2, 8, 0, 0))
        with pytest.raises(GatewayError) as spent:
            await lim.check(key, last_second)
        new_year = as_dict(await lim.check(key, at(2027, 1, 1, 0, 0, 0)))
    finally:
        await lim.close()
    assert spent.value.retry_after == 1
    assert "this month" in spent.value.message
    # The tightest token limit is the one the headers show.
    assert new_year["x-ratelimit-limit-tokens"] == "50"
    assert new_year["x-ratelimit-remaining-tokens"] == "50"


async def test_a_teams_month_budget_is_shared_by_its_keys_and_refuses_them_all():
    lim = limiter()
    team = {"team_id": 3, "team": "research", "team_tokens_per_month": 1000}
    ci = entry(**team)
    notebook = KeyEntry(
        8, "notebook", "efgh5678", "inference", frozenset(), None, False, KeyLimits(**team)
    )
    other = KeyEntry(  # another team's key: its own counter
        9, "vision-ci", "ijkl9012", "inference", frozenset(), None, False,
        KeyLimits(team_id=4, team="vision", team_tokens_per_month=1000),
    )  # fmt: skip
    now = at(2026, 12, 4, 10, 0, 0)
    try:
        await lim.check(ci, now)
        await lim.charge(ci, 600, now)
        shown = as_dict(await lim.check(notebook, now + 1))
        await lim.charge(notebook, 400, now + 1)
        refused = []
        for key in (ci, notebook):
            with pytest.raises(GatewayError) as spent:
                await lim.check(key, now + 2)
            refused.append(spent.value)
        others = as_dict(await lim.check(other, now + 2))
        next_month = as_dict(await lim.check(ci, at(2027, 1, 1, 0, 0, 0)))
    finally:
        await lim.close()
    # The headers count the team's budget, which notebook shares with ci.
    assert shown["x-ratelimit-limit-tokens"] == "1000"
    assert shown["x-ratelimit-remaining-tokens"] == "400"
    assert [e.status for e in refused] == [429, 429]
    assert refused[0].code == "insufficient_quota"
    assert refused[1].message.startswith(
        "team 'research' (of API key 'notebook' (efgh5678)) has used its budget of 1000 tokens "
        "for this month (UTC)"
    )
    assert others["x-ratelimit-remaining-tokens"] == "1000"
    assert next_month["x-ratelimit-remaining-tokens"] == "1000"


async def test_a_key_without_limits_never_asks_redis():
    lim = limiter(url="unix:///nonexistent/redis.sock")
    before = UNCHECKED._value.get()
    assert await lim.check(entry()) == []
    assert UNCHECKED._value.get() == before and lim._redis is None


def test_a_stream_that_did_not_ask_for_usage_gets_it_asked_for_and_taken_out():
    events = [
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n',
        b"\n",
        b"data: [DONE]\n\n",
    ]
    check = answers.SSECheck(strip_usage=True)
    out = b"".join(check.feed(e)[0] for e in events)
    assert out == events[0] + events[3]
    assert check.usage == {"prompt_tokens": 3, "completion_tokens": 1}
    kept = answers.SSECheck()
    assert b"".join(kept.feed(e)[0] for e in events) == b"".join(events)
