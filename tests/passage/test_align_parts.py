"""Align shards keyed by earlier page: a request split by its candidates' owners
(``AlignRequest.split``), each part aligned by an ``Aligner`` on a store that holds only
the forward records of the pages that part owns (``dupalign.store.forward_copy.ForwardCopy``, filled
as from the forward topic), the parts' best pages merged (``merge_ranked``): the matches of
one ``Aligner.align`` of the whole request, with ``passage.max_matches`` binding."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.match import Span
from dupalign.runtime.engine import Engine
from dupalign.service.align_store import forward_changes
from dupalign.stages.align import Aligner, RankedPage, merge_ranked
from dupalign.stages.messages import AlignRequest
from dupalign.store.forward_copy import ForwardCopy
from dupalign.store.keys import u64
from dupalign.wire.forward_record import encode_forward
from tests.passage.test_align_caps import dense_pages


class Record(NamedTuple):  # what the align role reads from the forward topic
    key: bytes
    value: bytes | None


def forward_record(engine: Engine, ordinal: int, doc_id: str) -> Record:
    record = engine.forward_record(ordinal)
    assert record is not None
    return Record(u64(ordinal), encode_forward(doc_id, *record))


@pytest.mark.parametrize(("parts", "max_matches", "seed"),
                         [(1, 3, 1), (2, 3, 2), (3, 2, 3), (5, 4, 4), (4, 100, 5)])
def test_a_request_aligned_in_parts_gives_the_matches_of_the_whole(
        tmp_path: Path, parts: int, max_matches: int, seed: int) -> None:
    cfg = EngineConfig(near=NearConfig(enabled=False), passage=PassageConfig(
        max_matches=max_matches)).validate()
    stores = {p: ForwardCopy(tmp_path / f"align-{p}") for p in range(parts)}
    aligners = {p: Aligner(cfg, store=s) for p, s in stores.items()}
    capped = 0
    split_pages = 0
    try:
        with Engine.open(tmp_path / "index", cfg) as engine:
            for page in dense_pages(36, seed):
                result = engine.index(engine.sketch(page))
                hit_before = engine.aligner.counters.pages_hit
                whole = engine.align(result)
                if result.align is not None:
                    split = result.align.split(parts)
                    assert sorted(o for r in split.values() for o in r.others.tolist()) \
                        == result.align.others.tolist()
                    split_pages += len(split) > 1
                    ranked = []
                    for p, part in split.items():
                        assert set(part.others.tolist()) <= {
                            o for o in result.align.others.tolist() if o % parts == p}
                        wire = AlignRequest.from_bytes(part.to_bytes(forward=False))
                        ranked.append(aligners[p].align_ranked(wire))
                    assert merge_ranked(ranked, max_matches) == whole
                    capped += engine.aligner.counters.pages_hit - hit_before > max_matches
                engine.indexer.finish(result, whole)
                if result.ordinal is not None:
                    p = result.ordinal % parts
                    stores[p].apply(p, forward_changes([forward_record(engine, result.ordinal,
                                                                       page.id)]),
                                    result.ordinal + 1)
    finally:
        for s in stores.values():
            s.close()
    if max_matches < 10:
        assert capped > 0  # the cap bound: the merge chose among the parts' best
    if parts > 1:
        assert split_pages > 0


def test_a_page_that_left_the_index_leaves_the_align_store(tmp_path: Path) -> None:
    store = ForwardCopy(tmp_path / "a")
    try:
        store.apply(1, forward_changes([Record(u64(5), encode_forward("p5", b"w", b"pos"))]), 7)
        assert store.windows([5]) == [b"w"] and store.offset(1) == 7
        assert store.has_all([5]) and not store.has_all([5, 9])
        store.apply(1, forward_changes([Record(u64(5), None)]), 8)
        assert store.windows([5]) == [None] and store.doc_id(5) is None
        assert store.offset(1) == 8 and store.offset(0) is None
    finally:
        store.close()


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


def test_forward_records_of_the_version_before_are_read_and_older_ones_refused(
        tmp_path: Path) -> None:
    """A rolling upgrade: the align store reads forward records of version 1 (int32
    positions, from an index role not yet upgraded) as it reads its own; an older version
    is refused, not misread."""
    import msgpack

    store = ForwardCopy(tmp_path / "a")
    try:
        for v in (1, 2):
            value = msgpack.packb({"v": v, "id": f"p{v}", "forward": b"w" * 8,
                                   "positions": b"x"}, use_bin_type=True)
            store.apply(0, forward_changes([Record(u64(v), value)]), v + 1)
            assert store.windows([v]) == [b"w" * 8]
        with pytest.raises(ValueError, match="forward record version 0"):
            store.apply(0, forward_changes([Record(u64(9), msgpack.packb({"v": 0}))]), 10)
    finally:
        store.close()
