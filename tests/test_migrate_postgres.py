"""KVSaver -> PostgresSaver export (saver.migrate.copy_all) against a real
PostgreSQL server: the session's throwaway cluster (tests/pg_helpers.py,
the ``postgres_url`` fixture of tests/conftest.py), skipped with the reason
where PostgreSQL is not installed."""

from __future__ import annotations

import pytest
from kvsaver import KVSaver
from kvsaver.migrate import MigrationError, copy_all, verify
from langgraph.checkpoint.postgres import PostgresSaver
from migrate_helpers import fanout_graph, populate, resume_all


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
