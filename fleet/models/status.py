"""What the reconciler knows about the fleet as a whole (one row), and what it decided (events)."""

from django.db import models

from .choices import EventKind


class FleetStatus(models.Model):
    """The reconciler's own state between passes: one row, ``pk=1``.

    It lets a pass tell an outage (no pass for a while, so every node's silence
    is suspect) from a node going quiet, and shows operators why nothing is
    being replaced when most of the fleet went silent at once.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    last_pass_ms = models.FloatField("last pass (ms)", null=True, blank=True)
    passes = models.PositiveBigIntegerField(default=0)
    grace_from = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Silence is counted from here: the end of the last control-plane outage.",
    )
    silent_nodes = models.PositiveIntegerField(default=0)
    total_nodes = models.PositiveIntegerField(default=0)
    replacement_paused = models.BooleanField(
        default=False,
        help_text="More than half the fleet is silent: nothing is declared lost or replaced.",
    )
    message = models.TextField(blank=True, help_text="What operators should know, if anything.")
    last_replacement_at = models.DateTimeField(
        null=True, blank=True, help_text="When a lost node's replicas were last replaced."
    )
    gpu_brake = models.TextField(
        blank=True,
        help_text="Why failed GPUs' replicas are left where they are: more GPUs failed "
        "at once than LLMGW_GPU_FAILURE_BRAKE allows. Empty: the brake is off.",
    )
    cost_accrued_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Until when the fleet's GPU-hours are counted (fleet.services.costs).",
    )

    class Meta:
        verbose_name = "fleet status"
        verbose_name_plural = "fleet status"

    def __str__(self) -> str:
        return "fleet status"

    @classmethod
    def get(cls) -> "FleetStatus":
        return cls.objects.get_or_create(pk=1)[0]


class Event(models.Model):
    """Something the control plane decided by itself, with its reason: an operator's log.

    Today the autoscaler's decisions (``kind`` "autoscale", ``direction`` up or
    down, replicas from and to). The model's name is kept as well as the link,
    so an event outlives a deleted model. What the weights clean-up did to a
    node's weights is ``WeightsEvent`` instead (docs/operations.md, "Two kinds
    of events").
    """

    created_at = models.DateTimeField(db_index=True)
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    model = models.ForeignKey(
        "Model", null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    model_name = models.CharField(max_length=128)
    node_id = models.CharField(
        "node",
        max_length=63,
        blank=True,
        db_index=True,  # a node's page lists its own
        help_text="The node it concerns, if one.",
    )
    direction = models.CharField(max_length=8, blank=True, help_text="up or down.")
    from_replicas = models.PositiveIntegerField(null=True, blank=True)
    to_replicas = models.PositiveIntegerField(null=True, blank=True)
    reason = models.TextField()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        if self.from_replicas is None and self.to_replicas is None:
            return f"{self.model_name or self.node_id or self.kind}: {self.reason}"
        return f"{self.model_name}: {self.from_replicas} → {self.to_replicas} ({self.reason})"
