"""The index role stopped rather than killed, against a real broker, each role in its own
process (issue 42, acceptance (a)): an index owner throttled to a fifth of a CPU, then
SIGSTOPped for longer than the group's session timeout while pages flow (its standby takes
the shard over and fences it), then SIGCONTed, then the owner SIGKILLed. No process exits
(a fenced producer steps down and rejoins), the matches are exactly ``scan``'s, and the
published ordinal never stands still for more than ``STALL_BOUND_S`` while pages wait."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from dupalign.page import Page
from dupalign.service.roles.sketch import SketchRole
from dupalign.service.topology import (
    decode_sequence,
    new_producer,
    stop_quietly,
    transactional_id,
)
from dupalign.wire import messages
from tests.service.test_worker_kafka import match_key
from tests.topology_harness import Topology, owner_of, progressed, synthetic_pages, wait_log

pytestmark = pytest.mark.kafka

STALL_BOUND_S = 30.0  # issue 42 (a): the longest the published ordinal may stand still


class Stalls:
    """Samples the index group's committed sequence offset (the published ordinal E) and
    the last sequenced ordinal; ``longest`` is the longest time E stood still while a
    sequenced page waited for its matches, since ``watch_from``."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.since: float | None = None  # E's last advance, or when a page began to wait
        self.published = -1
        self.longest = 0.0
        self.watch_from = float("inf")
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            published = await self.topo.index_committed()
            sequence = await self.topo.read("sequence")
            now = time.monotonic()
            waiting = bool(sequence) and published <= sequence[-1].offset
            if not waiting or published != self.published:
                self.since = now if waiting else None
            elif self.since is not None and now >= self.watch_from:
                self.longest = max(self.longest, now - max(self.since, self.watch_from))
            self.published = published
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def throttled(pid: int, share: float, period: float = 0.1) -> AsyncIterator[None]:
    """The process runs ``share`` of each ``period`` (SIGSTOP / SIGCONT): a CPU quota."""
    async def cycle() -> None:
        while True:
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(period * (1 - share))
            os.kill(pid, signal.SIGCONT)
            await asyncio.sleep(period * share)

    task = asyncio.ensure_future(cycle())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        os.kill(pid, signal.SIGCONT)


def step(what: str) -> None:
    print(time.strftime("%H:%M:%S"), what)  # (with -s: the test's steps beside the logs)


async def fence_the_owner_until_it_steps_down(
        topo: Topology, index: list[tuple[subprocess.Popen[bytes], Path]],
        pages: list[Page], attempts: int = 3) -> None:
    """Fence the index owner's producer with a rival's InitProducerId, then send ``pages``:
    the owner must step down. A rebalance that lands between the fence and the owner's next
    transaction (the continued process rejoining) has the owner take the shard again with a
    new producer, which fences the rival instead, or moves the shard to the other process,
    whose new producer does the same: then fence the owner again, with pages not yet sent,
    so that it has a transaction to find the fence in."""
    kc = topo.config.kafka
    parts = [pages[i::attempts] for i in range(attempts)]
    for attempt in range(1, attempts + 1):
        fenced = await owner_of(index)
        log = index[fenced][1]
        stepped = log.read_text().count("index role stepping down")
        owned = log.read_text().count("index shard owned")
        released = log.read_text().count("index shard released")
        rival = new_producer(kc, transactional_id(kc, f"{kc.group_id}-index",
                                                  TopicPartition(kc.sequence_topic, 0)))
        await rival.start()
        await stop_quietly(rival)
        step(f"index {fenced}'s producer fenced by another's InitProducerId ({attempt})")
        await topo.send(parts[attempt - 1])
        deadline = time.monotonic() + 60
        while log.read_text().count("index role stepping down") == stepped:
            said = log.read_text()
            if (said.count("index shard owned") > owned
                    or said.count("index shard released") > released):
                break  # taken again or moved, by a new producer: the rival was fenced
            assert time.monotonic() < deadline, f"no step-down\n{topo.logs()}"
            await asyncio.sleep(0.2)
        else:
            for rest in parts[attempt:]:
                await topo.send(rest)
            return
    raise AssertionError(f"the owner took the shard again after each of {attempts} fences, "
                         f"never stepping down\n{topo.logs()}")


@pytest.mark.testdata
async def test_an_index_stopped_past_its_session_throttled_and_killed_exits_never_and_stalls_little(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    topo = await Topology(kafka_bootstrap, tmp_path).create()
    session_s = topo.config.kafka.session_timeout_ms / 1000
    pages = synthetic_pages(240, seed=13)
    chunks = [pages[i::6] for i in range(6)]  # interleaved: copies span the chunks
    stalls = Stalls(topo)
    try:
        topo.start("sketch")
        topo.start("align")
        index = [topo.start("index", tmp_path / "index-a")]
        await wait_log(index[0][1], "index shard owned", 120)
        index.append(topo.start("index", tmp_path / "index-b"))  # a standby
        await wait_log(index[1][1], "index role started", 120)
        await topo.send(chunks[0])
        at = await progressed(topo, 10)

        # a fifth of a CPU while pages flow (for at least a session)
        throttle = await owner_of(index)
        step(f"index {throttle} throttled")
        async with throttled(index[throttle][0].pid, 0.2):
            until = time.monotonic() + session_s
            await topo.send(chunks[1])
            at = await progressed(topo, at + 10)
            await asyncio.sleep(until - time.monotonic())

        # stopped past its session while pages flow: the standby takes the shard and fences
        # it; continued, it finds its producer fenced or its membership gone
        stop = await owner_of(index)
        stopped = index[stop][0]
        stopped.send_signal(signal.SIGSTOP)
        step(f"index {stop} stopped")
        await topo.send(chunks[2])
        await asyncio.sleep(1.5 * session_s)
        stopped.send_signal(signal.SIGCONT)
        step(f"index {stop} continued")
        stalls.watch_from = time.monotonic()
        await topo.send(chunks[3])
        at = await progressed(topo, at + 10)

        # the owner's producer fenced while it keeps its membership, as when the broker
        # aborts a transaction open past kafka.transaction_timeout_ms: it steps down
        await fence_the_owner_until_it_steps_down(topo, index, chunks[4])
        at = await progressed(topo, at + 10)

        # the owner killed: the other one takes over
        killed = await owner_of(index)
        index[killed][0].send_signal(signal.SIGKILL)
        step(f"index {killed} killed")
        index[killed][0].wait(30)
        await topo.send(chunks[5])

        published = await topo.published(len(pages), timeout=120)
        await stalls.stop()
        expected = await topo.scan_in_sequence_order(tmp_path / "oracle")
        got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
        assert sum(1 for k in expected if k[1] == "passage") > 10
        assert got == expected
        topo.check_alive()  # no process exited but the one killed
        assert topo.log_lines("role stopped") == []
        assert stalls.longest < STALL_BOUND_S, stalls.longest
        took = [line.rsplit("(", 1)[-1] for line in topo.log_lines("index shard owned")]
        print(f"longest stall {stalls.longest:.1f} s; takeovers {took}; step-downs "
              f"{topo.log_lines('stepping down')}")
    finally:
        await stalls.stop()
        topo.stop_all()


async def test_a_role_whose_producers_are_fenced_steps_down_rejoins_and_loses_nothing(
        kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Another producer takes the transactional ids of a sketch role's partitions (as a
    process that took them over would): the role's next transaction is fenced, and it steps
    down, rejoins, takes its partitions back and sequences every page once."""
    topo = await Topology(kafka_bootstrap, tmp_path).create()
    kc = topo.config.kafka
    pages = [Page(f"p{i}", f"page {i} of a few words about fencing and rejoining")
             for i in range(24)]
    role = SketchRole(topo.config)
    task = asyncio.create_task(role.run())

    async def sequenced(n: int) -> list[str]:
        deadline = time.monotonic() + 120
        while len(ids := [decode_sequence(r.value)[0] for r in await topo.read("sequence")]) < n:
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, f"{len(ids)}/{n} pages sequenced"
            await asyncio.sleep(0.5)
        return ids

    try:
        with caplog.at_level(logging.INFO, logger="dupalign.roles"):
            await topo.send(pages[:12])
            await sequenced(12)
            held = sorted(role.producers)
            assert held
            rivals = [new_producer(kc, transactional_id(kc, role.group_id, tp)) for tp in held]
            for rival in rivals:
                await rival.start()  # InitProducerId: the role's producers are fenced
            await stop_quietly(*rivals)
            await topo.send(pages[12:])
            ids = await sequenced(24)
            await asyncio.sleep(2)  # (nothing more comes)
            ids = await sequenced(24)
        assert sorted(ids) == sorted(p.id for p in pages)  # each page once
        assert role.failure is None and not task.done()
        said = [r.getMessage() for r in caplog.records]
        assert any("sketch role stepping down: a producer was fenced" in m for m in said), said
        assert sorted(role.producers) == held  # taken back
    finally:
        role.stop()
        await asyncio.wait_for(task, 60)
