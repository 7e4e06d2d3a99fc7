"""Test data for every domain: nodes, models, replicas, keys, tokens and agent messages.

Plain functions, one per thing, each building through the real services where
there is one (a node is registered the way its agent registers it). Defaults
describe a schedulable node and a fake-engine model; a test that relies on
other facts passes them. What starts processes lives in ``tests.processes``.
"""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from agentd import protocol
from fleet.models import (
    ApiKey,
    ApiKeyScope,
    DesiredState,
    Engine,
    EngineProfile,
    Model,
    Node,
    NodeCredential,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)
from fleet.services import access, api_keys, heartbeat, inventory

GB = 1000  # MB in a GB, as placement counts them (fleet/services/units.py)

H100_GPUS = [
    {
        "index": i,
        "uuid": f"GPU-5f1c8a2e-{i:04x}-4b7d-9e2a-3c6f0d1b{i:04x}",
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mb": 81559,
        "memory_used_mb": 0,
        "compute_capability": "9.0",
        "numa_node": 0 if i < 4 else 1,
        "pci_bus_id": f"00000000:{0x18 + i * 0x10:02X}:00.0",
        "driver_version": "550.90.07",
        "cuda_version": "12.4",
        "nvlink_peers": [j for j in range(8) if j != i],
        "ecc_errors": 0,
        "temperature_c": 34,
        "problems": [],
    }
    for i in range(8)
]

# Every engine placement may ask for, so a node never fails a test for want of one.
ALL_ENGINES = {"fake": "1", "llamacpp": "0.3.16", "vllm": "0.11.0"}

# A llama.cpp profile on the CPU, as the admin, API and command tests declare models.
LLAMACPP_CPU = {"profile": "cpu", "engine": "llamacpp", "gpus_per_node": 0}


# ---- agent messages -------------------------------------------------------------------


def register_msg(node_id="gpu-01", **overrides) -> dict:
    """A register message as an 8×H100 node's agent sends it."""
    msg = {
        "type": "register",
        "v": 1,
        "node_id": node_id,
        "hostname": f"{node_id}.example",
        "mgmt_addr": "10.0.0.7",
        "labels": {"zone": "a"},
        "agent_version": "0.1.0",
        "engine_versions": {"llamacpp": "0.3.16"},
        "memory_total_mb": 2063500,
        "gpus": H100_GPUS,
        "fabrics": [{"fabric": "ib0", "hcas": ["mlx5_0", "mlx5_1"], "rate_gbps": 400}],
        "storage": [{"path": "/var/lib/llmgw", "free_bytes": 10**12, "total_bytes": 2 * 10**12}],
        "weights": [{"path": "/models/qwen", "size_bytes": 15 * 10**9}],
    }
    msg.update(overrides)
    return msg


def heartbeat_msg(seq=1, **overrides) -> dict:
    msg = {"type": "heartbeat", "v": 1, "seq": seq}
    msg.update(overrides)
    return msg


# ---- nodes ----------------------------------------------------------------------------


def add_node(
    node_id="gpu-01", *, as_reported=False, gpus=None, memory_gb=64, engines=None, **fields
):
    """A node registered through the real inventory service, connected and ready.

    By default a node for placement: eight H100s with UUIDs of the node's own,
    64 GB of memory, every engine and no weights. ``as_reported``: the facts of
    ``register_msg`` instead (its GPU UUIDs, 2 TB, llama.cpp only, a weights
    file), for tests that check what an agent reported is shown as reported.
    ``gpus`` given are registered as given; ``memory_total_mb`` given wins over
    ``memory_gb`` (None for either: unknown); ``engines`` (or ``engine_versions``)
    are the engine versions; any other register field may be passed.
    """
    if engines is not None:
        fields.setdefault("engine_versions", engines)
    if not as_reported:
        if gpus is None:
            gpus = [{**g, "uuid": f"GPU-{node_id}-{g['index']}"} for g in H100_GPUS]
        fields.setdefault("memory_total_mb", memory_gb * GB if memory_gb is not None else None)
        fields.setdefault("weights", [])
        fields.setdefault("engine_versions", ALL_ENGINES)
    if gpus is not None:
        fields["gpus"] = gpus
    msg = register_msg(node_id, **fields)
    return inventory.register_node(protocol.parse_agent_message(msg))


def report_gpu_events(node_id, *found, slowdowns=()):
    """The node's agent reports these ``(gpu_index, kind, xid)`` events ("xid" with its
    number, "double_bit_ecc" with None), as its socket hands them on."""
    from fleet.services import gpu_health

    msg = protocol.parse_agent_message(
        {
            "type": "gpu_events",
            "v": 1,
            "events": [{"gpu_index": i, "kind": k, "xid": x} for i, k, x in found],
            "slowdowns": [{"gpu_index": i, "reasons": r} for i, r in slowdowns],
        }
    )
    gpu_health.apply_gpu_events(node_id, msg)


def report_load(node_id, *, cpu_percent=37.5, age=timedelta(0), shards=()):
    """A heartbeat carrying load, applied as if it arrived ``age`` ago."""
    hb = protocol.parse_agent_message(
        heartbeat_msg(
            load={
                "cpu_percent": cpu_percent,
                "cpu_count": 224,
                "load1": 3.5,
                "load5": 3.0,
                "load15": 2.5,
                "memory_used_bytes": 412 * 2**30,
                "memory_available_bytes": 1600 * 2**30,
                "shards": list(shards),
            }
        )
    )
    # Written as the node's agent would be: only a live credential's heartbeat is.
    cred = NodeCredential.objects.filter(node_id=node_id, revoked_at__isnull=True).first()
    if cred is None:
        cred, _ = NodeCredential.issue(node=Node.objects.get(pk=node_id))
    heartbeat.apply_heartbeats([(node_id, cred.pk, hb, timezone.now() - age)])


# ---- the catalog and what runs --------------------------------------------------------


def add_model(
    name="qwen", *, replicas=1, policy="binpack", profile="default", engine="fake", **profile_fields
):
    """A model with one active profile: by default the fake engine on one GPU per replica.

    The profile is ``model.active_profile``; ``profile_fields`` override its fields.
    """
    model = Model.objects.create(name=name, desired_replicas=replicas, placement_policy=policy)
    fields = {"model_path": f"/models/{name}", "gpus_per_node": 1, "tp": 1, **profile_fields}
    prof = EngineProfile.objects.create(model=model, name=profile, engine=engine, **fields)
    model.active_profile = prof
    model.save()
    return model


def add_replica(model, profile, node_ids, state=ShardState.READY):
    """A replica with one shard per node, as the reconciler would have placed it."""
    replica = Replica.objects.create(
        model=model,
        profile=profile,
        state=ReplicaState.READY if state == ShardState.READY else ReplicaState.STARTING,
    )
    for rank, node_id in enumerate(node_ids):
        Shard.objects.create(
            replica=replica,
            node_id=node_id,
            rank=rank,
            port=8000 + rank,
            state=state,
            desired_state=DesiredState.RUNNING,
        )
    return replica


def make_shard(node_id: str, *, state="pending", desired_state="running", shard_id=None) -> Shard:
    """A one-shard replica of a small llama.cpp model on a node."""
    model, _ = Model.objects.get_or_create(name="qwen-0.5b")
    profile, _ = EngineProfile.objects.get_or_create(
        model=model,
        name="cpu",
        defaults={"engine": "llamacpp", "model_path": "/models/qwen-0.5b.gguf"},
    )
    replica = Replica.objects.create(model=model, profile=profile)
    fields = {"id": shard_id} if shard_id else {}
    return Shard.objects.create(
        replica=replica,
        node_id=node_id,
        port=8001,
        state=state,
        desired_state=desired_state,
        **fields,
    )


def ready_model(name: str, upstreams: list, *, served_name: str = "", node_prefix: str = "gw"):
    """A model whose replicas are ready, one per upstream (rows only; no agent involved)."""
    model = Model.objects.create(name=name, desired_replicas=len(upstreams))
    profile = EngineProfile.objects.create(
        model=model,
        name="default",
        engine=Engine.FAKE,
        model_path="/models/fake",
        served_model_name=served_name,
    )
    replicas = []
    for i, up in enumerate(upstreams):
        node, _ = Node.objects.get_or_create(
            pk=f"{node_prefix}-{name}-{i}".replace("/", "-")[:63],
            defaults={"mgmt_addr": "127.0.0.1", "connected": True},
        )
        replica = Replica.objects.create(model=model, profile=profile, state=ReplicaState.READY)
        Shard.objects.create(
            replica=replica,
            node=node,
            rank=0,
            port=up.port,
            state=ShardState.READY,
            desired_state=DesiredState.RUNNING,
        )
        replicas.append(replica)
    return model, replicas


# ---- access: tokens, credentials, users, keys -----------------------------------------


WEIGHTS_DIR = "/var/lib/llmgw/weights"


def node_with_weights(node_id="n1") -> Shard:
    """``node_id`` serves ``tiny`` from tiny.gguf (2 GB) and holds ``old`` (7 GB),
    which nothing needs; returns tiny's shard. The tests of the weights' surfaces
    (API, admin, commands, the console's node page) start from it."""
    from tests.reconciler.helpers import Clock  # it builds on this module

    add_node(node_id)
    weights = [
        {"path": f"{WEIGHTS_DIR}/tiny.gguf", "size_bytes": 2 * 10**9},
        {"path": f"{WEIGHTS_DIR}/old", "size_bytes": 7 * 10**9},
    ]
    msg = register_msg(node_id, gpus=[], weights=weights)
    inventory.register_node(protocol.parse_agent_message(msg))
    add_model("tiny", engine="llamacpp", gpus_per_node=0, model_path=f"{WEIGHTS_DIR}/tiny.gguf")
    Clock().pass_()
    return Shard.objects.get(node_id=node_id)


def join_token(name="rack-1", uses=1, ttl=timedelta(hours=1)) -> tuple:
    return access.create_join_token(name, ttl=ttl, max_uses=uses)


def enrol_node(node_id):
    """Enrol a node with a fresh join token; returns its credential secret."""
    _, secret = access.create_join_token("test", ttl=timedelta(hours=1))
    identity = access.identify(secret)
    _, credential = access.enrol(identity, node_id)
    return credential


def staff_user(username="ops", **fields):
    fields = {"is_staff": True, **fields}
    return get_user_model().objects.create_user(username, password="pw-for-tests", **fields)


def grant(user, *perms):
    """``user`` given these permissions ("fleet.drain_node"), fresh from the database.

    Fresh because Django caches a user's permissions on the object.
    """
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return get_user_model().objects.get(pk=user.pk)


def operator(username="ops", **fields):
    """A staff user with every fleet permission: whom tests of behaviour, not of access, act as."""
    user = staff_user(username, **fields)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="fleet"))
    return user


def manage_key(user=None, **fields):
    """A manage-scope API key (of an operator unless ``user`` says); returns (key, secret)."""
    return api_keys.create_api_key(
        "automation", scope=ApiKeyScope.MANAGE, user=user or operator(), **fields
    )


def inference_key(name: str = "client", **fields):
    return ApiKey.issue(name=name, scope="inference", **fields)


def bearer(secret) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
