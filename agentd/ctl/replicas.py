"""One replica drained (a replacement first), stopped or restarted, named as events and
pages print it. Changes when what an operator does to a single replica does."""

from __future__ import annotations

from agentd.ctl.client import Api, quote
from agentd.ctl.exits import EXIT_USAGE, Failure
from agentd.ctl.output import Output
from agentd.ctl.verb import Verb


def _replica(api: Api, args, show: Output) -> None:
    """``llmgw replica drain qwen#1381a499``: the id, or the part after '#', unique."""
    given = args.replica.rsplit("#", 1)[-1]
    found = api.all_pages(f"replicas/?id__startswith={quote(given)}")
    live = [r for r in found if r["state"] != "stopped"] or found
    if len(live) != 1:
        which = ", ".join(f"{r['model_name']}#{r['id']}" for r in live[:5])
        raise Failure(
            f"'{args.replica}' names {len(live)} replicas{': ' + which if which else ''}; "
            "give more of its id (llmgw node NODE --json lists them)",
            EXIT_USAGE,
        )
    result = api.call("POST", f"replicas/{live[0]['id']}/{args.verb}/")
    if show.json(result):
        return
    show.line(result["detail"])


def _replica_arguments(p) -> None:
    p.add_argument("verb", choices=["drain", "stop", "restart"])
    p.add_argument("replica", help="Its id, or MODEL#ID as events and pages print it.")


VERBS = {
    "replica": Verb(
        "Drain (a replacement first), stop (one fewer) or restart one replica.",
        _replica,
        _replica_arguments,
    ),
}
