"""The inverted lists of the passage index as the store holds them (the ``oph`` family).

A list is named by (bin, min-hash); its prefix ``bin ‖ min-hash`` (10 bytes, big-endian)
starts every key of the list, so that RocksDB's prefix Bloom filters answer most seeks to a
new list without reading a block. Under it, in key order:
- the long mark: the prefix alone -> u64 n: the list held at least n entries when a query
  found it to be a stop list (dupalign.passage.index, step 1);
- a run: prefix ‖ last ordinal ‖ ``RUN_SEQ`` -> every entry of the list up to that ordinal,
  as LEB128 varint deltas (a page with several windows in the list repeats, delta 0);
- one entry per later page: prefix ‖ ordinal -> b"" (one window of the page in the list)
  or <u4 n (n windows).
An entry is a ``LIST_KEY`` record; the engine handles entries as arrays of those records,
and lists by their prefix, and passes them here whole.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
from rocksdict import SstFileWriter

from dupalign.kernel_cache import njit
from dupalign.store.database import Batch, PrefixReader, Store
from dupalign.store.keys import read_u64, u64
from dupalign.store.options import table_file_options

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

FAMILY = "oph"
COUNT = struct.Struct("<I")
# a list entry's key: the list (bin ‖ min-hash) then the page, big-endian so that keys sort
# by list, then page
LIST_KEY = np.dtype([("bin", ">u2"), ("key", ">u8"), ("ordinal", ">u8")])
_LIST_ID = np.dtype([("bin", ">u2"), ("key", ">u8")])  # a list's name: its keys' prefix
_BIN = struct.Struct(">H")
RUN_SEQ = b"\xff\xff\xff\xff"
ENTRIES_KEY = b"lists_entries"  # (meta) the entries and runs are in the store

# a list entry's value by its page's number of windows in the list: empty for one (most
# lists), else the count; looked up by numpy for the common counts (not packed one by one
# in a Python loop: a templated llvm page has hundreds of lists with several windows)
_COUNT_VALUES = np.array([b"", b""] + [COUNT.pack(n) for n in range(2, 256)], dtype=object)


def entries(bins: I64, keys: U64, ordinal: int) -> npt.NDArray[Any]:
    """The page ``ordinal``'s entries in the lists (bin, key), as ``LIST_KEY`` records."""
    out = np.empty(len(bins), dtype=LIST_KEY)
    out["bin"], out["key"], out["ordinal"] = bins, keys, ordinal
    return out


def count_values(n_windows: I64) -> list[bytes]:
    """The list entries' values for ``n_windows`` (each >= 1) windows of the page."""
    values = _COUNT_VALUES[np.minimum(n_windows, len(_COUNT_VALUES) - 1)]
    for y in np.flatnonzero(n_windows >= len(_COUNT_VALUES)).tolist():
        values[y] = COUNT.pack(int(n_windows[y]))
    return cast(list[bytes], values.tolist())


def as_bytes(records: npt.NDArray[Any]) -> list[bytes]:
    """Each record of a structured array as its bytes (as a void dtype: ``S`` would strip
    trailing zero bytes); a tenth of the cost of slicing them out of ``tobytes`` in Python."""
    return cast(list[bytes], records.view(f"V{records.dtype.itemsize}").tolist())


def joined(records: Iterable[npt.NDArray[Any]]) -> bytes:
    """Arrays of entries as ``LIST_KEY`` records in one buffer (not ``np.concatenate``: it
    would give them numpy's native byte order, and the keys would no longer sort)."""
    return b"".join(np.ascontiguousarray(e, dtype=LIST_KEY).tobytes() for e in records)


def from_bytes(raw: bytes) -> npt.NDArray[Any]:
    """Entries from ``joined``."""
    return np.frombuffer(raw, dtype=LIST_KEY)


def prefixes(bins: I64, keys: U64) -> list[bytes]:
    """The prefix of each list (bin, key)."""
    out = np.empty(len(bins), dtype=_LIST_ID)
    out["bin"], out["key"] = bins, keys
    return as_bytes(out)


def prefix(bin_: int, key: int) -> bytes:
    return _BIN.pack(bin_) + u64(key)


def names(list_prefixes: list[bytes]) -> tuple[I64, U64]:
    """The (bins, keys) of lists by their prefixes."""
    named = np.frombuffer(b"".join(list_prefixes), dtype=_LIST_ID)
    return named["bin"].astype(np.int64), named["key"].astype(np.uint64)


def derived(family: str, key: bytes) -> bool:
    """Whether a key is one that a store's forward records give again: a list entry or run
    (not a long mark, which is the prefix alone), or the ``lists_entries`` key that says they
    are in the store. A list shard's changelog leaves these out (``rebuild_entries`` in
    dupalign.passage.lists.files)."""
    if family == FAMILY:
        return len(key) != _LIST_ID.itemsize
    return family == "meta" and key == ENTRIES_KEY


def reader(store: Store) -> PrefixReader:
    """Reads of many lists through one iterator, seeing the store as it is now."""
    return store.prefix_reader(FAMILY)


class StoredList(NamedTuple):
    """A list read from the store (``read``): marked long (nothing else read), or its run's
    entries (ordinals, ascending; empty without one) and key, then its later pages' keys
    and values."""

    marked: bool
    run: I64
    run_key: bytes | None
    keys: list[bytes]
    values: list[bytes]

    def keys_read(self) -> int:
        return 1 if self.marked else len(self.keys) + (self.run_key is not None)

    def windows(self) -> int:
        """The entries of the later pages (a page with n windows in the list counts n)."""
        return sum(1 if not v else COUNT.unpack(v)[0] for v in self.values)

    def windows_of(self, ordinal: int) -> int:
        """The entries of the page ``ordinal``."""
        own = u64(ordinal)
        return int(np.count_nonzero(self.run == ordinal)) + sum(
            1 if not v else COUNT.unpack(v)[0]
            for k, v in zip(self.keys, self.values, strict=True) if k.endswith(own))

    def stored_keys(self) -> list[bytes]:
        """Every key read (the run's first): what packing the list replaces."""
        return self.keys if self.run_key is None else [self.run_key, *self.keys]


_NO_RUN = np.empty(0, dtype=np.int64)


def read(lists: PrefixReader, list_prefix: bytes, limit: int) -> StoredList | None:
    """The list ``list_prefix``, at most ``limit`` keys of it (None: absent)."""
    ks, vs = lists.items(list_prefix, limit, header=True)
    if not ks:
        return None
    if len(ks[0]) == len(list_prefix):  # the list's long mark
        return StoredList(True, _NO_RUN, None, [], [])
    if ks[0][-4:] == RUN_SEQ:
        run = decode_run(np.frombuffer(vs[0], dtype=np.uint8))
        return StoredList(False, run, ks[0], ks[1:], vs[1:])
    return StoredList(False, _NO_RUN, None, ks, vs)


def entry_ordinals(keys: list[bytes], values: list[bytes]) -> I64:
    """The ordinals of later pages' entries (``StoredList.keys``/``values`` of one or more
    lists, in order), a page with n windows in a list repeated n times."""
    ords = np.frombuffer(b"".join(keys), dtype=LIST_KEY)["ordinal"].astype(np.int64)
    return np.repeat(ords, [1 if not v else COUNT.unpack(v)[0] for v in values])


def packed(list_prefix: bytes, ordinals: I64, replaced: list[bytes]
           ) -> tuple[bytes, bytes, list[bytes]]:
    """The run of a list's entries ``ordinals`` (ascending) that replaces its keys
    ``replaced``, for ``put_run``."""
    return (list_prefix + u64(int(ordinals[-1])) + RUN_SEQ, encode_run(ordinals).tobytes(),
            replaced)


def put_run(batch: Batch, run: tuple[bytes, bytes, list[bytes]]) -> None:
    run_key, value, replaced = run
    batch.put(FAMILY, run_key, value)
    for key in replaced:
        batch.delete(FAMILY, key)


def put_marks(batch: Batch, marks: dict[bytes, int]) -> None:
    """Mark the lists ``marks`` (prefix -> entries) long."""
    for list_prefix, n in marks.items():
        batch.put(FAMILY, list_prefix, u64(n))


def put_entries(batch: Batch, records: npt.NDArray[Any], n_windows: I64) -> None:
    """Entries (``LIST_KEY`` records) with their pages' windows in each list."""
    batch.put_many(FAMILY, as_bytes(records), count_values(n_windows))


def remove_pages(batch: Batch, lists: PrefixReader, list_prefix: bytes, lo: int, hi: int,
                 dead: I64, gone: set[int]) -> None:
    """Delete the entries of the pages ``dead`` (``gone``: the same as a set; ``lo``, ``hi``:
    the first and last of them in the list) from the list: their own keys, and from its run
    if it reaches them (rewritten without them)."""
    # a run is keyed by its last ordinal: at most one reaches the range, then later pages
    keys, values = lists.items_between(list_prefix, list_prefix + u64(lo),
                                       list_prefix + u64(hi + 1))
    n = len(list_prefix)
    for key, value in zip(keys, values, strict=True):
        if key.endswith(RUN_SEQ):
            run = decode_run(np.frombuffer(value, dtype=np.uint8))
            kept = run[~np.isin(run, dead)]
            if len(kept) == len(run):
                continue
            batch.delete(FAMILY, key)
            if len(kept):  # its key names its last ordinal
                batch.put(FAMILY, list_prefix + u64(int(kept[-1])) + RUN_SEQ,
                          encode_run(kept).tobytes())
        elif len(key) == LIST_KEY.itemsize and read_u64(key, n) in gone:
            batch.delete(FAMILY, key)


def write_file(path: str, records: npt.NDArray[Any], counts: I64) -> None:
    """Entries (``LIST_KEY`` records of pages in ascending order, each page's distinct) with
    their window counts, as one table file at ``path`` in key order, for ``ingest``."""
    # stable by list: within a list the pages keep their (ascending) order
    order = np.lexsort((records["key"].astype(np.uint64), records["bin"].astype(np.uint64)))
    keys = as_bytes(records[order])
    values = count_values(counts[order])
    writer = SstFileWriter(options=table_file_options(FAMILY))
    writer.open(path)
    for key, value in zip(keys, values, strict=True):
        writer[key] = value
    writer.finish()


def ingest(store: Store, paths: list[str]) -> None:
    """Table files from ``write_file`` into the lists."""
    store.ingest(FAMILY, paths)


@njit(cache=True)
def encode_run(ords: I64) -> npt.NDArray[np.uint8]:
    """Ascending ordinals as LEB128 varint deltas (the first from 0)."""
    out = np.empty(10 * ords.shape[0], dtype=np.uint8)
    n = 0
    prev = 0
    for o in ords:
        d = o - prev
        prev = o
        while d >= 0x80:
            out[n] = (d & 0x7F) | 0x80
            d >>= 7
            n += 1
        out[n] = d
        n += 1
    return out[:n]


@njit(cache=True)
def decode_run(raw: npt.NDArray[np.uint8]) -> I64:
    n = 0
    for byte in raw:
        n += byte < 0x80
    out = np.empty(n, dtype=np.int64)
    acc, shift, prev, x = np.int64(0), 0, np.int64(0), 0
    for byte in raw:
        acc |= np.int64(byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            prev += acc
            out[x] = prev
            x += 1
            acc, shift = np.int64(0), 0
    return out
