"""Autoscaling and scale to zero (docs/operations.md, "Autoscaling and scale to zero").

- ``decide``: the pure decision, ``decide(Policy, Facts) -> Decision``, tested with tables.
- ``load``: the gateways' reports in Redis (in flight, waiting, last request per model).
- ``step``: the reconciler pass's part: read the reports, decide, write the model and an Event.
- ``status``: what the admin, the API, the CLI and the console say about a model's scaling.

A new rule goes into ``decide`` with its reason string and a row in
tests/reconciler/test_autoscale_decide.py; a new fact is read in ``step`` (from the
pass's rows, or from the reports) and carried in ``Facts``.
"""
