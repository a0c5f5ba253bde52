"""KVSaver -> PostgresSaver export (saver.migrate.copy_all) against a real
PostgreSQL server that this module starts on a throwaway cluster (a temp
directory, a unix socket there, a free loopback port) and stops afterwards.

Needs PostgreSQL's initdb/pg_ctl/postgres (Debian: the ``postgresql``
package, /usr/lib/postgresql/<version>/bin); skipped, with the reason, where
they are not installed."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from kvsaver import KVSaver
from kvsaver.migrate import MigrationError, copy_all, verify
from langgraph.checkpoint.postgres import PostgresSaver
from migrate_helpers import fanout_graph, populate, resume_all

_TOOLS = ("initdb", "pg_ctl", "postgres")


def _pg_bindir() -> str | None:
    preferred = "/usr/lib/postgresql/15/bin"
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: d != preferred)
    if (found := shutil.which("pg_ctl")) is not None:
        dirs.append(os.path.dirname(os.path.realpath(found)))
    for d in dirs:
        if all(os.access(os.path.join(d, t), os.X_OK) for t in _TOOLS):
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found under "
            "/usr/lib/postgresql/*/bin or on PATH; install them (apt-get install postgresql)"
        )
    prefix: list[str] = []
    owner = None
    if os.geteuid() == 0:  # postgres refuses to run as root: run it as the postgres user
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        prefix = ["runuser", "-u", "postgres", "--"]
    base = tempfile.mkdtemp(prefix="kvsaver-pg-")
    data = os.path.join(base, "data")
    if owner is not None:
        os.chown(base, owner.pw_uid, owner.pw_gid)
    port = _free_port()

    def run(*cmd: str) -> None:
        subprocess.run([*prefix, *cmd], check=True, capture_output=True, timeout=120)

    started = False
    try:
        run(
            f"{bindir}/initdb",
            "-D",
            data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        options = (
            f"-k {base} -p {port} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        run(
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-l",
            os.path.join(base, "log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=disable"
    finally:
        if started:
            run(f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def test_kvsaver_to_postgres_export_round_trip(postgres_url, tmp_path):
    with KVSaver(str(tmp_path / "state")) as kv, PostgresSaver.from_conn_string(postgres_url) as pg:
        pg.setup()
        populate(kv)
        n = sum(1 for _ in kv.list(None))

        stats = copy_all(kv, pg)  # verified: every list()/get_tuple() equal
        assert stats.checkpoints_copied == stats.checkpoints == stats.verified == n
        assert stats.namespaces > stats.threads  # the subgraph's namespace came along
        # From a KVSaver, task_path and idx travel too (read from its store).
        with pg._cursor() as cur:
            cur.execute("SELECT task_path, idx FROM checkpoint_writes")
            rows = cur.fetchall()
        assert any(r["task_path"] for r in rows) and any(r["idx"] < 0 for r in rows)
        assert len(rows) == sum(len(t.pending_writes) for t in kv.list(None))

        again = copy_all(kv, pg)  # a re-run adds nothing
        assert again.checkpoints_copied == 0 and again.checkpoints_present == n

        # Back again through public methods only: task_path is lost there
        # (documented), so the writes are compared task by task.
        with KVSaver(":memory:") as back:
            back_stats = copy_all(pg, back)
            assert back_stats.verified == n
            assert verify(kv, back, stats.namespace_list, writes_order=False) == n

        # A store with other data is refused.
        with KVSaver(":memory:") as other:
            fanout_graph(other).invoke(
                {"items": [5], "results": []}, {"configurable": {"thread_id": "elsewhere"}}
            )
            with pytest.raises(MigrationError, match="not in"):
                copy_all(pg, other)

        # The exported threads continue on Postgres exactly as on KVSaver.
        from_pg = resume_all(pg)
        from_kv = resume_all(kv)
    assert from_pg == from_kv
    assert from_pg["sub"]["name"] == "Ada" and len(from_pg["fanout-pending"]) == 2
