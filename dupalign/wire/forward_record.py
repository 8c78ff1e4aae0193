"""A ``pages.forward`` record: the forward record of a page the index stored, sent to the
align shard that owns the page (docs/topology.md). Its key is the page's ordinal (``u64``,
big-endian); a null value says the page left the index's store."""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack

from dupalign.wire.versions import FORWARD_RECORD

_KEY = struct.Struct(">Q")


def forward_key(ordinal: int) -> bytes:
    """A ``pages.forward`` record's key: the page's ordinal."""
    return _KEY.pack(ordinal)


def read_forward_key(key: bytes) -> int:
    return int(_KEY.unpack(key)[0])


class ForwardRecord(NamedTuple):
    """A page's id and its forward record as the index's store holds it; ``high``: the high
    32 bits of its unit hashes (``<u4``), from which a forward stage rebuilds the windows
    (None: a sender that does not say them, the index role's)."""

    doc_id: str
    windows: bytes
    positions: bytes
    high: bytes | None = None


def encode_forward(doc_id: str, windows: bytes, positions: bytes,
                   high: bytes | None = None) -> bytes:
    """A ``pages.forward`` record's value (``high``: an optional field, which older readers
    skip)."""
    d: dict[str, Any] = {"v": FORWARD_RECORD.writes, "id": doc_id, "forward": windows,
                         "positions": positions}
    if high is not None:
        d["high"] = high
    return bytes(msgpack.packb(d, use_bin_type=True))


def decode_forward(value: bytes) -> ForwardRecord:
    """A ``pages.forward`` record's value, read (ValueError: a version not read)."""
    d = msgpack.unpackb(value, raw=False)
    FORWARD_RECORD.check(d.get("v"))
    return ForwardRecord(d["id"], d["forward"], d["positions"], d.get("high"))
