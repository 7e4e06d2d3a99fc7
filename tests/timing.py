"""Where the suite's time goes: the slowest modules and tests, printed after every run.

CI's output keeps it (``.ci/run`` runs ``make test`` twice), so a run that grew
slower says which module grew. Two figures for each test, setup and teardown
included, summed per module:

- **wall**: the seconds its worker spent on it. With xdist the modules ran side by
  side, so the sum is more than the run's wall time, and a test that waits on a
  process costs wall time but no core.
- **cpu**: the processor time its worker and the processes it started and reaped
  spent on it (``getrusage``: self and children). On a machine whose cores are all
  busy (CI's two), the run's wall time is about the summed CPU over the cores,
  so this is the figure to cut. A process a test leaves to another, such as an
  engine outliving its killed agent, is not counted.

Every test's figures go to ``timings.json`` in the run's state dir, with when it
began and on which worker: a long test begun late is the run's tail. Loaded with
``-p tests.timing`` (pyproject.toml's addopts).
"""

import json
import os
import resource
from collections import defaultdict
from pathlib import Path

import pytest

MODULES = 15
TESTS = 15

_wall: dict[str, float] = defaultdict(float)
_cpu: dict[str, float] = defaultdict(float)
_by_worker: dict[str, float] = defaultdict(float)
_began: dict[str, float] = {}  # when each test's setup began (epoch s)
_ran_on: dict[str, str] = {}
_last_cpu = [0.0]  # in a worker: its CPU figure when the last phase ended


def _cpu_now() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def pytest_runtest_logstart(nodeid, location) -> None:
    _last_cpu[0] = _cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    now = _cpu_now()
    outcome.get_result().user_properties.append(("cpu_s", now - _last_cpu[0]))
    _last_cpu[0] = now


def pytest_runtest_logreport(report) -> None:
    # On the controller under xdist too: each worker's reports arrive here.
    _wall[report.nodeid] += report.duration
    _cpu[report.nodeid] += dict(report.user_properties).get("cpu_s", 0.0)
    node = getattr(report, "node", None)  # the xdist worker that ran it
    worker = node.gateway.id if node is not None else "main"
    _by_worker[worker] += report.duration
    _began.setdefault(report.nodeid, report.start)
    _ran_on[report.nodeid] = worker


def _cpu_model() -> str:
    """The processor's name as /proc/cpuinfo gives it (Linux); '' elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def _machine_line(cpu_s: float) -> str:
    """The machine, and how much of its cores the run used: on CI's two cores the run's
    length is its CPU over the cores only when this is near 100 %; below, the workers
    were all waiting on the processes they started at once."""
    cores = os.cpu_count() or 1
    span = max(_began[n] + _wall[n] for n in _wall) - min(_began.values())
    busy = cpu_s / span / cores if span > 0 else 0.0
    model = _cpu_model()
    return (
        f"machine: {cores} CPUs{', ' + model if model else ''}; the tests kept "
        f"{busy:.0%} of them busy over the run's {span:.0f} s"
    )


def _per_module(figures: dict[str, float]) -> dict[str, float]:
    modules: dict[str, float] = defaultdict(float)
    for nodeid, seconds in figures.items():
        modules[nodeid.split("::", 1)[0]] += seconds
    return modules


def pytest_terminal_summary(terminalreporter) -> None:
    if not _wall or hasattr(terminalreporter.config, "workerinput"):
        return
    wall, cpu = _per_module(_wall), _per_module(_cpu)
    write = terminalreporter.write_line
    terminalreporter.section("where the time went")
    write(
        f"{sum(cpu.values()):8.1f} s CPU, {sum(wall.values()):.1f} s wall, "
        f"in {len(_wall)} tests over {len(wall)} modules (summed over workers)"
    )
    write(_machine_line(sum(cpu.values())))
    by_dir: dict[str, float] = defaultdict(float)
    for module, seconds in cpu.items():
        by_dir[module.rsplit("/", 1)[0]] += seconds
    dirs = sorted(by_dir.items(), key=lambda kv: -kv[1])
    write("CPU by directory: " + ", ".join(f"{d} {s:.0f} s" for d, s in dirs))
    write("wall by worker: " + ", ".join(f"{w} {s:.0f} s" for w, s in sorted(_by_worker.items())))
    write(f"slowest {MODULES} modules by CPU (  CPU s   wall s):")
    for module, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:MODULES]:
        write(f"{seconds:8.1f} {wall[module]:8.1f}  {module}")
    write(f"slowest {TESTS} tests by wall (  wall s   CPU s):")
    for nodeid, seconds in sorted(_wall.items(), key=lambda kv: -kv[1])[:TESTS]:
        write(f"{seconds:8.1f} {_cpu[nodeid]:8.1f}  {nodeid}")
    run_dir = os.environ.get("LLMGW_RUN_DIR") or os.environ.get("LLMGW_STATE_DIR")
    if run_dir:
        path = Path(run_dir) / "timings.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        first = min(_began.values())
        every = {
            n: {
                "wall_s": round(_wall[n], 2),
                "cpu_s": round(_cpu[n], 2),
                "began_s": round(_began[n] - first, 1),  # after the first test began
                "worker": _ran_on[n],
            }
            for n in _wall
        }
        path.write_text(json.dumps(dict(sorted(every.items())), indent=0))
        write(f"every test's figures: {path}")
