"""The align role's copy of forward records (``ForwardCopy``): a copy written by an earlier
version (the layout this one keeps) is read as before, and the align stage reads it as it
reads the engine's store."""

from __future__ import annotations

from pathlib import Path

import msgpack
from rocksdict import Options, Rdict

from dupalign.store.forward_copy import ForwardCopy
from dupalign.store.keys import u64
from dupalign.wire.forward_record import ForwardRecord


def test_a_copy_written_before_the_store_owned_its_layout_is_read(tmp_path: Path) -> None:
    """The keys an align store of the previous release wrote, byte for byte: a kept store
    directory must go on from its offsets, not be filled again or misread."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    old = Rdict(str(tmp_path / "a"), opts)
    old[b"f" + u64(5)] = b"windows"
    old[b"p" + u64(5)] = b"positions"
    old[b"d" + u64(5)] = msgpack.packb({"id": "p5"})
    old[b"o" + u64(3)] = u64(41)
    old.close()
    copy = ForwardCopy(tmp_path / "a")
    try:
        assert copy.windows([5, 6]) == [b"windows", None]
        assert copy.positions(5) == b"positions" and copy.positions(6) is None
        assert copy.doc_id(5) == "p5" and copy.doc_id(6) is None
        assert copy.offset(3) == 41 and copy.offset(0) is None
        assert copy.has_all([5]) and not copy.has_all([5, 6])
        copy.apply(3, [(6, ForwardRecord("p6", b"w6", b"q6")), (5, None)], 42)
    finally:
        copy.close()
    reopened = Rdict(str(tmp_path / "a"), opts)
    try:
        assert dict(reopened.items()) == {
            b"f" + u64(6): b"w6", b"p" + u64(6): b"q6",
            b"d" + u64(6): msgpack.packb({"id": "p6"}), b"o" + u64(3): u64(42)}
    finally:
        reopened.close()
