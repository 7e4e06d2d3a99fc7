"""How many agents a web process takes through registration at once, and when it tells
the rest to come back (fleet.services.admission)."""

import random

import pytest

from fleet.services.admission import RETRY_AFTER_MAX_S, START_RATE_PER_S, Admission


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_past_the_limit_the_next_agent_is_turned_away_until_one_is_through():
    gate = Admission(limit=2, clock=Clock())
    assert gate.enter() and gate.enter()
    assert not gate.enter()
    assert gate.pending == 2  # the one turned away is not counted as taken
    gate.leave(registered=True)
    assert gate.enter()
    assert gate.pending == 2


def test_a_limit_of_zero_takes_everyone():
    gate = Admission(limit=0, clock=Clock())
    assert all(gate.enter() for _ in range(10_000))
    assert gate.pending == 10_000


def test_the_pace_is_the_registrations_of_the_last_five_seconds():
    clock = Clock()
    gate = Admission(limit=500, clock=clock)
    # just started: the assumed pace, whatever little has finished
    assert gate.rate() == START_RATE_PER_S
    clock.now += 6
    for _ in range(300):
        gate.enter()
        gate.leave(registered=True)
    assert gate.rate() == 60  # 300 in the window of 5 s
    # a refused or vanished socket is not a registration
    gate.enter()
    gate.leave(registered=False)
    assert gate.rate() == 60
    clock.now += 5.1
    assert gate.rate() == 1.0  # none lately: at least one a second, never zero


def test_the_refused_are_spread_over_what_the_taken_ones_need():
    clock = Clock()
    gate = Admission(limit=256, clock=clock, rng=random.Random(3))
    clock.now += 6
    for _ in range(250):  # 50 a second
        gate.enter()
        gate.leave(registered=True)
    for _ in range(256):
        gate.enter()
    waits = [gate.retry_after() for _ in range(2000)]
    # 256 taken at 50 a second: about 5 s of work; the refused come back over twice that
    assert min(waits) == 1 and max(waits) == 11
    assert len(set(waits)) == 11


@pytest.mark.parametrize("pending", [0, 1, 10])
def test_a_short_queue_still_says_a_second_or_two(pending):
    gate = Admission(limit=256, clock=Clock(), rng=random.Random(1))
    gate.pending = pending
    assert {gate.retry_after() for _ in range(200)} <= {1, 2}


def test_never_longer_than_the_agents_own_backoff_cap():
    clock = Clock()
    gate = Admission(limit=100_000, clock=clock, rng=random.Random(5))
    clock.now += 6  # nothing finished lately: one a second
    gate.pending = 50_000
    assert max(gate.retry_after() for _ in range(500)) == RETRY_AFTER_MAX_S == 30
