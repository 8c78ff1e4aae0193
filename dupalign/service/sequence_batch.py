"""The partitioned pipeline's sequence: one record per sketch batch (docs/pipeline.md, "Roles on
Kafka"), and what a stage reads from it.

``SequenceBatch``: the record the sketch role sends first in a batch's transaction, to the
single partition of ``<in>.batches``: the input partition and offsets of the batch's pages
that are sequenced (dead letters take no place), the directory partition of each, the
directory partition count, the batch's clock, and which pages have list windows (a
passage state: then every list partition gets a ``ListWindows`` record of the page, else
none does). Its acknowledged offset b names the
batch; its pages are (b, i), which the sketch role puts on every record it sends for them
(``page_header``).

``SequenceLog``: a reader's view. A page's ordinal is the running count of the pages of the
batches before it, which every reader of the whole sequence computes alike (aborted
batches are never seen by read_committed readers). The log keeps the batches still
needed and says, for each ordinal, its (b, i), its directory partition and its clock.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from dupalign.wire.versions import SEQUENCE_BATCH

PAGE_HEADER = "dupalign-page"  # (b, i): the page's batch offset and index in it
_PAGE = struct.Struct(">QI")


def page_header(batch: int, index: int) -> tuple[str, bytes]:
    return PAGE_HEADER, _PAGE.pack(batch, index)


def record_page(record: Any) -> tuple[int, int]:
    """(b, i) of a record sent for page i of batch b."""
    for k, v in record.headers or ():
        if k == PAGE_HEADER:
            b, i = _PAGE.unpack(bytes(v))
            return int(b), int(i)
    raise ValueError(f"record {record.topic}:{record.partition}:{record.offset} has no "
                     f"{PAGE_HEADER} header")


@dataclass(frozen=True)
class SequenceBatch:
    """The pages of one sketch batch: ``offsets`` in partition ``partition`` of ``topic``,
    ``dirs[i]`` the directory partition (of ``n_dirs``) of page i; ``at_ms`` the clock of
    the retention sweeps that fall in it; ``windows[i]``: page i has list windows, one
    record for each list partition (empty: not said, a batch no list partition reads)."""

    topic: str
    partition: int
    offsets: tuple[int, ...]
    dirs: tuple[int, ...]
    n_dirs: int
    at_ms: int
    windows: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.dirs) or not self.offsets:
            raise ValueError("a sequence batch has one directory partition per page, and "
                             "at least one page")
        if len(self.windows) not in (0, len(self.offsets)):
            raise ValueError("a sequence batch says for every page or none whether it has "
                             "list windows")
        if not all(0 <= d < self.n_dirs for d in self.dirs):
            raise ValueError(f"directory partitions {self.dirs} not all below {self.n_dirs}")

    @property
    def n(self) -> int:
        return len(self.offsets)

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {
            "src": [self.topic, self.partition],
            "offsets": np.asarray(self.offsets, "<i8").tobytes(),
            "dirs": np.asarray(self.dirs, "<u2").tobytes(),
            "d": self.n_dirs, "at": self.at_ms}
        if self.windows:  # (a bit per page)
            d["w"] = np.packbits(np.asarray(self.windows, np.bool_)).tobytes()
        return SEQUENCE_BATCH.pack(d)

    @classmethod
    def from_bytes(cls, raw: bytes) -> SequenceBatch:
        d = SEQUENCE_BATCH.unpack(raw)
        offsets = tuple(np.frombuffer(d["offsets"], "<i8").tolist())
        windows: tuple[bool, ...] = ()
        if "w" in d:
            bits = np.unpackbits(np.frombuffer(d["w"], np.uint8), count=len(offsets))
            windows = tuple(bits.astype(bool).tolist())
        return cls(d["src"][0], d["src"][1], offsets,
                   tuple(np.frombuffer(d["dirs"], "<u2").tolist()), d["d"], d["at"], windows)


@dataclass(frozen=True)
class PageRef:
    """Page ``ordinal`` of the sequence: page ``index`` of the batch at offset ``batch``;
    ``windows``: it has list windows (None: its batch does not say)."""

    ordinal: int
    batch: int
    index: int
    dir: int
    at_ms: int
    windows: bool | None = None


class SequenceLog:
    """The batches read from offset ``offset`` of ``<in>.batches`` on, the first of them
    starting at ordinal ``first``. ``trim`` drops those a reader no longer needs."""

    def __init__(self, offset: int = 0, first: int = 0, n_dirs: int | None = None) -> None:
        self.n_dirs = n_dirs  # checked against every batch's
        self._offsets: list[int] = []  # batch offsets kept
        self._firsts: list[int] = []  # the ordinal of each one's first page
        self._batches: list[SequenceBatch] = []
        self.next_offset, self.end = offset, first  # the next to read; the ordinal after

    def add(self, offset: int, batch: SequenceBatch) -> None:
        """The batch record at ``offset`` (ascending; records below the resume point,
        read again, are ignored)."""
        if offset < self.next_offset:
            return
        if self.n_dirs is not None and batch.n_dirs != self.n_dirs:
            raise ValueError(f"sequence batch {offset} names {batch.n_dirs} directory "
                             f"partitions; this stage reads {self.n_dirs}")
        self._offsets.append(offset)
        self._firsts.append(self.end)
        self._batches.append(batch)
        self.next_offset, self.end = offset + 1, self.end + batch.n

    def page(self, ordinal: int) -> PageRef | None:
        """The page of ``ordinal`` (None: not read yet). ValueError below the batches
        kept."""
        if ordinal >= self.end:
            return None
        k = bisect.bisect_right(self._firsts, ordinal) - 1
        if k < 0:
            raise ValueError(f"ordinal {ordinal} is below the sequence kept")
        batch, i = self._batches[k], ordinal - self._firsts[k]
        return PageRef(ordinal, self._offsets[k], i, batch.dirs[i], batch.at_ms,
                       batch.windows[i] if batch.windows else None)

    def dirs(self, start: int, stop: int) -> list[int]:
        """The directory partitions of the pages from ordinal ``start`` (kept) up to
        ``stop`` or the last page read (``page``'s ``dir``, at once)."""
        out: list[int] = []
        if start >= self.end:
            return out
        k = bisect.bisect_right(self._firsts, start) - 1
        if k < 0:
            raise ValueError(f"ordinal {start} is below the sequence kept")
        while k < len(self._batches) and self._firsts[k] < stop:
            first = self._firsts[k]
            out += self._batches[k].dirs[max(start - first, 0):stop - first]
            k += 1
        return out

    def source(self, ordinal: int) -> tuple[str, int, int]:
        """Where the page of ``ordinal`` (read, kept) is in the input: topic, partition,
        offset."""
        ref = self.page(ordinal)
        if ref is None:
            raise ValueError(f"ordinal {ordinal} is not read yet")
        k = bisect.bisect_right(self._firsts, ordinal) - 1
        batch = self._batches[k]
        return batch.topic, batch.partition, batch.offsets[ref.index]

    def trim(self, below: int) -> None:
        """Drop the batches whose pages are all below ordinal ``below``."""
        drop = 0
        while (drop < len(self._batches)
               and self._firsts[drop] + self._batches[drop].n <= below):
            drop += 1
        del self._offsets[:drop], self._firsts[:drop], self._batches[:drop]

    def cursor(self) -> tuple[int, int]:
        """Where to read again from after a restart: the first batch kept (its offset and
        first ordinal), else the next to read."""
        if self._offsets:
            return self._offsets[0], self._firsts[0]
        return self.next_offset, self.end
