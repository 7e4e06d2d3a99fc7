"""Batch API benchmark: a large batch over the fake engine, beside direct requests.

    .venv/bin/python bench/batches.py [--lines 100000] [--baseline 10000] [--sqlite]

Real processes, as an operator runs them: the fake engine (``agentd.engines.fake``,
instant answers) as the one ready replica of a model, the whole app on uvicorn
(``python -m llmgw_site.serve``: the Batch API's views and the gateway), ONE
Celery worker (``--concurrency 1``) and beat, a private Redis, and a scratch
PostgreSQL database (``--pg``, dropped at the end; ``--sqlite`` for a SQLite file).
The worker sends the batch's lines to that web process (``LLMGW_BATCH_GATEWAY_URL``).

An input file of ``--lines`` chat completions is uploaded through ``/v1/files``,
a batch of it created through ``/v1/batches`` and polled until it is completed.
Measured:

- lines per second of the one worker, from the create to ``completed`` and while
  sending (``in_progress`` to ``finalizing``), and per quarter of the lines, so a
  rate that falls as the batch grows shows;
- the RSS of the worker's task process (and its parent) and of the web process,
  sampled every second: the first sample after the create, the one at half the
  lines, the peak while sending, the peak while the files were written;
- CPU per line of the worker, the web process and the engine;
- rows written per line, per table, from ``pg_stat_user_tables``
  (``n_tup_ins``/``n_tup_upd``/``n_tup_del`` over the batch, divided by the lines),
  and rows read per line (``seq_tup_read`` + ``idx_tup_fetch``); the output file's
  size, its lines checked (every ``custom_id`` once, every status 200).

Baseline, in the same run and against the same web process: ``--baseline``
requests (the batch's own bodies) sent straight to the gateway with the key by
a plain client (threads of ``http.client``, one keep-alive connection each, as
the runner's sender) at the runner's concurrency (``--concurrency``, set as
``LLMGW_BATCH_CONCURRENCY``; a batch has at most that many lines in flight),
half before the batch and half after it. The batch's lines/s is given as a
ratio of that rate.

Figures are for this machine, side by side; not a test.
"""

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from _common import (  # noqa: E402
    PY,
    ROOT,
    Procs,
    _pg_admin,
    machine,
    one_ready_replica,
    run_setup,
    setup_django,
    start_engine,
    start_gateway,
)

MODEL = "tiny"
PG = "postgres://postgres@127.0.0.1:5432"
DB_NAME = "llmgw_bench_batches"
CELERY_WORKER = ["worker", "--loglevel", "INFO", "--concurrency", "1"]
CELERY_WORKER += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
MIB = 1 << 20


def body(i: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}


def write_input(path: Path, n: int) -> int:
    with open(path, "w") as fh:
        for i in range(1, n + 1):
            line = {"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions"}
            fh.write(json.dumps({**line, "body": body(i)}) + "\n")
    return path.stat().st_size


# ---- the fleet's rows, in a subprocess with the bench's environment -----------------


def setup_db(engine_port: int) -> None:
    setup_django()
    from fleet.models import ApiKey, Engine

    one_ready_replica(MODEL, Engine.FAKE, engine_port)
    _, secret = ApiKey.issue(name="bench batches", scope="inference")
    print(secret)


def profile_worker(path: str) -> None:
    """``--profile``'s worker: ``runner.tick`` and ``runner.run_owner`` as the Celery tasks
    call them, one after another in this process's main thread, under cProfile, until
    a batch has come and none is left running; the stats written to ``path``."""
    import cProfile

    from _common import django_child

    django_child()
    from django.db import connection

    from fleet.models import Batch
    from fleet.services.batches import runner

    queries: dict[str, list] = {}  # the statement up to its first parameter: [count, seconds]

    def count(execute, sql, params, many, context):
        t = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            q = queries.setdefault(sql.split("%s")[0][:160], [0, 0.0])
            q[0] += 1
            q[1] += time.perf_counter() - t

    prof = cProfile.Profile()
    seen = False
    while True:
        prof.enable()
        with connection.execute_wrapper(count):
            for owner in runner.tick():
                while runner.run_owner(owner):
                    pass
        prof.disable()
        running = Batch.objects.filter(status__in=runner.RUNNING).exists()
        seen = seen or running or Batch.objects.exists()
        if seen and not running:
            break
        time.sleep(0.5)
    prof.dump_stats(path)
    with open(path + ".queries", "w") as fh:
        for sql, (n, secs) in sorted(queries.items(), key=lambda q: -q[1][1]):
            fh.write(f"{n:8d} {secs:8.2f} s  {sql}\n")


# ---- HTTP ---------------------------------------------------------------------------


class Api:
    """The web process's /v1 with the key, over one connection."""

    def __init__(self, port: int, key: str):
        self.port, self.key = port, key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def call(self, method: str, path: str, body: bytes | None = None, ctype: str = "") -> tuple:
        headers = {"Authorization": f"Bearer {self.key}"}
        if ctype:
            headers["Content-Type"] = ctype
        try:
            self.conn.request(method, path, body=body, headers=headers)
            resp = self.conn.getresponse()
        except (OSError, http.client.HTTPException):
            self.conn.close()  # once more on a fresh connection (the server closed it)
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            self.conn.request(method, path, body=body, headers=headers)
            resp = self.conn.getresponse()
        return resp.status, resp.read()

    def json(self, method: str, path: str, payload: dict | None = None) -> dict:
        data = json.dumps(payload).encode() if payload is not None else None
        status, raw = self.call(method, path, data, "application/json" if data else "")
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {raw[:500]!r}")
        return json.loads(raw)

    def upload(self, path: Path) -> dict:
        boundary = "llmgw-bench-boundary"
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{path.name}"\r\nContent-Type: application/jsonl\r\n\r\n'
        ).encode()
        data = head + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        status, raw = self.call(
            "POST", "/v1/files", data, f"multipart/form-data; boundary={boundary}"
        )
        if status >= 300:
            raise RuntimeError(f"upload: {status} {raw[:500]!r}")
        return json.loads(raw)

    def content_lines(self, file_id: str):
        """The file's lines, streamed."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        conn.request(
            "GET", f"/v1/files/{file_id}/content", headers={"Authorization": f"Bearer {self.key}"}
        )
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        yield from resp
        conn.close()


def direct(port: int, key: str, first: int, n: int, conc: int) -> dict:
    """``n`` chat completions (bodies ``first``..) to the gateway at ``conc`` at once, by
    threads with a keep-alive connection each; the rate and what answered what."""
    lock = threading.Lock()
    nxt = [first]
    end = first + n
    statuses: dict[int, int] = {}
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        seen: dict[int, int] = {}
        while True:
            with lock:
                i = nxt[0]
                if i >= end:
                    break
                nxt[0] += 1
            data = json.dumps(body(i), separators=(",", ":")).encode()
            try:
                conn.request("POST", "/v1/chat/completions", body=data, headers=headers)
                resp = conn.getresponse()
                resp.read()
                seen[resp.status] = seen.get(resp.status, 0) + 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                seen[0] = seen.get(0, 0) + 1
        conn.close()
        with lock:
            for k, v in seen.items():
                statuses[k] = statuses.get(k, 0) + v

    threads = [threading.Thread(target=worker) for _ in range(conc)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"requests": n, "seconds": wall, "rps": n / wall, "statuses": statuses}


# ---- sampling -------------------------------------------------------------------------


def rss(proc: psutil.Process, children: bool = True) -> int:
    total = 0
    try:
        total = proc.memory_info().rss
        if children:
            for c in proc.children(recursive=True):
                try:
                    total += c.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
    except psutil.NoSuchProcess:
        pass
    return total


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of a process and its living children."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class Sample:
    t: float
    answered: int
    status: str
    task_rss: int  # the worker's task process (its pool child)
    worker_rss: int  # the worker, parent and child
    web_rss: int


@dataclass
class Watch:
    """Samples every second while the batch runs: its counts and the processes' RSS."""

    api: Api
    batch_id: str
    worker: psutil.Process
    web: psutil.Process
    samples: list[Sample] = field(default_factory=list)
    batch: dict = field(default_factory=dict)

    def run(self, t0: float, timeout: float) -> dict:
        while time.monotonic() - t0 < timeout:
            self.batch = self.api.json("GET", f"/v1/batches/{self.batch_id}")
            counts = self.batch["request_counts"]
            kids = self.worker.children()
            self.samples.append(
                Sample(
                    time.monotonic() - t0,
                    counts["completed"] + counts["failed"],
                    self.batch["status"],
                    sum(rss(k, children=False) for k in kids),
                    rss(self.worker),
                    rss(self.web),
                )
            )
            if self.batch["status"] in ("completed", "failed", "expired", "cancelled"):
                return self.batch
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0) % 1.0))
        raise TimeoutError(f"batch {self.batch_id} not done in {timeout:g} s: {self.batch}")


# ---- the database's side --------------------------------------------------------------

_TABLES = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del, COALESCE(seq_tup_read, 0), "
    "COALESCE(idx_tup_fetch, 0), COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0), "
    "COALESCE(seq_scan, 0) "
    "FROM pg_stat_user_tables"
)


def pg_stats(url: str) -> tuple[dict, dict]:
    """(per table: inserted, updated, deleted, read, scans; the database's commits)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = {row[0]: row[1:] for row in conn.execute(_TABLES).fetchall()}
        xact = conn.execute(
            "SELECT xact_commit, tup_returned, tup_fetched FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    return tables, {"commits": xact[0], "returned": xact[1], "fetched": xact[2]}


def pg_delta(before: tuple, after: tuple, n: int) -> dict:
    rows = {}
    for table, now in after[0].items():
        was = before[0].get(table, (0,) * len(now))
        d = [a - b for a, b in zip(now, was, strict=True)]
        if any(d):
            rows[table] = {
                "inserted": d[0] / n,
                "updated": d[1] / n,
                "deleted": d[2] / n,
                "read": (d[3] + d[4]) / n,
                "seq_read": d[3] / n,
                "index_read": d[4] / n,
                "scans": d[5] / n,
                "seq_scans": d[6],
            }
    db = {k: (after[1][k] - before[1][k]) / n for k in after[1]}
    return {"tables": rows, "database": db}


def quiet_stats(seconds: float = 12.0) -> None:
    """Let every backend report its counters (PostgreSQL 15 flushes an idle backend's
    within 10 s, a busy one's at most once a second)."""
    time.sleep(seconds)


# ---- the run --------------------------------------------------------------------------


def wait_log(path: Path, text: str, proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{path.name}: exited {proc.returncode}:\n{tail}")
        if text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{path.name}: no {text!r} in {timeout:g} s")


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-batches-"))
    procs = Procs(work)
    env = {
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        **os.environ,
        "LLMGW_STATE_DIR": str(work / "state"),
        "LLMGW_CHANNEL_PREFIX": f"bench-batches-{os.getpid()}",
        "LLMGW_BATCH_CONCURRENCY": str(args.concurrency),
        "LLMGW_BATCH_TEAM_CONCURRENCY": str(max(args.concurrency, 8)),
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
    }
    redis = None
    if not args.redis:
        from fleet.devstack.redis import PrivateRedis

        (work / "redis").mkdir()
        redis = PrivateRedis(work / "redis").start()
        env["REDIS_URL"] = redis.url
    else:
        env["REDIS_URL"] = args.redis
    if args.sqlite:
        db_url = f"sqlite:///{work / 'bench.sqlite3'}"
    else:
        db_url = f"{args.pg}/{args.db_name}"
        _pg_admin(args.pg, f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)')
        _pg_admin(args.pg, f'CREATE DATABASE "{args.db_name}"')
    env["DATABASE_URL"] = db_url
    n = args.lines
    out: dict = {"lines": n, "database": "sqlite" if args.sqlite else "postgresql"}
    try:
        engine_port, engine = start_engine(procs, env, "engine", MODEL)
        key = run_setup(__file__, str(engine_port), env)[-1]
        port, web = start_gateway(procs, env, "serve")
        env["LLMGW_BATCH_GATEWAY_URL"] = f"http://127.0.0.1:{port}"
        if args.profile:
            # The runner in a process of its own under cProfile, in place of beat and
            # the worker: tick, then the owner's slices, until the batch is done.
            argv = [PY, __file__, "--profile-worker", str(Path(args.profile).resolve())]
            worker = procs.start("worker", argv, env)
        else:
            celery = [PY, "-m", "celery", "-A", "llmgw_site"]
            worker = procs.start("worker", [*celery, *CELERY_WORKER], env)
            beat_args = ["beat", "--loglevel", "INFO", "-s", str(work / "beat-schedule")]
            beat = procs.start("beat", [*celery, *beat_args], env)
            wait_log(work / "worker.log", " ready.", worker)
            wait_log(work / "beat.log", "beat: Starting", beat)
        api = Api(port, key)
        p_worker, p_web, p_engine = (psutil.Process(p.pid) for p in (worker, web, engine))

        source = work / "input.jsonl"
        out["input_bytes"] = write_input(source, n)
        t = time.perf_counter()
        upload = api.upload(source)
        out["upload_s"] = time.perf_counter() - t
        assert upload["bytes"] == out["input_bytes"], upload

        half = args.baseline // 2
        direct(port, key, 1, min(200, n), args.concurrency)  # warm the path
        before = [direct(port, key, 1, half, args.concurrency)]

        if not args.sqlite:
            quiet_stats()
            stats0 = pg_stats(db_url)
        cpu0 = {name: cpu_s(p) for name, p in (("worker", p_worker), ("web", p_web))}
        cpu0["engine"] = cpu_s(p_engine)
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        batch = api.json(
            "POST",
            "/v1/batches",
            {
                "input_file_id": upload["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        watch = Watch(api, batch["id"], p_worker, p_web)
        done = watch.run(t0, args.timeout)
        total_s = time.monotonic() - t0
        cpu1 = {name: cpu_s(p) for name, p in (("worker", p_worker), ("web", p_web))}
        cpu1["engine"] = cpu_s(p_engine)
        out["load1"] = [load0, os.getloadavg()[0]]
        out["status"] = done["status"]
        out["request_counts"] = done["request_counts"]
        out["total_s"] = total_s
        out["cpu_ms_per_line"] = {k: (cpu1[k] - cpu0[k]) * 1000 / n for k in cpu1}
        out.update(phases(watch.samples, done, n))
        out["rss"] = memory(watch.samples, n)

        if not args.sqlite:
            quiet_stats()
            out["db"] = pg_delta(stats0, pg_stats(db_url), n)

        out["output"] = check_output(api, done, n)
        after = direct(port, key, half + 1, args.baseline - half, args.concurrency)
        base = before + [after]
        rps = sum(b["requests"] for b in base) / sum(b["seconds"] for b in base)
        out["baseline"] = {
            "concurrency": args.concurrency,
            "requests": sum(b["requests"] for b in base),
            "rps": rps,
            "rps_before": base[0]["rps"],
            "rps_after": base[1]["rps"],
            "statuses": [b["statuses"] for b in base],
        }
        out["ratio"] = out["lines_per_s"] / rps
        out["ratio_sending"] = out["lines_per_s_sending"] / rps
    finally:
        procs.stop_all()
        if redis is not None:
            redis.stop()
        if not args.sqlite:
            _pg_admin(args.pg, f'DROP DATABASE IF EXISTS "{args.db_name}" WITH (FORCE)')
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        out["work"] = str(work)
    return out


def phases(samples: list[Sample], done: dict, n: int) -> dict:
    """Rates: create → completed, while sending, and per quarter of the lines."""
    sending = [s for s in samples if s.status == "in_progress"]
    first_t = next((s.t for s in samples if s.answered > 0), None)
    last_send = next((s.t for s in samples if s.answered >= n), samples[-1].t)
    out = {
        "lines_per_s": n / samples[-1].t,
        "to_in_progress_s": sending[0].t if sending else None,
        "first_answer_s": first_t,
        "finalizing_s": samples[-1].t - last_send,
    }
    start = sending[0].t if sending else 0.0
    out["lines_per_s_sending"] = n / (last_send - start) if last_send > start else None
    quarters = []
    prev_t, prev_n = start, 0
    for q in (1, 2, 3, 4):
        mark = n * q // 4
        s = next((s for s in samples if s.answered >= mark), samples[-1])
        quarters.append((s.answered - prev_n) / (s.t - prev_t) if s.t > prev_t else None)
        prev_t, prev_n = s.t, s.answered
    out["lines_per_s_by_quarter"] = quarters
    return out


def memory(samples: list[Sample], n: int) -> dict:
    """RSS (MiB): first sample, at half the lines, the peak while sending, the peak while
    the files were written, per process."""
    sending = [s for s in samples if s.answered < n and s.status == "in_progress"] or samples
    finishing = [s for s in samples if s not in sending] or samples[-1:]
    mid = next((s for s in sending if s.answered >= n // 2), sending[-1])
    out = {}
    for name in ("task_rss", "worker_rss", "web_rss"):

        def mib(s, name=name):
            return getattr(s, name) / MIB

        out[name] = {
            "first": mib(sending[0]),
            "half": mib(mid),
            "last_sending": mib(sending[-1]),
            "peak_sending": max(mib(s) for s in sending),
            "peak_finishing": max(mib(s) for s in finishing),
        }
    return out


def check_output(api: Api, done: dict, n: int) -> dict:
    """The output file's size and lines: every custom_id once, every status 200."""
    if not done.get("output_file_id"):
        return {"bytes": 0, "lines": 0}
    meta = api.json("GET", f"/v1/files/{done['output_file_id']}")
    ids: set[str] = set()
    lines = bad = 0
    for raw in api.content_lines(done["output_file_id"]):
        row = json.loads(raw)
        ids.add(row["custom_id"])
        lines += 1
        bad += row["response"]["status_code"] != 200
    ok = lines == n and len(ids) == n and bad == 0 and not done.get("error_file_id")
    return {"bytes": meta["bytes"], "lines": lines, "unique": len(ids), "non_200": bad, "ok": ok}


# ---- the report -------------------------------------------------------------------------


def report(r: dict) -> str:
    n = r["lines"]
    b = r["baseline"]
    m = r["rss"]
    q = r["lines_per_s_by_quarter"]
    rows = [
        ("figure", "value"),
        (
            "lines",
            f"{n:,} ({r['input_bytes'] / MIB:.1f} MiB in, uploaded in {r['upload_s']:.1f} s)",
        ),
        ("batch: create → completed", f"{r['total_s']:.1f} s ({r['status']})"),
        ("create → in_progress (beat's tick, validation)", f"{r['to_in_progress_s']:.1f} s"),
        ("all answered → completed (the files written)", f"{r['finalizing_s']:.1f} s"),
        ("**batch lines/s, one worker, create → completed**", f"**{r['lines_per_s']:.0f}**"),
        ("batch lines/s while sending", f"{r['lines_per_s_sending']:.0f}"),
        ("lines/s by quarter of the lines", " / ".join(f"{x:.0f}" for x in q if x)),
        (
            f"baseline: direct requests/s at concurrency {b['concurrency']} "
            f"({b['requests']:,} requests)",
            f"{b['rps']:.0f} (before {b['rps_before']:.0f}, after {b['rps_after']:.0f})",
        ),
        ("**batch / direct**", f"**×{r['ratio']:.2f}** (while sending ×{r['ratio_sending']:.2f})"),
    ]
    for name, label in (
        ("task_rss", "worker's task process"),
        ("worker_rss", "worker (parent + child)"),
        ("web_rss", "web process"),
    ):
        x = m[name]
        rows.append(
            (
                f"RSS, {label}: first / at half / peak sending / peak finishing",
                f"{x['first']:.0f} / {x['half']:.0f} / {x['peak_sending']:.0f} / "
                f"{x['peak_finishing']:.0f} MiB",
            )
        )
    cpu = r["cpu_ms_per_line"]
    rows.append(
        (
            "CPU a line: worker / web / engine",
            f"{cpu['worker']:.2f} / {cpu['web']:.2f} / {cpu['engine']:.2f} ms",
        )
    )
    o = r["output"]
    rows.append(
        (
            "output file",
            f"{o['bytes'] / MIB:.1f} MiB, {o['bytes'] / max(1, o['lines']):.0f} B a line, "
            f"{o['lines']:,} lines, {'checked' if o.get('ok') else 'NOT OK: ' + json.dumps(o)}",
        )
    )
    if "db" in r:
        d = r["db"]["database"]
        rows.append(("database: commits a line", f"{d['commits']:.2f}"))
        for table, t in sorted(r["db"]["tables"].items()):
            rows.append(
                (
                    f"`{table}` a line: inserted / updated / deleted / read",
                    f"{t['inserted']:.3f} / {t['updated']:.3f} / {t['deleted']:.3f} / "
                    f"{t['read']:.1f}",
                )
            )
    width = max(len(a) for a, _ in rows)
    lines = [f"| {a:<{width}} | {b} |" for a, b in rows[:1]]
    lines.append(f"| {'-' * width} | ---: |")
    lines += [f"| {a:<{width}} | {b} |" for a, b in rows[1:]]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=100_000, help="lines in the batch (100,000)")
    p.add_argument("--baseline", type=int, default=10_000, help="direct requests (10,000)")
    p.add_argument("--concurrency", type=int, default=4, help="LLMGW_BATCH_CONCURRENCY (4)")
    p.add_argument("--pg", default=PG, help=f"PostgreSQL server URL, no database ({PG})")
    p.add_argument("--db-name", default=DB_NAME, help=f"the scratch database ({DB_NAME})")
    p.add_argument("--sqlite", action="store_true", help="a SQLite file instead of PostgreSQL")
    p.add_argument("--redis", help="a Redis URL to use instead of a private redis-server")
    p.add_argument("--timeout", type=float, default=3600, help="the batch's deadline, s")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--profile", help="run the runner under cProfile, stats to this file")
    p.add_argument("--setup-db", help=argparse.SUPPRESS)
    p.add_argument("--profile-worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.profile_worker:
        profile_worker(args.profile_worker)
        return
    if args.setup_db:
        setup_db(int(args.setup_db))
        return
    print(machine(), flush=True)
    result = run(args)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
