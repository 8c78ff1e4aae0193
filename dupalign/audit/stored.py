"""The audit of a stored crawl, on demand (``dupalign audit``): the same exact answers for a
sample of the pages already stored, against what they were answered then (their stored
matches).

A stored page keeps no passage sketches, but its forward record's compact windows hold them:
for a passage ``[s, e)`` and a bin, the window of that bin that covers the subsequence (its
start in ``[i_lo, i_hi]``, its end in ``[j_lo, j_hi]``) carries the passage's min-hash, or
says the bin is empty (``passage_sketches_from``). A window left out of the record because
its list was already a stop list leaves the bin unknown, counted as neither a collision nor
an empty bin: the index's own rule. The pages aligned against are the live audit's
reservoir when the store has one (every window kept), else a sample of stored forward
records, which lack the windows in stop lists: that audit then sees the loss to the
probe budget, the list and candidate cuts and the match caps, not to stop lists. Misses
have no cause here (the lists have changed since): ``other``.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign.audit.auditor import Auditor, Case
from dupalign.audit.exact import Windows
from dupalign.audit.recall import Tally
from dupalign.audit.reservoir import draw
from dupalign.config import EngineConfig
from dupalign.match import Match
from dupalign.near.index import NearIndex
from dupalign.passage.sketch import passage_starts
from dupalign.store import records, tables
from dupalign.store.database import Store

U64 = npt.NDArray[np.uint64]
Bools = npt.NDArray[np.bool_]


def passage_sketches_from(w: Windows, k: int, query_len: int, stride: int
                          ) -> tuple[U64, Bools, Bools]:
    """The query passages' sketches of a page from its windows: ``(keys[P, k],
    empty[P, k], unknown[P, k])`` (unknown: no window of the record covers the passage in
    that bin)."""
    n = int(max(w.rects[:, 3].max(initial=-1), w.e_lr[:, 2].max(initial=-1))) + 1
    starts = np.asarray(passage_starts(n, query_len, stride), dtype=np.int64)
    ends = np.minimum(n, starts + query_len) - 1  # inclusive
    keys = np.zeros((len(starts), k), dtype=np.uint64)
    empty = np.zeros((len(starts), k), dtype=np.bool_)
    known = np.zeros((len(starts), k), dtype=np.bool_)
    r = w.rects
    cover = ((r[None, :, 0] <= starts[:, None]) & (starts[:, None] <= r[None, :, 1])
             & (r[None, :, 2] <= ends[:, None]) & (ends[:, None] <= r[None, :, 3]))
    rows, xs = np.nonzero(cover)
    keys[rows, w.bins[xs]] = w.keys[xs]
    known[rows, w.bins[xs]] = True
    e = w.e_lr
    e_cover = ((e[None, :, 0] <= starts[:, None]) & (starts[:, None] <= e[None, :, 1])
               & (ends[:, None] <= e[None, :, 2]))
    rows, xs = np.nonzero(e_cover)
    empty[rows, w.e_bins[xs]] = True
    known[rows, w.e_bins[xs]] = True
    return keys, empty, ~known


def _chosen(ordinals: list[int], n: int, seed: int, salt: int) -> list[int]:
    """``n`` of ``ordinals``, the same for the same seed (the smallest draws)."""
    return sorted(sorted(ordinals, key=lambda o: draw(seed, o, salt))[:n])


def audit_store(store: Store, config: EngineConfig, near: NearIndex, pages: int,
                reservoir: int, seed: int) -> Tally:
    """Audit ``pages`` stored pages (a seeded uniform sample) and return their tally
    (nothing is written)."""
    auditor = Auditor(store, config, 0.0, read_only=True)
    auditor.tally = Tally()
    stored = list(records.stored_ordinals(store))
    if not len(auditor.reservoir):  # no live reservoir: a sample of the forward records
        for o in _chosen(stored, reservoir, seed, 4):
            raw = tables.forward.get(store, o)
            if raw is not None:
                auditor.reservoir.slots[len(auditor.reservoir.slots)] = (o, raw)
    fps, ords = near.table.all_arrays()
    for o, case in _cases(store, config, _chosen(stored, pages, seed, 5)):
        case.population = sum(1 for x in stored if x < o)
        auditor.audit_case(case, fps, ords, near.sketch_of)
    return auditor.tally


def _cases(store: Store, config: EngineConfig, chosen: list[int]) -> Iterator[tuple[int, Case]]:
    p = config.passage
    for o in chosen:
        doc = tables.docs.get(store, o)
        if doc is None:
            continue
        record = msgpack.unpackb(doc)
        raw = tables.matches.get(store, o)
        matches = [] if raw is None else [Match.from_dict(d) for d in msgpack.unpackb(raw)]
        found = {tables.ids.get(store, m.match_doc_id) for m in matches}
        found_ords = frozenset(x for x in found if x is not None)
        near_found = frozenset(x for m in matches if m.kind == "near"
                               for x in [tables.ids.get(store, m.match_doc_id)] if x is not None)
        if any(m.kind == "exact" for m in matches):
            continue  # an exact duplicate was searched for nothing else
        case = Case(o, frozenset(), near_found=near_found, found=found_ords)
        sketch = tables.cws.get(store, o)
        if record.get("simhash") is not None and sketch is not None:
            case.fingerprint = int(record["simhash"])
            case.sketch = np.frombuffer(sketch, dtype="<u8")
        windows = tables.forward.get(store, o)
        if windows is not None and p.mode == "oph":
            w = Windows.from_record(windows)
            keys, empty, unknown = passage_sketches_from(w, p.k, p.query_len, p.stride)
            # (unknown bins: neither a collision nor an empty bin, as a stop list)
            case.q_keys, case.q_empty, case.unknown = keys, empty, unknown
        yield o, case
