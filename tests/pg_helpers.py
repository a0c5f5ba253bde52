"""A throwaway PostgreSQL cluster for the tests that need a server: initdb in
a temp directory, the unix socket there, a free loopback port; run as the
``postgres`` user when the tests run as root (the server refuses root).

One cluster serves the whole test session (tests/conftest.py's
``pg_server`` fixture); each test works in tables of its own. Needs
PostgreSQL's initdb/pg_ctl/postgres (Debian: the ``postgresql`` package,
/usr/lib/postgresql/<version>/bin); without them ``PgServer.start`` says why
and the fixture skips with that reason.

A second cluster, with pgvector, runs the binaries of the ``pgserver`` wheel
(a test dependency: a PostgreSQL build with pgvector; only its binaries are
used, not its Python API): ``PgServer(pgserver_bindir())``,
``shared_pgvector_server()``. Without the wheel the tests that need it fail
with the reason, never skip."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from typing import Any

_TOOLS = ("initdb", "pg_ctl", "postgres")


def pg_bindir() -> str | None:
    preferred = "/usr/lib/postgresql/15/bin"
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: d != preferred)
    if (found := shutil.which("pg_ctl")) is not None:
        dirs.append(os.path.dirname(os.path.realpath(found)))
    for d in dirs:
        if all(os.access(os.path.join(d, t), os.X_OK) for t in _TOOLS):
            return d
    return None


def pgserver_bindir() -> str:
    """The bin directory of the ``pgserver`` wheel's PostgreSQL (with pgvector),
    found without importing the package; readable by the ``postgres`` user
    when running as root (else a copy in a temporary directory that is)."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        raise Unavailable(
            "the pgserver wheel (PostgreSQL with pgvector) is not installed: "
            "pip install -e '.[test]'"
        )
    install = os.path.join(os.path.dirname(spec.origin), "pginstall")
    bindir = os.path.join(install, "bin")
    if not all(os.access(os.path.join(bindir, t), os.X_OK) for t in _TOOLS):
        raise Unavailable(f"pgserver's PostgreSQL binaries are missing under {bindir}")
    if os.geteuid() == 0 and not _postgres_can_run(install):
        copy = tempfile.mkdtemp(prefix="kvsaver-pginstall-")
        os.chmod(copy, 0o755)
        shutil.copytree(install, os.path.join(copy, "pginstall"), symlinks=True)
        install = os.path.join(copy, "pginstall")
        bindir = os.path.join(install, "bin")
        if not _postgres_can_run(install):
            raise Unavailable(f"the postgres user cannot run pgserver's binaries, even in {copy}")
    return bindir


def _postgres_can_run(install: str) -> bool:
    """Whether the ``postgres`` user can run the server of ``install`` and
    read its pgvector files."""
    checks = [
        *(f"-x {install}/bin/{t}" for t in _TOOLS),
        f"-r {install}/lib/postgresql/vector.so",
        f"-r {install}/share/postgresql/extension/vector.control",
    ]
    script = " && ".join(f"test {c}" for c in checks)
    done = subprocess.run(["runuser", "-u", "postgres", "--", "sh", "-c", script], check=False)
    return done.returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Unavailable(Exception):
    """No server can be started here; the message says why."""


class PgServer:
    """A private PostgreSQL cluster. ``url`` once started. ``bindir``: the
    server's binaries (default: the system's, ``pg_bindir``)."""

    def __init__(self, bindir: str | None = None) -> None:
        bindir = bindir or pg_bindir()
        if bindir is None:
            raise Unavailable(
                "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found under "
                "/usr/lib/postgresql/*/bin or on PATH; install them (apt-get install postgresql)"
            )
        self.bindir = bindir
        self.prefix: list[str] = []
        owner = None
        if os.geteuid() == 0:  # postgres refuses to run as root: run it as the postgres user
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable(
                    "running as root and there is no 'postgres' user to run the server as"
                ) from None
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.base = tempfile.mkdtemp(prefix="kvsaver-pg-")
        if owner is not None:
            os.chown(self.base, owner.pw_uid, owner.pw_gid)
        self.data = os.path.join(self.base, "data")
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable"
        self.started = False

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self.prefix, *cmd], check=True, capture_output=True, timeout=120)

    def _ctl(self, *args: str) -> None:
        self._run(f"{self.bindir}/pg_ctl", "-D", self.data, *args)

    def start(self, durable: bool = False) -> None:
        """Tests: no fsync (a throwaway cluster); ``durable=True`` (benchmarks):
        PostgreSQL's defaults, a commit is a WAL flush."""
        self._run(
            f"{self.bindir}/initdb", "-D", self.data, "-A", "trust", "-U", "postgres",
            "-E", "UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        options = (
            f"-k {self.base} -p {self.port} -c listen_addresses=127.0.0.1 -c max_connections=200"
        )
        if not durable:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._ctl("-l", os.path.join(self.base, "log"), "-w", "-t", "60", "-o", options, "start")
        self.started = True

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is ended, the server comes back."""
        # -l again: without it the new postmaster would write to our pipe,
        # which then never closes.
        log = os.path.join(self.base, "log")
        self._ctl("-l", log, "-w", "-t", "60", "-m", "fast", "restart")

    def stop(self) -> None:
        if self.started:
            self._ctl("-m", "immediate", "-w", "stop")
            self.started = False
        shutil.rmtree(self.base, ignore_errors=True)


def unique_table(prefix: str = "t") -> str:
    """A fresh table name: tests on the shared server never see each other."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def drop_tables(url: str, tables: list[str]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        for t in tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(t)))


# -- the session's server, started on first use ----------------------------------
# A singleton rather than only a fixture, so that helpers which open savers by
# backend name (saver_helpers.open_kv) reach it too; tests/conftest.py's
# pg_server fixture hands it out and its pytest_sessionfinish stops it.

_SHARED: list[PgServer] = []
_UNAVAILABLE: list[str] = []
_PGVECTOR: list[PgServer] = []


def shared_server() -> PgServer:
    """The session's server; pytest.skip (with the reason) where there is none."""
    import pytest

    if _UNAVAILABLE:
        pytest.skip(_UNAVAILABLE[0])
    if not _SHARED:
        try:
            server = PgServer()
        except Unavailable as e:
            _UNAVAILABLE.append(str(e))
            pytest.skip(str(e))
        try:
            server.start()
        except BaseException:
            server.stop()
            raise
        _SHARED.append(server)
    return _SHARED[0]


def shared_pgvector_server() -> PgServer:
    """The session's cluster with pgvector (pgserver's binaries); started on
    first use. Where it cannot be, the test fails with the reason (the wheel
    is a test dependency: its absence is a broken setup, not a skip)."""
    import pytest

    if not _PGVECTOR:
        try:
            server = PgServer(pgserver_bindir())
        except Unavailable as e:
            pytest.fail(f"no PostgreSQL with pgvector: {e}")
        try:
            server.start()
        except BaseException:
            server.stop()
            raise
        _PGVECTOR.append(server)
    return _PGVECTOR[0]


def stop_shared_server() -> None:
    while _POOL:
        _POOL.pop().close()
    while _SHARED:
        _SHARED.pop().stop()
    while _PGVECTOR:
        _PGVECTOR.pop().stop()


def table_for(place: object) -> str:
    """A table name derived from a place (a test's tmp_path): the same place
    reopens the same store, as a directory does for LMDB."""
    import hashlib

    return "kv_" + hashlib.sha1(str(place).encode()).hexdigest()[:16]


_POOL: list[Any] = []


def shared_pool() -> Any:
    """One psycopg_pool.ConnectionPool on the session's server, for tests that
    open many short-lived stores (a fresh table each, no pool start-up each)."""
    if not _POOL:
        from psycopg_pool import ConnectionPool

        _POOL.append(
            ConnectionPool(
                shared_server().url, min_size=1, max_size=8, kwargs={"autocommit": True}, open=True
            )
        )
    return _POOL[0]


def database_url(url: str, name: str) -> str:
    """``url`` (postgresql://.../db?...) naming database ``name`` instead."""
    base, _, query = url.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


def create_database(url: str, name: str) -> str:
    """CREATE DATABASE ``name`` on the server at ``url``; its URL."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return database_url(url, name)


def fresh_database(url: str) -> str:
    """A new empty database on the server at ``url``; its URL (for tools that
    use the default table name)."""
    return create_database(url, unique_table("db"))


def drop_database(url: str, name: str) -> None:
    """DROP DATABASE ``name`` (if it exists) on the server at ``url``, its
    sessions ended first (a killed client's may linger)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(query.format(sql.Identifier(name)))
