"""The RocksDB store: one database, one column family per kind of entry, raw bytes.

Keys are big-endian so that byte order is numeric order. rocksdict has no merge operator,
so everything that grows (inverted lists, offsets) is written as append-style keys and
read back by prefix scans. Everything one page writes goes into one WriteBatch, which
RocksDB applies atomically (also across a crash).

Every call into RocksDB that can fail raises :class:`StoreError` (operation, directory,
cause), never rocksdict's plain ``Exception``: a full disk, an I/O error, a read-only file
system, corruption or a held lock is a failure of the store, which callers must not mistake
for a problem with the page being processed. Only in-memory WriteBatch building is not
wrapped (it fails on programming errors alone).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice, repeat
from pathlib import Path
from typing import Any, cast

import msgpack
from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    IngestExternalFileOptions,
    MemtableFactory,
    Options,
    Rdict,
    ReadOptions,
    SliceTransform,
    WriteBatch,
)

from dupalign.errors import StoreError, StoreMismatch, StoreUnavailable

FAMILIES = (
    "meta",  # b"params" -> frozen engine parameters; b"idf/<version>" -> idf tables;
    # b"next_ordinal" -> the ordinal after the last one ever given (dupalign.stages.index);
    # b"lists_through" -> every page below has its inverted-list entries in ``oph``
    # (dupalign.passage.lists.files: the later pages' are read back from their forward records);
    # b"published/" ‖ topic ‖ partition -> an offset below which the Kafka worker published
    # every page's matches
    "docs",  # ordinal -> doc record (msgpack)
    "ids",  # doc id -> latest ordinal
    "replay",  # 16-byte hash of (doc id, body) -> ordinal ‖ how the body was read
    # (dupalign.text.tokens.reading; nothing after the ordinal in stores written before): a page
    # seen before
    "matches",  # ordinal -> the matches the page produced (msgpack), returned on replay
    "exact",  # content hash (16 B) ‖ ordinal -> b""
    "simhash",  # fingerprint ‖ ordinal -> b""
    "cws",  # ordinal -> K uint64 min-hashes of the page's word shingles (verification)
    "oph",  # bin ‖ min-hash value ‖ ordinal -> b"" or <u4 n: inverted lists of page
    # ordinals (the page has 1 or n windows in the list); bin ‖ min-hash value -> u64 n: the
    # list holds at least n entries (marks long lists); bin ‖ min-hash value ‖ ordinal ‖
    # 0xFFFFFFFF -> a run: every entry of the list up to that ordinal packed in one value,
    # varint deltas (dupalign.passage.index: packed when read)
    "forward",  # ordinal -> the page's windows: non-empty (bin, key, rectangle) and empty
    # (bin, l, r); with ``positions`` the page's forward record (dupalign.passage.forward)
    "positions",  # ordinal -> token character offsets (int32 starts, ends) and unit hashes
    "idf_pending",  # ordinal -> distinct token hashes, kept until the last idf freeze
    "offsets",  # topic ‖ partition -> next offset to consume
    "unfinished",  # ordinal -> the page's index result (dupalign.stages.index), until its matches
    # are stored: written with the page's index entries, finished (aligned) at open if a
    # crash came first
)

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


def u64(value: int) -> bytes:
    return _U64.pack(value)


def read_u64(data: bytes, at: int = 0) -> int:
    return int(_U64.unpack_from(data, at)[0])


def u32(value: int) -> bytes:
    return _U32.pack(value)


def ordinal_ranges(ordinals: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending distinct ordinals as maximal runs ``(first, last)`` of consecutive ones."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(int(x) for x in ordinals)):
        if out and out[-1][1] + 1 == o:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


# the families keyed by ordinal, which removal empties by ordinal ranges
ORDINAL_FAMILIES = ("docs", "matches", "unfinished", "cws", "forward", "positions")


def delete_ordinals(batch: Batch, families: Iterable[str], first: int, last: int) -> None:
    """Delete the keys ordinal ``first``..``last`` (keys that start with a big-endian u64
    ordinal) of each family: one point delete per key for a short run, one range delete
    (cheap to write, compacted away) for a longer one: many small range tombstones would
    slow reads."""
    for family in families:
        if last - first < 8:
            for o in range(first, last + 1):
                batch.delete(family, u64(o))
        else:
            batch.delete_range(family, u64(first), u64(last + 1))


def offsets_key(topic: str, partition: int) -> bytes:
    return topic.encode("utf-8") + b"\x00" + u32(partition)


def parse_offsets_key(key: bytes) -> tuple[str, int]:
    return key[:-5].decode("utf-8"), int(_U32.unpack_from(key, len(key) - 4)[0])


PUBLISHED_PREFIX = b"published/"  # meta keys: PUBLISHED_PREFIX ‖ offsets_key(...)


# -- records a service keeps in the engine's store --------------------------------------------
# They go in ``meta`` beside the engine's own, written in the engine's batches where they must
# be atomic with a page. Their keys are fixed by the stores already written, so each name maps
# to its key here: a service names them and never builds a key.
NOTES = {  # one value each
    "forward_sent": b"topology_forward_sent",  # the index role's forward records sent below
    "align_partitions": b"topology_align_partitions",  # the align partition count keyed by
    "applied_seq": b"applied_seq",  # a shard process's last sequence record applied
}
LOGS = {  # values by sequence number
    "outbox": b"outbox/",  # the index fan-in's keys messages per sequence record
    "partials": b"partial/",  # a shard process's partials per sequence record
}


def _note_key(name: str) -> bytes:
    key = NOTES.get(name)
    if key is None:
        raise KeyError(f"unknown store note {name!r}; known: {', '.join(NOTES)}")
    return key


def _log_prefix(log: str) -> bytes:
    prefix = LOGS.get(log)
    if prefix is None:
        raise KeyError(f"unknown store log {log!r}; known: {', '.join(LOGS)}")
    return prefix


def get_note(store: Store, name: str) -> bytes | None:
    return store.get("meta", _note_key(name))


def put_note(target: Store | Batch, name: str, value: bytes) -> None:
    target.put("meta", _note_key(name), value)


def log_items(store: Store, log: str) -> Iterator[tuple[int, bytes]]:
    """(sequence number, value) of ``log``, ascending."""
    prefix = _log_prefix(log)
    for key, value in store.prefix("meta", prefix):
        yield read_u64(key, len(prefix)), value


def log_get(store: Store, log: str, seq: int) -> bytes | None:
    return store.get("meta", _log_prefix(log) + u64(seq))


def log_put(batch: Batch, log: str, seq: int, value: bytes) -> None:
    batch.put("meta", _log_prefix(log) + u64(seq), value)


def log_delete(batch: Batch, log: str, seq: int) -> None:
    batch.delete("meta", _log_prefix(log) + u64(seq))


def log_delete_below(batch: Batch, log: str, end: int) -> None:
    """Delete the entries of ``log`` below sequence number ``end``."""
    prefix = _log_prefix(log)
    batch.delete_range("meta", prefix, prefix + u64(end))


def get_offset(store: Store, topic: str, partition: int) -> int | None:
    """The next input offset stored for (topic, partition) (None: none stored)."""
    raw = store.get("offsets", offsets_key(topic, partition))
    return None if raw is None else read_u64(raw)


def put_offset(batch: Batch, topic: str, partition: int, next_offset: int) -> None:
    batch.put("offsets", offsets_key(topic, partition), u64(next_offset))


def unfinished_records(store: Store) -> Iterator[bytes]:
    """The ``unfinished`` records (a store opened read-only made before the family: none)."""
    if store.has_family("unfinished"):
        for _, value in store.items("unfinished"):
            yield value


def forward_record(store: Store, ordinal: int) -> tuple[bytes, bytes] | None:
    """The page's forward record as stored: its windows and positions (None: it has none)."""
    windows = store.get("forward", u64(ordinal))
    positions = store.get("positions", u64(ordinal))
    return None if windows is None or positions is None else (windows, positions)


def stored_ordinals(store: Store, start: int = 0) -> Iterator[int]:
    """The ordinals of the pages stored, from ``start`` on, ascending."""
    for key, _ in store.items_from("docs", u64(start)):
        yield read_u64(key)


# Families read by prefix: the fixed key prefix that names one group (an inverted list is
# bin ‖ min-hash, 10 bytes). RocksDB keeps Bloom filters of these prefixes, so a seek to a
# list that does not exist (most lists a new page asks for) reads no data block
# (tests/bench/bench_store.py).
PREFIX_LENGTHS = {"oph": 10}
# Their memtables are hash tables of small skip lists, one per prefix: a page adds ~1,600
# list entries in one batch, and inserting them into one big skip list cost ~3 µs each
# (most of the index stage's store write on llvm); a bucket's list is short. Such a
# memtable answers a seek within one prefix only, so reads that cross prefixes ask for
# total order (``_total_order``) and RocksDB merges the buckets for them.
MEMTABLE_BUCKETS = 1 << 20


# How to get a store this version reads from one it does not: the pages are not kept.
REBUILD = ("rebuild it by processing the pages again into a new store (dupalign scan --store "
           "NEW ..., or a worker with a new store.path)")

BLOCK_CACHE_BYTES = 256 << 20  # uncompressed blocks shared by all families (default)
WAL_BYTES = 128 << 20  # write-ahead log kept at most (about): see _options


def _options(family: str | None = None, cache: Cache | None = None) -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(DBCompressionType.lz4())
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if cache is not None:
        # list reads are random over the whole store, so a small per-family cache holds
        # little of it (tests/bench/bench_store.py compares reads with plain options)
        table.set_block_cache(cache)
    opts.set_block_based_table_factory(table)
    opts.increase_parallelism(2)
    # A write-ahead log file is deleted only when every family with data in it has been
    # flushed; small families (ids, offsets, meta) seldom fill a memtable, so without a
    # bound the logs pile up (tests/bench/bench_lifecycle.py saw 650 MB of them under a
    # 150 MB store): past this size RocksDB flushes the families that hold the oldest.
    opts.set_max_total_wal_size(WAL_BYTES)
    # (one writer thread: concurrent memtable inserts gain nothing, and the hash memtables
    # below do not support them)
    opts.set_allow_concurrent_memtable_write(False)
    if family in PREFIX_LENGTHS:
        opts.set_prefix_extractor(SliceTransform.create_fixed_prefix(PREFIX_LENGTHS[family]))
        # (bucket count, skip list height, branching factor; rocksdict's stub omits them)
        opts.set_memtable_factory(MemtableFactory.hash_skip_list(  # type: ignore[call-arg]
            MEMTABLE_BUCKETS, 4, 4))
    return opts


def table_file_options(family: str) -> Options:
    """Options for table files written aside for ``family`` (``Store.ingest``)."""
    return _options(family)


def _total_order() -> ReadOptions:
    """Read options of a scan that may cross prefixes (see ``MEMTABLE_BUCKETS``)."""
    ropts = ReadOptions()
    ropts.set_total_order_seek(True)
    return ropts


def missing_store(path: str | Path) -> str | None:
    """Why there is no store at ``path`` to open read-only (None: there is one): cheap,
    so that a command says it before it imports the engine."""
    path = Path(path)
    if (path / "CURRENT").exists():
        return None
    return f"no store at {path}" + (
        " (the directory exists but holds no dupalign store)" if path.is_dir() else "")


class Batch:
    """A WriteBatch that names column families by string."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._wb = WriteBatch(raw_mode=True)

    def put(self, family: str, key: bytes, value: bytes) -> None:
        self._wb.put(key, value, self._store._handles[family])

    def put_many(self, family: str, keys: list[bytes], values: list[bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys, {len(values)} values")
        # the loop in C (map, drained by a zero-length deque): a page puts ~1,600 keys
        deque(map(self._wb.put, keys, values, repeat(self._store._handles[family])), 0)

    def delete(self, family: str, key: bytes) -> None:
        self._wb.delete(key, self._store._handles[family])

    def delete_range(self, family: str, begin: bytes, end: bytes) -> None:
        """Delete keys in [begin, end)."""
        self._wb.delete_range(begin, end, self._store._handles[family])

    def __len__(self) -> int:
        return int(self._wb.len())


class Store:
    """The engine's RocksDB database. Open with the engine's frozen parameters: a new store
    records them, an existing one must have been created with the same ones."""

    def __init__(self, path: str | Path, params: dict[str, Any], read_only: bool = False,
                 implied: dict[str, Any] | None = None,
                 upgrades: dict[str, tuple[Any, ...]] | None = None,
                 block_cache_bytes: int = BLOCK_CACHE_BYTES,
                 secondary: str | Path | None = None,
                 only: Iterable[str] | None = None) -> None:
        """``implied``: parameters added after some stores were made, with the value those
        stores were built with (a store that lacks one was built with that value).
        ``upgrades``: per parameter, older values a store may have that the asked value
        only extends (a later store format that adds optional entries): opened for
        writing, such a store is upgraded to the asked value, if nothing else differs.
        ``secondary``: open read-only as a RocksDB secondary instance (its own files in
        that directory) that follows the process writing the store (``catch_up``).
        ``only``: a reader that needs a few families opens only those (a secondary instance
        then replays only their part of the writer's log when it catches up)."""
        self.path = Path(path)
        self.secondary = secondary is not None
        read_only = read_only or self.secondary
        opts = _options()
        if self.secondary:  # keeps every table file open: the writer may delete them
            opts.set_max_open_files(-1)
            # a catch-up opens the writer's new table files on threads it starts and joins
            # each time (16 by default), which took longer than opening the files: one
            # here, the reading thread itself
            opts.set_max_file_opening_threads(1)
        if read_only:
            if (missing := missing_store(self.path)) is not None:
                raise StoreUnavailable(missing)
            access = (AccessType.secondary(str(secondary)) if secondary is not None
                      else AccessType.read_only())
        else:
            if self.path.exists() and not self.path.is_dir():
                raise StoreUnavailable(f"store path {self.path} is a file, not a directory")
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailable(f"cannot create the store directory {self.path}: "
                                       f"{exc.strerror}") from None
            access = AccessType.read_write()
        cache = Cache(block_cache_bytes)
        families = {name: _options(name, cache) for name in FAMILIES}
        try:
            if (self.path / "CURRENT").exists():
                existing = set(Rdict.list_cf(str(self.path), opts))
                if read_only:
                    families = {n: o for n, o in families.items() if n in existing
                                and (only is None or n in only)}
                else:  # every family must be opened for writing, those of older formats too
                    families.update({n: _options(n, cache) for n in existing
                                     if n not in families and n != "default"})
            self._db = Rdict(str(self.path), opts, column_families=families, access_type=access)
        except Exception as exc:  # rocksdict raises plain Exception("IO error: ...")
            raise StoreUnavailable(_open_failure(self.path, str(exc))) from None
        self._handles = {name: self._db.get_column_family_handle(name) for name in families}
        self._cfs = {name: self._db.get_column_family(name) for name in families}
        self._same_prefix = ReadOptions()
        self._same_prefix.set_prefix_same_as_start(True)
        self._check_params(params, read_only, implied or {}, upgrades or {})

    def _check_params(self, params: dict[str, Any], read_only: bool,
                      implied: dict[str, Any], upgrades: dict[str, tuple[Any, ...]]) -> None:
        stored = self.get("meta", b"params")
        if stored is None:
            if read_only:
                raise StoreMismatch(f"{self.path} has no engine parameters: not a dupalign store")
            self.put("meta", b"params", msgpack.packb(params))
            self.params = dict(params)
            return
        self.params = {**implied, **msgpack.unpackb(stored)}
        has, reads = self.params.get("format"), params.get("format")
        if "format" in params and has != reads and has not in upgrades.get("format", ()):
            raise StoreMismatch(f"store {self.path} has format {has!r}, which this version "
                                f"of dupalign does not read (it reads format {reads!r} and "
                                f"the ones it upgrades): {REBUILD}")
        if read_only:  # a reader takes the store's parameters, if it can read its format
            return
        diff = {
            k: (self.params.get(k), params.get(k))
            for k in set(self.params) | set(params)
            if self.params.get(k) != params.get(k)
        }
        if diff and all(a in upgrades.get(k, ()) for k, (a, _) in diff.items()):
            self.params.update({k: b for k, (_, b) in diff.items()})
            self.put("meta", b"params", msgpack.packb(self.params))
            return
        if diff:
            detail = ", ".join(f"{k}: store has {a!r}, asked for {b!r}" for k, (a, b) in
                               sorted(diff.items()))
            raise StoreMismatch(f"store {self.path} was built with other parameters ({detail}); "
                                "use the same config or a new store")

    def catch_up(self) -> bool:
        """A secondary instance: see what the writer wrote since (returns True); any other
        instance sees its own writes already (returns False)."""
        if not self.secondary:
            return False
        try:
            self._db.try_catch_up_with_primary()
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc
        return True

    def has_family(self, family: str) -> bool:
        return family in self._cfs

    def get(self, family: str, key: bytes) -> bytes | None:
        cf = self._cfs[family]
        try:
            value = cf.get(key)
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc
        return None if value is None else bytes(value)

    def multi_get(self, family: str, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        cf = self._cfs[family]
        try:
            found: list[bytes | None] = cf.get(keys)  # type: ignore[arg-type,assignment]
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc
        return found

    def put(self, family: str, key: bytes, value: bytes) -> None:
        cf = self._cfs[family]
        try:
            cf[key] = value
        except Exception as exc:
            raise store_error("write", self.path, exc) from exc

    def prefix(self, family: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """All entries whose key starts with ``prefix``, in key order."""
        ropts = _total_order()
        upper = _prefix_upper_bound(prefix)
        if upper is not None:
            ropts.set_iterate_upper_bound(upper)
        cf = self._cfs[family]
        try:
            it = cf.iter(ropts)
            it.seek(prefix)
            while it.valid():
                yield it.key(), it.value()
                it.next()
            it.status()  # an iterator stops on a read error: tell it from the end of data
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def prefix_items(
        self, family: str, prefix: bytes, limit: int | None = None
    ) -> list[tuple[bytes, bytes]]:
        """Like ``prefix`` but materialized (at most ``limit`` entries), iterated in Rust."""
        fixed = PREFIX_LENGTHS.get(family)
        if fixed == len(prefix):
            # exactly the family's fixed prefix: iteration ends where it changes, and the
            # prefix Bloom filters skip the files without it
            ropts = self._same_prefix
        else:
            if fixed is not None and len(prefix) > fixed:
                ropts = ReadOptions()
                ropts.set_prefix_same_as_start(True)
            else:
                ropts = _total_order()
            upper = _prefix_upper_bound(prefix)
            if upper is not None:
                ropts.set_iterate_upper_bound(upper)
        cf = self._cfs[family]
        try:
            items = cast(Iterator[tuple[bytes, bytes]], cf.items(from_key=prefix, read_opt=ropts))
            return list(items if limit is None else islice(items, limit))
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def prefix_reader(self, family: str) -> PrefixReader:
        """Many prefix reads through one iterator (see :class:`PrefixReader`)."""
        return PrefixReader(self._cfs[family], self._same_prefix
                            if family in PREFIX_LENGTHS else _total_order(), self.path)

    def items(self, family: str) -> Iterator[tuple[bytes, bytes]]:
        return self.items_from(family, None)

    def items_from(self, family: str, start: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """The family's entries in key order, from key ``start`` on (None: all)."""
        cf = self._cfs[family]
        try:
            it = cf.iter(_total_order())
            if start is None:
                it.seek_to_first()
            else:
                it.seek(start)
            while it.valid():
                yield it.key(), it.value()
                it.next()
            it.status()
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def keys(self, family: str) -> Iterator[bytes]:
        """Every key of ``family`` in order (rocksdict's key iterator: 2x faster than
        ``items`` where values are not needed)."""
        cf = self._cfs[family]
        try:
            yield from cf.keys(read_opt=_total_order())
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def last_key(self, family: str) -> bytes | None:
        cf = self._cfs[family]
        try:
            it = cf.iter(_total_order())
            it.seek_to_last()
            if it.valid():
                return bytes(it.key())
            it.status()
            return None
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def batch(self) -> Batch:
        return Batch(self)

    def write(self, batch: Batch) -> None:
        try:
            self._db.write(batch._wb)
        except Exception as exc:
            raise store_error("write", self.path, exc) from exc

    def ingest(self, family: str, paths: list[str]) -> None:
        """Table files (rocksdict ``SstFileWriter``, the family's options) into ``family``,
        moved in, their keys newer than every write before."""
        opts = IngestExternalFileOptions()
        opts.set_move_files(True)
        opts.set_allow_global_seqno(True)  # (files and memtable may share key ranges)
        opts.set_allow_blocking_flush(True)
        try:
            self._cfs[family].ingest_external_file(paths, opts)
        except Exception as exc:
            raise store_error("write", self.path, exc) from exc

    def size_bytes(self) -> int:
        total = 0
        try:
            for cf in self._cfs.values():
                total += int(cf.property_int_value("rocksdb.total-sst-files-size") or 0)
                total += int(cf.property_int_value("rocksdb.size-all-mem-tables") or 0)
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc
        return total

    def compact(self) -> None:
        """Compact every family now (what removals deleted leaves the files; RocksDB would
        do it in the background, later)."""
        try:
            for cf in self._cfs.values():
                cf.compact_range(None, None)
        except Exception as exc:
            raise store_error("compact", self.path, exc) from exc

    def compact_ordinals(self, families: Iterable[str], first: int, last: int) -> None:
        """Compact the keys ordinal ``first``..``last`` of ordinal-keyed families: after a
        retention sweep's range deletes, so the space comes back now rather than whenever
        RocksDB's background compaction reaches those files."""
        try:
            for family in families:
                self._cfs[family].compact_range(u64(first), u64(last + 1))
        except Exception as exc:
            raise store_error("compact", self.path, exc) from exc

    def flush(self) -> None:
        try:
            for cf in self._cfs.values():
                cf.flush()
        except Exception as exc:
            raise store_error("flush", self.path, exc) from exc

    def close(self) -> None:
        self._cfs.clear()
        self._handles.clear()
        db = self._db
        del self._db
        try:
            db.close()
            return
        except Exception as exc:
            error = store_error("close", self.path, exc)
            error.__cause__ = exc
        # After a failed close (a full or read-only disk), dropping the last reference still
        # releases RocksDB's files; the traceback must not keep it.
        del db
        raise error


# What RocksDB's messages say, in the words an operator searches for (the message itself,
# e.g. "IO error: No space left on device: While appending to file: .../000004.log: No
# space left on device", stays chained to the StoreError).
_CAUSES = (
    ("no space left on device", "no space left on device"),
    ("read-only file system", "read-only file system"),
    ("input/output error", "input/output error"),
    ("while lock file", "locked by another process"),
    ("lock hold by current process", "already open in this process"),
    ("permission denied", "permission denied"),
)


def store_error(operation: str, path: Path, exc: BaseException) -> StoreError:
    """The StoreError for rocksdict's exception ``exc`` during ``operation``."""
    if isinstance(exc, StoreError):
        return exc
    text = str(exc).strip() or type(exc).__name__
    lowered = text.lower()
    cause = next((short for needle, short in _CAUSES if needle in lowered), text)
    return StoreError(operation, path, cause)


def _open_failure(path: Path, error: str) -> str:
    """One line saying why RocksDB could not open ``path`` (and who holds its lock)."""
    if "lock" in error.lower():
        holder = lock_holder(path / "LOCK")
        who = f" by {holder}" if holder else " by another process"
        if "current process" in error:
            who = " by this process (it is already open)"
        return (f"store {path} is locked{who}: one process at a time can write a store "
                "(stop it, or use another --store)")
    if "Permission denied" in error or "Read-only file system" in error:
        return f"store {path} is not writable: {error}"
    return f"cannot open store {path}: {error}"


def lock_holder(lock_file: Path) -> str | None:
    """'pid N (command)' of the process holding a POSIX lock on ``lock_file``, from
    /proc/locks (Linux); None if unknown."""
    try:
        inode = lock_file.stat().st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:  # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        fields = line.split()
        if len(fields) > 5 and fields[5].rsplit(":", 1)[-1] == str(inode):
            pid = fields[4]
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = " ".join(fh.read().decode(errors="replace").replace("\0", " ").split())
            except OSError:
                cmd = ""
            return f"pid {pid}" + (f" ({cmd[:120]})" if cmd else "")
    return None


def _prefix_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class PrefixReader:
    """Prefix reads that share one RocksDB iterator: creating an iterator per read costs
    more than reading a short list with it (tests/bench/bench_store.py). The iterator sees
    the store as it was when the reader was made, so make one per query, after the writes
    it must see."""

    def __init__(self, cf: Rdict, ropts: ReadOptions, path: Path) -> None:
        self._path = path
        try:
            self._it = cf.iter(ropts)
        except Exception as exc:
            raise store_error("read", path, exc) from exc

    def items_between(self, prefix: bytes, start: bytes, stop: bytes
                      ) -> tuple[list[bytes], list[bytes]]:
        """Keys and values of the group ``prefix`` from key ``start`` on, up to and
        including the first key >= ``stop`` (a caller that needs the entry just past a
        range, e.g. a run keyed by its last member, gets it without another seek)."""
        it = self._it
        keys: list[bytes] = []
        values: list[bytes] = []
        n = len(prefix)
        try:
            it.seek(start)
            while it.valid():
                key = it.key()
                if key[:n] != prefix:
                    break
                keys.append(key)
                values.append(it.value())
                if key >= stop:
                    break
                it.next()
            if not it.valid():
                it.status()
        except Exception as exc:
            raise store_error("read", self._path, exc) from exc
        return keys, values

    def present(self, prefixes: list[bytes]) -> list[int]:
        """Indices of the ``prefixes`` that start at least one key: one seek each, nothing
        read. Most lists a page names are new, and reading each with ``items`` cost about
        three times this (cProfile of the index stage on the llvm pages)."""
        it = self._it
        seek, valid, key_of, status = it.seek, it.valid, it.key, it.status  # hot loop
        found: list[int] = []
        try:
            for y, prefix in enumerate(prefixes):
                seek(prefix)
                if valid():
                    if key_of().startswith(prefix):
                        found.append(y)
                else:
                    status()  # invalid after a read error too, not only past the data
        except Exception as exc:
            raise store_error("read", self._path, exc) from exc
        return found

    def items(self, prefix: bytes, limit: int | None = None, header: bool = False
              ) -> tuple[list[bytes], list[bytes]]:
        """Keys and values of the entries starting with ``prefix`` (at most ``limit``).
        With ``header``, an entry whose key is ``prefix`` itself (it sorts first: a group's
        header) is returned alone, without reading the group."""
        it = self._it
        valid, key_of, value_of, step = it.valid, it.key, it.value, it.next  # hot loop
        keys: list[bytes] = []
        values: list[bytes] = []
        try:
            it.seek(prefix)
            n = len(prefix)
            left = -1 if limit is None else limit
            while left and valid():
                key = key_of()
                if key[:n] != prefix:
                    break
                if header and key == prefix:  # only the first key can equal the prefix
                    return [key], [value_of()]
                keys.append(key)
                values.append(value_of())
                step()
                left -= 1
            if not valid():
                it.status()  # invalid after a read error, not only at the end of the data
        except Exception as exc:
            raise store_error("read", self._path, exc) from exc
        return keys, values
