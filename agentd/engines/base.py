"""What every engine adapter provides, and the parts they share.

An adapter turns an engine profile plus one shard of a replica into the argv and
environment of a process, and knows how to ask that process whether it is ready,
how busy it is, and which version of the engine is installed. It starts nothing
itself: the supervisor does that.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the fake engine imports this module and should start fast
    from agentd.protocol import DesiredShard, ProfileSpec

PROBE_TIMEOUT_S = 2.0
ADAPTER_TIMEOUT_S = 300.0  # a load reads the adapter's weights onto the GPUs
SLEEP_TIMEOUT_S = 300.0  # a sleep copies the weights to host memory; a wake, back
VERSION_TIMEOUT_S = 60.0
_MAX_BODY = 4 * 1024 * 1024


class EngineUnavailable(Exception):
    """The engine cannot run on this node; the message says why (shown to operators)."""


class Probe(enum.Enum):
    DOWN = "down"  # nothing answers on the port (not listening yet, or stuck)
    LOADING = "loading"  # the server answers but is not ready to serve
    READY = "ready"


@dataclass(frozen=True)
class Launch:
    """A process to start: its argv and what it adds to the agent's environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def model_of(profile: ProfileSpec, shard: DesiredShard) -> str:
    """The weights to load: the profile's path when it names one, else the model's name."""
    return profile.model_path or shard.model


def served_name(profile: ProfileSpec, shard: DesiredShard) -> str:
    """The name clients ask for; the gateway routes on it."""
    return profile.served_model_name or shard.model


def base_env(profile: ProfileSpec, shard: DesiredShard) -> dict[str, str]:
    """The environment every engine gets: the profile's, then what placement decided.

    Placement wins over the profile for the GPUs: an operator's CUDA_VISIBLE_DEVICES
    would put two replicas on one card. A shard given no GPUs gets an empty list,
    so a CPU replica never grabs a card another replica was given.
    """
    env = {str(k): str(v) for k, v in profile.env.items()}
    env.setdefault("PYTHONUNBUFFERED", "1")  # engine output reaches the log as it happens
    # UUIDs rather than indices: indices change with CUDA_DEVICE_ORDER and with
    # what else is visible, a UUID names one card.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(shard.gpu_uuids)
    if shard.hcas:
        # "=" asks NCCL for exact names: without it "mlx5_1" also matches mlx5_10..17
        # (NCCL environment variables, NCCL_IB_HCA).
        env.setdefault("NCCL_IB_HCA", "=" + ",".join(shard.hcas))
    if shard.mgmt_interface:
        # Bootstrap and Gloo traffic on the management network, where the leader's
        # address is reachable; data goes over the HCAs above. NCCL takes prefixes
        # ("eno1" would match eno10 too): "=" asks for the exact name, as for
        # NCCL_IB_HCA. Gloo takes one interface's name as it is.
        env.setdefault("NCCL_SOCKET_IFNAME", "=" + shard.mgmt_interface)
        env.setdefault("GLOO_SOCKET_IFNAME", shard.mgmt_interface)
    return env


def run_capture(argv: list[str], timeout: float = VERSION_TIMEOUT_S) -> str:
    """Run a short command (a version probe) and return its stdout and stderr together."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            errors="replace",
        )
    except FileNotFoundError:
        raise EngineUnavailable(f"{argv[0]} is not installed") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineUnavailable(f"{' '.join(argv)} failed: {exc}") from None
    text = done.stdout + "\n" + done.stderr
    if done.returncode != 0:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        tail = lines[-1] if lines else ""
        raise EngineUnavailable(f"{' '.join(argv)} exited with {done.returncode}: {tail}")
    return text


def run_version(argv: list[str], timeout: float = VERSION_TIMEOUT_S) -> str:
    """Run a version command and return its last non-empty output line."""
    lines = [ln.strip() for ln in run_capture(argv, timeout).splitlines() if ln.strip()]
    if not lines:
        raise EngineUnavailable(f"{' '.join(argv)} printed no version")
    return lines[-1]


def which(binary: str) -> str:
    path = shutil.which(binary)
    if not path:
        raise EngineUnavailable(f"{binary} is not installed (not found on PATH)")
    return path


def python_dist_version(python: str, dist: str) -> str:
    """The installed version of a distribution in another interpreter, without importing it.

    Importing vLLM or SGLang takes seconds and touches CUDA; reading the metadata does not.
    """
    code = f"from importlib.metadata import version; print(version({dist!r}))"
    try:
        return run_version([python, "-c", code])
    except EngineUnavailable as exc:
        raise EngineUnavailable(f"{dist} is not installed for {python}: {exc}") from None


class Engine:
    """One kind of engine. Subclasses set the class attributes and ``args``.

    ``binary`` is what agent.yaml names for this engine, if anything; without
    it the adapter looks in its usual places.
    """

    name: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str | None] = "/metrics"
    # Prometheus series whose sum is the number of requests in flight (running
    # plus queued); empty when the engine exposes none.
    in_flight_series: ClassVar[tuple[str, ...]] = ()
    # Engines that are only run when agent.yaml names them (the fake engine).
    opt_in: ClassVar[bool] = False
    # Engines that read CUDA_VISIBLE_DEVICES as integers: given NVML indices (with
    # CUDA_DEVICE_ORDER=PCI_BUS_ID) instead of the UUIDs placement names.
    gpus_by_index: ClassVar[bool] = False
    # LoRA adapters (agentd.adapters): loaded at start only (a change restarts the
    # engine: llama.cpp), else through the engine's API while it serves. The API's
    # paths: (load, unload), each taking {"lora_name", "lora_path"}.
    adapters_at_start: ClassVar[bool] = False
    adapter_api: ClassVar[tuple[str, str] | None] = None
    # Sleep (docs/engines.md, "Sleep and wake"): an engine with a sleep API releases
    # its GPU memory and takes it back while its process stays (``sleep_call`` and
    # ``wake_call`` say how). Every other engine sleeps by stopping, its weights
    # left in the page cache, and wakes by starting again.
    sleep_api: ClassVar[bool] = False

    def __init__(self, binary: str | None = None):
        self.binary = binary

    # -- to be provided ------------------------------------------------------

    def command(self) -> list[str]:
        """The argv prefix that runs this engine, or EngineUnavailable."""
        raise NotImplementedError

    def args(self, profile: ProfileSpec, shard: DesiredShard, host: str, port: int) -> list[str]:
        raise NotImplementedError

    def version(self) -> str:
        """The installed version (blocking; call it off the event loop), or EngineUnavailable."""
        raise NotImplementedError

    # -- shared --------------------------------------------------------------

    def serves_http(self, shard: DesiredShard) -> bool:
        """Whether this shard answers HTTP. Multi-node followers do not: rank 0 serves."""
        return shard.rank == 0

    def env(self, profile: ProfileSpec, shard: DesiredShard) -> dict[str, str]:
        return base_env(profile, shard)

    def build(self, profile: ProfileSpec, shard: DesiredShard, *, host: str, port: int) -> Launch:
        """The process for this shard. The profile's extra args come last, so they win."""
        argv = self.command() + self.args(profile, shard, host, port) + list(profile.args)
        return Launch(argv=argv, env=self.env(profile, shard))

    async def load_adapter(self, host: str, port: int, name: str, path: str) -> str:
        """Load a LoRA adapter into the running engine; "" when loaded, else the engine's
        reason."""
        if self.adapter_api is None:
            return f"{self.name} loads no adapters while it runs"
        return await _adapter_call(host, port, self.adapter_api[0], name, path)

    async def unload_adapter(self, host: str, port: int, name: str) -> str:
        if self.adapter_api is None:
            return ""
        return await _adapter_call(host, port, self.adapter_api[1], name, None)

    def sleeps_in_place(self, shard: DesiredShard) -> bool:
        """Whether this shard's engine sleeps through its API (its process stays)."""
        return self.sleep_api and shard.sleep_level > 0

    def sleep_call(self, level: int) -> tuple[str, dict | None]:
        """The POST that puts the engine to sleep at ``level``: its path and JSON body."""
        raise NotImplementedError

    def wake_call(self) -> tuple[str, dict | None]:
        """The POST that wakes it."""
        raise NotImplementedError

    def wake_calls(self, shard: DesiredShard) -> list[tuple[str, dict | None]]:
        """The POSTs that wake this shard's engine, in order."""
        return [self.wake_call()]

    async def sleep(self, host: str, port: int, level: int) -> str:
        """Put the engine to sleep; "" when it answered 200, else its reason."""
        return await _post(host, port, *self.sleep_call(level), SLEEP_TIMEOUT_S)

    async def wake(self, host: str, port: int, shard: DesiredShard) -> str:
        """Wake the engine; "" when every call answered 200, else the first one's reason."""
        for path, body in self.wake_calls(shard):
            if problem := await _post(host, port, path, body, SLEEP_TIMEOUT_S):
                return problem
        return ""

    async def probe(self, host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> Probe:
        try:
            status, _ = await http_get(host, port, self.health_path, timeout)
        except (OSError, TimeoutError, ValueError):
            return Probe.DOWN
        return Probe.READY if status == 200 else Probe.LOADING

    async def in_flight(self, host: str, port: int) -> int | None:
        """Requests running or queued, from the engine's metrics; None when it cannot say."""
        if not self.in_flight_series or not self.metrics_path:
            return None
        try:
            status, body = await http_get(host, port, self.metrics_path, PROBE_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError):
            return None
        if status != 200:
            return None
        return metric_sum(body.decode("utf-8", "replace"), self.in_flight_series)


async def _adapter_call(host: str, port: int, path: str, name: str, lora: str | None) -> str:
    body = {"lora_name": name} if lora is None else {"lora_name": name, "lora_path": lora}
    try:
        status, answer = await http_request(
            host, port, path, ADAPTER_TIMEOUT_S, method="POST", body=json.dumps(body).encode()
        )
    except (OSError, TimeoutError, ValueError) as exc:
        return f"{path} did not answer: {exc or type(exc).__name__}"
    if status == 200:
        return ""
    # The engine's words, cut here and bounded again with the adapter's reason.
    return f"{path} answered {status}: {answer[:2048].decode('utf-8', 'replace').strip()}"


async def _post(host: str, port: int, path: str, body: dict | None, timeout: float) -> str:
    data = json.dumps(body).encode() if body is not None else b""
    try:
        status, answer = await http_request(host, port, path, timeout, method="POST", body=data)
    except (OSError, TimeoutError, ValueError) as exc:
        return f"{path.split('?')[0]} did not answer: {exc or type(exc).__name__}"
    if status == 200:
        return ""
    text = answer[:2048].decode("utf-8", "replace").strip()
    return f"{path.split('?')[0]} answered {status}: {text}"


def metric_sum(text: str, names: tuple[str, ...]) -> int | None:
    """The sum over every sample of the named series in Prometheus text; None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            # "name{labels} value [timestamp]" or "name value [timestamp]"
            rest = line.rsplit("}", 1)[1] if "}" in line else line[len(name) :]
            try:
                total += float(rest.split()[0])
            except (IndexError, ValueError):
                continue
            seen = True
    return round(total) if seen else None


async def http_get(host: str, port: int, path: str, timeout: float) -> tuple[int, bytes]:
    """A bare HTTP/1.0 GET: status and body. Small on purpose, so the agent needs no client."""
    return await http_request(host, port, path, timeout)


async def http_request(
    host: str, port: int, path: str, timeout: float, method: str = "GET", body: bytes = b""
) -> tuple[int, bytes]:
    """A bare HTTP/1.0 request (a JSON body, if any): status and body."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            extra = (
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body else ""
            )
            writer.write(
                f"{method} {path} HTTP/1.0\r\nHost: {host}:{port}\r\n{extra}"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            data = b""
            while len(data) <= _MAX_BODY:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
        finally:
            writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ValueError(f"not an HTTP response from {host}:{port}")
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(b":")
        headers[key.strip().lower()] = value.strip().lower()
    if headers.get(b"transfer-encoding") == b"chunked":
        body = _dechunk(body)
    return int(parts[1]), body


def _dechunk(body: bytes) -> bytes:
    out, pos = b"", 0
    while True:
        end = body.find(b"\r\n", pos)
        if end < 0:
            return out
        size = int(body[pos:end].split(b";")[0] or b"0", 16)
        if size == 0:
            return out
        out += body[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


def is_python(path: str) -> bool:
    """Whether a configured binary is a Python interpreter (so a module is run with -m)."""
    return os.path.basename(path).startswith("python")


_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def weights_path(spec: DesiredShard) -> Path | None:
    """Where a shard's weights land while they download: the model path, or its hub cache."""
    model = spec.profile.model_path or spec.model
    if os.path.isabs(model):
        return Path(model)
    if _REPO_ID.match(model):
        env = {**os.environ, **spec.profile.env}
        hub = env.get("HF_HUB_CACHE") or os.path.join(
            env.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
        )
        return Path(hub) / ("models--" + model.replace("/", "--"))
    return None


def tree_size(path: Path) -> int:
    """Bytes in regular files under path (symlinks not followed: the hub cache links blobs)."""
    try:
        if path.is_file():
            return path.stat().st_size
    except OSError:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if not os.path.islink(full):
                total += st.st_size
    return total
