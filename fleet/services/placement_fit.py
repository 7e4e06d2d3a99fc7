"""Whether a node can take a replica's shard, and if not, why, in an operator's words.

Two kinds of reason: ``static_reason``, what the node is (its state, labels,
memory, engines, GPUs), the same all pass long; and ``dynamic_reason``, what
this pass has taken of it so far (GPUs or shares of them, memory promised,
ports). ``choose_gpus`` picks the GPUs a shard gets: an NVLink-connected set for
tensor parallelism where one exists, one NUMA node otherwise. Pure, like
``placement``, which walks the nodes and decides: this module changes when a
new constraint on where a shard may run does, or its wording.
"""

from __future__ import annotations

from . import weight_names
from .placement_types import BINPACK, GpuInfo, NodeInfo, Reason, Request
from .units import MIB_PER_GIB, gb_text


def static_reason(node: NodeInfo, req: Request) -> Reason | None:
    """Why this node can never take the request as things stand: its state, labels, memory,
    engines and GPUs, whatever this pass has taken (``Snapshot`` caches it per profile)."""
    nid = node.id
    if node.state != "ready":
        return Reason(nid, "state", f"{nid}: is {node.state} (silent)")
    if not node.connected:
        return Reason(nid, "connected", f"{nid}: no agent connected")
    if node.draining:
        return Reason(nid, "cordoned", f"{nid}: draining")
    if node.cordoned:
        return Reason(nid, "cordoned", f"{nid}: cordoned")
    for r in req.selector:
        if not r.matches(node.labels):
            return Reason(
                nid, "selector", f"{nid}: labels do not match '{r}' of '{req.selector_text}'"
            )
    if req.min_memory_gb and node.memory_mb is not None and node.memory_mb < req.need_mb:
        return Reason(
            nid,
            "memory",
            f"{nid}: has {gb_text(node.memory_mb)} GB of memory, needs {req.min_memory_gb}",
        )
    if req.min_memory_gb and node.asleep_mb and node.memory_mb is not None:
        if node.memory_mb - node.asleep_mb < req.need_mb:
            return Reason(
                nid,
                "memory",
                f"{nid}: {gb_text(node.asleep_mb)} of {gb_text(node.memory_mb)} GB host memory "
                f"held by sleeping replicas, needs {req.min_memory_gb}",
            )
    if req.engine not in node.engines:
        return Reason(nid, "engine", engine_missing(node, req.engine))
    if req.gpus_per_node:
        gpus = _class_gpus(node, req)
        if req.gpu_class and not gpus:
            return Reason(nid, "gpu_class", f"{nid}: has no {req.gpu_class} GPU")
        healthy = [g for g in gpus if g.healthy]
        if len(healthy) < req.gpus_per_node:
            sick = len(gpus) - len(healthy)
            with_problems = f" ({sick} with problems)" if sick else ""
            return Reason(
                nid,
                "gpus",
                f"{nid}: has {len(gpus)} GPUs{with_problems}, needs {req.gpus_per_node} healthy",
            )
        big = sum(1 for g in healthy if g.memory_mb >= req.min_gpu_mb)
        if big < req.gpus_per_node:
            most = max(g.memory_mb for g in healthy) / MIB_PER_GIB
            need = req.min_gpu_mb / MIB_PER_GIB
            return Reason(
                nid,
                "gpu_memory",
                f"{nid}: its GPUs have at most {most:.1f} GB, needs {need:.1f} on each of "
                f"{req.gpus_per_node} (the model's estimate)",
            )
    return None


def engine_missing(node: NodeInfo, engine: str) -> str:
    """Why a node does not offer an engine, as the agent's install state says."""
    nid = node.id
    if engine == "vllm" and node.vllm_build == "none":
        return f"{nid}: vllm build is none"
    got = node.installs.get(engine)
    if got is None:
        return f"{nid}: engine '{engine}' is not installed"
    name = f"{engine} {got.version}".strip()
    first = got.detail.splitlines()[0] if got.detail else ""
    if got.state == "installing":
        extra = [first] if first else []
        if got.progress_percent is not None:
            extra.append(f"{got.progress_percent} %")
        more = f" ({', '.join(extra)})" if extra else ""
        return f"{nid}: {name} is installing{more}"
    if got.state == "failed":
        return f"{nid}: {name} failed to install: {first or 'no detail'}"
    if got.state == "unsupported":
        return f"{nid}: {engine} is unsupported here: {first or 'no detail'}"
    return f"{nid}: engine '{engine}' is {got.state}"


def _class_gpus(node: NodeInfo, req: Request) -> list[GpuInfo]:
    if not req.gpu_class:
        return node.gpus
    # A node's GPUs never change within a snapshot; only which are used does.
    got = node.by_class.get(req.gpu_class)
    if got is None:
        want = req.gpu_class.lower()
        got = node.by_class[req.gpu_class] = [g for g in node.gpus if want in g.name.lower()]
    return got


def _open_gpus(node: NodeInfo, req: Request, reserve_mb: int) -> list[GpuInfo]:
    """The healthy GPUs a shard of ``req`` could have, best first.

    Whole GPUs: those nothing uses. A share: those not held whole with room for it;
    packing takes GPUs already shared first, the fullest first, so whole GPUs stay
    free for the models that need them; spreading, the most room first.
    """
    held = node.used_gpus
    gpus = [g for g in _class_gpus(node, req) if g.healthy and g.uuid not in held]
    need = req.gpu_memory_mb
    if not need:
        return [g for g in gpus if not g.promised_mb and g.memory_mb >= req.min_gpu_mb]
    gpus = [g for g in gpus if g.room_mb(reserve_mb) >= need]
    if req.policy == BINPACK:
        gpus.sort(key=lambda g: (not g.promised_mb, g.room_mb(reserve_mb), g.index))
    else:
        gpus.sort(key=lambda g: (-g.room_mb(reserve_mb), g.index))
    return gpus


def choose_gpus(
    node: NodeInfo, req: Request, reserve_mb: int
) -> tuple[tuple[str, ...], bool] | None:
    """GPUs for one shard (``_open_gpus``), an NVLink-connected set when one exists."""
    n = req.gpus_per_node
    free = _open_gpus(node, req, reserve_mb)
    if len(free) < n:
        return None
    if n == 1:
        return (free[0].uuid,), False
    # Tensor parallelism all-reduces every layer: a set where each GPU links to
    # every other is worth much more than PCIe. Greedy from each start is enough
    # at eight GPUs a node.
    for start in free:
        chosen = [start]
        for g in free:
            if g is start:
                continue
            if all(g.index in c.nvlink_peers and c.index in g.nvlink_peers for c in chosen):
                chosen.append(g)
                if len(chosen) == n:
                    return tuple(c.uuid for c in chosen), True
    # No linked set: keep to one NUMA node where possible (a share: in packing order).
    if req.gpu_memory_mb:
        return tuple(g.uuid for g in free[:n]), False
    free.sort(key=lambda g: (g.numa_node is None, g.numa_node or 0, g.index))
    return tuple(g.uuid for g in free[:n]), False


def free_port(node: NodeInfo, default_range: tuple[int, int]) -> int | None:
    """The lowest port of the node's range (its label's, else ``default_range``) that
    nothing holds."""
    lo, hi = node.port_range or default_range
    for port in range(lo, hi + 1):
        if port not in node.used_ports:
            return port
    return None


def dynamic_reason(
    node: NodeInfo, req: Request, port_range: tuple[int, int], reserve_mb: int
) -> Reason | None:
    """Why this node cannot take the request now, with what this pass has taken so far:
    GPUs, memory promised to other shards, ports."""
    nid = node.id
    if req.gpu_memory_mb:
        reason = _share_reason(node, req, reserve_mb)
        if reason is not None:
            return reason
    elif req.gpus_per_node:
        free = len(_open_gpus(node, req, reserve_mb))
        if free < req.gpus_per_node:
            return Reason(nid, "gpus", f"{nid}: has {free} free GPUs, needs {req.gpus_per_node}")
    if req.min_memory_gb and node.memory_mb is not None and node.promised_mb:
        left = node.memory_mb - node.promised_mb
        if left < req.need_mb:
            return Reason(
                nid,
                "memory",
                f"{nid}: has {gb_text(node.memory_mb)} GB of memory, "
                f"{gb_text(node.promised_mb)} GB promised to other shards, "
                f"needs {req.min_memory_gb}",
            )
    if free_port(node, port_range) is None:
        lo, hi = node.port_range or port_range
        if lo > hi:
            return Reason(nid, "ports", f"{nid}: its port range label is not LO-HI")
        return Reason(nid, "ports", f"{nid}: no free port in {lo}-{hi}")
    return None


def gpu_gb(mib: int) -> str:
    """GPU memory (MiB, as NVML counts it) in GB of 1,024 MiB, to a tenth."""
    return f"{mib / MIB_PER_GIB:.1f}"


def _share_reason(node: NodeInfo, req: Request, reserve_mb: int) -> Reason | None:
    """Why this node's GPUs have no room for a share of ``req``, naming the nearest GPU."""
    nid, n, need = node.id, req.gpus_per_node, req.gpu_memory_mb
    fitting = len(_open_gpus(node, req, reserve_mb))
    if fitting >= n:
        return None
    held = node.used_gpus
    rest = [
        g
        for g in _class_gpus(node, req)
        if g.healthy and g.uuid not in held and g.room_mb(reserve_mb) < need
    ]
    lead = f"{nid}: {fitting} of the {n} GPUs needed have room; " if fitting else ""
    if not rest:
        every = "every other GPU" if fitting else "every GPU"
        return Reason(nid, "gpus", f"{lead}{nid}: {every} is held whole")
    g = max(rest, key=lambda g: (g.room_mb(reserve_mb), -g.index))
    return Reason(
        nid,
        "gpu_memory",
        f"{lead}{nid} GPU {g.index}: {gpu_gb(g.promised_mb)} of {gpu_gb(g.memory_mb)} GB "
        f"promised, {gpu_gb(g.other_mb)} GB used by other processes, {gpu_gb(reserve_mb)} GB "
        f"reserved, needs {gpu_gb(need)}",
    )


def removing_reason(node: NodeInfo, req: Request) -> Reason | None:
    """A clean-up removal of these weights is on the node's socket: no shard needing them
    goes there until the node has answered (fleet.services.weights_gc.delivery)."""
    if node.removing and req.model_path:
        wanted = weight_names.Wanted([req.model_path])
        if any(wanted.serves(path, source) for path, source in node.removing):
            nid = node.id
            return Reason(nid, "weights", f"{nid}: is removing these weights (reply awaited)")
    return None
