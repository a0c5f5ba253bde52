"""Helpers shared by the kv store tests (``test_stores.py``, ``test_lmdb_gather.py``)."""

from __future__ import annotations

from typing import Any

from kvsaver.kv import LMDBStore


def batch_sizes(store: LMDBStore) -> list[int]:
    """The size of every batch ``store`` commits from now on, in order."""
    sizes: list[int] = []
    run_batch = store._run_batch

    def counted(env_: Any, batch: list[Any]) -> None:
        sizes.append(len(batch))
        run_batch(env_, batch)

    store._run_batch = counted  # type: ignore[method-assign]
    return sizes
