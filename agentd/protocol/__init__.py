"""Agent protocol v1: the one schema both ends validate against.

Every message is a JSON object with ``type`` and ``v``. Anything that does not
validate closes the socket (see ``CloseCode``) and changes nothing. The control
plane imports this package; it imports nothing from the control plane. Both ends
import the whole contract from here; the messages are defined in its parts, one
per subject: ``node`` (register, heartbeats, GPU events, notices), ``shards``
(the desired set and shard states), ``engines`` (engine installs), ``weights``
(weights held, fetched and removed) and ``session`` (acks, logs, goodbye,
closing), over the value rules they share in ``fields``. The checks before the
schema, the close codes and ``ProtocolError`` are in ``agentd.wire``, and
importable from here too. This module changes when a message is added to or
removed from the protocol (the unions and the parsers below).
Units are in the field names: ``_mb`` mebibytes, ``_bytes`` bytes, ``_s`` seconds.
``docs/protocol.md`` is the prose version of this package.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, TypeAdapter

# Re-exported (the "X as X" form says so): both ends import the whole contract
# from this package, though each message is defined in the part for its subject.
from agentd.protocol.engines import ENGINE_VERSION_MAX as ENGINE_VERSION_MAX
from agentd.protocol.engines import ENGINE_VERSION_PATTERN as ENGINE_VERSION_PATTERN
from agentd.protocol.engines import EngineInstall as EngineInstall
from agentd.protocol.engines import EngineWant as EngineWant
from agentd.protocol.engines import Provision as Provision
from agentd.protocol.engines import engine_version_problem as engine_version_problem
from agentd.protocol.fields import NODE_ID_PATTERN as NODE_ID_PATTERN
from agentd.protocol.fields import SHARD_ID_PATTERN as SHARD_ID_PATTERN
from agentd.protocol.node import GPU as GPU
from agentd.protocol.node import NOTICE_MAX_S as NOTICE_MAX_S
from agentd.protocol.node import Fabric as Fabric
from agentd.protocol.node import GPUEventReport as GPUEventReport
from agentd.protocol.node import GPUEvents as GPUEvents
from agentd.protocol.node import GPUProblem as GPUProblem
from agentd.protocol.node import GPUSlowdown as GPUSlowdown
from agentd.protocol.node import Heartbeat as Heartbeat
from agentd.protocol.node import Load as Load
from agentd.protocol.node import NodeNotice as NodeNotice
from agentd.protocol.node import Register as Register
from agentd.protocol.node import ShardLoad as ShardLoad
from agentd.protocol.node import Storage as Storage
from agentd.protocol.session import RECONNECT_BACKOFF_CAP_S as RECONNECT_BACKOFF_CAP_S
from agentd.protocol.session import AgentAck as AgentAck
from agentd.protocol.session import Closing as Closing
from agentd.protocol.session import Goodbye as Goodbye
from agentd.protocol.session import LogsReply as LogsReply
from agentd.protocol.session import LogsRequest as LogsRequest
from agentd.protocol.session import ServerAck as ServerAck
from agentd.protocol.shards import AdapterSpec as AdapterSpec
from agentd.protocol.shards import AdapterStatus as AdapterStatus
from agentd.protocol.shards import Desired as Desired
from agentd.protocol.shards import DesiredShard as DesiredShard
from agentd.protocol.shards import ProfileSpec as ProfileSpec
from agentd.protocol.shards import RunningShard as RunningShard
from agentd.protocol.shards import ShardState as ShardState
from agentd.protocol.shards import ShardStatus as ShardStatus
from agentd.protocol.shards import shard_state_from_wire as shard_state_from_wire
from agentd.protocol.weights import FetchProgress as FetchProgress
from agentd.protocol.weights import KeptWeights as KeptWeights
from agentd.protocol.weights import RemoveWeights as RemoveWeights
from agentd.protocol.weights import Weights as Weights
from agentd.wire import VERSION as VERSION
from agentd.wire import CloseCode as CloseCode
from agentd.wire import ProtocolError as ProtocolError
from agentd.wire import decode

AgentMessage = Annotated[
    Register
    | Heartbeat
    | ShardStatus
    | FetchProgress
    | LogsReply
    | AgentAck
    | GPUEvents
    | NodeNotice
    | Goodbye,
    Field(discriminator="type"),
]

ControlMessage = Annotated[
    ServerAck | Desired | Provision | RemoveWeights | LogsRequest | Closing,
    Field(discriminator="type"),
]

_agent_adapter: TypeAdapter = TypeAdapter(AgentMessage)
_control_adapter: TypeAdapter = TypeAdapter(ControlMessage)


AGENT_TYPES = {
    "register",
    "heartbeat",
    "shard_status",
    "fetch_progress",
    "logs_reply",
    "ack",
    "gpu_events",
    "node_notice",
    "goodbye",
}
CONTROL_TYPES = {"ack", "desired", "provision", "remove_weights", "logs_request", "closing"}


def parse_agent_message(raw: str | bytes | dict):
    """Validate a message from an agent, or raise ProtocolError."""
    return decode(raw, _agent_adapter, AGENT_TYPES)


def parse_control_message(raw: str | bytes | dict):
    """Validate a message from the control plane, or raise ProtocolError."""
    return decode(raw, _control_adapter, CONTROL_TYPES)


def dump(msg: BaseModel) -> str:
    """A message as the JSON text that goes on the wire."""
    return msg.model_dump_json()
