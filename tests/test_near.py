"""The near sketch's fused steps against their plain compositions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig
from dupalign.cws import minhash_sketch
from dupalign.hashing import shingle_hashes
from dupalign.idf import IdfBuilder, IdfTable, tf_idf_weights
from dupalign.near import _SHINGLE_SALT, distinct_counts, near_sketch
from dupalign.simhash import weighted_simhash

hashes_st = st.lists(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 20)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(hashes_st)
def test_distinct_counts_match_unique(h: list[int]) -> None:
    arr = np.array(h, dtype=np.uint64)
    uniq, counts = distinct_counts(arr)
    exp_u, exp_c = np.unique(arr, return_counts=True)
    assert uniq.dtype == np.uint64 and counts.dtype == np.int64
    assert uniq.tolist() == exp_u.tolist() and counts.tolist() == exp_c.tolist()


@settings(max_examples=100, deadline=None)
@given(hashes_st, st.booleans())
def test_near_sketch_is_the_composition_of_its_steps(h: list[int], idf_known: bool) -> None:
    """Fingerprint, W and verification sketch as tf_idf_weights, weighted_simhash and
    minhash_sketch of shingle_hashes compute them."""
    cfg = EngineConfig().validate()
    arr = np.array(h, dtype=np.uint64)
    idf = IdfTable.uniform()
    if idf_known:
        b = IdfBuilder()
        b.add_document(arr[: len(arr) // 2])
        b.add_document(arr[len(arr) // 3:])
        idf = b.freeze(1)
    state = near_sketch(arr, idf, cfg)
    if len(arr) < cfg.near.min_tokens:
        assert not state.indexed
        return
    uniq, w = tf_idf_weights(arr, idf, "log")
    fp, W = weighted_simhash(uniq, w)
    assert state.unique is not None and state.unique.tolist() == uniq.tolist()
    assert state.fingerprint == fp and state.W is not None
    assert state.W.tolist() == W.tolist()
    sketch = minhash_sketch(shingle_hashes(arr, cfg.near.shingle, _SHINGLE_SALT),
                            cfg.near.cws_samples, cfg.seed)
    assert state.sketch is not None and state.sketch.tolist() == sketch.tolist()
