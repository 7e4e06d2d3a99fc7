"""Placement: where a replica can run, and why not elsewhere.

A pure function of an inventory snapshot and a request: no database, no clock.
The reconciler builds the snapshot once per pass (``fleet.services.snapshot``),
asks for each replica it needs, and commits each answer into the snapshot so the
next answer sees the GPUs and ports already taken.

Every node that cannot take the request gets a reason naming what was short,
because "gpu-07: has 8 GB of memory, needs 24" is actionable where "no
candidates" is not; the reasons, and the GPUs a shard gets, are
``placement_fit``'s. This module walks the nodes and chooses among those that
fit: the policy, the weights already held, groups over a fabric.
"""

from __future__ import annotations

from agentd.ports import DEFAULT_PORT_RANGE

from . import placement_fit, weight_names
from .placement_types import (
    BINPACK,
    NodeInfo,
    NoPlacement,
    Placement,
    Reason,
    Request,
    ShardPlacement,
    Verdict,
)
from .units import size_text


class Snapshot:
    """The inventory at one moment, with an index that keeps each decision cheap.

    Nodes are bucketed by free healthy GPUs, so binpack walks up from the GPUs
    needed and spread walks down from the most free, and both stop at the
    first node that fits instead of scoring the whole fleet.
    """

    def __init__(
        self,
        nodes: list[NodeInfo],
        port_range: tuple[int, int] = DEFAULT_PORT_RANGE,
        gpu_reserve_mb: int = 1024,
    ):
        self.nodes: dict[str, NodeInfo] = {n.id: n for n in nodes}
        self.port_range = port_range
        # Memory of each GPU never promised to shares (LLMGW_GPU_MEMORY_RESERVE_GB).
        self.gpu_reserve_mb = gpu_reserve_mb
        self.max_gpus = max((len(n.gpus) for n in nodes), default=0)
        self._buckets: list[dict[str, None]] = [{} for _ in range(self.max_gpus + 1)]
        self._free: dict[str, int] = {}
        for n in nodes:
            free = n.free_gpus
            self._free[n.id] = free
            self._buckets[free][n.id] = None
        self._static: dict[tuple, dict[str, Reason | None]] = {}
        self._weights: dict[str, set[str]] | None = None

    def free(self, node_id: str) -> int:
        return self._free[node_id]

    def commit(self, placement: Placement, request: Request) -> None:
        """Take what a placement uses, so later decisions see it."""
        for s in placement.shards:
            node = self.nodes[s.node_id]
            _hold_gpus(node, s.gpu_uuids, request.gpu_memory_mb)
            node.used_ports.add(s.port)
            node.promised_mb += request.need_mb
            node.shards += 1
            self._rebucket(node)

    def release(
        self, node_id: str, gpu_uuids, port: int | None, need_mb: int, gpu_memory_mb: int = 0
    ) -> None:
        """Give back what a shard held (it is being stopped in this pass)."""
        node = self.nodes.get(node_id)
        if node is None:
            return
        _hold_gpus(node, gpu_uuids, -gpu_memory_mb, give_back=True)
        node.used_ports.discard(port)
        node.promised_mb = max(0, node.promised_mb - need_mb)
        node.shards = max(0, node.shards - 1)
        self._rebucket(node)

    def _rebucket(self, node: NodeInfo) -> None:
        free = node.free_gpus
        old = self._free[node.id]
        if free != old:
            del self._buckets[old][node.id]
            self._buckets[free][node.id] = None
            self._free[node.id] = free

    def weight_holders(self, model_path: str) -> set[str]:
        if not model_path:
            return set()
        if self._weights is None:
            self._weights = _weights_index(self.nodes.values())
        return self._weights.get(model_path.strip("/"), set())

    def static_reason(self, node: NodeInfo, req: Request) -> Reason | None:
        """Why this node can never take the request as things stand (cached per profile shape)."""
        cache = self._static.setdefault(req.static_key, {})
        if node.id in cache:
            return cache[node.id]
        reason = placement_fit.static_reason(node, req)
        cache[node.id] = reason
        return reason

    def dynamic_reason(self, node: NodeInfo, req: Request) -> Reason | None:
        """Why this node cannot take the request with what this pass has taken so far."""
        return placement_fit.dynamic_reason(node, req, self.port_range, self.gpu_reserve_mb)


def _hold_gpus(node: NodeInfo, uuids, share_mb: int, give_back: bool = False) -> None:
    """Whole GPUs taken (or given back), or ``share_mb`` promised on each of them."""
    if not share_mb:
        if give_back:
            node.used_gpus.difference_update(uuids)
        else:
            node.used_gpus.update(uuids)
        return
    wanted = set(uuids)
    for g in node.gpus:
        if g.uuid in wanted:
            g.promised_mb = max(0, g.promised_mb + share_mb)


def _weights_index(nodes) -> dict[str, set[str]]:
    """Which nodes hold what, by every name a profile's model_path could use for it
    (``weight_names``): each trailing run of a path's components, the hub cache's
    name, and a fetched entry's source."""
    index: dict[str, set[str]] = {}
    for node in nodes:
        for path in node.weights:
            for key in weight_names.names(path):
                index.setdefault(key, set()).add(node.id)
        for source in node.weight_sources:
            index.setdefault(source.strip("/"), set()).add(node.id)
    return index


def reason_for(snapshot: Snapshot, node: NodeInfo, req: Request) -> Reason | None:
    """The first thing that keeps this node from taking the request, or None."""
    reason = (
        snapshot.static_reason(node, req)
        or snapshot.dynamic_reason(node, req)
        or placement_fit.removing_reason(node, req)
    )
    failed = req.avoided.get(node.id)
    if reason is None and failed:
        reason = Reason(node.id, "avoid", f"{node.id}: this replica failed here {failed} times")
    return reason


def _shard_on(node: NodeInfo, req: Request, snapshot: Snapshot, rank: int, hcas=()):
    gpus: tuple[str, ...] = ()
    nvlink = False
    if req.gpus_per_node:
        chosen = placement_fit.choose_gpus(node, req, snapshot.gpu_reserve_mb)
        if chosen is None:
            return None
        gpus, nvlink = chosen
    port = placement_fit.free_port(node, snapshot.port_range)
    if port is None:
        return None
    return ShardPlacement(node.id, rank, gpus, port, tuple(hcas), nvlink)


def _fits(snapshot: Snapshot, node: NodeInfo, req: Request, avoid: bool) -> bool:
    if snapshot.static_reason(node, req) is not None:
        return False
    if avoid and node.id in req.avoided:
        return False
    if snapshot.dynamic_reason(node, req) is not None:
        return False
    return placement_fit.removing_reason(node, req) is None


def _policy_key(snapshot: Snapshot, node: NodeInfo, req: Request):
    # Smaller is better. Binpack fills the busiest node that fits; spread the emptiest.
    load = snapshot.free(node.id) if req.gpus_per_node else -node.shards
    return load if req.policy == BINPACK else -load


def place(snapshot: Snapshot, req: Request) -> Placement | NoPlacement:
    """Where a replica of ``req`` should run, or why it cannot run anywhere.

    Preference, in order: the nodes the replica ran on (a restart), nodes that
    already hold the weights, an NVLink-connected GPU set for tensor
    parallelism, then the policy (binpack or spread). Nodes the replica failed
    on too often are used only when nothing else fits.
    """
    if req.nodes > 1:
        return _place_multi(snapshot, req)
    for avoid in (True, False) if req.avoid else (True,):
        shard = _place_single(snapshot, req, avoid)
        if shard is not None:
            holds = shard.node_id in snapshot.weight_holders(req.model_path)
            return Placement((shard,), holds_weights=holds)
    return _no_placement(snapshot, req)


def _place_single(snapshot: Snapshot, req: Request, avoid: bool) -> ShardPlacement | None:
    nodes = snapshot.nodes
    for nid in req.prefer:
        node = nodes.get(nid)
        if node is not None and _fits(snapshot, node, req, avoid):
            return _shard_on(node, req, snapshot, 0)

    holders = [
        nodes[nid]
        for nid in snapshot.weight_holders(req.model_path)
        if _fits(snapshot, nodes[nid], req, avoid)
    ]
    if holders:
        best = min(holders, key=lambda n: _rank(snapshot, n, req))
        return _shard_on(best, req, snapshot, 0)

    if not req.gpus_per_node or req.gpu_memory_mb:
        # CPU, or a share of GPUs: the free-GPU buckets do not say where a share fits.
        fitting = [n for n in nodes.values() if _fits(snapshot, n, req, avoid)]
        if not fitting:
            return None
        return _shard_on(min(fitting, key=lambda n: _rank(snapshot, n, req)), req, snapshot, 0)

    want_nvlink = req.gpus_per_node > 1
    fallback = None
    counts = range(req.gpus_per_node, snapshot.max_gpus + 1)
    for free in counts if req.policy == BINPACK else reversed(counts):
        for nid in snapshot._buckets[free]:
            node = nodes[nid]
            if not _fits(snapshot, node, req, avoid):
                continue
            shard = _shard_on(node, req, snapshot, 0)
            if shard is None:
                continue
            if shard.nvlink or not want_nvlink:
                return shard
            fallback = fallback or shard
    return fallback


def _rank(snapshot: Snapshot, node: NodeInfo, req: Request):
    nvlink = False
    if req.gpus_per_node > 1:
        chosen = placement_fit.choose_gpus(node, req, snapshot.gpu_reserve_mb)
        nvlink = bool(chosen and chosen[1])
    return (not nvlink, _policy_key(snapshot, node, req), node.id)


# Engines whose ranks talk over plain TCP on the management network (llama.cpp's
# RPC): their groups need no fabric and no HCAs.
OVER_TCP = frozenset({"llamacpp"})
MGMT = "the management network"


def _place_multi(snapshot: Snapshot, req: Request) -> Placement | NoPlacement:
    """A replica over several nodes: all on one fabric, each with HCAs on it (or, for
    an engine in OVER_TCP, any nodes that fit)."""
    by_fabric: dict[str, list[NodeInfo]] = {}
    reasons: list[Reason] = []
    tcp = req.engine in OVER_TCP
    for node in snapshot.nodes.values():
        reason = reason_for(snapshot, node, req)
        if reason is not None and reason.kind == "avoid":
            reason = None  # a last resort: ranked after every other node below
        if reason is None and tcp:
            by_fabric.setdefault("", []).append(node)
            continue
        if reason is None and not node.fabrics:
            reason = Reason(node.id, "fabric", f"{node.id}: is on no fabric")
        if reason is None and not any(node.fabrics.values()):
            reason = Reason(node.id, "fabric", f"{node.id}: has no HCAs on its fabrics")
        if reason is not None:
            reasons.append(reason)
            continue
        for fabric, hcas in node.fabrics.items():
            if hcas:
                by_fabric.setdefault(fabric, []).append(node)
    holders = snapshot.weight_holders(req.model_path)
    options = []
    for fabric, members in by_fabric.items():
        if len(members) < req.nodes:
            continue
        members.sort(
            key=lambda n: (
                req.avoided.get(n.id, 0),
                n.id not in holders,
                *_rank(snapshot, n, req),
            )
        )
        chosen = members[: req.nodes]
        held = sum(n.id in holders for n in chosen)
        options.append((-held, _rank(snapshot, chosen[0], req), fabric, chosen))
    if not options:
        need = f"needs {req.nodes} nodes{_each(req)}"
        if tcp:
            extra = f"{need} on {MGMT}: {len(by_fabric.get('', []))} found"
        elif by_fabric:
            most = max(len(m) for m in by_fabric.values())
            where = ", ".join(f for f, m in sorted(by_fabric.items()) if len(m) == most)
            extra = f"{need} on one fabric: {most} found on {where}"
        else:
            extra = f"{need} on one fabric: none found"
        return NoPlacement(tuple(reasons), len(snapshot.nodes), extra)
    held, _, fabric, chosen = min(options)
    shards = []
    for rank, node in enumerate(chosen):
        shard = _shard_on(node, req, snapshot, rank, node.fabrics.get(fabric, ()))
        if shard is None:  # cannot happen: every member fitted a moment ago
            return NoPlacement(tuple(reasons), len(snapshot.nodes), f"{node.id} stopped fitting")
        shards.append(shard)
    return Placement(tuple(shards), fabric=fabric, holds_weights=held < 0)


def _each(req: Request) -> str:
    """What each node of a group must have, as the reason says it: " with 2 GPUs of 24 GB
    each"."""
    if req.gpus_per_node:
        gpus = f"{req.gpus_per_node} GPU" + ("s" if req.gpus_per_node > 1 else "")
        mb = req.gpu_memory_mb or req.min_gpu_mb
        return f" with {gpus}" + (f" of {mb / 1024:.3g} GB" if mb else "") + " each"
    if req.min_memory_gb:
        return f" with {req.min_memory_gb} GB of memory each"
    return ""


def _no_placement(snapshot: Snapshot, req: Request) -> NoPlacement:
    reasons = []
    for node in snapshot.nodes.values():
        reason = reason_for(snapshot, node, req)
        if reason is not None:
            reasons.append(reason)
    return NoPlacement(tuple(reasons), len(snapshot.nodes))


def explain(snapshot: Snapshot, req: Request) -> tuple[list[Verdict], Placement | NoPlacement]:
    """Every node with why it fits or not, and what ``place`` would choose."""
    holders = snapshot.weight_holders(req.model_path)
    verdicts = []
    for node in sorted(snapshot.nodes.values(), key=lambda n: n.id):
        reason = reason_for(snapshot, node, req)
        if reason is not None:
            verdicts.append(Verdict(node.id, False, reason.text))
            continue
        notes = []
        if req.gpu_memory_mb:
            reserve = snapshot.gpu_reserve_mb
            gpus, _ = placement_fit.choose_gpus(node, req, reserve)
            by_uuid = {g.uuid: g for g in node.gpus}
            for u in gpus:
                room = placement_fit.gpu_gb(by_uuid[u].room_mb(reserve))
                notes.append(f"GPU {by_uuid[u].index}: {room} GB left")
        elif req.gpus_per_node:
            gpus, nvlink = placement_fit.choose_gpus(node, req, snapshot.gpu_reserve_mb)
            notes.append(f"{snapshot.free(node.id)} free GPUs")
            if len(gpus) > 1:
                notes.append("an NVLink-connected set" if nvlink else "no NVLink-connected set")
        if node.memory_mb is None:
            notes.append("memory not reported")
        if node.id in holders:
            notes.append("holds the weights")
        elif weight_names.is_fetched(req.model_path):
            size = fetch_size(snapshot, req.model_path)
            notes.append(f"would fetch {size_text(size)}" if size else "would fetch the weights")
        verdicts.append(Verdict(node.id, True, f"{node.id}: fits ({', '.join(notes) or 'CPU'})"))
    return verdicts, place(snapshot, req)


def fetch_size(snapshot: Snapshot, model_path: str) -> int | None:
    """The size of ``model_path``'s weights where another node has fetched them, else None."""
    for node in snapshot.nodes.values():
        size = node.weight_sizes.get(model_path)
        if size is not None and model_path in node.weight_sources:
            return size
    return None
