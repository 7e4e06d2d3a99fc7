from .access import ApiKey, JoinToken, KeyUsage, NodeCredential
from .adapters import Adapter
from .catalog import EngineProfile, Model
from .choices import (
    SHARD_FINISHED,
    SHARD_STARTING,
    ApiKeyScope,
    DesiredState,
    Engine,
    EventKind,
    Evict,
    NodeState,
    PlacementPolicy,
    ReplicaState,
    ShardState,
    SleepLevel,
    VllmBuild,
)
from .nodes import (
    GPU,
    EngineInstall,
    FabricAttachment,
    LocalWeights,
    Node,
    NodeLoad,
    ShardLoad,
    Storage,
    WantedEngine,
)
from .status import Event, FleetStatus
from .teams import Team
from .weights import WeightsEvent
from .workload import Replica, Shard

__all__ = [
    "GPU",
    "Adapter",
    "SHARD_FINISHED",
    "SHARD_STARTING",
    "ApiKey",
    "ApiKeyScope",
    "DesiredState",
    "Engine",
    "EngineInstall",
    "EngineProfile",
    "Event",
    "EventKind",
    "Evict",
    "FabricAttachment",
    "FleetStatus",
    "JoinToken",
    "KeyUsage",
    "LocalWeights",
    "Model",
    "Node",
    "NodeCredential",
    "NodeLoad",
    "NodeState",
    "PlacementPolicy",
    "Replica",
    "ReplicaState",
    "Shard",
    "ShardLoad",
    "ShardState",
    "SleepLevel",
    "Team",
    "Storage",
    "VllmBuild",
    "WantedEngine",
    "WeightsEvent",
]
