"""The order tests are handed to xdist's workers, so the run keeps both cores busy.

`make test` runs ``-n 3 --dist worksteal``: each worker is first given a contiguous
third of the collected tests, and a worker that runs out takes the back half of the
longest queue left. In collection order the thirds were lopsided: the first two
were the in-process tests, which keep a core busy, and the last the end-to-end
tier, whose tests mostly wait on the processes they started. The run's second
half then had three workers waiting on stacks and a core and a half in use
(sampled from /proc/stat), the whole suite 20 % longer than its CPU needs.

So, under xdist, each worker's third is made to mix the two:

- *Waiting* modules (tests/e2e, the browser tier, anything marked ``live``) are
  dealt to the thirds by their estimated wall time, the longest first, each to the
  third with the least so far: the scenarios that take minutes start at once,
  on different workers, instead of ending the run late.
- The in-process modules fill each third, in collection order, to the size
  worksteal gives it, and the waiting modules are spread evenly through it, so a
  worker waiting on a stack leaves its core to the two beside it.
- The in-process tests come last in each third: what a finished worker steals is
  short.

A module is never split between waiting modules (its module-scoped fixtures, a
vLLM engine for one, start once); an in-process module may be, at a third's end.
Without xdist the order is left as collected.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# Modules that run minutes of wall, and about how many seconds (a PostgreSQL run at
# 1b6ea95 on CI's machine): real vLLM starting and restarting, faults that play out
# over a minute, the schema fuzz. Only the ratios matter.
LONG_S = {
    "e2e/test_sleep.py": 240,
    "e2e/test_vllm_real.py": 200,
    "api/test_api_fuzz.py": 160,
    "e2e/test_faults_cutoff.py": 150,
    "e2e/test_faults_control_plane.py": 110,
    "e2e/test_faults_database.py": 100,
    "e2e/test_multi_node.py": 80,
    "engines/test_vllm_contract.py": 50,
}
# The guess for a test of any other module, in seconds of wall (in-process ones: 0).
E2E_S, LIVE_S = 20.0, 2.0


def _estimate(module: Path, tests: list) -> float:
    """Seconds of wall the module's tests are guessed to take; 0 for in-process ones."""
    name = module.relative_to(TESTS).as_posix()
    if name in LONG_S:
        return LONG_S[name]
    if TESTS / "e2e" in module.parents:
        return E2E_S * len(tests)
    live = [t for t in tests if t.get_closest_marker("live") or t.get_closest_marker("browser")]
    return LIVE_S * len(live)


def _third_sizes(total: int, workers: int) -> list[int]:
    """How many tests worksteal first gives each worker (xdist/scheduler/worksteal.py)."""
    sizes, left = [], total
    for remaining in range(workers, 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    return sizes


def interleave(items: list, workers: int) -> list:
    """``items`` reordered into ``workers`` mixed thirds (see the module's docstring)."""
    modules: dict[Path, list] = defaultdict(list)
    for item in items:
        modules[item.path].append(item)
    waiting, busy = [], []
    for module, tests in modules.items():
        weight = _estimate(module, tests)
        (waiting if weight else busy).append((weight, tests))

    sizes = _third_sizes(len(items), workers)
    thirds_waiting: list[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    count = [0] * workers
    for weight, tests in sorted(waiting, key=lambda wt: -wt[0]):
        # The least loaded third with room left; any third when none has room.
        roomy = [i for i in range(workers) if count[i] + len(tests) <= sizes[i]] or range(workers)
        i = min(roomy, key=lambda k: load[k])
        thirds_waiting[i].append(tests)
        load[i] += weight
        count[i] += len(tests)

    flat_busy = [t for _, tests in busy for t in tests]
    ordered: list = []
    start = 0
    for i in range(workers):
        room = max(0, sizes[i] - count[i]) if i < workers - 1 else len(flat_busy) - start
        mine = flat_busy[start : start + room]
        start += room
        # Waiting module k goes before in-process test k * len(mine) / (their number).
        at = defaultdict(list)
        for k, tests in enumerate(thirds_waiting[i]):
            at[k * len(mine) // len(thirds_waiting[i])].extend(tests)
        for j, test in enumerate(mine):
            ordered.extend(at.pop(j, []))
            ordered.append(test)
        for rest in at.values():
            ordered.extend(rest)
    assert len(ordered) == len(items), "every test kept, once"
    return ordered


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        items[:] = interleave(items, workers)
