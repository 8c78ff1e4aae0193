"""Weighted simhash: plain-Python twin, properties, and behaviour on real text (IETF RFCs)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.near.simhash import (
    hamming,
    hamming_many,
    popcount64,
    weighted_simhash,
    weighted_simhash_batch,
)
from dupalign.text.hashing import token_hashes
from tests.corpora import RFC


def simhash_twin(hashes: list[int], weights: list[float]) -> tuple[int, list[float]]:
    """VOSH Algorithm 1 as written (bits 0-based, bit set iff W_j > 0)."""
    w_sum = [0.0] * 64
    for h, w in zip(hashes, weights, strict=True):
        for j in range(64):
            if (h >> j) & 1:
                w_sum[j] += w
            else:
                w_sum[j] -= w
    fp = 0
    for j in range(64):
        if w_sum[j] > 0:
            fp |= 1 << j
    return fp, w_sum


u64 = st.integers(min_value=0, max_value=2**64 - 1)
weight = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
features = st.lists(st.tuples(u64, weight), max_size=40)


@settings(max_examples=300, deadline=None)
@given(features)
def test_matches_plain_python_twin(feats: list[tuple[int, float]]) -> None:
    hs = [h for h, _ in feats]
    ws = [w for _, w in feats]
    fp, w_sum = weighted_simhash(np.array(hs, dtype=np.uint64), np.array(ws))
    fp_twin, w_twin = simhash_twin(hs, ws)
    # same order of additions, so equality is exact, not approximate
    assert fp == fp_twin
    assert w_sum.tolist() == w_twin


@settings(max_examples=200, deadline=None)
@given(features, st.floats(min_value=1e-3, max_value=1e3))
def test_bit_is_sign_of_w_and_scaling_invariant(feats: list[tuple[int, float]], c: float) -> None:
    h = np.array([f[0] for f in feats], dtype=np.uint64)
    w = np.array([f[1] for f in feats])
    fp, w_sum = weighted_simhash(h, w)
    assert all(((fp >> j) & 1) == int(w_sum[j] > 0) for j in range(64))
    fp_c, w_c = weighted_simhash(h, w * c)
    # rounding can flip a bit only where W_j is ~0 relative to the total weight
    tol = 1e-9 * c * float(w.sum())
    for j in range(64):
        if abs(w_c[j]) > tol:
            assert ((fp_c >> j) & 1) == ((fp >> j) & 1)
    np.testing.assert_allclose(w_c, w_sum * c, rtol=1e-9, atol=tol)


@settings(max_examples=100, deadline=None)
@given(st.lists(features, min_size=0, max_size=6))
def test_batch_equals_single(docs: list[list[tuple[int, float]]]) -> None:
    h = np.array([f[0] for d in docs for f in d], dtype=np.uint64)
    w = np.array([f[1] for d in docs for f in d], dtype=np.float64)
    off = np.cumsum([0] + [len(d) for d in docs])
    fps, ws = weighted_simhash_batch(h, w, off)
    assert fps.shape == (len(docs),) and ws.shape == (len(docs), 64)
    for i, d in enumerate(docs):
        fp, w_sum = weighted_simhash(
            np.array([f[0] for f in d], dtype=np.uint64), np.array([f[1] for f in d])
        )
        assert int(fps[i]) == fp
        assert ws[i].tolist() == w_sum.tolist()


def test_identical_input_identical_output_and_single_feature() -> None:
    h = np.array([0b1011, 2**63], dtype=np.uint64)
    w = np.array([2.0, 1.0])
    assert weighted_simhash(h, w)[0] == weighted_simhash(h.copy(), w.copy())[0]
    # one feature: fp is the hash itself, W_j = ±w
    fp, w_sum = weighted_simhash(np.array([0xDEADBEEF], dtype=np.uint64), np.array([0.5]))
    assert fp == 0xDEADBEEF
    assert set(w_sum.tolist()) == {0.5, -0.5}
    # empty document: all W_j = 0, so no bit is set (W_j > 0 rule)
    fp0, w0 = weighted_simhash(np.array([], dtype=np.uint64), np.array([]))
    assert fp0 == 0 and not w0.any()


def test_bad_shapes_rejected() -> None:
    with pytest.raises(ValueError):
        weighted_simhash(np.zeros(3, dtype=np.uint64), np.ones(2))
    with pytest.raises(ValueError):
        weighted_simhash_batch(np.zeros(3, dtype=np.uint64), np.ones(3), [0, 2])


@settings(max_examples=200, deadline=None)
@given(st.lists(u64, max_size=30), st.lists(u64, max_size=30))
def test_popcount_and_hamming(xs: list[int], ys: list[int]) -> None:
    arr = np.array(xs, dtype=np.uint64)
    assert popcount64(arr).tolist() == [bin(x).count("1") for x in xs]
    for x in xs:
        for y in ys[:3]:
            assert hamming(x, y) == bin(x ^ y).count("1")
        assert hamming_many(x, np.array(ys, dtype=np.uint64)).tolist() == [
            bin(x ^ y).count("1") for y in ys
        ]


# --- real text ---------------------------------------------------------------------------


def _tokens(path: Path) -> list[str]:
    return re.findall(r"\w+", path.read_text(encoding="latin-1").lower())


def _fp_of_tokens(tokens: list[str]) -> int:
    # log-tf weights, uniform idf: what the engine does on a cold start
    uniq, counts = np.unique(token_hashes(tokens), return_counts=True)
    return weighted_simhash(uniq, 1.0 + np.log(counts))[0]


def _light_edit(tokens: list[str], rate: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for t in tokens:
        r = rng.random()
        if r < rate / 3:
            continue  # delete
        if r < 2 * rate / 3:
            out.append(f"edit{rng.randrange(10**6)}")  # substitute
            continue
        out.append(t)
        if r < rate:
            out.append(f"ins{rng.randrange(10**6)}")  # insert after
    return out


@pytest.mark.testdata
def test_light_edits_stay_close_unrelated_documents_do_not() -> None:
    names = ["rfc2821", "rfc8446", "rfc1034", "rfc7231"]
    docs = {n: _tokens(RFC / f"{n}.txt") for n in names}
    fps = {n: _fp_of_tokens(t) for n, t in docs.items()}
    edited = [
        hamming(fps[n], _fp_of_tokens(_light_edit(toks, 0.01, seed)))
        for n, toks in docs.items()
        for seed in range(3)
    ]
    unrelated = [hamming(fps[a], fps[b]) for i, a in enumerate(names) for b in names[i + 1 :]]
    # 1 % of tokens edited moves a few bits; different RFCs sit ~16-26 bits apart
    # (measured 0-7 vs 16-26): the two ranges must not overlap.
    assert max(edited) <= 8
    assert max(edited) < min(unrelated)
