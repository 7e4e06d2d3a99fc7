"""The audit trail: who changed what, when and through which door, newest first.
Changes when how the trail is asked for or shown does."""

from __future__ import annotations

from agentd.ctl.client import Api
from agentd.ctl.output import Output
from agentd.ctl.times import ago
from agentd.ctl.verb import Verb


def _change(field: str, said) -> str:
    """One field's change: 'before → after', or for a many-to-many 'add: a, b'."""
    if isinstance(said, dict):  # {"type": "m2m", "operation": "add", "objects": [...]}
        objects = ", ".join(map(str, said.get("objects", [])))
        return f"{field} {said.get('operation', '?')}: {objects}"
    before, after = said
    return f"{field}: {before} → {after}"


def _audit(api: Api, args, show: Output) -> None:
    page = api.call(
        "GET",
        "audit/",
        limit=args.limit,
        actor=args.actor,
        door=args.door,
        object_type=args.type,
        object=args.object,
        since=ago(args.since) if args.since else None,
    )
    rows = page.get("results", []) if isinstance(page, dict) else page
    if show.json(rows):
        return
    if not rows:
        show.note("no changes recorded that match")
        return
    table = [["WHEN (UTC)", "WHO", "DOOR", "ACTION", "OBJECT", "CHANGES"]]
    for r in rows:
        changes = ", ".join(_change(field, said) for field, said in r["changes"].items())
        table.append(
            [r["timestamp"][:19].replace("T", " "), r["actor"] or "(system)", r["door"],
             r["action"], f"{r['object_type']} {r['object_repr']}", changes[:120]]
        )  # fmt: skip
    show.table(table)


def _audit_arguments(p) -> None:
    p.add_argument("--actor", help="One user's changes.")
    p.add_argument("--door", help="admin, console, api, llmgw, 'manage.py CMD' or system.")
    p.add_argument("--type", help="What was changed: model, node, apikey, engineprofile …")
    p.add_argument("--object", help="One object's changes, by its id (a node's name).")
    p.add_argument("--since", help="How far back: 24h, 7d… or an ISO 8601 time.")
    p.add_argument("--limit", type=int, default=50, help="How many (default 50).")


VERBS = {
    "audit": Verb(
        "Who changed what, when and through which door; newest first.", _audit, _audit_arguments
    ),
}
