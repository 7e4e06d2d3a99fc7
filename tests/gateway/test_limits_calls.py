"""Per-key limits at many requests a second (issue 53): the checks of one turn of the event
loop share one Redis call, tokens ride on the next call, and a key far from its limits
is served from a lease counted in Redis ahead. None of it lets two gateway processes
together past a limit. On a real Redis, through the limiter's public methods."""

import asyncio
import dataclasses

import pytest

from fleet.gateway import ratelimit
from fleet.gateway.errors import GatewayError
from fleet.gateway.keys import KeyEntry
from fleet.gateway.limit_answers import KeyLimits
from fleet.gateway.limit_leases import LEASE_REQUESTS, LEASE_S, Lease
from tests.gateway.test_limits import as_dict, at, entry, limiter


def calls_of(lim) -> list[int]:
    """Counts the script calls ``lim`` makes (the checks in each)."""
    seen: list[int] = []
    real = lim._client

    def counting():
        script = real()

        async def call(keys, args):
            seen.append((len(keys) - args[0]) // 5)
            return await script(keys=keys, args=args)

        return call

    lim._client = counting
    return seen


async def test_the_checks_of_one_turn_share_one_call_each_with_its_own_answer():
    # given a key allowed 3 requests a minute, and another key
    lim = limiter()
    calls = calls_of(lim)
    small, other = entry(requests_per_minute=3), entry(requests_per_minute=100)
    other = dataclasses.replace(other, id=8, name="team-b")
    now = at(2026, 5, 4, 12, 0, 1)
    try:
        # when five of the one and one of the other are checked at once
        results = await asyncio.gather(
            *(lim.check(small, now) for _ in range(5)),
            lim.check(other, now),
            return_exceptions=True,
        )
    finally:
        await lim.close()
    # then Redis was asked once, and counted them in order
    assert calls == [6]
    passed = [
        as_dict(r)["x-ratelimit-remaining-requests"] for r in results[:5] if isinstance(r, list)
    ]
    refused = [r for r in results[:5] if isinstance(r, GatewayError)]
    assert passed == ["2", "1", "0"]
    assert [r.status for r in refused] == [429, 429]
    assert as_dict(results[5])["x-ratelimit-remaining-requests"] == "99"


async def test_tokens_ride_on_the_next_call_or_reach_redis_within_the_delay_alone():
    lim = limiter()
    calls = calls_of(lim)
    key = entry(tokens_per_day=1000)
    now = at(2026, 5, 4, 12, 0, 1)
    try:
        await lim.check(key, now)
        # when an answer's tokens are charged and the next check follows at once
        await lim.charge(key, 300, now)
        lim.leases.clear()  # this check asks Redis
        shown = as_dict(await lim.check(key, now + 1))
        # and tokens charged with no check after them
        await lim.charge(key, 200, now + 2)
        await asyncio.sleep(lim.charge_delay_s + 0.1)
        lim.leases.clear()
        later = as_dict(await lim.check(key, now + 3))
    finally:
        await lim.close()
    # then the check read them in the same call that charged them
    assert shown["x-ratelimit-remaining-tokens"] == "700"
    assert later["x-ratelimit-remaining-tokens"] == "500"
    # one call a check, and one for the tokens that had no check to ride on
    assert calls == [1, 1, 0, 1]


async def test_a_key_far_from_its_limits_is_served_from_its_lease_without_a_round_trip():
    lim = limiter()
    calls = calls_of(lim)
    key = entry(requests_per_minute=100_000, tokens_per_minute=10**9)
    now = at(2026, 5, 4, 12, 0, 1)
    try:
        headers = [as_dict(await lim.check(key, now)) for _ in range(5)]
        # the keys loaded again (every few seconds): equal limits, another object
        key = dataclasses.replace(key, limits=dataclasses.replace(key.limits))
        headers += [as_dict(await lim.check(key, now)) for _ in range(5)]
        await asyncio.sleep(0)  # a renewal, where one was asked for, is under way
    finally:
        await lim.close()
    # then the first check asked Redis, and the rest came from its lease (renewed at
    # most once, where the machine was slow)
    assert calls[0] == 1 and len(calls) <= 2
    assert [h["x-ratelimit-remaining-requests"] for h in headers] == [
        str(100_000 - n) for n in range(1, 11)
    ]


async def test_near_a_limit_no_lease_is_granted_and_every_request_asks_redis():
    lim = limiter()
    calls = calls_of(lim)
    key = entry(requests_per_minute=16 * LEASE_REQUESTS, tokens_per_day=1000)
    now = at(2026, 5, 4, 12, 0, 1)
    try:
        for _ in range(3):
            await lim.check(key, now)
        spent = entry(tokens_per_day=1000)
        spent = dataclasses.replace(spent, id=9)
        await lim.charge(spent, 950, now)
        for _ in range(3):
            await lim.check(spent, now)
    finally:
        await lim.close()
    # under 16 leases' worth of requests left, or past 90 % of a token limit: asked each time
    assert calls == [1, 1, 1, 1, 1, 1]
    assert [lease.left for lease in lim.leases.values()] == [0, 0]  # counters only


@pytest.mark.parametrize("limit", [1000, 3 * LEASE_REQUESTS * 16 + 7])
async def test_two_processes_with_leases_let_through_no_more_than_the_limit(limit):
    # given two gateway processes' limiters on one Redis, and a key allowed `limit` a minute
    a = limiter()
    b = ratelimit.Limiter(url=a.url, prefix=a.prefix.removesuffix(":limits"))
    key = entry(requests_per_minute=limit)
    now = at(2026, 5, 4, 12, 0, 1)
    passed = 0
    try:
        # when both send well past the limit, in turns and at once
        for _ in range(limit // 4 + 40):
            results = await asyncio.gather(
                *(lim.check(key, now) for lim in (a, b, a, b)), return_exceptions=True
            )
            passed += sum(1 for r in results if isinstance(r, list))
    finally:
        await a.close()
        await b.close()
    # then no more than the limit passed between them, and the leases wasted little
    assert limit - 2 * LEASE_REQUESTS <= passed <= limit


async def test_another_process_s_tokens_reach_a_lease_within_its_age():
    # given a team's budget shared by two keys, served by two processes
    a = limiter()
    b = ratelimit.Limiter(url=a.url, prefix=a.prefix.removesuffix(":limits"))
    team = {"team_id": 3, "team": "research", "team_tokens_per_month": 10_000}
    ci = entry(**team)
    notebook = KeyEntry(
        8, "notebook", "efgh5678", "inference", frozenset(), None, False, KeyLimits(**team)
    )
    now = at(2026, 12, 4, 10, 0, 0)
    try:
        await a.check(ci, now)
        assert a.leases  # far from the budget: a lease
        # when the other process's key spends the budget
        await b.check(notebook, now)
        await b.charge(notebook, 10_000, now)
        await asyncio.sleep(b.charge_delay_s + LEASE_S + 0.1)
        # then the first process refuses, once its lease is older than LEASE_S
        with pytest.raises(GatewayError) as spent:
            await a.check(ci, now + 1)
    finally:
        await a.close()
        await b.close()
    assert spent.value.status == 429 and "team 'research'" in spent.value.message


def tokens_calls_slowed(lim, delay: float) -> list[str]:
    """Holds back ``lim``'s calls that carry only tokens before they reach Redis, as a
    busy event loop or a connection still opening would; what those calls did, in order."""
    real = lim._client
    seen: list[str] = []

    def slowed():
        script = real()

        async def call(keys, args):
            if len(keys) != args[0]:  # a check in it
                return await script(keys=keys, args=args)
            seen.append("tokens sent")
            await asyncio.sleep(delay)
            got = await script(keys=keys, args=args)
            seen.append("tokens counted")
            return got

        return call

    lim._client = slowed
    return seen


@pytest.mark.parametrize("requests_per_minute", [0, 100], ids=["leased", "no lease"])
async def test_a_check_is_never_decided_without_tokens_sent_ahead_of_it(requests_per_minute):
    # given a key with a day budget of 10 tokens (and, for no lease, a request limit too
    # near to lease from), two answers of 7 tokens charged, and the second's tokens on
    # their way to Redis in a call of their own, held back
    lim = limiter()
    tokens_calls = tokens_calls_slowed(lim, 0.2)
    key = entry(tokens_per_day=10, requests_per_minute=requests_per_minute)
    now = at(2026, 5, 4, 12, 0, 1)
    try:
        await lim.check(key, now)
        await lim.charge(key, 7, now)
        await lim.check(key, now)
        await lim.charge(key, 7, now)
        await asyncio.sleep(lim.charge_delay_s + 0.05)
        assert tokens_calls == ["tokens sent"]
        # when the next request is checked, its answer from Redis read first
        with pytest.raises(GatewayError) as spent:
            await lim.check(key, now + 0.1)
        assert tokens_calls == ["tokens sent"]
    finally:
        await lim.close()
    # then it is refused: the budget is spent, whichever call reached Redis first
    assert spent.value.status == 429
    assert "budget of 10 tokens for today" in spent.value.message
    assert as_dict(spent.value.extra_headers)["x-ratelimit-remaining-tokens"] == "0"
    assert tokens_calls == ["tokens sent", "tokens counted"]


def test_an_answer_read_before_the_lease_s_own_tokens_never_lowers_its_count():
    # given a lease of a key with a day budget of 10 tokens, told 0 by Redis
    limits = KeyLimits(tokens_per_day=10)
    lease = Lease(limits, "m1")
    lease.told([0, 1, 0, 0, 0, 0, LEASE_REQUESTS], at=0.0)
    assert lease.take(limits, "m1", 0.001)
    # when 14 tokens are charged here, and a renewal's answer read before they reached
    # Redis says 7
    lease.td += 14
    lease.told([0, 2, 7, 7, 7, 0, 0], at=0.002)
    # then the lease still counts 14, and lets nothing more through
    assert lease.td == 14
    assert not lease.take(limits, "m1", 0.003)
