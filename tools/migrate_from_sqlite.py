"""Copy a LangGraph ``SqliteSaver`` database into a KVSaver directory.

    kvsaver migrate SOURCE.sqlite DEST_DIR [options]
    python -m kvsaver.tools.migrate_from_sqlite SOURCE.sqlite DEST_DIR [options]

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

import dataclasses
import json
import os
import sys
import time
from typing import TextIO

import click
from kvsaver.kv.postgres import is_postgres_url
from kvsaver.migrate import MigrationError, MigrationStats, VerificationError, migrate_from_sqlite

from .cliutil import Command, Fail, module_prog


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
    PostgreSQL URL, the table's size on the server."""
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


@click.command("migrate", cls=Command)
@click.argument("source", metavar="SOURCE.sqlite")
@click.argument("dest", metavar="DEST")
@click.option(
    "--verify/--no-verify",
    default=True,
    help="compare list()/get_tuple() of source and destination afterwards (default: on)",
)
@click.option(
    "--merge",
    is_flag=True,
    help="allow a destination that already holds checkpoints not from this source",
)
@click.option("--dry-run", is_flag=True, help="report what would be copied; write nothing")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=256,
    metavar="N",
    help="checkpoints per write transaction (default: 256)",
)
@click.option(
    "--durability",
    type=click.Choice(["full", "meta", "none"]),
    default=None,
    help="the destination's LMDB durability (default: full; an LMDB option only)",
)
@click.option("--quiet", is_flag=True, help="no progress output")
@click.option("--json", "as_json", is_flag=True, help="the summary as one JSON document")
def migrate_command(
    source: str,
    dest: str,
    verify: bool,
    merge: bool,
    dry_run: bool,
    batch_size: int,
    durability: str | None,
    quiet: bool,
    as_json: bool,
) -> int:
    """Copy a LangGraph SqliteSaver database into a KVSaver store (DEST: a
    directory, created if missing, or a postgresql:// URL).

    Exit status 1 when verification finds a difference, 2 when refused."""
    progress = None if quiet else Progress(sys.stderr)
    dest_before = dir_bytes(dest)

    def show(stats: MigrationStats) -> None:
        if as_json:
            fields = dataclasses.asdict(stats)
            fields["namespace_list"] = [list(pair) for pair in stats.namespace_list]
            print(json.dumps(fields, indent=2))
        else:
            print(summary(stats, dest_before, dir_bytes(dest)))

    try:
        stats = migrate_from_sqlite(
            source,
            dest,
            merge=merge,
            dry_run=dry_run,
            verify=verify,
            batch_size=batch_size,
            progress=progress,
            # Only when given: KVSaver refuses LMDB options for other backends.
            dest_options={} if durability is None else {"durability": durability},
        )
    except VerificationError as e:
        if progress is not None:
            progress.finish()
        if e.stats is not None:
            show(e.stats)
        raise Fail(str(e), code=1) from None
    except MigrationError as e:
        if progress is not None:
            progress.finish()
        raise Fail(str(e)) from None
    except KeyboardInterrupt:
        # saver.migrate makes sure a Ctrl-C that LangGraph's decoding swallowed
        # (ValueError('ext_hook failed')) still arrives as KeyboardInterrupt.
        if progress is not None:
            progress.finish()
        raise Fail("interrupted; re-run to resume", code=130) from None
    if progress is not None:
        progress.finish()
    show(stats)
    return 0


def main(argv: list[str] | None = None) -> int:
    prog = module_prog(__spec__)
    return migrate_command.main(argv, prog_name=prog, standalone_mode=False)


if __name__ == "__main__":
    sys.exit(main())
