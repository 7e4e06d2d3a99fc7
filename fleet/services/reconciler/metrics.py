"""The reconciler's own figures on /metrics, read from FleetStatus at scrape time.

Passes run in Celery workers, which nothing scrapes, so what a pass learned is
kept in the FleetStatus row and exported by whichever process serves /metrics.
"""

import logging

from django.db import DatabaseError
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger(__name__)

_registered = False


def _families():
    return {
        "paused": GaugeMetricFamily(
            "llmgw_reconciler_replacement_paused",
            "1 while more than half the fleet is silent and nothing is replaced.",
        ),
        "silent": GaugeMetricFamily(
            "llmgw_reconciler_silent_nodes", "Nodes silent past the suspect deadline."
        ),
        "fleet": GaugeMetricFamily(
            "llmgw_reconciler_fleet_nodes", "Nodes counted in the fleet (not lost)."
        ),
        "duration": GaugeMetricFamily(
            "llmgw_reconciler_last_pass_duration_seconds", "How long the last pass took."
        ),
        "age": GaugeMetricFamily(
            "llmgw_reconciler_last_pass_age_seconds",
            "Seconds since the last pass; growing means no worker or beat is running.",
        ),
        "passes": CounterMetricFamily("llmgw_reconciler_passes", "Passes run."),
    }


class ReconcilerCollector:
    def describe(self):
        return list(_families().values())

    def collect(self):
        from fleet.models import FleetStatus

        try:
            status = FleetStatus.objects.filter(pk=1).first()
        except DatabaseError:
            logger.warning("reconciler metrics: the database did not answer")
            return []
        if status is None or status.last_pass_at is None:
            return []
        f = _families()
        f["paused"].add_metric([], 1 if status.replacement_paused else 0)
        f["silent"].add_metric([], status.silent_nodes)
        f["fleet"].add_metric([], status.total_nodes)
        f["duration"].add_metric([], (status.last_pass_ms or 0) / 1000)
        f["age"].add_metric([], (timezone.now() - status.last_pass_at).total_seconds())
        f["passes"].add_metric([], status.passes)
        return list(f.values())


def register() -> None:
    global _registered
    if _registered:
        return
    from fleet.metrics import REGISTRY

    REGISTRY.register(ReconcilerCollector())
    _registered = True
