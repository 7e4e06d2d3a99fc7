"""The fake engine's sleep mode, as vLLM 0.32.0 serves it.

vLLM's development endpoints, served only when VLLM_SERVER_DEV_MODE=1 (else they
are unknown paths: 404): ``POST /sleep?level=0|1|2&mode=abort|wait|keep``,
``POST /wake_up`` (``?tags=weights&tags=kv_cache`` to wake part of it), ``GET
/is_sleeping`` and ``POST /collective_rpc`` (``{"method": "reload_weights"}``
reads the weights again after a level-2 sleep). Their methods, parameters,
statuses and bodies are vLLM's (vllm/entrypoints/serve/dev/sleep/api_router.py,
dev/rpc/api_router.py; vllm/v1/engine/core.py, vllm/v1/executor/abstract.py for
what a sleep does); the contract test holds them to the CPU build.

What the fake does with them:

- A sleep pauses scheduling first: ``wait`` lets what runs finish, ``abort`` ends
  it (finish_reason "abort"), ``keep`` freezes it; requests that arrive while it
  is paused queue and run after the wake (a later sleep with ``abort`` ends them
  too). vLLM's gauges do not move while it is paused, so queued requests are not
  counted as waiting. /health still answers 200. Level 0 only pauses.
- Started with ``--enable-sleep-mode``, levels 1 and 2 release its claim in the
  NVML double: level 1 keeps the weights' bytes in host memory (printed, and
  ``fake:host_memory_bytes``) and takes ``--wake-time`` to copy them each way;
  level 2 keeps nothing, and a wake maps the weights' memory back empty: until
  ``reload_weights`` (``--load-time``) its completions are "!" tokens, as a
  model's with zeroed weights are. A wake that finds no room on a GPU answers
  500, as a failed CUDA allocation does, and leaves the memory unclaimed.
- Without it (vLLM on a CPU, where sleep mode is refused) a sleep only pauses:
  nothing is released.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from agentd import gpuclaims

TAGS = frozenset(("weights", "kv_cache"))  # vLLM's SLEEP_TAGS
MODES = ("abort", "wait", "keep")  # vLLM's PauseMode
NOT_INT = "Input should be a valid integer, unable to parse string as an integer"
PATHS = {"/sleep": "POST", "/wake_up": "POST", "/is_sleeping": "GET", "/collective_rpc": "POST"}
# vllm:engine_sleep_state, in vLLM's words (vllm/v1/metrics/loggers.py).
STATE_HELP = (
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
    "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2."
)


def dev_mode() -> bool:
    """VLLM_SERVER_DEV_MODE as vLLM reads it (vllm/envs.py): an integer, 0 by default."""
    try:
        return bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        return False


def error(message: str, kind: str, status: int, param: str | None = None) -> dict:
    """vLLM's error body (the fake's FakeApi.error)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class Memory:
    """What the engine holds in the NVML double, by vLLM's memory tag: each GPU's
    share split into weights and KV cache."""

    def __init__(self, path: Path, parts: dict[str, dict[str, int]]):
        self.path = path
        self.parts = parts  # tag -> {GPU uuid: bytes}
        self.awake: set[str] = set()

    def claims(self, tags: set[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for tag in tags:
            for uuid, size in self.parts.get(tag, {}).items():
                out[uuid] = out.get(uuid, 0) + size
        return out

    def take(self, tags: set[str]) -> None:
        """Claim these tags' memory too, or raise gpuclaims.OutOfMemory having claimed none."""
        want = self.awake | tags
        gpuclaims.take(self.path, os.getpid(), self.claims(want))
        self.awake = want

    def release(self) -> None:
        self.awake = set()
        gpuclaims.claim(self.path, os.getpid(), {})

    def weights_bytes(self) -> int:
        return sum(self.parts.get("weights", {}).values())


class Sleep:
    """The engine's sleep state and vLLM's endpoints over it."""

    def __init__(self, enabled: bool, wake_time: float, load_time: float):
        self.enabled = enabled  # --enable-sleep-mode: memory is released
        self.wake_time = wake_time
        self.load_time = load_time
        self.memory: Memory | None = None  # set when it holds memory in the NVML double
        self.tags: set[str] = set()  # the executor's sleeping tags
        self.paused = False  # the scheduler's
        self.admit = asyncio.Event()  # new requests are scheduled
        self.step = asyncio.Event()  # running requests go on (cleared by mode=keep)
        self.admit.set()
        self.step.set()
        self.epoch = 0  # raised by mode=abort: what runs or waits ends
        self.gauge = (0, 0)  # (asleep, level) as vllm:engine_sleep_state shows them
        self.host_bytes = 0  # the weights kept in host memory at level 1
        self.dropped = False  # level 2 discarded the weights
        self.stale = False  # their memory is back but empty: reload_weights not yet run

    # -- what the server asks --------------------------------------------------

    @property
    def sleeping(self) -> bool:
        return self.paused or bool(self.tags)

    def metrics(self, labels: str) -> list[str]:
        """vllm:engine_sleep_state's lines, ``labels`` being vLLM's others ("engine=..,")."""
        asleep, level = self.gauge
        values = {
            "awake": 0 if asleep else 1,
            "weights_offloaded": int(asleep and level == 1),
            "discard_all": int(asleep and level == 2),
        }
        lines = [
            f"# HELP vllm:engine_sleep_state {STATE_HELP}",
            "# TYPE vllm:engine_sleep_state gauge",
        ]
        for state, value in values.items():
            lines.append(f'vllm:engine_sleep_state{{{labels},sleep_state="{state}"}} {value:.1f}')
        held = sum(self.memory.claims(self.memory.awake).values()) if self.memory else 0
        return lines + [
            f"fake:gpu_memory_bytes {held}",
            f"fake:host_memory_bytes {self.host_bytes}",
        ]

    # -- the endpoints -----------------------------------------------------------

    async def route(
        self, method: str, path: str, query: str, body: bytes, in_flight: Callable[[], int]
    ) -> tuple[int, dict]:
        """(status, JSON answer) of one of PATHS, as vLLM answers it."""
        if method != PATHS[path]:
            return 405, {"detail": "Method Not Allowed"}  # Starlette's words
        params = parse_qs(query, keep_blank_values=True)
        if path == "/sleep":
            return await self.sleep(params, in_flight)
        if path == "/wake_up":
            return await self.wake(params.get("tags", []))
        if path == "/is_sleeping":
            return 200, {"is_sleeping": self.sleeping}
        return await self.collective_rpc(body)

    async def sleep(self, params: dict, in_flight: Callable[[], int]) -> tuple[int, dict]:
        level, mode, problems = 1, "abort", []
        if "level" in params:
            given = params["level"][-1]
            try:
                level = int(given)
            except ValueError:
                problems.append(_invalid("int_parsing", "level", given, NOT_INT))
            else:
                if level < 0:
                    problems.append(_invalid("greater_than_equal", "level", given,
                                             "Input should be greater than or equal to 0",
                                             {"ge": 0}))  # fmt: skip
                elif level > 2:
                    problems.append(_invalid("less_than_equal", "level", given,
                                             "Input should be less than or equal to 2",
                                             {"le": 2}))  # fmt: skip
        if "mode" in params:
            mode = params["mode"][-1]
            if mode not in MODES:
                expected = "'abort', 'wait' or 'keep'"
                problems.append(_invalid("literal_error", "mode", mode,
                                         f"Input should be {expected}",
                                         {"expected": expected}))  # fmt: skip
        if problems:
            label = "error" if len(problems) == 1 else "errors"
            text = f"{len(problems)} validation {label}:\n" + "\n".join(f"  {p}" for p in problems)
            return 400, error(text, "Bad Request", 400, problems[0]["loc"])
        await self.pause(mode, in_flight)
        if level >= 1 and "weights" not in self.tags:  # a second sleep changes nothing
            if self.enabled and self.memory is not None:
                if level == 1:
                    await asyncio.sleep(self.wake_time)  # the weights copied out
                    self.host_bytes = self.memory.weights_bytes()
                self.dropped = level == 2
                self.memory.release()
            self.tags |= TAGS
        self.gauge = (1, level)
        kept = f", holding {self.host_bytes} bytes of host memory" if level == 1 else ""
        print(f"fake engine: asleep at level {level}{kept}", flush=True)
        return 200, {"status": "sleeping", "level": level}

    async def pause(self, mode: str, in_flight: Callable[[], int]) -> None:
        self.paused = True
        self.admit.clear()
        if mode == "keep":
            self.step.clear()
            return
        if mode == "abort":
            self.epoch += 1
        while in_flight():
            await asyncio.sleep(0.01)

    async def wake(self, tags: list[str]) -> tuple[int, dict]:
        asked = tags or None
        core = [t for t in asked if t != "scheduling"] if asked else None
        if core is None or core:
            problem = await self.wake_memory(core)
            if problem:
                text = f"Call to wake_up method failed: {problem}"
                return 500, error(text, "InternalServerError", 500)
        awake = not self.tags
        if awake:
            self.paused = False
            self.gauge = (0, 0)
            self.admit.set()
            self.step.set()
            print("fake engine: awake", flush=True)
        return 200, {"status": "awake" if awake else "sleeping", "tags": asked}

    async def wake_memory(self, tags: list[str] | None) -> str:
        """The executor's wake of these tags (all when None): "" or why it failed."""
        if not self.tags or (tags and any(t not in self.tags for t in tags)):
            return ""  # vLLM logs a warning and wakes nothing
        waking = set(tags) if tags else set(self.tags)
        if self.enabled and self.memory is not None:
            try:
                self.memory.take(waking & TAGS)
            except gpuclaims.OutOfMemory as exc:
                print(f"fake engine: no room to wake: {exc}", flush=True)
                # vLLM's cumem allocator's words; it names its source file, shown as <path>.
                return "CUDA Error: out of memory at <path>"
            if "weights" in waking and not self.dropped:
                await asyncio.sleep(self.wake_time)  # the weights copied back
        if "weights" in waking:
            self.stale, self.dropped = self.dropped, False
            self.host_bytes = 0
        self.tags -= waking
        return ""

    async def collective_rpc(self, body: bytes) -> tuple[int, dict]:
        try:
            req = json.loads(body or b"")
        except ValueError as exc:
            return 400, error(f"JSON decode error: {exc}", "Bad Request", 400)
        if not isinstance(req, dict):
            return 400, error("Request body must be a JSON object", "Bad Request", 400)
        method = req.get("method")
        if method is None:
            return 400, error("Missing 'method' in request body", "Bad Request", 400)
        if method != "reload_weights":
            # vLLM's words for a method its worker lacks; CPUWorker on its CPU build.
            worker = "Worker" if os.environ.get("CUDA_VISIBLE_DEVICES") else "CPUWorker"
            text = (
                f"Call to collective_rpc method failed: Worker failed with error "
                f"''{worker}' object has no attribute '{method}'', please check the stack "
                "trace above for the root cause"
            )
            return 500, error(text, "InternalServerError", 500)
        if self.enabled and self.memory is not None and "weights" not in self.memory.awake:
            # Writing into released memory is a CUDA fault in vLLM; here, only refused.
            text = "Call to collective_rpc method failed: the weights' memory is asleep"
            return 500, error(text, "InternalServerError", 500)
        await asyncio.sleep(self.load_time)  # the weights read again from the model's files
        self.stale = False
        return 200, {"results": [None]}


def _invalid(kind: str, name: str, given: str, msg: str, ctx: dict | None = None) -> dict:
    """One of pydantic's errors for a query parameter, as vLLM reports it."""
    out = {"type": kind, "loc": f"query.{name}", "msg": msg, "input": given}
    return {**out, "ctx": ctx} if ctx else out
