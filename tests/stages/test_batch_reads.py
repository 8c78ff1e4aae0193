"""The index stage's reads of a batch's pages at once (dupalign.runtime.batched ``Stored``,
``PageWrites.read_replays`` and ``read_exacts``): the answers of the reads one by one (the
oracle), for ids, replay keys and content hashes stored, staged in the pending batch, both,
and absent."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.errors import PageRejected
from dupalign.runtime.engine import Engine
from dupalign.stages.sketch import replay_key
from tests.runtime.test_batched import NEAR_ONLY, lifecycle_pages

pytestmark = pytest.mark.testdata


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), cut=st.integers(0, 30))
def test_reads_of_many_pages_answer_as_reads_one_by_one(
        tmp_path_factory: pytest.TempPathFactory, seed: int, cut: int) -> None:
    pages = lifecycle_pages(seed, 24)
    with Engine.open(tmp_path_factory.mktemp("reads") / "s", NEAR_ONLY) as engine:
        indexer = engine.indexer
        for page in pages[:cut]:  # stored one by one
            with contextlib.suppress(PageRejected):
                engine.process(page)
        indexer.begin_batch()  # the rest staged in the pending batch (a removal writes it)
        for page in pages[cut:]:
            with contextlib.suppress(PageRejected):
                sk = engine.sketch(page)
                indexer.finish(indexer.index(sk, defer=True), [])
        assert indexer.writes.pending is not None
        ids = [p.id for p in pages] + ["never-seen"]
        assert indexer.current_many(ids) == [indexer.current(d) for d in ids]
        keys = [replay_key(p) for p in pages if isinstance(p.body, str)] + [b"\x00" * 16]
        one_by_one = [indexer.writes.replay(k) for k in keys]
        indexer.writes.read_replays(keys)
        assert indexer.writes.pending.stored_replay, "the reads were kept"
        assert [indexer.writes.replay(k) for k in keys] == one_by_one
        hashes = [b"\x00" * 16, b"\xff" * 16]
        for page in pages:
            with contextlib.suppress(PageRejected):
                hashes.append(engine.sketch(page).content_hash)
        one_by_one_exact = [indexer.writes.exact(h) for h in hashes]
        indexer.writes.read_exacts(hashes)
        assert indexer.writes.pending.stored_exact, "the reads were kept"
        assert [indexer.writes.exact(h) for h in hashes] == one_by_one_exact
        indexer.end_batch()
