"""What the operator's console shows: the cluster, one node, one model, as plain data.

The pages (``fleet/console/``) only lay these out. Exports ``cluster`` (the
cluster page: ``totals``, one page of ``node_queryset``, the models, pending
replicas), ``node_detail`` and ``models_on_node`` (a node's page and its
charts' models), ``model_detail`` and ``gateway_figures`` (a model's page),
``batch_list`` and ``batch_detail`` (the Batches page and a batch's), and the
dataclasses they return.

The modules: ``lines`` (a node as a table line: its bars, GPUs, engines,
disks; shared by the cluster and node pages), ``cluster``, ``node``, ``model``,
``batches``, and ``costs`` (the cost page: ``period`` and ``cost_page``, imported
as ``services.console.costs``).

Adding to a page: read in a fixed number of queries whatever the fleet's size
(a prefetch or an aggregate, never a query per row), return plain data, and
extend the page's query-count test in tests/console/. Unknown is not zero: a
figure the node never sent is None and shows "-".
"""

from .batches import (
    BATCHES_SHOWN,
    STATUS_FILTERS,
    BatchDetail,
    BatchList,
    batch_detail,
    batch_list,
    progress_text,
)
from .cluster import PAGE_SIZE, STATE_FILTERS, Cluster, cluster, node_queryset, totals
from .lines import Bar, NodeLine, node_line
from .model import GatewayFigures, ModelDetail, gateway_figures, model_detail
from .node import NodeDetail, models_on_node, node_detail

__all__ = [
    "BATCHES_SHOWN",
    "PAGE_SIZE",
    "STATE_FILTERS",
    "STATUS_FILTERS",
    "Bar",
    "BatchDetail",
    "BatchList",
    "Cluster",
    "GatewayFigures",
    "ModelDetail",
    "NodeDetail",
    "NodeLine",
    "batch_detail",
    "batch_list",
    "cluster",
    "gateway_figures",
    "model_detail",
    "models_on_node",
    "node_detail",
    "node_line",
    "node_queryset",
    "progress_text",
    "totals",
]
