"""The index shards as roles (``kafka.index_shards = 2``: the index role is the fan-in, two
``--roles shard`` processes hold the keyed index) against a real broker, each role in its
own OS process: the matches are exactly those of one ``scan`` over the pages in
``sequence`` order; a shard moved to a fresh store directory rebuilds by replaying its
``keys`` partition; a SIGKILL of a shard mid-stream loses and repeats nothing."""

from __future__ import annotations

import collections
import signal
from pathlib import Path

import pytest

from tests.test_worker_kafka import clough_pages, match_key
from tests.topology_harness import (
    Topology,
    progressed,
    rfc_pages,
    synthetic_pages,
    wait_log,
)
from worker import messages

pytestmark = pytest.mark.kafka


async def matches_equal_scan(topo: Topology, n_pages: int, oracle: Path) -> None:
    published = await topo.published(n_pages, timeout=300)
    expected = await topo.scan_in_sequence_order(oracle)
    got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
    assert {k[1] for k in expected} == {"exact", "near", "passage"}
    twice = [k for k, n in got.items() if n > expected[k]]
    assert not twice, f"published twice: {twice[:5]}"
    assert got == expected


@pytest.mark.testdata
async def test_two_index_shards_as_processes_give_the_matches_of_scan(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Test (a) of issue 12 with 2 shards: 2 sketch + the fan-in + 2 shard + 2 align."""
    topo = await Topology(kafka_bootstrap, tmp_path, index_shards=2).create()
    try:
        for role in ("sketch", "sketch", "align", "align"):
            topo.start(role)
        topo.start("index", tmp_path / "fan-in")
        _, log_a = topo.start("shard", tmp_path / "shards-a")
        _, log_b = topo.start("shard", tmp_path / "shards-b")
        pages = clough_pages() + rfc_pages(max_bytes=60_000) + synthetic_pages(100, seed=3)
        await topo.send(pages)
        await matches_equal_scan(topo, len(pages), tmp_path / "oracle")
        # the shards' stores hold the lists, the fan-in's none (a process that owned a
        # partition before a rebalance keeps that store too)
        owned = {p.name for d in ("shards-a", "shards-b") for p in (tmp_path / d / "shards")
                 .iterdir()}
        assert owned == {"0", "1"}
        for log in (log_a, log_b):
            assert "index shard " in log.read_text()
        assert not (tmp_path / "fan-in" / "shards").exists()
    finally:
        topo.stop_all()
