"""Which replicas of lower priority make room for one that fits nowhere: a pure function.

The reconciler asks when a replica of a model with a priority finds no node
(``reconciler.placing``). The answer is one node and the fewest replicas on it
whose removal lets placement put the replica there, of the lowest priorities
among the sets of that size; never a replica of equal or higher priority. The
node is judged by placement itself on a copy of it with those replicas' GPUs
given back, so every other rule (engine, labels, weights, NVLink) still holds.
"""

import copy
import itertools
from dataclasses import dataclass

from .placement import NoPlacement, Placement, Snapshot, place
from .placement_types import NodeInfo, Request

# Sets of more replicas than this are not searched: making room that way would
# stop a good part of a node for one replica.
MOST_VICTIMS = 4
# Per node, the candidates of lowest priority considered (the search is over their sets).
MOST_CANDIDATES = 12


@dataclass(frozen=True)
class Holder:
    """A running replica of one node that could be preempted."""

    replica_id: str
    model: str
    priority: int
    node_id: str
    gpu_uuids: tuple[str, ...]
    share_mb: int = 0  # its budget on each GPU; 0: it holds them whole


@dataclass(frozen=True)
class Room:
    node_id: str
    victims: tuple[Holder, ...]
    placement: Placement


def _without(node: NodeInfo, victims) -> NodeInfo:
    """The node as it will be once the victims' shards are gone."""
    freed = copy.deepcopy(node)
    for v in victims:
        if v.share_mb:
            for g in freed.gpus:
                if g.uuid in v.gpu_uuids:
                    g.promised_mb = max(0, g.promised_mb - v.share_mb)
        else:
            freed.used_gpus.difference_update(v.gpu_uuids)
        freed.shards = max(0, freed.shards - 1)
    return freed


def _fits(snap: Snapshot, node: NodeInfo, req: Request, victims) -> Placement | None:
    alone = Snapshot([_without(node, victims)], snap.port_range, snap.gpu_reserve_mb)
    result = place(alone, req)
    return None if isinstance(result, NoPlacement) else result


def choose_victims(
    snap: Snapshot, req: Request, priority: int, holders: list[Holder]
) -> Room | None:
    """The fewest replicas of lower priority than ``priority``, all on one node, whose
    removal lets ``req`` be placed there; None when no such set exists."""
    by_node: dict[str, list[Holder]] = {}
    for h in holders:
        if h.priority < priority and h.node_id in snap.nodes and h.gpu_uuids:
            by_node.setdefault(h.node_id, []).append(h)
    viable = {}
    for node_id, found in by_node.items():
        found.sort(key=lambda h: (h.priority, h.replica_id))
        found = found[:MOST_CANDIDATES]
        # Not even all of them together would do: nothing to search here.
        if _fits(snap, snap.nodes[node_id], req, found) is not None:
            viable[node_id] = found
    for size in range(1, MOST_VICTIMS + 1):
        best = None
        for node_id, found in sorted(viable.items()):
            for victims in itertools.combinations(found, size):
                rank = (max(v.priority for v in victims), sum(v.priority for v in victims))
                if best is not None and rank >= best[0]:
                    continue
                fit = _fits(snap, snap.nodes[node_id], req, victims)
                if fit is not None:
                    best = (rank, Room(node_id, victims, fit))
        if best is not None:
            return best[1]
    return None
