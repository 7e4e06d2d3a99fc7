"""GPU faults and notices (docs/operations.md, "GPU faults and notices"): clearing a
GPU's fault, and saying a node goes away (``llmgw node notice``, reached through the
``node`` verb in ``nodes``). Changes when how an operator marks hardware fine again or
about to go does; how a time ahead is read is ``times.notice_seconds``.
"""

from __future__ import annotations

from agentd.ctl.client import Api, quote
from agentd.ctl.exits import EXIT_REFUSED, EXIT_USAGE, Failure
from agentd.ctl.output import Output
from agentd.ctl.times import notice_seconds
from agentd.ctl.verb import Verb


def node_notice(api: Api, args, show: Output) -> None:
    """``llmgw node notice gpu-07 --in 2m --reason "spot reclaim"``."""
    try:
        in_s = notice_seconds(args.in_)
    except ValueError as exc:
        raise Failure(str(exc), EXIT_USAGE) from None
    body = {"in_s": in_s, **({"reason": args.reason} if args.reason else {})}
    result = api.call("POST", f"nodes/{quote(args.notice_node)}/notice/", body)
    if show.json(result):
        return
    show.line(result["detail"])


def gpu_name(name: str) -> tuple[str, int]:
    """'gpu-07/3' (or 'gpu-07/gpu3', as pages print it) -> ('gpu-07', 3)."""
    node, _, index = name.rpartition("/")
    index = index.removeprefix("gpu")
    if not node or not index.isdigit():
        raise Failure(f"'{name}' is not a GPU: name it NODE/INDEX, like gpu-07/3", EXIT_USAGE)
    return node, int(index)


def _gpu(api: Api, args, show: Output) -> None:
    """``llmgw gpu clear gpu-07/3 --reason "reset, ran dcgmi diag -r 3 clean"``."""
    if not args.reason.strip():
        raise Failure(
            "say why the GPU is fine again (--reason): the audit trail keeps it", EXIT_USAGE
        )
    node, index = gpu_name(args.gpu)
    found = api.all_pages(f"gpus/?node={quote(node)}&index={index}")
    if not found:
        raise Failure(f"no GPU {index} on node '{node}'", EXIT_REFUSED)
    result = api.call("POST", f"gpus/{found[0]['id']}/clear/", {"reason": args.reason})
    if show.json(result):
        return
    show.line(result["detail"])


def _gpu_arguments(p) -> None:
    p.add_argument("verb", choices=["clear"])
    p.add_argument("gpu", metavar="NODE/INDEX", help="Like gpu-07/3.")
    p.add_argument(
        "--reason", required=True, metavar="TEXT", help="Why it is fine again (kept in the audit)."
    )


VERBS = {
    "gpu": Verb(
        "Clear a GPU's fault, with a reason: placed on again.",
        _gpu,
        _gpu_arguments,
        usage="llmgw gpu clear NODE/INDEX --reason TEXT",
    ),
}
