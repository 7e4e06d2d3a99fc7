"""Fleets for the console's tests: many nodes with GPUs, loads and shards, in few queries."""

from datetime import timedelta

from django.utils import timezone

from fleet.models import (
    GPU,
    DesiredState,
    EngineInstall,
    EngineProfile,
    Model,
    Node,
    NodeLoad,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
    Storage,
)


def simulated_fleet(n: int, *, gpus: int = 8, prefix: str = "node") -> list[str]:
    """``n`` connected nodes as their agents would have reported them, each with ``gpus``
    H100s, a fresh load, a disk, two engine installs and one ready shard per node;
    one pending replica per ten nodes. Written in bulk: a benchmark and a query-count
    test need the rows, not the path that makes them."""
    now = timezone.now()
    ids = [f"{prefix}-{i:05d}" for i in range(n)]
    Node.objects.bulk_create(
        Node(
            id=nid,
            hostname=f"{nid}.example",
            connected=True,
            last_seen=now,
            memory_total_mb=2063500,
            engine_versions={"vllm": "0.11.0", "llamacpp": "0.3.16"},
            agent_version="0.1.0",
            agent_labels={"zone": "a"},
        )
        for nid in ids
    )
    GPU.objects.bulk_create(
        GPU(
            node_id=nid,
            index=g,
            uuid=f"GPU-{nid}-{g}",
            name="NVIDIA H100 80GB HBM3",
            memory_total_mb=81559,
            memory_used_mb=(g * 9000) % 81559,
        )
        for nid in ids
        for g in range(gpus)
    )
    NodeLoad.objects.bulk_create(
        NodeLoad(
            node_id=nid,
            sampled_at=now,
            cpu_percent=(i * 7) % 100,
            cpu_count=224,
            load1=3.5,
            load5=3.0,
            load15=2.5,
            memory_used_bytes=412 * 2**30,
            memory_available_bytes=1600 * 2**30,
        )
        for i, nid in enumerate(ids)
    )
    Storage.objects.bulk_create(
        Storage(node_id=nid, path="/var/lib/llmgw", free_bytes=10**12, total_bytes=2 * 10**12)
        for nid in ids
    )
    EngineInstall.objects.bulk_create(
        EngineInstall(node_id=nid, engine=e, version=v, state="installed")
        for nid in ids
        for e, v in (("vllm", "0.11.0"), ("llamacpp", "0.3.16"))
    )
    model = Model.objects.create(name=f"{prefix}-qwen", desired_replicas=n)
    profile = EngineProfile.objects.create(
        model=model, name="default", engine="vllm", model_path="/models/qwen", gpus_per_node=1
    )
    replicas = Replica.objects.bulk_create(
        Replica(id=f"r-{nid}", model=model, profile=profile, state=ReplicaState.READY)
        for nid in ids
    )
    Shard.objects.bulk_create(
        Shard(
            id=f"s-{nid}",
            replica=r,
            node_id=nid,
            port=30000,
            gpu_uuids=[f"GPU-{nid}-0"],
            state=ShardState.READY,
            desired_state=DesiredState.RUNNING,
        )
        for r, nid in zip(replicas, ids, strict=True)
    )
    Replica.objects.bulk_create(
        Replica(
            id=f"p-{prefix}-{i}",
            model=model,
            profile=profile,
            state=ReplicaState.PENDING,
            reason="no node fits: gpu-07: has 8 GB of memory, needs 24",
            created_at=now - timedelta(minutes=1),
        )
        for i in range(max(1, n // 10))
    )
    return ids
