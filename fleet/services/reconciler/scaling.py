"""Scaling a pass's models: how many replicas of which profile, and which leave first.

A mixin of the pass (``passes._Pass``), as ``placing`` and ``sleeping`` are: it
reads the pass's replicas and shards and writes through its gathered writes.
Its rules: the desired count (the autoscaler's, or the operator's), a rolling
replacement when the active profile or its spec changes, replicas on draining
nodes or failed GPUs moving once their replacements are ready, an operator's
drain, stop or restart of one replica, and a canary's share beside the active
profile (docs/operations.md, "Canaries"), promoted or aborted by
``fleet.services.canary.judge``. Old replicas leave only as new ones are ready:
never fewer serving than wanted while a replacement is on its way.
"""

import logging

import redis

from fleet.conf import fleet_settings
from fleet.models import DesiredState, EngineProfile, Evict, Model, Replica, ReplicaState

from .. import canary as canary_service
from .. import canary_figures, permissions

logger = logging.getLogger(__name__)

# Scale-down removes the least useful first: pending, then failed, then
# starting, then ready; among equals the newest.
USEFULNESS = {
    ReplicaState.PENDING: 0,
    ReplicaState.FAILED: 1,
    ReplicaState.STARTING: 2,
    ReplicaState.ASLEEP: 2,
    ReplicaState.READY: 3,
}


class Scaling:
    def on_draining_node(self, r: Replica) -> bool:
        """On a draining node, or on a failed GPU whose replicas move: it must go."""
        moving = self.faults.moving
        return any(
            s.node_id in self.draining_nodes
            or (moving and any((s.node_id, u) in moving for u in s.gpu_uuids))
            for s in self.shards.get(r.pk, [])
        )

    def must_go_now(self, r: Replica) -> str:
        """Why a replica that must move drains now, its replacement ready or not: its
        node's notice runs out, or its failed GPU's wait for a replacement is over."""
        for s in self.shards.get(r.pk, []):
            if s.node_id in self.leaving:
                return f"node {s.node_id} goes away within {fleet_settings().notice_drain_s:g} s"
            for uuid in s.gpu_uuids:
                since = self.faults.moving.get((s.node_id, uuid))
                wait_s = fleet_settings().gpu_drain_wait_s
                if since is not None and (self.now - since).total_seconds() >= wait_s:
                    return f"its GPU failed and no replacement was ready within {wait_s:g} s"
        return ""

    def scale(self, model: Model, replicas: list[Replica]) -> None:
        live = [r for r in replicas if r.state not in (ReplicaState.DRAINING, ReplicaState.STOPPED)]
        # An operator's stop or restart of one replica: drained now. A stop also
        # lowered desired_replicas; a restart's place is filled below, at once.
        for r in [r for r in live if r.evict in (Evict.STOP, Evict.RESTART)]:
            self.retire(r, f"{r.evict} asked by {r.evict_by}")
            self.replica_event(r, "draining now" if r.state == ReplicaState.DRAINING else "stopped")
            live.remove(r)
        profile = model.active_profile
        if profile is None:
            return  # nothing to run new replicas with; existing ones are left alone
        wanted = max(0, model.desired_replicas)
        live = self.scale_canary(model, live, wanted)
        spec = profile.spec_hash
        outdated = [
            r
            for r in live
            if r.profile_id != profile.pk
            or (r.spec_hash and r.spec_hash != spec)
            or self.on_draining_node(r)
            or r.evict == Evict.DRAIN
        ]
        old = {r.pk for r in outdated}
        current = [r for r in live if r.pk not in old]
        for r in outdated:
            if r.state != ReplicaState.READY:
                self.retire(r, "replaced by a replica of the active profile or on another node")
        # An operator's drain goes first among the old, and waits for its
        # replacement only so long.
        outdated_ready = sorted(
            (r for r in outdated if r.state == ReplicaState.READY),
            key=lambda r: r.evict != Evict.DRAIN,
        )
        wait_s = fleet_settings().replica_drain_wait_s
        for r in [r for r in outdated_ready if r.evict == Evict.DRAIN and r.evict_at]:
            if (self.now - r.evict_at).total_seconds() >= wait_s:
                self.retire(r, f"drain asked by {r.evict_by}")
                self.replica_event(
                    r, f"no replacement was ready within {wait_s:g} s: draining it anyway"
                )
                outdated_ready.remove(r)
        for r in list(outdated_ready):
            if why := self.must_go_now(r):
                self.retire(r, why)
                outdated_ready.remove(r)
        short = wanted - len(current)
        if short < 0:
            surplus = sorted(
                current, key=lambda r: (USEFULNESS.get(r.state, 0), -r.created_at.timestamp())
            )[:-short]
            for r in surplus:
                self.retire(r, f"scaled down to {wanted}")
                current.remove(r)
        # Old replicas leave only as new ones are ready: never fewer serving
        # than wanted while a replacement is on its way.
        ready = sum(1 for r in current if r.state == ReplicaState.READY) + len(outdated_ready)
        for r in list(outdated_ready[: max(0, ready - wanted)]):
            self.retire(r, "its replacement is ready")
            if r.evict == Evict.DRAIN:
                self.replica_event(r, "its replacement is ready: draining")
            outdated_ready.remove(r)
        # A drain starts every replacement at once; a profile change one at a time.
        surge = max(
            1,
            sum(1 for r in outdated_ready if self.on_draining_node(r) or r.evict == Evict.DRAIN),
        )
        if short > 0:
            room = wanted + surge - len(current) - len(outdated_ready)
            for _ in range(min(short, max(0, room))):
                current.append(self.create(model))

    def scale_canary(self, model: Model, live: list[Replica], wanted: int) -> list[Replica]:
        """Keep a canary's replicas (docs/operations.md, "Canaries"): its share of the
        wanted count, at least one, beside the active profile's. Returns the replicas
        that are not the canary's; without a canary, its old replicas are among them and
        leave as outdated ones do."""
        canary = model.canary_profile
        if canary is None:
            return live
        ours = [r for r in live if r.profile_id == canary.pk]
        if self.judge_canary(model, ours):
            return live  # promoted or aborted: its replicas are the active ones, or old
        count = max(1, round(wanted * model.canary_percent / 100)) if wanted else 0
        # A canary is a trial: one that must move (its profile edited, its node
        # drained, an operator's drain) is replaced after, not before.
        good = [
            r
            for r in ours
            if (not r.spec_hash or r.spec_hash == canary.spec_hash)
            and not self.on_draining_node(r)
            and r.evict != Evict.DRAIN
        ]
        keep = sorted(good, key=lambda r: -USEFULNESS.get(r.state, 0))[:count]
        for r in ours:
            if r not in keep:
                self.retire(r, f"the canary wants {count} replica(s) here")
        for _ in range(count - len(keep)):
            self.create(model, canary)
        return [r for r in live if r not in ours]

    def judge_canary(self, model: Model, ours: list[Replica]) -> bool:
        """Abort a canary past its bounds, or one that never became ready; promote one
        within them for its window if the model says so (canary_service.judge). True when
        it did either: ``model`` then has no canary."""
        try:
            figures = canary_figures.read(model.name, model.canary_profile_id)
        except redis.RedisError as exc:
            logger.warning("canary of %s not judged: Redis: %s", model.name, exc)
            return False
        ready = any(r.state == ReplicaState.READY for r in ours)
        failures = max((r.failures for r in ours), default=0)
        verdict = canary_service.judge(model, figures, ready, failures, self.now)
        if verdict is None:
            return False
        what, why = verdict
        act = canary_service.promote if what == "promote" else canary_service.abort
        act(model, permissions.SYSTEM, why)
        if what == "promote":
            model.active_profile = model.canary_profile
        model.canary_profile, model.canary_percent = None, 0
        return True

    def create(self, model: Model, profile: EngineProfile | None = None) -> Replica:
        profile = profile or model.active_profile
        r = Replica(
            model=model,
            profile=profile,
            spec_hash=profile.spec_hash,
            state=ReplicaState.PENDING,
            reason="waiting for placement",
            state_changed_at=self.now,
            created_at=self.now,
        )
        self.new_replicas[r.pk] = r
        self.shards[r.pk] = []
        self.replicas.append(r)
        self.to_place[r.pk] = r
        self.report.created += 1
        return r

    def retire(self, r: Replica, why: str) -> None:
        self.to_place.pop(r.pk, None)
        if r.state == ReplicaState.READY:
            # In-flight requests finish first; the gateway sends no new ones.
            self.set_shards(r, DesiredState.DRAINING)
            self.set_replica(r, ReplicaState.DRAINING, why)
        else:
            self.set_shards(r, DesiredState.STOPPED)
            self.set_replica(r, ReplicaState.STOPPED, why)
        logger.info(
            "replica retired replica=%s model=%s why=%s", r.pk, self.models[r.model_id], why
        )
        self.report.retired += 1
