"""Engine installs on the wire: which engines the fleet wants, and how each stands here.

The control plane's ``provision`` message names the engines and versions a node
should install; the agent reports each one's install (``EngineInstall``) on
register and in heartbeats. This module changes when what is said about engine
installs changes (docs/engines.md).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from agentd.protocol.fields import Msg, Part, ShortStr, Text

# An engine version the fleet may want (fleet.models.WantedEngine, and the agent
# again before it runs pip: a version ends up in pip's requirement and in wheel
# URLs, so nothing that could read as a URL, a path or an option). Empty: the latest.
ENGINE_VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$"


ENGINE_VERSION_MAX = 64


def engine_version_problem(version: str) -> str | None:
    """Why ``version`` is not an engine version to install, or None ("" is the latest)."""
    if version == "" or (
        len(version) <= ENGINE_VERSION_MAX and re.fullmatch(ENGINE_VERSION_PATTERN, version)
    ):
        return None
    return (
        f"{version[:80]!r} is not a version (like 0.11.2 or 0.3.36: letters, digits and "
        f". + ! _ -, at most {ENGINE_VERSION_MAX} characters); nothing was installed"
    )


class EngineInstall(Part):
    engine: Annotated[str, Field(min_length=1, max_length=32)]
    version: ShortStr = ""
    variant: ShortStr = ""
    # installing, installed, failed or unsupported (docs/engines.md); free text, so a
    # newer agent's state is shown rather than refused.
    state: Annotated[str, Field(max_length=32)]
    detail: Text = ""
    # While installing, where known (a download's share). None: not known.
    progress_percent: Annotated[int, Field(ge=0, le=100)] | None = None


class EngineWant(Part):
    engine: Annotated[str, Field(min_length=1, max_length=32)]
    version: ShortStr = ""
    variant: ShortStr = ""


class Provision(Msg):
    type: Literal["provision"]
    engines: Annotated[list[EngineWant], Field(max_length=32)] = []
