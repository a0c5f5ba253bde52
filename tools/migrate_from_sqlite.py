"""Copy a LangGraph ``SqliteSaver`` database into a KVSaver directory.

    python -m tools.migrate_from_sqlite SOURCE.sqlite DEST_DIR [options]

The source is opened read-only and checked before anything is written; every
checkpoint (id, parent, namespace, metadata) and its pending writes are
copied; afterwards ``list()`` and ``get_tuple()`` of a read-only SqliteSaver
on the source and of KVSaver on the destination are compared for every
thread and namespace (``--no-verify`` skips that). Re-running over the same
destination adds nothing twice, and an interrupted run finishes on re-run.

Exit status: 0 done; 1 verification found a difference (shown); 2 the
migration was refused or failed (bad source, destination with other data
without ``--merge``, ...): the message says why; 130 interrupted (Ctrl-C):
the batches committed are kept, and a re-run goes on from there.

The work is done by ``saver.migrate.migrate_from_sqlite``; this module adds
the command line, a progress bar (plain lines when stderr is not a terminal)
and the summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

from kvsaver.kv.postgres import is_postgres_url
from kvsaver.migrate import MigrationError, MigrationStats, VerificationError, migrate_from_sqlite


class Progress:
    """A one-line progress bar on a terminal; on anything else, a plain line at
    each tenth of the work (and at the end), so logs stay readable."""

    WIDTH = 30

    def __init__(self, stream: TextIO, *, tty: bool | None = None) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.phase = ""
        self.started = 0.0
        self.last_draw = 0.0
        self.last_tenth = -1

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if phase != self.phase:
            self.finish()
            self.phase, self.started, self.last_draw, self.last_tenth = phase, now, 0.0, -1
        elapsed = now - self.started
        rate = done / elapsed if elapsed > 0 else 0.0
        if not total:  # the total is unknown: a count, at most once a second
            if now - self.last_draw >= 1.0:
                self.last_draw = now
                end = "\x1b[K" if self.tty else "\n"
                lead = "\r" if self.tty else ""
                self.stream.write(f"{lead}{phase}: {done:,} checkpoints, {rate:,.0f}/s{end}")
                self.stream.flush()
            return
        frac = done / total
        if self.tty:
            if done < total and now - self.last_draw < 0.1:
                return  # at most ten redraws a second
            self.last_draw = now
            filled = int(self.WIDTH * frac)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            eta = f" ETA {(total - done) / rate:,.0f} s" if rate > 0 and done < total else ""
            self.stream.write(
                f"\r{phase:<6} [{bar}] {frac:4.0%} {done:,}/{total:,} checkpoints "
                f"{rate:,.0f}/s{eta}\x1b[K"
            )
        else:
            tenth = int(frac * 10)
            if tenth == self.last_tenth:
                return
            self.last_tenth = tenth
            self.stream.write(f"{phase}: {done}/{total} checkpoints ({frac:.0%}), {rate:,.0f}/s\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self.phase:
            self.stream.write("\n")
            self.stream.flush()
        self.phase = ""


def dir_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (0 if it does not exist); for a
    PostgreSQL URL, the table's size on the server (issue #14)."""
    if is_postgres_url(path):
        from kvsaver.kv import PostgresStore

        try:
            with PostgresStore(path, readonly=True) as store:
                return store.disk_usage()
        except Exception:
            return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def summary(stats: MigrationStats, dest_before: int, dest_after: int) -> str:
    s = stats
    verb = "would copy" if s.dry_run else "copied"
    lines = [
        f"{'dry run (nothing written)' if s.dry_run else 'migrated'}: {s.source} -> {s.dest}",
        f"  threads      {s.threads:,} ({s.namespaces:,} thread/namespace pairs)",
        f"  checkpoints  {s.checkpoints_copied:,} {verb}, {s.checkpoints_present:,} already "
        f"there (source has {s.checkpoints:,})",
        f"  writes       {s.writes_copied:,} {verb}, {s.writes_present:,} already there "
        f"(source has {s.writes:,})",
    ]
    if s.orphan_writes:
        lines.append(f"  skipped      {s.orphan_writes:,} writes of checkpoints the source lacks")
    if not s.dry_run:
        ratio = f" ({dest_after / s.source_bytes:.2f}x)" if s.source_bytes else ""
        was = f"; {_mb(dest_before)} before this run" if dest_before else ""
        lines.append(
            f"  size         SQLite {_mb(s.source_bytes)} -> KVSaver {_mb(dest_after)}{ratio}{was}"
        )
        rate = f", {s.rate:,.0f} checkpoints/s" if s.checkpoints_copied else ""
        lines.append(
            f"  time         {s.seconds:,.2f} s{rate} ({s.blobs_written:,} channel values, "
            f"{_mb(s.bytes_written)} written)"
        )
    else:
        lines.append(f"  size         SQLite {_mb(s.source_bytes)}; scanned in {s.seconds:,.2f} s")
    if s.verified is not None:
        lines.append(
            f"  verified     {s.verified:,} checkpoints: list() and get_tuple() equal "
            f"({s.verify_seconds:,.2f} s)"
        )
    elif not s.dry_run:
        lines.append("  verified     no (--no-verify)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.migrate_from_sqlite",
        description="Copy a LangGraph SqliteSaver database into a KVSaver directory.",
    )
    parser.add_argument("source", help="the SqliteSaver database file (opened read-only)")
    parser.add_argument(
        "dest", help="the KVSaver directory (created if missing), or a postgresql:// URL"
    )
    parser.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare list()/get_tuple() of source and destination afterwards (default: on)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="allow a destination that already holds checkpoints not from this source",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="report what would be copied; write nothing"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=256,
        metavar="N",
        help="checkpoints per write transaction (default: 256)",
    )
    parser.add_argument(
        "--durability",
        choices=["full", "meta", "none"],
        default="full",
        help="the destination's LMDB durability (default: full)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")

    progress = None if args.quiet else Progress(sys.stderr)
    try:
        return _run(args, progress)
    except KeyboardInterrupt:
        # saver.migrate makes sure a Ctrl-C that LangGraph's decoding swallowed
        # (ValueError('ext_hook failed')) still arrives as KeyboardInterrupt.
        if progress is not None:
            progress.finish()
        print("interrupted; re-run to resume", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, progress: Progress | None) -> int:
    dest_before = dir_bytes(args.dest)
    try:
        stats = migrate_from_sqlite(
            args.source,
            args.dest,
            merge=args.merge,
            dry_run=args.dry_run,
            verify=args.verify,
            batch_size=args.batch_size,
            progress=progress,
            dest_options={"durability": args.durability},
        )
    except VerificationError as e:
        if progress is not None:
            progress.finish()
        if e.stats is not None:
            print(summary(e.stats, dest_before, dir_bytes(args.dest)))
        print(f"error: {e}", file=sys.stderr)
        return 1
    except MigrationError as e:
        if progress is not None:
            progress.finish()
        print(f"error: {e}", file=sys.stderr)
        return 2
    if progress is not None:
        progress.finish()
    print(summary(stats, dest_before, dir_bytes(args.dest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
