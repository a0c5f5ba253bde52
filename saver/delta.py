"""Delta storage of append-only channel values.

A message history (``add_messages``) or any list channel that only grows
gains an element or two per step, yet a checkpointer that stores every new
version whole stores an n-step conversation about n²/2 times. Here a new
version that extends the version stored at its checkpoint's parent is stored
as the appended part plus a reference to that version; every ``MAX_CHAIN``-th
version of a chain is stored whole again, and every ``STRIDE``-th delta of
a chain references the version ``STRIDE`` back instead of its parent's (a
long step), so a read joins one full copy and at most ``STRIDE - 1 +
(MAX_CHAIN - 1) // STRIDE`` deltas: 14 at K = 64, not 63.

**Bytes, not objects.** ``JsonPlusSerializer`` makes msgpack with ormsgpack,
and a msgpack array is its header (the element count) followed by its
elements, each self-delimiting. So a list that extends another by k elements
serializes to ``header(n) + old elements' bytes + k elements' bytes``, and
"extends" is checked exactly, on bytes: the new value's serialized elements
must start with the base's serialized elements, byte for byte. Since msgpack
is a prefix-free code, the rest then starts at an element boundary and is the
appended elements. Anything else (a ``RemoveMessage``, a message replaced by
id, a trimmed window, a value that is not a list, a different layout of the
same elements) is not a byte extension and is stored whole. A read rebuilds
``header(n) + base elements + pieces`` by one concatenation and decodes once.

**Records.** A delta blob is ``MARK`` (``0xD1``: whole records start with an
ASCII type name, so the two can never be confused, and a kvsaver too old to
know deltas fails loudly, besides refusing the store by its format version)
followed by the msgpack array ``[ref, n, depth, digest, type, piece]``:

- ``ref``: the base's channel version, in the same thread, namespace and
  channel (the key of the base is the delta's key with this version): the
  version at the put's parent checkpoint, or for a long step the one
  ``STRIDE`` versions further back on the same chain;
- ``n``: the element count of the whole value;
- ``depth``: 1 + the parent version's depth (a whole value has depth 0): the
  versions since the chain's whole copy, whatever steps a read takes; a
  value whose depth would reach ``MAX_CHAIN`` is stored whole;
- ``digest``: 16 bytes naming the content: BLAKE2b of the base's digest and
  this piece (a whole base's digest is BLAKE2b of its stored record). It
  lets the in-process cache of rebuilt values recognize a record by its raw
  bytes, with no risk of serving another thread's or an older store's value;
- ``type``, ``piece``: the appended elements' bytes after the outer layers,
  as any value: zstd when that pays (``.zd1``: with the built-in dictionary
  of message bytes, ``compression.SMALL_DICT``, from format 4; ``.zst`` in
  format 3, and for pieces of 2 KiB or more), then the cipher of an
  ``EncryptedSerializer`` (``+aes``). The delta is taken before either.

The reference and the count are in the clear (as the key's versions are), so
deletes and copies follow chains without decrypting anything.

**Chains and what deletes do.** A delta's base must exist as long as the
delta does. ``threads.gc_blobs`` (behind prune, retention, delete_for_runs)
keeps the bases of every blob it keeps, transitively; ``delete_thread``
removes the whole thread; ``copy_thread`` copies every blob of the source
thread (chains included) and, before overwriting a target blob with other
bytes, rewrites whole any target-only blob whose chain goes through it
(``detach``); ``put`` does the same before it overwrites a stored version
with a different value. Forks share their base: two branches that extend the
same version both reference it.

**Long steps.** A read that no cache helps (another process) walks the
chain: per piece a record decoded, a key built, a zstd frame decompressed,
which in Python makes the walk of a deep chain a large part of a cold read
once the messages decode cheaply (``saver/messages.py``). So the delta at a
depth that is a multiple of ``STRIDE`` takes its base ``STRIDE`` versions
back on its own chain (found by following its parent's refs, over one
reverse scan of the channel's previous keys): its piece holds ``STRIDE``
versions' elements, and a read of depth d joins ``d % STRIDE`` short steps
and ``d // STRIDE`` long ones. A long step is an ordinary delta record (a
ref to an older version of the channel), so stores without long steps read
as they are, a kvsaver that makes none reads these, and every delete and
copy follows refs the same way. Long steps cut a deep chain's cold rebuild
substantially for a few percent more bytes on disk.
``STRIDE`` = 8 = sqrt(K) makes the most steps (7 + 7) fewest for the bytes
(each block of 8 versions stores 15 versions' elements instead of 8).

**Which serializers.** Deltas are made only when the innermost serializer is
a ``JsonPlusSerializer`` (its msgpack layout is known); with any other the
values are stored whole. Reading needs only the outer layers.

**K.** ``MAX_CHAIN`` = 64, by measurement on a long chat's message list:
its bytes fall steeply as K grows to 64 and little beyond. What K costs is a
read no cache helps (another process, a restart): its bytes are rebuilt
from up to K pieces, which stays small against decoding the messages, a
cost every K pays alike. A put or a warm read finds its base in the cache,
whatever K is. 64 keeps the worst cold rebuild a small part of the decode;
128 would save a few percent of the store and lengthen the walk of a cold
read, the read that is slowest against SqliteSaver. With long steps a
larger K would cost a cold read little (K = 128: at most 7 + 15 steps), but
the target for bytes on disk is met at 64.
"""

from __future__ import annotations

# The mechanism in two modules, named here as before: the record format and
# chains (``delta_records``), the codec that makes and reads them (``codec``).
from ._msgpack import header, make_header
from .codec import START, Codec, Pending, codec
from .delta_records import (
    MARK,
    MAX_CHAIN,
    MIN_BYTES,
    PIECE_THRESHOLD,
    STRIDE,
    DeltaRecord,
    base_key,
    chain_closure,
    decode,
    encode,
    is_delta,
)
from .delta_records import _Pairs as _Pairs  # for tests

__all__ = [
    "MARK",
    "MAX_CHAIN",
    "MIN_BYTES",
    "PIECE_THRESHOLD",
    "START",
    "STRIDE",
    "Codec",
    "DeltaRecord",
    "Pending",
    "base_key",
    "chain_closure",
    "codec",
    "decode",
    "encode",
    "header",
    "is_delta",
    "make_header",
]
