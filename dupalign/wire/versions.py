"""Every versioned binary message: one table of the version each writes and those it reads,
and the one codec for numpy arrays inside them.

A message is a msgpack map whose ``v`` field is its version. A reader accepts every
version in ``reads`` (messages retained in a topic or kept in a store from before an
upgrade are read again after it); a writer writes ``writes``. The engine encodes its stage
messages (``PageSketch``, ``AlignRequest``, ``IndexResult``, the directory's
``DirectoryEntry`` and ``Decision``, the exact stage's ``ExactAnswer``, the list stage's
``ListWindows`` and ``ListPartial``, the router's ``NearOps`` and the near shards' answers);
the service encodes the stage roles' records (dupalign/service/topology.py,
dupalign/wire/forward_record.py) and the JSON-Schema'd ones of dupalign/wire/messages.py.
They share this table so that a version is bumped in one place and every reader's list is
in sight of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, overload

import msgpack
import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class WireVersion:
    """The version a message is written in and the versions read."""

    name: str  # as error messages call it
    writes: int
    reads: tuple[int, ...]

    def check(self, v: Any) -> int:
        """``v`` if it is read; else a one-line ValueError naming the message."""
        if v not in self.reads:
            raise ValueError(f"{self.name} version {v!r}, expected one of {self.reads}")
        return int(v)

    def pack(self, fields: dict[str, Any]) -> bytes:
        """The message of ``fields`` (str keys) in the version written."""
        return bytes(msgpack.packb({"v": self.writes, **fields}, use_bin_type=True))

    def unpack(self, raw: bytes) -> dict[str, Any]:
        """The fields of the message ``raw`` (its ``v`` among them), if its version is
        read."""
        d: dict[str, Any] = msgpack.unpackb(raw, raw=False)
        self.check(d.get("v"))
        return d


# -- the engine's stage messages (dupalign) ----------------------------------------------------
# 2 adds the page's reading (how its body was decoded) to the replay key's inputs; 3: the
# combine's copy has no near arrays and no windows (``PageSketch.to_combine_bytes``)
PAGE_SKETCH = WireVersion("page sketch", 3, (1, 2, 3))
# ``AlignRequest`` and ``IndexResult``: 3 carries the align request's steps (store format
# 7); 2 is read in ``unfinished`` records of format 6 stores and retained align tasks
INDEX_MESSAGE = WireVersion("message", 3, (2, 3))
# the page directory's input and output (dupalign.stages.directory)
DIRECTORY_ENTRY = WireVersion("directory entry", 1, (1,))
# 2 carries a stored page's content hash (the exact stage's key), 3 whether it is
# near-indexed (the routers count the near table's rows); no role ever wrote 1 or 2
DIRECTORY_DECISION = WireVersion("directory decision", 3, (3,))
# the exact stage's output (dupalign.stages.exact)
EXACT_ANSWER = WireVersion("exact answer", 1, (1,))
# the list stage's input and output (dupalign.stages.list_shard)
LIST_WINDOWS = WireVersion("list windows", 1, (1,))
LIST_PARTIAL = WireVersion("list partial", 1, (1,))
# the router's output to a near shard and the near shard's answer (dupalign.stages.router)
NEAR_OPS = WireVersion("near ops", 1, (1,))
NEAR_ANSWER = WireVersion("near answer", 1, (1,))

# -- the service's messages (worker) -----------------------------------------------------------
# page, match, dead letter (schemas/*.json)
SERVICE_MESSAGE = WireVersion("message", 1, (1,))
# the partitioned pipeline's sequence: one record per sketch batch
# (dupalign/service/sequence_batch.py)
SEQUENCE_BATCH = WireVersion("sequence batch", 1, (1,))
# ``aligned`` records: 1 a whole request's passages, 2 one part's best pages; the writer
# picks the form (dupalign/service/topology.py ``encode_aligned``, ``encode_aligned_part``)
ALIGNED = WireVersion("aligned record", 2, (1, 2))
ALIGNED_WHOLE = 1  # the version that carries a whole request's passages
# a page's forward record, sketch role to align partition (dupalign/wire/forward_record.py): 2
# has 2-byte positions and positions records of 2-byte steps (store format 7); an optional
# "high" field (the unit hashes' high halves, for a forward stage:
# dupalign.passage.forward_units) needs no new one
FORWARD_RECORD = WireVersion("forward record", 2, (1, 2))


# -- numpy arrays on the wire: little-endian bytes of a fixed dtype ----------------------------
@overload
def pack_array(a: npt.NDArray[Any], dtype: str) -> bytes: ...
@overload
def pack_array(a: None, dtype: str) -> None: ...
@overload
def pack_array(a: npt.NDArray[Any] | None, dtype: str) -> bytes | None: ...
def pack_array(a: npt.NDArray[Any] | None, dtype: str) -> bytes | None:
    """``a`` as the bytes of ``dtype`` (None stays None)."""
    return None if a is None else np.ascontiguousarray(a, dtype=dtype).tobytes()


@overload
def unpack_array(raw: bytes, dtype: str, out: Any = None) -> npt.NDArray[Any]: ...
@overload
def unpack_array(raw: None, dtype: str, out: Any = None) -> None: ...
@overload
def unpack_array(raw: bytes | None, dtype: str, out: Any = None
                 ) -> npt.NDArray[Any] | None: ...
def unpack_array(raw: bytes | None, dtype: str, out: Any = None) -> npt.NDArray[Any] | None:
    """A writable array of the bytes ``raw`` read as ``dtype``, converted to ``out`` (None:
    the same type in native byte order); None stays None."""
    if raw is None:
        return None
    a = np.frombuffer(raw, dtype=dtype)
    return a.astype(out) if out is not None else a.astype(a.dtype.newbyteorder("="))
