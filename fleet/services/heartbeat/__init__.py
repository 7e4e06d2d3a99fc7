"""Heartbeats: from an agent's socket to the rows they update, a batch at a time.

Exports ``batcher()`` (the group-committing writer of the current event loop),
``attach``/``detach`` (an agent socket opened or closed), ``ReportMemo`` (what a
socket last had written, so an unchanged fact is no news), ``apply_heartbeats``
and ``HeartbeatResult``.

The modules: ``batching`` (group commit on a writer thread of its own),
``apply`` (the memo, and a batch's writes: the common part by one of two
writers, the rare part itself), ``orm`` and ``pg`` (the two writers of what
every heartbeat carries, side by side), ``columns`` (the load columns, named
once for both) and ``changes`` (row replacement and change logging, shared
with registration in ``fleet.services.inventory``).

Adding a fact to heartbeats, in order:

1. ``agentd/protocol/node.py``: the field on ``Heartbeat``, with its "unset means
   unchanged" value; then docs/protocol.md; then the agent sends it.
2. ``ReportMemo`` in ``apply``: if agents repeat the fact unchanged most of the
   time, remember what was written and send the writer no news instead.
3. The writers: a fact every heartbeat carries goes in both ``orm.apply_common``
   and ``pg.apply_common`` (a load figure: one line in ``columns``); a fact
   said now and then goes in ``apply._says_something_rare`` and ``_apply_rare``.
4. The parity test in tests/consumer/test_heartbeat_writes.py: both writers, the same
   heartbeats, the same rows.
"""

from .apply import HeartbeatResult, ReportMemo, apply_heartbeats
from .batching import attach, batcher, detach

__all__ = ["HeartbeatResult", "ReportMemo", "apply_heartbeats", "attach", "batcher", "detach"]
