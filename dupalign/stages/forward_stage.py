"""The forward records the align stage reads in the partitioned pipeline (docs/pipeline.md):
by store ordinal, each stored page's full forward record and positions (as the single
index writes them: dupalign.passage.index), the high halves of its unit hashes and its id,
for the pages that are in the lists (stored, not exact copies, with passages). Kept from
upstream data alone: the decisions placed by its ``Ledger``, the exact answers, the pages'
forward records as the sketch stage makes them (``forward_value``: the wire form the align
stage's partitions read, dupalign/service/roles/stage_align.py) and the sweeps; read through
a ``StoreForward`` (dupalign.store.forward_reader). The ``forward`` records are derived from
the positions and the units (dupalign.passage.forward_units): a changelog may leave them out
(``DERIVED``), and the stage rebuilds them when it opens a store restored without them."""

from __future__ import annotations

from collections.abc import Iterable

import msgpack
import numpy as np

from dupalign.config import EngineConfig
from dupalign.passage import forward_units
from dupalign.passage.sketch import PassageSketcher, PassageState
from dupalign.stages.directory import Decision
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.ledger import Expired, Placed
from dupalign.store import tables
from dupalign.store.database import Batch, Store
from dupalign.wire.forward_record import ForwardRecord, encode_forward


def forward_value(doc_id: str, passage: PassageState | None) -> bytes | None:
    """The page's forward record as the sketch stage sends it (``encode_forward``: its id,
    windows, positions and units' high halves, the values the store keeps; None: a page
    without passages, which no list holds)."""
    if passage is None or passage.rects is None:
        return None
    if passage.units is None:
        raise ValueError(f"page {doc_id!r}: a passage sketch without its units (read back "
                         "from the wire?): its forward record needs them")
    return encode_forward(doc_id, forward_units.windows_value(passage.rects),
                          passage.positions, forward_units.units_high(passage.units))


# the keys a forward stage's changelog leaves out: rebuilt at open (``ForwardStage``)
DERIVED = forward_units.derived


class ForwardStage:
    """The forward records over one store (one WriteBatch per decision that changes it).
    Opening a store without its ``forward`` records (restored from a changelog that left
    them out: ``DERIVED``) rebuilds them (``rebuilt``: the pages rebuilt)."""

    def __init__(self, store: Store, config: EngineConfig) -> None:
        self.store = store
        self.rebuilt = forward_units.rebuild_forward(store, PassageSketcher(config))

    def apply(self, d: Decision, placed: Placed, exact: ExactAnswer | None,
              record: ForwardRecord | None) -> None:
        """The next decision (sequence order) with the stored page's exact answer and its
        forward record (``forward_value``, read)."""
        batch = self.store.batch()
        if placed.removed is not None:
            self._remove(batch, [placed.removed])
        if (d.kind == "stored" and exact is not None and exact.original is None
                and record is not None):
            assert placed.ordinal is not None
            if record.high is None:
                raise ValueError(f"page {d.doc_id!r}: a forward record without its units' "
                                 "high halves (from an older sketch role?)")
            tables.forward.put(batch, placed.ordinal, record.windows)
            tables.positions.put(batch, placed.ordinal, record.positions)
            tables.units.put(batch, placed.ordinal, record.high)
            tables.docs.put(batch, placed.ordinal, msgpack.packb({"id": d.doc_id}))
        if len(batch):
            self.store.write(batch)

    def forget(self, expired: Iterable[Expired]) -> None:
        """A sweep: the swept pages' records."""
        ordinals = [e.ordinal for e in expired]
        if ordinals:
            batch = self.store.batch()
            self._remove(batch, ordinals)
            self.store.write(batch)

    @staticmethod
    def _remove(batch: Batch, ordinals: list[int]) -> None:
        dead = np.unique(np.asarray(ordinals, dtype=np.int64)).tolist()
        tables.forward.remove(batch, dead)
        tables.positions.remove(batch, dead)
        tables.units.remove(batch, dead)
        tables.docs.remove(batch, ordinals)
