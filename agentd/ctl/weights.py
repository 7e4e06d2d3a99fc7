"""Weights on nodes (size, last use, what uses them) and their clean-up run now
(docs/weights.md). Changes when what an operator sees of or does to weights does."""

from __future__ import annotations

from agentd.ctl.client import Api, quote
from agentd.ctl.exits import EXIT_REFUSED, Failure
from agentd.ctl.output import Output
from agentd.ctl.verb import Verb


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _weights(api: Api, args, show: Output) -> None:
    query = []
    if args.node:
        query.append(f"node={quote(args.node)}")
    if args.unused:
        query.append("unused=true")
    rows = api.all_pages("weights/" + (f"?{'&'.join(query)}" if query else ""))
    if show.json(rows):
        return
    if not rows:
        show.line("no weights" + (" unused" if args.unused else "") + " on record")
        return
    table = [["NODE", "PATH", "SIZE", "UNUSED SINCE", "IN USE BY", "PINNED"]]
    for r in rows:
        table.append(
            [
                r["node"],
                r["path"],
                _size(r["size_bytes"]),
                "in use now" if r["in_use_by"] else (r.get("unused_since") or "-"),
                ", ".join(r["in_use_by"]) or "-",
                "yes" if r["pinned"] else "no",
            ]
        )
    show.table(table)


def _weights_arguments(p) -> None:
    p.add_argument("--node", help="Only this node's.")
    p.add_argument("--unused", action="store_true", help="Only what no shard needs.")


def _gc_weights(api: Api, args, show: Output) -> None:
    report = api.call("GET" if args.dry_run else "POST", "weights/cleanup/")
    if show.json(report):
        return
    if report.get("skipped"):
        raise Failure("a reconciler pass held the lock; try again", EXIT_REFUSED)
    for p in report["proposals"]:
        show.line(f"{p['node']} {p['path']} ({_size(p['size_bytes'])}): {p['reason']}")
    for p in report["refused"]:
        show.line(f"{p['node']} {p['path']}: kept although asked for: {p['reason']}")
    for p in report.get("waiting", []):  # absent from a control plane before it
        show.line(f"{p['node']} {p['path']}: asked for, not yet: {p['reason']}")
    verb = "would propose" if args.dry_run else "proposed"
    show.line(f"{verb} {len(report['proposals'])} for removal")


def _gc_weights_arguments(p) -> None:
    p.add_argument("--dry-run", action="store_true", help="Print what would go, and why.")


VERBS = {
    "weights": Verb(
        "Weights on nodes: size, last use, what uses them.", _weights, _weights_arguments
    ),
    "gc-weights": Verb(
        "Run the weights clean-up now (docs/weights.md).", _gc_weights, _gc_weights_arguments
    ),
}
