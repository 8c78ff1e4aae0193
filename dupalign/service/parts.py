"""Records too large for one Kafka record, sent as parts and put together again.

A big page's sketch is about twelve times its text (positions, unit hashes and windows per
token), so a page of a few hundred KB already makes a sketch over the producer's and the
topic's record limit. Such a value goes out as consecutive slices, each record carrying
the page's ordinal and a ``dupalign-part`` header (index, count); the reader keeps the
slices per ordinal until all are there. Several processes write the same partition, so
the parts of one value may be interleaved with other records: the reader keys them by
ordinal, never by adjacency, and its commit offset stays at or below the first part of a
value still incomplete (``lowest_offset``), so a restart reads every part again.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Any

from dupalign.service.topology import RECORD_OVERHEAD, Outgoing, header

PART_HEADER = "dupalign-part"
SENDER_HEADER = "dupalign-from"  # on parts: who sent the value (``in_parts_from``)
_PART = struct.Struct(">II")  # index, count


def split(value: bytes, limit: int) -> list[bytes]:
    """``value`` as slices of at most ``limit`` bytes (itself when it fits)."""
    if limit < 1:
        raise ValueError(f"part limit {limit} < 1")
    if len(value) <= limit:
        return [value]
    return [value[i:i + limit] for i in range(0, len(value), limit)]


def in_parts(record: Outgoing, limit: int) -> list[Outgoing]:
    """``record`` as records that fit a topic taking at most ``limit`` bytes a record:
    itself, or its value's slices, each with the part header."""
    if record.value is None:
        return [record]
    slices = split(record.value, limit - RECORD_OVERHEAD)
    if len(slices) == 1:
        return [record]
    return [dataclasses.replace(record, value=part,
                                headers=[*record.headers, part_header(i, len(slices))])
            for i, part in enumerate(slices)]


def in_parts_from(record: Outgoing, sender: str, limit: int) -> list[Outgoing]:
    """``in_parts``, with a header naming the ``sender`` on the parts: a reader tells apart
    by their headers the parts of values that several senders send for one ordinal to one
    partition (the list partitions' partials to a combine partition)."""
    if record.value is None or len(record.value) <= limit - RECORD_OVERHEAD:
        return [record]
    return in_parts(dataclasses.replace(
        record, headers=[*record.headers, (SENDER_HEADER, sender.encode())]), limit)


def part_header(index: int, count: int) -> tuple[str, bytes]:
    return PART_HEADER, _PART.pack(index, count)


def record_part(record: Any) -> tuple[int, int] | None:
    """(index, count) of a part record; None for a whole one. Raises ValueError for a
    header that cannot be a part's."""
    raw = header(record, PART_HEADER)
    if raw is None:
        return None
    if len(raw) != _PART.size:
        raise ValueError(f"{PART_HEADER} header of {len(raw)} bytes")
    index, count = _PART.unpack(raw)
    if not 0 <= index < count:
        raise ValueError(f"{PART_HEADER} header says part {index} of {count}")
    return index, count


@dataclass
class _Pending:
    count: int
    first_offset: int
    slices: dict[int, bytes] = field(default_factory=dict)


class PartsByOrdinal:
    """The values of one partition put together from their parts, per ordinal."""

    def __init__(self) -> None:
        self._pending: dict[int, _Pending] = {}

    def add(self, ordinal: int, record: Any) -> tuple[int, bytes] | None:
        """The whole value of ``ordinal`` with the lowest offset of its parts, once
        ``record`` completes it (at once for a whole record); None while parts are
        missing. A part read twice within a value counts once; a value sent again (a
        takeover's resend) is put together again, as a whole record read again is
        returned again. A resend cut short leaves a value that never completes: the
        caller's ``floor`` passes it (``lowest_offset``)."""
        part = record_part(record)
        value = bytes(record.value or b"")
        if part is None:
            self._pending.pop(ordinal, None)  # a whole copy supersedes parts of another
            return record.offset, value
        index, count = part
        pending = self._pending.get(ordinal)
        if pending is None or pending.count != count:
            pending = self._pending[ordinal] = _Pending(count, record.offset)
        pending.first_offset = min(pending.first_offset, record.offset)
        pending.slices.setdefault(index, value)
        if len(pending.slices) < count:
            return None
        del self._pending[ordinal]
        return pending.first_offset, b"".join(pending.slices[i] for i in range(count))

    def lowest_offset(self, floor: int) -> int | None:
        """The first offset of a value of ordinal ``floor`` or above still missing parts
        (where a commit must stop); values below ``floor`` are no longer wanted and are
        forgotten."""
        for ordinal in [o for o in self._pending if o < floor]:
            del self._pending[ordinal]
        return min((p.first_offset for p in self._pending.values()), default=None)
