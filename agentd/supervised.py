"""The engine supervisor as the agent sees it: what the agent asks of whatever runs shards.

``Shards`` is the interface; ``SupervisedShards`` puts ``agentd.supervisor`` behind
it and ``NoShards`` is an agent that runs no engines (tests pass their own). This
module changes when what the agent needs from the supervisor changes; the agent's
session (``agentd.agent``) and its engine installs (``agentd.provisioning``) use it.
"""

from __future__ import annotations

import logging
from typing import Protocol

from agentd import protocol

# Its lines are the agent's, as they were before this module was split from it.
logger = logging.getLogger("agentd.agent")


class Shards(Protocol):
    """What the agent needs from the engine supervisor."""

    desired_version: int

    async def start(self) -> None: ...
    async def refresh(self) -> None: ...
    async def apply(self, desired: protocol.Desired) -> None: ...
    def running(self) -> list[protocol.RunningShard]: ...
    def process_groups(self) -> dict[str, int]: ...
    def sources(self) -> list[str]: ...
    def tail(self, shard_id: str, lines: int) -> list[str] | None: ...
    def paths_in_use(self) -> list[str]: ...
    def weights_in_use(self) -> list[str]: ...
    def engine_versions(self) -> dict[str, str]: ...
    def engine_problems(self) -> dict[str, str]: ...
    def use_installed(self, engine: str, binary: str | None) -> None: ...
    async def close(self) -> None: ...


class NoShards:
    """An agent without engine supervision: it runs nothing and says so."""

    desired_version = 0

    async def start(self) -> None:
        return None

    async def refresh(self) -> None:
        return None

    async def apply(self, desired: protocol.Desired) -> None:
        if any(s.state == "running" for s in desired.shards):
            logger.warning(
                "desired set v%d asks for %d shard(s); this agent runs no engines",
                desired.version,
                len(desired.shards),
            )

    def running(self) -> list[protocol.RunningShard]:
        return []

    def process_groups(self) -> dict[str, int]:
        return {}

    def sources(self) -> list[str]:
        return []

    def tail(self, shard_id: str, lines: int) -> list[str] | None:
        return None

    def paths_in_use(self) -> list[str]:
        return []

    def weights_in_use(self) -> list[str]:
        return []

    def engine_versions(self) -> dict[str, str]:
        return {}

    def engine_problems(self) -> dict[str, str]:
        return {}

    def use_installed(self, engine: str, binary: str | None) -> None:
        return None

    async def close(self) -> None:
        return None


class SupervisedShards:
    """The engine supervisor (agentd/supervisor.py) as the agent uses it."""

    def __init__(self, supervisor):
        self.sup = supervisor

    @property
    def desired_version(self) -> int:
        return self.sup.desired_version

    async def start(self) -> None:
        await self.sup.start()  # adopts what a previous agent left running

    async def refresh(self) -> None:
        await self.sup.probe_engines()

    async def apply(self, desired: protocol.Desired) -> None:
        await self.sup.apply(desired)

    def running(self) -> list[protocol.RunningShard]:
        return self.sup.running_shards()

    def process_groups(self) -> dict[str, int]:
        return self.sup.process_groups()

    def sources(self) -> list[str]:
        return self.sup.log_sources()

    def tail(self, shard_id: str, lines: int) -> list[str] | None:
        try:
            return self.sup.tail(shard_id, lines)
        except KeyError:
            return None

    def paths_in_use(self) -> list[str]:
        return self.sup.paths_in_use()

    def weights_in_use(self) -> list[str]:
        return self.sup.weights_in_use()

    def engine_versions(self) -> dict[str, str]:
        return self.sup.engine_versions()

    def engine_problems(self) -> dict[str, str]:
        return self.sup.engine_problems()

    def use_installed(self, engine: str, binary: str | None) -> None:
        self.sup.use_installed(engine, binary)

    async def close(self) -> None:
        await self.sup.close()
