"""Pages whose sketches exceed a record: the sketch role sends them as parts, the index role
puts them together (dupalign/service/parts.py), and the topology gives ``scan``'s matches
with nothing dead-lettered; with default settings, up to pages of several MB."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

import numpy as np
import pytest

from dupalign.page import Page
from dupalign.service.parts import PART_HEADER
from dupalign.wire import messages
from tests.corpora import DEMO, words
from tests.service.test_worker_kafka import match_key, set_max_message_bytes
from tests.topology_harness import Topology

pytestmark = pytest.mark.kafka

VOCAB = [w for f in sorted((DEMO / "rfc").glob("*.txt"))
         for w in words(f.read_text("utf-8", "replace"))]


def text(rng: np.random.Generator, n_words: int) -> list[str]:
    """Runs of the demo RFCs' words from random places: text no page shares by chance."""
    out: list[str] = []
    while len(out) < n_words:
        start = int(rng.integers(0, len(VOCAB) - 200))
        out += VOCAB[start:start + int(rng.integers(20, 200))]
    return out[:n_words]


def copying(rng: np.random.Generator, source: list[str], i: int) -> Page:
    """A short page with a passage of ``source`` in the middle."""
    a = int(rng.integers(0, len(source) - 300))
    body = text(rng, 150) + source[a:a + 250] + text(rng, 150)
    return Page(id=f"copy-{i}", body=" ".join(body), content_type="text/plain")


def holds_one_partition(log: Path) -> bool:
    assigned = [line for line in (log.read_text() if log.exists() else "").splitlines()
                if "sketch role assigned" in line]
    return bool(assigned) and assigned[-1].count("pages-") == 1


async def published_equals_scan(topo: Topology, pages: list[Page], timeout: float) -> None:
    published = await topo.published(len(pages), timeout=timeout)
    topo.stop_all()
    expected = await topo.scan_in_sequence_order(topo.tmp / "oracle")
    got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
    assert collections.Counter(k[1] for k in expected.elements())["passage"] >= 2, expected
    assert got == expected
    assert not await topo.read("dlq")


async def test_sketches_over_the_topic_s_limit_go_as_interleaved_parts(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """A sketches topic made elsewhere takes 64 KB a record: two sketch processes (one
    per pages partition) send sketches of 200-500 KB as parts into its one partition, at
    the same time, so the index may read their parts interleaved (tests/service/test_parts.py
    covers every interleaving)."""
    rng = np.random.default_rng(5)
    topo = await Topology(kafka_bootstrap, tmp_path, batch_size=2).create()
    await set_max_message_bytes(kafka_bootstrap, topo.topic["sketches"], 64 << 10)
    big = [text(rng, int(rng.integers(3000, 7000))) for _ in range(6)]
    pages = [Page(id=f"big-{i}", body=" ".join(b), content_type="text/plain")
             for i, b in enumerate(big)]
    pages += [copying(rng, big[i], i) for i in (0, 3, 5)]
    sketchers = [topo.start("sketch")[1] for _ in range(2)]
    topo.start("index", tmp_path / "index")
    topo.start("align")
    try:
        # pages once each sketch process holds one partition (not while the second joins)
        deadline = time.monotonic() + 120
        while not all(holds_one_partition(log) for log in sketchers):
            topo.check_alive()
            assert time.monotonic() < deadline, topo.logs()
            await asyncio.sleep(0.5)
        await topo.send(pages)
        await published_equals_scan(topo, pages, timeout=300)
    finally:
        topo.stop_all()
    sketches = await topo.read("sketches")
    parts = [r for r in sketches if any(k == PART_HEADER for k, _ in r.headers)]
    assert len(parts) > 2 * len(big), "the big sketches were not sent as parts"
    assert max(len(r.value) for r in sketches) <= 64 << 10



@pytest.mark.parametrize("shards", [1, 2])
async def test_with_default_settings_a_page_of_several_mb_gives_the_single_worker_s_matches(
        kafka_bootstrap: str, tmp_path: Path, shards: int) -> None:
    """Default record and fetch sizes (1 MB records): a 3.4 MB page, whose sketch is ~40
    MB (and with 2 index shards, whose keys messages are several MB), goes through the
    topology like any other, and the pages that copy from it match it."""
    rng = np.random.default_rng(6)
    topo = await Topology(kafka_bootstrap, tmp_path, default_limits=True,
                          index_shards=shards).create()
    big = text(rng, 600_000)
    pages = [Page(id="huge", body=" ".join(big), content_type="text/plain")]
    assert len(pages[0].body) > 3 << 20
    pages += [copying(rng, big, i) for i in range(3)]
    for role in ("sketch", "align"):
        topo.start(role)
    topo.start("index", tmp_path / "index")
    if shards > 1:
        topo.start("shard", tmp_path / "shards")
    try:
        await topo.send(pages)
        await published_equals_scan(topo, pages, timeout=600)
    finally:
        topo.stop_all()
    if shards > 1:
        keys = await topo.read("keys")
        assert any(k == PART_HEADER for r in keys for k, _ in r.headers), \
            "no keys message was sent as parts"
        assert max(len(r.value) for r in keys) <= 1 << 20
