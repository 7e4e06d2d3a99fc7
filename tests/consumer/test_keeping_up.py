"""A node that is not keeping up with its desired set: since when it lags, and the rule."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from agentd import protocol
from fleet.models import Node, NodeCredential
from fleet.services import desired, inventory
from fleet.services.fleet_metrics import collect_fleet
from fleet.services.heartbeat import apply as heartbeat_apply
from tests.factories import add_node, heartbeat_msg, register_msg

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# ---- the rule, at its boundary (no database) ---------------------------------------


@pytest.mark.parametrize(
    ("connected", "behind_s", "flagged"),
    [
        (True, None, False),  # caught up
        (True, 29.9, False),
        (True, 30.0, False),  # at the bound: not yet
        (True, 30.1, True),
        (False, 3600, False),  # disconnected: its silence has timers of its own
    ],
)
def test_not_keeping_up_is_behind_for_longer_than_the_bound(connected, behind_s, flagged):
    since = None if behind_s is None else T0 - timedelta(seconds=behind_s)
    assert desired.not_keeping_up(connected, since, T0, bound_s=30) is flagged


def test_the_bound_is_a_setting(settings):
    settings.LLMGW = {**settings.LLMGW, "DESIRED_LAG_BOUND_S": 5}
    assert desired.not_keeping_up(True, T0 - timedelta(seconds=6), T0)
    settings.LLMGW = {**settings.LLMGW, "DESIRED_LAG_BOUND_S": 60}
    assert not desired.not_keeping_up(True, T0 - timedelta(seconds=6), T0)


# ---- the writers keep desired_lag_since -------------------------------------------------


def lag(node_id="gpu-01"):
    return Node.objects.values_list("acked_version", "desired_version", "desired_lag_since").get(
        pk=node_id
    )


@pytest.mark.django_db(transaction=True)
def test_a_bump_starts_the_clock_and_an_ack_stops_it():
    add_node("gpu-01")
    assert lag()[2] is None

    desired.bump_desired(["gpu-01"])
    acked, version, since = lag()
    assert acked < version and since is not None

    # a second bump while behind: still behind since the first
    desired.bump_desired(["gpu-01"])
    assert lag()[2] == since

    # an ack that moves forward without catching up restarts the clock: it converges
    inventory.apply_desired_ack("gpu-01", version)
    acked, _, moved = lag()
    assert acked == version and moved is not None and moved > since

    # a late ack of an older version changes nothing
    inventory.apply_desired_ack("gpu-01", version - 1)
    assert lag()[2] == moved

    # caught up: cleared
    inventory.apply_desired_ack("gpu-01", version + 1)
    assert lag() == (version + 1, version + 1, None)


@pytest.mark.django_db
def test_register_times_a_node_still_behind_from_now():
    add_node("gpu-01")
    Node.objects.filter(pk="gpu-01").update(
        desired_version=5, acked_version=2, desired_lag_since=T0
    )
    inventory.register_node(protocol.parse_agent_message(register_msg(desired_version=3)))
    acked, version, since = lag()
    assert (acked, version) == (3, 5) and since > T0

    inventory.register_node(protocol.parse_agent_message(register_msg(desired_version=5)))
    assert lag() == (5, 5, None)


@pytest.mark.django_db
def test_register_keeps_the_management_interface():
    inventory.register_node(protocol.parse_agent_message(register_msg(mgmt_interface="eno1")))
    assert Node.objects.get(pk="gpu-01").mgmt_interface == "eno1"


# ---- what operators see: /metrics ---------------------------------------------------------


@pytest.mark.django_db
def test_metrics_say_how_long_each_connected_node_lags():
    now = timezone.now()
    for node_id in ("gpu-01", "gpu-02", "gpu-03"):
        add_node(node_id)
    Node.objects.filter(pk="gpu-02").update(
        desired_version=4, desired_lag_since=now - timedelta(seconds=45)
    )
    Node.objects.filter(pk="gpu-03").update(
        connected=False, desired_version=4, desired_lag_since=now - timedelta(hours=1)
    )

    families = {f.name: f for f in collect_fleet(now)}

    def values(name):
        return {s.labels["node"]: s.value for s in families[name].samples}

    assert values("llmgw_node_desired_lag_seconds") == {"gpu-01": 0.0, "gpu-02": 45.0}
    assert values("llmgw_node_not_keeping_up") == {"gpu-01": 0, "gpu-02": 1}


@pytest.mark.django_db
def test_a_heartbeat_that_catches_up_clears_the_lag():
    add_node("gpu-01")
    cred, _ = NodeCredential.issue(node=Node.objects.get(pk="gpu-01"))
    Node.objects.filter(pk="gpu-01").update(desired_version=3, desired_lag_since=T0)
    heartbeat_apply.apply_heartbeats(
        [("gpu-01", cred.pk, protocol.parse_agent_message(heartbeat_msg(desired_version=3)),
          timezone.now())]
    )  # fmt: skip
    assert lag() == (3, 3, None)
