"""Rules with one definition that several parts share, pinned at their boundaries.

Readiness (reconciler, gateway, drains, make run), the labels in effect
(model, placement snapshot, API filter), bearer headers (agent socket,
gateway), API-key refusals (management API, gateway) and the port range
(agent, control plane) each live in one place; these tests pin that place.
"""

from types import SimpleNamespace

import pytest

from agentd.ports import DEFAULT_PORT_RANGE, parse_port_range
from fleet.models import Node
from fleet.models.access import api_key_refusal, bearer_secret
from fleet.selectors import effective_labels
from fleet.services.readiness import replica_ready


def shard(state, desired="running"):
    return SimpleNamespace(state=state, desired_state=desired)


@pytest.mark.parametrize(
    "shards, ready",
    [
        ([], False),  # not placed
        ([shard("ready")], True),
        ([shard("ready"), shard("ready")], True),  # a two-node replica
        ([shard("ready"), shard("loading")], False),  # rank 1 still loading
        ([shard("ready", "draining")], False),  # on its way out: no new requests
        ([shard("draining", "draining")], False),
        # placed again: the old shard told to stop does not count either way
        ([shard("ready", "stopped"), shard("starting")], False),
        ([shard("failed", "stopped"), shard("ready")], True),
        ([shard("ready", "stopped")], False),
        ([shard("weird-new-state")], False),  # never guessed healthy
    ],
)
def test_a_replica_is_ready_when_its_current_shards_are_all_ready(shards, ready):
    assert replica_ready(shards) is ready


def test_operator_labels_win_over_the_agents_key_by_key():
    agent = {"zone": "a", "gpu": "h100"}
    operator = {"zone": "b", "role": "coding"}

    assert effective_labels(agent, operator) == {"zone": "b", "gpu": "h100", "role": "coding"}
    assert effective_labels(None, None) == {}
    assert Node(agent_labels=agent, operator_labels=operator).labels == effective_labels(
        agent, operator
    )


@pytest.mark.parametrize(
    "headers, secret",
    [
        ([], None),
        ([(b"host", b"x")], None),
        ([(b"authorization", b"Bearer lgk_abc")], "lgk_abc"),
        ([(b"authorization", b"bearer   lgk_abc  ")], "lgk_abc"),
    ],
)
def test_bearer_header(headers, secret):
    assert bearer_secret(headers) == secret


@pytest.mark.parametrize("value", [b"Basic dXNlcjpwdw==", b"lgk_abc", b"Bearer"])
def test_an_authorization_header_of_another_kind_is_refused(value):
    with pytest.raises(ValueError, match="must be 'Bearer <secret>'"):
        bearer_secret([(b"authorization", value)])


def test_api_key_refusals_name_the_key_and_revocation_comes_first():
    assert api_key_refusal("ci", "ab12cd34", revoked=True, expired=True) == (
        "revoked_api_key",
        "API key 'ci' (ab12cd34) has been revoked",
    )
    assert api_key_refusal("ci", "ab12cd34", revoked=False, expired=True) == (
        "expired_api_key",
        "API key 'ci' (ab12cd34) has expired",
    )
    assert api_key_refusal("ci", "ab12cd34", revoked=False, expired=False) == ("", "")


@pytest.mark.parametrize(
    "text, message",
    [
        ("30000", "is not LO-HI"),
        ("a-b", "is not LO-HI"),
        ("31000-30000", "must lie within 1024-65535, low first"),
        ("80-90", "must lie within 1024-65535, low first"),
        ("65000-70000", "must lie within 1024-65535, low first"),
    ],
)
def test_a_bad_port_range_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_port_range(text)


def test_the_default_port_range_is_the_same_on_both_ends():
    from agentd.config import Config
    from fleet.conf import FleetSettings

    assert parse_port_range("1024-65535") == (1024, 65535)
    assert parse_port_range(FleetSettings().shard_port_range) == DEFAULT_PORT_RANGE
    assert Config.model_fields["engine_port_range"].default == DEFAULT_PORT_RANGE


@pytest.mark.parametrize(
    "n, text",
    [
        (None, "-"),  # unknown is not zero
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (412 * 2**30, "412.0 GiB"),
        (2063500 * 2**20, "2.0 TiB"),
        (3 * 2**50, "3.0 PiB"),
        (5000 * 2**50, "5000.0 PiB"),
    ],
)
def test_bytes_for_people_in_binary_units(n, text):
    from fleet.services.units import bytes_text

    assert bytes_text(n) == text
