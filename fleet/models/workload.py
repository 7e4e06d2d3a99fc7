"""Replicas and their shards: what actually runs where."""

import uuid

from django.db import models

from .catalog import Model
from .choices import DesiredState, Evict, ReplicaState, ShardState
from .nodes import Node
from .profiles import EngineProfile


def new_id() -> str:
    return uuid.uuid4().hex[:16]


class Replica(models.Model):
    """One serving copy of a model, made of one shard per node it spans.

    It is ready when all its shards are ready. A replica that cannot be placed
    stays pending, and ``reason`` says what was short.
    """

    id = models.CharField(primary_key=True, max_length=32, default=new_id, editable=False)
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="replicas")
    profile = models.ForeignKey(EngineProfile, on_delete=models.PROTECT, related_name="replicas")
    state = models.CharField(
        max_length=16, choices=ReplicaState.choices, default=ReplicaState.PENDING
    )
    reason = models.TextField(blank=True, help_text="Why it is pending or failed.")
    state_changed_at = models.DateTimeField(null=True, blank=True)
    # Restart bookkeeping, kept on the replica because a multi-node replica
    # restarts as a group.
    failures = models.PositiveIntegerField(
        default=0, help_text="Failed starts in a row; reset when it becomes ready."
    )
    restarts = models.PositiveIntegerField(
        default=0,
        help_text="Times the reconciler restarted it after a shard failed, all told; "
        "never reset. Each restart starts new shards.",
    )
    retry_at = models.DateTimeField(
        null=True, blank=True, help_text="Not restarted before this (backoff after a failure)."
    )
    spec_hash = models.CharField(
        max_length=64,
        blank=True,
        help_text="What its profile said when it was created; an edit since rolls it.",
    )
    node_failures = models.JSONField(
        default=dict,
        blank=True,
        help_text="Failed starts per node. A node with too many is tried last.",
    )
    # Preemption (docs/operations.md, "Priorities"): a replica drained to make room
    # names the replica it made room for; its replacement says by whom it waits.
    preempted_for = models.CharField(
        max_length=32, blank=True, help_text="The replica this one was drained to make room for."
    )
    preempted_by = models.CharField(
        max_length=200,
        blank=True,
        help_text="Who took this model's place, e.g. 'qwen-72b (priority 90)'; "
        "cleared once it is placed again.",
    )
    # Sleep (docs/operations.md, "Sleep and wake"): a replica put to sleep to make room
    # on its GPUs names the replica it made room for, until it wakes.
    sleep_for = models.CharField(
        max_length=32,
        blank=True,
        help_text="The replica this one went to sleep to make room for (to wake or be placed).",
    )
    # An operator's drain, stop or restart of this replica alone (fleet.services.drain).
    evict = models.CharField(
        max_length=8,
        choices=Evict.choices,
        blank=True,
        default=Evict.NONE,
        help_text="Asked by an operator: drain (a replacement first), stop or restart.",
    )
    evict_at = models.DateTimeField(null=True, blank=True, help_text="When it was asked.")
    evict_by = models.CharField(max_length=150, blank=True, help_text="Who asked.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "created_at"]
        permissions = [
            # Apart from the model's change permission: it moves serving traffic now.
            ("drain_replica", "Can drain, stop and restart single replicas"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}#{self.id[:8]}"


class Shard(models.Model):
    """A replica's part on one node: one engine process group.

    ``desired_state`` is the control plane's intent; ``state`` is what the agent
    last reported.
    """

    id = models.CharField(primary_key=True, max_length=100, default=new_id, editable=False)
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="shards")
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="shards"
    )
    rank = models.PositiveSmallIntegerField(default=0, help_text="0 serves HTTP.")
    gpu_uuids = models.JSONField("GPUs", default=list, blank=True)
    hcas = models.JSONField("HCAs", default=list, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    spec = models.JSONField(
        default=dict,
        blank=True,
        help_text="The model name and profile as they were when it was placed: what the agent "
        "runs. Editing the profile rolls replicas instead of changing this under a live engine.",
    )
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.RUNNING
    )
    state = models.CharField(max_length=16, choices=ShardState.choices, default=ShardState.PENDING)
    error = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    last_output = models.JSONField(default=list, blank=True, help_text="Last lines of output.")
    adapters = models.JSONField(
        default=list,
        blank=True,
        help_text="The LoRA adapters its engine holds, as the agent last reported them: "
        '[{"name", "state" (loading, loaded, failed), "error", "id"}].',
    )
    fetch_source = models.CharField(max_length=1024, blank=True)
    fetch_bytes_done = models.PositiveBigIntegerField(null=True, blank=True)
    fetch_bytes_total = models.PositiveBigIntegerField(null=True, blank=True)
    fetch_updated_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["replica", "rank"]

    def __str__(self) -> str:
        return f"{self.id} (rank {self.rank} on {self.node_id or '-'})"
