"""A page's forward record as the sketch role sends it to the align partition that owns the
page's id (``<in>.passages``: dupalign.service.roles.stage_align), which stores it if the
page is stored (``ForwardStage``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from dupalign.wire.versions import FORWARD_RECORD


class ForwardRecord(NamedTuple):
    """A page's id and its forward record as a store holds it; ``high``: the high 32 bits of
    its unit hashes (``<u4``), from which a forward stage rebuilds the windows (None: a
    sender that does not say them, which ``ForwardStage`` refuses)."""

    doc_id: str
    windows: bytes
    positions: bytes
    high: bytes | None = None


def encode_forward(doc_id: str, windows: bytes, positions: bytes,
                   high: bytes | None = None) -> bytes:
    """A forward record's value (``high``: an optional field, which older readers skip)."""
    d: dict[str, Any] = {"v": FORWARD_RECORD.writes, "id": doc_id, "forward": windows,
                         "positions": positions}
    if high is not None:
        d["high"] = high
    return bytes(msgpack.packb(d, use_bin_type=True))


def decode_forward(value: bytes) -> ForwardRecord:
    """A forward record's value, read (ValueError: a version not read)."""
    d = msgpack.unpackb(value, raw=False)
    FORWARD_RECORD.check(d.get("v"))
    return ForwardRecord(d["id"], d["forward"], d["positions"], d.get("high"))
