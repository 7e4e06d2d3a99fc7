"""Gateway benchmark: the latency llmgw's gateway adds over the engine, beside LiteLLM's proxy.

    .venv/bin/python bench/gateway.py [--duration 5] [--concurrency 1,16,64] [--no-litellm]

Same machine, same run, same engine (``agentd.engines.fake``): an instant
answer (``max_tokens`` 1) and a 20-token stream, each at every concurrency,
measured with wrk directly against the engine and through llmgw's gateway as
each server arrangement serves it:

- ``llmgw (serve)``: the whole app on uvicorn, ``python -m llmgw_site.serve``,
  as `make run` and the production recipe run it (the default);
- ``llmgw (daphne)``: the whole app on Daphne (supported, the old default);
- ``llmgw (uvicorn)``: the gateway alone on uvicorn (``llmgw_site.gateway_asgi``);
- ``llmgw (serve, N workers)`` with ``--serve-workers N``: the same with N
  processes sharing the port (``--workers N``);
- ``llmgw (serve, compared)`` with ``--compare-tree DIR``: ``llmgw_site.serve`` from
  another checkout, for a before and after in one run;
- ``uvicorn floor (no llmgw)`` with ``--asgi-floor``: a trivial app on the same
  uvicorn (``bench/_asgi_floor.py``), what a request costs with no llmgw at all;
- ``llmgw (plain uvicorn)`` with ``--plain-uvicorn``: the whole app on uvicorn's
  pure-Python asyncio loop and h11 parser, to show what uvloop and httptools add;

and through LiteLLM's proxy (one process, a master key, no database) from its
own virtualenv (``--litellm-venv``; made with ``pip install 'litellm[proxy]'``).
Also compares upstream HTTP clients: the gateway's own (``fleet.gateway.upstream``),
aiohttp's and httpx's.

Every process shares the machine's cores with wrk and the engine, so the
figures are for this machine and meaningful side by side, not alone.
"""

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (  # noqa: E402
    ROOT,
    Procs,
    cpu_seconds,
    gateway_env,
    one_ready_replica,
    run_setup,
    setup_django,
    start_engine,
    start_gateway,
    start_litellm,
    wrk,
)

MODEL = "tiny"
PAYLOADS = {
    "instant": {
        "model": MODEL,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}],
    },
    "stream20": {
        "model": MODEL,
        "max_tokens": 20,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    },
}


# ---- llmgw's side: a database with one ready replica, and a key ---------------


def setup_db(engine_port: int) -> None:
    """Run in a subprocess with the bench's environment: migrate, then the fleet rows."""
    setup_django()
    from fleet.models import ApiKey, Engine

    one_ready_replica(MODEL, Engine.FAKE, engine_port)
    _, secret = ApiKey.issue(name="bench", scope="inference")
    # Limits on, set too high to refuse anything: what checking them costs a request
    # (one Redis round trip before the engine, one after for the tokens).
    _, limited = ApiKey.issue(
        name="bench-limited",
        scope="inference",
        requests_per_minute=2_000_000_000,
        tokens_per_minute=2_000_000_000,
        tokens_per_day=10**15,
        tokens_per_month=10**15,
    )
    print(secret)
    print(limited)


# ---- load ----------------------------------------------------------------------


def settle(pgid: int, timeout: float = 90) -> None:
    """Wait until a proxy has finished what the last run left it.

    A server that does not cancel the requests wrk abandoned at the end of a run
    would spend the next run's time on them.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pgid)
        time.sleep(0.5)
        if cpu_seconds(pgid) - before < 0.05:
            return


def wait_quiet(below: float, limit_s: float = 600) -> None:
    """Wait until the machine's 1-minute load average is under ``below`` (neighbours quiet)."""
    deadline, said = time.monotonic() + limit_s, 0.0
    while os.getloadavg()[0] >= below and time.monotonic() < deadline:
        if time.monotonic() - said > 60:
            print(f"  waiting for load < {below:g} (now {os.getloadavg()[0]:.1f})", flush=True)
            said = time.monotonic()
        time.sleep(2)


def check_answer(url: str, key: str) -> None:
    """One request of each kind, checked, so no figure is the speed of an error."""
    import urllib.request

    for name, payload in PAYLOADS.items():
        req = urllib.request.Request(
            url,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        if name == "stream20":
            assert body.count(b"data: ") >= 21 and body.rstrip().endswith(b"[DONE]"), body[:300]
        else:
            assert json.loads(body)["choices"], body[:300]


# ---- the upstream client choice ---------------------------------------------------


async def _client_rate(kind: str, url: str, payload: dict, n: int, conc: int) -> float:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if kind == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def one():
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()

        close = session.close
    elif kind == "llmgw":
        from urllib.parse import urlsplit

        from fleet.gateway.upstream import Client

        parts = urlsplit(url)
        head = (
            f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        llmgw = Client(5.0)

        async def one():
            resp = await llmgw.post(parts.hostname, parts.port, head, body)
            await resp.read()
            resp.release()

        async def close():
            llmgw.close()
    else:
        import httpx

        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=None))

        async def one():
            resp = await client.post(url, content=body, headers=headers)
            await resp.aread()

        close = client.aclose

    async def worker(count):
        for _ in range(count):
            await one()

    await asyncio.gather(*(worker(20) for _ in range(conc)))  # warm the pool
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(n // conc) for _ in range(conc)))
    rate = (n // conc * conc) / (time.perf_counter() - t0)
    await close()
    return rate


def compare_clients(url: str) -> dict:
    results = {}
    kinds = ["llmgw", "aiohttp"]
    if importlib.util.find_spec("httpx") is None:
        # Not one of llmgw's requirements: only this comparison uses it.
        print("httpx is not installed (pip install httpx): comparing llmgw's client and aiohttp")
    else:
        kinds.append("httpx")
    for kind in kinds:
        for conc in (1, 16):
            results[f"{kind} c={conc}"] = asyncio.run(
                _client_rate(kind, url, PAYLOADS["instant"], 1000, conc)
            )
    return results


# ---- the run -------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument(
        "--litellm-duration",
        type=float,
        default=15.0,
        help="seconds per LiteLLM measurement: at a few requests a second, 5 s is too few",
    )
    p.add_argument("--litellm-venv", default=str(ROOT / "var" / "bench-litellm-venv"))
    p.add_argument("--no-litellm", action="store_true")
    p.add_argument("--no-uvicorn", action="store_true", help="skip the gateway-only uvicorn")
    p.add_argument(
        "--serve-workers",
        type=int,
        default=0,
        metavar="N",
        help="also llmgw_site.serve with N worker processes",
    )
    p.add_argument(
        "--plain-uvicorn",
        action="store_true",
        help="also the whole app on uvicorn with asyncio and h11 (no uvloop, no httptools)",
    )
    p.add_argument(
        "--asgi-floor",
        action="store_true",
        help="also a trivial app on the same uvicorn (bench/_asgi_floor.py): a request's CPU "
        "with no llmgw at all",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "gateway.json"))
    p.add_argument(
        "--only", help="semicolon-separated targets to measure, e.g. 'direct;llmgw (serve)'"
    )
    p.add_argument(
        "--wait-load",
        type=float,
        metavar="L",
        help="before each round, wait (up to 10 min) until the 1-minute load average is below L",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every point this many times, the targets interleaved; report medians",
    )
    p.add_argument(
        "--compare-tree",
        metavar="DIR",
        help="also llmgw_site.serve from another checkout (e.g. the commit before a change, "
        "from git worktree add or git archive): 'llmgw (serve, compared)', same database",
    )
    p.add_argument("--setup-db", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.setup_db:
        setup_db(args.setup_db)
        return 0
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    concs = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="llmgw-bench-gw-"))
    procs = Procs(work)
    # A plain kill stops every process the bench started too (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"stopped by SIGTERM; logs: {work}"))
    env, redis = gateway_env(work, "gw")
    results: dict = {"targets": {}, "machine": {"cpus": os.cpu_count()}}
    try:
        engine_port, engine = start_engine(procs, env, "engine", MODEL)
        key, limited = run_setup(__file__, str(engine_port), env)[-2:]
        targets = {"direct": (f"http://127.0.0.1:{engine_port}", key, engine.pid)}

        only = args.only.split(";") if args.only else None

        def add(name: str, server: str, extra=(), limits: bool = False, tree=None) -> None:
            if only and name not in only and f"{name} limits" not in only:
                return  # not measured: not started, so not a neighbour either
            port, proc = start_gateway(procs, env, server, extra, tree=tree)
            targets[name] = (f"http://127.0.0.1:{port}", key, proc.pid)
            if limits:
                targets[f"{name} limits"] = (f"http://127.0.0.1:{port}", limited, proc.pid)

        add("llmgw (serve)", "serve", limits=True)
        if args.compare_tree:
            add(
                "llmgw (serve, compared)",
                "serve",
                limits=True,
                tree=Path(args.compare_tree).resolve(),
            )
        if args.serve_workers:
            workers = args.serve_workers
            add(f"llmgw (serve, {workers} workers)", "serve", ("--workers", str(workers)))
        if args.plain_uvicorn:
            add("llmgw (plain uvicorn)", "plain-uvicorn")
        if args.asgi_floor:
            add("uvicorn floor (no llmgw)", "asgi-floor")
        add("llmgw (daphne)", "daphne", limits=True)
        if not args.no_uvicorn:
            add("llmgw (uvicorn)", "gateway-only", limits=True)
        if not args.no_litellm:
            try:
                port, proc = start_litellm(
                    procs, env, engine_port, MODEL, Path(args.litellm_venv), work
                )
            except FileNotFoundError as exc:
                sys.exit(str(exc))
            targets["litellm"] = (f"http://127.0.0.1:{port}", "sk-bench-master", proc.pid)

        for base, k, _ in targets.values():
            check_answer(base + "/v1/chat/completions", k)
        results["clients"] = compare_clients(f"http://127.0.0.1:{engine_port}/v1/chat/completions")
        chosen = {
            name: target
            for name, target in targets.items()
            if not args.only or name in args.only.split(";")
        }
        if args.rounds == 1:
            order = [(n, p, c) for n in chosen for p in PAYLOADS for c in concs]
        else:
            # Each point measured for every target back to back, in rounds: on a
            # shared machine, neighbours' load then falls on all targets alike.
            order = [(n, p, c) for p in PAYLOADS for c in concs for n in chosen]
        runs: dict = {}
        for round_no in range(args.rounds):
            if args.wait_load:
                wait_quiet(args.wait_load)
            for name, payload, conc in order:
                base, k, pgid = chosen[name]
                if engine.poll() is not None:
                    sys.exit(f"the engine exited with {engine.returncode}; see {work}")
                url = base + "/v1/chat/completions"
                wrk(url, PAYLOADS[payload], k, conc, 1, work)  # warm-up
                settle(pgid)
                duration = args.litellm_duration if name == "litellm" else args.duration
                r = wrk(url, PAYLOADS[payload], k, conc, duration, work, pgid)
                settle(pgid)
                runs.setdefault(name, {}).setdefault(payload, {}).setdefault(conc, []).append(r)
                print(
                    (f"[{round_no + 1}/{args.rounds}] " if args.rounds > 1 else "")
                    + f"{name:22} {payload:9} c={conc:<3} p50 {r['p50_ms']:7.2f} ms  "
                    f"p99 {r['p99_ms']:7.2f} ms  {r['rps']:8.0f} req/s  "
                    + (
                        f"cpu {r['cpu_ms_per_request']:6.2f} ms/req  "
                        if r["cpu_ms_per_request"] is not None
                        else ""
                    )
                    + f"load {r['load1']:.1f}"
                    + (f"  non-2xx {r['non_2xx']}" if r["non_2xx"] else "")
                    + (f"  socket errors {r['socket_errors']}" if r["socket_errors"] else ""),
                    flush=True,
                )
        for name, by_payload in runs.items():
            for payload, by_conc in by_payload.items():
                for conc, rs in by_conc.items():
                    results["targets"].setdefault(name, {}).setdefault(payload, {})[conc] = _median(
                        rs
                    )
        if args.rounds > 1:
            results["rounds"] = runs
    finally:
        procs.stop_all()
        if redis is not None:
            redis.stop()
    report(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nfigures: {args.out}; logs: {work}")
    return 0


def _median(runs: list[dict]) -> dict:
    """Each figure's median over the rounds (the load: the highest; errors: all of them)."""
    out = {}
    for field in runs[0]:
        values = [r[field] for r in runs if isinstance(r[field], (int, float))]
        if field == "load1":
            out[field] = max(values)
        elif field == "non_2xx":
            out[field] = sum(values)
        elif field == "socket_errors":
            out[field] = "; ".join(r[field] for r in runs if r[field])
        elif len(values) == len(runs):
            out[field] = statistics.median(values)
        else:
            out[field] = runs[-1][field]
    return out


def report(results: dict) -> None:
    t = results["targets"]
    direct = t["direct"]
    print("\nadded over direct (ms, p50 / p99) and highest req/s:")
    for name, by_payload in t.items():
        if name == "direct":
            continue
        for payload, by_conc in by_payload.items():
            cells = []
            for conc, r in by_conc.items():
                d = direct[payload][conc]
                cells.append(
                    f"c={conc}: +{r['p50_ms'] - d['p50_ms']:.2f}/+{r['p99_ms'] - d['p99_ms']:.2f}"
                )
            best = max(r["rps"] for r in by_conc.values())
            cpu = [r["cpu_ms_per_request"] for r in by_conc.values() if r["cpu_ms_per_request"]]
            print(
                f"  {name:22} {payload:9} {'  '.join(cells)}  max {best:.0f} req/s"
                + (f"  cpu {min(cpu):.2f} ms/req" if cpu else "")
            )
    print(
        "\nissue 15's targets: added at c=1 <= 0.5 ms p50 and <= 5 ms p99; "
        "at c=64 at least half the engine's direct rate:"
    )
    for name, by_payload in t.items():
        if name == "direct":
            continue
        for payload, by_conc in by_payload.items():
            cells = []
            if 1 in by_conc:
                r, d = by_conc[1], direct[payload][1]
                p50, p99 = r["p50_ms"] - d["p50_ms"], r["p99_ms"] - d["p99_ms"]
                ok = "met" if p50 <= 0.5 and p99 <= 5 else "MISSED"
                cells.append(f"c=1 +{p50:.2f}/+{p99:.2f} ms {ok}")
            if 64 in by_conc:
                share = by_conc[64]["rps"] / direct[payload][64]["rps"]
                ok = "met" if share >= 0.5 else "MISSED"
                cells.append(
                    f"c=64 {by_conc[64]['rps']:.0f} of {direct[payload][64]['rps']:.0f} req/s "
                    f"({share:.0%}) {ok}"
                )
            print(f"  {name:22} {payload:9} " + "  ".join(cells))
    print("\nlimits on minus off, same gateway process, same run (ms, p50 / p99):")
    for name, by_payload in t.items():
        off = t.get(name.removesuffix(" limits")) if name.endswith(" limits") else None
        if off is None:
            continue
        for payload, by_conc in by_payload.items():
            cells = [
                f"c={conc}: {r['p50_ms'] - off[payload][conc]['p50_ms']:+.2f}"
                f"/{r['p99_ms'] - off[payload][conc]['p99_ms']:+.2f}"
                for conc, r in by_conc.items()
                if conc in off.get(payload, {})
            ]
            print(f"  {name.removesuffix(' limits'):16} {payload:9} {'  '.join(cells)}")
    if "clients" in results:
        print("\nupstream client, direct to the engine (req/s):")
        for name, rate in results["clients"].items():
            print(f"  {name:14} {rate:8.0f}")


if __name__ == "__main__":
    sys.exit(main())
