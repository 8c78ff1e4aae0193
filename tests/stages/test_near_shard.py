"""The near stage split by fingerprint prefix finds what the single near index finds
(docs/pipeline.md, step 3): the same verified near duplicates, PSM_A and PSM_F, as pages
come and go."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig
from dupalign.near.idf import IdfTable
from dupalign.near.index import NearIndex, NearState, near_sketch
from dupalign.near.prefix_shards import route, shard_of_fingerprint
from dupalign.near.psm_probes import probe_headers
from dupalign.stages.near_shard import NearQuery, NearShard, combine_near
from dupalign.store.database import Store


def pages(seed: int, n: int) -> list[np.ndarray]:
    """Token streams in families: a base text and copies with a few tokens changed, so that
    many pairs are near duplicates within a few bits and some just outside."""
    rng = np.random.default_rng(seed)
    bases: list[np.ndarray] = []
    out = []
    for _ in range(n):
        if not bases or rng.random() < 0.3:
            bases.append(rng.integers(0, 400, int(rng.integers(12, 120))).astype(np.uint64))
            out.append(bases[-1])
            continue
        text = bases[int(rng.integers(0, len(bases)))].copy()
        for _ in range(int(rng.integers(0, max(1, len(text) // 8)))):
            text[int(rng.integers(0, len(text)))] = np.uint64(rng.integers(0, 400))
        out.append(text)
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(20, 160), b=st.integers(0, 3),
       mode=st.sampled_from(["all", "first"]), h=st.integers(2, 6),
       budget=st.integers(1, 24), removals=st.integers(0, 30))
def test_the_shards_find_what_the_single_near_index_finds(seed, n, b, mode, h, budget,
                                                          removals) -> None:
    compare(seed, n, b, mode, h, budget, removals)


def test_a_stream_with_many_near_duplicates_over_four_shards() -> None:
    assert compare(1, 160, 2, "all", 5, 24, 10) > 20
    assert compare(2, 160, 2, "first", 4, 6, 10) > 10


def compare(seed: int, n: int, b: int, mode: str, h: int, budget: int, removals: int) -> int:
    """Page by page, the single index's answer and the shards'; returns the near duplicates
    found."""
    base = EngineConfig()
    config = replace(base, near=replace(base.near, hamming=h, probe_budget=budget, mode=mode))
    rng = np.random.default_rng(seed + 1)
    gone_at = {int(rng.integers(1, n)): int(rng.integers(0, n)) for _ in range(removals)}
    with tempfile.TemporaryDirectory() as tmp:
        one = NearIndex(Store(Path(tmp) / "one", config.frozen_params()), config, 0)
        shards = [NearShard(Store(Path(tmp) / str(s), config.frozen_params()), config, s, b)
                  for s in range(1 << b)]
        alive: dict[int, NearState] = {}
        found = 0
        for ordinal, text in enumerate(pages(seed, n)):
            victim = gone_at.get(ordinal)
            if victim is not None and victim in alive:  # a page removed before this one
                fp = alive.pop(victim).fingerprint
                assert fp is not None
                batch = one.store.batch()
                one.stage_removal(batch, [(victim, fp)])
                one.store.write(batch)
                one.commit_removal([victim])
                shards[int(shard_of_fingerprint([fp], b)[0])].remove([(victim, fp)])
            state = near_sketch(text, IdfTable.uniform(), config)
            want = sorted(one.search(state, ordinal))
            if state.indexed:
                assert state.fingerprint is not None and state.W is not None
                assert state.sketch is not None
                t = one.table.header_width(sum(map(len, shards)))
                assert t == one.table.probe_bits
                offsets, headers = probe_headers([state.fingerprint], state.W[None, :], t, h,
                                                 budget, one.in_force)
                routed = route(offsets, headers, t, b)
                query = [NearQuery(state.fingerprint, state.sketch, ordinal)]
                got = combine_near([s.answer(routed[i], query, t) for i, s in
                                    enumerate(shards)], 1, mode == "first")[0]
                assert got == want
                found += len(got)
                batch = one.store.batch()
                one.stage(batch, ordinal, state)
                one.store.write(batch)
                one.commit(ordinal, state)
                shards[int(shard_of_fingerprint([state.fingerprint], b)[0])].add(
                    ordinal, state.fingerprint, state.sketch)
                alive[ordinal] = state
            else:
                assert want == []
        assert sum(map(len, shards)) == len(one.table) == len(alive)
        return found


def test_a_shard_refuses_a_page_of_another_prefix(tmp_path: Path) -> None:
    config = EngineConfig()
    shard = NearShard(Store(tmp_path / "s", config.frozen_params()), config, 1, 1)
    try:
        shard.add(0, 5, np.zeros(config.near.cws_samples, dtype=np.uint64))
    except ValueError as e:
        assert "outside shard 1" in str(e)
    else:
        raise AssertionError("a page of shard 0 was taken by shard 1")
