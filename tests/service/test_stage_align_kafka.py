"""The whole chain of stage roles on a real broker, passages on (docs/pipeline.md, "Roles on
Kafka"): a process of every role, the combine with C = 2 partitions and 2 processes of the
align stage (A = 2), on a random stream of pages that share passages, with revisits,
deletes, rejected pages and retention sweeps. Once align answers have started, the align
process that answered is SIGKILLed: its partition moves to the other, which restores it from
the changelog. The output topic's matches (read_committed), by ordinal, are those of
``Partitioned`` (the pipeline in one process) for the same pages in sequence order: none
missing, none twice."""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dupalign.match import Match
from dupalign.service.topology import decode_aligned, ensure_topics, record_ordinal
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.wire import messages
from tests.role_processes import check_alive, stop_all
from tests.service.test_stage_roles_kafka import Roles, oracle, stream

pytestmark = pytest.mark.kafka

SHAPE = Shape(1, 1, 1, 1, 2, 1, 2)
Published = dict[int, list[dict[str, Any]]]


def recorded_matches(p: Partitioned) -> Published:
    """Each page's matches as ``p``'s combines finish them from now on, by ordinal (filled
    as it runs; a page without matches publishes nothing)."""
    out: Published = {}

    def finish(real: Any, combined: Any, passages: Any) -> Any:
        got = real(combined, passages)
        if got:
            out[combined.seq] = [m.to_dict() for m in got]
        return got

    for combine, _ in p.combines:
        combine.finish = functools.partial(finish, combine.finish)  # type: ignore[method-assign]
    return out


def by_ordinal(records: list[Any]) -> Published:
    got: Published = defaultdict(list)
    for r in records:
        got[record_ordinal(r)].append(Match.from_dict(messages.decode_match(r.value)).to_dict())
    return dict(got)


async def records_in(roles: Roles, topic: str, partitions: int, n: int, timeout: float
                     ) -> list[Any]:
    """The records of ``topic`` once there are at least ``n``."""
    deadline = time.monotonic() + timeout
    while True:
        check_alive(roles.procs)
        got = await roles.read(topic, partitions)
        if len(got) >= n:
            return got
        assert time.monotonic() < deadline, (
            f"{len(got)} records of {topic}, {n} wanted:\n" + "\n".join(
                f"== {lg.name}\n{lg.read_text()[-3000:]}" for _, lg in roles.procs))
        await asyncio.sleep(1)


@pytest.mark.timeout(1800)  # (ten processes on a loaded machine: up to 10 minutes seen)
async def test_every_role_with_two_align_processes_publishes_the_pipelines_matches(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    roles = Roles(kafka_bootstrap, tmp_path, SHAPE)
    await ensure_topics(roles.kc, roles.topics.wanted())
    pages = stream(13, 80)
    first, rest = pages[:40], pages[40:]
    try:
        roles.start("sketch")
        for role in ("directory", "exact", "router", "near", "lists", "combine"):
            roles.start(role, role)
        aligns = [roles.start("align", "align-a"), roles.start("align", "align-b")]
        await roles.send(first)
        answers = await records_in(roles, roles.topics.aligned, SHAPE.combine, 1, 600)
        # mid-stream, the process that answered: its partition moves to the other
        killed = decode_aligned(answers[0].value).part
        proc, _ = holder(aligns, killed)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        await roles.send(rest)
        batches, _ = await roles.settled(len(pages), 600)
        want: Published = {}

        def record_into(p: Partitioned) -> None:
            nonlocal want
            want = recorded_matches(p)

        oracle(roles, await roles.read(roles.kc.input_topic, 2), batches, record_into)
        n = sum(map(len, want.values()))
        out = roles.kc.output_topic
        await records_in(roles, out, 2, n, 600)
        await asyncio.sleep(5)  # (a page published twice would come by now)
        got = by_ordinal(await roles.read(out, 2))
        check_alive(roles.procs)
    finally:
        stop_all(roles.procs)
    assert got == want
    kinds = {m["kind"] for ms in got.values() for m in ms}
    assert "passage" in kinds, kinds
    restored = [line for _, lg in roles.procs for line in lg.read_text().splitlines()
                if f"align partition {killed} taken" in line
                and "changelog records restored" in line and " 0 changelog" not in line]
    assert restored, "the align partition of the process killed was not restored"


def holder(procs: list[tuple[Any, Path]], partition: int) -> tuple[Any, Path]:
    """The process of ``procs`` that took align partition ``partition`` last."""
    last: dict[str, tuple[str, tuple[Any, Path]]] = {}
    for proc, log in procs:
        for line in log.read_text().splitlines():
            if f"align partition {partition} taken" in line:
                last[line[:23]] = (line, (proc, log))
    assert last, f"no align process took partition {partition}"
    return last[max(last)][1]
