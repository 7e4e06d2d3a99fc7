"""Placing a pass's replicas: placement's decisions turned into shards on nodes.

A mixin of the pass (``passes._Pass``): it reads the pass's replicas and
models, and writes through its gathered writes, so the whole pass is still one
transaction. The decisions themselves are ``fleet.services.placement``'s, a
pure function of the snapshot.
"""

import logging
import math
from datetime import timedelta

from fleet.conf import fleet_settings
from fleet.models import (
    SHARD_FINISHED,
    DesiredState,
    Event,
    EventKind,
    Node,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)

from .. import placement, placement_fit, preemption, teams
from .. import snapshot as snapshots
from ..placement_types import NoPlacement, Placement
from ..units import MIB_PER_GIB

logger = logging.getLogger(__name__)


class Placing:
    def place_all(self) -> None:
        todo = [
            r
            for r in self.to_place.values()
            if r.state not in (ReplicaState.STOPPED, ReplicaState.DRAINING)
        ]
        if not todo:
            return
        # Higher priorities first: room that frees goes to them before the replicas
        # they took it from (a stable sort: otherwise the order they asked in).
        todo.sort(key=lambda r: -self.models[r.model_id].priority)
        snap = self.snapshot()
        unplaceable: dict[tuple, str] = {}
        self._holders: list[preemption.Holder] | None = None
        self._preempting: dict[str, list[str]] | None = None
        self._preemptions_left: int | None = None
        holdings = teams.Holdings.now(snap)  # a team's quota bounds what it is given
        self._holdings = holdings  # and its guarantee, whose replicas may be preempted
        self._taken_back: dict[int, int] = {}  # by team: MiB preempted in this pass
        for r in todo:
            model = self.models[r.model_id]
            prefer = self.prefer.get(r.pk)
            if prefer is None and r.state == ReplicaState.FAILED:
                prefer = self.last_nodes(r)
            req = snapshots.request_for(model, r.profile, r, prefer or ())
            key = (r.profile_id,) if not (req.avoid or req.prefer) else None
            if key in unplaceable:
                self.unplaced(r, unplaceable[key])
                continue
            if over := holdings.refusal(model.team_id, req):
                self.unplaced(r, over)  # nothing is preempted for a team past its quota
                continue
            result = placement.place(snap, req)
            if isinstance(result, NoPlacement):
                if key is not None and not model.priority:
                    unplaceable[key] = result.summary
                if self.sleep_to_place(r, req, snap):
                    continue
                if not self.make_room(r, req, snap):
                    self.unplaced(r, result.summary)
                continue
            if over := holdings.refusal(model.team_id, req, result):
                self.unplaced(r, over)
                continue
            snap.commit(result, req)
            holdings.add(model.team_id, r.pk, req, result)
            spec = self.spec_of(r, result, snap)
            self.new_shards.extend(
                Shard(
                    replica_id=r.pk,
                    spec=spec,
                    node_id=s.node_id,
                    rank=s.rank,
                    gpu_uuids=list(s.gpu_uuids),
                    hcas=list(s.hcas),
                    port=s.port,
                    desired_state=DesiredState.RUNNING,
                    state=ShardState.PENDING,
                    state_changed_at=self.now,
                )
                for s in result.shards
            )
            self.touched.update(result.node_ids)
            self.set_replica(r, ReplicaState.STARTING, preempted_by="")
            logger.info(
                "replica placed replica=%s model=%s nodes=%s",
                r.pk,
                model,
                ",".join(result.node_ids),
            )
            self.report.placed += 1

    def spec_of(self, r: Replica, result: Placement, snap) -> dict:
        """What the shards will run, kept on them so a later profile edit cannot change it."""
        profile = r.profile
        profile.model = self.models[profile.model_id]  # no query per profile
        spec = profile.spec()
        if share := snapshots.share_mb(profile.gpu_memory_gb):
            # The engines are told their budget as a part of the GPU's total (the
            # smallest of the GPUs placed on, where a replica spans several).
            by_uuid = {g.uuid: g for s in result.shards for g in snap.nodes[s.node_id].gpus}
            totals = [by_uuid[u].memory_mb for s in result.shards for u in s.gpu_uuids]
            if totals and min(totals) > 0:
                # Rounded down: an engine that takes all it is told stays in budget.
                fraction = math.floor(share / min(totals) * 10_000) / 10_000
                spec["gpu_memory_fraction"] = min(1.0, fraction)
            if profile.engine == "llamacpp":
                layers = snapshots.layers_within(profile, share)
                if layers is not None:
                    spec["gpu_layers"] = layers
        model = self.models[r.model_id]
        if model.sleep_after_s:
            # Started ready to sleep through its API (vLLM: --enable-sleep-mode); a
            # replica placed before its model slept sleeps by stopping instead.
            spec["sleep_level"] = model.sleep_level
        if profile.engine == "vllm" and not profile.gpus_per_node:
            if kv_gb := snapshots.cpu_kv_cache_gb(profile):
                spec["kv_cache_gb"] = kv_gb
        if len(result.shards) > 1:
            # The other ranks find rank 0 here: its management address and a
            # port of its own for the engines' rendezvous. Each node's engines
            # bootstrap over its management interface; the data goes over the
            # fabric placement chose (each shard's HCAs are on it).
            leader = result.shards[0].node_id
            port = placement_fit.free_port(snap.nodes[leader], snap.port_range)
            snap.nodes[leader].used_ports.add(port)
            nets = {
                pk: (addr, iface)
                for pk, addr, iface in Node.objects.filter(pk__in=result.node_ids).values_list(
                    "pk", "mgmt_addr", "mgmt_interface"
                )
            }
            spec.update(
                leader_addr=nets.get(leader, ("", ""))[0],
                leader_port=port or 0,
                fabric=result.fabric,
                mgmt_interfaces={pk: iface for pk, (_, iface) in nets.items() if iface},
            )
            if profile.engine in placement.OVER_TCP:
                # llama.cpp: each follower's ggml-rpc-server listens on its shard's
                # port at its node's management address; the leader connects to them.
                spec["rpc_servers"] = [
                    f"{_host(nets.get(s.node_id, ('', ''))[0])}:{s.port}" for s in result.shards[1:]
                ]
        return spec

    # ---- preemption ----------------------------------------------------------------

    def make_room(self, r: Replica, req, snap) -> bool:
        """Drain replicas of lower priority so ``r`` fits once they are gone.

        True when ``r`` waits for room (its reason says for what); False when no
        room can be made, and it is unplaced as usual.
        """
        model = self.models[r.model_id]
        if not model.priority or not req.gpus_per_node or req.nodes > 1:
            return False
        waiting = self.preempting().get(r.pk)
        if waiting:
            # Its room is being made: more would stop replicas for nothing.
            self.unplaced(r, f"making room: waiting for {', '.join(waiting)} to stop")
            return True
        if self.exp.paused:
            return False  # the mass-failure brake: nothing is stopped on purpose
        room = preemption.choose_victims(
            snap, req, model.priority, self.holders(), model.team_id, self.borrowed()
        )
        if room is None:
            return False
        left = self.preemptions_left()
        if len(room.victims) > left:
            limit = fleet_settings().preemptions_per_minute
            self.unplaced(
                r,
                f"would preempt {len(room.victims)} on {room.node_id}, but at most {limit} "
                "replicas are preempted a minute (LLMGW_PREEMPTIONS_PER_MINUTE): waiting",
            )
            return True
        by = f"{model.name} (priority {model.priority})"
        for victim in room.victims:
            self.preempt(victim, r, by, self.borrowing(victim, model.team_id))
        names = ", ".join(f"{v.model} (priority {v.priority})" for v in room.victims)
        self.unplaced(r, f"making room on {room.node_id}: preempting {names}")
        self._preempting[r.pk] = [v.model for v in room.victims]
        return True

    def keeps(self, team_id: int) -> int:
        """The GPU memory (MiB) a team keeps once what drains has stopped, less what this
        pass has taken back already."""
        h = self._holdings.held[team_id]
        return h.memory_mb - h.draining_mb - self._taken_back.get(team_id, 0)

    def borrowed(self) -> dict[int, int]:
        """By team: the GPU memory (MiB) it keeps above its guarantee; teams at or below
        it are left out."""
        found = {}
        for pk, team in self._holdings.teams.items():
            above = self.keeps(pk) - (team.guaranteed_gpu_memory_gb or 0) * MIB_PER_GIB
            if above > 0:
                found[pk] = above
        return found

    def borrowing(self, victim: preemption.Holder, team_id: int | None) -> str:
        """Why another team's replica may be taken: what that team holds against its
        guarantee (said in the event); "" for the fleet's and one's own team's."""
        if victim.team_id is None or victim.team_id == team_id:
            return ""
        team = self._holdings.teams[victim.team_id]
        return (
            f"team '{team.name}' holds {teams.gib_text(self.keeps(victim.team_id))} GB of GPU "
            f"memory, above its guaranteed {team.guaranteed_gpu_memory_gb or 0} GB"
        )

    def preempt(self, victim: preemption.Holder, r: Replica, by: str, borrowing: str) -> None:
        replica = next(x for x in self.replicas if x.pk == victim.replica_id)
        if victim.team_id is not None:
            self._taken_back[victim.team_id] = (
                self._taken_back.get(victim.team_id, 0) + victim.memory_mb
            )
        vmodel = self.models[replica.model_id]
        why = f"preempted by {by}"
        self.retire(replica, why)
        self.set_replica(replica, replica.state, why, preempted_for=r.pk)
        # The model keeps its count: a replica in its place waits for room.
        comeback = self.create(vmodel)
        comeback.preempted_by = by
        comeback.reason = f"{why}; waiting for room"
        self._holders = [h for h in self._holders if h.replica_id != victim.replica_id]
        self._preemptions_left -= 1
        self.report.preempted += 1
        Event.objects.create(
            created_at=self.now,
            kind=EventKind.PREEMPT,
            model_id=vmodel.pk,
            model_name=vmodel.name,
            reason=f"replica {replica.pk} on {victim.node_id} drained to make room for {by}"
            + (f": {borrowing}" if borrowing else ""),
        )
        logger.warning(
            "replica preempted replica=%s model=%s node=%s for=%s by=%s",
            replica.pk,
            vmodel,
            victim.node_id,
            r.pk,
            by,
        )

    def holders(self) -> list[preemption.Holder]:
        """Replicas running on one node with GPUs, that a preemption could stop."""
        if self._holders is None:
            found: dict[str, list] = {}
            rows = (
                Shard.objects.filter(
                    replica__state__in=[ReplicaState.READY, ReplicaState.STARTING],
                    node__isnull=False,
                )
                .exclude(state__in=SHARD_FINISHED)
                .values_list(
                    "replica_id",
                    "node_id",
                    "gpu_uuids",
                    "replica__model__name",
                    "replica__model__priority",
                    "replica__profile__gpu_memory_gb",
                    "replica__model__team_id",
                )
            )
            # As this pass left them: one it retired (scaled down, say) is not yet written.
            running = {
                r.pk
                for r in self.replicas
                if r.state in (ReplicaState.READY, ReplicaState.STARTING)
            }
            for replica_id, *shard in rows:
                if replica_id in running:
                    found.setdefault(replica_id, []).append(shard)
            memory_of = self._holdings.memory_of
            self._holders = [
                preemption.Holder(
                    replica_id=replica_id,
                    model=name,
                    priority=prio,
                    node_id=node_id,
                    gpu_uuids=tuple(uuids),
                    share_mb=(share := snapshots.share_mb(share_gb)),
                    team_id=team_id,
                    memory_mb=sum(share or memory_of((node_id, u)) for u in uuids),
                )
                for replica_id, shards in found.items()
                if len(shards) == 1  # a multi-node replica is not preempted
                for node_id, uuids, name, prio, share_gb, team_id in shards
                if replica_id not in self.to_place and uuids
            ]
        return self._holders

    def preempting(self) -> dict[str, list[str]]:
        """By the replica room is made for, the models of its victims not yet stopped."""
        if self._preempting is None:
            self._preempting = {}
            rows = (
                Shard.objects.exclude(replica__preempted_for="")
                .exclude(state__in=SHARD_FINISHED)
                .values_list("replica__preempted_for", "replica__model__name")
                .distinct()
            )
            for for_id, name in rows:
                self._preempting.setdefault(for_id, []).append(name)
        return self._preempting

    def preemptions_left(self) -> int:
        if self._preemptions_left is None:
            recent = Event.objects.filter(
                kind=EventKind.PREEMPT, created_at__gt=self.now - timedelta(minutes=1)
            ).count()
            self._preemptions_left = max(0, fleet_settings().preemptions_per_minute - recent)
        return self._preemptions_left

    def unplaced(self, r: Replica, summary: str) -> None:
        if r.preempted_by:
            summary = f"preempted by {r.preempted_by}; {summary}"
        if r.reason != summary:
            logger.warning("replica cannot be placed replica=%s reason=%s", r.pk, summary)
        self.set_replica(r, ReplicaState.PENDING, summary)
        self.report.unplaceable += 1

    def last_nodes(self, r: Replica) -> list[str]:
        """The nodes of a replica's last attempt, where a restart goes first."""
        last = Shard.objects.filter(replica_id=r.pk, node__isnull=False).order_by("-created_at")
        return list(last.values_list("node_id", flat=True)[: r.profile.nodes])


def _host(addr: str) -> str:
    """An address as host:port wants it: IPv6 in brackets."""
    return f"[{addr}]" if ":" in addr else addr
