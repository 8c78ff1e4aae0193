"""The list role on a real broker (docs/pipeline.md, "Roles on Kafka"): a sketch, a directory
and an exact process, and 2 processes of the list role (S = 2, C = 2), on a random stream
with revisits, deletes, rejected pages and retention sweeps. A list process is SIGKILLed
once the partials have started: its partition moves to the other copy, which restores it
from the changelog. Every list partial, by ordinal and list partition, is ``Partitioned``'s
(the pipeline in one process) for the same pages in sequence order, on the combine
partition of the page's id."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from dupalign.service.topology import ensure_topics, record_ordinal
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.list_shard import ListPartial
from dupalign.stages.partitioned import Partitioned, Shape
from tests.role_processes import check_alive, stop_all
from tests.service.test_stage_lists import recorded_partials
from tests.service.test_stage_roles_kafka import Roles, oracle, stream

pytestmark = pytest.mark.kafka

SHAPE = Shape(1, 1, 1, 2, 2)


async def partials_in(roles: Roles, n: int, timeout: float) -> list[Any]:
    """The partials once there are at least ``n``."""
    deadline = time.monotonic() + timeout
    while True:
        check_alive(roles.procs)
        got = await roles.read(roles.topics.partials, SHAPE.combine)
        if len(got) >= n:
            return got
        if time.monotonic() > deadline:
            t = roles.topics
            counts = {topic: len(await roles.read(topic, k)) for topic, k in (
                (t.batches, 1), (t.decisions, SHAPE.directory), (t.exact, SHAPE.exact),
                (t.windows, SHAPE.lists))}
        assert time.monotonic() < deadline, (
            f"{len(got)} partials of {n}, {counts}:\n" + "\n".join(
                f"== {lg.name}\n{lg.read_text()[-3000:]}" for _, lg in roles.procs))
        await asyncio.sleep(0.5)


async def test_two_list_processes_answer_as_the_pipeline_across_a_kill(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    roles = Roles(kafka_bootstrap, tmp_path, SHAPE)
    await ensure_topics(roles.kc, roles.topics.wanted())
    pages = stream(11, 60)
    try:
        roles.start("sketch")
        roles.start("directory", "dir")
        roles.start("exact", "exact")
        lists_a, _ = roles.start("lists", "lists-a")
        roles.start("lists", "lists-b")
        await roles.send(pages)
        await partials_in(roles, 1, 120)
        lists_a.send_signal(signal.SIGKILL)  # mid-stream: its partition moves to lists-b
        lists_a.wait(30)
        batches, decided = await roles.settled(len(pages), 120)
        want: dict[tuple[int, int], bytes] = {}

        def record_into(p: Partitioned) -> None:
            nonlocal want
            want = recorded_partials(p)

        oracle(roles, await roles.read(roles.kc.input_topic, 2), batches, record_into)
        got_records = await partials_in(roles, len(want), 120)
        check_alive(roles.procs)
    finally:
        stop_all(roles.procs)
    ids = {record_ordinal(r): Decision.from_bytes(r.value).doc_id for r in decided}
    got: dict[tuple[int, int], bytes] = {}
    for r in got_records:
        key = (record_ordinal(r), ListPartial.from_bytes(r.value).shard)
        assert key not in got  # each partial sent once
        assert r.partition == directory_owner(ids[key[0]], SHAPE.combine)
        got[key] = r.value
    assert got == want
    assert {s for _, s in got} == {0, 1}
    taken = [line for _, lg in roles.procs for line in lg.read_text().splitlines()
             if "lists partition" in line and "taken:" in line
             and " 0 changelog" not in line]
    assert taken, "no list partition was restored from a changelog"
