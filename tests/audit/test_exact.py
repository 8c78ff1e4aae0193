"""The audit's exact answers against their brute-force twins (all pairs, all subsequences)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.audit.exact import (
    Windows,
    aligned,
    aligned_brute,
    within_hamming,
    within_hamming_brute,
)
from dupalign.audit.reservoir import draw
from dupalign.config import EngineConfig, PassageConfig
from dupalign.passage import forward
from dupalign.passage.sketch import PassageSketcher


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, (1 << 64) - 1), max_size=60), st.integers(0, (1 << 64) - 1),
       st.integers(0, 64), st.integers(0, 70), st.randoms())
def test_within_hamming_is_all_pairs(fps: list[int], fp: int, h: int, before: int,
                                     rnd: object) -> None:
    # some rows a few bits away, so that small bounds find something
    fps = fps + [fp ^ (1 << b) ^ (1 << (b * 7 % 64)) for b in range(0, 64, 9)]
    ords = list(range(len(fps)))
    got = within_hamming(np.array(fps, dtype=np.uint64), np.array(ords, dtype=np.int64),
                         fp, h, before)
    assert got.tolist() == within_hamming_brute(fps, ords, fp, h, before)


def _sketcher(k: int, theta: str, min_len: int) -> PassageSketcher:
    return PassageSketcher(EngineConfig(passage=PassageConfig(
        k=k, theta=theta, shingle=1, query_len=12, stride=6, min_len=min_len)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 11), min_size=4, max_size=30),
       st.lists(st.integers(0, 11), min_size=4, max_size=30),
       st.sampled_from([4, 8]), st.sampled_from(["1/2", "3/10", "3/4", "1"]),
       st.integers(1, 6), st.booleans(), st.integers(0, 2 ** 32))
def test_aligned_is_every_subsequence(a: list[int], b: list[int], k: int, theta: str,
                                      min_len: int, stop: bool, seed: int) -> None:
    sk = _sketcher(k, theta, min_len)
    # a small alphabet so that pages share units; units hashed as the index hashes them
    qa = np.array([draw(1, x, 3) for x in a], dtype=np.uint64)
    tb = np.array([draw(1, x, 3) for x in b], dtype=np.uint64)
    starts = np.arange(0, len(qa), 6, dtype=np.int64)
    ends = np.minimum(len(qa), starts + 12)
    keys, empty = sk.sketches(qa, starts, ends)
    r = sk.windows(tb)
    w = Windows.from_record(forward.pack_rects(
        r.bin, r.key, r.i_lo, r.i_hi, r.j_lo, r.j_hi, r.empty, np.flatnonzero(~r.empty)))
    stopped = None
    if stop:  # some bins' lists are stop lists
        rng = np.random.default_rng(seed)
        stopped = rng.random(keys.shape) < 0.3
    p, q = (int(x) for x in ([*theta.split("/"), "1"])[:2])
    assert aligned(keys, empty, w, p, q, min_len, stopped) == aligned_brute(
        keys, empty, w, p, q, min_len, len(tb), stopped)


def test_draw_is_deterministic_and_spread() -> None:
    values = [draw(5, o, 2) for o in range(2000)]
    assert values == [draw(5, o, 2) for o in range(2000)]
    share = sum(v < (1 << 62) for v in values) / len(values)  # about a quarter
    assert 0.2 < share < 0.3
