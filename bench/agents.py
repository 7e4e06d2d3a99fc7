"""How many agents one Daphne process holds: enrol, register, then heartbeat every 10 s.

Each simulated agent is a real WebSocket client on loopback. It enrols with a
join token, registers a realistic 8-GPU node and sends realistic heartbeats on
a staggered schedule; the control plane acks a heartbeat only after the batched
write that holds it has committed, so send -> ack is the whole path. Beside
each heartbeat every agent times a WebSocket ping half an interval later:
Daphne answers pings in its reactor without touching the app or the database,
so the ping round trip is the baseline of this machine and this load (event
loop lag on both ends plus the noise of a shared box), measured at the same
time on the same sockets.

    .venv/bin/python bench/agents.py --agents 100,1000 --db postgres
    .venv/bin/python bench/agents.py --agents 1000,2000,5000 --clients 2

Every level gets a fresh database (copied from a migrated template) and a fresh
Daphne; it stops by itself after --intervals heartbeat intervals have been
measured with every agent registered. Loopback only.
"""

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._agent_sim import worker_main  # noqa: E402
from bench._common import (  # noqa: E402
    OUT,
    PY,
    ROOT,
    CpuWindow,
    DbProbe,
    ScratchDatabases,
    machine,
    percentile,
    raise_nofile,
    start_daphne,
)

# ---- the orchestrator ---------------------------------------------------------


def make_token(uses: int) -> None:
    """Run inside a subprocess whose DATABASE_URL names the level's database."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django

    django.setup()
    from datetime import timedelta

    from fleet.services.access import create_join_token

    _, secret = create_join_token("bench", ttl=timedelta(hours=2), max_uses=uses)
    print(secret)


def _ms(s: float) -> float:
    return round(s * 1000, 1)


def run_level(args, dbs: ScratchDatabases, n: int, workdir: Path) -> dict:
    label = f"{dbs.kind}-n{n}"
    db_url = dbs.fresh(f"n{n}")
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_URL": args.redis_url,
        "LLMGW_CHANNEL_PREFIX": f"llmgw-bench-{os.getpid()}-{label}",
        "LLMGW_STATE_DIR": str(workdir / "state"),
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": args.log_level,
    }
    env.update(dict(kv.split("=", 1) for kv in args.server_env))
    secret = subprocess.run(
        [PY, __file__, "--make-token", str(n)],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    daphne = start_daphne(env, workdir / f"daphne-{label}.log")
    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    try:
        ids = list(range(n))
        for k in range(args.clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=worker_main,
                args=(
                    child,
                    daphne.ws_url,
                    secret,
                    ids[k :: args.clients],
                    args.interval,
                    args.enrol_concurrency,
                    args.enrol_timeout,
                ),
                daemon=True,
            )
            p.start()
            procs.append(p)
            pipes.append(parent)
        t_start = time.monotonic()
        registered = 0
        # Bounded, but generous: a busy shared machine enrols slowly.
        deadline = t_start + args.enrol_timeout + n / 2
        for pipe in pipes:
            if not pipe.poll(max(1.0, deadline - time.monotonic())):
                raise RuntimeError(f"{label}: agents did not finish enrolling in time")
            registered += pipe.recv()[1]
        enrol_wall = time.monotonic() - t_start
        print(
            f"[{label}] {registered}/{n} agents registered in {enrol_wall:.1f} s; "
            f"measuring {args.intervals} x {args.interval:g} s",
            flush=True,
        )
        # One interval of warm-up: by then every agent has started its staggered beat.
        t0 = time.time() + args.interval
        t1 = t0 + args.intervals * args.interval
        drain = max(5.0, args.interval)
        for pipe in pipes:
            pipe.send((t0, t1, drain))
        time.sleep(max(0.0, t0 - time.time()))
        server = CpuWindow([psutil.Process(daphne.proc.pid)])
        clients = CpuWindow([psutil.Process(p.pid) for p in procs])
        busy0 = psutil.cpu_times()
        probe = DbProbe(db_url)
        server.begin()
        clients.begin()
        next_sample = time.monotonic() + 1
        while time.time() < t1:
            time.sleep(min(0.1, max(0.0, t1 - time.time())))
            probe.once()
            if time.monotonic() >= next_sample:
                server.sample()
                next_sample += 1
        probe.close()
        server_cpu, server_rss = server.end()
        client_cpu, _ = clients.end()
        busy1 = psutil.cpu_times()
        total = sum(busy1) - sum(busy0)
        idle = (busy1.idle + busy1.iowait) - (busy0.idle + busy0.iowait)
        machine_cpu = 100.0 * psutil.cpu_count() * (1 - idle / total) if total > 0 else 0.0
        merged = {
            "enrol_s": [],
            "hb_rtt_s": [],
            "ping_rtt_s": [],
            "lag_s": [],
            "gc_pauses_s": [],
            "enrol_failed": {},
        }
        counts = {"hb_sent": 0, "hb_lost": 0, "closed_early": 0, "enrol_retries": 0}
        for pipe in pipes:
            if not pipe.poll(drain + 60):
                raise RuntimeError(f"{label}: a client process did not report")
            res = pipe.recv()[1]
            for key in ("enrol_s", "hb_rtt_s", "ping_rtt_s", "lag_s", "gc_pauses_s"):
                merged[key] += res[key]
            for kind, c in res["enrol_failed"].items():
                merged["enrol_failed"][kind] = merged["enrol_failed"].get(kind, 0) + c
            for key in counts:
                counts[key] += res[key]
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        daphne.stop()
        if not args.keep:
            dbs.drop(db_url)
    log = daphne.log.read_text(errors="replace")
    hb, ping, enrol = merged["hb_rtt_s"], merged["ping_rtt_s"], merged["enrol_s"]
    row = {
        "db": dbs.kind,
        "agents": n,
        "registered": registered,
        "enrol_failed": merged["enrol_failed"],
        "enrol_wall_s": round(enrol_wall, 1),
        "enrol_retries": counts["enrol_retries"],
        "enrol_p50_ms": _ms(percentile(enrol, 50)),
        "enrol_p99_ms": _ms(percentile(enrol, 99)),
        "window_s": args.intervals * args.interval,
        "hb_sent": counts["hb_sent"],
        "hb_acked": len(hb),
        "hb_lost": counts["hb_lost"],
        "closed_early": counts["closed_early"],
        "hb_p50_ms": _ms(percentile(hb, 50)),
        "hb_p99_ms": _ms(percentile(hb, 99)),
        "hb_max_ms": _ms(max(hb) if hb else float("nan")),
        "ping_p50_ms": _ms(percentile(ping, 50)),
        "ping_p99_ms": _ms(percentile(ping, 99)),
        "client_lag_p99_ms": _ms(percentile(merged["lag_s"], 99)),
        "client_lag_max_ms": _ms(max(merged["lag_s"], default=float("nan"))),
        "client_full_gcs": len(merged["gc_pauses_s"]),
        "db_p50_ms": _ms(percentile(probe.rtt, 50)),
        "db_p99_ms": _ms(percentile(probe.rtt, 99)),
        "server_cpu_pct": round(server_cpu, 1),
        "server_rss_mib": round(server_rss / 2**20),
        "clients_cpu_pct": round(client_cpu, 1),
        "machine_cpu_pct": round(machine_cpu, 1),
        "server_errors": log.count("Traceback") + log.count(" ERROR "),
    }
    print(json.dumps(row), flush=True)
    return row


TABLE_HEAD = (
    "| db | agents | enrol+register p50 / p99 (all in) | heartbeat RTT p50 / p99 (max) "
    "| ping RTT p50 / p99 | DB SELECT 1 p50 / p99 | Daphne CPU / RSS | clients CPU "
    "| machine CPU | lost |\n"
    "| --- | ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: |"
)


def table_row(r: dict) -> str:
    return (
        f"| {r['db']} | {r['agents']:,} "
        f"| {r['enrol_p50_ms']:g} / {r['enrol_p99_ms']:g} ms ({r['enrol_wall_s']:g} s) "
        f"| {r['hb_p50_ms']:g} / {r['hb_p99_ms']:g} ms ({r['hb_max_ms']:g}) "
        f"| {r['ping_p50_ms']:g} / {r['ping_p99_ms']:g} ms "
        f"| {r['db_p50_ms']:g} / {r['db_p99_ms']:g} ms "
        f"| {r['server_cpu_pct']:g} % / {r['server_rss_mib']} MiB "
        f"| {r['clients_cpu_pct']:g} % | {r['machine_cpu_pct']:g} % "
        f"| {r['hb_lost'] + r['closed_early']} |"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", default="100,1000", help="levels, comma-separated")
    p.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--interval", type=float, default=10.0, help="heartbeat interval, s")
    p.add_argument("--intervals", type=int, default=3, help="intervals measured per level")
    p.add_argument("--clients", type=int, default=1, help="client processes")
    p.add_argument(
        "--enrol-concurrency", type=int, default=8, help="enrolments in flight per client process"
    )
    p.add_argument("--enrol-timeout", type=float, default=120.0)
    p.add_argument(
        "--server-env", action="append", default=[], help="KEY=VALUE for Daphne (repeatable)"
    )
    p.add_argument("--log-level", default="INFO", help="the control plane's LOG_LEVEL")
    p.add_argument("--keep", action="store_true", help="keep each level's database")
    p.add_argument("--make-token", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.make_token:
        make_token(args.make_token)
        return 0
    if args.intervals < 3:
        p.error("--intervals must be at least 3: fewer is not a steady state")
    levels = [int(x) for x in args.agents.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        p.error("--agents takes positive counts, e.g. 100,1000")
    nofile = raise_nofile()
    if nofile < max(levels) + 256:
        p.error(f"open-file limit is {nofile}; {max(levels)} agents need more")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    workdir = OUT / f"agents-{stamp}"
    (workdir / "state").mkdir(parents=True, exist_ok=True)
    dbs = ScratchDatabases(args.db, pg_url=args.pg_url, name="llmgw_bench", workdir=workdir)
    print(f"machine: {machine()}; open-file limit {nofile}; output in {workdir}", flush=True)
    dbs.prepare_template(workdir / "migrate.log")
    rows = []
    try:
        for n in levels:
            rows.append(run_level(args, dbs, n, workdir))
    finally:
        dbs.drop_template()
        (workdir / "results.json").write_text(
            json.dumps({"machine": machine(), "args": vars(args), "rows": rows}, indent=2)
        )
    print()
    print(TABLE_HEAD)
    for r in rows:
        print(table_row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
