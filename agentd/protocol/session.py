"""The session between an agent and its control plane: acks, logs, leaving, closing.

How the conversation itself goes, whatever its subject: the answer to a
register (and the credential on enrolment), the agent's acknowledgement of a
control-plane message, a request for logs and its reply, an agent's goodbye and
the control plane's word before it closes the socket, and how long an agent
waits at most before knocking again. This module changes when the session's
rules change.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from agentd.protocol.fields import Count, Msg, NodeId, ShortStr, Text, Version
from agentd.protocol.weights import KeptWeights

# The longest an agent waits between two tries to reach its control plane
# (agentd.client.Backoff): the control plane counts on every live agent having
# knocked again within this (fleet.services.reconciler.expiry.Rejoin).
RECONNECT_BACKOFF_CAP_S = 30.0


class ServerAck(Msg):
    """Answers a register. On enrolment it carries the node's new credential, once."""

    type: Literal["ack"]
    of: Literal["register", "heartbeat"]
    node_id: NodeId
    seq: Count = 0
    credential: str | None = None
    heartbeat_interval_s: Annotated[float, Field(gt=0)] = 10


class AgentAck(Msg):
    """The agent acknowledges a control-plane message, e.g. a desired set it has applied."""

    type: Literal["ack"]
    of: Literal["desired", "provision", "remove_weights"]
    version: Version = 0
    ok: bool = True
    detail: Text = ""
    # remove_weights only: the proposal's request_id, and per path what happened.
    request_id: Annotated[str, Field(max_length=64)] = ""
    removed: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=1024)] = []
    kept: Annotated[list[KeptWeights], Field(max_length=1024)] = []


class LogsRequest(Msg):
    type: Literal["logs_request"]
    request_id: Annotated[str, Field(min_length=1, max_length=64)]
    # "agent" for the agent's own log, or a shard id for that engine's output.
    source: ShortStr = "agent"
    lines: Annotated[int, Field(ge=1, le=10000)] = 200


class LogsReply(Msg):
    type: Literal["logs_reply"]
    request_id: Annotated[str, Field(min_length=1, max_length=64)]
    lines: Annotated[list[Text], Field(max_length=10000)] = []
    sources: Annotated[list[ShortStr], Field(max_length=256)] = []
    error: Text = ""


class Goodbye(Msg):
    """Sent before an orderly shutdown (SIGTERM): the node is leaving on purpose."""

    type: Literal["goodbye"]
    reason: Text = ""


class Closing(Msg):
    """Sent just before the control plane closes the socket: the close code, and why.

    The close frame carries the same code, but Daphne drops a close frame's
    reason (django/daphne#374), so this message is how the reason reaches the
    agent's log. An agent that does not know it can ignore it.
    """

    type: Literal["closing"]
    code: Annotated[int, Field(ge=1000, le=4999)]
    reason: Text = ""
