"""Tokens per key and model, from the gateways' counts: totals or one line per hour.
Changes when the usage report does; what it costs in money is in ``costs``."""

from __future__ import annotations

from agentd.ctl.client import Api
from agentd.ctl.output import Output
from agentd.ctl.verb import Verb


def _usage(api: Api, args, show: Output) -> None:
    rows = api.call("GET", "usage/", key=args.key, model=args.model, since=args.since)
    if show.json(rows):
        return
    if not rows:
        show.note(f"no usage in the last {args.since}")
        return
    head = ["KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION"]
    if args.hourly:
        table = [["HOUR (UTC)", *head]] + [
            [r["hour"][:13].replace("T", " ") + ":00", r["key"], r["model"], str(r["requests"]),
             str(r["prompt_tokens"]), str(r["completion_tokens"])]
            for r in rows
        ]  # fmt: skip
    else:
        totals: dict[tuple[str, str], list[int]] = {}
        for r in rows:
            t = totals.setdefault((r["key"], r["model"]), [0, 0, 0])
            t[0] += r["requests"]
            t[1] += r["prompt_tokens"]
            t[2] += r["completion_tokens"]
        table = [head] + [[k, m, *map(str, t)] for (k, m), t in sorted(totals.items())]
    show.table(table)


def _usage_arguments(p) -> None:
    p.add_argument("--key", help="A key's prefix or name.")
    p.add_argument("--model", help="One model.")
    p.add_argument("--since", default="7d", help="How far back: 24h, 7d… (default 7d).")
    p.add_argument("--hourly", action="store_true", help="One line per hour, not totals.")


VERBS = {
    "usage": Verb("Tokens per key and model, from the gateways' counts.", _usage, _usage_arguments),
}
