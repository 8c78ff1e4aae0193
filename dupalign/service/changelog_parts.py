"""Changelog values too large for one Kafka record, kept in parts a compacted topic keeps.

A store value over the record limit (a big page's forward record, sketch or list partial: a
page of a few MB makes values of several MB) goes out as its first slice under the value's
own key, with the ``dupalign-part`` header (0, count), and slice i >= 1 under its part key:
``PART_MARK``, i (4 bytes), then the value's key. A family's name is never 255 bytes long,
so a part key is never a value's key (``changelog.encode_key``). The log cleaner keeps the
last record per key: every write of a value in n parts writes all n of them in one
transaction, so the parts below n it keeps are those of the last write. A value that
shrinks (or goes) deletes the parts it no longer has, when the changelog knows how many
the last write had (``counts``); a restore reports the parts it found unused (``stale``),
deleted by the next turn.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dupalign.service.parts import part_header, record_part, split
from dupalign.service.topology import RECORD_OVERHEAD, Outgoing

PART_MARK = 0xFF
_INDEX = struct.Struct(">I")


def part_key(index: int, key: bytes) -> bytes:
    """The key of slice ``index`` (>= 1) of the value of ``key``."""
    return bytes([PART_MARK]) + _INDEX.pack(index) + key


def parse_part_key(raw: bytes) -> tuple[int, bytes] | None:
    """(index, the value's key) of a part key; None for a value's key."""
    if not raw or raw[0] != PART_MARK:
        return None
    return _INDEX.unpack_from(raw, 1)[0], raw[1 + _INDEX.size:]


def slice_limit(limit: int) -> int:
    """The largest slice of a record that must fit ``limit`` bytes (``kafka.max_request_size``)."""
    return limit - RECORD_OVERHEAD - 1 - _INDEX.size


def part_count(value: bytes | None, limit: int) -> int:
    """The records a value takes (a tombstone: 1)."""
    return 1 if value is None else max(1, math.ceil(len(value) / slice_limit(limit)))


def value_records(topic: str, partition: int, key: bytes, value: bytes | None, limit: int,
                  before: int = 1) -> list[Outgoing]:
    """The records of ``value`` (None: a deletion) under ``key``; ``before``: how many the
    last value of ``key`` took (its parts that this one has not are deleted)."""
    slices = [None] if value is None else split(value, slice_limit(limit))
    n = len(slices)
    if n == 1:
        out = [Outgoing(topic, slices[0], key=key, partition=partition)]
    else:
        out = [Outgoing(topic, slices[0], key=key, partition=partition,
                        headers=[part_header(0, n)])]
        out += [Outgoing(topic, s, key=part_key(i, key), partition=partition)
                for i, s in enumerate(slices[1:], 1)]
    out += [Outgoing(topic, None, key=part_key(i, key), partition=partition)
            for i in range(n, before)]
    return out


@dataclass
class Rejoined:
    """What a restore read, values put together: ``changes`` (key, value or None) in the
    order read, the values in parts last; ``counts``: the parts of each value kept in more
    than one; ``stale``: part keys no value uses (to delete)."""

    changes: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    counts: dict[bytes, int] = field(default_factory=dict)
    stale: list[bytes] = field(default_factory=list)


class Rejoin:
    """Changelog records in offset order, put together into the store's values. Whole values
    and deletions pass through at once (``add``'s result); a value in parts waits for the end
    (``finish``): a later record of its key (whole or deleted) supersedes it."""

    def __init__(self) -> None:
        self.firsts: dict[bytes, tuple[int, bytes]] = {}  # key -> (count, slice 0)
        self.parts: dict[bytes, dict[int, bytes]] = {}  # key -> index -> slice

    def add(self, records: Iterable[Any]) -> list[tuple[bytes, bytes | None]]:
        """The whole values and deletions among ``records`` (key, value)."""
        out: list[tuple[bytes, bytes | None]] = []
        for r in records:
            parsed = parse_part_key(r.key)
            if parsed is not None:
                index, key = parsed
                if r.value is None:
                    self.parts.get(key, {}).pop(index, None)
                else:
                    self.parts.setdefault(key, {})[index] = bytes(r.value)
                continue
            part = record_part(r) if r.value is not None else None
            if part is None:
                self.firsts.pop(r.key, None)
                out.append((r.key, None if r.value is None else bytes(r.value)))
            else:
                self.firsts[r.key] = (part[1], bytes(r.value))
        return out

    def finish(self) -> Rejoined:
        """The values in parts, put together; raises ValueError for one missing a part."""
        done = Rejoined()
        for key, (count, first) in self.firsts.items():
            got = self.parts.get(key, {})
            missing = [i for i in range(1, count) if i not in got]
            if missing:
                raise ValueError(f"changelog value {key!r} misses parts {missing[:5]} of "
                                 f"{count}")
            done.changes.append((key, first + b"".join(got[i] for i in range(1, count))))
            done.counts[key] = count
        for key, got in self.parts.items():
            count = self.firsts.get(key, (1, b""))[0]
            done.stale += [part_key(i, key) for i in sorted(got) if i >= count]
        return done
