"""Profile of get_tuple latest on the long chat (issue #15): warm and cold
(a fresh serializer, as another process reads), KVSaver against SqliteSaver.

    python bench/profile_long_chat_read.py --turns 120 --workdir /tmp/chat  # builds once
    python bench/profile_long_chat_read.py --turns 500 --workdir /tmp/chat --profile

One thread of the chat of ``bench_long_chat.py`` is put into both savers
(kept in ``--workdir`` between runs); then paired rounds of get_tuple
(process CPU time, order rotated), the decode of the message list alone (what
every saver pays for the same bytes), and with ``--profile`` the cProfile
tops of the kv warm and cold reads.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sqlite3
import statistics
import time
from typing import Any

import bench_long_chat as L
from kvsaver import KVSaver
from kvsaver import compression as C
from kvsaver import delta as D
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver


def build(workdir: str, turns: int) -> tuple[Any, Any]:
    base = os.path.join(workdir, f"t{turns}")
    fresh = not os.path.exists(base)
    th = "chat-00"
    L.REPLIES.clear()
    L.REPLIES.update({(th, t): L.text(f"a/{th}/{t}", 290, 340) for t in range(turns)})
    os.makedirs(base, exist_ok=True)
    conn = sqlite3.connect(os.path.join(base, "cp.sqlite"), check_same_thread=False)
    savers = (SqliteSaver(conn), KVSaver(os.path.join(base, "kv")))
    if fresh:
        graphs = [L.build().compile(checkpointer=s) for s in savers]
        cfg: Any = {"configurable": {"thread_id": th}}
        for t in range(turns):
            inp = {"messages": [HumanMessage(L.text(f"h/{th}/{t}", 290, 340), id=f"h-{t}")]}
            for g in graphs:
                g.invoke(inp, cfg, durability="sync")
    return savers


def _stock_hook(h: Any) -> Any:
    return h


def reads(sq: Any, kv: Any, rounds: int, ab: bool = False) -> dict[str, float]:
    """Median process CPU ms per saver; with ``ab`` also kv read with the
    stock ext hook ("stock": the decode before saver/messages.py), warm and
    cold, in the same rounds."""
    cfg: Any = {"configurable": {"thread_id": "chat-00"}}
    names = ["sqlite", "kv", "kv cold"]
    if ab:
        names += ["kv stock", "kv cold stock"]
    times: dict[str, list[float]] = {n: [] for n in names}
    warm_stock = C.wrap(JsonPlusSerializer())
    fast = C.fast_hook
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            saver = sq if n == "sqlite" else kv
            serde = saver.serde
            if n.startswith("kv cold"):
                saver.serde = C.wrap(JsonPlusSerializer())
            elif n == "kv stock":
                saver.serde = warm_stock
            if n.endswith("stock"):
                C.fast_hook = _stock_hook  # type: ignore[assignment]
                saver.serde._loader = None
            t0 = time.process_time()
            saver.get_tuple(cfg)
            times[n].append(time.process_time() - t0)
            C.fast_hook = fast  # type: ignore[assignment]
            saver.serde = serde
    return {n: statistics.median(v) * 1e3 for n, v in times.items()}


def decode_only(kv: Any, rounds: int) -> float:
    tup = kv.get_tuple({"configurable": {"thread_id": "chat-00"}})
    ser = JsonPlusSerializer()
    typed = ser.dumps_typed(tup.checkpoint["channel_values"]["messages"])
    ts = []
    for _ in range(rounds):
        t0 = time.process_time()
        ser.loads_typed(typed)
        ts.append(time.process_time() - t0)
    return statistics.median(ts) * 1e3


def parts(kv: Any, rounds: int) -> dict[str, float]:
    """Cold reads (a fresh serializer each) with the delta codec's parts
    timed inside (process CPU, median ms): ``typed`` (the whole rebuild), the
    records' ``decode``, the whole base's ``unwrap`` and the ``pieces``."""
    acc: dict[str, float] = {}

    def timed(label: str, fn: Any) -> Any:
        def f(*args: Any) -> Any:
            t0 = time.process_time()
            try:
                return fn(*args)
            finally:
                acc[label] = acc.get(label, 0.0) + time.process_time() - t0

        return f

    saved = D.Codec.typed, D.Codec.unwrap, D.Codec._piece_reader, D.decode
    D.Codec.typed = timed("typed", saved[0])  # type: ignore[method-assign]
    D.Codec.unwrap = timed("unwrap", saved[1])  # type: ignore[method-assign]
    D.Codec._piece_reader = lambda self: timed("pieces", saved[2](self))  # type: ignore
    D.decode = timed("decode", saved[3])
    cfg: Any = {"configurable": {"thread_id": "chat-00"}}
    serde, out = kv.serde, {}
    try:
        for _ in range(rounds):
            kv.serde = C.wrap(JsonPlusSerializer())
            acc.clear()
            t0 = time.process_time()
            kv.get_tuple(cfg)
            acc["get_tuple"] = time.process_time() - t0
            for k, v in acc.items():
                out.setdefault(k, []).append(v)
    finally:
        D.Codec.typed, D.Codec.unwrap, D.Codec._piece_reader, D.decode = saved
        kv.serde = serde
    return {k: statistics.median(v) * 1e3 for k, v in out.items()}


def profile(kv: Any, cold: bool, n: int) -> str:
    cfg: Any = {"configurable": {"thread_id": "chat-00"}}
    pr = cProfile.Profile()
    serde = kv.serde
    for _ in range(n):
        if cold:
            kv.serde = C.wrap(JsonPlusSerializer())
        pr.enable()
        kv.get_tuple(cfg)
        pr.disable()
        kv.serde = serde
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--turns", type=int, default=120)
    p.add_argument("--workdir", default="/tmp/kvsaver-chat-profile")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--ab", action="store_true", help="also kv with the stock ext hook")
    p.add_argument("--parts", action="store_true", help="the cold rebuild's parts")
    a = p.parse_args()
    sq, kv = build(a.workdir, a.turns)
    for _ in range(5):
        reads(sq, kv, 3)
    load = os.getloadavg()[0]
    med = reads(sq, kv, a.rounds, a.ab)
    dec = decode_only(kv, a.rounds)
    print(f"turns {a.turns}  load {load:.2f}  process CPU ms (median of {a.rounds})")
    for n, v in med.items():
        print(f"  {n:8s} {v:7.3f} ms  {v / med['sqlite']:.3f}x")
    print(f"  decode of the message list alone (JsonPlusSerializer): {dec:.3f} ms")
    if a.parts:
        for k, v in parts(kv, a.rounds).items():
            print(f"  cold, {k:10s} {v:7.3f} ms")
    if a.profile:
        for cold in (False, True):
            print(f"--- kv {'cold' if cold else 'warm'} ---")
            print(profile(kv, cold, 40))
    kv.close()
    sq.conn.close()


if __name__ == "__main__":
    main()
