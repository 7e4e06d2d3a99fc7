"""How many agents a web process takes through registration at once, and when it tells
the rest to come back (fleet.sockets.admission)."""

import random

from fleet.sockets.admission import RETRY_AFTER_MAX_S, START_RATE_PER_S, Admission


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


def test_the_refused_get_appointments_after_the_taken_ones_at_the_pace_and_a_half():
    clock = Clock()
    gate = Admission(limit=256, clock=clock, rng=random.Random(3))
    clock.now += 6
    for _ in range(250):  # 50 a second
        gate.enter()
        gate.leave(registered=True)
    for _ in range(256):
        gate.enter()
    waits = [gate.retry_after() for _ in range(600)]
    # 256 taken at 50 a second: about 5 s of work; then 75 appointments a second
    assert waits[0] == 6
    assert [waits.count(w) for w in range(6, 14)] == [75] * 8
    # a second later the calendar has moved on with the clock
    clock.now += 1
    assert gate.retry_after() == 13


def test_a_short_queue_says_a_second_until_that_second_is_full():
    gate = Admission(limit=256, clock=Clock(), rng=random.Random(1))
    gate.pending = 10  # a web process just started: the pace assumed is START_RATE_PER_S
    waits = [gate.retry_after() for _ in range(200)]
    per_s = round(START_RATE_PER_S * 1.5)
    assert waits == [1] * per_s + [2] * per_s + [3] * (200 - 2 * per_s)


def test_never_longer_than_the_agents_own_backoff_cap():
    clock = Clock()
    gate = Admission(limit=100_000, clock=clock, rng=random.Random(5))
    clock.now += 6  # nothing finished lately: one a second
    gate.pending = 50_000
    waits = [gate.retry_after() for _ in range(500)]
    # the calendar is past the cap: drawn from its upper half, as agentd's backoff
    assert min(waits) >= RETRY_AFTER_MAX_S // 2 and max(waits) == RETRY_AFTER_MAX_S == 30


def test_a_calendar_full_to_the_cap_spills_into_the_backoff_s_upper_half():
    clock = Clock()
    gate = Admission(limit=256, clock=clock, rng=random.Random(6))
    clock.now += 6  # one a second: two appointments a second
    waits = [gate.retry_after() for _ in range(100)]
    assert waits[:60] == [w for w in range(1, 31) for _ in range(2)]
    assert all(15 <= w <= 30 for w in waits[60:])
