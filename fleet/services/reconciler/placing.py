"""Placing a pass's replicas: placement's decisions turned into shards on nodes.

A mixin of the pass (``passes._Pass``): it reads the pass's replicas and
models, and writes through its gathered writes, so the whole pass is still one
transaction. The decisions themselves are ``fleet.services.placement``'s, a
pure function of the snapshot.
"""

import logging

from fleet.models import DesiredState, Node, Replica, ReplicaState, Shard, ShardState

from .. import placement
from .. import snapshot as snapshots

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
        snap = snapshots.build()
        unplaceable: dict[tuple, str] = {}
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
            result = placement.place(snap, req)
            if isinstance(result, placement.NoPlacement):
                if key is not None:
                    unplaceable[key] = result.summary
                self.unplaced(r, result.summary)
                continue
            snap.commit(result, req)
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
            self.set_replica(r, ReplicaState.STARTING)
            logger.info(
                "replica placed replica=%s model=%s nodes=%s",
                r.pk,
                model,
                ",".join(result.node_ids),
            )
            self.report.placed += 1

    def spec_of(self, r: Replica, result: placement.Placement, snap) -> dict:
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
                spec["gpu_memory_fraction"] = round(min(1.0, share / min(totals)), 4)
        if len(result.shards) > 1:
            # The other ranks find rank 0 here: its management address and a
            # port of its own for the engines' rendezvous. Each node's engines
            # bootstrap over its management interface; the data goes over the
            # fabric placement chose (each shard's HCAs are on it).
            leader = result.shards[0].node_id
            port = placement.free_port(snap.nodes[leader], snap)
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
        return spec

    def unplaced(self, r: Replica, summary: str) -> None:
        if r.reason != summary:
            logger.warning("replica cannot be placed replica=%s reason=%s", r.pk, summary)
        self.set_replica(r, ReplicaState.PENDING, summary)
        self.report.unplaceable += 1

    def last_nodes(self, r: Replica) -> list[str]:
        """The nodes of a replica's last attempt, where a restart goes first."""
        last = Shard.objects.filter(replica_id=r.pk, node__isnull=False).order_by("-created_at")
        return list(last.values_list("node_id", flat=True)[: r.profile.nodes])
