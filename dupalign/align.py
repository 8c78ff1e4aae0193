"""The align stage: a page's alignment tasks → its passage matches, with no index state.

Input: an ``AlignRequest`` (dupalign.index), the tasks of one page against its earlier
candidate pages with those pages' windows as the index gathered them, and their token
character offsets (the share of their forward records that spans cite). Steps: per task,
the rectangles gathered, the viability cut and the interval scan
(``passage_align.scan_tasks``), then the hits on one page merged into maximal spans with
token and character ranges (``PassageIndex._spans``, the same code as the one-thread
query). Runs anywhere: other threads, other processes, later other machines.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from dupalign.config import EngineConfig
from dupalign.match import Span, best_span
from dupalign.passages import PassageIndex, _Hit, _unpack_positions
from dupalign.store import read_u64
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
    """What ``PassageIndex._spans`` reads from the store, served from the tasks instead:
    the candidate pages' token character offsets."""

    def __init__(self) -> None:
        self.positions: dict[int, bytes] = {}

    def get(self, family: str, key: bytes) -> bytes | None:
        if family != "positions":
            raise KeyError(f"the align stage has no {family!r} records")
        return self.positions.get(read_u64(key))


class Aligner:
    """The align stage for one engine configuration (cheap; one per process or thread)."""

    def __init__(self, config: EngineConfig) -> None:
        self.forward = _ForwardRecords()
        # a passage index over the forward records only: its span code, no lists, no store
        self.spans = PassageIndex(self.forward, config)  # type: ignore[arg-type]
        self.cfg = config.passage

    def align(self, request: Any) -> list[tuple[str, list[Span]]]:
        """Passage matches of ``request`` (an ``index.AlignRequest``): (earlier page id,
        spans) per earlier page, in ordinal order."""
        idx = self.spans
        t = request.tasks
        h_t, h_s, h_e, h_x = idx.scan(t)
        hits = list(zip(t.t_p[h_t].tolist(), t.t_o[h_t].tolist(), h_s.tolist(), h_e.tolist(),
                        h_x.tolist(), strict=True))
        others = request.others.tolist()
        self.forward.positions = dict(zip(others, request.other_positions, strict=True))
        q_starts, q_ends, q_units = _unpack_positions(request.positions)
        tokens = Tokens("", [], q_starts.astype(np.int64), q_ends.astype(np.int64))
        ids = dict(zip(others, request.other_ids, strict=True))
        try:
            found = spans_of_hits(idx, hits, request.starts, request.ends, tokens, q_units)
        finally:
            self.forward.positions = {}
        return [(ids[other], spans) for other, spans in found]
