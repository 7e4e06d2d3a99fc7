"""``llmgw_autoscaler_decisions_total{model,direction}``, counted from the events at scrape time.

Decisions are made in Celery workers, which nothing scrapes; each is an
``Event`` row, so whichever process serves /metrics counts them (one grouped
query per scrape).
"""

import logging

from django.db import DatabaseError
from django.db.models import Count
from prometheus_client.core import CounterMetricFamily

logger = logging.getLogger(__name__)

_registered = False


def _family() -> CounterMetricFamily:
    return CounterMetricFamily(
        "llmgw_autoscaler_decisions",
        "Autoscaler decisions (each an event with its reason), by model and direction.",
        labels=["model", "direction"],
    )


class AutoscalerCollector:
    def describe(self):
        return [_family()]

    def collect(self):
        from fleet.models import Event, EventKind

        family = _family()
        try:
            rows = list(
                Event.objects.filter(kind=EventKind.AUTOSCALE)
                .values_list("model_name", "direction")
                .annotate(n=Count("id"))
                .order_by("model_name", "direction")
            )
        except DatabaseError:
            logger.warning("autoscaler metrics: the database did not answer")
            return []
        for model, direction, n in rows:
            family.add_metric([model, direction], n)
        return [family]


def register() -> None:
    global _registered
    if _registered:
        return
    from fleet.metrics import REGISTRY

    REGISTRY.register(AutoscalerCollector())
    _registered = True
