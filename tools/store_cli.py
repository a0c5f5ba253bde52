"""``kvsaver store``: look inside a KVStore (LangGraph's long-term memory).

    kvsaver store ls     STORE [PREFIX] [--max-depth N] [--limit N]
    kvsaver store get    STORE NAMESPACE KEY
    kvsaver store search STORE [PREFIX] [--query TEXT --embed SPEC] [--filter JSON]
                               [--limit N] [--offset N]

STORE is what ``KVStore`` opens: an LMDB directory (it must hold
``data.mdb``; the checkpoints of a ``KVSaver`` on the same directory are not
items), a FileStore file, or a ``postgresql://`` URL; always read-only, so
beside a running application. Every command prints plain aligned text, cut
to the terminal's width on a terminal (``--full``: everything), or with
``--json`` one JSON document. Exit status 0, or 2 with one line on stderr (a
bad argument, a missing item, a store that cannot be read).

A namespace is written dotted, as LangGraph joins it (``users.u1.memories``
is ``("users", "u1", "memories")``): LangGraph refuses labels with a "." or
a NUL, so that is exact for every namespace a store accepts. An argument
starting with ``[`` is a JSON array of labels instead, which reaches any
label (``'["a.b", "c\\u0000d"]'``), and the output writes a namespace that
way when its dotted form would not read back as itself. ``""`` is the empty
prefix: every namespace.

A search with ``--query`` ranks items by meaning, which needs the query's
embedding: ``--embed module:function`` (a function from a list of texts to
vectors, or a LangChain ``Embeddings``, imported from the current directory
or the Python path) or a
LangChain model name ``provider:model`` (``openai:text-embedding-3-small``,
as ``IndexConfig``'s ``embed`` takes it). The query is embedded once.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from kvsaver.kv import KVError
from langgraph.store.base import InvalidNamespaceError, Item, SearchItem

from .cliutil import Fail, Group, full_option, json_option, store_argument
from .output import Out, emit_json, jsonable, text
from .sources import open_readonly, redact, store_kind

__all__ = ["format_namespace", "parse_namespace", "store_group"]

_ALL = 1 << 62  # list_namespaces without --limit: every namespace


# -- namespaces as arguments and as text -------------------------------------------


def parse_namespace(arg: str, what: str = "NAMESPACE") -> tuple[str, ...]:
    """A namespace argument: dotted labels, or a JSON array of labels when it
    starts with ``[``; ``""`` is the empty namespace (every one, as a prefix)."""
    if arg.startswith("["):
        try:
            labels = json.loads(arg)
        except ValueError as e:
            raise Fail(f"{what} {arg!r} starts with '[' but is not a JSON array: {e}") from None
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise Fail(f"{what} {arg!r}: a JSON namespace is an array of strings")
        return tuple(labels)
    return tuple(arg.split(".")) if arg else ()


def format_namespace(labels: Sequence[str]) -> str:
    """The namespace as an argument that reads back as itself: dotted, or
    JSON where a label holds a "." or a NUL, is empty, or the first starts
    with ``[``."""
    dotted = ".".join(labels)
    plain = all(x and "." not in x and "\x00" not in x for x in labels)
    if plain and not dotted.startswith("["):
        return dotted
    return json.dumps(list(labels), ensure_ascii=False)


# -- opening -----------------------------------------------------------------------


def open_kvstore(store: str, index: Any = None) -> Any:
    """STORE as a read-only KVStore (see the module docstring for what it may be)."""
    from kvsaver import KVStore

    kind = store_kind(store)
    if kind not in ("postgres", "lmdb", "file"):
        raise Fail(
            f"{store} is not a store KVStore opens (an LMDB directory, a FileStore file "
            "or a postgresql:// URL)"
        )
    return open_readonly(KVStore, store, kind, index=index)


@contextmanager
def _reading(store: str, index: Any = None) -> Iterator[Any]:
    """The store open for reading; what it refuses is a one-line error."""
    kv = open_kvstore(store, index)
    try:
        yield kv
    except InvalidNamespaceError as e:
        raise Fail(str(e)) from None
    except (KVError, ValueError, TypeError) as e:
        raise Fail(f"cannot read {redact(store)}: {' '.join(str(e).split())}") from None
    finally:
        kv.close()


def _embedder(spec: str) -> Any:
    """``--embed``: ``module:attr`` imported, else the text as LangGraph takes
    it (``provider:model``, through LangChain's ``init_embeddings``)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise Fail(f"--embed {spec!r}: give module:function or provider:model")
    if all(part.isidentifier() for part in [*module.split("."), *attr.split(".")]):
        if os.getcwd() not in sys.path:  # as `python -m` and uvicorn find a module here
            sys.path.insert(0, os.getcwd())
        try:
            found: Any = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module.split(".")[0]:
                raise Fail(f"--embed {spec!r}: {e}") from None
        else:
            for part in attr.split("."):
                if not hasattr(found, part):
                    raise Fail(f"--embed {spec!r}: {module} has no {attr}")
                found = getattr(found, part)
            return found() if isinstance(found, type) else found
    return spec


def _query_index(spec: str, query: str) -> dict[str, Any]:
    """An IndexConfig whose embedding of ``query`` is computed here, once."""
    from langgraph.store.base.embed import ensure_embeddings

    try:
        vector = list(ensure_embeddings(_embedder(spec)).embed_query(query))
    except Fail:
        raise
    except Exception as e:  # the user's embedder or model: whatever it raises
        raise Fail(f"--embed {spec!r} could not embed the query: {type(e).__name__}: {e}") from None
    return {"dims": len(vector), "embed": lambda texts: [vector for _ in texts]}


# -- output -----------------------------------------------------------------------


def _when(dt: Any) -> str:
    return dt.isoformat(timespec="seconds")[:19].replace("T", " ")


def _item_json(item: Item) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": jsonable(item.value),
        "created_at": item.created_at.isoformat(),
        "updated_at": item.updated_at.isoformat(),
    }
    if isinstance(item, SearchItem):
        doc["score"] = item.score
    return doc


# -- the commands -------------------------------------------------------------------


@click.group("store", cls=Group, short_help="Look inside a KVStore (long-term memory).")
def store_group() -> None:
    """Look inside a KVStore (LangGraph's long-term memory store), read-only.

    NAMESPACE and PREFIX are dotted (users.u1.memories), or a JSON array of
    labels when they start with '[' (for labels holding '.' or NUL)."""


@store_group.command("ls", short_help="Namespaces, in order.")
@store_argument
@click.argument("prefix", required=False, default="")
@click.option(
    "--max-depth", type=click.IntRange(min=1), metavar="N", help="cut namespaces to N labels"
)
@click.option("--limit", type=click.IntRange(min=0), metavar="N", help="the first N (default: all)")
@json_option
@full_option
def ls_command(
    store: str, prefix: str, max_depth: int | None, limit: int | None, as_json: bool, full: bool
) -> None:
    """The namespaces that hold items (under PREFIX), each once; with
    --max-depth, cut to their first N labels."""
    labels = parse_namespace(prefix, "PREFIX")
    with _reading(store) as kv:
        found = kv.list_namespaces(
            prefix=labels or None, max_depth=max_depth, limit=_ALL if limit is None else limit
        )
    if as_json:
        emit_json([list(ns) for ns in found])
        return
    out = Out(full)
    for ns in found:
        out.line(format_namespace(ns))
    out.line(f"{len(found):,} namespace{'' if len(found) == 1 else 's'}")


@store_group.command("get", short_help="One item.")
@store_argument
@click.argument("namespace")
@click.argument("key")
@json_option
@full_option
def get_command(store: str, namespace: str, key: str, as_json: bool, full: bool) -> None:
    """The item KEY of NAMESPACE: its value and times."""
    labels = parse_namespace(namespace)
    if not labels:
        raise Fail("NAMESPACE is empty: an item lives in a namespace of one label or more")
    with _reading(store) as kv:
        item = kv.get(labels, key)
    if item is None:
        raise Fail(f"no item {key!r} in namespace {format_namespace(labels)}")
    if as_json:
        emit_json(_item_json(item))
        return
    out = Out(full)
    out.line(f"namespace  {format_namespace(item.namespace)}")
    out.line(f"key        {item.key}")
    out.line(f"created    {_when(item.created_at)}")
    out.line(f"updated    {_when(item.updated_at)}")
    out.line("value")
    for line in json.dumps(jsonable(item.value, human=True), indent=2, ensure_ascii=False).split(
        "\n"
    ):
        out.line(f"  {line}")


def _filter(arg: str | None) -> dict[str, Any] | None:
    if arg is None:
        return None
    try:
        got = json.loads(arg)
    except ValueError as e:
        raise Fail(f"--filter is not JSON: {e}") from None
    if not isinstance(got, dict):
        raise Fail('--filter is a JSON object: {"field": value} or {"field": {"$gt": value}}')
    return got


@store_group.command("search", short_help="Items under a prefix: filtered, or ranked by a query.")
@store_argument
@click.argument("prefix", required=False, default="")
@click.option("--query", metavar="TEXT", help="rank by meaning (needs --embed)")
@click.option(
    "--embed",
    metavar="SPEC",
    help="the query's embedder: module:function or provider:model (as IndexConfig takes it)",
)
@click.option("--filter", "filter_json", metavar="JSON", help='e.g. \'{"kind": "note"}\'')
@click.option("--limit", type=click.IntRange(min=0), default=10, show_default=True, metavar="N")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, metavar="N")
@json_option
@full_option
def search_command(
    store: str,
    prefix: str,
    query: str | None,
    embed: str | None,
    filter_json: str | None,
    limit: int,
    offset: int,
    as_json: bool,
    full: bool,
) -> None:
    """Items under PREFIX (default: every namespace) matching --filter, in
    the store's order, or with --query best first by similarity."""
    labels = parse_namespace(prefix, "PREFIX")
    conditions = _filter(filter_json)
    if query is not None and embed is None:
        raise Fail("--query needs --embed (module:function or provider:model): the store keeps "
                   "vectors, not the model that made them")  # fmt: skip
    if embed is not None and query is None:
        raise Fail("--embed is for --query")
    index = None if query is None or embed is None else _query_index(embed, query)
    with _reading(store, index) as kv:
        found = kv.search(labels, query=query, filter=conditions, limit=limit, offset=offset)
    if as_json:
        emit_json([_item_json(i) for i in found])
        return
    out = Out(full)
    scored = query is not None
    headers = ["namespace", "key", "updated", *(["score"] if scored else []), "value"]
    rows = []
    for i in found:
        score = "-" if i.score is None else f"{i.score:.4f}"
        row = [format_namespace(i.namespace), i.key, _when(i.updated_at)]
        rows.append([*row, *([score] if scored else []), text(i.value)])
    out.table(headers, rows, right=("score",))
    out.line(f"{len(found):,} item{'' if len(found) == 1 else 's'}")
