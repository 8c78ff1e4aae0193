"""The near sketch's fused steps against their plain compositions; the simhash table's load."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, PassageConfig
from dupalign.near import index as near_index
from dupalign.near.cws import minhash_sketch
from dupalign.near.idf import IdfBuilder, IdfTable, tf_idf_weights
from dupalign.near.index import _SHINGLE_SALT, distinct_counts, near_sketch
from dupalign.near.simhash import weighted_simhash
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.store import tables
from dupalign.store.database import Store
from dupalign.store.keys import read_u64, u64
from dupalign.text.hashing import shingle_hashes

hashes_st = st.lists(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 20)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(hashes_st)
def test_distinct_counts_match_unique(h: list[int]) -> None:
    arr = np.array(h, dtype=np.uint64)
    uniq, counts = distinct_counts(arr)
    exp_u, exp_c = np.unique(arr, return_counts=True)
    assert uniq.dtype == np.uint64 and counts.dtype == np.int64
    assert uniq.tolist() == exp_u.tolist() and counts.tolist() == exp_c.tolist()


_GOLDEN_INVERSE = pow(0x9E3779B97F4A7C15, -1, 2**64)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**20), max_size=300), st.lists(st.integers(0, 2**64 - 1),
                                                                 max_size=30))
@example(list(range(100)) * 2, [])  # 200 in one slot: ~20,000 probes, past the budget
def test_distinct_counts_of_values_made_to_collide_match_unique(small: list[int],
                                                                 other: list[int]) -> None:
    """Values whose table slot is the same (Fibonacci hashing: k / golden mod 2^64 lands in
    slot 0 for small k), with others between: long probes, then the sort of all values."""
    arr = np.array([k * _GOLDEN_INVERSE % 2**64 for k in small] + other, dtype=np.uint64)
    np.random.default_rng(len(small)).shuffle(arr)
    uniq, counts = distinct_counts(arr)
    exp_u, exp_c = np.unique(arr, return_counts=True)
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


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**40)),
                     max_size=40, unique_by=lambda r: r[1]),
       chunk=st.integers(1, 7))
def test_fingerprints_load_in_chunks_as_the_keys_read_one_by_one(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[int, int]], chunk: int
) -> None:
    path = tmp_path_factory.mktemp("fp") / "s"
    store = Store(path, {"t": 1})
    batch = store.batch()
    batch.put_many("simhash", [u64(f) + u64(o) for f, o in rows], [b""] * len(rows))
    store.write(batch)
    fps, ords = tables.simhash.load(store, chunk)
    keys = [key for key, _ in store.items("simhash")]
    store.close()
    assert fps.dtype == np.uint64 and ords.dtype == np.int64
    assert fps.tolist() == [read_u64(k) for k in keys]
    assert ords.tolist() == [read_u64(k, 8) for k in keys]
    assert sorted(zip(fps.tolist(), ords.tolist(), strict=True)) == sorted(rows)


def test_volatility_model_after_reopen_is_the_model_of_one_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is written whole at checkpoints and logged per page in between: reopened
    anywhere (a crash loses no written page: nothing is written at close), it is the model
    an uninterrupted run has after the same pages, byte for byte."""
    monkeypatch.setattr(near_index, "MODEL_CHECKPOINT", 3)
    rng = np.random.default_rng(5)
    vocab = [f"w{i}" for i in range(400)]
    pages = [Page(id=f"p{i}", body=" ".join(rng.choice(vocab, 120))) for i in range(11)]
    cfg = EngineConfig(passage=PassageConfig(enabled=False)).validate()

    def run(stops: set[int], store: Path) -> list[bytes]:
        models = []
        engine = Engine.open(store, cfg)
        for i, p in enumerate(pages):
            if i in stops:
                engine.close()
                engine = Engine.open(store, cfg)
            engine.process(p)
            models.append(engine.indexer.near.model.to_bytes())
        engine.close()
        engine = Engine.open(store, cfg)
        models.append(engine.indexer.near.model.to_bytes())
        engine.close()
        return models

    straight = run(set(), tmp_path / "one")
    assert straight[-1] == straight[-2] and straight[0] != straight[-1]
    assert run({1, 3, 4, 7, 9, 10}, tmp_path / "two") == straight


def test_the_volatility_model_learns_until_the_last_idf_freeze_then_stays(tmp_path: Path
                                                                       ) -> None:
    """docs/pipeline.md, rules 3 and 7: the model learns from consecutive pages (a serial
    computation), so it stops at the last idf freeze; the probes use the model taken at
    the latest freeze; a reopened store has the same models."""
    base = EngineConfig()
    config = replace(base, near=replace(base.near, idf_freeze_at=(3, 6)))
    store = Store(tmp_path / "s", config.frozen_params())
    index = near_index.NearIndex(store, config, 0)
    rng = np.random.default_rng(5)
    models, in_force = [], []
    prior = index.in_force.to_bytes()
    for ordinal in range(12):
        state = near_sketch(rng.integers(0, 300, 60).astype(np.uint64), index.idf, config)
        batch = store.batch()
        index.stage(batch, ordinal, state)
        store.write(batch)
        index.commit(ordinal, state)
        models.append(index.model.to_bytes())
        in_force.append(index.in_force.to_bytes())
    assert len(index.tables) == 3  # uniform + the two frozen tables
    assert len(set(models[:6])) == 6  # learning: every page changes it
    assert set(models[5:]) == {models[5]}  # from the sixth page (the last freeze) on: stays
    # rule 7: the probes' model is the one taken at the latest freeze (the prior before)
    assert in_force[:2] == [prior] * 2
    assert in_force[2:5] == [models[2]] * 3 and in_force[5:] == [models[5]] * 7
    store.close()
    reopened = near_index.NearIndex(Store(tmp_path / "s", config.frozen_params()), config, 12)
    assert reopened.model.to_bytes() == models[-1]
    assert reopened.in_force.to_bytes() == models[5]
