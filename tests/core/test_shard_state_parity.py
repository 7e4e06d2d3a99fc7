"""The agent's shard states and the control plane's are one set of values.

The agent reports ``agentd.protocol.ShardState`` values, and the control plane
stores them in a column whose choices are ``fleet.models.choices.ShardState``.
A state only the agent has would be stored outside the column's choices, where
the admin's and the API's filters do not know it; one only the control plane
has could never be reported, since the wire reads an unknown state as failed.
"""

from agentd import protocol
from fleet.models import choices


def test_the_agent_reports_no_state_the_control_plane_cannot_store():
    agent_only = {s.value for s in protocol.ShardState} - set(choices.ShardState.values)
    assert agent_only == set()


def test_the_control_plane_knows_no_state_the_agent_cannot_report():
    control_only = set(choices.ShardState.values) - {s.value for s in protocol.ShardState}
    assert control_only == set()
