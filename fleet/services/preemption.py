"""Which replicas of lower priority make room for one that fits nowhere: a pure function.

The reconciler asks when a replica of a model with a priority finds no node
(``reconciler.placing``). The answer is one node and the fewest replicas on it
whose removal lets placement put the replica there, of the lowest priorities
among the sets of that size; never a replica of equal or higher priority. The
node is judged by placement itself on a copy of it with those replicas' GPUs
given back, so every other rule (engine, labels, weights, NVLink) still holds.

Teams (docs/security.md, "Teams"): a replica may take the place of its own
team's replicas and the fleet's (no team), but of another team's only while that
team holds more GPU memory than it is guaranteed (``Team.guaranteed_gpu_memory_gb``),
and only what it borrowed: each of that team's victims but the last is taken
while the team is still above its guarantee.
"""

import copy
import itertools
from dataclasses import dataclass

from .placement import Snapshot, place
from .placement_types import NodeInfo, NoPlacement, Placement, Request

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
    team_id: int | None = None  # its model's team; None: the fleet's
    memory_mb: int = 0  # GPU memory it holds, all GPUs together (MiB)


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


def takeable(h: Holder, team_id: int | None, borrowed: dict[int, int]) -> bool:
    """Whether a replica of team ``team_id`` may take ``h``'s place, by team alone: the
    fleet's and its own team's, and another team's while that team borrows."""
    return h.team_id is None or h.team_id == team_id or borrowed.get(h.team_id, 0) > 0


def within_borrowed(victims, team_id: int | None, borrowed: dict[int, int]) -> bool:
    """Whether ``victims`` take back from each other team only what it borrowed: all of
    that team's but the last are gone before it is down to its guarantee."""
    taken: dict[int, list[int]] = {}
    for v in victims:
        if v.team_id is not None and v.team_id != team_id:
            taken.setdefault(v.team_id, []).append(v.memory_mb)
    return all(sum(mb) - max(mb) < borrowed.get(t, 0) for t, mb in taken.items())


def choose_victims(
    snap: Snapshot,
    req: Request,
    priority: int,
    holders: list[Holder],
    team_id: int | None = None,
    borrowed: dict[int, int] | None = None,
    order: dict[str, tuple] | None = None,
) -> Room | None:
    """The fewest replicas of lower priority than ``priority``, all on one node, whose
    removal lets ``req`` (of team ``team_id``) be placed there; None when no such set
    exists. ``borrowed``: by team, the GPU memory (MiB) it holds above its guarantee;
    a team not in it borrows nothing, and its replicas are not taken. ``order``: by
    replica, the key candidates are taken in (default: priority), and sets of one size
    are preferred in; sleep passes least recently used first."""
    borrowed = borrowed or {}
    by_node: dict[str, list[Holder]] = {}
    for h in holders:
        if (
            h.priority < priority
            and h.node_id in snap.nodes
            and h.gpu_uuids
            and takeable(h, team_id, borrowed)
        ):
            by_node.setdefault(h.node_id, []).append(h)
    viable = {}
    for node_id, found in by_node.items():
        found.sort(key=lambda h: (order or {}).get(h.replica_id) or (h.priority, h.replica_id))
        found = found[:MOST_CANDIDATES]
        # Not even all of them together would do: nothing to search here.
        if _fits(snap, snap.nodes[node_id], req, found) is not None:
            viable[node_id] = found
    for size in range(1, MOST_VICTIMS + 1):
        best = None
        for node_id, found in sorted(viable.items()):
            for victims in itertools.combinations(found, size):
                rank = (max(v.priority for v in victims), sum(v.priority for v in victims))
                if order:
                    rank = (*rank, max(order[v.replica_id] for v in victims))
                if best is not None and rank >= best[0]:
                    continue
                if not within_borrowed(victims, team_id, borrowed):
                    continue
                fit = _fits(snap, snap.nodes[node_id], req, victims)
                if fit is not None:
                    best = (rank, Room(node_id, victims, fit))
        if best is not None:
            return best[1]
    return None
