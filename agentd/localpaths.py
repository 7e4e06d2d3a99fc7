"""Local paths a profile or an adapter names: read only under the roots agent.yaml names.

A profile's ``model_path`` (or, without one, the model's name) and an adapter's
``source`` that carry no ``://`` are handed to an engine, which opens them as
this node's user. The control plane cannot see the disk, so, as with removals
(``agentd.weights``), the node decides: such a path is used only when it
resolves (links and ``..`` followed) under one of ``weights_dirs`` or
``model_dirs``. The agent's own files (its state dir, credential, TLS key) are
never used, even under a root, unless the root itself lies inside them.

A name in the hub's form (``org/name`` or ``name``: letters, digits, ``.``,
``_``, ``-``) is a repository the engine resolves itself, as before; it counts
as a path only when something of that name exists where the engine starts
(``cwd``), since the engine would then open it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_HUB_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
KEYS = "weights_dirs or model_dirs"


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the hub's form: ``name`` or ``org/name``, no ``..``."""
    parts = text.split("/")
    return 1 <= len(parts) <= 2 and all(_HUB_PART.match(p) and ".." not in p for p in parts)


@dataclass(frozen=True)
class LocalRoots:
    """Where local model paths and adapter sources may point on this node.

    ``roots``: agent.yaml's ``weights_dirs`` and ``model_dirs``. ``private``: the
    agent's own files, refused under a root that holds them. ``cwd``: where engines
    start, against which a relative path resolves.
    """

    roots: list[Path] = field(default_factory=list)
    private: list[Path] = field(default_factory=list)
    cwd: Path = Path("/")

    def problem(self, text: str, what: str) -> str | None:
        """Why the engine may not be given ``text`` (a local path or a hub id), or None.

        Blocking: a few stats. Nothing is opened.
        """
        if not text or "://" in text:
            return None
        if "\x00" in text:
            return f"{what} {text!r} is not a path"
        if not os.path.isabs(text) and is_hub_id(text):
            if not os.path.lexists(self.cwd / text):
                return None  # a repository the engine fetches itself
        real = Path(os.path.realpath(self.cwd / text))
        for root in self.roots:
            r = Path(os.path.realpath(root))
            if not real.is_relative_to(r):
                continue
            # The agent's own files, unless the root itself lies among them.
            own = [p for p in self._private() if real.is_relative_to(p)]
            held = [p for p in own if not r.is_relative_to(p)]
            if held:
                return (
                    f"{what} {text} is among this agent's own files ({held[0]}); "
                    "the engine is not given it"
                )
            return None
        shown = ", ".join(str(r) for r in self.roots) or "none"
        link = f" (it resolves to {real})" if str(real) != os.path.abspath(self.cwd / text) else ""
        return (
            f"{what} {text} is not under a directory this node's agent.yaml names for "
            f"weights{link} ({KEYS}: {shown}); add its directory to model_dirs on this "
            "node to allow it. Nothing was read"
        )

    def _private(self) -> list[Path]:
        return [Path(os.path.realpath(p)) for p in self.private]
