"""The autoscaler's decision as a table: facts in, replicas and reason out (no database)."""

import pytest

from fleet.services.autoscaler.decide import DOWN, UP, Facts, Policy, decide

POLICY = Policy(
    min_replicas=1,
    max_replicas=4,
    target=4.0,
    idle_s=None,
    hysteresis=0.2,
    up_cooldown_s=15,
    down_cooldown_s=120,
)
TO_ZERO = Policy(0, 4, 4.0, idle_s=300)


def facts(desired=1, ready=None, outstanding=0.0, waiting=0, idle_s=0.0, since_scaled_s=None):
    return Facts(desired, desired if ready is None else ready, outstanding, waiting, idle_s,
                 since_scaled_s)  # fmt: skip


@pytest.mark.parametrize(
    "policy, f, desired, direction, reason",
    [
        # bounds first
        (POLICY, facts(desired=6, ready=6), 4, DOWN, "above max_replicas 4"),
        (POLICY, facts(desired=0, ready=0), 1, UP, "below min_replicas 1"),
        # scaled to zero: wakes for waiting requests, enough for them, no cool-down
        (TO_ZERO, facts(desired=0, ready=0, waiting=1, since_scaled_s=1), 1, UP, "1 request(s)"),
        (TO_ZERO, facts(desired=0, ready=0, waiting=9), 3, UP, "starting 3"),
        (TO_ZERO, facts(desired=0, ready=0, waiting=64), 4, UP, "starting 4"),
        (TO_ZERO, facts(desired=0, ready=0), 0, "", ""),
        # idle: to zero only past the idle time, with nothing in flight or waiting
        (TO_ZERO, facts(desired=2, idle_s=300), 0, DOWN, "no request for 300 s"),
        (TO_ZERO, facts(desired=1, idle_s=299), 1, "", ""),
        (TO_ZERO, facts(desired=1, idle_s=900, outstanding=1), 1, "", ""),
        (TO_ZERO, facts(desired=1, idle_s=None), 1, "", ""),
        (POLICY, facts(desired=1, idle_s=10_000), 1, "", ""),  # min 1: never to zero
        # load up: above target + 20 %, to as many as the load needs, within max
        (POLICY, facts(desired=1, outstanding=4.8), 1, "", ""),
        (POLICY, facts(desired=1, outstanding=5), 2, UP, "5 outstanding on 1 ready"),
        (POLICY, facts(desired=1, outstanding=12), 3, UP, "12 each"),
        (POLICY, facts(desired=2, outstanding=100), 4, UP, "50 each"),
        (POLICY, facts(desired=4, outstanding=100), 4, "", ""),  # at max
        (POLICY, facts(desired=2, outstanding=20, since_scaled_s=10), 2, "", ""),  # cool-down
        (POLICY, facts(desired=2, outstanding=20, since_scaled_s=15), 4, UP, "10 each"),
        (POLICY, facts(desired=2, ready=1, outstanding=20), 2, "", ""),  # last step not ready
        # load down: one step, only if one fewer stays under target - 20 %
        (POLICY, facts(desired=3, outstanding=6.5), 3, "", ""),  # 3.25 on 2: stays
        (POLICY, facts(desired=3, outstanding=6), 2, DOWN, "2 would carry 3"),
        (POLICY, facts(desired=3, outstanding=0, since_scaled_s=119), 3, "", ""),  # cool-down
        (POLICY, facts(desired=3, outstanding=0, since_scaled_s=120), 2, DOWN, "0 outstanding"),
        (POLICY, facts(desired=1, outstanding=0), 1, "", ""),  # load never goes below 1
        (TO_ZERO, facts(desired=1, outstanding=0, idle_s=5), 1, "", ""),
    ],
)
def test_decide(policy, f, desired, direction, reason):
    d = decide(policy, f)
    assert (d.desired, d.direction) == (desired, direction)
    assert reason in d.reason


def test_a_load_between_the_thresholds_changes_nothing_either_way():
    # given: 2 replicas at the target, load wobbling inside the band around it
    for outstanding in (6.5, 7.0, 8.0, 9.0, 9.6):
        # then: neither up (≤ 4.8 each) nor down (one fewer would carry > 3.2)
        assert not decide(POLICY, facts(desired=2, outstanding=outstanding)).changed


def test_a_step_up_then_the_same_load_does_not_step_down():
    # given: one replica with 10 outstanding steps up to 3
    up = decide(POLICY, facts(desired=1, outstanding=10))
    assert (up.desired, up.direction) == (3, UP)
    # then: the same load on 3 ready replicas (3.3 each) is not a reason to go down
    later = decide(POLICY, facts(desired=3, outstanding=10, since_scaled_s=600))
    assert not later.changed
