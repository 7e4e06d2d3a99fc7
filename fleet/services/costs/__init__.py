"""What the fleet costs, by team and model (docs/operations.md, "What the fleet costs").

- ``attribution``: who holds which GPUs (and shares, and CPU-only nodes) now; pure.
- ``accrual``: ``accrue``, beat's count of that into the hour's CostHour rows,
  and the closing of hours that are over.
- ``prices``: ``set_price``, ``price_at`` and the pricing of rows (``reprice``).
- ``budgets``: each team's spending this month, its warning and its refusal.
- ``report``: ``report`` and ``series``, from the CostHour rows alone.

A new kind of holder (a replica held by something other than its shards) is a
new ``attribution.Holder`` from ``accrual.read_facts``; nothing else changes.
"""

from .accrual import Accrued, accrue, close
from .budgets import Budget, spend, spent_refusal
from .prices import price_at, reprice, set_price
from .report import CostReport, CostRow, report, series

__all__ = [
    "Accrued",
    "Budget",
    "CostReport",
    "CostRow",
    "accrue",
    "close",
    "price_at",
    "report",
    "reprice",
    "series",
    "set_price",
    "spend",
    "spent_refusal",
]
