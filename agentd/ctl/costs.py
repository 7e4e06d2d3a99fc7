"""What the fleet cost over a period, by team, model or GPU class, with the idle apart,
as a table or CSV (docs/operations.md, "What the fleet costs"). Changes when the cost
report does."""

from __future__ import annotations

from agentd.ctl.client import Api
from agentd.ctl.output import Output
from agentd.ctl.times import through
from agentd.ctl.verb import Verb


def _costs(api: Api, args, show: Output) -> None:
    query = {"start": args.from_, "end": through(args.to), "by": args.by}
    if args.csv:
        show.text(api.call("GET", "costs/", accept="text/csv", **query))
        return
    found = api.call("GET", "costs/", **query)
    if show.json(found):
        return
    period = f"{found['start'][:16].replace('T', ' ')} to {found['end'][:16].replace('T', ' ')}"
    show.note(f"costs from {period} UTC, of {found['seen']}")
    by = found["by"]
    head = [b.upper().replace("_", " ") for b in by]
    table = [[*head, "GPU-HOURS", "COST", "TOKENS", "PER 1M TOKENS", "UTILISATION"]]

    def figures(r) -> list[str]:
        per_m, use = r["cost_per_million_tokens"], r["utilisation"]
        return [
            f"{r['gpu_hours']:,.1f}",
            f"{_money(r['cost'])} {r['currency']}",
            f"{r['tokens']:,}" if not r["idle"] else "-",
            "-" if per_m is None else f"{_money(per_m)} {r['currency']}",
            "-" if use is None else f"{use:.0%}",
        ]

    for r in found["rows"]:
        table.append([*(_named(b, r[b]) for b in by), *figures(r)])
    for r in found["idle"]:
        table.append([f"idle ({_gpu(r['gpu_class'])})", *["" for _ in by[1:]], *figures(r)])
    for r in found["totals"]:
        table.append(["total", *["" for _ in by[1:]], *figures(r)])
    if len(table) == 1:
        show.note("no costs counted in that period")
        return
    show.table(table)
    if found["unpriced"]:
        show.note(f"no price for: {', '.join(map(_gpu, found['unpriced']))} (costed at 0)")


def _named(by: str, value: str) -> str:
    """A row's team, model or GPU class: the fleet's own models have no team."""
    if by == "gpu_class":
        return _gpu(value)
    return value or ("(fleet)" if by == "team" else "-")


def _gpu(gpu_class: str) -> str:
    """A GPU class as the report names it; "" is the hours of nodes without GPUs."""
    return gpu_class or "CPU-only nodes"


def _money(text) -> str:
    """A decimal the API sends as text, to two places: '12.345600' -> '12.35'."""
    return f"{float(text):,.2f}"


def _costs_arguments(p) -> None:
    p.add_argument(
        "--from",
        dest="from_",
        metavar="DATE",
        help="2026-11-01 or an ISO time (UTC); default: this month's start.",
    )
    p.add_argument("--to", metavar="DATE", help="The last day, included, or a time (default: now).")
    p.add_argument(
        "--by", default="team,model", help="team, model, gpu_class or several, comma-separated."
    )
    p.add_argument("--csv", action="store_true", help="The rows as CSV, for a spreadsheet.")


VERBS = {
    "costs": Verb(
        "What the fleet cost, by team and model, with the idle apart.", _costs, _costs_arguments
    ),
}
