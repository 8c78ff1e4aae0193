"""The router, near and learner roles on a real broker (docs/pipeline.md, "Roles on Kafka"):
one sketch, directory and exact process each (they own both partitions: D = E = 2), two
router and two near processes (R = P = 2, C = 2) and two learner processes (one partition)
on a random stream with revisits, deletes, dead letters and retention sweeps, with idf
tables learned and frozen at 3, 10 and 20 pages. Mid stream a router, a near and the
learner process that holds its partition are SIGKILLed: their partitions move to the other
copies, which restore fresh stores from the changelogs. Every ``NearOps``, near answer and
revisit distance, by ordinal, is ``Partitioned``'s for the same pages in sequence order,
each answer in the combine partition of its page's id."""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from dupalign.service.roles.stage_learner import record_version
from dupalign.service.roles.stage_router import SWEEP, UPTO, record_near_from
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.topology import ensure_topics, record_ordinal
from dupalign.stages.directory import directory_owner
from dupalign.stages.near_shard import answer_from_bytes
from dupalign.stages.partitioned import Partitioned, Shape
from tests.reused_stores import temporary_stores
from tests.role_processes import check_alive, stop_all
from tests.service.test_stage_near import NEAR_TEXTS, Answers, Ops, recorded_near
from tests.service.test_stage_roles_kafka import ENGINE_TOML, Roles, sequence_order, stream

pytestmark = pytest.mark.kafka

SHAPE = Shape(directory=2, exact=2, near=2, lists=1, combine=2, router=2)
# near matches (tests/service/test_stage_near.py's NEAR and NEAR_TEXTS)
NEAR_TOML = ENGINE_TOML.replace("min_tokens = 4", "min_tokens = 4\nhamming = 7\nprobe_budget = 6")
LEARNED_TOML = NEAR_TOML.replace("idf_freeze_at = []", "idf_freeze_at = [3, 10, 20]")


async def routed(roles: Roles, n_pages: int, timeout: float) -> tuple[list[Any], list[Any]]:
    """Once every page sent is sequenced or dead-lettered and both routers said, in every
    near partition, that they routed every page: the batch records and the near ops."""
    deadline = time.monotonic() + timeout
    while True:
        check_alive(roles.procs)
        batches = await roles.read(roles.topics.batches, 1)
        dead = await roles.read(roles.kc.dlq_topic, 2)
        ops = await roles.read(roles.topics.near_ops, SHAPE.near)
        sequenced = sum(SequenceBatch.from_bytes(r.value).n for r in batches)
        upto: dict[tuple[int, int], int] = {}
        for r in ops:
            router, kind, _ = record_near_from(r)
            if kind == UPTO:
                upto[(r.partition, router)] = max(upto.get((r.partition, router), 0),
                                                  record_ordinal(r))
        if (sequenced + len(dead) == n_pages and len(upto) == SHAPE.near * SHAPE.router
                and min(upto.values()) == sequenced):
            return batches, ops
        assert time.monotonic() < deadline, (
            f"{sequenced} sequenced, {len(dead)} dead of {n_pages}, routed {upto}:\n"
            + "\n".join(f"== {lg.name}\n{lg.read_text()[-3000:]}" for _, lg in roles.procs))
        await asyncio.sleep(1)


def oracle(roles: Roles, sent: list[Any], batches: list[Any]) -> tuple[Ops, Answers]:
    """``Partitioned`` on the sequenced pages in ordinal order, swept where the roles sweep:
    its near ops and answers by ordinal (with the combine partition of the page's id)."""
    ordered = sequence_order(sent, batches)
    engine = roles.config.engine
    with temporary_stores("stage-near-oracle-") as stores:
        p = Partitioned(engine, SHAPE, functools.partial(stores.store,
                                                         params=engine.frozen_params()))
        ops, answers = recorded_near(p)
        r = engine.retention
        for o, (page, at_ms) in enumerate(ordered):
            if o and o % r.every == 0:
                p.sweep(r.max_pages, r.max_age, at_ms)
            for _ in p.process_many([page]):
                pass
    return ops, {(o, s): (directory_owner(ordered[o][0].id, SHAPE.combine), raw)
                 for (o, s), raw in answers.items()}


async def test_router_and_near_processes_send_what_the_pipeline_in_one_process_does(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    roles = Roles(kafka_bootstrap, tmp_path, SHAPE, LEARNED_TOML)
    await ensure_topics(roles.kc, roles.topics.wanted())
    pages = stream(3, 70, NEAR_TEXTS)
    first, second = pages[:35], pages[35:]
    try:
        roles.start("sketch")
        roles.start("directory", "dir")
        roles.start("exact", "ex")
        router_a, _ = roles.start("router", "router-a")
        roles.start("router", "router-b")
        near_a, _ = roles.start("near", "near-a")
        roles.start("near", "near-b")
        learners = [roles.start("learner", "learner-a"), roles.start("learner", "learner-b")]
        await roles.send(first)
        await routed(roles, len(first), 240)
        learner = next(proc for proc, log in learners  # (the one holding the partition)
                       if "learner partition 0 taken" in log.read_text())
        for proc in (router_a, near_a, learner):  # the others restore their partitions
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        await roles.send(second)
        batches, sent_ops = await routed(roles, len(pages), 240)
        want_ops, want_answers = oracle(roles, await roles.read(roles.kc.input_topic, 2),
                                        batches)
        deadline = time.monotonic() + 120
        n_answers = sum(1 for (_, s) in want_answers if s != -1)  # (-1: revisits)
        while len(answered := await roles.read(roles.topics.near_answers, SHAPE.combine)
                  ) < n_answers:
            check_alive(roles.procs)
            assert time.monotonic() < deadline, f"{len(answered)} of {n_answers}"
            await asyncio.sleep(1)
        check_alive(roles.procs)
    finally:
        stop_all(roles.procs)
    got: Ops = {}
    for r in sent_ops:
        router, kind, _ = record_near_from(r)
        if kind != UPTO:
            key = (record_ordinal(r), kind, router, r.partition)
            assert key not in got  # (each sent once)
            got[key] = r.value
    assert got == want_ops
    got_answers: Answers = {(record_ordinal(r), answer_from_bytes(r.value)[1]):
                            (r.partition, r.value) for r in answered}
    assert len(got_answers) == len(answered)  # (each sent once)
    related = await roles.read(roles.topics.revisits, SHAPE.combine)
    got_answers.update({(record_ordinal(r), -1): (r.partition, r.value) for r in related})
    assert len(got_answers) == len(answered) + len(related)
    assert got_answers == want_answers
    assert any(s == -1 for (_, s) in got_answers)  # (revisits related)
    frozen = await roles.read(roles.topics.idf, 1)
    assert {1, 2} <= {record_version(r) for r in frozen}  # (3: near the stream's end)
    assert any(kind == SWEEP for (_, kind, _, _) in got)
    assert any(len(answer_from_bytes(v)[2].ordinal) for _, v in got_answers.values())
    taken = [line for _, lg in roles.procs for line in lg.read_text().splitlines()
             if "partition" in line and "taken:" in line and " 0 changelog" not in line
             and ("router" in line or "near" in line or "learner" in line)]
    assert taken, "no router or near partition was restored from a changelog"
