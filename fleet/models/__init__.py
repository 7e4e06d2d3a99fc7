from .access import ApiKey, JoinToken, KeyUsage, NodeCredential
from .adapters import Adapter
from .batches import Batch, BatchFile, BatchLine
from .catalog import Model
from .choices import (
    BATCH_FINISHED,
    SHARD_FINISHED,
    SHARD_STARTING,
    ApiKeyScope,
    BatchStatus,
    DesiredState,
    Engine,
    EventKind,
    Evict,
    FilePurpose,
    GPUHealth,
    NodeState,
    PlacementPolicy,
    ReplicaState,
    ShardState,
    SleepLevel,
    VllmBuild,
)
from .costs import CostHour, Price
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
from .profiles import EngineProfile
from .status import Event, FleetStatus
from .teams import Team
from .weights import WeightsEvent
from .workload import Replica, Shard

__all__ = [
    "GPU",
    "Adapter",
    "BATCH_FINISHED",
    "SHARD_FINISHED",
    "SHARD_STARTING",
    "ApiKey",
    "ApiKeyScope",
    "Batch",
    "BatchFile",
    "BatchLine",
    "BatchStatus",
    "CostHour",
    "DesiredState",
    "Engine",
    "EngineInstall",
    "EngineProfile",
    "Event",
    "EventKind",
    "Evict",
    "FabricAttachment",
    "FilePurpose",
    "GPUHealth",
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
    "Price",
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
