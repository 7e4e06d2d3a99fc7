"""The gateway as the public gateway boards measure it: plain and governed, beside the
engine and LiteLLM's proxy, in one run, one table.

    .venv/bin/python bench/gateway_boards.py [--rounds 2] [--duration 5] [--no-litellm]

Definitions (those of the public multi-gateway comparisons):

- **added latency**: a lane's latency minus the engine's, measured directly against
  the same engine in the same run, p50 and p99, one connection (c=1), a whole answer
  of one token (wrk);
- **throughput**: requests a second at 64 connections (wrk), with that point's p99;
- **time to first token added**: a 20-token stream at c=1, from the request's first
  byte sent to the first event carrying text, minus the engine's directly (this
  script's client: asyncio with httptools' parser, one connection a worker);
- **220 KB prompts**: a chat request whose message is 220 KB of text, streamed, at
  150 connections: requests a second and the time to first token added.

Lanes, each its own web process (``python -m llmgw_site.serve``, as `make run` serves
it) on one SQLite and one Redis:

- ``direct``: the fake engine (``agentd.engines.fake``) itself;
- ``llmgw plain``: a key without limits or team, a model without prefix routing, no
  fair-share queue (``LLMGW_GATEWAY_FAIR_QUEUE=0``);
- ``llmgw governed``: a key with requests-a-minute and tokens-a-minute/day/month
  limits and ``max_concurrent``, of a team with a token budget and a budget in money,
  the fair-share queue on (``LLMGW_GATEWAY_FAIR_QUEUE=1024``, weighted fair order), a
  model with prefix routing on; usage counted and written as always. The limits are
  set far above what the run sends, so nothing is refused and every check is made;
- ``llmgw governed, 2 workers``: the same with ``--workers 2`` (one process a core),
  for the 220 KB run only (``--no-workers`` leaves it out);
- ``litellm``: LiteLLM's proxy, one process, a master key, no database, from its own
  virtualenv (``--litellm-venv``, made with ``pip install 'litellm[proxy]'``); not
  in the 220 KB run (tens of requests a second would take minutes a point).

Every model has two ready replicas on the one engine, so prefix routing has a ring
to choose on. Lanes are measured one after another for each point, in an order that
turns each round, so the neighbours' load falls on all of them alike; ``--rounds N``
reports medians. ``--profile`` also samples the governed process with py-spy
(``--py-spy``) while wrk loads it at c=64, and prints where its time went.

The table goes to stdout and ``bench/out/gateway_boards.md``, the figures to
``bench/out/gateway_boards.json``.
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (  # noqa: E402
    OUT,
    ROOT,
    Procs,
    commit,
    cpu_seconds,
    gateway_env,
    percentile,
    run_setup,
    setup_django,
    start_engine,
    start_gateway,
    start_litellm,
    wrk,
)

PLAIN_MODEL = "tiny"
GOVERNED_MODEL = "tiny-gov"
BIG_PROMPT_BYTES = 220 * 1024
# What the governed key and its team may use: far above what a run sends, so that
# every check is made and none refuses.
GOVERNED_LIMITS = {
    "requests_per_minute": 2_000_000_000,
    "tokens_per_minute": 2_000_000_000,
    "tokens_per_day": 10**15,
    "tokens_per_month": 10**15,
    "max_concurrent": 100_000,
}
PLAIN_ENV = {"LLMGW_GATEWAY_FAIR_QUEUE": "0", "LLMGW_GATEWAY_FAIR_SHARE": "false"}
GOVERNED_ENV = {"LLMGW_GATEWAY_FAIR_QUEUE": "1024", "LLMGW_GATEWAY_FAIR_SHARE": "true"}

# The issue's goals (issue 53), checked in the table's last lines.
GOAL_C1_P50_MS = 0.25
GOAL_C1_P99_MS = 0.40
GOAL_C64_SHARE = 0.85
GOAL_TTFT_P99_MS = 0.5
GOAL_BIG_RPS = 1000
GOAL_BIG_TTFT_MS = 5.0


def chat(model: str, content: str, max_tokens: int, stream: bool = False) -> dict:
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
    }
    if stream:
        body["stream"] = True
    return body


def big_prompt(size: int = BIG_PROMPT_BYTES) -> str:
    """``size`` bytes of words, as a long document pasted into a prompt would be."""
    words = "the gateway routes each request to the replica that holds its prefix".split()
    out, n, i = [], 0, 0
    while n < size:
        w = words[i % len(words)] + str(i % 97)
        out.append(w)
        n += len(w) + 1
        i += 1
    return " ".join(out)[:size]


# ---- the fleet: two models, two replicas each on the one engine, two keys ----------


def setup_db(engine_port: int) -> None:
    """In a subprocess with the bench's environment: migrate, the fleet rows, the keys."""
    setup_django()
    from decimal import Decimal

    from django.contrib.auth.models import Group

    from fleet.models import (
        ApiKey,
        Engine,
        EngineProfile,
        Model,
        Node,
        Replica,
        ReplicaState,
        Shard,
        ShardState,
        Team,
    )

    node = Node.objects.create(pk="bench-01", mgmt_addr="127.0.0.1", connected=True)
    for name, by_prefix in ((PLAIN_MODEL, False), (GOVERNED_MODEL, True)):
        model = Model.objects.create(name=name, desired_replicas=2, prefix_routing=by_prefix)
        profile = EngineProfile.objects.create(
            model=model, name="bench", engine=Engine.FAKE, model_path="/none"
        )
        for _ in range(2):
            replica = Replica.objects.create(model=model, profile=profile, state=ReplicaState.READY)
            Shard.objects.create(
                replica=replica, node=node, port=engine_port, state=ShardState.READY
            )
    team = Team.objects.create(
        name="bench-team",
        group=Group.objects.create(name="bench-team"),
        tokens_per_month=10**15,
        budget_per_month=Decimal("1000000"),
        budget_currency="USD",
    )
    _, plain = ApiKey.issue(name="bench-plain", scope="inference")
    _, governed = ApiKey.issue(
        name="bench-governed", scope="inference", team=team, **GOVERNED_LIMITS
    )
    print(plain)
    print(governed)


# ---- the streaming client: time to first token ------------------------------------

# An event carrying generated text: a "content" that is not empty (the role event's is).
_TOKEN = re.compile(rb'"content":\s*"[^"]')


def _load_client():
    import httptools

    class Conn(asyncio.Protocol):
        """One keep-alive connection; ``request`` sends one and waits for its end."""

        def __init__(self, loop):
            self.loop = loop
            self.parser = httptools.HttpResponseParser(self)
            self.transport = None
            self.done = None
            self.first = 0.0
            self.status = 0
            self.tail = b""

        def connection_made(self, transport):
            self.transport = transport

        def data_received(self, data):
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as exc:
                self._fail(exc)

        def connection_lost(self, exc):
            self._fail(exc or ConnectionError("closed"))

        def _fail(self, exc):
            if self.done is not None and not self.done.done():
                self.done.set_exception(exc)

        def on_headers_complete(self):
            self.status = self.parser.get_status_code()

        def on_body(self, body):
            if not self.first:
                seen = self.tail + body
                if _TOKEN.search(seen):
                    self.first = time.perf_counter()
                else:
                    self.tail = seen[-32:]

        def on_message_complete(self):
            if self.done is not None and not self.done.done():
                self.done.set_result(None)

        async def request(self, raw: bytes) -> None:
            self.first, self.status, self.tail = 0.0, 0, b""
            self.done = self.loop.create_future()
            self.transport.write(raw)
            await self.done

    return Conn


def request_bytes(port: int, key: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _stream_load(port: int, raw: bytes, conc: int, duration: float) -> dict:
    loop = asyncio.get_running_loop()
    conn_class = _load_client()
    conns = []
    for _ in range(conc):
        _, conn = await loop.create_connection(lambda: conn_class(loop), "127.0.0.1", port)
        conns.append(conn)
    ttft: list[float] = []
    bad = [0]

    async def worker(conn, until: float, record: bool) -> None:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            await conn.request(raw)
            if conn.status != 200 or not conn.first:
                bad[0] += 1
            elif record:
                ttft.append((conn.first - t0) * 1000)

    # A second's warm-up on every connection, then the measured window.
    await asyncio.gather(*(worker(c, time.perf_counter() + 1.0, False) for c in conns))
    bad[0] = 0
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c, t0 + duration, True) for c in conns))
    took = time.perf_counter() - t0
    for c in conns:
        c.transport.close()
    return {
        "rps": len(ttft) / took,
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "requests": len(ttft),
        "bad": bad[0],
        "load1": os.getloadavg()[0],
    }


def stream_load(port: int, raw: bytes, conc: int, duration: float, pgid=None) -> dict:
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    cpu0 = cpu_seconds(pgid) if pgid else 0.0
    r = runner(_stream_load(port, raw, conc, duration))
    # The warm-up's requests are in the CPU too: per request, roughly.
    if pgid and r["requests"]:
        total = r["requests"] * (duration + 1.0) / duration
        r["cpu_ms_per_request"] = (cpu_seconds(pgid) - cpu0) * 1000 / total
    return r


# ---- lanes ----------------------------------------------------------------------


class Lane:
    def __init__(self, name: str, port: int, key: str, model: str, pgid: int, points: set):
        self.name, self.port, self.key, self.model, self.pgid = name, port, key, model, pgid
        self.points = points  # the points measured on this lane

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


def check_lane(lane: Lane, big: str) -> None:
    """One whole answer and one stream, checked: no figure is the speed of an error."""
    import urllib.request

    for payload in (
        chat(lane.model, "hi", 1),
        chat(lane.model, "hi", 20, stream=True),
        chat(lane.model, big, 4, stream=True),
    ):
        req = urllib.request.Request(
            lane.url,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {lane.key}"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = resp.read()
        if payload.get("stream"):
            assert body.rstrip().endswith(b"[DONE]") and _TOKEN.search(body), body[:300]
        else:
            assert json.loads(body)["choices"], body[:300]


def settle(pgid: int, timeout: float = 60) -> None:
    """Wait until a process group has finished what the last run left it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pgid)
        time.sleep(0.3)
        if cpu_seconds(pgid) - before < 0.03:
            return


def measure(point: str, lane: Lane, args, work: Path, big: str) -> dict:
    duration = args.litellm_duration if lane.name.startswith("litellm") else args.duration
    if point == "c1":
        payload = chat(lane.model, "hi", 1)
        wrk(lane.url, payload, lane.key, 1, 1, work)  # warm-up
        settle(lane.pgid)
        return wrk(lane.url, payload, lane.key, 1, duration, work, lane.pgid)
    if point == "c64":
        payload = chat(lane.model, "hi", 1)
        wrk(lane.url, payload, lane.key, 64, 1, work)
        settle(lane.pgid)
        r = wrk(lane.url, payload, lane.key, 64, duration, work, lane.pgid)
        settle(lane.pgid)
        return r
    if point == "ttft":
        raw = request_bytes(lane.port, lane.key, chat(lane.model, "hi", 20, stream=True))
        return stream_load(lane.port, raw, 1, duration, lane.pgid)
    if point == "big":
        raw = request_bytes(lane.port, lane.key, chat(lane.model, big, 4, stream=True))
        r = stream_load(lane.port, raw, args.big_concurrency, args.big_duration, lane.pgid)
        settle(lane.pgid)
        return r
    raise ValueError(point)


def line(point: str, name: str, r: dict) -> str:
    if point in ("c1", "c64"):
        text = f"p50 {r['p50_ms']:7.3f}  p99 {r['p99_ms']:7.3f} ms  {r['rps']:8.0f} req/s"
    else:
        text = (
            f"ttft p50 {r['ttft_p50_ms']:7.3f}  p99 {r['ttft_p99_ms']:7.3f} ms  "
            f"{r['rps']:8.0f} req/s"
        )
    cpu = r.get("cpu_ms_per_request")
    bad = r.get("non_2xx") or r.get("bad")
    return (
        f"{point:5} {name:28} {text}"
        + (f"  cpu {cpu:5.2f} ms/req" if cpu else "")
        + f"  load {r['load1']:.1f}"
        + (f"  FAILED {bad}" if bad else "")
    )


def _median(runs: list[dict]) -> dict:
    out = {}
    for field, first in runs[0].items():
        values = [r.get(field) for r in runs]
        if field == "load1":
            out[field] = max(values)
        elif field in ("non_2xx", "bad", "requests"):
            out[field] = sum(v or 0 for v in values)
        elif all(isinstance(v, int | float) for v in values):
            out[field] = statistics.median(values)
        else:
            out[field] = first
    return out


def full_collections(port: int) -> dict:
    """A web process's full garbage collections so far (llmgw_site.serve counts them)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    got = {}
    for row in text.splitlines():
        for field in ("count", "sum"):
            if row.startswith(f"llmgw_web_gc_full_collection_seconds_{field} "):
                got[field] = float(row.split()[-1])
    return got


def wait_quiet(below: float, limit_s: float = 600) -> None:
    """Wait until the machine's 1-minute load average is under ``below``."""
    deadline, said = time.monotonic() + limit_s, 0.0
    while os.getloadavg()[0] >= below and time.monotonic() < deadline:
        if time.monotonic() - said > 60:
            print(f"  waiting for load < {below:g} (now {os.getloadavg()[0]:.1f})", flush=True)
            said = time.monotonic()
        time.sleep(2)


# ---- profile ----------------------------------------------------------------------


def profile(lane: Lane, args, work: Path, point: str, big: str) -> str:
    """py-spy's samples of ``lane``'s processes while ``point`` is measured on it: the
    frames that hold the most samples, by their own time and with what they call."""
    spy = args.py_spy or shutil.which("py-spy")
    if not spy:
        return "py-spy not found (--py-spy PATH): no profile"
    out = work / f"profile-{point}.collapsed"
    seconds = args.big_duration if point == "big" else args.duration
    spy_proc = subprocess.Popen(
        [spy, "record", "--pid", str(lane.pgid), "--subprocesses", "--format", "raw"]
        + ["--output", str(out), "--rate", "1000", "--nonblocking"]
        + ["--duration", str(int(seconds) + 4)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1)
    measure(point, lane, args, work, big)
    spy_proc.wait(120)
    return summarize(out.read_text() if out.exists() else "")


def summarize(collapsed: str, top: int = 25) -> str:
    """The collapsed stacks' frames by own samples and by samples under them."""
    own: dict[str, int] = {}
    under: dict[str, int] = {}
    total = 0
    for row in collapsed.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            under[f] = under.get(f, 0) + n
    if not total:
        return "no samples"
    lines = [f"{total} samples"]
    for title, table in (("own", own), ("with callees", under)):
        lines.append(f"-- {title}:")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"{100 * n / total:5.1f}%  {frame}")
    return "\n".join(lines)


# ---- the table -------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x:+.2f}"


def table(res: dict, names: list[str], commit: str) -> str:
    d = res.get("direct", {})
    rows = [
        "| lane | added c=1 p50 / p99 | req/s c=64 (share of plain) / p99 "
        "| TTFT added c=1 p50 / p99 | cpu/req c=64 "
        f"| 220 KB c={res['big_concurrency']}: req/s / TTFT added p50 / p99 |",
        "| --- | --- | --- | --- | ---: | --- |",
    ]
    plain = res.get("llmgw plain", {}).get("c64", {}).get("rps")
    for name in names:
        r = res.get(name, {})
        cells = [name]
        c1, c64, tt, big = r.get("c1"), r.get("c64"), r.get("ttft"), r.get("big")
        if name == "direct":
            cells.append(f"({c1['p50_ms']:.2f} / {c1['p99_ms']:.2f} ms)" if c1 else "")
        else:
            cells.append(
                f"{_ms(c1['p50_ms'] - d['c1']['p50_ms'])} / {_ms(c1['p99_ms'] - d['c1']['p99_ms'])}"
                " ms"
                if c1
                else "not measured"
            )
        if c64:
            share = f" ({c64['rps'] / plain:.0%})" if plain and name != "direct" else ""
            cells.append(f"{c64['rps']:,.0f}{share} / {c64['p99_ms']:.1f} ms")
        else:
            cells.append("not measured")
        if tt and name == "direct":
            cells.append(f"({tt['ttft_p50_ms']:.2f} / {tt['ttft_p99_ms']:.2f} ms)")
        elif tt:
            cells.append(
                f"{_ms(tt['ttft_p50_ms'] - d['ttft']['ttft_p50_ms'])} / "
                f"{_ms(tt['ttft_p99_ms'] - d['ttft']['ttft_p99_ms'])} ms"
            )
        else:
            cells.append("not measured")
        cpu = (c64 or {}).get("cpu_ms_per_request")
        cells.append(f"{cpu:.3f} ms" if cpu else "")
        if big and name == "direct":
            cells.append(
                f"{big['rps']:,.0f} / ({big['ttft_p50_ms']:.1f} / {big['ttft_p99_ms']:.1f} ms)"
            )
        elif big:
            cells.append(
                f"{big['rps']:,.0f} / {_ms(big['ttft_p50_ms'] - d['big']['ttft_p50_ms'])} / "
                f"{_ms(big['ttft_p99_ms'] - d['big']['ttft_p99_ms'])} ms"
            )
        else:
            cells.append("not measured")
        rows.append("| " + " | ".join(cells) + " |")
    if "litellm" in res.get("skipped", {}):
        rows.append(f"| litellm | {res['skipped']['litellm']} | | | | |")
    gc = [
        f"{name} {int(g.get('count', 0))} ({1000 * g.get('sum', 0):.0f} ms in all)"
        for name, g in res.get("gc", {}).items()
    ]
    if gc:
        rows.append("")
        rows.append(
            "Full garbage collections in each web process over the run: " + "; ".join(gc) + "."
        )
    rows.append("")
    rows.append(goals(res))
    rows.append("")
    rows.append(
        f"Measured at `{commit}`, {time.strftime('%Y-%m-%d', time.gmtime())}, "
        f"load {res['load_min']:.1f}-{res['load_max']:.1f}, medians of {res['rounds']} "
        f"round(s), {res['duration']:g} s a point; direct in parentheses, the others "
        "added over it in the same round."
    )
    return "\n".join(rows)


def goals(res: dict) -> str:
    """Each of issue 53's goals that the run measured: met, or by how much not."""
    d, g, p = (res.get(n, {}) for n in ("direct", "llmgw governed", "llmgw plain"))
    out = []
    if "c1" in d and "c1" in g:
        c1p50 = g["c1"]["p50_ms"] - d["c1"]["p50_ms"]
        c1p99 = g["c1"]["p99_ms"] - d["c1"]["p99_ms"]
        ok = c1p50 <= GOAL_C1_P50_MS and c1p99 <= GOAL_C1_P99_MS
        out.append(
            f"governed c=1 added {c1p50:+.2f} / {c1p99:+.2f} ms against <= {GOAL_C1_P50_MS} / "
            f"{GOAL_C1_P99_MS}: " + ("met" if ok else "MISSED")
        )
    if "c64" in g and "c64" in p:
        share = g["c64"]["rps"] / p["c64"]["rps"]
        out.append(
            f"governed c=64 at {share:.0%} of plain against >= {GOAL_C64_SHARE:.0%}: "
            + ("met" if share >= GOAL_C64_SHARE else "MISSED")
        )
    if "ttft" in d and "ttft" in g:
        tt = g["ttft"]["ttft_p99_ms"] - d["ttft"]["ttft_p99_ms"]
        out.append(
            f"governed TTFT added p99 {tt:+.2f} ms against <= {GOAL_TTFT_P99_MS}: "
            + ("met" if tt <= GOAL_TTFT_P99_MS else "MISSED")
        )
    for name in ("llmgw governed", "llmgw governed, 2 workers"):
        big = res.get(name, {}).get("big")
        if big and "big" in d:
            added = big["ttft_p99_ms"] - d["big"]["ttft_p99_ms"]
            ok = big["rps"] >= GOAL_BIG_RPS and added <= GOAL_BIG_TTFT_MS
            out.append(
                f"{name}, 220 KB c={res['big_concurrency']}: {big['rps']:,.0f} req/s "
                f"(engine directly: {d['big']['rps']:,.0f}), TTFT added p99 {added:+.1f} ms, "
                f"against >= {GOAL_BIG_RPS:,} req/s and <= {GOAL_BIG_TTFT_MS:g} ms: "
                + ("met" if ok else "MISSED")
            )
    return "\n".join(f"- {o}" for o in out)


# ---- the run -------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--big-duration", type=float, default=8.0, help="seconds of the 220 KB run")
    p.add_argument("--big-concurrency", type=int, default=150)
    p.add_argument("--litellm-duration", type=float, default=10.0)
    p.add_argument("--litellm-venv", default=str(ROOT / "var" / "bench-litellm-venv"))
    p.add_argument("--no-litellm", action="store_true")
    p.add_argument("--no-workers", action="store_true", help="no 2-worker governed lane")
    p.add_argument(
        "--wait-load",
        type=float,
        metavar="L",
        help="before each round, wait (up to 10 min) until the 1-minute load average is below L",
    )
    p.add_argument(
        "--points", default="c1,c64,ttft,big", help="comma-separated: c1, c64, ttft, big"
    )
    p.add_argument(
        "--lanes", help="comma-separated lanes to measure besides direct, e.g. 'llmgw governed'"
    )
    p.add_argument(
        "--profile",
        nargs="?",
        const="llmgw governed",
        metavar="LANE",
        help="py-spy a lane (default the governed one) while --profile-points are measured",
    )
    p.add_argument("--profile-points", default="c1,c64", help="comma-separated, as --points")
    p.add_argument("--py-spy", help="the py-spy binary (default: on PATH)")
    p.add_argument("--compare-tree", metavar="DIR", help="also governed from another checkout")
    p.add_argument("--out", default=str(OUT / "gateway_boards"))
    p.add_argument("--setup-db", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.setup_db:
        setup_db(args.setup_db)
        return 0
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    points = args.points.split(",")
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-boards-"))
    procs = Procs(work)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"stopped by SIGTERM; logs: {work}"))
    env, redis = gateway_env(work, "boards")
    big = big_prompt()
    res: dict = {"big_concurrency": args.big_concurrency, "skipped": {}}
    loads: list[float] = []
    try:
        engine_port, engine = start_engine(procs, env, "engine", PLAIN_MODEL)
        plain_key, gov_key = run_setup(__file__, str(engine_port), env)[-2:]
        all_points = set(points)
        lanes = [Lane("direct", engine_port, plain_key, PLAIN_MODEL, engine.pid, all_points)]

        def gateway(name, extra_env, key, model, extra=(), only=None, tree=None):
            port, proc = start_gateway(procs, {**env, **extra_env}, "serve", extra, tree=tree)
            lanes.append(Lane(name, port, key, model, proc.pid, only or all_points))

        gateway("llmgw plain", PLAIN_ENV, plain_key, PLAIN_MODEL)
        gateway("llmgw governed", GOVERNED_ENV, gov_key, GOVERNED_MODEL)
        if args.compare_tree:
            tree = Path(args.compare_tree).resolve()
            gateway("llmgw governed (compared)", GOVERNED_ENV, gov_key, GOVERNED_MODEL, tree=tree)
        if not args.no_workers and "big" in points:
            gateway(
                "llmgw governed, 2 workers",
                GOVERNED_ENV,
                gov_key,
                GOVERNED_MODEL,
                ("--workers", "2"),
                {"big"},
            )
        if not args.no_litellm:
            why = None
            try:
                port, proc = start_litellm(
                    procs, env, engine_port, PLAIN_MODEL, Path(args.litellm_venv), work
                )
                version = subprocess.run(
                    [str(Path(args.litellm_venv) / "bin" / "python"), "-c",
                     "import importlib.metadata as m; print(m.version('litellm'))"],
                    capture_output=True, text=True,
                ).stdout.strip()  # fmt: skip
                lanes.append(
                    Lane(
                        f"litellm {version}".strip(),
                        port,
                        "sk-bench-master",
                        PLAIN_MODEL,
                        proc.pid,
                        all_points - {"big"},
                    )
                )
            except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
                why = f"not run: {exc}"
            if why:
                print(f"litellm: {why}")
                res["skipped"]["litellm"] = why
        if args.lanes:
            wanted = {"direct", *args.lanes.split(",")}
            for lane in lanes:
                if lane.name not in wanted:
                    lane.points = set()
        for lane in lanes:
            check_lane(lane, big)
        for round_no in range(args.rounds):
            if args.wait_load:
                wait_quiet(args.wait_load)
            for point in points:
                # The lanes' order turns each round: none is always first after a pause.
                turn = round_no % len(lanes)
                for lane in lanes[turn:] + lanes[:turn]:
                    if point not in lane.points:
                        continue
                    if engine.poll() is not None:
                        sys.exit(f"the engine exited with {engine.returncode}; see {work}")
                    r = measure(point, lane, args, work, big)
                    loads.append(r["load1"])
                    res.setdefault(lane.name, {}).setdefault(point, []).append(r)
                    print(
                        f"[{round_no + 1}/{args.rounds}] " + line(point, lane.name, r), flush=True
                    )
        res["gc"] = {
            lane.name: full_collections(lane.port)
            for lane in lanes
            if lane.name.startswith("llmgw") and lane.points
        }
        for by_point in res.values():
            if isinstance(by_point, dict):
                for point, runs in list(by_point.items()):
                    if isinstance(runs, list):
                        by_point[point] = _median(runs)
        if args.profile:
            gov = next(lane for lane in lanes if lane.name == args.profile)
            for point in args.profile_points.split(","):
                res[f"profile {point}"] = text = profile(gov, args, work, point, big)
                print(f"\n{args.profile}, {point}, py-spy:\n" + text)
    finally:
        procs.stop_all()
        if redis is not None:
            redis.stop()
    res["rounds"], res["duration"] = args.rounds, args.duration
    res["load_min"], res["load_max"] = (min(loads), max(loads)) if loads else (0, 0)
    at = commit()
    names = [lane.name for lane in lanes]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2))
    text = table(res, names, at)
    print("\n" + text)
    out.with_suffix(".md").write_text(text + "\n")
    print(f"\ntable: {out.with_suffix('.md')}; figures: {out.with_suffix('.json')}; logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
