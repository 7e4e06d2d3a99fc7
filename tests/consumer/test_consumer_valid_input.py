"""Whatever the schema accepts, the control plane can store.

The other half of the bad-input property: valid messages pushed to the edges
of the schema (the longest strings, the largest integers and floats) are
applied without an error and the socket stays open. Run against PostgreSQL
this is what finds a bound in the schema looser than its column.
"""

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentd import protocol
from fleet.models import Node, Shard
from tests.consumer.helpers import db, enrol
from tests.consumer.strategies import valid_heartbeats, valid_registers, valid_shard_reports
from tests.factories import make_shard

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
async def agent():
    """gpu-01 registered, with one shard of its own (s-1) for status reports to land on."""
    await db(Node.objects.create)(id="gpu-01")
    await db(make_shard)("gpu-01", shard_id="s-1")
    a = await enrol("gpu-01")
    yield a
    await a.close()


_seqs = itertools.count(1000)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
    ],
)
@given(msg=st.one_of(valid_heartbeats, valid_registers, valid_shard_reports))
async def test_every_valid_message_is_applied_and_the_socket_stays(agent, caplog, msg):
    protocol.parse_agent_message(json.dumps(msg))  # the strategy makes valid messages only
    seen = len(caplog.records)

    await agent.send(msg)
    # A heartbeat behind it: its ack says the message before it was applied.
    seq = next(_seqs)
    await agent.send({"type": "heartbeat", "v": 1, "seq": seq})
    while True:
        reply = await agent.recv(timeout=5)
        if reply["type"] == "ack" and reply["of"] == "heartbeat" and reply["seq"] == seq:
            break
        assert reply["type"] in {"ack", "desired", "provision"}, reply

    new = caplog.records[seen:]
    assert not [r for r in new if r.exc_info], [r.getMessage() for r in new if r.exc_info]
    assert not [r for r in new if "agent socket closed" in r.getMessage()]
    if msg["type"] == "shard_status" and msg["shard_id"] == "s-1":
        shard = await db(Shard.objects.get)(pk="s-1")
        assert shard.state == protocol.shard_state_from_wire(msg["state"])
