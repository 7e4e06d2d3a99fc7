"""How many agents one web process holds: enrol, register, heartbeat every 10 s, restart.

Each simulated agent is a real WebSocket client on loopback. It enrols with a
join token, registers a realistic 8-GPU node and sends realistic heartbeats on
a staggered schedule; the control plane acks a heartbeat only after the batched
write that holds it has committed, so send -> ack is the whole path. Beside
each heartbeat every agent times a WebSocket ping half an interval later: the
web server answers pings itself without touching the app or the database, so
the ping round trip is the baseline of this machine and this load (event loop
lag on both ends plus the noise of a shared box), measured at the same time on
the same sockets.

    .venv/bin/python bench/agents.py --agents 100,1000 --db postgres
    .venv/bin/python bench/agents.py --agents 5000 --clients 2 --server serve,daphne
    .venv/bin/python bench/agents.py --agents 5000 --clients 2 --replicas 500 --restart

The control plane is a web process (``--server``: ``serve``, as `make run` and
production run it, the default; Daphne; or uvicorn's own command line), a Celery
worker and beat (``--web-only`` leaves those out). With ``--replicas K`` a model
of K one-node replicas is applied once every agent has registered and the
reconciler places it; the simulated agents run what their desired set says.
With ``--restart`` the whole control plane is stopped (SIGTERM) and started
again after the measured window, under the connected agents, which reconnect
with agentd's backoff: measured is the time until every node has registered
again, and whether any node went suspect or lost or any replica was replaced.

Every level gets a fresh database (copied from a migrated template) and a fresh
control plane; it stops by itself. Loopback only.
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
    SERVERS,
    CpuWindow,
    DbProbe,
    ScratchDatabases,
    machine,
    percentile,
    raise_nofile,
    start_celery,
    start_web,
)

# ---- the orchestrator ---------------------------------------------------------

CATALOG = """
models:
  - name: bench-model
    replicas: {replicas}
    placement_policy: spread
    profiles:
      - name: h100
        engine: vllm
        model_path: org/bench-model
        gpus_per_node: 8
        tp: 8
"""


def django_cmd(kind: str, value: int) -> None:
    """Run inside a subprocess whose DATABASE_URL names the level's database."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    import django

    django.setup()
    from datetime import timedelta

    if kind == "token":
        from fleet.services.access import create_join_token

        _, secret = create_join_token("bench", ttl=timedelta(hours=4), max_uses=value)
        print(secret)
    elif kind == "seed":
        seed_fleet(value)
    elif kind == "catalog":
        from fleet.services import catalog

        catalog.apply(CATALOG.format(replicas=value))


def seed_fleet(n: int) -> None:
    """``n`` nodes enrolled and registered as the simulated agents register them, in bulk,
    each with a credential: printed one per line, in node order."""
    import json as _json

    from django.utils import timezone

    from agentd import protocol
    from bench._agent_sim import register_msg
    from fleet.models import (
        GPU,
        EngineInstall,
        FabricAttachment,
        LocalWeights,
        Node,
        NodeCredential,
        Storage,
    )
    from fleet.models.access import hash_secret, make_secret
    from fleet.services import inventory

    now = timezone.now()
    regs = [protocol.parse_agent_message(_json.dumps(register_msg(i))) for i in range(n)]
    Node.objects.bulk_create(
        [
            Node(
                id=r.node_id,
                hostname=r.hostname,
                mgmt_addr=r.mgmt_addr,
                agent_labels=r.labels,
                agent_version=r.agent_version,
                engine_versions=r.engine_versions,
                memory_total_mb=r.memory_total_mb,
                state="ready",
                connected=False,
                last_seen=now,
                registered_at=now,
                inventory_digest=inventory.inventory_digest(r),
            )
            for r in regs
        ],
        batch_size=1000,
    )
    for model, rows in (
        (GPU, lambda r: [GPU(node_id=r.node_id, **g.model_dump()) for g in r.gpus]),
        (
            FabricAttachment,
            lambda r: [FabricAttachment(node_id=r.node_id, **f.model_dump()) for f in r.fabrics],
        ),
        (Storage, lambda r: [Storage(node_id=r.node_id, **x.model_dump()) for x in r.storage]),
        (
            LocalWeights,
            lambda r: [
                LocalWeights(
                    node_id=r.node_id, path=w.path, size_bytes=w.size_bytes, shared=w.shared
                )
                for w in r.weights
            ],
        ),
        (
            EngineInstall,
            lambda r: [EngineInstall(node_id=r.node_id, **e.model_dump()) for e in r.provision],
        ),
    ):
        model.objects.bulk_create([x for r in regs for x in rows(r)], batch_size=5000)
    secrets = []
    creds = []
    for r in regs:
        secret, prefix = make_secret(NodeCredential.KIND)
        secrets.append(secret)
        creds.append(
            NodeCredential(node_id=r.node_id, prefix=prefix, secret_hash=hash_secret(secret))
        )
    NodeCredential.objects.bulk_create(creds, batch_size=5000)
    print("\n".join(secrets))


def _ms(s: float) -> float:
    return round(s * 1000, 1)


class Db:
    """The level's database, read by plain SQL from the orchestrator (no Django here)."""

    def __init__(self, url: str):
        self.sqlite = url.startswith("sqlite:///")
        if self.sqlite:
            import sqlite3

            self.conn = sqlite3.connect(url[len("sqlite:///") :], timeout=30)
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)

    def rows(self, sql: str, *params) -> list[tuple]:
        if self.sqlite:
            sql = sql.replace("%s", "?")
            params = tuple(
                p.strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(p, datetime) else p for p in params
            )
        return self.conn.execute(sql, params).fetchall()

    def one(self, sql: str, *params):
        r = self.rows(sql, *params)
        return r[0][0] if r else None

    def states(self) -> dict[str, int]:
        return dict(self.rows("SELECT state, count(*) FROM fleet_node GROUP BY state"))

    def passes(self) -> int:
        return self.one("SELECT passes FROM fleet_fleetstatus WHERE id = 1") or 0

    def shards(self) -> tuple[set, int]:
        ids = {r[0] for r in self.rows("SELECT id FROM fleet_shard")}
        return ids, self.one("SELECT coalesce(sum(restarts), 0) FROM fleet_replica") or 0

    def load(self) -> dict[str, float]:
        """The database's own counters (PostgreSQL): transactions and rows so far."""
        if self.sqlite:
            return {}
        row = self.rows(
            "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, tup_returned "
            "FROM pg_stat_database WHERE datname = current_database()"
        )[0]
        return dict(zip(("commits", "inserted", "updated", "deleted", "read"), row, strict=True))

    def close(self) -> None:
        self.conn.close()


def redis_commands(url: str) -> int:
    """Commands the Redis server has processed so far (all its clients, not only ours)."""
    import redis

    return int(redis.Redis.from_url(url).info("stats")["total_commands_processed"])


class ControlPlane:
    """The web process, and unless --web-only a Celery worker and beat, on one port."""

    def __init__(self, args, env: dict, workdir: Path, label: str, server: str):
        self.args, self.env, self.workdir, self.label = args, env, workdir, label
        self.server = server
        self.port = None
        self.web = None
        self.celery: list[subprocess.Popen] = []

    def start(self) -> float:
        """Start everything; returns the wall clock at which the web process listened."""
        if not self.args.web_only:
            log = self.workdir / f"celery-{self.label}.log"
            self.celery = [
                start_celery(
                    self.env,
                    log,
                    ["worker", "--concurrency", "1", "--without-gossip", "--without-mingle"],
                ),
                start_celery(
                    self.env, log, ["beat", "-s", str(self.workdir / f"beat-{self.label}")]
                ),
            ]
        self.web = start_web(
            self.server, self.env, self.workdir / f"web-{self.label}.log", port=self.port
        )
        self.port = self.web.port
        return time.time()

    def pids(self) -> list[int]:
        return [self.web.proc.pid, *(p.pid for p in self.celery)]

    def stop(self, timeout: float = 15) -> float:
        """SIGTERM to every process at once, SIGKILL after ``timeout``; returns seconds."""
        t = time.monotonic()
        procs = [*([self.web.proc] if self.web else []), *self.celery]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(max(0.1, timeout - (time.monotonic() - t)))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.celery = []
        return time.monotonic() - t

    def errors(self) -> int:
        n = 0
        for log in self.workdir.glob(f"*-{self.label}.log"):
            text = log.read_text(errors="replace")
            n += text.count("Traceback") + text.count(" ERROR ")
        return n


PY_SPY = str(Path(PY).parent / "py-spy") if (Path(PY).parent / "py-spy").exists() else "py-spy"


class Profile:
    """py-spy sampling the web process during one phase (--profile): collapsed stacks in
    ``<phase>-<label>.txt``, one line per stack with its sample count."""

    def __init__(self, args, workdir: Path, label: str):
        self.on = args.profile
        self.workdir, self.label = workdir, label
        self.proc: subprocess.Popen | None = None

    def start(self, phase: str, pid: int) -> None:
        if not self.on:
            return
        self.stop()
        out = self.workdir / f"profile-{phase}-{self.label}.txt"
        self.proc = subprocess.Popen(
            [PY_SPY, "record", "--format", "raw", "--rate", "50", "--threads"]
            + ["--nonblocking", "-p", str(pid), "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: py-spy writes what it has and exits
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def wait_for(what: str, check, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def restart_phase(args, cp: ControlPlane, db: Db, n: int, profile: Profile) -> dict:
    """Stop the whole control plane under the connected agents, start it again, and
    watch the nodes come back; returns the figures."""
    shards_before, restarts_before = db.shards()
    t_stop = time.time()
    since = datetime.fromtimestamp(t_stop, UTC)
    stop_s = cp.stop()
    if args.down > 0:
        time.sleep(args.down)
    t_up = cp.start()
    profile.start("restart", cp.web.proc.pid)
    states_seen: dict[str, int] = {}

    def look() -> int:
        for state, count in db.states().items():
            states_seen[state] = max(states_seen.get(state, 0), count)
        return db.one("SELECT count(*) FROM fleet_node WHERE registered_at >= %s", since)

    curve = {}
    deadline = time.monotonic() + args.restart_timeout
    back = 0
    while time.monotonic() < deadline:
        back = look()
        for frac in (0.5, 0.9, 0.99, 1.0):
            if frac not in curve and back >= frac * n:
                curve[frac] = time.time() - t_up
        if back >= n:
            break
        time.sleep(0.5)
    profile.stop()
    # A few more passes of the reconciler (each expires nodes and places) while watching.
    if not args.web_only:
        p0 = db.passes()
        try:
            wait_for("three reconciler passes", lambda: db.passes() >= p0 + 3 or look() < 0, 60)
        except RuntimeError:
            pass
    look()
    shards_after, restarts_after = db.shards()
    return {
        "stop_s": round(stop_s, 1),
        "down_s": round(t_up - t_stop, 1),
        "back": back,
        "back_50_s": round(curve.get(0.5, float("nan")), 1),
        "back_90_s": round(curve.get(0.9, float("nan")), 1),
        "back_99_s": round(curve.get(0.99, float("nan")), 1),
        "back_all_s": round(curve.get(1.0, float("nan")), 1),
        "max_suspect": states_seen.get("suspect", 0),
        "max_lost": states_seen.get("lost", 0),
        "shards_replaced": len(shards_after - shards_before),
        "shards_gone": len(shards_before - shards_after),
        "restarts": restarts_after - restarts_before,
    }


def run_level(args, dbs: ScratchDatabases, n: int, server: str, workdir: Path) -> dict:
    label = f"{dbs.kind}-{server}-n{n}"
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

    def django(kind: str, value: int) -> str:
        out = subprocess.run(
            [PY, __file__, "--django", kind, str(value)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if out.returncode:
            raise RuntimeError(f"{label}: --django {kind} failed:\n{out.stderr[-3000:]}")
        return out.stdout.strip()

    credentials = None
    if args.seed:
        # Enrolled already (in bulk): the agents connect with their own credentials.
        credentials = django("seed", n).splitlines()[-n:]
        secret = ""
    else:
        # The last line: the settings' logging may say something first.
        secret = django("token", n).splitlines()[-1]
    cp = ControlPlane(args, env, workdir, label, server)
    cp.start()
    profile = Profile(args, workdir, label)
    profile.start("enrol", cp.web.proc.pid)
    db = Db(db_url)
    ctx = mp.get_context("spawn")
    procs, pipes = [], []
    restart = {}
    try:
        ids = list(range(n))
        for k in range(args.clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=worker_main,
                args=(
                    child,
                    cp.web.ws_url,
                    secret,
                    ids[k :: args.clients],
                    args.interval,
                    args.enrol_concurrency,
                    args.enrol_timeout,
                    credentials[k :: args.clients] if credentials else None,
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
        profile.stop()
        print(f"[{label}] {registered}/{n} agents registered in {enrol_wall:.1f} s", flush=True)
        if not registered:
            raise RuntimeError(f"{label}: no agent registered; see {cp.web.log}")
        placed_s = None
        if args.replicas:
            t = time.monotonic()
            django("catalog", args.replicas)
            wait_for(
                f"{args.replicas} shards ready",
                lambda: (
                    db.one("SELECT count(*) FROM fleet_shard WHERE state = 'ready'")
                    >= args.replicas
                ),
                timeout=300,
            )
            placed_s = time.monotonic() - t
            print(f"[{label}] {args.replicas} replicas placed and ready in {placed_s:.1f} s")
        print(f"[{label}] measuring {args.intervals} x {args.interval:g} s", flush=True)
        # One interval of warm-up: by then every agent has started its staggered beat.
        t0 = time.time() + args.interval
        t1 = t0 + args.intervals * args.interval
        drain = max(5.0, args.interval)
        for pipe in pipes:
            pipe.send((t0, t1, drain))
        time.sleep(max(0.0, t0 - time.time()))
        profile.start("heartbeats", cp.web.proc.pid)
        server_procs = [psutil.Process(pid) for pid in cp.pids()]
        web_win = CpuWindow(server_procs[:1])
        celery_win = CpuWindow(server_procs[1:])
        clients = CpuWindow([psutil.Process(p.pid) for p in procs])
        busy0 = psutil.cpu_times()
        probe = DbProbe(db_url)
        load0, redis0, t_load0 = db.load(), redis_commands(args.redis_url), time.monotonic()
        for w in (web_win, celery_win, clients):
            w.begin()
        next_sample = time.monotonic() + 1
        while time.time() < t1:
            time.sleep(min(0.1, max(0.0, t1 - time.time())))
            probe.once()
            if time.monotonic() >= next_sample:
                web_win.sample()
                next_sample += 1
        probe.close()
        time.sleep(1)  # PostgreSQL publishes its counters a moment after each transaction
        load1, redis1 = db.load(), redis_commands(args.redis_url)
        span = time.monotonic() - t_load0
        db_load = {f"db_{k}_per_s": round((load1[k] - load0[k]) / span, 1) for k in load1}
        db_load["redis_commands_per_s"] = round((redis1 - redis0) / span, 1)
        profile.stop()
        server_cpu, server_rss = web_win.end()
        celery_cpu, _ = celery_win.end()
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
        if args.restart:
            print(f"[{label}] restarting the control plane under {registered} agents", flush=True)
            restart = restart_phase(args, cp, db, registered, profile)
            print(f"[{label}] restart: {json.dumps(restart)}", flush=True)
        reconnect = {"reconnect_attempts": 0, "reconnect_errors": {}}
        for pipe in pipes:
            pipe.send("stop")
        for pipe in pipes:
            if pipe.poll(60):
                res = pipe.recv()[1]
                reconnect["reconnect_attempts"] += res["reconnect_attempts"]
                for kind, c in res["reconnect_errors"].items():
                    errs = reconnect["reconnect_errors"]
                    errs[kind] = errs.get(kind, 0) + c
        for p in procs:
            p.join(30)
    finally:
        profile.stop()
        for p in procs:
            if p.is_alive():
                p.kill()
        cp.stop()
        db.close()
        if not args.keep:
            dbs.drop(db_url)
    hb, ping, enrol = merged["hb_rtt_s"], merged["ping_rtt_s"], merged["enrol_s"]
    row = {
        "db": dbs.kind,
        "server": server,
        "agents": n,
        "clients": args.clients,
        "registered": registered,
        "enrol_failed": merged["enrol_failed"],
        "enrol_wall_s": round(enrol_wall, 1),
        "enrol_per_s": round(registered / enrol_wall, 1) if enrol_wall > 0 else None,
        "enrol_retries": counts["enrol_retries"],
        "enrol_p50_ms": _ms(percentile(enrol, 50)),
        "enrol_p99_ms": _ms(percentile(enrol, 99)),
        "replicas": args.replicas,
        "placed_s": round(placed_s, 1) if placed_s is not None else None,
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
        "hb_over_ping_p99_ms": _ms(percentile(hb, 99) - percentile(ping, 99)),
        "client_lag_p99_ms": _ms(percentile(merged["lag_s"], 99)),
        "client_lag_max_ms": _ms(max(merged["lag_s"], default=float("nan"))),
        "client_full_gcs": len(merged["gc_pauses_s"]),
        "db_p50_ms": _ms(percentile(probe.rtt, 50)),
        "db_p99_ms": _ms(percentile(probe.rtt, 99)),
        "server_cpu_pct": round(server_cpu, 1),
        "server_rss_mib": round(server_rss / 2**20),
        "celery_cpu_pct": round(celery_cpu, 1),
        "clients_cpu_pct": round(client_cpu, 1),
        "machine_cpu_pct": round(machine_cpu, 1),
        "server_errors": cp.errors(),
        **db_load,
        **({"restart": restart, **reconnect} if args.restart else {}),
    }
    print(json.dumps(row), flush=True)
    return row


TABLE_HEAD = (
    "| db | server | agents | enrol+register p50 / p99 (all in, per s) "
    "| heartbeat RTT p50 / p99 (max) | ping RTT p50 / p99 | DB SELECT 1 p50 / p99 "
    "| web CPU / RSS | worker+beat CPU | clients CPU | machine CPU | lost |\n"
    "| --- | --- | ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"
)


def table_row(r: dict) -> str:
    return (
        f"| {r['db']} | {r['server']} | {r['agents']:,} "
        f"| {r['enrol_p50_ms']:g} / {r['enrol_p99_ms']:g} ms "
        f"({r['enrol_wall_s']:g} s, {r['enrol_per_s']:g}/s) "
        f"| {r['hb_p50_ms']:g} / {r['hb_p99_ms']:g} ms ({r['hb_max_ms']:g}) "
        f"| {r['ping_p50_ms']:g} / {r['ping_p99_ms']:g} ms "
        f"| {r['db_p50_ms']:g} / {r['db_p99_ms']:g} ms "
        f"| {r['server_cpu_pct']:g} % / {r['server_rss_mib']} MiB "
        f"| {r['celery_cpu_pct']:g} % | {r['clients_cpu_pct']:g} % | {r['machine_cpu_pct']:g} % "
        f"| {r['hb_lost'] + r['closed_early']} |"
    )


RESTART_HEAD = (
    "| server | agents | replicas | stop / down | back 50 % / 90 % / 99 % / all "
    "| suspect / lost (max) | shards replaced / restarts | reconnect attempts |\n"
    "| --- | ---: | ---: | --- | --- | --- | --- | ---: |"
)


def restart_row(r: dict) -> str:
    x = r["restart"]
    return (
        f"| {r['server']} | {r['agents']:,} | {r['replicas']} "
        f"| {x['stop_s']:g} / {x['down_s']:g} s "
        f"| {x['back_50_s']:g} / {x['back_90_s']:g} / {x['back_99_s']:g} / "
        f"{x['back_all_s']:g} s ({x['back']:,} back) "
        f"| {x['max_suspect']} / {x['max_lost']} "
        f"| {x['shards_replaced']} / {x['restarts']} | {r['reconnect_attempts']:,} |"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", default="100,1000", help="levels, comma-separated")
    p.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument(
        "--server",
        default="serve",
        help=f"web server(s), comma-separated, each level run under each: {', '.join(SERVERS)}",
    )
    p.add_argument(
        "--web-only", action="store_true", help="no Celery worker and beat, the web process alone"
    )
    p.add_argument("--interval", type=float, default=10.0, help="heartbeat interval, s")
    p.add_argument("--intervals", type=int, default=3, help="intervals measured per level")
    p.add_argument("--clients", type=int, default=1, help="client processes")
    p.add_argument(
        "--enrol-concurrency", type=int, default=8, help="enrolments in flight per client process"
    )
    p.add_argument("--enrol-timeout", type=float, default=120.0)
    p.add_argument(
        "--seed",
        action="store_true",
        help="the nodes enrolled in bulk beforehand: agents connect with their own credentials",
    )
    p.add_argument(
        "--replicas", type=int, default=0, help="one-node replicas placed on the agents' nodes"
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="after the window, restart the whole control plane under the agents",
    )
    p.add_argument("--down", type=float, default=0.0, help="seconds the control plane stays down")
    p.add_argument("--restart-timeout", type=float, default=180.0)
    p.add_argument(
        "--server-env", action="append", default=[], help="KEY=VALUE for the control plane"
    )
    p.add_argument("--log-level", default="INFO", help="the control plane's LOG_LEVEL")
    p.add_argument("--keep", action="store_true", help="keep each level's database")
    p.add_argument(
        "--db-name",
        default="llmgw_bench",
        help="prefix of the scratch databases (one's own on a shared server)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="sample the web process with py-spy while agents enrol and while they heartbeat",
    )
    p.add_argument("--django", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.django:
        django_cmd(args.django[0], int(args.django[1]))
        return 0
    if args.intervals < 3:
        p.error("--intervals must be at least 3: fewer is not a steady state")
    levels = [int(x) for x in args.agents.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        p.error("--agents takes positive counts, e.g. 100,1000")
    servers = [x.strip() for x in args.server.split(",") if x.strip()]
    unknown = [x for x in servers if x not in SERVERS]
    if unknown or not servers:
        p.error(f"--server takes {' or '.join(SERVERS)}, comma-separated (got {args.server!r})")
    if args.replicas < 0 or args.replicas > min(levels):
        p.error(f"--replicas must be between 0 and the smallest level ({min(levels)})")
    if args.replicas and args.web_only:
        p.error("--replicas needs the reconciler: leave out --web-only")
    nofile = raise_nofile()
    if nofile < max(levels) + 256:
        p.error(f"open-file limit is {nofile}; {max(levels)} agents need more")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    workdir = OUT / f"agents-{stamp}"
    (workdir / "state").mkdir(parents=True, exist_ok=True)
    dbs = ScratchDatabases(args.db, pg_url=args.pg_url, name=args.db_name, workdir=workdir)
    print(f"machine: {machine()}; open-file limit {nofile}; output in {workdir}", flush=True)
    dbs.prepare_template(workdir / "migrate.log")
    rows = []
    try:
        for n in levels:
            for server in servers:
                rows.append(run_level(args, dbs, n, server, workdir))
    finally:
        dbs.drop_template()
        (workdir / "results.json").write_text(
            json.dumps({"machine": machine(), "args": vars(args), "rows": rows}, indent=2)
        )
    print()
    print(TABLE_HEAD)
    for r in rows:
        print(table_row(r))
    if args.restart:
        print()
        print(RESTART_HEAD)
        for r in rows:
            print(restart_row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
