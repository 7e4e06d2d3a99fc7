"""Real NVML events on a real GPU: what the agent's GPU watch would see, printed.

    .venv/bin/python bench/gpu_events.py [SECONDS]

Opens NVML as the agent does (agentd.nvml.NVML.open()), registers every GPU
for the critical events it supports (XID errors, double-bit ECC; clock
changes where the GPU still has them), and waits SECONDS (default 10) for
them. Then prints, per GPU: its name, which events it is registered for, its
harmful clock slowdowns and its problems as the agent reports them, its health
by agentd.xid's table; and every event seen, with the XID's meaning and what
llmgw does about it. A quiet GPU shows no events: that is the healthy answer.

On a machine without an NVIDIA driver (a CPU node) it says NVML is unavailable
and exits 0. Exit status 1 when waiting for events failed.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml  # noqa: E402

from agentd.gpuwatch import describe  # noqa: E402
from agentd.nvml import NVML, WATCHED_EVENTS, Checks  # noqa: E402
from agentd.xid import health  # noqa: E402


def _kinds(mask: int) -> str:
    return ", ".join(kind for bit, kind in WATCHED_EVENTS.items() if mask & bit) or "none"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("seconds", nargs="?", type=float, default=10.0, help="how long to wait")
    opts = p.parse_args()
    session = NVML.open()
    if session is None:
        print("NVML is unavailable (no NVIDIA driver): nothing to watch on this machine")
        return 0
    status = 0
    try:
        watcher = session.watch()
        print(
            f"driver {session.driver_version}, CUDA {session.cuda_version or '-'}: "
            f"{len(session.devices)} GPU(s); waiting {opts.seconds:g} s for events"
        )
        seen = []
        started = time.monotonic()
        deadline = started + opts.seconds
        try:
            while (left := deadline - time.monotonic()) > 0:
                for event in watcher.wait(max(1, int(min(left, 1.0) * 1000))):
                    at = time.monotonic() - started
                    seen.append((at, event))
                    print(f"  +{at:6.2f} s  GPU {event.index}: {describe(event)}", flush=True)
        except pynvml.NVMLError as exc:
            print(f"waiting for events failed: {exc}")
            status = 1
        finally:
            watcher.close()

        gpus = {g.index: g for g in session.gpus(Checks())}
        slowdowns = session.slowdowns()
        for d in session.devices:
            g = gpus.get(d.index)
            events = [e for _at, e in seen if e.index == d.index]
            problems = g.problems if g else []
            h = health(events, problems, slowdowns.get(d.index, []))
            print(f"GPU {d.index}: {g.name if g and g.name else '?'} ({g.uuid if g else '?'})")
            print(f"  events registered: {_kinds(watcher.registered.get(d.index, 0))}")
            print(f"  slowdowns:         {', '.join(slowdowns.get(d.index, [])) or 'none'}")
            print(f"  problems:          {'; '.join(problems) or 'none'}")
            print(f"  health:            {h.state}" + (f" ({h.reason})" if h.reason else ""))
            print(f"  events seen:       {len(events)}")
        strays = [e for _at, e in seen if e.index is None]
        if strays:
            print(f"{len(strays)} event(s) named a GPU not registered: {strays}")
        print(f"{len(seen)} event(s) in {opts.seconds:g} s")
    finally:
        session.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
