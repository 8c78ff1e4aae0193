"""Inverted-list entries written behind the index thread, as table files.

A page with passages adds one entry to each inverted list of its windows (~1,400 on an
llvm page): written in the page's batch, each would be one RocksDB memtable insert in the
index thread, which must run alone (rocksdict holds the GIL through a write), and again a
sort of the whole hash memtable in RocksDB's flush thread: together about a third of the
index stage and a tenth of all the CPU on llvm (tests/bench/bench_scan.py). Here the
entries of committed pages wait in memory (``PendingLists``, which reads see through
``recent``) until ``FILE_PAGES`` pages have some; then they are sorted into a table file
(``build_list_file``: a pure function, so a pool process can run it) and ingested whole.

Crash safety: the store's ``lists_through`` mark says below which ordinal every page's entries
are in the store. The entries of a page are its forward record's lists (the same pairs,
counted per list), which is in the page's own batch, so at open the pages from the mark on
are read back from their forward records (``PassageIndex.write_lists_behind``). A file's
mark goes into the next batch written after its ingest (``mark_due``): the batch that may
pack the file's entries into runs, or rewrite them for a removal, so that entries are never
written again over a run that holds them; a crash before it writes the file's entries
again: the same keys and values.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from dupalign.passage import forward
from dupalign.passage.lists.chains import ListChains
from dupalign.passage.sketch import distinct_lists
from dupalign.store import lists, tables
from dupalign.store.database import Batch, Store
from dupalign.store.failures import store_error

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

# pages with entries per table file (~50 MB of entries on llvm pages; held in memory with
# the file in flight and the next). RocksDB compacts each ingested file into the level
# below, so files must not be small: process CPU on the scale stream (bench_passages) at
# 60,000 pages was 6.23 ms a page with 1,024-page files and 5.17 with 2,048, against 5.47
# with the memtable (compacting half as much new data at a time rewrites the level below
# twice as often)
FILE_PAGES = 2048
INCOMING = "lists-incoming"  # the store's subdirectory of files not ingested yet


def build_list_file(arg: tuple[str, bytes, bytes]) -> str:
    """``(path, entries, counts)`` -> path: the list entries (``lists.joined``, of pages in
    ascending order, each page's distinct) with their window counts (<u4), as one table
    file at ``path``. Pure: runs in any process."""
    path, raw, raw_counts = arg
    lists.write_file(path, lists.from_bytes(raw),
                     np.frombuffer(raw_counts, dtype="<u4").astype(np.int64))
    return path


class Handle(Protocol):
    """A submitted build (a pool call or a future)."""

    def done(self) -> bool: ...
    def cancel(self) -> bool: ...
    def result(self, timeout: float | None = None) -> Any: ...


Submit = Callable[[Callable[[Any], Any], Any], Handle]
# a page pending: its ordinal, its list entries (``lists.entries``), its windows per entry
PendingPage = tuple[int, npt.NDArray[Any], I64]
BuildArg = tuple[str, bytes, bytes]  # ``build_list_file``'s
# the last file (``drain(into_file=True, parts=N)``) is split in key ranges only from this
# many entries on (~70 llvm pages): below it the split costs more than it spreads
SPLIT_ENTRIES = 1 << 16
SAMPLE = 4096  # entries the key ranges' cuts are chosen from


def split_entries(records: npt.NDArray[Any], counts: I64, parts: int
                  ) -> list[tuple[npt.NDArray[Any], I64]]:
    """``records`` (``LIST_KEY``, pages in ascending order) and their ``counts`` in up to
    ``parts`` disjoint ranges of list names (bin, key), of about as many entries each (cut at
    the quantiles of an even sample), each in the order it had: each range is a table file of
    its own, and the files' keys do not overlap (a list's entries are all in one)."""
    n = len(records)
    if parts < 2 or n < SPLIT_ENTRIES:
        return [(records, counts)]
    sample = records[np.linspace(0, n - 1, min(n, SAMPLE)).astype(np.int64)]
    order = np.lexsort((sample["key"].astype(np.uint64), sample["bin"].astype(np.uint64)))
    bins, keys = records["bin"].astype(np.int64), records["key"].astype(np.uint64)
    part = np.zeros(n, dtype=np.int64)
    for q in range(1, parts):  # a range's number: how many cuts its names are not below
        cut = sample[order[q * len(sample) // parts]]
        cb, ck = int(cut["bin"]), np.uint64(cut["key"])
        part += (bins > cb) | ((bins == cb) & (keys >= ck))
    return [(records[part == q], counts[part == q]) for q in range(parts)
            if (part == q).any()]


class _Built:
    def __init__(self, path: str) -> None:
        self.path = path

    def done(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> str:
        return self.path


class PendingLists:
    """The list entries of committed pages not in the store yet, and the file being built
    of the ones before (module docstring). One thread, the index's, uses it."""

    def __init__(self, store: Store, file_pages: int = FILE_PAGES) -> None:
        self.store = store
        self.file_pages = file_pages
        # the pending entries by list: of the pages not in a file yet, and of those in the
        # file in flight
        self.recent = ListChains()
        self.recent_flight = ListChains()
        self.pages: list[PendingPage] = []  # not in a file yet
        # the file being built (in one or more parts of disjoint keys: ``drain``): each
        # part's handle and build arguments, the last page, the pages
        self.flight: tuple[list[tuple[Handle, BuildArg]], int, list[PendingPage]] | None = None
        self.submit: Submit | None = None  # builds elsewhere (a pool); None: here
        self.build_seconds = 0.0  # thread CPU of the builds run here (benchmarks)
        # the mark of the last file ingested, for the next batch (``mark_into``)
        self.mark_due: int | None = None
        self.files = 0
        self.last = -1  # the last page pending (pages come in ordinal order)
        self.incoming = Path(store.path) / INCOMING

    def __len__(self) -> int:
        """Pages whose entries are not in the store yet."""
        return len(self.pages) + (len(self.flight[2]) if self.flight else 0)

    def add(self, ordinal: int, entries: npt.NDArray[Any], counts: I64) -> None:
        """A committed page's entries (``lists.entries``, distinct lists) and windows per
        entry; a file is started or ingested when its turn comes."""
        if not self.remember(ordinal, entries, counts):
            return
        if self.flight is not None and (all(h.done() for h, _ in self.flight[0])
                                        or len(self.pages) >= self.file_pages):
            self._land()
        if self.flight is None and len(self.pages) >= self.file_pages:
            self._ship()

    def recent_entries(self, bins: I64, keys: U64) -> tuple[I64, I64]:
        """Per list (bin, key): the number of pending entries, and all of them in one array
        (list by list, each ascending: those in flight first)."""
        n_f, ords_f = self.recent_flight.entries(bins, keys)
        n_n, ords_n = self.recent.entries(bins, keys)
        n = n_f + n_n
        start = np.cumsum(n) - n
        out = np.empty(int(n.sum()), dtype=np.int64)
        out[ranks(start, n_f)] = ords_f
        out[ranks(start + n_f, n_n)] = ords_n
        return n, out

    def holds_any(self, ordinals: list[int]) -> bool:
        """Whether any of ``ordinals`` may have entries pending."""
        first = (self.flight[2][0][0] if self.flight is not None
                 else self.pages[0][0] if self.pages else None)
        return first is not None and bool(ordinals) and max(ordinals) >= first

    def mark_into(self, batch: Batch) -> int | None:
        """The mark of the files ingested since the last batch written, into ``batch``;
        returns it, for ``marked`` once the batch is written."""
        if self.mark_due is not None:
            tables.lists_through.put_count(batch, self.mark_due)
        return self.mark_due

    def marked(self, mark: int | None) -> None:
        """A batch holding ``mark`` (``mark_into``) is written."""
        if mark is not None and mark == self.mark_due:
            self.mark_due = None

    def settle(self) -> None:
        """Ingest the file in flight, if any (before its builder goes away)."""
        if self.flight is not None:
            self._land()

    def drain(self, into_file: bool = False, parts: int = 1) -> None:
        """Every pending entry into the store now (the file in flight ingested, the rest
        written in one batch, or ``into_file``: one more file, built here): before a
        page pending is removed (a batch), and at close (a file). ``parts``: that file in
        as many files of disjoint keys (``split_entries``), one built here and the others
        by the pool (``submit``), at once: at close nothing else is left to run, and on
        llvm the last file was 4 % of a ``--jobs 2`` run, on one core."""
        if self.flight is not None:
            self._land()
        if self.pages and into_file:
            self._ship(here=True, parts=parts)
            self._land()
        if self.pages:
            entries = lists.from_bytes(_joined(self.pages))
            counts = np.concatenate([c for _, _, c in self.pages])
            batch = self.store.batch()
            lists.put_entries(batch, entries, counts)
            tables.lists_through.put_count(batch, self.pages[-1][0] + 1)
            self.store.write(batch)
            self.pages = []
            self.recent.reset()
        elif self.mark_due is not None:
            batch = self.store.batch()
            tables.lists_through.put_count(batch, self.mark_due)
            self.store.write(batch)
        self.mark_due = None

    def remember(self, ordinal: int, entries: npt.NDArray[Any], counts: I64) -> bool:
        """A page's entries pending, nothing else done (False: it has none, or they are
        pending already: a commit that failed after this is done again)."""
        if not len(entries) or ordinal <= self.last:
            return False
        self.last = ordinal
        self.pages.append((ordinal, entries, counts))
        self.recent.add(entries["bin"], entries["key"], counts, ordinal)
        return True

    def _ship(self, here: bool = False, parts: int = 1) -> None:
        """The pending pages into a file, built by the pool (``submit``) or here; ``here``
        with ``parts`` > 1: in key ranges, the first built here and the others by the
        pool."""
        pages = self.pages
        first, last = pages[0][0], pages[-1][0]
        self.incoming.mkdir(exist_ok=True)
        name = str(self.incoming / f"{first:016x}-{last:016x}")
        counts = np.concatenate([c for _, _, c in pages])
        pieces = [] if parts < 2 or self.submit is None else split_entries(
            lists.from_bytes(_joined(pages)), counts, parts)
        args: list[BuildArg] = (
            [(f"{name}.sst", _joined(pages), counts.astype("<u4").tobytes())]
            if len(pieces) < 2 else
            [(f"{name}-{x}.sst", lists.joined([r]), c.astype("<u4").tobytes())
             for x, (r, c) in enumerate(pieces)])
        handles: list[Handle | None] = [None] * len(args)
        if self.submit is not None:
            for x in range(1 if here else 0, len(args)):
                with contextlib.suppress(Exception):  # (a broken pool: the pipeline sees it)
                    handles[x] = self.submit(build_list_file, args[x])
        try:  # (a build here that fails leaves the pages pending)
            built = [h or self._build_here(a) for h, a in zip(handles, args, strict=True)]
        except BaseException:
            _forget(handles, args)
            raise
        self.flight = (list(zip(built, args, strict=True)), last, pages)
        self.pages = []
        self.recent_flight, self.recent = self.recent, self.recent_flight  # (reset on land)

    def _build_here(self, arg: tuple[str, bytes, bytes]) -> Handle:
        t0 = time.thread_time()
        try:
            return _Built(build_list_file(arg))
        except Exception as exc:  # a file in the store's directory: a store failure
            raise store_error("write", self.store.path, exc) from exc
        finally:
            self.build_seconds += time.thread_time() - t0

    def _land(self) -> None:
        """Ingest the file in flight, all its parts at once (each built here if no worker
        has started it, or if the worker failed), then have its mark written by the next
        batch."""
        assert self.flight is not None
        parts, last, _ = self.flight
        paths = []
        for handle, arg in parts:
            if not handle.done() and handle.cancel():
                handle = self._build_here(arg)
            try:
                path = handle.result()
            except Exception:  # the worker's failure is not the pages': build it here
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(arg[0])
                path = self._build_here(arg).result()
            paths.append(path)
        lists.ingest(self.store, paths)  # (failing, the file stays in flight)
        self.mark_due = last + 1
        self.flight = None
        self.files += 1
        self.recent_flight.reset()


def _forget(handles: list[Handle | None], args: list[BuildArg]) -> None:
    """The parts of a file that will not be ingested (a part built here failed): taken
    back, or waited for, and their files removed (none is left writing one)."""
    for handle, (path, _, _) in zip(handles, args, strict=True):
        if handle is not None and not handle.cancel():
            with contextlib.suppress(Exception):
                handle.result()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def forward_entries(store: Store, start: int = 0) -> Iterator[PendingPage]:
    """The list entries and windows per entry of every page from ordinal ``start`` on, read
    back from its forward record (the same lists, counted per list: module docstring)."""
    for ordinal, record in tables.forward.items(store, start):
        bins, keys, _, _, _ = forward.unpack_windows(record)
        l_bins, l_keys, inverse = distinct_lists(bins, keys.astype(np.uint64))
        yield (ordinal, lists.entries(l_bins, l_keys, ordinal),
               np.bincount(inverse, minlength=len(l_bins)))


# pages whose entries one batch of ``rebuild_entries`` writes (~400 entries a page on llvm)
REBUILD_PAGES = 256


def rebuild_entries(store: Store) -> int:
    """The lists' entries of a store that lacks them (no ``lists_entries`` key: restored from
    a list shard's changelog, which leaves them out: ``lists.derived``), written from its
    forward records; its long marks are kept, any other list key (a changelog of an older
    layout) goes first, so that no entry is counted twice. Returns the pages read. The key
    goes last: a crash before it leaves a store that rebuilds again (the same keys)."""
    if tables.lists_entries.get(store) is not None:
        return 0
    batch = store.batch()
    for key in store.keys(lists.FAMILY):
        if lists.derived(lists.FAMILY, key):
            batch.delete(lists.FAMILY, key)
    store.write(batch)
    n = 0
    pages: list[PendingPage] = []
    for page in forward_entries(store):
        pages.append(page)
        if len(pages) == REBUILD_PAGES:
            _put_pages(store, pages)
            n += len(pages)
            pages = []
    _put_pages(store, pages)
    tables.lists_entries.put(store, b"")
    return n + len(pages)


def _put_pages(store: Store, pages: list[PendingPage]) -> None:
    if not pages:
        return
    batch = store.batch()
    lists.put_entries(batch, lists.from_bytes(_joined(pages)),
                      np.concatenate([c for _, _, c in pages]))
    store.write(batch)


def _joined(pages: list[PendingPage]) -> bytes:
    """The pages' entries in one buffer (``lists.joined``)."""
    return lists.joined(e for _, e, _ in pages)


def ranks(starts: I64, counts: I64) -> I64:
    """``starts[y] + i`` for i in range(counts[y]), for every y in order."""
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)
