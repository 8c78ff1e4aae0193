"""The RocksDB store: one database, one column family per kind of entry, raw bytes
(the families and their keys: ``dupalign.store.keys``).

Keys are big-endian so that byte order is numeric order. rocksdict has no merge operator,
so everything that grows (inverted lists, offsets) is written as append-style keys and
read back by prefix scans. Everything one page writes goes into one WriteBatch, which
RocksDB applies atomically (also across a crash).

A service that keeps a changelog of the store (Kafka) attaches an observer (``observe``): it is
handed what each write changed, as plain ``Change`` tuples, after the write; ``apply`` writes
such changes into another store (a restore). Unobserved, a batch notes nothing.

Every call into RocksDB that can fail raises :class:`StoreError` (operation, directory,
cause), never rocksdict's plain ``Exception``: a full disk, an I/O error, a read-only file
system, corruption or a held lock is a failure of the store, which callers must not mistake
for a problem with the page being processed. Only in-memory WriteBatch building is not
wrapped (it fails on programming errors alone).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice, repeat
from pathlib import Path
from typing import Any, cast

import msgpack
from rocksdict import (
    AccessType,
    Cache,
    IngestExternalFileOptions,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteBufferManager,
)

from dupalign.errors import StoreMismatch, StoreUnavailable
from dupalign.store.failures import missing_store, open_failure, store_error
from dupalign.store.keys import FAMILIES, PREFIX_LENGTHS, u64
from dupalign.store.options import BLOCK_CACHE_BYTES, family_options, total_order

# How to get a store this version reads from one it does not: the pages are not kept.
# What one write changed, key by key, in order: (family, key, value); value None: deleted.
Change = tuple[str, bytes, bytes | None]
Observer = Callable[[list[Change]], None]

REBUILD = ("rebuild it by processing the pages again into a new store (dupalign scan --store "
           "NEW ..., or a worker with a new store.path)")


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


class _NotingBatch(Batch):
    """A batch of an observed store: also notes its changes. A range delete is noted as the
    point deletes of the keys it removes, found when the batch is written (``changes``): a
    compacted log keeps the last record per key, and a range record would keep forever."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.noted: list[Change] = []
        self.ranges: list[tuple[int, str, bytes, bytes]] = []  # (position in noted, range)

    def put(self, family: str, key: bytes, value: bytes) -> None:
        super().put(family, key, value)
        self.noted.append((family, key, value))

    def put_many(self, family: str, keys: list[bytes], values: list[bytes]) -> None:
        super().put_many(family, keys, values)
        self.noted.extend(zip(repeat(family), keys, values))

    def delete(self, family: str, key: bytes) -> None:
        super().delete(family, key)
        self.noted.append((family, key, None))

    def delete_range(self, family: str, begin: bytes, end: bytes) -> None:
        super().delete_range(family, begin, end)
        self.ranges.append((len(self.noted), family, begin, end))

    def changes(self) -> list[Change]:
        """What the batch changes, its range deletes as the keys they remove: those in the
        store (read now, before the write) and those the batch put before the range."""
        if not self.ranges:
            return self.noted
        out: list[Change] = []
        at = 0
        for pos, family, begin, end in self.ranges:
            out += self.noted[at:pos]
            at = pos
            gone = dict.fromkeys(self._store._keys_between(family, begin, end))
            gone.update(dict.fromkeys(k for f, k, v in out if f == family and begin <= k < end
                                      and v is not None))
            out += [(family, k, None) for k in gone]
        out += self.noted[at:]
        return out


class Store:
    """The engine's RocksDB database. Open with the engine's frozen parameters: a new store
    records them, an existing one must have been created with the same ones."""

    def __init__(self, path: str | Path, params: dict[str, Any], read_only: bool = False,
                 implied: dict[str, Any] | None = None,
                 upgrades: dict[str, tuple[Any, ...]] | None = None,
                 block_cache_bytes: int = BLOCK_CACHE_BYTES,
                 memtable_bytes: int = 0,
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
        opts = family_options()
        if memtable_bytes:  # every family's memtables together (0: each family its own)
            # a flush trigger, without its write stall: the stall waits until memory falls
            # to half the budget, which the empty hash memtable of ``oph`` (8 MB of buckets)
            # may never allow, and writers then hang for good (facebook/rocksdb#11780). The
            # families' write buffers (``family_options``) bound a writer that outruns the
            # flushes.
            opts.set_write_buffer_manager(WriteBufferManager(memtable_bytes, False))
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
        families = {name: family_options(name, cache, memtable_bytes) for name in FAMILIES}
        try:
            if (self.path / "CURRENT").exists():
                existing = set(Rdict.list_cf(str(self.path), opts))
                if read_only:
                    families = {n: o for n, o in families.items() if n in existing
                                and (only is None or n in only)}
                else:  # every family must be opened for writing, those of older formats too
                    families.update({n: family_options(n, cache, memtable_bytes) for n in existing
                                     if n not in families and n != "default"})
            self._db = Rdict(str(self.path), opts, column_families=families, access_type=access)
        except Exception as exc:  # rocksdict raises plain Exception("IO error: ...")
            raise StoreUnavailable(open_failure(self.path, str(exc))) from None
        self._handles = {name: self._db.get_column_family_handle(name) for name in families}
        self._cfs = {name: self._db.get_column_family(name) for name in families}
        self._same_prefix = ReadOptions()
        self._same_prefix.set_prefix_same_as_start(True)
        self._total_order = total_order()
        self._observer: Observer | None = None
        self._check_params(params, read_only, implied or {}, upgrades or {})

    def observe(self, observer: Observer | None) -> None:
        """Hand what every later write changes to ``observer`` (None: stop), after the write
        succeeded. Batches made before must not be written after (``write`` refuses them)."""
        self._observer = observer

    def apply(self, changes: Iterable[Change]) -> None:
        """Write ``changes`` in order, in one batch, without telling the observer (a restore
        from a changelog; ``observe``)."""
        wb = WriteBatch(raw_mode=True)
        handles = self._handles
        for family, key, value in changes:
            if value is None:
                wb.delete(key, handles[family])
            else:
                wb.put(key, value, handles[family])
        try:
            self._db.write(wb)
        except Exception as exc:
            raise store_error("write", self.path, exc) from exc

    def _keys_between(self, family: str, begin: bytes, end: bytes) -> list[bytes]:
        ropts = total_order()
        ropts.set_iterate_upper_bound(end)
        try:
            return [cast(bytes, k) for k in self._cfs[family].keys(from_key=begin, read_opt=ropts)]
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

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
        if self._observer is not None:
            self._observer([(family, key, value)])

    def prefix(self, family: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """All entries whose key starts with ``prefix``, in key order."""
        ropts = total_order()
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
                ropts = total_order()
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
                            if family in PREFIX_LENGTHS else total_order(), self.path)

    def items(self, family: str) -> Iterator[tuple[bytes, bytes]]:
        return self.items_from(family, None)

    def items_from(self, family: str, start: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """The family's entries in key order, from key ``start`` on (None: all)."""
        cf = self._cfs[family]
        try:
            it = cf.iter(total_order())
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
            yield from cf.keys(read_opt=total_order())
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def first_key(self, family: str, prefix: bytes) -> bytes | None:
        """The first key of ``family`` that starts with ``prefix`` (None: none): one seek,
        with read options made once (``prefix`` made them and a generator a lookup, about
        a third of its cost)."""
        cf = self._cfs[family]
        try:
            it = cf.iter(self._total_order)
            it.seek(prefix)
            if it.valid():
                key = bytes(it.key())
                return key if key.startswith(prefix) else None
            it.status()
            return None
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def last_key(self, family: str) -> bytes | None:
        cf = self._cfs[family]
        try:
            it = cf.iter(total_order())
            it.seek_to_last()
            if it.valid():
                return bytes(it.key())
            it.status()
            return None
        except Exception as exc:
            raise store_error("read", self.path, exc) from exc

    def batch(self) -> Batch:
        return Batch(self) if self._observer is None else _NotingBatch(self)

    def write(self, batch: Batch) -> None:
        observer = self._observer
        changes = None
        if observer is not None:
            if not isinstance(batch, _NotingBatch):
                raise RuntimeError("a batch made before the store was observed: its changes "
                                   "were not noted")
            changes = batch.changes()  # (its range deletes read the store before the write)
        try:
            self._db.write(batch._wb)
        except Exception as exc:
            raise store_error("write", self.path, exc) from exc
        if observer is not None and changes:
            observer(changes)

    def ingest(self, family: str, paths: list[str]) -> None:
        """Table files (rocksdict ``SstFileWriter``, the family's options) into ``family``,
        moved in, their keys newer than every write before. Not in an observed store: what
        the files hold is not noted."""
        if self._observer is not None:
            raise RuntimeError("an observed store cannot ingest table files: their changes "
                               "would be missing from its changelog")
        opts = IngestExternalFileOptions()
        opts.set_move_files(True)
        opts.set_allow_global_seqno(True)  # (files and memtable may share key ranges)
        opts.set_allow_blocking_flush(True)
        try:
            self._cfs[family].ingest_external_file(paths, opts)
        except Exception as exc:
            raise store_error("write", self.path, exc) from exc

    def memory_bytes(self) -> dict[str, int]:
        """RocksDB's memory: the block cache in use, every family's memtables, and the
        index and filter blocks of open table files held outside the block cache."""
        def total(prop: str) -> int:
            return sum(int(cf.property_int_value(prop) or 0) for cf in self._cfs.values())
        any_cf = next(iter(self._cfs.values()))
        return {"blocks": int(any_cf.property_int_value("rocksdb.block-cache-usage") or 0),
                "memtables": total("rocksdb.cur-size-all-mem-tables"),
                "table_readers": total("rocksdb.estimate-table-readers-mem")}

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
