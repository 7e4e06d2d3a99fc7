"""What happened to weights on nodes: the clean-up's proposals and the nodes' replies."""

from django.db import models
from django.utils import timezone

from .nodes import Node


class WeightsEvent(models.Model):
    """One weights entry's fate in a removal: proposed, removed, kept (and why), or dropped.

    Written by ``fleet.services.weights_gc`` when it proposes and when the node
    replies; trimmed after ``LLMGW_WEIGHTS_EVENTS_KEEP_S``. The control plane's
    decisions about models (the autoscaler's) are ``Event`` instead
    (docs/operations.md, "Two kinds of events").
    """

    class Action(models.TextChoices):
        PROPOSED = "proposed", "proposed"  # a pass chose it and asked the node
        REMOVED = "removed", "removed"  # the node removed it
        KEPT = "kept", "kept"  # the node (or the control plane) kept it; reason says why
        DROPPED = "dropped", "dropped"  # the proposal went stale before it reached the node

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="weights_events")
    path = models.CharField(max_length=1024)
    source = models.CharField(max_length=1024, blank=True)
    size_bytes = models.PositiveBigIntegerField("size (bytes)", default=0)
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.TextField(blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.path} {self.action}"
