"""The element cache (saver/elements.py) on a history too large to keep, against
the serializer alone (issue #13).

    python bench/elements_large13.py [--messages 3000] [--puts 15]

A list of ``--messages`` HumanMessages (~500 bytes each) is extended by one
AIMessage per put, ``--puts`` times; each put is timed through
``Elements.dumps`` (falling back to the serializer when it returns None, as
``delta.Codec.prepare`` does) and through ``JsonPlusSerializer.dumps_typed``
alone, alternating, under the default bound (16 MiB) and a small one
(512 KiB). Reported: the median ratio elements / serializer, and whether the
list was kept. A list the cache keeps costs a fraction of the serializer
(only its new elements are serialized); one it cannot keep should cost about
the serializer's time, not more.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvsaver import elements as E
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--puts", type=int, default=15)
    args = ap.parse_args()
    ser = JsonPlusSerializer()
    for bound in (E.CACHE_BYTES, 512 << 10):
        msgs = [
            HumanMessage(content=("hello world " * 40) + str(i), id=f"m{i}")
            for i in range(args.messages)
        ]
        el = E.Elements(bound)
        key = ("t", "", "messages")
        mine: list[float] = []
        plain: list[float] = []
        for r in range(args.puts):
            msgs.append(AIMessage(content="answer " * 30 + str(r), id=f"a{r}"))
            t = time.perf_counter()
            a = el.dumps(key, msgs) or ser.dumps_typed(msgs)[1]
            mine.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = ser.dumps_typed(msgs)[1]
            plain.append(time.perf_counter() - t)
            assert a == b
        ratio = statistics.median(mine) / statistics.median(plain)
        print(
            f"{len(msgs)} messages, {len(b):,} bytes, bound {bound >> 10} KiB: "
            f"kept {key in el.lists}, elements / serializer {ratio:.2f} "
            f"(median of {args.puts} puts, the first one included)"
        )


if __name__ == "__main__":
    main()
