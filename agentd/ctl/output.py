"""How every llmgw verb prints: its answer as a table, aligned fields or lines, or with
``--json`` the API's JSON as it came, for scripts. Changes when the look of the output
does, for every verb at once.

What a command answers goes to ``out`` (stdout); what is said about it (the period a
report covers, "nothing found", the name of a secret) to ``err``, so that a pipe gets
the answer alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from agentd import tables


class Output:
    """Where a verb prints, and whether ``--json`` asked for the API's JSON instead."""

    def __init__(self, out, err, as_json: bool):
        self.out, self.err, self.as_json = out, err, as_json

    def json(self, answer) -> bool:
        """With ``--json``, ``answer`` printed as JSON (nothing for an empty body), and
        True: the verb prints nothing else. Without it, False."""
        if not self.as_json:
            return False
        if answer is not None:
            self.out.write(json.dumps(answer, indent=2) + "\n")
        return True

    def line(self, text: str) -> None:
        self.out.write(text + "\n")

    def lines(self, texts: Iterable[str]) -> None:
        self.out.writelines(text + "\n" for text in texts)

    def text(self, text: str) -> None:
        """``text`` as it came (a CSV report)."""
        self.out.write(text)

    def note(self, text: str) -> None:
        """Said about the answer, on stderr."""
        self.err.write(text + "\n")

    def secret(self, about: str, secret: str) -> None:
        """A secret shown only once: ``about`` it on stderr, the secret alone on stdout."""
        self.note(about)
        self.line(secret)

    def table(self, rows: list[list[str]]) -> None:
        """``rows`` (the header first) in left-aligned columns, as ``manage.py`` prints."""
        self.lines(tables.lines(rows))

    def node_table(self, rows: list[dict]) -> None:
        """The node table, column for column as ``manage.py nodes`` prints it."""
        self.lines(tables.node_lines(rows))

    def fields(self, pairs: list[tuple[str, str]]) -> None:
        """One object's fields, a name and its value per line, the values aligned."""
        width = max(len(name) for name, _ in pairs)
        self.lines(f"{name.ljust(width)}  {value}" for name, value in pairs)

    def listing(self, items: list, empty: str, header: list[str], row: Callable) -> None:
        """A collection as a table (``row`` makes each line of an item), ``empty`` when it
        has none; or its JSON."""
        if self.json(items):
            return
        if not items:
            self.line(empty)
            return
        self.table([header, *map(row, items)])
