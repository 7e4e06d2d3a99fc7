"""The nodes: the table, one node in full, cordon, drain (and waiting for it), revoking
a node's credentials, its vLLM build and its logs. Changes when what an operator sees
of or does to a node does; a node's notice of going away is in ``faults``.
"""

from __future__ import annotations

import argparse
import time

from agentd.ctl import faults
from agentd.ctl.client import Api, quote
from agentd.ctl.exits import EXIT_REFUSED, EXIT_TIMEOUT, EXIT_USAGE, Failure, require_yes
from agentd.ctl.output import Output
from agentd.ctl.verb import Verb


def _nodes(api: Api, args, show: Output) -> None:
    rows = api.call("GET", "nodes/table/")
    if show.json(rows):
        return
    if not rows:
        show.line("no nodes yet: enrol one with a join token (manage.py create_join_token)")
        return
    show.node_table(rows)


def _node(api: Api, args, show: Output) -> None:
    node = api.call("GET", f"nodes/{quote(args.node)}/")
    if show.json(node):
        return
    load = node.get("load") or {}
    fields = [
        ("node", node["id"]),
        ("hostname", node.get("hostname") or "-"),
        (
            "state",
            node["state"]
            + (
                ",draining" if node.get("draining") else ",cordoned" if node.get("cordoned") else ""
            ),
        ),
        ("connected", "yes" if node.get("connected") else "no"),
        ("last seen", node.get("last_seen") or "-"),
        ("agent", node.get("agent_version") or "-"),
        ("address", node.get("mgmt_addr") or "-"),
        (
            "memory",
            f"{node['memory_total_mb'] / 1000:.1f} GB" if node.get("memory_total_mb") else "-",
        ),
        ("CPU", f"{load['cpu_percent']:.0f} %" if load.get("cpu_percent") is not None else "-"),
        (
            "engines",
            ", ".join(f"{k} {v}" for k, v in sorted((node.get("engine_versions") or {}).items()))
            or "-",
        ),
        ("vLLM build", node.get("vllm_build") or "-"),
        (
            "installs",
            "; ".join(_install_text(i) for i in node.get("engine_installs") or []) or "-",
        ),
        (
            "labels",
            ", ".join(f"{k}={v}" for k, v in sorted((node.get("labels") or {}).items())) or "-",
        ),
        (
            "desired set",
            f"v{node.get('desired_version')} (acked v{node.get('acked_version')})"
            + ("; not keeping up" if node.get("not_keeping_up") else ""),
        ),
    ]
    if node.get("notice_deadline"):
        said = node.get("notice_source") or "-"
        if node.get("notice_reason"):
            said += f": {node['notice_reason']}"
        fields.append(("notice", f"goes away at {node['notice_deadline']} ({said})"))
    show.fields(fields)
    for gpu in node.get("gpus") or []:
        health = gpu.get("health") or "healthy"
        if gpu.get("health_reason"):
            health += f" ({gpu['health_reason']})"
        xids = ", ".join(f"{k}×{v}" for k, v in sorted((gpu.get("xids") or {}).items()))
        show.line(
            f"gpu {gpu.get('index')}: {gpu.get('name')}, "
            f"{gpu.get('memory_used_mb', '-')}/{gpu.get('memory_total_mb', '-')} MB, {health}"
            + (f", XIDs {xids}" if xids else "")
        )


def _node_or_notice(api: Api, args, show: Output) -> None:
    """``llmgw node NODE``, or ``llmgw node notice NODE --in TIME``."""
    if args.node == "notice" and args.notice_node:
        if args.in_ is None:
            raise Failure("node notice: say when it goes away: --in 120s (or 2m, 120)", EXIT_USAGE)
        return faults.node_notice(api, args, show)
    if args.notice_node or args.in_ is not None or args.reason:
        raise Failure(
            "node: --in and --reason are for 'llmgw node notice NODE --in TIME'", EXIT_USAGE
        )
    return _node(api, args, show)


def _node_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", metavar="NODE")
    p.add_argument("notice_node", nargs="?", metavar="NODE", help=argparse.SUPPRESS)
    p.add_argument("--in", dest="in_", metavar="TIME", help="notice: 120, 120s, 2m or 1h.")
    p.add_argument(
        "--reason", default="", metavar="TEXT", help="notice: said on the node page and the event."
    )


def _install_text(i: dict) -> str:
    """One engine's install, worded as in ``manage.py nodes`` (agentd.sources.describe)."""
    from agentd.sources import describe  # here, not above: most commands never need it

    fields = ("engine", "version", "variant", "state", "detail")
    return describe(*(str(i.get(k) or "") for k in fields), i.get("progress_percent"))


def _engine_build(api: Api, args, show: Output) -> None:
    node = api.call("POST", f"nodes/{quote(args.node)}/vllm-build/", {"vllm_build": args.build})
    if show.json(node):
        return
    show.line(f"{node['id']}: vLLM build {node['vllm_build']} (the node is told at once)")


def _engine_build_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("build", choices=["auto", "cu13", "cu129", "none"])


def _intent(verb: str):
    def run(api: Api, args, show: Output) -> None:
        node = api.call("POST", f"nodes/{quote(args.node)}/{verb}/")
        if verb == "drain" and getattr(args, "wait", False):
            node = _wait_drained(api, args.node, args.timeout, show)
        if show.json(node):
            return
        show.line(f"{node['id']}: {_intent_text(node)}")

    return run


def _intent_text(node: dict) -> str:
    if node.get("draining"):
        return "draining (cordoned; its replicas move elsewhere)"
    if node.get("cordoned"):
        return "cordoned (no new placements)"
    return "takes placements"


def _wait_drained(api: Api, node_id: str, timeout: float, show: Output) -> dict:
    """Until no shard that should run is left on the node (its replicas moved)."""
    deadline = time.monotonic() + timeout
    while True:
        shards = api.all_pages(f"shards/?node={quote(node_id)}&desired_state=running")
        node = api.call("GET", f"nodes/{quote(node_id)}/")
        if not shards:
            if not show.as_json:
                show.line(f"{node_id}: drained, nothing runs there")
            return node
        if time.monotonic() >= deadline:
            raise Failure(
                f"{node_id}: still {len(shards)} shard(s) running after {timeout:g} s; "
                "the drain goes on (llmgw node to follow it)",
                EXIT_TIMEOUT,
            )
        time.sleep(1)


def _drain_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--wait", action="store_true", help="Return once nothing runs there.")
    p.add_argument("--timeout", type=float, default=600, help="For --wait, in seconds.")


def _node_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")


def _revoke(api: Api, args, show: Output) -> None:
    require_yes(
        args,
        f"revoking {args.node} disconnects its agent, which must enrol again with a new join token",
    )
    result = api.call("POST", f"nodes/{quote(args.node)}/revoke/")
    if show.json(result):
        return
    show.line(f"{args.node}: {result['revoked']} credential(s) revoked; its agent is disconnected")


def _revoke_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--yes", action="store_true", help="Yes, its agent must enrol again.")


def _logs(api: Api, args, show: Output) -> None:
    reply = api.call(
        "GET", f"nodes/{quote(args.node)}/logs/", source=args.shard or "agent", lines=args.lines
    )
    if show.json(reply):
        return
    show.lines(reply["lines"])
    if reply.get("error"):
        raise Failure(
            f"{args.node}: {reply['error']} (sources: {', '.join(reply['sources'])})", EXIT_REFUSED
        )


def _logs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--shard", help="A shard's id (llmgw node NODE --json lists them).")
    p.add_argument("-n", "--lines", type=int, default=200, help="How many (1-2000).")


VERBS = {
    "nodes": Verb("The node table: state, CPU, memory, GPUs, engines, shards.", _nodes),
    "node": Verb(
        "One node in full; or 'node notice NODE --in 2m': NODE goes away then.",
        _node_or_notice,
        _node_arguments,
        usage="llmgw node NODE\n       llmgw node notice NODE --in TIME [--reason TEXT]",
        description="Show NODE; or say NODE goes away in TIME: it drains now, "
        "replacements first (docs/operations.md, 'GPU faults and notices').",
    ),
    "drain": Verb(
        "Cordon NODE and move its replicas elsewhere.", _intent("drain"), _drain_arguments
    ),
    "cordon": Verb("No new placements on NODE.", _intent("cordon"), _node_argument),
    "uncordon": Verb("Placements again.", _intent("uncordon"), _node_argument),
    "revoke": Verb(
        "Revoke NODE's credentials and disconnect its agent.", _revoke, _revoke_arguments
    ),
    "engine-build": Verb(
        "Which vLLM build NODE installs (docs/engines.md).", _engine_build, _engine_build_arguments
    ),
    "logs": Verb("The last lines of NODE's agent log, or of a shard's.", _logs, _logs_arguments),
}
