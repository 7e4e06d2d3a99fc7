"""The Django admin for every fleet model.

Observed facts (what agents report) are read-only everywhere; operators edit
only their intent (cordon, drain, operator labels) and the catalog. Actions
call fleet.services, never re-implement them.
"""

from . import access, batches, catalog, costs, gpus, nodes, teams, third_party, weights, workload

__all__ = [
    "access",
    "batches",
    "catalog",
    "costs",
    "gpus",
    "nodes",
    "teams",
    "third_party",
    "weights",
    "workload",
]
