"""Size cap and full disk.

``KVSaver(dir, max_size=N)``: a write past the cap raises ``kvsaver.kv.StoreFullError``
naming the cap, everything committed before is intact, the failed write left
nothing behind, and after ``delete_thread``/``prune`` writes succeed again
(LMDB reuses the freed pages). A real full disk (a small tmpfs mounted for
the test) must raise a clear error as well and leave the store readable with
every prior commit.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import procs_helpers as H
import pytest
from kvsaver import KVSaver
from kvsaver.kv import StoreFullError

SPAWN = mp.get_context("spawn")
pytestmark = pytest.mark.timeout(180)

CAP = 1 << 20
BIG = (30_000, 30_000)  # random bytes: incompressible, ~8 LMDB pages per value


class Filler:
    """LoopWriters (big payloads) over several threads; remembers what was acked."""

    def __init__(self, saver: KVSaver, ack_path: Path, threads: list[str]) -> None:
        self.saver, self.ack_path = saver, ack_path
        self.writers = {
            t: H.LoopWriter(saver, t, ack_path, fsync_ack=False, payload_size=BIG) for t in threads
        }

    def fill(self, limit: int = 400) -> tuple[int, StoreFullError]:
        """Put round-robin until the store is full; (puts done, the error)."""
        done = 0
        writers = list(self.writers.values())
        for i in range(limit):
            try:
                writers[i % len(writers)].step()
                done += 1
            except StoreFullError as e:
                return done, e
        raise AssertionError(f"{limit} puts of {BIG[0]} bytes fit under the cap")

    def add(self, thread: str) -> H.LoopWriter:
        self.writers[thread] = H.LoopWriter(
            self.saver, thread, self.ack_path, fsync_ack=False, payload_size=BIG
        )
        return self.writers[thread]


def _verify(saver: KVSaver, ack_path: Path, deleted: Iterable[str] = ()) -> dict[str, Any]:
    """verify_loop_store over the acks of threads not deleted on purpose."""
    gone = set(deleted)
    kept = ack_path.with_suffix(".kept")
    kept.write_text(
        "".join(" ".join(a) + "\n" for a in H.read_acks([ack_path]) if a[0] not in gone)
    )
    result = H.verify_loop_store(saver, [kept])
    assert result["n"] == 0, result
    return result


def _store_keys(saver: KVSaver) -> list[bytes]:
    with saver.store.read() as txn:
        return [k for k, _ in txn.scan(None, None)]


def test_size_cap(tmp_path: Path) -> None:
    path, acks = tmp_path / "store", tmp_path / "acks"
    saver = KVSaver(path, max_size=CAP)
    try:
        filler = Filler(saver, acks, ["t0", "t1", "t2", "t3"])
        done, err = filler.fill()
        assert done >= 10
        assert "1,048,576" in str(err) and "max_size" in str(err), str(err)
        assert os.path.getsize(path / "data.mdb") <= CAP

        # The failed put left nothing (no checkpoint, no orphan blob, no index
        # entry), and a second attempt fails the same way.
        keys = _store_keys(saver)
        with pytest.raises(StoreFullError):
            filler.writers["t0"].step()
        assert _store_keys(saver) == keys
        # put_writes past the cap: the same error, nothing written.
        tup = saver.get_tuple(H.thread_config("t0"))
        assert tup is not None
        with pytest.raises(StoreFullError):
            saver.put_writes(tup.config, [("big", os.urandom(200_000))], "extra")
        assert _store_keys(saver) == keys
        before = _verify(saver, acks)
        assert before["acked"] == done

        # delete_thread frees pages: big puts fit again.
        saver.delete_thread("t1")
        new = filler.add("after-delete")
        for _ in range(4):
            new.step()
        result = _verify(saver, acks, deleted={"t1"})
        assert result["listed"] == done - len([a for a in H.read_acks([acks]) if a[0] == "t1"]) + 4

        # Fill to the cap again; prune(keep_latest) frees pages too.
        filler.fill()
        saver.prune(["t0", "t2", "t3", "after-delete"], strategy="keep_latest")
        pruned = filler.add("after-prune")
        for _ in range(4):
            pruned.step()
        assert len(list(saver.list(H.thread_config("t2")))) == 1
    finally:
        saver.close()
    # A fresh process sees every kept checkpoint whole.
    with KVSaver(path, readonly=True) as fresh:
        for thread in ("t0", "t2", "t3", "after-delete"):
            tup = fresh.get_tuple(H.thread_config(thread))
            assert tup is not None and not H.check_tuple(tup, expect_marker=True)
        assert len(list(fresh.list(H.thread_config("after-prune")))) == 4


def test_size_cap_with_concurrent_writers(tmp_path: Path) -> None:
    """Four threads put concurrently (commits grouped) until each one hits the
    cap: every put acknowledged is whole, none half-written."""
    path, acks = tmp_path / "store", tmp_path / "acks"
    saver = KVSaver(path, max_size=CAP)
    errors: list[BaseException] = []
    try:

        def run(thread: str) -> None:
            w = H.LoopWriter(saver, thread, acks, fsync_ack=False, payload_size=(5_000, 40_000))
            try:
                for _ in range(500):
                    w.step()
                errors.append(AssertionError(f"{thread}: never hit the cap"))
            except StoreFullError:
                pass
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        result = _verify(saver, acks)
        assert result["acked"] > 0
    finally:
        saver.close()


def _small(saver: KVSaver, thread: str) -> H.LoopWriter:
    return H.LoopWriter(saver, thread, os.devnull, fsync_ack=False, payload_size=(50, 400))


def _fill_small(writers: list[H.LoopWriter], limit: int = 20_000) -> int:
    """Small puts round-robin until two in a row fail (a failed put can leave
    room for a smaller one); returns the puts done."""
    done, failed = 0, 0
    for i in range(limit):
        try:
            writers[i % len(writers)].step()
            done, failed = done + 1, 0
        except StoreFullError:
            failed += 1
            if failed == 2:
                return done
    raise AssertionError(f"{limit} small puts fit under the cap")


@pytest.mark.parametrize("cleanup", ["delete_thread", "prune"])
def test_a_store_at_its_cap_can_always_be_cleaned_up(tmp_path: Path, cleanup: str) -> None:
    """Filled to the cap with many small checkpoints: deleting or pruning
    rewrites many pages and needs free pages itself, and must commit all the
    same (it may use a small reserve past the cap); then puts fit again, and
    the cap holds again."""
    path = tmp_path / "store"
    saver = KVSaver(path, max_size=CAP, durability="none")  # small puts: no fsync needed
    try:
        assert _fill_small([_small(saver, "s0"), _small(saver, "s1")]) > 100
        if cleanup == "delete_thread":
            saver.delete_thread("s0")
        else:
            saver.prune(["s0", "s1"], strategy="keep_latest")
        cleaned = saver.store.info()["file_bytes"]  # type: ignore[attr-defined]
        assert cleaned <= CAP + max(64 * 4096, CAP // 32)  # at most the reserve past the cap
        again = _small(saver, "again")
        for _ in range(50):
            again.step()
        _fill_small([again])
        # The cap holds again: puts reuse freed pages, never the reserve.
        assert saver.store.info()["file_bytes"] <= max(CAP, cleaned)  # type: ignore[attr-defined]
        for tup in saver.list(None):
            assert H.check_tuple(tup) == []
    finally:
        saver.close()


# -- a real full disk ----------------------------------------------------------------


def _mount_tmpfs(mnt: Path, size: str) -> None:
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        detail = getattr(e, "stderr", "") or e
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root/CAP_SYS_ADMIN): {detail}")


def _umount(mnt: Path) -> None:
    if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    _mount_tmpfs(mnt, "8m")
    try:
        yield mnt
    finally:
        _umount(mnt)


def test_full_disk(small_disk: Path, tmp_path: Path) -> None:
    """An 8 MiB filesystem filled by puts: the write that does not fit raises
    StoreFullError naming the path and the full disk (put, put_writes, and a
    write() transaction alike); the store stays usable and readable (in
    another process too) with every prior commit. After some disk space is
    freed and a thread deleted, more is written than the freed disk space:
    the store reuses the pages the delete freed."""
    path, acks = small_disk / "store", tmp_path / "acks"
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (512 * 1024))
    saver = KVSaver(path)
    try:
        filler = Filler(saver, acks, ["d0", "d1", "d2"])
        for w in filler.writers.values():
            w.payload_size = (150_000, 250_000)
        done, err = filler.fill()
        assert done >= 10
        message = str(err)
        assert str(path) in message and "disk" in message and "full" in message, message
        assert os.statvfs(small_disk).f_bavail < 64  # it really is full

        tup = saver.get_tuple(H.thread_config("d0"))
        assert tup is not None
        keys = _store_keys(saver)
        with pytest.raises(StoreFullError):
            saver.put_writes(tup.config, [("big", random.randbytes(1_000_000))], "extra")
        assert _store_keys(saver) == keys  # the failed write left nothing
        with pytest.raises(StoreFullError, match="disk"):  # a write() transaction
            saver.copy_thread("d0", "copy-of-d0")
        assert _store_keys(saver) == keys
        assert _verify(saver, acks)["acked"] == done

        # A fresh process opens the full store read-only and finds every commit.
        status = tmp_path / "verify.jsonl"
        p = SPAWN.Process(target=H.verify_worker, args=(str(path), [str(acks)], str(status)))
        with H.reaped([p]):
            p.start()
            p.join(120)
        result = H.read_reports(status)[-1]
        assert result["ok"] and result["acked"] == done, result

        # Free 512 KiB of disk, delete a thread (~1/3 of the store), then write
        # more than 512 KiB: it fits in the pages the delete freed.
        ballast.unlink()
        saver.delete_thread("d1")
        new = filler.add("after-delete")
        new.payload_size = (200_000, 200_000)
        for _ in range(5):
            new.step()
        _verify(saver, acks, deleted={"d1"})
    finally:
        saver.close()
