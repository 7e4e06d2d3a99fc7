"""Weights figures on /metrics, read from the database at scrape time.

Removals are recorded by whichever process holds the node's socket, so the
running total lives on the node's row (``Node.weights_reclaimed_bytes``,
added to in the database) and any process serving /metrics reports it.
"""

import logging

from django.db import DatabaseError
from django.db.models import Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger(__name__)

_registered = False


def _families():
    return {
        "bytes": GaugeMetricFamily(
            "llmgw_weights_bytes", "Bytes of model weights on the node's disks.", labels=["node"]
        ),
        "reclaimed": CounterMetricFamily(
            "llmgw_weights_reclaimed_bytes",
            "Bytes of unused weights the node removed when the clean-up asked.",
            labels=["node"],
        ),
    }


class WeightsCollector:
    def describe(self):
        return list(_families().values())

    def collect(self):
        from fleet.models import LocalWeights, Node

        f = _families()
        try:
            sizes = dict(
                LocalWeights.objects.values_list("node_id")
                .annotate(total=Sum("size_bytes"))
                .values_list("node_id", "total")
            )
            nodes = list(Node.objects.values_list("pk", "weights_reclaimed_bytes"))
        except DatabaseError:
            logger.warning("weights metrics: the database did not answer")
            return []
        for node_id, reclaimed in nodes:
            f["bytes"].add_metric([node_id], sizes.get(node_id) or 0)
            f["reclaimed"].add_metric([node_id], reclaimed)
        return list(f.values())


def register() -> None:
    global _registered
    if _registered:
        return
    from fleet.metrics import REGISTRY

    REGISTRY.register(WeightsCollector())
    _registered = True
