"""Simulated agents for bench/agents.py: what they say, and a client process running many.

Kept free of Django so a client process costs only what a real agent's socket would.
"""

import asyncio
import gc
import json
import random
import time
from dataclasses import asdict, dataclass, field

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from agentd.client import Backoff, retry_after_s
from bench._common import raise_nofile

# As agentd: give up on a handshake after 10 s, on the register's ack after 15 s.
OPEN_TIMEOUT_S = 10
REGISTER_ACK_TIMEOUT_S = 15
LAG_PROBE_S = 0.05

# ---- what an agent says ------------------------------------------------------

GIB = 2**30
H100_MB = 81559


def register_msg(i: int) -> dict:
    """An 8x H100 node as agentd reports it: NVML facts, an IB fabric, disks, weights."""
    node_id = f"bench-{i:05d}"
    gpus = [
        {
            "index": g,
            "uuid": f"GPU-{i:08x}-{g:04x}-4b7d-9e2a-3c6f0d1b{g:04x}",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_mb": H100_MB,
            "memory_used_mb": 0,
            "compute_capability": "9.0",
            "numa_node": 0 if g < 4 else 1,
            "pci_bus_id": f"00000000:{0x18 + g * 0x10:02X}:00.0",
            "driver_version": "550.90.07",
            "cuda_version": "12.4",
            "nvlink_peers": [p for p in range(8) if p != g],
            "ecc_errors": 0,
            "temperature_c": 33 + g % 4,
            "problems": [],
        }
        for g in range(8)
    ]
    return {
        "type": "register",
        "v": 1,
        "node_id": node_id,
        "hostname": f"{node_id}.dc1.example",
        "mgmt_addr": f"10.{i // 250 % 250}.{i % 250}.7",
        "labels": {"zone": f"z{i % 4}", "rack": f"r{i // 32}"},
        "agent_version": "0.1.0",
        "engine_versions": {"vllm": "0.11.0", "sglang": "0.5.3"},
        "memory_total_mb": 2063500,
        "gpus": gpus,
        "fabrics": [{"fabric": "ib0", "hcas": [f"mlx5_{h}" for h in range(8)], "rate_gbps": 400}],
        "storage": [
            {"path": "/var/lib/llmgw", "free_bytes": 3 * 10**12, "total_bytes": 7 * 10**12},
            {"path": "/models", "free_bytes": 90 * 10**12, "total_bytes": 200 * 10**12},
        ],
        "weights": [
            {"path": "/models/Qwen3-235B-A22B", "size_bytes": 470 * 10**9, "shared": True},
            {"path": "/models/Llama-3.3-70B-Instruct", "size_bytes": 141 * 10**9, "shared": True},
            {"path": "/var/lib/llmgw/weights/gpt-oss-120b", "size_bytes": 65 * 10**9},
        ],
        "provision": [
            {"engine": "vllm", "version": "0.11.0", "variant": "cu128", "state": "installed"},
            {"engine": "sglang", "version": "0.5.3", "variant": "cu128", "state": "installed"},
        ],
    }


class HeartbeatMaker:
    """Heartbeats of one node: mostly the same facts, a little drift, like a serving node.

    Three nodes in four serve a model (GPU memory held by the engine, two
    shards' load); the rest are idle. GPU memory is reported every time and
    changes rarely, disk space drifts a little every time.
    """

    def __init__(self, i: int, rng: random.Random):
        self.rng = rng
        self.serving = i % 4 != 3
        self.gpu_used = [73_400 + rng.randrange(0, 600) if self.serving else 0] * 8
        self.state_free = 3 * 10**12
        self.seq = 0
        self.shards = [f"bench-{i:05d}-r{k}" for k in range(2)] if self.serving else []

    def next(self, desired_version: int, shards=None) -> dict:
        """The next heartbeat; ``shards``, when given, are the shard ids the node runs."""
        rng = self.rng
        self.seq += 1
        if self.serving and rng.random() < 0.2:
            g = rng.randrange(8)
            self.gpu_used = [*self.gpu_used]
            self.gpu_used[g] = max(0, self.gpu_used[g] + rng.randrange(-256, 257))
        self.state_free -= rng.randrange(0, 50 * 2**20)
        cpu = rng.uniform(20, 45) if self.serving else rng.uniform(0.5, 3)
        return {
            "type": "heartbeat",
            "v": 1,
            "seq": self.seq,
            "gpu_memory_used_mb": self.gpu_used,
            "storage": [
                {
                    "path": "/var/lib/llmgw",
                    "free_bytes": self.state_free,
                    "total_bytes": 7 * 10**12,
                },
                {
                    "path": "/models",
                    "free_bytes": 90 * 10**12,
                    "total_bytes": 200 * 10**12,
                    "shared": True,
                },
            ],
            "load": {
                "cpu_percent": round(cpu, 1),
                "cpu_count": 224,
                "load1": round(cpu * 2.24, 2),
                "load5": round(cpu * 2.2, 2),
                "load15": round(cpu * 2.1, 2),
                "memory_used_bytes": (600 if self.serving else 40) * GIB + rng.randrange(GIB),
                "memory_available_bytes": (1350 if self.serving else 1900) * GIB,
                "shards": [
                    {
                        "shard_id": s,
                        "cpu_cores": round(rng.uniform(1.0, 3.0), 2),
                        "rss_bytes": 48 * GIB + rng.randrange(GIB),
                    }
                    for s in (self.shards if shards is None else shards)
                ],
            },
            "desired_version": desired_version,
        }


# ---- the client side: one process runs many agents ---------------------------


@dataclass
class WorkerResult:
    enrol_s: list
    enrol_failed: dict
    hb_rtt_s: list
    ping_rtt_s: list
    hb_sent: int = 0
    hb_lost: int = 0
    closed_early: int = 0
    enrol_retries: int = 0
    lag_s: list = field(default_factory=list)
    gc_pauses_s: list = field(default_factory=list)
    # After the window: each reconnected agent's registration (wall clock), and
    # how many connection attempts the reconnects took.
    reregistered_at: list = field(default_factory=list)
    reconnect_attempts: int = 0
    reconnect_errors: dict = field(default_factory=dict)
    shards_started: int = 0


RETRYABLE = (OSError, TimeoutError, InvalidHandshake, ConnectionClosed)
# Who this node is refused (agentd stops on these); any other close is retried.
REFUSED = {4003, 4010}


class Agent:
    """One simulated node: enrols, registers, heartbeats, pings, runs what it is told to,
    and reconnects as agentd does (its own Backoff) when the socket ends."""

    def __init__(self, i: int, ctx: "Worker"):
        self.i, self.ctx = i, ctx
        self.rng = random.Random(i)
        self.hb = HeartbeatMaker(i, self.rng)
        self.desired_version = 0
        self.sent: dict[int, tuple[float, bool]] = {}  # seq -> (monotonic sent, in window)
        self.ws = None
        self.credential: str | None = None
        self.held: dict[str, dict] = {}  # shard id -> what register reports of it

    def register(self) -> dict:
        msg = register_msg(self.i)
        msg["running_shards"] = list(self.held.values())
        msg["desired_version"] = self.desired_version
        return msg

    async def _connect(self) -> None:
        """Open a socket with this node's credential (or the join token) and register."""
        from websockets.asyncio.client import connect

        ctx = self.ctx
        self.ws = await connect(
            ctx.ws_url,
            additional_headers={"Authorization": f"Bearer {self.credential or ctx.secret}"},
            ping_interval=None,  # our pings are measurements, not keepalives
            proxy=None,
            open_timeout=OPEN_TIMEOUT_S,
            max_queue=None,
        )
        try:
            await self.ws.send(json.dumps(self.register()))
            async with asyncio.timeout(REGISTER_ACK_TIMEOUT_S):
                while True:
                    msg = json.loads(await self.ws.recv())
                    if msg["type"] == "desired":
                        await self.on_desired(msg)
                    elif msg["type"] == "ack" and msg["of"] == "register":
                        break
        except BaseException:
            await self.ws.close()
            raise
        if self.credential is None:
            if not msg.get("credential"):
                raise RuntimeError("register ack without a credential on enrolment")
            self.credential = msg["credential"]

    async def enrol(self) -> None:
        """Enrol and register, retrying as agentd does: jittered backoff, 1 s doubling."""
        ctx = self.ctx
        t = time.perf_counter()
        deadline = time.monotonic() + ctx.enrol_timeout
        backoff = Backoff(rng=self.rng)
        while True:
            try:
                await self._connect()
                break
            except RETRYABLE as exc:
                refused = (
                    isinstance(exc, ConnectionClosed) and exc.rcvd and exc.rcvd.code in REFUSED
                )
                if refused or time.monotonic() >= deadline:
                    raise
                ctx.result.enrol_retries += 1
                await asyncio.sleep(backoff.wait_after(exc))
        ctx.result.enrol_s.append(time.perf_counter() - t)

    async def on_desired(self, msg: dict) -> None:
        """Run what the desired set says (a simulated engine is ready at once) and ack it."""
        if msg["version"] < self.desired_version:
            return  # fencing, as agentd
        self.desired_version = msg["version"]
        wanted = {s["shard_id"]: s for s in msg["shards"] if s["state"] == "running"}
        for sid in [sid for sid in self.held if sid not in wanted]:
            del self.held[sid]
        for sid, s in wanted.items():
            if sid in self.held:
                continue
            self.held[sid] = {
                "shard_id": sid,
                "replica_id": s["replica_id"],
                "state": "ready",
                "model": s["model"],
            }
            self.ctx.result.shards_started += 1
            await self.ws.send(
                json.dumps(
                    {
                        "type": "shard_status",
                        "v": 1,
                        "shard_id": sid,
                        "replica_id": s["replica_id"],
                        "state": "ready",
                    }
                )
            )
        await self.ws.send(
            json.dumps({"type": "ack", "v": 1, "of": "desired", "version": self.desired_version})
        )

    async def read(self) -> None:
        ctx = self.ctx
        try:
            async for raw in self.ws:
                now = time.monotonic()
                msg = json.loads(raw)
                if msg["type"] == "ack" and msg["of"] == "heartbeat":
                    sent = self.sent.pop(msg["seq"], None)
                    if sent is not None and sent[1]:
                        ctx.result.hb_rtt_s.append(now - sent[0])
                elif msg["type"] == "desired":
                    await self.on_desired(msg)
        except Exception:  # noqa: BLE001 - counted below; the bench goes on
            pass
        if not ctx.stopping and time.time() < ctx.window[1]:
            ctx.result.closed_early += 1

    async def beat(self, first_at: float) -> None:
        ctx, loop = self.ctx, asyncio.get_running_loop()
        interval = ctx.interval
        at = first_at
        while not ctx.stopping:
            await asyncio.sleep(max(0.0, at - loop.time()))
            if ctx.stopping:
                return
            in_window = ctx.window[0] <= time.time() < ctx.window[1]
            self.sent[self.hb.seq + 1] = (time.monotonic(), in_window)
            try:
                await self.ws.send(json.dumps(self.hb.next(self.desired_version, list(self.held))))
            except Exception:  # noqa: BLE001 - the reader counts the close
                return
            if in_window:
                ctx.result.hb_sent += 1
            await asyncio.sleep(max(0.0, at + interval / 2 - loop.time()))
            if ctx.stopping:
                return
            in_window = ctx.window[0] <= time.time() < ctx.window[1]
            t = time.monotonic()
            try:
                pong = await self.ws.ping()
                await asyncio.wait_for(pong, interval / 2)
            except Exception:  # noqa: BLE001 - a lost pong is not a heartbeat figure
                pass
            else:
                if in_window:
                    ctx.result.ping_rtt_s.append(time.monotonic() - t)
            at += interval

    async def live(self) -> None:
        """Serve the registered socket; when it ends, reconnect (agentd's backoff) and go on."""
        ctx, loop = self.ctx, asyncio.get_running_loop()
        while not ctx.stopping:
            # Staggered: the first heartbeat falls somewhere in the first interval.
            beat = asyncio.ensure_future(self.beat(loop.time() + self.rng.uniform(0, ctx.interval)))
            try:
                await self.read()
            finally:
                beat.cancel()
            # Heartbeats the dead socket ate are not news on the next one.
            self.sent = {seq: v for seq, v in self.sent.items() if v[1]}
            backoff = Backoff(rng=self.rng)
            failure = None
            while not ctx.stopping:
                await asyncio.sleep(backoff.wait_after(failure))
                if ctx.stopping:
                    return
                ctx.result.reconnect_attempts += 1
                try:
                    await self._connect()
                    break
                except RETRYABLE as exc:
                    failure = exc
                    kind = type(exc).__name__
                    if retry_after_s(exc) is not None:
                        kind = "TryLater"
                    ctx.result.reconnect_errors[kind] = ctx.result.reconnect_errors.get(kind, 0) + 1
            else:
                return
            ctx.result.reregistered_at.append(time.time())


class Worker:
    def __init__(
        self, ws_url, secret, ids, interval, enrol_concurrency, enrol_timeout, credentials=None
    ):
        self.ws_url, self.secret, self.ids = ws_url, secret, ids
        self.credentials = credentials
        self.interval = interval
        self.enrol_concurrency = enrol_concurrency
        self.enrol_timeout = enrol_timeout
        self.window = (float("inf"), float("inf"))
        self.stopping = False
        self.result = WorkerResult([], {}, [], [])

    async def run(self, conn) -> None:
        loop = asyncio.get_running_loop()
        sem = asyncio.Semaphore(self.enrol_concurrency)
        agents = [Agent(i, self) for i in self.ids]
        for agent, credential in zip(agents, self.credentials or (), strict=False):
            agent.credential = credential  # enrolled beforehand (--seed)
        tasks = []

        async def bring_up(agent: Agent):
            async with sem:
                try:
                    await agent.enrol()
                except Exception as exc:  # noqa: BLE001 - reported, not fatal
                    kind = f"{type(exc).__name__}: {str(exc)[:80]}"
                    self.result.enrol_failed[kind] = self.result.enrol_failed.get(kind, 0) + 1
                    return
            tasks.append(asyncio.ensure_future(agent.live()))

        await asyncio.gather(*(bring_up(a) for a in agents))
        conn.send(("registered", len(self.result.enrol_s)))
        t0, t1, drain = await loop.run_in_executor(None, conn.recv)
        self.window = (t0, t1)
        await asyncio.sleep(max(0.0, t0 - time.time()))
        # The clients' own stalls land in every round trip they time: measured
        # so a slow client is not mistaken for a slow server.
        gc.callbacks.append(self._gc_timer)
        while time.time() < t1:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            self.result.lag_s.append(loop.time() - t - LAG_PROBE_S)
        gc.callbacks.remove(self._gc_timer)
        # Heartbeats sent just before t1 get `drain` seconds to be acked, then count as lost.
        deadline = loop.time() + drain
        while loop.time() < deadline and any(
            in_window for a in agents for _, in_window in a.sent.values()
        ):
            await asyncio.sleep(0.2)
        self.result.hb_lost = sum(
            1 for a in agents for _, in_window in a.sent.values() if in_window
        )
        for a in agents:
            a.sent.clear()
        conn.send(("done", asdict(self.result)))
        # The agents stay connected (and reconnect) until told to stop: the
        # orchestrator may restart the control plane under them first.
        await loop.run_in_executor(None, conn.recv)
        self.stopping = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(
            *(
                asyncio.wait_for(a.ws.close(), 5)
                for a in agents
                if a.ws is not None and a.ws.state.name == "OPEN"
            ),
            return_exceptions=True,
        )
        conn.send(("bye", asdict(self.result)))

    _gc_started = 0.0

    def _gc_timer(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif info.get("generation") == 2:
            self.result.gc_pauses_s.append(time.perf_counter() - self._gc_started)


def worker_main(conn, *args) -> None:
    raise_nofile()
    worker = Worker(*args)
    asyncio.run(worker.run(conn))
