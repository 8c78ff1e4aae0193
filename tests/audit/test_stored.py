"""What the audit keeps and reads back: passage sketches from a stored page's windows (twin:
the sketch stage's own), the reservoir (bounded, deterministic, kept across a reopen)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.audit.exact import Windows
from dupalign.audit.reservoir import Reservoir, draw
from dupalign.audit.stored import passage_sketches_from
from dupalign.config import EngineConfig, PassageConfig
from dupalign.passage import forward
from dupalign.passage.sketch import PassageSketcher, passage_starts
from dupalign.store.database import Store


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=120), st.sampled_from([4, 8, 16]),
       st.integers(4, 30), st.data())
def test_sketches_from_windows_are_the_sketch_stages(
        words: list[int], k: int, query_len: int, data: st.DataObject) -> None:
    stride = data.draw(st.integers(1, query_len))
    sk = PassageSketcher(EngineConfig(passage=PassageConfig(
        k=k, shingle=1, query_len=query_len, stride=stride, min_len=1)))
    units = np.array([draw(2, x, 3) for x in words], dtype=np.uint64)
    starts = np.asarray(passage_starts(len(units), query_len, stride), dtype=np.int64)
    keys, empty = sk.sketches(units, starts, np.minimum(len(units), starts + query_len))
    r = sk.windows(units)
    w = Windows.from_record(forward.pack_rects(
        r.bin, r.key, r.i_lo, r.i_hi, r.j_lo, r.j_hi, r.empty, np.flatnonzero(~r.empty)))
    got_keys, got_empty, unknown = passage_sketches_from(w, k, query_len, stride)
    assert not unknown.any()
    assert (got_empty == empty).all()
    assert (got_keys[~empty] == keys[~empty]).all()


def test_reservoir_is_bounded_deterministic_and_kept(tmp_path: Path) -> None:
    def fill(path: Path) -> list[int]:
        store = Store(path, {"seed": 1})
        try:
            res = Reservoir(store, 16, seed=3)
            for o in range(500):
                res.offer(o, b"w%d" % o)
                assert len(res) <= 16
            res.removed([o for o, _ in res.pages(500)][:4])
            assert len(res) == 12
            res.offer(500, b"w500")  # a free slot is taken first
            assert 500 in [o for o, _ in res.pages(501)]
            return [o for o, _ in res.pages(501)]
        finally:
            store.close()

    kept = fill(tmp_path / "a")
    assert kept == fill(tmp_path / "b")  # same seed, same pages
    assert sum(o < 250 for o in kept) >= 3  # not only the newest: a sample of them all
    store = Store(tmp_path / "a", {"seed": 1})  # reopened: the same reservoir
    try:
        again = Reservoir(store, 16, seed=3)
        assert [o for o, _ in again.pages(501)] == kept
        assert dict(again.pages(501))[kept[0]] == b"w%d" % kept[0]
    finally:
        store.close()
