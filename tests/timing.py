"""Where the suite's time goes: the slowest modules and tests, printed after every run.

CI's output keeps it (``.ci/run`` runs ``make test`` twice), so a run that grew
slower says which module grew. Times are each test's setup, call and teardown as
the worker that ran it measured them, summed per module; with xdist the modules
ran side by side, so the sum is more than the run's wall time. Loaded with
``-p tests.timing`` (pyproject.toml's addopts).
"""

from collections import defaultdict

MODULES = 15
TESTS = 15

_by_module: dict[str, float] = defaultdict(float)
_by_test: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report) -> None:
    # On the controller under xdist too: each worker's reports arrive here.
    module = report.nodeid.split("::", 1)[0]
    _by_module[module] += report.duration
    _by_test[report.nodeid] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _by_test or hasattr(terminalreporter.config, "workerinput"):
        return
    total = sum(_by_module.values())
    write = terminalreporter.write_line
    terminalreporter.section("where the time went")
    write(f"{total:8.1f} s  in {len(_by_test)} tests over {len(_by_module)} modules (summed)")
    write(f"slowest {MODULES} modules:")
    for module, seconds in sorted(_by_module.items(), key=lambda kv: -kv[1])[:MODULES]:
        write(f"{seconds:8.1f} s  {100 * seconds / total:4.1f} %  {module}")
    write(f"slowest {TESTS} tests:")
    for nodeid, seconds in sorted(_by_test.items(), key=lambda kv: -kv[1])[:TESTS]:
        write(f"{seconds:8.1f} s  {nodeid}")
