"""llmgw: the fleet from an operator's laptop, through the management API only.

``llmgw nodes``, ``llmgw drain gpu-07 --wait``, ``llmgw apply -f catalog.yaml`` … do
what the ``manage.py`` commands of the same names do, over HTTP with a ``manage`` API
key, so they need neither the control plane's database nor its settings. Installed
with the agent (``pip install .``), standard library and PyYAML only.

Where it connects: ``--url`` / ``LLMGW_URL``; the key: ``LLMGW_API_KEY``; or both from
``~/.config/llmgw/cli.yaml`` (``url:`` and ``api_key:``), which must be readable by its
owner alone (mode 0600), as ssh insists for its keys (``client``).

Exit status, for scripts (``exits``): 0 done; 1 the API refused the request (it says
why); 2 bad usage or a bad file, nothing sent; 3 the key was refused (unknown, revoked,
not a manage key); 4 the control plane could not be reached or failed (5xx); 5
``--wait`` ran out of time.

This module builds the command line from the groups of verbs, one module each:
``nodes``, ``faults`` (GPU faults and notices), ``catalog`` (models, adapters, apply,
explain, canaries), ``teams``, ``replicas``, ``keys`` (join tokens and API keys),
``usage``, ``costs``, ``audit`` and ``weights``. Every verb prints through ``output``
(tables, fields, lines, or ``--json``); times typed on the command line are read in
``times``. To add a verb: a ``Verb`` in its group's ``VERBS`` (a new group: a module
with a docstring and ``VERBS``, listed in ``GROUPS``), and its name in ``HELP_ORDER``.
"""

from __future__ import annotations

import argparse
import sys

from agentd.ctl import (
    audit,
    catalog,
    client,
    costs,
    faults,
    keys,
    nodes,
    replicas,
    teams,
    usage,
    weights,
)
from agentd.ctl.exits import EXIT_OK, Failure
from agentd.ctl.output import Output

GROUPS = (nodes, faults, catalog, teams, replicas, keys, usage, costs, audit, weights)
VERBS = {name: verb for group in GROUPS for name, verb in group.VERBS.items()}
# The order ``llmgw --help`` lists the verbs in, whichever group holds each.
HELP_ORDER = (
    "nodes",
    "node",
    "gpu",
    "models",
    "teams",
    "adapters",
    "explain",
    "apply",
    "drain",
    "cordon",
    "uncordon",
    "revoke",
    "replica",
    "canary",
    "join-token",
    "api-key",
    "revoke-key",
    "rotate-key",
    "usage",
    "costs",
    "audit",
    "engine-build",
    "weights",
    "gc-weights",
    "logs",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw",
        description="The llmgw fleet through its management API (a manage key).",
        epilog="Connects to --url / LLMGW_URL with LLMGW_API_KEY, or with "
        f"{client.CONFIG_PATH} (url:, api_key:; mode 600).",
    )
    p.add_argument("--url", help="The control plane, e.g. https://llmgw.example.com")
    p.add_argument("--config", help=f"A config file instead of {client.CONFIG_PATH}")
    p.add_argument("--json", action="store_true", help="Print the API's JSON, for scripts.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in HELP_ORDER:
        VERBS[name].add_to(sub, name)
    return p


def main(argv: list[str] | None = None, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = _parser().parse_args(argv)
    try:
        api = client.Api(*client.settings(args))
        VERBS[args.command].run(api, args, Output(out, err, args.json))
        return EXIT_OK
    except Failure as exc:
        err.write(f"llmgw {args.command}: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        return 130
