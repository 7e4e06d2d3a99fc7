"""One step of an engine install or its verification: a command run to its end.

Both the install loop (``agentd.install``) and its verification
(``agentd.verify``) run commands the same way: in a process group of their own,
bounded in time, their output kept for the operator, a failure raised as
``StepFailed`` with the last lines of it. This module changes when how such a
command is run or reported changes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

TAIL_LINES = 20


class StepFailed(Exception):
    """One step of an install or a verification failed; the message is for operators."""


# ``run_step``'s signature: argv, timeout, what, env, progress -> output.
Run = Callable[..., Awaitable[str]]


def has_own_pip() -> bool:
    """Whether the agent's own Python has a pip that installs into another
    environment (``--python``: pip 22.3 and later; Python 3.11 bundles 22.3)."""
    try:
        major, minor = (int(part) for part in version("pip").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (22, 3)


def new_venv(python: str, env: Path) -> list[str]:
    """The command that makes ``env`` anew with ``python``: without a pip of its own
    where ``pip_for`` brings the agent's."""
    bare = ["--without-pip"] if has_own_pip() else []
    return [python, "-m", "venv", "--clear", *bare, str(env)]


def pip_for(python: str | Path) -> list[str]:
    """The start of a pip command for the environment whose interpreter is ``python``.

    The agent's own pip, pointed at it (``--python``, pip 22.3 and later): a new
    environment is made without a pip of its own (``python -m venv
    --without-pip``), which saves ensurepip's install of the pip that Python
    bundles, 6 s of a CPU for each environment. Where the agent's Python has no
    pip, the environment's own (made with one)."""
    if has_own_pip():
        return [sys.executable, "-m", "pip", "--python", str(python)]
    return [str(python), "-m", "pip"]


def tail(text: str, lines: int = TAIL_LINES) -> str:
    kept = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def pip_phase(line: str) -> str:
    """What pip is doing, from one line of its output: downloading, building, installing."""
    if line.startswith(("Collecting ", "Downloading ", "  Downloading ", "Obtaining ")):
        return "downloading"
    if "Building wheel" in line or line.startswith("Building wheels"):
        return "building"
    if line.startswith("Installing collected packages"):
        return "installing"
    return ""


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads; gone already is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_step(
    argv: list[str],
    *,
    timeout: float,
    what: str,
    env: dict[str, str] | None = None,
    progress: Callable[[str, int | None], None] | None = None,
) -> str:
    """Run a command to its end, in a process group of its own; its output, or StepFailed
    with the last lines of it."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("PYTHONPATH", None)  # the agent's own imports are not the engine's
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )
    except OSError as exc:
        raise StepFailed(f"{what} could not start: {exc}") from None
    lines: list[str] = []
    phase = ""

    async def read():
        nonlocal phase
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            lines.append(line)
            del lines[:-200]
            if progress is not None:
                got = pip_phase(line)
                if got and got != phase:
                    phase = got
                    progress(got, None)

    try:
        async with asyncio.timeout(timeout):
            await read()
            code = await proc.wait()
    except TimeoutError:
        kill_group(proc.pid)
        await proc.wait()
        raise StepFailed(
            f"{what} took longer than {timeout:g} s\n{tail(chr(10).join(lines))}"
        ) from None
    except asyncio.CancelledError:
        kill_group(proc.pid)
        raise
    text = "\n".join(lines)
    if code != 0:
        raise StepFailed(f"{what} exited with {code}\n{tail(text)}")
    return text
