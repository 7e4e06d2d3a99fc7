"""What a GPU's errors mean to a fleet: the XID table and a GPU's health.

One table, here only, of the XIDs that matter to llmgw, each with NVIDIA's
meaning in a few words and what llmgw does about it:

- ``watch``: count it, nothing else. Mostly an application's fault (a bad
  kernel, a page fault); the engine that caused it dies and is restarted, the
  GPU is fine.
- ``drain``: the GPU is degraded. Cordon it and replace what runs on it.
- ``fail``: the GPU is failed. Drain it and hold it out of placement until an
  operator clears it (reset, replaced).

The numbers and meanings are NVIDIA's (the Xid catalog for Ampere and newer,
docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, and the older
Xid error listing, docs.nvidia.com/deploy/xid-errors/). Where the catalog's
immediate action is a GPU reset or a machine restart, llmgw fails the GPU:
llmgw resets nothing, so the GPU stays out until someone has. An XID not in
the table is watched.

``health()`` is pure: a GPU's recent events, its current problems (the texts
``NVML.problems()`` reports) and its harmful clock slowdowns in; its state and
the reasons, worst first, out. No NVML and no Django here, so the control
plane can use it as well as the agent.

To extend: add a row to ``XIDS``. A new problem text from ``nvml.py`` is
degraded unless it says the GPU needs service (``problem_state``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    WATCH = "watch"  # count it; the GPU is fine
    DRAIN = "drain"  # degraded: cordon it, replace what runs on it
    FAIL = "fail"  # failed: drain it and hold it out until an operator clears it


class Health(StrEnum):
    HEALTHY = "healthy"  # nothing that counts
    DEGRADED = "degraded"  # cordoned: nothing new placed on it
    FAILED = "failed"  # held out until an operator clears it


# Event kinds as the watcher in nvml.py names the driver's event types.
XID_EVENT = "xid"
DOUBLE_BIT_ECC_EVENT = "double_bit_ecc"
CLOCK_EVENT = "clock"


@dataclass(frozen=True)
class Xid:
    number: int
    meaning: str  # NVIDIA's meaning, in a few words
    action: Action


XIDS: dict[int, Xid] = {
    x.number: x
    for x in (
        # Application faults: the catalog says restart the application.
        Xid(13, "Graphics Engine Exception", Action.WATCH),
        Xid(31, "GPU memory page fault", Action.WATCH),
        Xid(43, "GPU stopped processing", Action.WATCH),
        Xid(45, "Preemptive cleanup, due to previous errors", Action.WATCH),
        # The GPU itself.
        Xid(46, "GPU timeout error", Action.FAIL),
        Xid(48, "Double Bit ECC Error", Action.FAIL),
        Xid(61, "Internal micro-controller breakpoint/warning", Action.DRAIN),
        Xid(62, "Internal micro-controller halt", Action.DRAIN),
        # A row was remapped: not harmful alone. The reset it asks for shows
        # as "row remapping pending" among the problems, which degrades the GPU.
        Xid(63, "ECC page retirement or row remapping recording event", Action.WATCH),
        Xid(64, "ECC page retirement or row remapper recording failure", Action.FAIL),
        Xid(74, "NVLink error", Action.DRAIN),
        Xid(79, "GPU has fallen off the bus", Action.FAIL),
        Xid(92, "High single-bit ECC error rate", Action.DRAIN),
        Xid(94, "Contained ECC error", Action.DRAIN),
        Xid(95, "Uncontained ECC error", Action.FAIL),
        Xid(109, "Context switch timeout", Action.FAIL),
        Xid(110, "Security fault", Action.FAIL),
        Xid(119, "GSP RPC timeout", Action.FAIL),
        Xid(120, "GSP error", Action.FAIL),
        # NVLink did not come up: like 74, the GPU still computes on its own.
        Xid(136, "NVLink training failed", Action.DRAIN),
        Xid(140, "Unrecovered ECC error", Action.FAIL),
        Xid(143, "GPU initialization failure", Action.FAIL),
        # The driver's recovery action changed; the number alone does not say
        # to what, and the XID that came with it decides whether it failed.
        Xid(154, "GPU recovery action changed", Action.DRAIN),
        Xid(158, "GPU fatal timeout", Action.FAIL),
    )
}


def lookup(number: int) -> Xid:
    """The table's row for an XID; one it lacks is watched."""
    return XIDS.get(number) or Xid(number, "not in llmgw's XID table", Action.WATCH)


@dataclass(frozen=True)
class GPUEvent:
    """One critical event as the driver delivered it."""

    index: int | None  # the GPU's index on its node; None when the driver named a GPU not watched
    uuid: str
    kind: str  # XID_EVENT, DOUBLE_BIT_ECC_EVENT, CLOCK_EVENT, or the event type in hex
    xid: int | None = None  # the XID number, for XID_EVENT


@dataclass(frozen=True)
class GPUHealth:
    state: Health
    reasons: tuple[str, ...] = ()  # what counted, worst first; empty when healthy

    @property
    def reason(self) -> str:
        """The one that decided the state: "XID 79: GPU has fallen off the bus"."""
        return self.reasons[0] if self.reasons else ""


_STATE = {Action.WATCH: Health.HEALTHY, Action.DRAIN: Health.DEGRADED, Action.FAIL: Health.FAILED}
_RANK = {Health.HEALTHY: 0, Health.DEGRADED: 1, Health.FAILED: 2}


def event_finding(event: GPUEvent) -> tuple[Action, str]:
    """What one event means: the action and the reason in NVML's words."""
    if event.kind == XID_EVENT and event.xid is not None:
        row = lookup(event.xid)
        return row.action, f"XID {row.number}: {row.meaning}"
    if event.kind == DOUBLE_BIT_ECC_EVENT:
        # On Ampere and newer a contained error (XID 94) also counts as one; the
        # XID that comes with it says whether the GPU failed.
        return Action.DRAIN, "double bit ECC error"
    # Clock changes and anything else: the clock-event reasons say whether it hurts.
    return Action.WATCH, event.kind


def problem_state(problem: str) -> Health:
    """A problem from ``NVML.problems()``: failed where the GPU cannot be read or needs
    service, else degraded (placement already keeps off any GPU with a problem)."""
    if problem.startswith("unreadable through NVML") or "needs service" in problem:
        return Health.FAILED
    return Health.DEGRADED


def health(
    events: Iterable[GPUEvent], problems: Iterable[str] = (), slowdowns: Iterable[str] = ()
) -> GPUHealth:
    """A GPU's health from its recent events, its current problems and its harmful clock
    slowdowns ("HW Thermal Slowdown"). The worst finding decides; among equals, events
    (the cause) come before the problems they leave behind."""
    found: list[tuple[Health, str]] = []
    for event in events:
        action, reason = event_finding(event)
        if action is not Action.WATCH:
            found.append((_STATE[action], reason))
    found += [(problem_state(p), p) for p in problems]
    found += [(Health.DEGRADED, f"clocks slowed: {s}") for s in slowdowns]
    if not found:
        return GPUHealth(Health.HEALTHY)
    found.sort(key=lambda f: -_RANK[f[0]])  # stable: arrival order among equals
    reasons = tuple(dict.fromkeys(reason for _state, reason in found))
    return GPUHealth(found[0][0], reasons)
