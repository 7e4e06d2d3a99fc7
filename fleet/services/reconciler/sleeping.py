"""Sleep and wake in a reconciler pass (docs/operations.md, "Sleep and wake").

A mixin of the pass (``passes._Pass``), as ``placing`` is. A model with
``sleep_after_s`` keeps its replicas' engines when it is idle and gives their
GPU memory back; a request wakes them. Three rules:

- ``sleep_idle``: no request for ``sleep_after_s`` (nor since the replica became
  ready), nothing in flight or waiting at the gateways: its ready replicas sleep.
- ``wake_asked``: requests wait at the gateways and no replica is ready: its
  asleep replicas wake, as many as the waiting requests need at the model's
  target, each where its GPUs have room now (``_room``). Where they do not, ready
  replicas on those GPUs make way (``_make_way``): of models that sleep, of no
  higher priority, of the same team or the fleet's, with no request waiting for
  them, the lowest priority and then the least recently used first. They sleep
  (their requests in flight finish first, on the node) and the replica wakes at
  a later pass, once they are asleep.
- ``sleep_to_place``: a new replica that fits nowhere may put such replicas to
  sleep as well, so that several models take turns on one GPU: at most what fits
  awake at once is awake.

The snapshot (``fleet.services.snapshot``) counts a shard's GPUs until its node
reports it asleep, and again from the pass that wakes it, so what is promised
awake never passes what a GPU has.
"""

import logging
import math

from fleet.conf import fleet_settings
from fleet.models import DesiredState, Event, EventKind, ReplicaState, ShardState

from .. import preemption, teams
from .. import snapshot as snapshots

logger = logging.getLogger(__name__)

WAKING = "waking"


class Sleeping:
    # ---- the rules ---------------------------------------------------------------

    def sleep_and_wake(self) -> None:
        """The idle sleep, then the wakes that requests ask for (before placement, whose
        snapshot they share)."""
        if self.loads is None:
            return  # without the gateways' figures neither idleness nor demand is known
        for model in self.models.values():
            replicas = [
                r
                for r in self.by_model.get(model.pk, [])
                if r.state not in (ReplicaState.DRAINING, ReplicaState.STOPPED)
            ]
            if not replicas:
                continue
            load = self.loads.get(model.name)
            waiting = load.waiting if load else 0
            in_flight = load.outstanding if load else 0.0
            asleep = [r for r in replicas if self.is_asleep(r)]
            if model.sleep_after_s is None:
                for r in asleep:  # sleep was turned off: everything wakes
                    self.wake(r, "sleep is off for this model")
                continue
            if not waiting and not in_flight:
                self.sleep_idle(model, replicas)
            if waiting and not any(r.state == ReplicaState.READY for r in replicas):
                target = model.target_outstanding or fleet_settings().autoscale_target_outstanding
                wanted = max(1, math.ceil(waiting / max(target, 0.001)))
                waking = sum(1 for r in replicas if self.is_waking(r))
                for r in asleep[: max(0, wanted - waking)]:
                    self.wake(r, f"{waiting} request(s) waiting")

    def sleep_idle(self, model, replicas) -> None:
        after = model.sleep_after_s
        for r in replicas:
            if r.state != ReplicaState.READY:
                continue
            known = [t for t in (model.last_request_at, r.state_changed_at) if t is not None]
            if not known:
                continue  # a replica without a time cannot be idle for long
            idle = (self.now - max(known)).total_seconds()
            if idle >= after:
                self.put_to_sleep(r, f"no request for {idle:.0f} s (sleep after {after} s)")

    # ---- one replica ---------------------------------------------------------------

    def is_asleep(self, r) -> bool:
        """Asleep or going to sleep: every shard is meant to sleep."""
        shards = self.shards.get(r.pk, [])
        return bool(shards) and all(s.desired_state == DesiredState.ASLEEP for s in shards)

    def is_waking(self, r) -> bool:
        return r.state == ReplicaState.STARTING and r.reason.startswith(WAKING)

    def put_to_sleep(self, r, why: str, made_way_for: str = "") -> None:
        self.set_shards(r, DesiredState.ASLEEP)
        self.set_replica(r, ReplicaState.ASLEEP, f"asleep: {why}", sleep_for=made_way_for)
        self.sleep_event(r, f"going to sleep: {why}")
        self.report.slept += 1

    def wake(self, r, why: str) -> None:
        """Wake ``r`` if its GPUs have room; else make way on them, and wake it later."""
        shards = self.shards.get(r.pk, [])
        if any(s.state != ShardState.ASLEEP for s in shards):
            # Still going to sleep (its engine holds its GPUs yet): called off.
            return self._wake_now(r, why)
        going = [
            x
            for x in self.replicas
            if x.sleep_for == r.pk and self.is_asleep(x) and not self.all_asleep(x)
        ]
        if going:
            names = ", ".join(sorted({self.models[x.model_id].name for x in going}))
            self.set_replica(r, r.state, f"asleep: waking once {names} sleeps")
            return
        snap = self.snapshot()
        model = self.models[r.model_id]
        if model.team_id is not None:
            # Awake, it counts against its team's quota again (asleep, it does not).
            if over := self.team_holdings(snap).refusal(
                model.team_id, snapshots.request_for(model, r.profile, r)
            ):
                self.set_replica(r, r.state, f"asleep: cannot wake: {over}")
                return
        short = self._room(snap, r)
        if not short:
            return self._wake_now(r, why)
        victims = self._make_way(snap, r, short)
        if victims is None:
            self.set_replica(r, r.state, f"asleep: cannot wake: {short[0][2]}")
            return
        by = f"{model.name} (priority {model.priority})"
        for v in victims:
            self.put_to_sleep(v, f"made way for {by}", made_way_for=r.pk)
        names = ", ".join(self.models[v.model_id].name for v in victims)
        self.set_replica(r, r.state, f"asleep: waking once {names} sleeps")

    def _wake_now(self, r, why: str) -> None:
        snap = self.snapshot()
        for s in self.shards.get(r.pk, []):
            node = snap.nodes.get(s.node_id)
            if node is not None and s.state == ShardState.ASLEEP:
                share = snapshots.share_mb(r.profile.gpu_memory_gb)
                _hold(node, s.gpu_uuids, share)
        self.set_shards(r, DesiredState.RUNNING)
        self.set_replica(r, ReplicaState.STARTING, f"{WAKING}: {why}", sleep_for="")
        self.sleep_event(r, f"waking: {why}")
        self.report.woken += 1

    def all_asleep(self, r) -> bool:
        shards = self.shards.get(r.pk, [])
        return bool(shards) and all(s.state == ShardState.ASLEEP for s in shards)

    def sleep_event(self, r, text: str) -> None:
        name = self.models[r.model_id].name
        Event.objects.create(
            created_at=self.now,
            kind=EventKind.SLEEP,
            model_id=r.model_id,
            model_name=name,
            reason=f"{name}#{r.pk[:8]}: {text}",
        )
        logger.info("replica sleep replica=%s model=%s: %s", r.pk, name, text)

    def woke(self, r) -> None:
        """A waking replica became ready: the event says how long the wake took."""
        took = (self.now - r.state_changed_at).total_seconds() if r.state_changed_at else 0.0
        self.sleep_event(r, f"awake in {took:.1f} s")

    # ---- room on the GPUs ------------------------------------------------------------

    def team_holdings(self, snap):
        if getattr(self, "_wake_holdings", None) is None:
            self._wake_holdings = teams.Holdings.now(snap)
        return self._wake_holdings

    def snapshot(self):
        if getattr(self, "_snap", None) is None:
            self._snap = snapshots.build()
        return self._snap

    def _room(self, snap, r) -> list[tuple[str, str, str]]:
        """What ``r``'s shards lack on their GPUs to wake now: (node, GPU, why), or []."""
        share = snapshots.share_mb(r.profile.gpu_memory_gb)
        short = []
        for s in self.shards.get(r.pk, []):
            node = snap.nodes.get(s.node_id)
            if node is None:
                continue
            for g in node.gpus:
                if g.uuid not in s.gpu_uuids:
                    continue
                if share:
                    room = g.room_mb(snap.gpu_reserve_mb)
                    if room < share:
                        short.append(
                            (
                                node.id,
                                g.uuid,
                                f"{node.id}: GPU {g.index} has {max(0, room) / 1024:.1f} GB "
                                f"free, needs {share / 1024:.1f}",
                            )
                        )
                elif g.uuid in node.used_gpus or g.promised_mb:
                    short.append((node.id, g.uuid, f"{node.id}: GPU {g.index} is in use"))
        return short

    def awake_on(self, node_id: str, uuids) -> list:
        """Ready replicas with a shard on these GPUs of a node, and their shards there."""
        found = []
        wanted = set(uuids)
        for x in self.replicas:
            if x.state != ReplicaState.READY:
                continue
            for s in self.shards.get(x.pk, []):
                if s.node_id == node_id and wanted.intersection(s.gpu_uuids):
                    found.append(x)
                    break
        return found

    def may_make_way(self, v, model) -> bool:
        """Whether ``v`` may sleep so that a replica of ``model`` runs: a model that sleeps,
        another one, of no higher priority, the same team's or the fleet's, on one node,
        with no request waiting for it."""
        vm = self.models[v.model_id]
        if vm.pk == model.pk or vm.sleep_after_s is None or vm.priority > model.priority:
            return False
        if vm.team_id not in (None, model.team_id):
            return False  # another team's capacity is never taken to wake or place one
        if len({s.node_id for s in self.shards.get(v.pk, [])}) != 1:
            return False
        load = (self.loads or {}).get(vm.name)
        return not (load and load.waiting)

    def lru_key(self, v):
        vm = self.models[v.model_id]
        last = vm.last_request_at or v.state_changed_at
        return (vm.priority, last.timestamp() if last else 0.0, v.pk)

    def _make_way(self, snap, r, short) -> list | None:
        """The replicas to put to sleep so that ``r`` wakes, or None when none may."""
        model = self.models[r.model_id]
        share = snapshots.share_mb(r.profile.gpu_memory_gb)
        chosen: list = []
        for node_id, uuid, _ in short:
            node = snap.nodes[node_id]
            gpu = next(g for g in node.gpus if g.uuid == uuid)
            holders = self.awake_on(node_id, [uuid])
            if not share:
                # A whole GPU: everything awake on it makes way, or nothing does.
                if not all(self.may_make_way(v, model) for v in holders) or not holders:
                    return None
                chosen += [v for v in holders if v not in chosen]
                continue
            room = gpu.room_mb(snap.gpu_reserve_mb) + sum(
                snapshots.share_mb(v.profile.gpu_memory_gb) for v in chosen if v in holders
            )
            for v in sorted(holders, key=self.lru_key):
                if room >= share:
                    break
                if v in chosen or not self.may_make_way(v, model):
                    continue
                if not self._host_room(node, v):
                    continue
                chosen.append(v)
                room += snapshots.share_mb(v.profile.gpu_memory_gb)
            if room < share:
                return None
        return chosen

    def _host_room(self, node, v) -> bool:
        """Whether the node's memory holds ``v``'s weights while it sleeps (level 1)."""
        if node.memory_mb is None:
            return True
        model = self.models[v.model_id]
        spec = {"sleep_level": model.sleep_level}
        on_gpus = any(s.gpu_uuids for s in self.shards.get(v.pk, []))
        need = snapshots.asleep_host_mb(v.profile, spec, on_gpus, node)
        if node.memory_mb - node.asleep_mb < need:
            return False
        node.asleep_mb += need
        return True

    # ---- a new replica -------------------------------------------------------------

    def sleep_to_place(self, r, req, snap) -> bool:
        """Put replicas of models that sleep to sleep so that a new ``r`` fits. True when
        ``r`` waits for them (its reason says so)."""
        model = self.models[r.model_id]
        going = [x for x in self.replicas if x.sleep_for == r.pk and not self.all_asleep(x)]
        if going:
            names = ", ".join(sorted({self.models[x.model_id].name for x in going}))
            self.unplaced(r, f"making room: waiting for {names} to sleep")
            return True
        if not req.gpus_per_node or req.nodes > 1:
            return False
        holders = [
            h
            for h in self.holders()
            if (v := self.replica_by_id(h.replica_id)) is not None
            and v.state == ReplicaState.READY
            and not self.is_asleep(v)
            and self.may_make_way(v, model)
        ]
        if not holders:
            return False
        order = {h.replica_id: self.lru_key(self.replica_by_id(h.replica_id)) for h in holders}
        # Equal priorities take turns: one above the model's own is never a candidate.
        room = preemption.choose_victims(
            snap, req, model.priority + 1, holders, model.team_id, {}, order=order
        )
        if room is None:
            return False
        by = f"{model.name} (priority {model.priority})"
        for h in room.victims:
            self.put_to_sleep(self.replica_by_id(h.replica_id), f"made way for {by}", r.pk)
        names = ", ".join(h.model for h in room.victims)
        self.unplaced(r, f"making room on {room.node_id}: putting {names} to sleep")
        return True

    def replica_by_id(self, pk: str):
        if getattr(self, "_by_id", None) is None:
            self._by_id = {x.pk: x for x in self.replicas}
        return self._by_id.get(pk)


def _hold(node, uuids, share_mb: int) -> None:
    """Count a waking shard's GPUs in the snapshot, so the same pass promises them to no one."""
    if not share_mb:
        node.used_gpus.update(uuids)
        return
    for g in node.gpus:
        if g.uuid in uuids:
            g.promised_mb += share_mb
