"""A PostgreSQL server of a test's own, which the test may stop and start again.

The e2e stack runs on the test database (SQLite by default, or CI's PostgreSQL,
which no test may stop). Reliability row 7 stops the database under load, so
it gets one of its own: ``initdb`` into a temporary directory, ``postgres`` on
a free loopback port, trust authentication for one user. PostgreSQL refuses
to run as root, so as root the server runs as the ``postgres`` user, in a
directory outside pytest's (which that user cannot enter).

``PrivatePostgres.as_default()`` points this test process's ORM at it too, so
the Stack's helpers (keys, join tokens, the rows a test waits on) see what the
control-plane processes see.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.processes.base import ROOT, free_port, subprocess_env, wait_for_port

SERVER_DIRS = "/usr/lib/postgresql/*/bin"
USER = "llmgw"
DATABASE = "llmgw"
# Who runs the server when the test runs as root (as Debian's packages name it).
SERVER_USER = "postgres"


def server_binaries() -> tuple[str, str]:
    """``initdb`` and ``postgres``: the newest under /usr/lib/postgresql/*/bin (Debian's
    layout), else the ones on PATH. Fails naming what is missing."""

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    for bindir in sorted(glob.glob(SERVER_DIRS), key=version, reverse=True):
        initdb, postgres = Path(bindir, "initdb"), Path(bindir, "postgres")
        if initdb.is_file() and postgres.is_file():
            return str(initdb), str(postgres)
    initdb, postgres = shutil.which("initdb"), shutil.which("postgres")
    if initdb and postgres:
        return initdb, postgres
    missing = [name for name, found in (("initdb", initdb), ("postgres", postgres)) if not found]
    raise RuntimeError(
        f"this test needs a PostgreSQL server of its own, but {' and '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} found neither under {SERVER_DIRS} nor on "
        "PATH: install the PostgreSQL server (Debian: apt-get install postgresql)"
    )


class PrivatePostgres:
    """``initdb`` + ``postgres`` on 127.0.0.1:<free port>, its files in a temporary
    directory removed by ``close()``. ``stop()`` and ``start()`` keep the data."""

    def __init__(self):
        self.initdb, self.postgres = server_binaries()
        self.run_as = None
        if os.geteuid() == 0:
            try:
                self.run_as = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise RuntimeError(
                    "PostgreSQL refuses to run as root, and there is no "
                    f"'{SERVER_USER}' user to run it as"
                ) from None
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        if self.run_as is not None:
            os.chown(self.dir, self.run_as.pw_uid, self.run_as.pw_gid)

    @property
    def url(self) -> str:
        return f"postgres://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, argv: list[str], **kwargs) -> subprocess.Popen:
        if self.run_as is not None:
            kwargs.update(user=self.run_as.pw_uid, group=self.run_as.pw_gid, extra_groups=[])
        with open(self.log, "ab") as fh:
            return subprocess.Popen(
                argv,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kwargs,
            )

    def _output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def init(self) -> PrivatePostgres:
        """A new cluster, the server started, and the empty database the stack migrates."""
        argv = [self.initdb, "-D", str(self.data), "-U", USER, "-A", "trust", "-E", "UTF8"]
        argv += ["--locale=C", "--no-sync"]
        proc = self._run(argv)
        if proc.wait(120) != 0:
            raise RuntimeError(f"initdb failed ({proc.returncode}):\n{self._output()}")
        self.start()
        self._sql(f'CREATE DATABASE "{DATABASE}"')
        return self

    def start(self, timeout: float = 60) -> None:
        argv = [self.postgres, "-D", str(self.data), "-p", str(self.port), "-k", str(self.dir)]
        # Loopback only; durability is not what the tests measure.
        argv += ["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"]
        argv += ["-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        self.proc = self._run(argv)
        try:
            wait_for_port(self.port, self.proc, timeout)
            deadline = time.monotonic() + timeout
            while True:  # listening comes before accepting ("the database system is starting up")
                try:
                    self._sql("SELECT 1", dbname="postgres")
                    return
                except Exception:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    time.sleep(0.1)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"postgres did not start ({exc}):\n{self._output()}") from None

    def _sql(self, statement: str, dbname: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, dbname=dbname, autocommit=True
        ) as conn:
            conn.execute(statement)

    def stop(self, timeout: float = 30) -> None:
        """A fast shutdown (SIGINT): sessions are ended, new connections refused."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def migrate(self) -> None:
        """``manage.py migrate`` against it, as an operator sets up a new database."""
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=ROOT,
            env=subprocess_env(DATABASE_URL=self.url),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"migrate on {self.url} failed:\n{done.stdout}{done.stderr}")

    @contextlib.contextmanager
    def as_default(self):
        """This thread's ORM on this server while inside (the "default" alias), restored after.

        The connection of the test database is put back before pytest-django
        flushes it, so the test database is left as every other test leaves it.
        Django's cache of content types (by id, per process) is emptied on the
        way in and out: the two databases number them apart, and a cached id of
        the other one breaks the audit log's foreign key.
        """
        import dj_database_url
        from django.contrib.contenttypes.models import ContentType
        from django.db import connections
        from django.db.utils import load_backend

        config = connections.configure_settings({"default": dj_database_url.parse(self.url)})
        wrapper = load_backend(config["default"]["ENGINE"]).DatabaseWrapper(
            config["default"], "default"
        )
        saved = connections["default"]
        connections["default"] = wrapper
        ContentType.objects.clear_cache()
        try:
            yield
        finally:
            wrapper.close()
            connections["default"] = saved
            ContentType.objects.clear_cache()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
