"""The data file read beside LMDB: its two meta pages, and which file it is.

LMDB reads pages through its memory map, and a page past the end of a
truncated file kills the process with SIGBUS: so the meta pages are checked
with ``pread`` before LMDB reads any (``_check_data_file``). A map of just
the meta pages (``_map_metas``) gives the last transaction id and the pages
in use without ``env.info()``, which releases the GIL.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

from ..store import CorruptStoreError

# LMDB 0.9's MDB_meta on a 64-bit build (lmdb.h/mdb.c), after the 16-byte page
# header of pages 0 and 1: magic, version, address, mapsize, then two MDB_db
# (pad, flags, depth, branch/leaf/overflow pages, entries, root; the free DB's
# pad is the page size), then the last page number and the transaction id.
_META = struct.Struct("<IIQQ" + "IHHQQQQQ" * 2 + "QQ")
_META_AT = 16
_TXNID = struct.Struct("<Q")
_TXNID_AT = _META_AT + _META.size - _TXNID.size  # the last field: the transaction id
_LAST_PG_AT = _TXNID_AT - _TXNID.size  # the field before it: the last page in use
_META_MAGIC = 0xBEEFC0DE
_META_VERSION = 1
_NO_PAGE = (1 << 64) - 1  # P_INVALID: the root of an empty DB


def _check_data_file(path: str) -> None:
    """Raise CorruptStoreError naming ``path/data.mdb`` if it cannot be the
    file its meta pages describe. LMDB maps the file and reads pages through
    the map: a page past the end of a truncated file kills the process with
    SIGBUS, no exception. So the meta pages are read with ``pread`` first,
    and the newest one (the larger transaction id, as LMDB picks it) must
    have its last page inside the file and its roots at or below its last
    page. A problem is confirmed by reading again (a meta page read while
    another process writes it may be torn). Nothing is checked for a missing
    file."""
    data = os.path.join(path, "data.mdb")
    problem = None
    for attempt in range(3):
        try:
            problem = _data_file_problem(data)
        except FileNotFoundError:
            return
        if problem is None:
            return
        time.sleep(0.01 * (attempt + 1))
    raise CorruptStoreError(
        f"{data} {problem}: the store is damaged and cannot be opened safely; "
        "restore it from a backup"
    )


def _data_file_problem(data: str) -> str | None:
    fd = os.open(data, os.O_RDONLY | os.O_CLOEXEC)
    try:
        metas = []
        at = 0
        for _ in range(2):
            raw = os.pread(fd, _META_AT + _META.size, at)
            if len(raw) < _META_AT + _META.size:
                break
            meta = _META.unpack_from(raw, _META_AT)
            metas.append(meta)
            at = meta[4]  # the page size: meta page 1 starts there
            if not 512 <= at <= 65536 or at & (at - 1):
                break
        # The size after the meta pages: another process may commit (and
        # extend the file) meanwhile, and the file only grows.
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size == 0:
        return "is empty (0 bytes)"
    if len(metas) < 2 or any(m[0] != _META_MAGIC for m in metas):
        return "is not a valid LMDB data file (no LMDB meta pages)"
    if any(m[1] != _META_VERSION for m in metas):
        return f"has LMDB data format {metas[0][1]}/{metas[1][1]}, not {_META_VERSION}"
    meta = max(metas, key=lambda m: m[21])
    psize, last, roots = meta[4], meta[20], (meta[11], meta[19])
    need = (last + 1) * psize
    if need > size:
        return (
            f"is truncated: {size:,} bytes, but its last transaction uses "
            f"{need:,} ({last + 1:,} pages of {psize:,} bytes)"
        )
    if any(r != _NO_PAGE and r > last for r in roots):
        return f"has a damaged meta page (a root past its last page {last:,})"
    return None


def _map_metas(path: str, psize: int) -> mmap.mmap:
    """A read-only shared map of the data file's two meta pages (see
    _Env.last_txnid): the same page cache LMDB's own map reads."""
    fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, 2 * psize, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)


def _identity(path: str) -> tuple[int, int] | None:
    """Which file ``path/data.mdb`` is (device, inode), or None if none is."""
    try:
        st = os.stat(os.path.join(path, "data.mdb"))
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
