"""The index shards as roles (``kafka.index_shards = 2``: the index role is the fan-in, two
``--roles shard`` processes hold the keyed index) against a real broker, each role in its
own OS process: the matches are exactly those of one ``scan`` over the pages in
``sequence`` order; a shard moved to a fresh store directory rebuilds by replaying its
``keys`` partition; a SIGKILL of a shard mid-stream loses and repeats nothing."""

from __future__ import annotations

import asyncio
import collections
import re
import signal
import subprocess
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import NewTopic

from dupalign.config import EngineConfig, RetentionConfig
from dupalign.service.roles.shard_protocol import ShardMessage
from dupalign.service.topology import new_producer, record_ordinal
from dupalign.wire import messages
from tests.kafka_topics import create_topics
from tests.service.test_topology_kafka import alive_ids, delete_before, lifecycle_key
from tests.service.test_worker_kafka import clough_pages, match_key
from tests.topology_harness import (
    Topology,
    lifecycle_stream,
    progressed,
    rfc_pages,
    synthetic_pages,
    wait_log,
)

pytestmark = pytest.mark.kafka


async def matches_equal_scan(topo: Topology, n_pages: int, oracle: Path) -> None:
    published = await topo.published(n_pages, timeout=300)
    expected = await topo.scan_in_sequence_order(oracle)
    got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
    assert {k[1] for k in expected} == {"exact", "near", "passage"}
    twice = [k for k, n in got.items() if n > expected[k]]
    assert not twice, f"published twice: {twice[:5]}"
    assert got == expected


async def keys_sent_for(topo: Topology, ordinal: int) -> bool:
    """Whether the fan-in sent keys messages of the page at ``ordinal`` (read_uncommitted:
    in a transaction still open, as a page waiting for its shards' partials may be)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=topo.bootstrap, enable_auto_commit=False,
                                isolation_level="read_uncommitted")
    await consumer.start()
    try:
        tps = [TopicPartition(topo.topic["keys"], p) for p in range(2)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                if any(record_ordinal(r) >= ordinal for r in records):
                    return True
        return False
    finally:
        await consumer.stop()


async def one_of_each(topo: Topology, fan_in: Path, shards: Path
                      ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """A sketch, an align, the fan-in (its store at ``fan_in``) and one shard process
    holding both shards, started; the fan-in and shard processes."""
    for role in ("sketch", "align"):
        topo.start(role)
    fan_in_proc, _ = topo.start("index", fan_in)
    shard, shard_log = topo.start("shard", shards)
    await wait_log(shard_log, "index shard 1 owned", 120)
    return fan_in_proc, shard


async def shard_lag(topo: Topology) -> bool:
    """Whether keys records are past the shard group's committed offsets (a transaction's
    commit marker takes the last offset of a partition a shard has caught up with)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=topo.bootstrap,
                                group_id=f"{topo.group}-shard", enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topo.topic["keys"], p) for p in range(2)]
        end = await consumer.end_offsets(tps)
        return any([end[tp] - (await consumer.committed(tp) or 0) > 1 for tp in tps])
    finally:
        await consumer.stop()


@pytest.mark.testdata
async def test_two_index_shards_as_processes_give_the_matches_of_scan_across_a_join_and_leave(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Test (a) of issue 12 with 2 shards: 2 sketch + the fan-in + 2 shard + 2 align; and
    (d) for the shards: mid-stream a third shard process joins (a standby: the shards stay
    with their owners) and a first one leaves (the third takes its partition, rebuilding
    it by replay in a fresh store), then comes back with its store, as a standby; and for
    align: a third align process joins (taking the surplus of the others), then leaves,
    while the shards move."""
    topo = await Topology(kafka_bootstrap, tmp_path, index_shards=2).create()
    try:
        for role in ("sketch", "sketch", "align", "align"):
            topo.start(role)
        topo.start("index", tmp_path / "fan-in")
        shard_a, log_a = topo.start("shard", tmp_path / "shards-a")
        _, log_b = topo.start("shard", tmp_path / "shards-b")
        pages = clough_pages() + rfc_pages(max_bytes=60_000) + synthetic_pages(100, seed=3)
        parts = [pages[i::3] for i in range(3)]  # interleaved: copies span the parts
        await topo.send(parts[0])
        await topo.published(len(parts[0]), timeout=300)
        _, log_c = topo.start("shard", tmp_path / "shards-c")  # joins
        third_align, third_align_log = topo.start("align")  # joins too
        shard_a.send_signal(signal.SIGTERM)  # and a first one leaves
        assert shard_a.wait(60) == 0
        await wait_log(log_c, "shard role assigned ['", 120)
        await topo.send(parts[1])
        await wait_log(third_align_log, "align role assigned ['", 120)
        await topo.published(len(parts[0]) + len(parts[1]), timeout=300)
        third_align.send_signal(signal.SIGTERM)  # leaves
        assert third_align.wait(60) == 0
        topo.start("shard", tmp_path / "shards-a")  # back, its store behind
        await topo.send(parts[2])
        await matches_equal_scan(topo, len(pages), tmp_path / "oracle")
        # the shards' stores hold the lists, the fan-in's none (a process that owned a
        # partition before a rebalance keeps that store too)
        owned = {p.name for d in ("shards-a", "shards-b", "shards-c")
                 for p in (tmp_path / d / "shards").iterdir()}
        assert owned == {"0", "1"}
        for log in (log_a, log_b, log_c):
            assert "shard role assigned ['" in log.read_text()
        assert "rebuilt up to offset" in log_c.read_text()
        assert not (tmp_path / "fan-in" / "shards").exists()
        # the fan-in sent its pages' forward records: every part aligned by its align shard
        assert topo.log_lines("not in this store") == []
    finally:
        topo.stop_all()


@pytest.mark.testdata
async def test_a_shard_killed_mid_stream_and_a_shard_moved_to_a_fresh_store_change_nothing(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Tests (b) for the shard role and (c) with shards: one shard process holds both
    shards; SIGKILL mid-stream and a restart on its store (the messages from the committed
    offset are read again: answered from the stored partials, nothing lost or published
    twice); a SIGKILL of the fan-in and a restart on its store; then a second shard
    process on a fresh store directory takes one shard over and rebuilds it by replaying
    its keys partition; then the fan-in is SIGKILLed again and a standby on a fresh store
    directory rebuilds it by replaying sequence and sketches, deciding each page from the
    partials the shards answered then (the retained partials topic); the matches stay
    those of scan."""
    topo = await Topology(kafka_bootstrap, tmp_path, index_shards=2).create()
    pages = clough_pages() + synthetic_pages(240, seed=11)
    chunks = [pages[i::4] for i in range(4)]  # interleaved: copies span the chunks
    try:
        fan_in, shard = await one_of_each(topo, tmp_path / "fan-in", tmp_path / "shards-a")

        await topo.send(chunks[0])
        at = await progressed(topo, 10)
        await topo.send(chunks[1])
        # mid-stream: once keys past its committed offsets are there (its open
        # transaction aborts; its store may be ahead of the committed offsets)
        while not await shard_lag(topo):
            topo.check_alive()
            await asyncio.sleep(0.05)
        shard.send_signal(signal.SIGKILL)
        shard.wait(30)
        _, again_log = topo.start("shard", tmp_path / "shards-a")  # the same store
        await wait_log(again_log, "index shard 1 owned", 120)
        await topo.send(chunks[2])
        at = await progressed(topo, at + 5)
        # the fan-in too, mid-stream; on its store again, it sends the shard messages of
        # the records from the published ordinal on again and decides its unfinished
        # pages from the partials (the shards answer repeats from their stores)
        fan_in.send_signal(signal.SIGKILL)
        fan_in.wait(30)
        fan_in, fan_in_log = topo.start("index", tmp_path / "fan-in")
        await wait_log(fan_in_log, "index shard owned", 120)
        at = await progressed(topo, at + 10)

        # another machine: its store is empty, the group gives it one of the shards
        _, fresh_log = topo.start("shard", tmp_path / "shards-b")
        await wait_log(fresh_log, "rebuilding it from the retained keys partition", 120)
        # the fan-in's machine is lost: a standby with an empty store takes over
        _, standby_log = topo.start("index", tmp_path / "fan-in-b")
        await wait_log(standby_log, "index role started", 120)
        fan_in.send_signal(signal.SIGKILL)
        fan_in.wait(30)
        await wait_log(standby_log, "rebuilding it from the retained sequence and sketches",
                       120)
        await topo.send(chunks[3])
        await matches_equal_scan(topo, len(pages), tmp_path / "oracle")
        assert "rebuilt up to offset" in fresh_log.read_text()
        assert "index store rebuilt up to ordinal" in standby_log.read_text()
    finally:
        topo.stop_all()


@pytest.mark.testdata
async def test_a_fan_in_back_on_its_store_after_a_standby_published_past_it_finishes_its_pages(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Fan-in A is SIGKILLed with pages it indexed and never finished (its shard process
    was down: no partials came); standby B, on a fresh store, rebuilds, goes on and
    publishes past them, then stops; A comes back on its store. It finishes those pages
    by replay, from the partials the shards answered B (it stopped at every start with
    "not finished" before), and goes on; the matches stay those of scan."""
    topo = await Topology(kafka_bootstrap, tmp_path, index_shards=2).create()
    pages = clough_pages() + synthetic_pages(120, seed=13)
    parts = [pages[i::3] for i in range(3)]  # interleaved: copies span the parts
    try:
        fan_in_a, shard = await one_of_each(topo, tmp_path / "fan-in-a", tmp_path / "shards")
        await topo.send(parts[0])
        await topo.published(len(parts[0]), timeout=300)
        shard.send_signal(signal.SIGKILL)
        shard.wait(30)
        await topo.send(parts[1])
        sequenced = len(parts[0]) + len(parts[1])
        while len(await topo.read("sequence")) < sequenced:
            topo.check_alive()
            await asyncio.sleep(0.2)
        # A indexes them, sends their keys messages, waits (a fixed 3 s here once: on a
        # loaded machine A had indexed none, and never said "finishing them by replay")
        last = (await topo.read("sequence"))[-1].offset
        while not await keys_sent_for(topo, last):
            topo.check_alive()
            await asyncio.sleep(0.2)
        fan_in_a.send_signal(signal.SIGKILL)
        fan_in_a.wait(30)
        topo.start("shard", tmp_path / "shards")
        fan_in_b, _ = topo.start("index", tmp_path / "fan-in-b")
        await topo.published(sequenced, timeout=300)
        fan_in_b.send_signal(signal.SIGTERM)
        assert fan_in_b.wait(60) == 0
        _, log_a = topo.start("index", tmp_path / "fan-in-a")
        await wait_log(log_a, "finishing them by replay", 120)
        await topo.send(parts[2])
        await matches_equal_scan(topo, len(pages), tmp_path / "oracle")
        assert "index store rebuilt up to ordinal" in log_a.read_text()
    finally:
        topo.stop_all()


async def test_a_shard_rebuilt_from_a_keys_partition_that_lost_records_stops_and_says_so(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """A shard on a fresh store replays its keys partition from the first record; where
    those are gone (deleted here; retention would do the same), it stops and says so
    rather than build a shard without the lists of the pages before."""
    topo = await Topology(kafka_bootstrap, tmp_path, index_shards=2).create()
    producer = new_producer(topo.config.kafka)
    await producer.start()
    try:
        for seq in range(2):
            for shard in range(2):
                await producer.send_and_wait(topo.topic["keys"], ShardMessage(seq).to_bytes(),
                                             partition=shard)
    finally:
        await producer.stop()
    for shard in range(2):
        await delete_before(kafka_bootstrap, TopicPartition(topo.topic["keys"], shard), 1)
    proc, log = topo.start("shard", tmp_path / "shards")
    assert proc.wait(120) == 1
    assert (f"index shard 0 must read {topo.topic['keys']}[0] from offset 0, but the topic's "
            "log starts at 1") in log.read_text()


async def test_a_keys_topic_with_another_partition_count_stops_the_roles(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The keys topic must have one partition per shard: a shard process (and the fan-in)
    on a keys topic made for 3 shards stops at start and says so."""
    topo = Topology(kafka_bootstrap, tmp_path, index_shards=2)
    await create_topics(kafka_bootstrap, [NewTopic(topo.topic["keys"], 3, 1)])
    for role, store in (("shard", tmp_path / "shards"), ("index", tmp_path / "fan-in")):
        proc, log = topo.start(role, store)
        assert proc.wait(120) == 1
        assert (f"topic {topo.topic['keys']!r} has 3 partitions; the topology needs exactly "
                "2") in log.read_text()


@pytest.mark.testdata
async def test_revisits_deletes_and_retention_with_shards_give_the_engine_s_matches(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Issue 13's lifecycle with 2 shard processes: new pages, unchanged and edited
    revisits, tombstones, ``deleted: true`` pages, replays and deleted ids sent again, under
    ``retention.max_pages`` (the sweeps go to the shards as removals before the page they
    come before; a removal waits for the pages not decided yet), through a SIGKILL of the
    fan-in and its restart on its store, then a SIGKILL and a standby on an empty store
    that rebuilds the fan-in by replay (the sweeps, deletes and revisits again, each page
    decided from the retained partials); the matches (revisit messages included) are one
    engine's over the same records in sequence order, and the rebuilt fan-in's store holds
    the engine's pages."""
    engine = EngineConfig(retention=RetentionConfig(max_pages=60, every=16))
    topo = await Topology(kafka_bootstrap, tmp_path, engine=engine, index_shards=2,
                          engine_toml="""
[engine.retention]
max_pages = 60
every = 16
""").create()
    records, kinds = lifecycle_stream(150, seed=5)
    assert min(kinds.values()) >= 3, kinds
    third = len(records) // 3
    try:
        topo.start("sketch")
        topo.start("align")
        fan_in, log = topo.start("index", tmp_path / "fan-in")
        topo.start("shard", tmp_path / "shards-a")
        topo.start("shard", tmp_path / "shards-b")
        await wait_log(log, "index shard owned", 120)
        await topo.send_records(records[:third])
        at = await progressed(topo, 20)
        fan_in.send_signal(signal.SIGKILL)
        fan_in.wait(30)
        fan_in, _ = topo.start("index", tmp_path / "fan-in")  # the same store
        await topo.send_records(records[third:2 * third])
        await progressed(topo, at + 20)
        _, standby_log = topo.start("index", tmp_path / "fan-in-b")  # an empty store
        await wait_log(standby_log, "index role started", 120)
        fan_in.send_signal(signal.SIGKILL)
        fan_in.wait(30)
        await wait_log(standby_log, "rebuilding it from the retained sequence and sketches",
                       120)
        await topo.send_records(records[2 * third:])
        published = await topo.published(len(records), timeout=300)
    finally:
        topo.stop_all()
    expected = await topo.scan_in_sequence_order(tmp_path / "oracle", key=lifecycle_key)
    got = collections.Counter(lifecycle_key(messages.decode_match(r.value)) for r in published)
    revisits = collections.Counter(k[-3] for k in expected.elements())
    assert revisits["unchanged"] >= 3 and revisits["changed"] >= 3, revisits
    twice = [k for k, n in got.items() if n > expected[k]]
    assert not twice, f"published twice: {twice[:5]}"
    assert got == expected
    assert alive_ids(tmp_path / "fan-in-b", shards=2) == alive_ids(tmp_path / "oracle")
    assert "index store rebuilt up to ordinal" in standby_log.read_text()


@pytest.mark.testdata
async def test_a_shard_group_without_offsets_resumes_where_its_store_is(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The shard group's offsets are gone (expired, deleted) while its process is down: the
    shard reads again only the messages whose partials it keeps (16 here), not the keys
    partitions from their beginning, whose older messages it cannot answer again (it
    stopped with "its partial is not kept any more")."""
    topo = await Topology(kafka_bootstrap, tmp_path, index_shards=2, partials_kept=16).create()
    pages = clough_pages()
    try:
        topo.start("sketch")
        topo.start("align")
        topo.start("index", tmp_path / "fan-in")
        shard, _ = topo.start("shard", tmp_path / "shards")
        await topo.send(pages[:60])
        await topo.published(60, timeout=180)
        shard.send_signal(signal.SIGTERM)
        assert shard.wait(60) == 0
        await topo.delete_group("shard")
        _, log = topo.start("shard", tmp_path / "shards")
        await topo.send(pages[60:])
        published = await topo.published(len(pages), timeout=180)
        assert "no committed offset; resuming at" in log.read_text()
    finally:
        topo.stop_all()
    expected = await topo.scan_in_sequence_order(tmp_path / "oracle")
    got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
    assert sum(1 for k in expected if k[1] == "passage") > 10
    assert got == expected


async def holding(log: Path, shards: set[int], timeout: float = 120) -> None:
    """Until the shard process logging to ``log`` was last assigned ``shards``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = re.findall(r"shard role assigned \[(.*?)\]", log.read_text())
        if found and {int(p) for p in re.findall(r":(\d+)'", found[-1])} == shards:
            return
        assert asyncio.get_running_loop().time() < deadline, (
            f"not assigned {shards}: {found[-1:]}\n{log.read_text()[-3000:]}")
        await asyncio.sleep(0.2)


async def test_shard_processes_restarted_in_the_other_order_get_back_their_own_shards(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """A shard process's claim outlives it (a file in its store directory): two shard
    processes, stopped together and started again in the other order, the first alone at
    first (given both shards), each end with the shard their store is for. Without the
    claim files, the same restart swaps them (the first keeps shard 0)."""
    topo = await Topology(kafka_bootstrap, tmp_path, index_shards=2).create()
    a, b = tmp_path / "a", tmp_path / "b"
    try:
        _, log_a = topo.start("shard", a)
        await holding(log_a, {0, 1})
        _, log_b = topo.start("shard", b)
        await holding(log_b, {1})
        await holding(log_a, {0})
        topo.stop_all()
        for store in (a, b):
            assert [f.name for f in store.glob("sticky-claim-*")] == [
                f"sticky-claim-{topo.group}-shard.json"]
        for restart in ("with claims", "without"):
            if restart == "without":
                topo.stop_all()
                for claim in tmp_path.glob("*/sticky-claim-*"):
                    claim.unlink()
            _, log_b = topo.start("shard", b)
            await holding(log_b, {0, 1})
            _, log_a = topo.start("shard", a)
            mine, other = ({0}, {1}) if restart == "with claims" else ({1}, {0})
            await holding(log_a, mine)
            await holding(log_b, other)
    finally:
        topo.stop_all()
