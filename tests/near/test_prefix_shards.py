"""The PSM table split by header prefix answers as one table (docs/pipeline.md, near stage)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.near.prefix_shards import (
    PrefixShard,
    combine,
    route,
    shard_of_fingerprint,
)
from dupalign.near.psm import psm_search_batch
from dupalign.near.psm_probes import probe_headers
from dupalign.near.simhash_table import SimhashTable
from tests.near.test_psm import make_table, queries_and_w, table_params


@settings(max_examples=80, deadline=None)
@given(params=table_params, h=st.integers(0, 4),
       budget=st.one_of(st.none(), st.integers(1, 40)),
       mode=st.sampled_from(["first", "all"]), b=st.integers(0, 4),
       header_bits=st.one_of(st.none(), st.integers(0, 10)), data=st.data())
def test_the_shards_answer_as_one_table(params, h, budget, mode, b, header_bits, data) -> None:
    """Rows split by their top b bits over 2^b tables (each with its own directory width and
    buffer), the probes made once with the whole table's width and routed: the union of the
    answers is the one table's, PSM_A and PSM_F, with and without an ordinal bound."""
    table, fps = make_table(params, header_bits=header_bits, buffer_min=16)
    allf, allo = table.all_arrays()
    owner = shard_of_fingerprint(allf, b)
    shards = [PrefixShard(s, b, SimhashTable(buffer_min=8)) for s in range(1 << b)]
    for s, shard in enumerate(shards):
        mine = np.flatnonzero(owner == s)
        cut = data.draw(st.integers(0, len(mine)))  # some merged, some still buffered
        shard.add(allf[mine[:cut]], allo[mine[:cut]])
        shard.table.flush()
        shard.add(allf[mine[cut:]], allo[mine[cut:]])
    t = table.probe_bits
    q, W = queries_and_w(params[0] + 3, fps, 24)
    offsets, headers = probe_headers(q, W, t, h, budget)
    routed = route(offsets, headers, t, b)
    # a probe narrower than the prefix meets 2^(b - t) shards, others one
    assert sum(len(r.query) for r in routed) == len(headers) << max(0, b - t)
    first = mode == "first"
    for before in (None, int(allo.max(initial=0)) // 2):
        want = psm_search_batch(table, q, W, h=h, budget=budget, mode=mode, before=before)
        if not first:  # the probes made apart are the ones the lookup spends
            assert np.diff(offsets).tolist() == want.probes.tolist()
        answers = [shard.answer(routed[s], q, t, h, before, first)
                   for s, shard in enumerate(shards)]
        got = combine(answers, len(q), first)
        for i in range(len(q)):
            assert sorted(got.get(i)) == sorted(want.get(i))


def test_a_probe_goes_to_the_shards_whose_prefix_it_meets() -> None:
    # a probe at least as wide as the prefix: one shard, its top b bits
    routed = route(np.array([0, 1]), np.array([0b101], dtype=np.uint64), 3, 2)
    assert [r.query.tolist() for r in routed] == [[], [], [0], []]
    # narrower: every shard under it; width 0 meets them all
    routed = route(np.array([0, 1]), np.array([0], dtype=np.uint64), 0, 2)
    assert [r.query.tolist() for r in routed] == [[0], [0], [0], [0]]
    routed = route(np.array([0, 2, 3]), np.array([0b1, 0b0, 0b1], dtype=np.uint64), 1, 2)
    assert [r.query.tolist() for r in routed] == [[0], [0], [0, 1], [0, 1]]
    assert [r.rank.tolist() for r in routed] == [[1], [1], [0, 0], [0, 0]]


def test_a_fingerprint_outside_the_shard_is_refused() -> None:
    shard = PrefixShard(1, 1)
    shard.add([np.uint64(1) << np.uint64(63)], [0])
    try:
        shard.add([np.uint64(5)], [1])
    except ValueError as e:
        assert "outside shard 1" in str(e)
    else:
        raise AssertionError("a row of shard 0 was taken by shard 1")
