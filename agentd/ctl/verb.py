"""What a verb of llmgw is: what ``llmgw --help`` says of it, its arguments, and the
function that runs it. Each group module fills in its ``VERBS`` with these; the package
builds the command line from them. Changes only if every verb needs something new."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


@dataclass(frozen=True)
class Verb:
    """``run(api, args, show)`` does the verb: ``api`` an ``agentd.ctl.client.Api``,
    ``show`` an ``agentd.ctl.output.Output``; it ends with a ``Failure`` or returns."""

    help: str
    run: Callable
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    usage: str | None = None
    description: str | None = None

    def add_to(self, subparsers, name: str) -> None:
        parser = subparsers.add_parser(
            name, help=self.help, usage=self.usage, description=self.description
        )
        self.arguments(parser)
