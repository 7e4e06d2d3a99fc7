"""The catalog: its models and LoRA adapters, applying a catalog file, asking where a
model could run, and a model's canary promoted or aborted. Changes when what an
operator sees of or does to the catalog does; teams are in ``teams``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentd.ctl.client import Api, quote
from agentd.ctl.exits import EXIT_REFUSED, EXIT_USAGE, Failure
from agentd.ctl.output import Output
from agentd.ctl.verb import Verb


def _models(api: Api, args, show: Output) -> None:
    def row(m) -> list[str]:
        return [
            m["name"],
            m.get("team") or "-",
            str(m.get("desired_replicas", "-")),
            str(m.get("priority", "-")),  # an older control plane has none
            m.get("scaling") or "-",  # an older control plane has no such field
            m.get("sleep") or "-",  # "1 asleep; after 300 s idle, level 1"
            str(m.get("active_profile_name") or m.get("active_profile") or "-"),
            (m.get("description") or "")[:60],
        ]

    header = [
        "MODEL",
        "TEAM",
        "REPLICAS",
        "PRIORITY",
        "SCALING",
        "SLEEP",
        "PROFILE",
        "DESCRIPTION",
    ]
    empty = "no models in the catalog: llmgw apply -f catalog.yaml"
    show.listing(api.all_pages("models/"), empty, header, row)


def _adapters(api: Api, args, show: Output) -> None:
    def row(a) -> list[str]:
        where = [
            f"{w['node']} ({w['state']})" + (f": {w['error'][:60]}" if w.get("error") else "")
            for w in a.get("loaded") or []
        ]
        return [a["name"], a["model_name"], a["source"][:60], ", ".join(where) or "-"]

    header = ["ADAPTER", "MODEL", "SOURCE", "LOADED ON"]
    empty = "no adapters: declare them under their model (llmgw apply -f catalog.yaml)"
    show.listing(api.all_pages("adapters/"), empty, header, row)


def _read_file(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise Failure(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _apply(api: Api, args, show: Output) -> None:
    text = _read_file(args.file)
    try:
        result = api.call("POST", "catalog/apply/", {"catalog": text, "dry_run": args.dry_run})
    except Failure as exc:
        if exc.code == EXIT_REFUSED:
            raise Failure(
                f"{args.file}: nothing applied:\n{_indent(str(exc))}", EXIT_REFUSED
            ) from None
        raise
    if show.json(result):
        return
    prefix = "would change: " if args.dry_run else ""
    show.lines(prefix + line for line in result["changes"])
    if not result["changes"]:
        show.line("nothing to change")
    elif result["unchanged"]:
        show.line(f"unchanged: {', '.join(result['unchanged'])}")


def _apply_arguments(p) -> None:
    p.add_argument("-f", "--file", required=True, help="catalog.yaml, or - for stdin")
    p.add_argument("--dry-run", action="store_true", help="Say what would change only.")


def _explain(api: Api, args, show: Output) -> None:
    body = {"model": args.model, "profile": args.profile or ""}
    if args.file:
        body["catalog"] = _read_file(args.file)
    result = api.call("POST", "catalog/explain/", body)
    if show.json(result):
        return
    show.lines(result["lines"])


def _explain_arguments(p) -> None:
    p.add_argument("model")
    p.add_argument("--profile", help="Ask about this profile instead of the active one.")
    p.add_argument("-f", "--file", help="A catalog file to consider applied first (what if).")


def _canary(api: Api, args, show: Output) -> None:
    """``llmgw canary promote qwen --why "p95 within bounds"``."""
    found = api.all_pages(f"models/?name={quote(args.model)}")
    if not found:
        raise Failure(f"no model named '{args.model}'", EXIT_REFUSED)
    path = "promote" if args.verb == "promote" else "abort-canary"
    body = {"why": args.why} if args.why else {}
    result = api.call("POST", f"models/{found[0]['id']}/{path}/", body)
    if show.json(result):
        return
    show.line(result["detail"])


def _canary_arguments(p) -> None:
    p.add_argument("verb", choices=["promote", "abort"])
    p.add_argument("model")
    p.add_argument("--why", help="Said in the event.")


VERBS = {
    "models": Verb("The catalog's models.", _models),
    "adapters": Verb("LoRA adapters, their models and where they are loaded.", _adapters),
    "explain": Verb(
        "Why a new replica of MODEL could run on each node.", _explain, _explain_arguments
    ),
    "apply": Verb("Apply a catalog file: all of it, or nothing.", _apply, _apply_arguments),
    "canary": Verb(
        "Promote MODEL's canary to its active profile, or abort it.", _canary, _canary_arguments
    ),
}
