"""Move checkpoints into (and out of) KVSaver.

Two ways in, one check:

* ``migrate_from_sqlite(source, dest)`` reads a ``SqliteSaver`` database's
  tables directly (opened read-only, ``mode=ro``) and writes every
  checkpoint, with its id, parent, namespace, metadata and pending writes,
  into a KVSaver store through ``saver.schema``: one write transaction per
  batch of checkpoints, each checkpoint complete (record, new blobs, writes)
  within its batch. The whole checkpoint is in SqliteSaver's one blob; its
  ``channel_values`` are split into per-(channel, version) blobs, and a
  value is decoded and serialized only when its (channel, version) is not
  stored yet (see ``_Splitter``). Pending writes keep ``task_id``, ``idx``
  (special negative ones included), ``channel`` and ``task_path`` (``""``
  for databases made before that column existed); their serde-typed bytes
  are copied as they are where the destination's serializer would make the
  same bytes, else decoded and re-encoded (e.g. for an
  ``EncryptedSerializer``). Metadata (JSON text in SQLite) is decoded and
  stored through the destination's serde exactly as read: no config value
  is merged in, as ``put`` would. The result is byte for byte what
  ``KVSaver.put``/``put_writes`` store for the same checkpoints (a test pins
  this), except the thread activity stamps of ``saver.retention``: a
  migrated thread was not active at migration time, and retention dates a
  thread without a stamp by its latest checkpoint's ``ts``.

  Safe to re-run and to interrupt: every key is made of the source's ids, a
  checkpoint already in the destination is not decoded again, a write or
  blob already there is not written again, and a batch commits atomically.
  A destination that holds checkpoints not in the source is refused unless
  ``merge=True``. ``dry_run=True`` counts what would be copied and writes
  nothing (a missing destination is not created).

* ``copy_all(source_saver, dest_saver)`` copies every thread between any two
  ``BaseCheckpointSaver`` objects through their public methods (``list``,
  ``get_tuple``, ``put``, ``put_writes``), e.g. KVSaver -> PostgresSaver.
  What public methods cannot carry: ``get_tuple``'s pending writes have no
  ``task_path`` and no ``idx``. From a KVSaver source both are read from its
  store, so nothing is lost; from any other source every write gets
  ``task_path=""`` and the indexes ``0..n-1`` in its task's order (special
  channels keep their fixed negative indexes). Writes are then ordered by
  task id within a checkpoint instead of by task path, and verification
  compares each task's writes in order instead of the whole list. Each
  ``put`` passes the checkpoint's full ``channel_versions`` as
  ``new_versions`` (the destination may store some values more than once;
  savers keyed by (channel, version), as Postgres and KVSaver are, keep one).

* ``verify(source, dest, namespaces)`` compares ``list()`` and
  ``get_tuple()`` of both, per (thread, namespace), and raises
  ``VerificationError`` naming the first difference. The verification that
  ``migrate_from_sqlite`` and ``copy_all`` run reads both sides in
  LangGraph's strict msgpack mode when both use a ``JsonPlusSerializer``
  without an allowlist (``_strict_pair``). The copy itself decodes values
  with the source's serializer: migrate only from a source you trust.

Only ``kv``'s ``Store`` protocol and ``saver``'s own modules are used; the
``SqliteSaver`` used for verification is imported when needed (the
``langgraph-checkpoint-sqlite`` package).
"""

from .common import MigrationError, MigrationStats, ProgressFn, VerificationError
from .copy import copy_all
from .source import open_sqlite_saver
from .sqlite import migrate_from_sqlite
from .verify import verify

__all__ = [
    "MigrationError",
    "MigrationStats",
    "ProgressFn",
    "VerificationError",
    "copy_all",
    "migrate_from_sqlite",
    "open_sqlite_saver",
    "verify",
]
