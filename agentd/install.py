"""The agent's engine installs: a virtualenv per engine, filled by pip, verified before it counts.

The control plane says which engines at which versions the fleet runs (a
``provision`` message); ``agentd.builds`` picks the variant for this node. Each
engine goes into ``<state_dir>/engines/<engine>-<version>-<variant>/``, by pip,
from the variant's sources (``pip_plan``; every URL and argument can be replaced
in agent.yaml's ``install``). It counts only once it ran here (``agentd.verify``
says how an engine proves it works; ``agentd.steps`` runs each command). A mark
file records a verified install, so a restarted agent re-checks rather than
reinstalls. This module changes when the loop changes: what is installed where,
when, and how a broken environment is replaced.

An environment is never changed once verified, since engines may run from it: a
new install (a repair, another plan) is made in a new environment beside it
(``<name>@2``, ``@3``, …), used once verified, and the one it replaces is removed
when no process runs from it any more.

Installed engines are checked again every ``RECHECK_S``: a library removed by an
unrelated upgrade is found here, not by the next replica to start, and a new
environment is built beside the broken one while the engine stays advertised
(what runs from it keeps serving). After a failure the next pass comes sooner
and backs off (``Schedule``). Docs: docs/engines.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from agentd import builds, llamatools, protocol
from agentd.engineconfig import InstallConfig
from agentd.sources import Plan, PlanError, env_dir, pip_plan, release_wheel
from agentd.steps import StepFailed, new_venv, pip_for, run_step, tail
from agentd.verify import DIST_VERSION, Verifier, engine_binary

logger = logging.getLogger(__name__)

INSTALLING, INSTALLED, FAILED, UNSUPPORTED = "installing", "installed", "failed", "unsupported"
# How often installed engines are checked again, and the retry after a failure:
# a lock held by a new machine's own updates clears in a minute or two, while
# ten minutes' wait would leave a node idle for no reason.
RECHECK_S = 600.0
# A re-check that fails is run again this much later before the environment counts as
# broken: a GPU busy or full beside running engines fails a check once, a missing
# library every time.
RECHECK_AGAIN_S = 5.0
RETRY_FIRST_S = 60.0
RETRY_MAX_S = 600.0
MARK = "llmgw-installed.json"
# The detail of an installed engine whose re-check failed, while its new environment
# is made: it stays advertised meanwhile.
REPAIRING = "repairing"


@dataclass(frozen=True)
class Want:
    engine: str
    version: str = ""
    variant: str = ""  # what the control plane asked: for vLLM, the node's build


@dataclass(frozen=True)
class Status:
    """Where one wanted engine stands here."""

    engine: str
    version: str
    variant: str
    state: str
    detail: str = ""
    progress: int | None = None
    binary: str = ""  # what the supervisor runs, once installed

    def wire(self) -> protocol.EngineInstall:
        return protocol.EngineInstall(
            engine=self.engine,
            version=self.version[:255],
            variant=self.variant[:255],
            state=self.state,
            detail=self.detail[:4096],
            progress_percent=self.progress,
        )


class Schedule:
    """When the next pass is due: ``RECHECK_S`` after a good one; after a failed one
    ``RETRY_FIRST_S``, doubling each failure up to ``RETRY_MAX_S``; reset by success."""

    def __init__(self, every=RECHECK_S, first=RETRY_FIRST_S, most=RETRY_MAX_S):
        self.every, self.first, self.most = every, first, most
        self.retry = first

    def after(self, failed: bool) -> float:
        if not failed:
            self.retry = self.first
            return self.every
        delay, self.retry = self.retry, min(self.retry * 2, self.most)
        return delay


# Tests of the real agent process move its install clock on by writing seconds to
# the file this variable names; nothing else reads it.
CLOCK_FILE_ENV = "LLMGW_AGENT_CLOCK_FILE"


def clock_from_env() -> Callable[[], float]:
    """``time.monotonic``, or, where ``LLMGW_AGENT_CLOCK_FILE`` is set, monotonic time plus
    the seconds that file holds (read at each call; missing or empty is 0)."""
    path = os.environ.get(CLOCK_FILE_ENV)
    if not path:
        return time.monotonic

    def clock() -> float:
        try:
            return time.monotonic() + float(Path(path).read_text().strip() or 0)
        except (OSError, ValueError):
            return time.monotonic()

    return clock


OnStatus = Callable[[Status], None]


class Installer:
    """Installs and verifies the wanted engines, one pass at a time (``converge``).

    ``on_status`` hears every change of an engine's status (progress included).
    ``clock`` is monotonic seconds; tests pass their own.
    """

    def __init__(
        self,
        root: Path,
        cfg: InstallConfig,
        *,
        on_status: OnStatus | None = None,
        clock: Callable[[], float] = time.monotonic,
        held_gpus: Callable[[], set[str]] | None = None,
    ):
        self.root = Path(root)
        self.cfg = cfg
        self.on_status = on_status or (lambda st: None)
        self.clock = clock
        self.python = cfg.python or sys.executable
        cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        self.build_cache = Path(cfg.build_cache or os.path.join(cache_home, "llmgw", "builds"))
        self.statuses: dict[str, Status] = {}
        self.recheck_again_s = RECHECK_AGAIN_S
        self.verifier = Verifier(self.root, cfg.verify_timeout_s, held_gpus=held_gpus)
        # (engine, version) -> the build ``auto`` settled on after its first choice failed.
        self.settled: dict[tuple[str, str], str] = {}
        self.downloads = 0  # pip runs started: a test counts what was fetched

    # ---- what the agent reads -------------------------------------------------

    def installed(self) -> dict[str, Status]:
        return {e: st for e, st in self.statuses.items() if st.state == INSTALLED}

    def _set(self, st: Status) -> Status:
        prev = self.statuses.get(st.engine)
        self.statuses[st.engine] = st
        if prev != st:
            self.on_status(st)
        return st

    def restore(self, wants: list[Want], gpus: list[protocol.GPU]) -> None:
        """What a previous agent installed and verified, counted as installed until the
        first pass checks it again (at once, when the control plane's wants arrive)."""
        for want in wants:
            choice = builds.choose(want.engine, want.variant, gpus)
            if choice.variant is None or protocol.engine_version_problem(want.version):
                continue
            variants = [choice.variant]
            if builds.chosen_here(want.engine, want.variant) and (
                fell_to := builds.fallback(choice.variant)
            ):
                variants.append(fell_to)  # where auto settled before the restart
            for variant in variants:
                try:
                    plan = pip_plan(want.engine, want.version, variant, self.cfg)
                except PlanError:
                    continue
                env = self._current(env_dir(self.root, want.engine, want.version, variant), plan)
                if env is None:
                    continue
                mark = self._read_mark(env) or {}
                if variant != choice.variant:
                    self.settled[(want.engine, want.version)] = variant
                self._set(
                    Status(want.engine, mark.get("version") or want.version, variant,
                           INSTALLED, binary=engine_binary(plan, env))
                )  # fmt: skip
                break

    # ---- one pass -------------------------------------------------------------

    async def converge(self, wants: list[Want], gpus: list[protocol.GPU]) -> list[Status]:
        """Install or re-check every wanted engine; forget the ones no longer wanted."""
        self.verifier.gpus = list(gpus)
        for engine in list(self.statuses):
            if engine not in {w.engine for w in wants}:
                del self.statuses[engine]
        out = []
        for want in wants:
            try:
                out.append(await self._one(want, gpus))
            except Exception as exc:  # noqa: BLE001 - one engine's trouble is not the others'
                logger.exception("installing %s failed unexpectedly", want.engine)
                out.append(self._fail(want, want.variant, f"{type(exc).__name__}: {exc}"))
        return out

    def _fail(self, want: Want, variant: str, detail: str) -> Status:
        return self._set(Status(want.engine, want.version, variant, FAILED, detail))

    async def _one(self, want: Want, gpus: list[protocol.GPU]) -> Status:
        # The control plane checks versions too; this agent does not count on it.
        if (problem := protocol.engine_version_problem(want.version)) is not None:
            return self._fail(want, want.variant or "", problem)
        choice = builds.choose(want.engine, want.variant, gpus)
        if choice.variant is None:
            # Decided before anything is fetched: nothing is downloaded for it.
            return self._set(
                Status(want.engine, want.version, want.variant or "", UNSUPPORTED, choice.reason)
            )
        variant = choice.variant
        key = (want.engine, want.version)
        auto = builds.chosen_here(want.engine, want.variant)
        if auto and key in self.settled:
            variant = self.settled[key]
        st = await self._attempt(want, variant)
        fell_to = builds.fallback(variant) if auto and key not in self.settled else None
        if st.state != FAILED or fell_to is None:
            return st
        # The seed's promise: a cu13 build that fails here (a GPU CUDA 13 does not
        # run, a driver that says more than it does) is followed by cu129, once.
        first = st.detail.splitlines()[0] if st.detail else "failed"
        logger.warning("vllm %s failed here (%s): falling back to %s", variant, first, fell_to)
        self.settled[key] = fell_to
        st = await self._attempt(want, fell_to)
        why = f"auto: {variant} failed here ({first}); fell back to {fell_to}"
        return self._set(replace(st, detail=f"{why}\n{st.detail}" if st.detail else why))

    async def _attempt(self, want: Want, variant: str) -> Status:
        """Install (or re-check) one variant of a wanted engine, verified before it counts."""
        try:
            plan = pip_plan(want.engine, want.version, variant, self.cfg)
        except PlanError as exc:
            return self._fail(want, variant, str(exc))
        slot = env_dir(self.root, want.engine, want.version, variant)
        # Agents of one machine may share a root (install.root): one installs a slot
        # while the others wait, then find it verified.
        async with _slot_lock(slot):
            return await self._attempt_locked(want, variant, plan, slot)

    async def _attempt_locked(self, want: Want, variant: str, plan: Plan, slot: Path) -> Status:
        base = Status(want.engine, want.version, variant, INSTALLING)
        prev = self.statuses.get(want.engine)
        env = self._current(slot, plan)
        if env is not None:
            try:
                found = await self._recheck(plan, env)
            except StepFailed as exc:
                logger.warning(
                    "%s in %s no longer works (%s): building a new environment beside it",
                    want.engine,
                    env,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
                if prev is not None and prev.state == INSTALLED and prev.variant == variant:
                    # What serves from it keeps serving, and new replicas may still come.
                    base = replace(prev, detail=REPAIRING)
            else:
                self._retire(slot, keep=env)
                now = replace(base, state=INSTALLED, version=found,
                              binary=engine_binary(plan, env))  # fmt: skip
                if prev is None or (prev.state, prev.version, prev.binary) != (
                    now.state,
                    now.version,
                    now.binary,
                ):
                    self._set(now)
                return self.statuses[want.engine]
        new = self._fresh(slot)
        try:
            await self._install(plan, new, base)
            self._step(base, "verifying")
            found = await self.verify(plan, new)
        except StepFailed as exc:
            return self._fail(want, variant, str(exc))
        self._write_mark(new, plan, found)
        self._retire(slot, keep=new)
        binary = engine_binary(plan, new)
        return self._set(replace(base, state=INSTALLED, version=found, binary=binary, detail=""))

    def _step(self, base: Status, detail: str, progress: int | None = None) -> None:
        """How far an install has got; a repair's steps keep the engine installed."""
        if base.state == INSTALLED:
            detail = f"{REPAIRING}: {detail}"
        self._set(replace(base, detail=detail, progress=progress))

    # ---- environments: one per verified install, never changed under an engine ----

    @staticmethod
    def _generations(slot: Path) -> list[Path]:
        """``slot`` and the environments made beside it (``slot@2``, …), oldest first."""

        def number(path: Path) -> int:
            tail = path.name[len(slot.name) + 1 :]
            return int(tail) if tail.isdigit() else 0

        beside = [p for p in slot.parent.glob(f"{slot.name}@*") if number(p) > 1]
        return ([slot] if slot.exists() else []) + sorted(beside, key=number)

    def _current(self, slot: Path, plan: Plan) -> Path | None:
        """The newest environment verified for ``plan``, if any."""
        for env in reversed(self._generations(slot)):
            mark = self._read_mark(env)
            if mark is not None and mark.get("plan") == plan.fingerprint():
                return env
        return None

    def _fresh(self, slot: Path) -> Path:
        """Where a new install goes: a name no environment has. Unverified ones (a failed
        or cut-off install) that nothing runs from are removed first."""
        taken = []
        for env in self._generations(slot):
            if self._read_mark(env) is None and not _in_use(env):
                shutil.rmtree(env, ignore_errors=True)
            else:
                taken.append(env)
        if slot not in taken:
            return slot
        n = 2
        while slot.with_name(f"{slot.name}@{n}") in taken:
            n += 1
        return slot.with_name(f"{slot.name}@{n}")

    def _retire(self, slot: Path, keep: Path) -> None:
        """Remove the environments ``keep`` replaced, each once nothing runs from it."""
        for env in self._generations(slot):
            if env != keep and not _in_use(env):
                shutil.rmtree(env, ignore_errors=True)
                logger.info("removed %s: %s replaces it and nothing runs from it", env, keep.name)

    async def verify(self, plan: Plan, env: Path, quiet: bool = False) -> str:
        """Run the engine here (``agentd.verify``); its version, or StepFailed."""
        return await self.verifier.verify(plan, env, quiet)

    async def _recheck(self, plan: Plan, env: Path) -> str:
        """A verified install checked again; a failure counts only if it happens twice."""
        try:
            return await self.verify(plan, env, quiet=True)
        except StepFailed as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            logger.info("%s's re-check failed (%s); checking again", plan.engine, first)
        await asyncio.sleep(self.recheck_again_s)
        found = await self.verify(plan, env, quiet=True)
        logger.info("%s's re-check passed the second time: nothing repaired", plan.engine)
        return found

    # ---- installing -----------------------------------------------------------

    async def _install(self, plan: Plan, env: Path, base: Status) -> None:
        python = env / "bin" / "python"
        if not python.exists():
            self._step(base, "creating its environment")
            await run_step(new_venv(self.python, env), timeout=300, what="python -m venv")
        args = [*pip_for(python), "install", "--disable-pip-version-check"]
        if plan.release:
            self._step(base, "reading the release's wheels")
            try:
                args.append(await asyncio.to_thread(release_wheel, plan))
            except PlanError as exc:
                raise StepFailed(str(exc)) from None
        self.downloads += 1
        self._step(base, "downloading")
        await run_step(
            args + plan.args,
            timeout=self.cfg.pip_timeout_s,
            what="pip install",
            env=plan.env,
            progress=lambda detail, pct: self._step(base, detail, pct),
        )
        if plan.tools is not None:
            await self._build_tools(plan, env, base)
        if plan.remove:
            # pip skips, with a warning, what is not installed.
            await run_step(
                [*pip_for(python), "uninstall", "--yes", *plan.remove],
                timeout=self.cfg.verify_timeout_s,
                what=f"pip uninstall {' '.join(plan.remove)}",
            )
        if plan.xtile:
            await self._add_xtile(python)

    async def _add_xtile(self, python: Path) -> None:
        """agentd/xtile.py into the environment's site-packages, imported by a .pth line
        at every start of its Python (workers included)."""
        site = tail(
            await run_step(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                timeout=self.cfg.verify_timeout_s,
                what="finding the environment's site-packages",
            ),
            1,
        )
        shutil.copyfile(Path(__file__).with_name("xtile.py"), Path(site) / "llmgw_xtile.py")
        (Path(site) / "llmgw_xtile.pth").write_text("import llmgw_xtile\n")

    async def _build_tools(self, plan: Plan, env: Path, base: Status) -> None:
        """llama.cpp's server and rpc-server, from the source of the llama-cpp-python just
        installed (agentd.llamatools)."""
        version = tail(
            await run_step(
                [str(env / "bin" / "python"), "-c", DIST_VERSION.format(dist=plan.dist)],
                timeout=self.cfg.verify_timeout_s,
                what=f"reading {plan.dist}'s version",
            ),
            1,
        )
        try:
            origin = await llamatools.build(
                run_step,
                env,
                spec=f"{plan.dist}=={version}",
                pip_args=[a for a in plan.args[1:] if a != "--no-cache-dir"],
                cmake_args=plan.tools or "",
                cache=self.build_cache,
                timeout=self.cfg.pip_timeout_s,
                note=lambda detail: self._step(base, detail),
            )
        except OSError as exc:
            raise StepFailed(f"building llama.cpp's server and rpc-server: {exc}") from None
        logger.info("llama.cpp's llama-server and ggml-rpc-server %s", origin)

    # ---- marks ------------------------------------------------------------------

    def _read_mark(self, env: Path) -> dict | None:
        try:
            return json.loads((env / MARK).read_text())
        except (OSError, ValueError):
            return None

    def _write_mark(self, env: Path, plan: Plan, version: str) -> None:
        tmp = env / (MARK + ".tmp")
        tmp.write_text(json.dumps({"plan": plan.fingerprint(), "version": version}))
        os.replace(tmp, env / MARK)


@contextlib.asynccontextmanager
async def _slot_lock(slot: Path):
    """An exclusive lock on ``slot`` (a file beside it) for as long as the block runs."""
    slot.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(slot.with_name(f".{slot.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another agent's install in %s", slot)
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _in_use(env: Path) -> bool:
    """Whether a process (an engine, its workers, a leader waiting for its followers)
    runs from ``env``: a path inside it among its arguments."""
    inside = f"{env}/"
    for proc in psutil.process_iter(["cmdline"]):
        if any(arg.startswith(inside) for arg in proc.info["cmdline"] or ()):
            return True
    return False
