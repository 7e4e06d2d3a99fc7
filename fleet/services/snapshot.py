"""Building placement's inventory snapshot and requests from the database.

A handful of ``values()`` queries, no model instances: a pass over 5,000 nodes
with 40,000 GPUs must stay well under a second.
"""

import json
import math
import time
from dataclasses import dataclass

from django.db import connection
from django.utils import timezone

from agentd.ports import PORTS_LABEL, parse_port_range
from fleet.conf import fleet_settings
from fleet.models import (
    GPU,
    SHARD_FINISHED,
    DesiredState,
    EngineInstall,
    FabricAttachment,
    LocalWeights,
    Node,
    Shard,
    ShardLoad,
    ShardState,
)
from fleet.selectors import effective_labels, parse_selector

from .estimate import estimate_key, profile_text
from .nodes import LOAD_MAX_AGE
from .placement import Snapshot, explain
from .placement_types import (
    GpuInfo,
    InstallInfo,
    NodeInfo,
    NoPlacement,
    Placement,
    Request,
    Verdict,
)
from .units import MB_PER_GB, share_mb
from .weights_gc.facts import ts as unix_seconds


def default_port_range() -> tuple[int, int]:
    return parse_port_range(fleet_settings().shard_port_range)


def _rows(sql: str, params=()) -> list[tuple]:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall()


class _Json:
    """JSON columns decoded once per distinct text: GPUs' NVLink lists and most
    labels repeat across a fleet, and decoding 40,000 of them dominated a build."""

    def __init__(self):
        self.seen: dict[str, object] = {}

    def __call__(self, value, empty):
        if value is None:
            return empty
        if not isinstance(value, str):
            return value  # the driver decoded it already
        got = self.seen.get(value)
        if got is None:
            got = self.seen[value] = json.loads(value)
        return got


def build() -> Snapshot:
    """The inventory as placement sees it, with the GPUs, ports and memory shards hold.

    Raw queries: the ORM's per-row conversion cost more than everything else
    at 5,000 nodes.
    """
    decode = _Json()
    t = {
        m: m._meta.db_table
        for m in (Node, GPU, FabricAttachment, LocalWeights, Shard, EngineInstall)
    }
    nodes: dict[str, NodeInfo] = {}
    for nid, state, cordoned, draining, connected, agent, operator, mem, engines, build in _rows(
        f"SELECT id, state, cordoned, draining, connected, agent_labels, operator_labels, "
        f"memory_total_mb, engine_versions, vllm_build FROM {t[Node]} ORDER BY id"
    ):
        labels = effective_labels(decode(agent, {}), decode(operator, {}))
        port_range = None
        if PORTS_LABEL in labels:
            try:
                port_range = parse_port_range(labels[PORTS_LABEL])
            except ValueError:
                port_range = (0, -1)  # an empty range: the reason names the bad label
        nodes[nid] = NodeInfo(
            id=nid,
            state=state,
            cordoned=bool(cordoned),
            draining=bool(draining),
            connected=bool(connected),
            labels=labels,
            memory_mb=mem,
            engines=decode(engines, {}),
            port_range=port_range,
            vllm_build=build,
        )
    peers: dict[str, frozenset] = {}
    index_col = connection.ops.quote_name("index")
    used_mb: dict[str, int] = {}  # GPU uuid -> memory in use, as the last heartbeat said
    for nid, uuid, index, name, problems, health, nvlink, numa, total, used in _rows(
        f"SELECT node_id, uuid, {index_col}, name, problems, health, nvlink_peers, numa_node, "
        f"memory_total_mb, memory_used_mb FROM {t[GPU]} ORDER BY node_id, {index_col}"
    ):
        node = nodes.get(nid)
        if node is None:
            continue
        # Inline rather than through decode(): this loop runs once per GPU.
        key = nvlink if isinstance(nvlink, str) else json.dumps(nvlink)
        linked = peers.get(key)
        if linked is None:
            linked = peers[key] = frozenset(decode(nvlink, ()))
        # Degraded or failed (fleet.services.gpu_health): nothing new placed on it.
        healthy = health == "healthy" and (problems in ("[]", None) or not decode(problems, ()))
        node.gpus.append(GpuInfo(uuid, index, name, healthy, linked, numa, memory_mb=total or 0))
        used_mb[uuid] = used or 0
    for nid, fabric, hcas in _rows(f"SELECT node_id, fabric, hcas FROM {t[FabricAttachment]}"):
        if nid in nodes:
            nodes[nid].fabrics[fabric] = list(decode(hcas, ()))
    # Why an engine is missing, for the pending reason; only rows that are not installed.
    for nid, engine, version, state, detail, pct in _rows(
        f"SELECT node_id, engine, version, state, detail, progress_percent "
        f"FROM {t[EngineInstall]} WHERE state <> 'installed'"
    ):
        if nid in nodes:
            nodes[nid].installs[engine] = InstallInfo(state, version, detail, pct)
    # An entry whose removal is on the node's socket is not held: it is going
    # (fleet.services.weights_gc), and no shard that needs it is placed there
    # until the node has answered, or the answer is overdue.
    weights: dict[str, tuple[set, set, dict, list]] = {}
    overdue = time.time() - fleet_settings().weights_removal_timeout_s
    for nid, path, source, size, removal, removal_at in _rows(
        f"SELECT node_id, path, source, size_bytes, removal, removal_at FROM {t[LocalWeights]}"
    ):
        paths, sources, sizes, removing = weights.setdefault(nid, (set(), set(), {}, []))
        if removal == LocalWeights.Removal.SENT:
            at = unix_seconds(removal_at)
            if at is None or at > overdue:
                removing.append((path, source or ""))
                continue
        paths.add(path)
        sizes[path] = size
        if source:
            sources.add(source)
            sizes[source] = size
    for nid, (paths, sources, sizes, removing) in weights.items():
        node = nodes.get(nid)
        if node is not None:
            node.weights = frozenset(paths)
            node.weight_sources = frozenset(sources)
            node.weight_sizes = sizes
            node.removing = tuple(removing)
    # What a shard holds until its process is gone. One that was stopped before
    # it ever started (still pending) holds nothing.
    held = Shard.objects.filter(node__isnull=False).exclude(state__in=SHARD_FINISHED)
    held = held.exclude(desired_state=DesiredState.STOPPED, state=ShardState.PENDING)
    shares: dict[str, int] = {}  # GPU uuid -> MB promised to shares there
    # GPU uuid -> what those shares hold of their budget now, as their nodes measured it.
    holding: dict[str, int] = {}
    measured = dict(
        ShardLoad.objects.filter(
            sampled_at__gte=timezone.now() - LOAD_MAX_AGE, gpu_memory_mb__isnull=False
        ).values_list("shard_id", "gpu_memory_mb")
    )
    asleep: list[str] = []
    for (
        shard_id,
        nid,
        gpu_uuids,
        port,
        min_gb,
        share_gb,
        rank,
        spec,
        state,
        want,
    ) in held.values_list(
        "id",
        "node_id",
        "gpu_uuids",
        "port",
        "replica__profile__min_memory_gb",
        "replica__profile__gpu_memory_gb",
        "rank",
        "spec",
        "state",
        "desired_state",
    ):
        node = nodes.get(nid)
        if node is None:
            continue
        if state == ShardState.ASLEEP and want == DesiredState.ASLEEP:
            # Asleep (docs/operations.md, "Sleep and wake"): its port, and the host
            # memory its weights take at level 1; no GPU memory until it wakes.
            if port:
                node.used_ports.add(port)
            node.shards += 1
            asleep.append(shard_id)
            continue
        if share_gb:
            share = share_mb(share_gb)
            # Not yet measured: taken as holding all of it, as before it was measured.
            holds = min(share, measured.get(shard_id, share))
            for uuid in gpu_uuids or ():
                shares[uuid] = shares.get(uuid, 0) + share
                holding[uuid] = holding.get(uuid, 0) + holds
        else:
            node.used_gpus.update(gpu_uuids or ())
        if port:
            node.used_ports.add(port)
        if rank == 0 and (spec or {}).get("leader_port"):
            node.used_ports.add(spec["leader_port"])  # a multi-node replica's rendezvous
        node.promised_mb += (min_gb or 0) * MB_PER_GB
        node.shards += 1
    for node in nodes.values():
        for g in node.gpus:
            if g.uuid in node.used_gpus:
                continue
            # What the engines sharing it were promised is theirs, used or not. What
            # is used beyond what they hold of it belongs to processes llmgw did not
            # start (or to a shard over its budget): either way, not there to promise.
            g.promised_mb = shares.get(g.uuid, 0)
            g.other_mb = max(0, used_mb.get(g.uuid, 0) - holding.get(g.uuid, 0))
    if asleep:
        _asleep_memory(nodes, asleep)
    reserve_mb = share_mb(fleet_settings().gpu_memory_reserve_gb)
    return Snapshot(list(nodes.values()), default_port_range(), reserve_mb)


def _asleep_memory(nodes: dict[str, NodeInfo], shard_ids: list[str]) -> None:
    """The host memory sleeping shards hold, per node (``NodeInfo.asleep_mb``)."""
    # Few rows (the sleeping shards alone), so whole instances: the estimate's key
    # needs most of the profile.
    for s in Shard.objects.filter(pk__in=shard_ids).select_related("replica__profile"):
        node = nodes.get(s.node_id)
        if node is not None:
            node.asleep_mb += asleep_host_mb(
                s.replica.profile, s.spec or {}, bool(s.gpu_uuids), node
            )


def asleep_host_mb(profile, spec: dict, on_gpus: bool, node: NodeInfo | None = None) -> int:
    """The host memory (MB) a sleeping shard holds: at level 1, an engine that sleeps
    through its API keeps its weights there, by the model's estimate, else their size
    on the node where it knows it (0 where neither says). One that sleeps by stopping,
    or at level 2, holds none: the page cache gives way."""
    if spec.get("sleep_level") != 1 or not on_gpus or profile.engine == "llamacpp":
        return 0
    if estimated_bytes(profile):
        weights = profile.estimate.get("weights_bytes") or profile.estimate["total_bytes"]
    else:
        weights = (node.weight_sizes.get(profile.model_path) or 0) if node is not None else 0
    return math.ceil(weights / 10**6)


def estimated_bytes(profile) -> int:
    """What the profile's model needs by its estimate (0: none, or made from other inputs)."""
    found = profile.estimate or {}
    if found.get("total_bytes") and found.get("key") == estimate_key(profile):
        return found["total_bytes"]
    return 0


def layers_within(profile, share_mb_each: int) -> int | None:
    """For llama.cpp, the layers a budget of ``share_mb_each`` on each GPU holds: each
    offloaded layer brings its weights and its part of the KV cache. None: no estimate.

    A tenth of the budget is left for llama.cpp's compute buffers, which the
    headers do not state."""
    if not estimated_bytes(profile):
        return None
    found = profile.estimate
    layers = found["layers"]
    per_layer = found["layer_bytes"] + found["kv_bytes"] // max(1, layers)
    budget = share_mb_each * 2**20 * max(1, profile.gpus_per_node) * 0.9
    return max(0, min(layers, int(budget // max(1, per_layer))))


def cpu_kv_cache_gb(profile) -> int:
    """For vLLM on a CPU node, the GiB its KV cache may take (VLLM_CPU_KVCACHE_SPACE,
    whole GiB): the estimate's KV cache, or, where the operator reserved more memory
    (``min_memory_gb``), what the weights leave of it. 0: no estimate (vLLM's default)."""
    if not estimated_bytes(profile):
        return 0
    found = profile.estimate
    kv = math.ceil(found["kv_bytes"] / 2**30)
    if profile.min_memory_gb:
        left = (profile.min_memory_gb * 10**9 - found["weights_bytes"]) // 2**30
        kv = max(kv, left)
    return max(1, kv)


def request_for(model, profile, replica=None, prefer=()) -> Request:
    """What a replica of ``model`` on ``profile`` needs. ``replica`` adds its failure history."""
    avoid: tuple = ()
    if replica is not None and replica.node_failures:
        limit = fleet_settings().failures_before_moving
        avoid = tuple(sorted((n, c) for n, c in replica.node_failures.items() if c >= limit))
    min_memory_gb, min_gpu_mb = profile.min_memory_gb, 0
    if total := estimated_bytes(profile):
        # The estimate stands in for what the operator left blank.
        if not profile.gpus_per_node and min_memory_gb is None:
            min_memory_gb = math.ceil(total / 10**9)
        elif profile.gpus_per_node and not profile.gpu_memory_gb:
            min_gpu_mb = math.ceil(total / profile.gpus_total / 2**20)
    return Request(
        model=model.name,
        engine=profile.engine,
        gpus_per_node=profile.gpus_per_node,
        gpu_memory_mb=share_mb(profile.gpu_memory_gb),
        nodes=profile.nodes,
        tp=profile.tp,
        gpu_class=profile.gpu_class,
        min_memory_gb=min_memory_gb,
        min_gpu_mb=min_gpu_mb,
        selector=tuple(parse_selector(profile.node_selector)),
        selector_text=profile.node_selector,
        model_path=profile.model_path,
        policy=model.placement_policy,
        avoid=avoid,
        prefer=tuple(prefer),
    )


class ExplainError(LookupError):
    """The model or profile to explain does not exist. The message names it."""


class NoActiveProfile(ExplainError):
    """The model exists but has no active profile, and none was named."""


@dataclass
class Explanation:
    model: str
    profile: str
    summary: str  # the profile's needs, in a line
    verdicts: list[Verdict]
    choice: str  # where a new replica would go, or why nowhere
    placement: Placement | None

    def lines(self) -> list[str]:
        return [
            f"model {self.model}, profile {self.profile}: {self.summary}",
            f"a new replica: {self.choice}",
            *(v.text for v in self.verdicts),
        ]

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "profile": self.profile,
            "summary": self.summary,
            "choice": self.choice,
            "placement": [
                {"node": s.node_id, "rank": s.rank, "gpus": list(s.gpu_uuids), "port": s.port}
                for s in (self.placement.shards if self.placement else ())
            ],
            "nodes": [{"node": v.node_id, "fits": v.fits, "reason": v.text} for v in self.verdicts],
        }


def _needs(model, profile) -> str:
    parts = [profile.engine]
    if profile.gpus_per_node:
        gpu = f"{profile.gpus_per_node} {profile.gpu_class or ''} GPU(s)".replace("  ", " ")
        if profile.gpu_memory_gb:
            gpu += f" with {profile.gpu_memory_gb:g} GB of each"
        parts.append(f"{gpu} on each of {profile.nodes} node(s)" if profile.nodes > 1 else gpu)
    else:
        parts.append("CPU")
    if profile.min_memory_gb:
        parts.append(f"{profile.min_memory_gb} GB of memory")
    if profile.node_selector:
        parts.append(f"nodes matching '{profile.node_selector}'")
    parts.append(f"policy {model.placement_policy}")
    text = ", ".join(parts)
    return f"{text}; {profile_text(profile)}"


def explain_model(model_name: str, profile_name: str | None = None) -> Explanation:
    """Every node and why it could run a new replica of the model, or not.

    ``profile_name`` asks "what if" with another of the model's profiles.
    """
    from fleet.models import EngineProfile, Model

    model = Model.objects.select_related("active_profile").filter(name=model_name).first()
    if model is None:
        raise ExplainError(f"no model '{model_name}'")
    if profile_name is None:
        profile = model.active_profile
        if profile is None:
            raise NoActiveProfile(f"model '{model_name}' has no active profile; name one")
    else:
        profile = EngineProfile.objects.filter(model=model, name=profile_name).first()
        if profile is None:
            names = ", ".join(model.profiles.values_list("name", flat=True)) or "none"
            raise ExplainError(
                f"model '{model_name}' has no profile '{profile_name}' (it has: {names})"
            )
    snap = build()
    req = request_for(model, profile)
    verdicts, result = explain(snap, req)
    over = None
    if model.team_id is not None:
        from .teams import Holdings

        over = Holdings.now(snap).refusal(
            model.team_id, req, None if isinstance(result, NoPlacement) else result
        )
    if over:
        choice, chosen = f"cannot be placed: {over}", None
    elif isinstance(result, NoPlacement):
        choice, chosen = f"cannot be placed: {result.summary}", None
    else:
        where = ", ".join(
            f"{s.node_id} (port {s.port}"
            + (f", {len(s.gpu_uuids)} GPUs" if s.gpu_uuids else "")
            + ")"
            for s in result.shards
        )
        choice, chosen = f"would go to {where}", result
    return Explanation(model.name, profile.name, _needs(model, profile), verdicts, choice, chosen)
