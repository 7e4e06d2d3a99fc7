"""The agent's engine installs: what the control plane wants, installed here and put to use.

The control plane's ``provision`` message says which engines the fleet runs; the
node's own say wins (an engine agent.yaml disables or names by hand is not the
control plane's to install). ``EngineInstalls`` keeps the wanted list, runs the
install loop over ``agentd.install`` (a pass by the clock, or at once when the
list changes), hands each verified install to the supervisor, and says what the
node advertises. This module changes when how the agent drives its installs
changes; the session with the control plane stays in ``agentd.agent``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from agentd import install, protocol
from agentd.config import Config
from agentd.discovery import Machine
from agentd.supervised import Shards

# Its lines are the agent's, as they were before this module was split from it.
logger = logging.getLogger("agentd.agent")

# How often the install loop looks at its clock: a pass is due by the clock, or
# at once when the control plane's wanted engines change.
INSTALL_TICK_S = 1.0


class EngineInstalls:
    """The wanted engines and their installs, for one agent.

    ``shards`` gives the agent's supervisor, read at each use: the agent's is set
    after the agent is made (``agentd.__main__``), since its events go through it.
    ``saved`` are the wanted engines a previous agent last heard (its state file),
    so a restarted agent runs its verified installs from the start; ``save_state``
    writes the state file again when the list changes. ``clock`` is the install
    schedule's (monotonic seconds; ``install.clock_from_env()`` by default).
    """

    def __init__(
        self,
        cfg: Config,
        shards: Callable[[], Shards],
        machine: Machine,
        *,
        saved: list[protocol.EngineWant],
        save_state: Callable[[], None],
        clock: Callable[[], float] | None = None,
    ):
        self.cfg = cfg
        self.shards = shards
        self.machine = machine
        self.saved = saved
        self.save_state = save_state
        self.clock = clock or install.clock_from_env()
        # The engines the control plane wants (None: it has not said), and their installs.
        self.wants: list[protocol.EngineWant] | None = None
        self.installer = install.Installer(
            cfg.envs_dir,
            cfg.install,
            on_status=self.log_status,
            clock=self.clock,
            held_gpus=self.held_gpus,
        )
        self.schedule = install.Schedule()
        self.kick = asyncio.Event()
        self._logged: dict[str, tuple] = {}
        self._installed: dict[str, str] = {}  # engine -> binary, as the supervisor was told

    def known(self) -> list[protocol.EngineWant]:
        """The wanted engines to keep in the state file: the last heard, or the saved ones."""
        return self.wants if self.wants is not None else self.saved

    def own_say(self, engine: str) -> bool:
        return engine in self.cfg.engines.disabled or engine in self.cfg.engines.binaries

    def held_gpus(self) -> set[str]:
        """The GPUs of shards whose engines run now."""
        return {u for s in self.shards().running() if s.pid for u in s.gpu_uuids}

    async def restore(self) -> None:
        """What a previous agent installed and verified, in use before the first pass."""
        # Not an engine agent.yaml now disables or names by hand: the operator's say
        # wins from the start, not only from the first provision.
        saved = [w for w in self.saved if not self.own_say(w.engine)]
        if saved:
            wants = [install.Want(w.engine, w.version, w.variant) for w in saved]
            gpus = await asyncio.to_thread(self.machine.gpus)
            self.installer.restore(wants, gpus)
            self.use_installed()

    def on_provision(self, msg: protocol.Provision) -> None:
        """The engines the fleet runs. The node's own say wins: an engine it disabled, or
        whose binary it names by hand, is not the control plane's to install."""
        wants = [e for e in msg.engines if not self.own_say(e.engine)]
        failed = any(st.state == install.FAILED for st in self.installer.statuses.values())
        if wants != self.wants:
            logger.info(
                "control plane wants engines %s",
                [f"{e.engine} {e.version} {e.variant}".strip() for e in wants] or "none",
            )
            self.wants = wants
            self.save_state()
            self.kick.set()
        elif failed:
            # The same list again (a reconnect): a failed install is tried now, not at
            # the end of its back-off. Good installs wait for their re-check.
            self.kick.set()

    def provision(self) -> list[protocol.EngineInstall]:
        """Where each wanted engine stands here, as the install loop last saw it."""
        out = []
        for want in self.wants or []:
            st = self.installer.statuses.get(want.engine)
            if st is None:
                st = install.Status(want.engine, want.version, want.variant, install.INSTALLING,
                                    "waiting for the install loop")  # fmt: skip
            out.append(st.wire())
        return out

    def engine_versions(self) -> dict[str, str]:
        """What this node advertises: engines installed here and seen to run, and engines
        agent.yaml names that answer their probe. Nothing merely found on the machine."""
        found = dict(self.shards().engine_versions())
        for engine, st in self.installer.installed().items():
            found[engine] = st.version
        return {e: v for e, v in found.items() if e not in self.cfg.engines.disabled}

    # ---- the install loop ------------------------------------------------------

    async def loop(self) -> None:
        due: float | None = None
        while True:
            try:
                await asyncio.wait_for(self.kick.wait(), INSTALL_TICK_S)
            except TimeoutError:
                pass
            kicked = self.kick.is_set()
            self.kick.clear()
            if self.wants is None:
                continue
            if not kicked and (due is None or self.clock() < due):
                continue
            try:
                failed = await self.install_pass()
            except Exception:  # noqa: BLE001 - the next pass tries again
                logger.exception("the engine install pass failed")
                failed = True
            due = self.clock() + self.schedule.after(failed)

    async def install_pass(self) -> bool:
        """Install or re-check every wanted engine; True when one of them failed."""
        wants = [install.Want(w.engine, w.version, w.variant) for w in self.wants or []]
        gpus = await asyncio.to_thread(self.machine.gpus)
        statuses = await self.installer.converge(wants, gpus)
        self.use_installed()
        return any(st.state == install.FAILED for st in statuses)

    def use_installed(self) -> None:
        """Tell the supervisor of each engine whose verified install changed."""
        now = {e: st.binary for e, st in self.installer.installed().items()}
        if now == self._installed:
            return
        for engine in set(self._installed) | set(now):
            if self._installed.get(engine) != now.get(engine):
                self.shards().use_installed(engine, now.get(engine))
        self._installed = now
        logger.info(
            "engines installed and running: %s",
            ", ".join(f"{e} {self.installer.statuses[e].version}" for e in sorted(now)) or "none",
        )

    def log_status(self, st: install.Status) -> None:
        """Each change of an engine's install logged once; progress alone is not a change."""
        key = (st.state, st.version, st.variant, st.detail)
        if self._logged.get(st.engine) == key:
            return
        self._logged[st.engine] = key
        warn = st.state in (install.FAILED, install.UNSUPPORTED)
        level = logging.WARNING if warn else logging.INFO
        detail = f": {st.detail}" if st.detail else ""
        logger.log(
            level, "engine %s %s (%s) %s%s", st.engine, st.version, st.variant, st.state, detail
        )
