"""``kvsaver``: look inside a checkpoint store without writing code.

    kvsaver threads STORE [--limit N] [--match SUBSTRING]
    kvsaver history STORE THREAD [--ns NS] [--limit N]
    kvsaver show    STORE THREAD [CHECKPOINT_ID] [--ns NS] [--channel NAME] [--full]
    kvsaver diff    STORE THREAD A B [--ns NS]
    kvsaver stats|sweep|compact STORE ...      (tools/storage.py)
    kvsaver migrate SOURCE.sqlite DEST_DIR ...  (tools/migrate_from_sqlite.py)
    kvsaver store ls|get|search STORE ...      (tools/store_cli.py: KVStore items)

Installed with the package as the ``kvsaver`` console script and as
``python -m kvsaver``. STORE is an LMDB directory, a FileStore file, a
SqliteSaver ``.sqlite`` file or a ``postgresql://`` URL (``tools/sources.py``
decides which), always opened read-only and decoded with LangGraph's strict
msgpack allowlist: a class outside it is shown as ``<unallowed type m.Class>``,
never imported.

Every command prints plain aligned text, cut to the terminal's width on a
terminal (``--full`` shows everything; a pipe gets everything), or with
``--json`` one JSON document. Exit status 0 done, 2 a bad argument, a missing
thread or checkpoint, or a store that cannot be read (one line on stderr).

Tables are plain text rather than ``rich``: they are a few columns of ids and
numbers, plain text is what a pipe or a test wants, and it keeps the install
to one small dependency (click).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from kvsaver.kv import KVError
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import CheckpointTuple
from ormsgpack import MsgpackDecodeError

from .cliutil import (
    Fail,
    Group,
    encrypted_option,
    encrypting,
    full_option,
    json_option,
    store_argument,
)
from .migrate_from_sqlite import migrate_command
from .output import Out, jsonable
from .output import emit_json as _emit_json
from .output import is_messages as _is_messages
from .output import text as _text
from .output import when as _when
from .sources import Entry, Source, ThreadInfo, open_source, redact, strict_serde
from .storage import COMMANDS as STORAGE_COMMANDS
from .store_cli import store_group

__all__ = ["cli", "jsonable", "main"]


# -- shared options ----------------------------------------------------------------

_thread = click.argument("thread")
_ns = click.option(
    "--ns", default=None, metavar="NS", help="checkpoint namespace ('' is the root graph)"
)


def _open(store: str, encrypted: bool) -> Source:
    serde: Any = None
    if encrypted:
        serde = encrypting(strict_serde())
    return open_source(store, serde=serde)


@contextmanager
def _reading(store: str, encrypted: bool) -> Iterator[Source]:
    """The store open for reading; a value that cannot be decoded (encrypted,
    damaged, a serializer this LangGraph lacks) is a one-line error."""
    with _open(store, encrypted) as src:
        try:
            yield src
        except (NotImplementedError, ValueError, KVError, sqlite3.Error, MsgpackDecodeError) as e:
            message = " ".join(str(e).split()) or type(e).__name__
            hint = ""
            if "+aes" in message and not encrypted:
                hint = (
                    " (written with EncryptedSerializer: add --encrypted, key in LANGGRAPH_AES_KEY)"
                )
            raise Fail(f"cannot decode what {redact(store)} holds: {message}{hint}") from None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvsaver")
    except PackageNotFoundError:  # pragma: no cover - run from a clone, not installed
        return "unknown"


HELP = """Look inside a LangGraph checkpoint store (read-only), and look after its size.

STORE is a KVSaver LMDB directory, a FileStore file, a SqliteSaver .sqlite
file or a postgresql:// URL. 'kvsaver store ...' reads a KVStore's items
(long-term memory). Every command takes --json. Exit status 0, or 2 with one
line on stderr (bad argument, missing thread, unreadable store)."""


@click.group(cls=Group, name="kvsaver", help=HELP)
@click.version_option(_version(), prog_name="kvsaver")
def cli() -> None:
    pass


_COMMANDS: list[click.Command] = [*STORAGE_COMMANDS, migrate_command, store_group]
for _command in _COMMANDS:
    cli.add_command(_command)


# -- threads -----------------------------------------------------------------------


def _thread_json(info: ThreadInfo) -> dict[str, Any]:
    return {
        "thread_id": info.thread_id,
        "checkpoints": info.checkpoints,
        "namespaces": info.namespaces,
        "last_checkpoint_id": info.last_checkpoint_id,
        "last_ts": info.last_ts,
        "last_activity": _when(info.last_activity),
        "writes": info.writes,
        "bytes": info.bytes,
    }


@cli.command("threads", short_help="Every thread, most recently active first.")
@store_argument
@click.option("--limit", type=click.IntRange(min=0), metavar="N", help="show the first N")
@click.option("--match", metavar="SUBSTRING", help="only threads whose id contains it")
@json_option
@full_option
@encrypted_option
def threads_command(
    store: str, limit: int | None, match: str | None, as_json: bool, full: bool, encrypted: bool
) -> None:
    """Every thread, most recently active first: checkpoints, namespaces,
    latest checkpoint and time, bytes."""
    with _reading(store, encrypted) as src:
        infos = src.threads()
    if match is not None:
        infos = [i for i in infos if match in i.thread_id]
    if limit is not None:
        infos = infos[:limit]
    if as_json:
        _emit_json([_thread_json(i) for i in infos])
        return
    out = Out(full)
    rows = []
    for i in infos:
        when = _when(i.last_activity) or i.last_ts or ""
        rows.append(
            [
                i.thread_id,
                f"{i.checkpoints:,}",
                len(i.namespaces),
                i.last_checkpoint_id,
                when[:19].replace("T", " "),
                "-" if i.bytes is None else f"{i.bytes:,}",
            ]
        )
    headers = ["thread", "checkpoints", "namespaces", "last checkpoint", "last activity", "bytes"]
    out.table(headers, rows, right=("checkpoints", "namespaces", "bytes"))
    out.line(f"{len(infos):,} thread{'' if len(infos) == 1 else 's'}")


# -- history -----------------------------------------------------------------------


def _entry_json(e: Entry) -> dict[str, Any]:
    return {
        "checkpoint_id": e.checkpoint_id,
        "checkpoint_ns": e.checkpoint_ns,
        "step": e.metadata.get("step"),
        "source": e.metadata.get("source"),
        "parent_checkpoint_id": e.parent_checkpoint_id,
        "pending_writes": e.pending_writes,
        "changed": e.changed,
        "ts": e.ts,
    }


@cli.command("history", short_help="A thread's checkpoints, newest first.")
@store_argument
@_thread
@_ns
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="the newest N checkpoints")
@json_option
@full_option
@encrypted_option
def history_command(
    store: str,
    thread: str,
    ns: str | None,
    limit: int | None,
    as_json: bool,
    full: bool,
    encrypted: bool,
) -> None:
    """A thread's checkpoints, newest first: id, step, source, parent,
    pending writes, and the channels each one changed. Every namespace
    unless --ns is given."""
    with _reading(store, encrypted) as src:
        entries = src.history(thread, ns, limit)
        if not entries:
            src.missing(thread, ns, None)
    if as_json:
        _emit_json([_entry_json(e) for e in entries])
        return
    out = Out(full)
    many_ns = any(e.checkpoint_ns for e in entries)
    headers = ["checkpoint", *(["ns"] if many_ns else []), "step", "source", "writes"]
    headers += ["parent", "changed"]
    rows = []
    for e in entries:
        row: list[Any] = [e.checkpoint_id, *([e.checkpoint_ns] if many_ns else [])]
        row += [e.metadata.get("step"), e.metadata.get("source"), e.pending_writes]
        row += [e.parent_checkpoint_id or "-", ", ".join(e.changed)]
        rows.append(row)
    out.table(headers, rows, right=("step", "writes"))


# -- show --------------------------------------------------------------------------


def _tuple_head(t: CheckpointTuple) -> dict[str, Any]:
    conf = t.config["configurable"]
    return {
        "thread_id": conf["thread_id"],
        "checkpoint_ns": conf.get("checkpoint_ns", ""),
        "checkpoint_id": conf["checkpoint_id"],
        "parent_checkpoint_id": (
            t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        ),
        "ts": t.checkpoint.get("ts"),
    }


def _show_value(out: Out, name: str, value: Any, pad: int) -> None:
    if _is_messages(value):
        out.line(f"  {name.ljust(pad)}  {len(value)} messages")
        for m in value:
            out.line(f"    {_text(m)}")
    else:
        out.line(f"  {name.ljust(pad)}  {_text(value)}")


@cli.command("show", short_help="One checkpoint, decoded.")
@store_argument
@_thread
@click.argument("checkpoint_id", required=False)
@_ns
@click.option("--channel", metavar="NAME", help="only this channel (and its pending writes)")
@json_option
@full_option
@encrypted_option
def show_command(
    store: str,
    thread: str,
    checkpoint_id: str | None,
    ns: str | None,
    channel: str | None,
    as_json: bool,
    full: bool,
    encrypted: bool,
) -> None:
    """A checkpoint (default: the thread's latest) decoded: channel values,
    metadata, pending writes."""
    with _reading(store, encrypted) as src:
        t = src.get(thread, ns, checkpoint_id)
    values = dict(t.checkpoint.get("channel_values") or {})
    writes = list(t.pending_writes or ())
    if channel is not None:
        if channel not in values and not any(w[1] == channel for w in writes):
            known = ", ".join(sorted(values)) or "none"
            raise Fail(f"checkpoint has no channel {channel!r} (channels with values: {known})")
        values = {channel: values[channel]} if channel in values else {}
        writes = [w for w in writes if w[1] == channel]
    if as_json:
        doc = _tuple_head(t)
        doc["metadata"] = jsonable(t.metadata or {})
        doc["channel_values"] = {k: jsonable(v) for k, v in values.items()}
        doc["channel_versions"] = jsonable(t.checkpoint.get("channel_versions") or {})
        doc["pending_writes"] = [
            {"task_id": task, "channel": ch, "value": jsonable(v)} for task, ch, v in writes
        ]
        _emit_json(doc)
        return
    out = Out(full)
    head = _tuple_head(t)
    meta: dict[str, Any] = dict(t.metadata or {})
    out.line(f"thread      {head['thread_id']}")
    if head["checkpoint_ns"]:
        out.line(f"namespace   {head['checkpoint_ns']}")
    out.line(
        f"checkpoint  {head['checkpoint_id']}  (step {meta.get('step')}, {meta.get('source')})"
    )
    out.line(f"parent      {head['parent_checkpoint_id'] or '-'}")
    out.line(f"time        {head['ts']}")
    out.line()
    out.line("channel values")
    pad = max((len(k) for k in values), default=0)
    for name in sorted(values):
        _show_value(out, name, values[name], pad)
    if not values:
        out.line("  (none)")
    out.line()
    out.line("metadata")
    pad = max((len(k) for k in meta), default=0)
    for key in sorted(meta):
        out.line(f"  {key.ljust(pad)}  {_text(meta[key])}")
    out.line()
    out.line(f"pending writes ({len(writes)})")
    if writes:
        out.table(
            ["  task", "channel", "value"],
            [[f"  {task}", ch, _text(v)] for task, ch, v in writes],
        )


# -- diff --------------------------------------------------------------------------


def _message_key(m: BaseMessage) -> str:
    return m.id or json.dumps(jsonable(m), sort_keys=True, default=str)


def _message_diff(a: Any, b: Any) -> tuple[list[Any], list[Any]]:
    """(added, removed) messages between two message lists: by id (or by
    content, for messages without one); a message whose content changed
    under the same id is both removed (old) and added (new)."""
    a_list = a if isinstance(a, list) else []
    b_list = b if isinstance(b, list) else []
    a_msgs = [m for m in a_list if isinstance(m, BaseMessage)]
    b_msgs = [m for m in b_list if isinstance(m, BaseMessage)]
    a_by = {_message_key(m): jsonable(m) for m in a_msgs}
    b_by = {_message_key(m): jsonable(m) for m in b_msgs}
    added = [m for m in b_msgs if a_by.get(_message_key(m)) != b_by[_message_key(m)]]
    removed = [m for m in a_msgs if b_by.get(_message_key(m)) != a_by[_message_key(m)]]
    return added, removed


@cli.command("diff", short_help="What changed between two checkpoints.")
@store_argument
@_thread
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@_ns
@json_option
@full_option
@encrypted_option
def diff_command(
    store: str,
    thread: str,
    a: str,
    b: str,
    ns: str | None,
    as_json: bool,
    full: bool,
    encrypted: bool,
) -> None:
    """Channels added, removed and changed from checkpoint A to checkpoint B;
    for message lists, the messages added and removed."""
    with _reading(store, encrypted) as src:
        ta, tb = src.get(thread, ns, a), src.get(thread, ns, b)
    va = dict(ta.checkpoint.get("channel_values") or {})
    vb = dict(tb.checkpoint.get("channel_values") or {})
    added = sorted(set(vb) - set(va))
    removed = sorted(set(va) - set(vb))
    changed = sorted(ch for ch in set(va) & set(vb) if jsonable(va[ch]) != jsonable(vb[ch]))
    messages = {}
    for ch in [*added, *removed, *changed]:
        if _is_messages(va.get(ch)) or _is_messages(vb.get(ch)):
            messages[ch] = _message_diff(va.get(ch), vb.get(ch))
    if as_json:
        _emit_json(
            {
                "thread_id": thread,
                "a": _tuple_head(ta),
                "b": _tuple_head(tb),
                "added": added,
                "removed": removed,
                "changed": changed,
                "messages": {
                    ch: {"added": jsonable(ad), "removed": jsonable(rm)}
                    for ch, (ad, rm) in messages.items()
                },
                "values": {
                    ch: {"a": jsonable(va.get(ch)), "b": jsonable(vb.get(ch))}
                    for ch in [*added, *removed, *changed]
                    if ch not in messages
                },
            }
        )
        return
    out = Out(full)
    for label, t in (("A", ta), ("B", tb)):
        meta = t.metadata or {}
        head = _tuple_head(t)
        ns_text = f" ns {head['checkpoint_ns']}" if head["checkpoint_ns"] else ""
        out.line(f"{label}  {head['checkpoint_id']}{ns_text}  (step {meta.get('step')})")
    if not (added or removed or changed):
        out.line("no differences in channel values")
        return
    pad = max(len(ch) for ch in [*added, *removed, *changed])
    for mark, names in (("+", added), ("-", removed), ("~", changed)):
        for ch in names:
            if ch in messages:
                ad, rm = messages[ch]
                out.line(f"{mark} {ch.ljust(pad)}  +{len(ad)} -{len(rm)} messages")
                for m in rm:
                    out.line(f"    - {_text(m)}")
                for m in ad:
                    out.line(f"    + {_text(m)}")
            elif mark == "+":
                out.line(f"+ {ch.ljust(pad)}  {_text(vb[ch])}")
            elif mark == "-":
                out.line(f"- {ch.ljust(pad)}  {_text(va[ch])}")
            else:
                out.line(f"~ {ch.ljust(pad)}  {_text(va[ch])}  ->  {_text(vb[ch])}")


def main(argv: list[str] | None = None) -> int:
    """The ``kvsaver`` console script: returns the exit status."""
    return cli.main(argv, prog_name="kvsaver", standalone_mode=False)


if __name__ == "__main__":
    raise SystemExit(main())
