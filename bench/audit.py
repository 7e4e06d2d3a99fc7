"""What the audit trail costs a write: an API PATCH of a model and a cordon, with the trail
recording and with it switched off, side by side in one run.

    .venv/bin/python bench/audit.py                       # SQLite in a scratch state dir
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/llmgw_bench .venv/bin/python bench/audit.py

A child process migrates a fresh database (SQLite, or the PostgreSQL database
named, which it drops and creates), makes a manage key, and then, in alternating
rounds so the machine's noise falls on both alike, sends ``PATCH
/api/v1/models/<id>/`` through Django's test client (the whole request:
authentication, middleware, serializer, the save and its entry) and cordons and
uncordons a node through the service. "off" runs the same inside
django-auditlog's ``disable_auditlog()``, with ``audit.record`` doing nothing.
Prints the median time per write and the queries each takes, as JSON too.
Figures for docs/benchmarks.md.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(rounds: int, per_round: int) -> dict:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    django.setup()
    from auditlog.context import disable_auditlog
    from auditlog.models import LogEntry
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from fleet import audit
    from fleet.models import Node
    from fleet.services import nodes as node_service
    from tests.factories import add_model, add_node, bearer, manage_key

    setup_test_environment()
    call_command("migrate", verbosity=0)
    model = add_model("bench", replicas=1)
    node = add_node("gpu-01")
    _, secret = manage_key()
    client = Client(**bearer(secret))
    url = f"/api/v1/models/{model.pk}/"
    replicas = iter(range(2, 10**9))

    def patch() -> None:
        resp = client.patch(
            url, {"desired_replicas": next(replicas)}, content_type="application/json"
        )
        assert resp.status_code == 200, resp.content

    def cordon() -> None:
        with audit.acting("api"):
            node_service.cordon(node)
            node_service.uncordon(node)

    recording = audit.record

    @contextlib.contextmanager
    def switched_off():
        # Saves: django-auditlog's own switch; UPDATEs (cordon): no record() call.
        audit.record = lambda *args, **kwargs: None
        try:
            with disable_auditlog():
                yield
        finally:
            audit.record = recording

    def timed(fn, off: bool) -> float:
        with switched_off() if off else contextlib.nullcontext():
            started = time.perf_counter()
            for _ in range(per_round):
                fn()
            return (time.perf_counter() - started) / per_round * 1000

    def queries(fn, off: bool) -> int:
        with switched_off() if off else contextlib.nullcontext():
            with CaptureQueriesContext(connection) as seen:
                fn()
        return len(seen.captured_queries)

    ms = {(w, s): [] for w in ("patch", "cordon") for s in ("on", "off")}
    for i in range(rounds):
        for side in ("on", "off") if i % 2 == 0 else ("off", "on"):
            ms["patch", side].append(timed(patch, side == "off"))
            ms["cordon", side].append(timed(cordon, side == "off"))
    result = {
        "database": connection.vendor,
        "rounds": rounds,
        "writes_per_round": per_round,
        "entries_written": LogEntry.objects.count(),
    }
    for (what, side), values in ms.items():
        result[f"{what}_{side}_ms"] = round(statistics.median(values), 3)
    for what, fn in (("patch", patch), ("cordon", cordon)):
        result[f"{what}_on_queries"] = queries(fn, False)
        result[f"{what}_off_queries"] = queries(fn, True)
        on, off = result[f"{what}_on_ms"], result[f"{what}_off_ms"]
        result[f"{what}_ratio"] = round(on / off, 2)
    Node.objects.all().delete()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--per-round", type=int, default=50)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.rounds, args.per_round)))
        return
    with tempfile.TemporaryDirectory() as state:
        env = {**os.environ, "LLMGW_STATE_DIR": state}
        url = env.get("DATABASE_URL", "")
        if url.startswith("postgres"):
            name = url.rsplit("/", 1)[1]
            admin = url.rsplit("/", 1)[0] + "/postgres"
            for sql in (f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}"):
                subprocess.run(["psql", admin, "-qc", sql], check=True)
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--rounds", str(args.rounds),
             "--per-round", str(args.per_round)],
            env=env, check=True, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for what in ("patch", "cordon"):
        print(
            f"{what:7} on {result[f'{what}_on_ms']:.3f} ms ({result[f'{what}_on_queries']} "
            f"queries)  off {result[f'{what}_off_ms']:.3f} ms "
            f"({result[f'{what}_off_queries']} queries)  ×{result[f'{what}_ratio']}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
