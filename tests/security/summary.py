"""What the generated security walks covered, in every run's summary: a plugin that
tests/conftest.py registers (under pytest-xdist the run's own process loads no conftest
below tests/, so a hook in tests/security/conftest.py would never print).

Each walk's test records its counts as user properties (``record_property``), which
pytest-xdist carries from its workers to the run's own report, so the line appears
however the suite runs: "reference walk: 12 fields × 19 doors, 75 walks (1,717
tries)".
"""


def walked(stats: dict, name: str) -> list:
    """The values recorded as ``name`` by the tests that ran."""
    return [
        value
        for reports in stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for key, value in getattr(report, "user_properties", ())
        if key == name
    ]


def summary_lines(stats: dict) -> list[str]:
    lines = []
    if walks := walked(stats, "reference_walk"):
        doors = {door for w in walks for door in w["doors"]}
        line = (
            f"reference walk: {len(walks)} fields × {len(doors)} doors, "
            f"{sum(w['walks'] for w in walks)} walks ({sum(w['tries'] for w in walks):,} tries)"
        )
        for fields in walked(stats, "reference_fields"):
            line += f"; {fields['written_by_no_door']} reference fields written by no door"
        lines.append(line)
    if audits := walked(stats, "audit_walk"):
        lines.append(
            f"audit walk: {len(audits)} doors; {sum(a['audited'] for a in audits)} walks in "
            f"the trail with their user and door, {sum(a['unaudited'] for a in audits)} "
            "changing only what it leaves out (listed), "
            f"{sum(a['unchanged'] for a in audits)} doors that change nothing"
        )
    return lines


def pytest_terminal_summary(terminalreporter):
    if lines := summary_lines(terminalreporter.stats):
        terminalreporter.write_sep("-", "generated security walks")
        for line in lines:
            terminalreporter.write_line(line)
