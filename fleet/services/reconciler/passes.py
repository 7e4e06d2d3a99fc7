"""The reconciler: the catalog's desired replicas against the shards that exist.

One pass, in one transaction, does everything: node expiry, failed and hung
starts, replacement of replicas on lost nodes, scaling and rolling
replacement, placement, drains, and the clean-up of finished rows. It reads
the database afresh each time and writes only differences, so running it
twice changes nothing the second time. Time comes in as ``now`` so tests
drive it without sleeping.

Nodes hear of it through their desired sets: every node whose shards changed
gets a new version and a doorbell after commit (``fleet.services.desired``).
"""

import logging
import time
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from fleet.conf import fleet_settings
from fleet.models import (
    SHARD_FINISHED,
    SHARD_STARTING,
    DesiredState,
    EngineProfile,
    Event,
    EventKind,
    Model,
    Node,
    Replica,
    ReplicaState,
    Shard,
    ShardState,
)

from .. import adapters, gpu_health
from ..autoscaler.step import needs_load, read_loads
from ..autoscaler.step import step as autoscale
from ..desired import bump_desired
from ..doorbells import ring_gateways
from ..readiness import replica_ready
from . import expiry, housekeeping, rows
from .placing import Placing
from .report import PassReport
from .scaling import Scaling
from .sleeping import WAKING, Sleeping

logger = logging.getLogger(__name__)


def backoff_s(failures: int) -> float:
    """10 s after the first failure, doubling, at most 5 min (settings)."""
    base = fleet_settings().restart_backoff_s
    cap = fleet_settings().restart_backoff_max_s
    return min(cap, base * 2 ** max(0, failures - 1))


def run_pass(now: datetime | None = None) -> PassReport:
    """One reconciler pass. The caller holds the pass lock (``runner.run_locked``)."""
    now = now or timezone.now()
    started = time.perf_counter()
    report = PassReport()
    with transaction.atomic():
        status = expiry.begin_pass(now)
        exp = expiry.expire_nodes(status, now)
        report.phases["expiry"] = (time.perf_counter() - started) * 1000
        report.paused = exp.paused
        if exp.suspected or exp.lost:
            # Their replicas are now a last resort, or out of the table: every
            # gateway reloads it at once, not at its next periodic refresh.
            ring_gateways("routes")
        work = _Pass(now, exp, report)
        work.run()
        status.last_pass_at = now
        status.last_pass_ms = (time.perf_counter() - started) * 1000
        status.save()
        report.nodes_notified = sorted(work.touched)
        bump_desired(work.touched)
        mark = time.perf_counter()
    report.phases["commit"] = (time.perf_counter() - mark) * 1000  # with the doorbells
    report.duration_ms = (time.perf_counter() - started) * 1000
    if report.changed():
        logger.info("reconciler pass %s", report.summary())
    return report


class _Pass(Placing, Scaling, Sleeping):
    def __init__(self, now: datetime, exp: expiry.Expiry, report: PassReport):
        self.now = now
        self.exp = exp
        self.report = report
        self.touched: set[str] = set()
        # Replicas to place this pass, by id, in the order they asked.
        self.to_place: dict[str, Replica] = {}
        self.prefer: dict[str, list[str]] = {}
        # Writes are gathered and made in a few statements (``flush``): one
        # UPDATE per replica cost most of a pass at a few thousand replicas.
        self.replica_writes: dict[str, dict] = {}
        self.shard_writes: dict[str, set[str]] = {}
        self.new_shards: list[Shard] = []
        self.new_replicas: dict[str, Replica] = {}
        self._snap = None  # placement's snapshot, built once when a pass needs it

    # ---- loading ---------------------------------------------------------------

    def load(self) -> None:
        self.models = {
            m.pk: m
            for m in Model.objects.select_related("active_profile", "canary_profile").order_by("pk")
        }
        # Each profile once, shared by its replicas.
        profiles = {p.pk: p for p in EngineProfile.objects.all()}
        self.replicas = rows.live_replicas(profiles)
        self.shards: dict[str, list] = {r.pk: [] for r in self.replicas}
        for s in rows.active_shards():
            self.shards.setdefault(s.replica_id, []).append(s)
        self.draining_nodes = set(Node.objects.filter(draining=True).values_list("pk", flat=True))
        # Failed GPUs whose replicas move, within the brake's bound, and nodes whose
        # notice runs out: what runs there goes (fleet.services.gpu_health).
        self.faults = gpu_health.step(self.exp.status, self.now)
        self.leaving = gpu_health.leaving_now(self.now) if self.draining_nodes else set()
        self.by_model: dict[int, list[Replica]] = {}
        for r in self.replicas:
            self.by_model.setdefault(r.model_id, []).append(r)
        # The gateways' load, once (the autoscaler and sleep read it); None: Redis is
        # away, and neither acts on what it cannot see.
        wanted = any(needs_load(m) for m in self.models.values())
        self.loads = read_loads(self.now) if wanted else {}

    # ---- the pass --------------------------------------------------------------

    def run(self) -> None:
        self.phase()
        self.load()
        self.phase("load")
        lost_candidates: dict[str, list[Replica]] = {}
        for r in self.replicas:
            if r.model_id not in self.models:
                continue
            if r.state == ReplicaState.DRAINING:
                self.check_draining(r)
            else:
                self.check_replica(r, lost_candidates)
        self.replace_lost(lost_candidates)
        self.phase("replicas")
        # The autoscaler moves desired_replicas; the scaling below acts on it.
        self.report.scaled = autoscale(
            self.models.values(), self.by_model, self.now, loads=self.loads
        )
        if self.report.scaled:
            ring_gateways("routes")
        self.phase("autoscale")
        # Which adapters replicas hold: the least recently used make way.
        bump_desired(adapters.step(self.now))
        # Sleep and wake (docs/operations.md, "Sleep and wake"), before scaling: a
        # model woken here is not also given a new replica.
        self.sleep_and_wake()
        self.phase("sleep")
        for model in self.models.values():
            self.scale(model, self.by_model.get(model.pk, []))
        self.phase("scaling")
        self.place_all()
        self.phase("placement")
        self.flush()
        self.phase("writes")
        housekeeping.finish_drains(self.draining_nodes, self.report)
        housekeeping.check_registrations(self.exp.status.last_pass_at, self.touched, self.report)
        housekeeping.clean_up(self.touched, self.report)
        self.phase("clean_up")

    def phase(self, name: str | None = None) -> None:
        now = time.perf_counter()
        if name:
            self.report.phases[name] = (now - self._mark) * 1000
        self._mark = now

    def set_replica(self, r: Replica, state: str, reason: str = "", **fields) -> None:
        fields = {k: v for k, v in fields.items() if getattr(r, k) != v}
        if r.state == state and r.reason == reason and not fields:
            return
        if r.state != state:
            fields["state_changed_at"] = self.now
            if state == ReplicaState.READY:
                logger.info("replica ready replica=%s model=%s", r.pk, self.models[r.model_id])
        fields.update(state=state, reason=reason)
        for k, v in fields.items():
            setattr(r, k, v)
        if r.pk not in self.new_replicas:  # a new one is inserted as it is by then
            self.replica_writes.setdefault(r.pk, {}).update(fields)

    def set_shards(self, r: Replica, desired: str) -> None:
        """Tell every active shard of a replica to drain or stop, as a group."""
        shards = self.shards.get(r.pk, [])
        ids = [s.pk for s in shards if s.desired_state != desired]
        if not ids:
            return
        self.shard_writes.setdefault(desired, set()).update(ids)
        for s in shards:
            s.desired_state = desired
            if s.node_id:
                self.touched.add(s.node_id)
        if desired == DesiredState.STOPPED:
            self.report.stopped += len(ids)
            self.shards[r.pk] = []

    def flush(self) -> None:
        """Make the gathered writes: a statement per distinct change, not per row."""
        Replica.objects.bulk_create(self.new_replicas.values(), batch_size=500)
        self.new_replicas = {}
        for desired, ids in self.shard_writes.items():
            Shard.objects.filter(pk__in=list(ids)).update(desired_state=desired)
        self.shard_writes = {}
        groups: dict[tuple, tuple[dict, list[str]]] = {}
        for pk, fields in self.replica_writes.items():
            key = tuple(sorted((k, repr(v)) for k, v in fields.items()))
            groups.setdefault(key, (fields, []))[1].append(pk)
        for fields, ids in groups.values():
            for i in range(0, len(ids), 500):
                Replica.objects.filter(pk__in=ids[i : i + 500]).update(**fields)
        self.replica_writes = {}
        Shard.objects.bulk_create(self.new_shards, batch_size=500)
        self.new_shards = []

    # ---- one replica -----------------------------------------------------------

    def check_replica(self, r: Replica, lost_candidates: dict) -> None:
        shards = self.shards.get(r.pk, [])
        model = self.models[r.model_id]
        if not shards:
            if r.state == ReplicaState.FAILED and r.retry_at and r.retry_at > self.now:
                return  # backing off
            self.to_place[r.pk] = r
            return
        orphans = [s for s in shards if s.node_id is None]
        if orphans:
            # Its node was deleted under it: an impossible state, healed by
            # placing the replica again.
            logger.error("replica lost a node it ran on (deleted) replica=%s", r.pk)
            self.set_shards(r, DesiredState.STOPPED)
            self.set_replica(r, ReplicaState.PENDING, "a node it ran on was deleted")
            self.report.replaced += 1
            self.to_place[r.pk] = r
            return
        replace_after = model.replace_after_s or fleet_settings().replace_after_s
        for s in shards:
            silent = self.exp.silence.get(s.node_id)
            if silent is not None and silent >= replace_after and not self.exp.paused:
                lost_candidates.setdefault(s.node_id, []).append(r)
                return
        self.check_start_timeouts(r, shards)
        # A shard that stopped while it should run has failed, whatever it says.
        failed = [s for s in shards if s.state in SHARD_FINISHED]
        if failed:
            self.restart_later(r, failed)
        elif all(s.desired_state == DesiredState.ASLEEP for s in shards):
            if r.state != ReplicaState.ASLEEP:
                self.set_replica(r, ReplicaState.ASLEEP, r.reason)
        elif replica_ready(shards):
            if r.state == ReplicaState.STARTING and r.reason.startswith(WAKING):
                self.woke(r)
            self.set_replica(r, ReplicaState.READY, failures=0, retry_at=None)
        elif r.state != ReplicaState.STARTING:
            self.set_replica(r, ReplicaState.STARTING)

    def check_start_timeouts(self, r: Replica, shards: list[Shard]) -> None:
        """A start that outlives its timeout is failed (a fetch that moves is not hung).

        The engine's start is timed from the later of its transition and its last
        fetch progress: a download of an hour neither fails the start nor eats the
        engine's own time once it is done. Progress is not a transition, so it
        never moves ``state_changed_at``; a fetch that stops moving is failed by
        the node (fetch.stall_timeout_s), or here once the timeout passes.
        """
        limit = timedelta(seconds=r.profile.startup_timeout_s)
        stall = timedelta(seconds=fleet_settings().fetch_stall_s)
        for s in shards:
            waking = s.state == ShardState.ASLEEP and s.desired_state == DesiredState.RUNNING
            if (s.state not in SHARD_STARTING and not waking) or s.node_id in self.exp.silence:
                continue
            since = s.state_changed_at or s.created_at
            if waking and r.state_changed_at and r.state_changed_at > since:
                since = r.state_changed_at  # timed from the wake, not from its sleep
            if s.fetch_updated_at and s.fetch_updated_at > since:
                since = s.fetch_updated_at
            if self.now - since < limit:
                continue
            if s.fetch_updated_at and self.now - s.fetch_updated_at < stall:
                continue
            error = f"not ready within {r.profile.startup_timeout_s} s (was {s.state})"
            if Shard.objects.filter(pk=s.pk, state=s.state).update(
                state=ShardState.FAILED, error=error, state_changed_at=self.now
            ):
                logger.error("shard start timed out shard=%s node=%s", s.pk, s.node_id)
                s.state, s.error = ShardState.FAILED, error
                self.report.timed_out += 1

    def restart_later(self, r: Replica, failed: list[Shard]) -> None:
        """Stop the whole group and schedule a restart after the backoff."""
        shards = self.shards[r.pk]
        self.prefer[r.pk] = [s.node_id for s in shards]
        counts = dict(r.node_failures or {})
        for s in failed:
            counts[s.node_id] = counts.get(s.node_id, 0) + 1
        failures = r.failures + 1
        delay = backoff_s(failures)
        first = failed[0]
        detail = first.error or (
            f"exit code {first.exit_code}" if first.exit_code is not None else "no error given"
        )
        reason = f"shard on {first.node_id} failed: {detail}; restart in {delay:.0f} s"
        self.set_shards(r, DesiredState.STOPPED)
        self.set_replica(
            r,
            ReplicaState.FAILED,
            reason,
            failures=failures,
            restarts=r.restarts + 1,
            node_failures=counts,
            retry_at=self.now + timedelta(seconds=delay),
        )
        logger.warning(
            "replica failed replica=%s node=%s failures=%d restart_in_s=%.0f error=%s",
            r.pk,
            first.node_id,
            failures,
            delay,
            detail,
        )
        self.report.restarts += 1
        if delay <= 0:
            self.to_place[r.pk] = r

    def check_draining(self, r: Replica) -> None:
        shards = self.shards.get(r.pk, [])
        drain_s = fleet_settings().drain_timeout_s
        since = r.state_changed_at or r.updated_at
        done = all(s.state in SHARD_FINISHED for s in shards)
        if done or (self.now - since).total_seconds() >= drain_s:
            self.set_shards(r, DesiredState.STOPPED)
            self.set_replica(r, ReplicaState.STOPPED, r.reason)
            if r.evict:
                self.replica_event(
                    r,
                    "drained and stopped"
                    if done
                    else f"stopped at the {drain_s:g} s drain timeout (LLMGW_DRAIN_TIMEOUT_S), "
                    "before its engine said it was done",
                )

    def replica_event(self, r: Replica, text: str) -> None:
        """An event about one replica an operator drained, stopped or restarted."""
        name = self.models[r.model_id].name
        Event.objects.create(
            created_at=self.now,
            kind=EventKind.REPLICA,
            model_id=r.model_id,
            model_name=name,
            reason=f"{name}#{r.pk[:8]} ({r.evict} asked by {r.evict_by}): {text}",
        )

    # ---- lost nodes --------------------------------------------------------------

    def replace_lost(self, candidates: dict[str, list[Replica]]) -> None:
        if not candidates:
            return
        status = self.exp.status
        if not expiry.may_replace_now(status, self.now):
            return
        # One node per REPLACE_EVERY_S: a flapping switch must not reshuffle a
        # whole fleet in one pass. The longest silent goes first.
        node_id = max(candidates, key=lambda n: self.exp.silence[n])
        silent = self.exp.silence[node_id]
        for r in candidates[node_id]:
            self.prefer.pop(r.pk, None)
            self.set_shards(r, DesiredState.STOPPED)
            self.set_replica(
                r, ReplicaState.PENDING, f"replacing: node {node_id} silent {silent:.0f} s"
            )
            self.to_place[r.pk] = r
            self.report.replaced += 1
        status.last_replacement_at = self.now
        logger.warning(
            "replacing replicas of a silent node node=%s silent_s=%.0f replicas=%d",
            node_id,
            silent,
            len(candidates[node_id]),
        )
