"""Align partitions keyed by the candidate's id: a request split by its candidates' owners
(``AlignRequest.split_by``, with ``directory_owner`` as the combine's ``request_parts``), each
part aligned by an ``Aligner`` on a ``ForwardReader`` that holds only the forward records of
the pages that part owns (``PartForward``, as an align partition's store holds its own ids'
records), the parts' best pages merged
(``merge_ranked``): the matches of one ``Aligner.align`` of the whole request, with
``passage.max_matches`` binding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.match import Span
from dupalign.runtime.engine import Engine
from dupalign.stages.align import Aligner, RankedPage, merge_ranked
from dupalign.stages.directory import directory_owner
from dupalign.stages.messages import AlignRequest
from dupalign.wire.forward_record import decode_forward
from tests.passage.test_align_caps import dense_pages


class PartForward:
    """A ``ForwardReader`` (dupalign.store.forward_reader) of the pages one part owns."""

    def __init__(self) -> None:
        self.records: dict[int, tuple[str, bytes, bytes]] = {}

    def windows(self, ordinals: list[int]) -> list[bytes | None]:
        return [self.records[o][1] if o in self.records else None for o in ordinals]

    def positions(self, ordinal: int) -> bytes | None:
        return self.records[ordinal][2] if ordinal in self.records else None

    def doc_id(self, ordinal: int) -> str | None:
        return self.records[ordinal][0] if ordinal in self.records else None

    def catch_up(self) -> bool:
        return False


@pytest.mark.parametrize(("parts", "max_matches", "seed"),
                         [(1, 3, 1), (2, 3, 2), (3, 2, 3), (5, 4, 4), (4, 100, 5)])
def test_a_request_aligned_in_parts_gives_the_matches_of_the_whole(
        tmp_path: Path, parts: int, max_matches: int, seed: int) -> None:
    cfg = EngineConfig(near=NearConfig(enabled=False), passage=PassageConfig(
        max_matches=max_matches)).validate()
    stores = {p: PartForward() for p in range(parts)}
    aligners = {p: Aligner(cfg, store=s) for p, s in stores.items()}
    ids: dict[int, str] = {}  # store ordinal -> id of the pages with forward records
    capped = 0
    split_pages = 0
    with Engine.open(tmp_path / "index", cfg) as engine:
        for page in dense_pages(36, seed):
            result = engine.index(engine.sketch(page))
            hit_before = engine.aligner.counters.pages_hit
            whole = engine.align(result)
            if result.align is not None:
                owner = np.array([directory_owner(ids[o], parts)
                                  for o in result.align.tasks.t_o.tolist()], dtype=np.int64)
                split = result.align.split_by(owner)
                assert sorted(o for r in split.values() for o in r.others.tolist()) \
                    == result.align.others.tolist()
                split_pages += len(split) > 1
                ranked = []
                for p, part in split.items():
                    assert set(part.others.tolist()) <= {
                        o for o in result.align.others.tolist()
                        if directory_owner(ids[o], parts) == p}
                    wire = AlignRequest.from_bytes(part.to_bytes(forward=False))
                    ranked.append(aligners[p].align_ranked(wire))
                assert merge_ranked(ranked, max_matches) == whole
                capped += engine.aligner.counters.pages_hit - hit_before > max_matches
            engine.indexer.finish(result, whole)
            record = None if result.ordinal is None else engine.forward_record(
                result.ordinal)
            if record is not None:
                assert result.ordinal is not None
                ids[result.ordinal] = page.id
                stores[directory_owner(page.id, parts)].records[result.ordinal] = (page.id,
                                                                                  *record)
    if max_matches < 10:
        assert capped > 0  # the cap bound: the merge chose among the parts' best
    if parts > 1:
        assert split_pages > 0


def _span(x: int) -> Span:
    return Span(tokens=(x, x + 1), chars=(x, x + 1), match_tokens=(0, 1), match_chars=(0, 1),
                est_jaccard=0.5)


pages_st = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4), st.integers(0, 3),
                              st.booleans()), max_size=14, unique_by=lambda t: t[0])


@settings(max_examples=200, deadline=None)
@given(pages_st, st.integers(1, 4), st.integers(1, 5))
def test_merge_ranked_equals_ranking_the_whole(pages: list[Any], parts: int, cap: int) -> None:
    """Ranking every page and keeping ``cap`` (what one process does) equals merging the
    parts' own best ``cap`` pages: the keys of a page are its own."""
    ranked = [RankedPage(o, covered, est / 4, [_span(o)] if spans else [], f"d{o}")
              for o, covered, est, spans in pages]
    best = sorted(ranked, key=lambda r: (-r.covered, -r.best_est, r.ordinal))[:cap]
    want = [(r.doc_id, r.spans) for r in sorted(best, key=lambda r: r.ordinal) if r.spans]
    per_part = [sorted((r for r in ranked if r.ordinal % parts == p),
                       key=lambda r: (-r.covered, -r.best_est, r.ordinal))[:cap]
                for p in range(parts)]
    assert merge_ranked(per_part, cap) == want


def test_forward_records_of_the_version_before_are_read_and_older_ones_refused() -> None:
    """A rolling upgrade: an align partition reads forward records of version 1 (int32
    positions, from a sketch role not yet upgraded) as it reads its own; an older version
    is refused, not misread."""
    for v in (1, 2):
        value = msgpack.packb({"v": v, "id": f"p{v}", "forward": b"w" * 8,
                               "positions": b"x"}, use_bin_type=True)
        assert decode_forward(value)[:3] == (f"p{v}", b"w" * 8, b"x")
    with pytest.raises(ValueError, match="forward record version 0"):
        decode_forward(msgpack.packb({"v": 0}))
