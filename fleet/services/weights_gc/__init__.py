"""Cleaning up weights no shard needs: inventory, rules, the pass, and the node's reply.

The modules, in the order weights meet them:

- ``rules``: which entries go and why, a pure function of facts (no database,
  no clock): retention, pins, shared filesystems, disk watermarks.
- ``facts``: those facts read from the database in a few raw queries.
- ``cleanup``: the pass (``run_locked``, beat's task; ``dry_run``), which
  writes since when entries are unused and proposes removals.
- ``delivery``: a proposal sent by the node's socket while still current,
  and the node's reply recorded (events, counters).
- ``inventory``: weights per node for operators, pin and "remove now".
- ``metrics``: ``llmgw_weights_bytes`` and ``llmgw_weights_reclaimed_bytes_total``.

Adding a rule: a field on ``rules.Entry`` or ``rules.Policy``, read in
``facts``, decided in ``rules.select`` with a reason operators can act on,
and a case in tests/reconciler/test_weights_rules.py.
"""
