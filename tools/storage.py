"""Look after a KVSaver store's size: stats, retention sweeps, compaction.

    kvsaver stats   DIR [--top N] [--json]
    kvsaver sweep   DIR [--keep-last N] [--ttl-minutes M]
                        [--strategy delete|keep_latest] [--incremental]
                        [--encrypted] [--json]
    kvsaver compact DIR [--full] [--json]

These are the ``kvsaver`` command's (``tools/cli.py``); this module runs the
same three as ``python -m kvsaver.tools.storage``.

``stats`` opens the store read-only (beside running writers) and prints bytes
on disk and live (a KVStore's items on the same store included, and shown
apart), and the largest threads. ``sweep`` applies a retention
policy now, one short write transaction per thread, so it can run beside a
live application, and removes the expired items of a KVStore on the same
store (``KVStore.sweep_ttl``; without --keep-last or --ttl-minutes, only
that). ``compact`` rewrites an LMDB store into a dense new file
(an LMDB file never shrinks by itself); it is offline and refuses while any
process has the store open. A ``FileStore`` file (``--backend file``) is
rewritten whole at every commit and never needs compacting.

DIR may also be a PostgreSQL URL (``postgresql://...``). There
PostgreSQL's autovacuum makes the space of deleted rows reusable by itself;
``compact`` runs ``VACUUM (ANALYZE)`` on the table now, and ``compact
--full`` runs ``VACUUM FULL``, which returns the space to the operating
system but locks the table while it rewrites it (run it when writers can wait).

``--encrypted`` is for stores written with
``EncryptedSerializer.from_pycryptodome_aes``: the key is read from
``LANGGRAPH_AES_KEY``, as LangGraph does (a sweep decodes checkpoint
metadata; stats and compaction never decode values).

Stored data is decoded in LangGraph's strict msgpack mode (only its safe
types are rebuilt), whatever ``LANGGRAPH_STRICT_MSGPACK`` says: a crafted
store cannot make these tools import and call what it names.

Long runs show a progress bar (tqdm) on a terminal. Exit status: 0 done,
2 refused or failed (the message says why).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from kvsaver import KVSaver, Retention
from kvsaver._compat import strict_jsonplus
from kvsaver.kv import KVError, PostgresStore
from kvsaver.kv.lmdb import compact_lmdb
from kvsaver.kv.postgres import is_postgres_url

from .cliutil import Command, Fail, Group, encrypted_option, encrypting, module_prog


@contextmanager
def progress_bar(desc: str, unit: str, enabled: bool) -> Iterator[Callable[[int, Any], None]]:
    """A ``progress(done, total)`` callback drawing a tqdm bar on stderr (only
    on a terminal; tqdm is an optional dependency: the ``tools`` extra)."""
    bar: Any = None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the tools and test extras
        tqdm = None

    def update(done: int, total: Any) -> None:
        nonlocal bar
        if tqdm is None or not enabled:
            return
        if bar is None:
            bar = tqdm(total=total, desc=desc, unit=unit, disable=None, file=sys.stderr)
        if total is not None and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        if bar is not None:
            bar.close()


def _open(args: argparse.Namespace, *, readonly: bool) -> KVSaver:
    path = args.dir
    if is_postgres_url(path):
        return KVSaver(path, readonly=readonly, serde=_serde(args))
    backend = "file" if os.path.isfile(path) else args.backend
    if backend == "lmdb" and not os.path.isfile(os.path.join(path, "data.mdb")):
        raise ValueError(f"{path} is not a KVSaver store (no data.mdb)")
    return KVSaver(path, readonly=readonly, backend=backend, serde=_serde(args))


def _serde(args: argparse.Namespace) -> Any:
    serde = strict_jsonplus()  # strict: see the docstring
    if getattr(args, "encrypted", False):
        return encrypting(serde)
    return serde


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def cmd_stats(args: argparse.Namespace) -> int:
    with _open(args, readonly=True) as saver:
        stats = saver.stats()
    if args.json:
        print(json.dumps(dataclasses.asdict(stats), indent=2))
    else:
        print(stats.format(top=args.top))
    return 0


def _kvstore_of(saver: KVSaver) -> Any:
    """A KVStore over the saver's store when a KVStore has written there (its
    schema record is there), else None."""
    from kvsaver import KVStore
    from kvsaver.kvstore.keyspace import SCHEMA_KEY

    with saver.store.read() as txn:
        if txn.get(SCHEMA_KEY) is None:
            return None
    return KVStore(saver.store)


def cmd_sweep(args: argparse.Namespace) -> int:
    policy = args.keep_last is not None or args.ttl_minutes is not None
    with _open(args, readonly=False) as saver:
        items = _kvstore_of(saver)
        if not policy and items is None:
            return _fail(
                "sweep needs --keep-last, --ttl-minutes or both (without them it removes only "
                "a KVStore's expired items, and this store has none)"
            )
        report = None
        if policy:
            retention = Retention(
                keep_last=args.keep_last,
                ttl_minutes=args.ttl_minutes,
                strategy=args.strategy,
                sweep_interval_minutes=None,
            )
            with progress_bar("sweep", "thread", not args.quiet) as progress:
                report = saver.sweep(retention, full=not args.incremental, progress=progress)
        expired = None
        if items is not None:
            try:
                expired = items.sweep_ttl()
            finally:
                items.close()
        after = saver.stats()
    if args.json:
        done = dataclasses.asdict(report) if report is not None else {}
        done = {**done, "items_expired": expired, "live_bytes": after.live_bytes}
        done = {**done, "store_items": after.store_items, "store_bytes": after.store_bytes}
        print(json.dumps({**done, "disk_bytes": after.disk_bytes}, indent=2))
        return 0
    if report is not None:
        print(
            f"checked {report.threads_checked:,} threads: deleted {report.threads_deleted:,}, "
            f"pruned {report.threads_pruned:,}, {report.checkpoints_deleted:,} checkpoints removed"
        )
    if expired is not None:
        print(f"removed {expired:,} expired store item{'' if expired == 1 else 's'} (KVStore)")
    theirs = (
        f" (KVStore: {after.store_items:,} items, {after.store_bytes:,} bytes)"
        if after.store_bytes
        else ""
    )
    print(f"live bytes now {after.live_bytes:,}{theirs}; on disk {after.disk_bytes:,}")
    if after.disk_bytes > 2 * after.live_bytes and os.path.isdir(args.dir):
        print(f"the file keeps its size until compacted: kvsaver compact {args.dir}")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    if is_postgres_url(args.dir):
        with PostgresStore(args.dir) as store:
            before = store.disk_usage()
            store.vacuum(full=args.full)
            after = store.disk_usage()
        what = "VACUUM FULL" if args.full else "VACUUM"
        if args.json:
            print(json.dumps({"before": before, "after": after, "compacted": what}, indent=2))
            return 0
        print(f"{what} {store.table}: {before:,} -> {after:,} bytes")
        if not args.full:
            print("freed space is reused by new rows; to return it to the OS (locks the table "
                  f"while it runs): kvsaver compact --full {args.dir}")  # fmt: skip
        return 0
    if os.path.isfile(args.dir):
        if args.json:
            size = os.path.getsize(args.dir)
            print(json.dumps({"before": size, "after": size, "compacted": False}, indent=2))
            return 0
        print(f"{args.dir} is a FileStore file: it is rewritten at every commit, nothing to do")
        return 0
    with progress_bar("compact", "record", not args.quiet) as progress:
        result = compact_lmdb(args.dir, progress=progress)
    saved = result.before - result.after
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "compacted": True}, indent=2))
        return 0
    print(
        f"compacted {args.dir}: {result.before:,} -> {result.after:,} bytes ({saved:,} bytes freed)"
    )
    return 0


def _call(fn: Callable[[argparse.Namespace], int], params: dict[str, Any]) -> int:
    """Run a ``cmd_*`` handler on click's parameters; errors -> exit status 2."""
    try:
        code = int(fn(argparse.Namespace(**params)))
    except (KVError, ValueError, OSError) as e:
        raise Fail(str(e)) from None
    if code:
        raise click.exceptions.Exit(code)
    return 0


# The commands, shared by this module's ``main`` and ``kvsaver``.
_store = click.argument("dir", metavar="STORE")
_quiet = click.option("--quiet", is_flag=True, help="no progress bar")
_json = click.option("--json", "json", is_flag=True, help="one JSON document")
_backend = click.option(
    "--backend", type=click.Choice(["lmdb", "file"]), default="lmdb", show_default=True
)


@click.command("stats", cls=Command)
@_store
@click.option("--top", type=int, default=20, show_default=True, help="threads to list")
@_json
@_backend
@_quiet
def stats_command(**params: Any) -> int:
    """Bytes on disk and live, and the largest threads."""
    return _call(cmd_stats, params)


@click.command("sweep", cls=Command)
@_store
@click.option("--keep-last", type=int, help="checkpoints to keep per thread and namespace")
@click.option("--ttl-minutes", type=float, help="threads idle for longer are swept")
@click.option(
    "--strategy", type=click.Choice(["delete", "keep_latest"]), default="delete", show_default=True
)
@click.option(
    "--incremental",
    is_flag=True,
    help="only threads idle past the TTL or written since the last sweep",
)
@encrypted_option
@_json
@_backend
@_quiet
def sweep_command(**params: Any) -> int:
    """Apply a retention policy now; remove a KVStore's expired items."""
    return _call(cmd_sweep, params)


@click.command("compact", cls=Command)
@_store
@click.option("--full", is_flag=True, help="PostgreSQL: VACUUM FULL (locks the table)")
@_json
@_quiet
def compact_command(**params: Any) -> int:
    """Rewrite an LMDB store without free space (offline); VACUUM on PostgreSQL."""
    return _call(cmd_compact, params)


COMMANDS = [stats_command, sweep_command, compact_command]


def main(argv: list[str] | None = None) -> int:
    prog = module_prog(__spec__)
    group = Group(prog, help=(__doc__ or "").split("\n\n")[0])
    for command in COMMANDS:
        group.add_command(command)
    return group.main(argv, prog_name=prog, standalone_mode=False)


if __name__ == "__main__":
    raise SystemExit(main())
