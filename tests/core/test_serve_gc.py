"""The web process's garbage collector (llmgw_site.serve._tune_gc).

With thousands of agents connected, a full collection walks every socket's
objects and stops the process for hundreds of milliseconds: each heartbeat and
gateway request in flight waits. Objects that live a few milliseconds (a
heartbeat waiting for its batch, a request waiting on its engine) must not age
into the old generation and set those collections off.

Run in processes of their own (so ``live``), so the collector's settings are the web process's,
not this test run's. Collections are counted, not timed: the counts depend only
on what is allocated and freed, not on how fast the machine is.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes.servers import collect_static

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.live

# A process holding many long-lived objects (a fleet's sockets), then serving
# requests: each leaves cyclic garbage (as asyncio's tasks and futures
# do) and keeps its own objects while the next ones arrive. Lists, because the
# collector tracks them always (a dict of numbers it leaves alone).
_SCRIPT = """
import collections, gc, json, sys

if sys.argv[1] == "serve":
    from llmgw_site import serve  # loads the app and sets the collector up
    from fleet.metrics import GC_FULL_PAUSE, REGISTRY
else:
    gc.freeze()  # the same start, with Python's own thresholds

sockets = [{"socket": i, "state": [i]} for i in range(150_000)]
gc.collect()
before = [g["collections"] for g in gc.get_stats()]
in_flight = collections.deque()
for n in range(80_000):
    garbage = [[] for _ in range(199)]
    garbage.append(garbage)  # freed only by the collector
    in_flight.append([[n] for _ in range(30)])
    if len(in_flight) > 50:
        in_flight.popleft()
after = [g["collections"] for g in gc.get_stats()]
out = {
    "middle": after[1] - before[1],
    "full": after[2] - before[2],
    "threshold": gc.get_threshold(),
}
if sys.argv[1] == "serve":
    name = GC_FULL_PAUSE.NAME + "_count"
    counted = REGISTRY.get_sample_value(name)
    gc.collect()
    out["pause_counted"] = REGISTRY.get_sample_value(name) - counted
print(json.dumps(out))
"""


def _run(mode: str) -> dict:
    # The web process loads only over collected static files, which a run collects once
    # (else this test passed only after one that started a web process).
    collect_static()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llmgw_site.settings"}
    env.setdefault("ALLOWED_HOSTS", "localhost")  # the app refuses to load without
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_short_lived_objects_set_off_no_full_collection_in_the_web_process():
    default = _run("python")
    tuned = _run("serve")
    # Python's own thresholds: the requests' objects age into the old generation
    # and set off full collections, each a walk over every long-lived object.
    assert default["full"] >= 1, default
    # The web process's: as many middle collections as make the collector weigh
    # a full one, and the requests' objects are gone before they age.
    assert tuned["threshold"][0] >= 50_000
    assert tuned["middle"] > tuned["threshold"][2], tuned
    assert tuned["full"] == 0, tuned
    # and each full collection that still happens is counted for Prometheus
    # (llmgw_web_gc_full_collection_seconds: how long the process stood still)
    assert tuned["pause_counted"] == 1
