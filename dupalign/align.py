"""The align stage: a page's alignment tasks → its passage matches, with no index state.

Input: an ``AlignRequest`` (dupalign.index), the tasks of one page against its earlier
candidate pages. Steps: the candidates' windows in the page's lists and empty bins
gathered from their forward records (dupalign.forward: read from the store or a secondary
instance of it, or carried by the request), per task the viability cut and the interval
scan
(``passage_align.scan_tasks``), then the hits on one page merged into maximal spans with
token and character ranges (``PassageIndex._spans``, the same code as the one-thread
query). Runs anywhere: other threads, other processes, later other machines.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import msgpack
import numpy as np

from dupalign.config import EngineConfig
from dupalign.match import Span, best_span
from dupalign.passages import PassageIndex, _Hit, _unpack_positions
from dupalign.store import Store, read_u64, u64
from dupalign.text import Tokens

Hit = tuple[int, int, int, int, float]  # passage, earlier page, start, end, estimate


def spans_of_hits(index: PassageIndex, hits: list[Hit], starts: Any, ends: Any,
                  tokens: Tokens, units: Any) -> list[tuple[int, list[Span]]]:
    """Hits grouped by earlier page (ascending) and turned into spans (``units``: the
    query page's unit hashes, low 32 bits, as in its positions record); pages whose spans
    come out empty are left out, and only the best ``passage.max_matches`` pages kept."""
    per_page: dict[int, list[_Hit]] = defaultdict(list)
    for p, other, t_start, t_end, est in hits:
        per_page[other].append(_Hit(int(starts[p]), int(ends[p]), t_start, t_end, est))
    out = []
    for other in sorted(per_page):
        spans = index._spans(other, per_page[other], tokens, np.asarray(units, np.uint64))
        if spans:
            out.append((other, spans))
    return _best(out, index.cfg.max_matches)


def _best(found: list[tuple[int, list[Span]]], cap: int) -> list[tuple[int, list[Span]]]:
    """The ``cap`` best pages (most tokens of this page covered, then highest estimate,
    then earliest page), still in page order."""
    if len(found) <= cap:
        return found

    def rank(item: tuple[int, list[Span]]) -> tuple[int, float, int]:
        other, spans = item
        covered = sum(s.tokens[1] - s.tokens[0] for s in spans)
        return -covered, -best_span(spans).est_jaccard, other

    return sorted(sorted(found, key=rank)[:cap])


class _ForwardRecords:
    """What ``PassageIndex._spans`` reads of the candidate pages: their positions records,
    from the request when it carries them (``AlignRequest.to_bytes(forward=True)``), else
    from the store."""

    def __init__(self, store: Store | None) -> None:
        self.store = store
        self.positions: dict[int, bytes] | None = None

    def get(self, family: str, key: bytes) -> bytes | None:
        if self.positions is not None and family == "positions":
            return self.positions.get(read_u64(key))
        if self.store is None:
            raise KeyError(f"the align stage has no store to read {family!r} records from")
        return self.store.get(family, key)


class Aligner:
    """The align stage for one engine configuration (cheap; one per process or thread).
    ``store``: where the candidates' forward records are read (the store, or a secondary
    instance of it that catches up with the writer when a record is not there yet);
    without one, only requests that carry them can be aligned."""

    def __init__(self, config: EngineConfig, store: Store | None = None) -> None:
        self.store = store
        self.forward = _ForwardRecords(store)
        # a passage index over the forward records only: its span code, no lists
        self.spans = PassageIndex(self.forward, config)  # type: ignore[arg-type]
        self.cfg = config.passage

    def read_forward(self, ordinals: list[int]) -> list[bytes | None]:
        """The candidates' windows values; a secondary instance catches up once if some
        are newer than what it has seen."""
        if self.store is None:
            raise KeyError("the request carries no forward data and the align stage has no "
                           "store (Indexer.with_forward attaches it)")
        keys = [u64(o) for o in ordinals]
        found = self.store.multi_get("forward", keys)
        if any(v is None for v in found) and self.store.catch_up():
            found = self.store.multi_get("forward", keys)
        return found

    def align(self, request: Any) -> list[tuple[str, list[Span]]]:
        """Passage matches of ``request`` (an ``index.AlignRequest``): (earlier page id,
        spans) per earlier page, in ordinal order."""
        idx = self.spans
        carried = request.has_forward
        t = request.tasks.gather(self.read_forward)
        h_t, h_s, h_e, h_x = idx.scan(t)
        hits = list(zip(t.t_p[h_t].tolist(), t.t_o[h_t].tolist(), h_s.tolist(), h_e.tolist(),
                        h_x.tolist(), strict=True))
        others = request.others.tolist()
        if carried:
            self.forward.positions = dict(zip(others, request.other_positions, strict=True))
        q_starts, q_ends, q_units = _unpack_positions(request.positions)
        tokens = Tokens("", [], q_starts.astype(np.int64), q_ends.astype(np.int64))
        try:
            found = spans_of_hits(idx, hits, request.starts, request.ends, tokens, q_units)
        finally:
            self.forward.positions = None
        if carried:
            ids = dict(zip(others, request.other_ids, strict=True))
            return [(ids[other], spans) for other, spans in found]
        return [(self._doc_id(other), spans) for other, spans in found]

    def _doc_id(self, ordinal: int) -> str:
        assert self.store is not None
        raw = self.store.get("docs", u64(ordinal))
        if raw is None:
            raise KeyError(f"no document with ordinal {ordinal}")
        return str(msgpack.unpackb(raw)["id"])
