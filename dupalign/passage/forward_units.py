"""A forward stage's ``forward`` records are derived data: rebuilt from the pages' unit hashes.

A page's compact windows are a function of its unit hashes and the frozen passage
configuration alone (``PassageSketcher.windows``: mode, k, tf mode; no idf, no index state),
and the forward stage keeps every window of the page (the sketch role's ``forward_value``:
none is left out for a stop list, unlike a list shard's record). Its ``positions`` record
already holds the low 32 bits of each unit hash; the stage keeps the high 32 bits beside it
(``units``, 4 bytes a unit), and its changelog leaves the ``forward`` records out
(``derived``): random 64-bit keys that zstd cannot shrink, ~4 windows a unit. A store restored
without them rebuilds them when the stage opens it (``rebuild_forward``), byte for byte as
the sketch role wrote them (``windows_value`` on both sides).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dupalign.passage import forward
from dupalign.passage.positions import unpack_positions
from dupalign.passage.sketch import PassageSketcher, Rects
from dupalign.store import tables
from dupalign.store.database import Store

U64 = npt.NDArray[np.uint64]
REBUILD_PAGES = 256  # pages whose forward records one batch of ``rebuild_forward`` writes


def windows_value(rects: Rects) -> bytes:
    """The ``forward`` value of a page's windows (``forward.pack_windows``)."""
    return forward.pack_windows(rects.bin, rects.key, np.stack(
        (rects.i_lo, rects.i_hi, rects.j_lo, rects.j_hi), axis=1), rects.empty)


def units_high(units: U64) -> bytes:
    """The ``units`` value of a page: the high 32 bits of its unit hashes."""
    return (np.asarray(units, dtype=np.uint64) >> np.uint64(32)).astype("<u4").tobytes()


def page_units(positions: bytes, high: bytes) -> U64:
    """A page's unit hashes from its ``positions`` (the low halves) and ``units`` values."""
    _, _, low = unpack_positions(positions)
    if low is None:
        raise ValueError("a positions record without unit hashes (store format < 7)")
    hi = np.frombuffer(high, dtype="<u4")
    if len(hi) != len(low):
        raise ValueError(f"{len(hi)} high halves against {len(low)} unit hashes")
    return (hi.astype(np.uint64) << np.uint64(32)) | low.astype(np.uint64)


def rebuilt_windows(sketcher: PassageSketcher, positions: bytes, high: bytes) -> bytes:
    """The ``forward`` value of the page whose ``positions`` and ``units`` values these are."""
    return windows_value(sketcher.windows(page_units(positions, high)))


def derived(family: str, key: bytes) -> bool:
    """Whether a forward stage's store key is one its ``positions`` and ``units`` give again:
    a ``forward`` record, or the key saying they are in the store. Its changelog leaves
    these out."""
    return family == tables.forward.family or (family == tables.forward_windows.family
                                               and key == tables.forward_windows.key)


def rebuild_forward(store: Store, sketcher: PassageSketcher) -> int:
    """The ``forward`` records of a forward stage's store that lacks them (no
    ``forward_windows`` key: restored from its changelog, or made before it), written from
    every page's ``positions`` and ``units``. A record of a page without ``units`` (kept by
    an older layout's changelog) stays; one of a page without ``positions`` (removed since:
    the changelog leaves out its tombstone) goes. Returns the pages rebuilt. The key goes
    last: a crash before it leaves a store that rebuilds again (the same values)."""
    if tables.forward_windows.get(store) is not None:
        return 0
    batch = store.batch()
    for ordinal in tables.forward.ordinals(store):
        if tables.positions.get(store, ordinal) is None:
            tables.forward.delete(batch, ordinal)
    store.write(batch)
    n = 0
    batch = store.batch()
    for ordinal, high in tables.units.items(store):
        positions = tables.positions.get(store, ordinal)
        if positions is None:
            raise ValueError(f"page {ordinal} has units but no positions record")
        tables.forward.put(batch, ordinal, rebuilt_windows(sketcher, positions, high))
        n += 1
        if n % REBUILD_PAGES == 0:
            store.write(batch)
            batch = store.batch()
    tables.forward_windows.put(batch, b"")
    store.write(batch)
    return n
