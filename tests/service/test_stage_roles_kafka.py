"""The partitioned pipeline's first roles on a real broker (docs/pipeline.md, "Roles on Kafka"):
2 sketch, 2 directory and 2 exact processes (D = E = 2) on a random stream with revisits,
deletes, rejected pages and retention sweeps; their decisions and exact answers are those
of ``Partitioned`` (the pipeline in one process) for the same pages in sequence order. Mid
stream a directory and an exact process are SIGKILLed: their partitions move to the other
copies, which restore fresh stores from the changelogs; then they come back."""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dupalign.page import Page
from dupalign.service.config import load_config
from dupalign.service.produce import send_pages
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import ensure_topics, new_producer, record_ordinal
from dupalign.stages.directory import Decision
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.wire import messages
from tests.reused_stores import temporary_stores
from tests.role_processes import REPO, check_alive, read_topic, stop_all
from tests.service.test_stage_partitions import recorded
from tests.stages.streams import N_IDS, SHARED_TEXTS, pages_of

pytestmark = pytest.mark.kafka

SHAPE = Shape(2, 2, 1, 1, 1)
ENGINE_TOML = """
[engine.near]
min_tokens = 4
cws_samples = 16
idf_freeze_at = []
[engine.passage]
k = 8
query_len = 4
stride = 2
min_len = 2
max_list = 2
max_list_read = 1
max_candidates = 2
[engine.retention]
max_pages = 3
every = 5
"""


def stream(seed: int, n: int, texts: list[str] = SHARED_TEXTS) -> list[Page]:
    """The stage oracles' random pages (tests/stages/streams.py): revisits of every kind,
    exact copies, deletes (of unknown ids too), empty pages (dead-lettered); ``texts``: the
    pool of bodies."""
    rng = random.Random(seed)
    ops: list[tuple[Any, ...]] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.8:
            ops.append(("page", rng.randrange(N_IDS), rng.choice([0, 0, 1, 2]),
                        rng.choice([0, 0, 1, 2, 3, 4, 5]), rng.random() < 0.7))
        elif r < 0.92:
            ops.append(("delete", rng.randrange(N_IDS + 1)))
        else:
            ops.append(("reject", rng.randrange(N_IDS), False))
    return [p for _, p in pages_of(ops, texts) if isinstance(p, Page)]


class Roles:
    def __init__(self, bootstrap: str, tmp: Path, shape: Shape = SHAPE,
                 engine_toml: str = ENGINE_TOML, batch_size: int = 3,
                 topic_partitions: int = 2) -> None:
        tag = uuid.uuid4().hex[:8]
        self.tmp, self.shape = tmp, shape
        self.config_path = tmp / "stage.toml"
        self.config_path.write_text(f"""
[kafka]
bootstrap_servers = "{bootstrap}"
input_topic = "pages-{tag}"
output_topic = "matches-{tag}"
dlq_topic = "dlq-{tag}"
group_id = "g-{tag}"
create_topics = true
topic_partitions = {topic_partitions}
session_timeout_ms = 6000
heartbeat_interval_ms = 500
transaction_timeout_ms = 15000
[worker]
batch_size = {batch_size}
log_format = "text"
[metrics]
enabled = false
{engine_toml}""", "utf-8")
        self.config = load_config(self.config_path, env={})
        self.kc = self.config.kafka
        self.topics = StageTopics(self.kc, shape)
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, role: str, store: str | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{role}-{len(self.procs)}.log"
        cmd = [sys.executable, "-m", "dupalign.service.roles.stage_launch", role,
               "--config", str(self.config_path), "--shape", shape_arg(self.shape)]
        if store is not None:
            cmd += ["--store", str(self.tmp / store)]
        with open(log, "ab") as fh:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.procs.append((proc, log))
        return proc, log

    async def send(self, pages: list[Page]) -> None:
        producer = new_producer(self.kc)
        await producer.start()
        try:
            await send_pages(producer, self.kc.input_topic, pages)
        finally:
            await producer.stop()

    async def read(self, topic: str, partitions: int) -> list[Any]:
        return await read_topic(self.kc.bootstrap_servers, topic, partitions)

    async def settled(self, n_pages: int, timeout: float) -> tuple[list[Any], list[Any]]:
        """Once every page sent is sequenced or dead-lettered and every sequenced page
        decided: the batch records and the decisions."""
        deadline = time.monotonic() + timeout
        while True:
            check_alive(self.procs)
            batches = await self.read(self.topics.batches, 1)
            dead = await self.read(self.kc.dlq_topic, 2)
            decisions = await self.read(self.topics.decisions, self.shape.directory)
            sequenced = sum(SequenceBatch.from_bytes(r.value).n for r in batches)
            if sequenced + len(dead) == n_pages and len(decisions) == sequenced:
                return batches, decisions
            assert time.monotonic() < deadline, (
                f"{sequenced} sequenced, {len(dead)} dead, {len(decisions)} decided of "
                f"{n_pages}:\n" + "\n".join(f"== {lg.name}\n{lg.read_text()[-3000:]}"
                                            for _, lg in self.procs))
            await asyncio.sleep(1)


def shape_arg(s: Shape) -> str:
    """``--shape`` for ``s``."""
    return f"{s.directory},{s.exact},{s.near},{s.lists},{s.combine},{s.router},{s.align}"


def sequence_order(pages: list[Any], batches: list[Any]) -> list[tuple[Page, int]]:
    """The pages sequenced (records of the input topic), in ordinal order, each with its
    batch's clock."""
    by_source = {(r.partition, r.offset): messages.decode_record(r.key, r.value) for r in pages}
    ordered: list[tuple[Page, int]] = []
    for r in sorted(batches, key=lambda r: r.offset):
        b = SequenceBatch.from_bytes(r.value)
        ordered += [(by_source[(b.partition, o)], b.at_ms) for o in b.offsets]
    return ordered


def oracle(roles: Roles, pages: list[Any], batches: list[Any],
           record: Callable[[Partitioned], Any] | None = None
           ) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """``Partitioned`` on the sequenced pages in ordinal order, swept where the roles sweep
    (before each multiple of ``retention.every`` ordinals, with that batch's clock): its
    decisions and exact answers by ordinal, in their wire form. ``record``: called on the
    pipeline before its first page (to record more of it)."""
    ordered = sequence_order(pages, batches)
    engine = roles.config.engine
    swept = 0
    with temporary_stores("stage-oracle-") as stores:
        params = engine.frozen_params()
        p = Partitioned(engine, roles.shape, functools.partial(stores.store, params=params))
        decisions, answers = recorded(p)
        if record is not None:
            record(p)
        r = engine.retention
        for o, (page, at_ms) in enumerate(ordered):
            if o and o % r.every == 0:
                swept += len(p.sweep(r.max_pages, r.max_age, at_ms))
            for _ in p.process_many([page]):
                pass
    assert swept > 0  # (the sweeps change what later pages are)
    return decisions, answers


async def test_two_copies_of_each_role_decide_as_the_pipeline_in_one_process(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    roles = Roles(kafka_bootstrap, tmp_path)
    await ensure_topics(roles.kc, roles.topics.wanted())
    pages = stream(5, 110)
    first, second, third = pages[:50], pages[50:90], pages[90:]
    try:
        for _ in range(2):
            roles.start("sketch")
        dir_a, _ = roles.start("directory", "dir-a")
        roles.start("directory", "dir-b")
        ex_a, _ = roles.start("exact", "ex-a")
        ex_b, _ = roles.start("exact", "ex-b")
        await roles.send(first)
        await roles.settled(len(first), 300)
        # a directory and an exact process killed: the others restore their partitions
        for proc in (dir_a, ex_a):
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        await roles.send(second)
        await roles.settled(len(first) + len(second), 300)
        roles.start("directory", "dir-a")  # back (a standby, or takes a partition again)
        ex_a, ex_a_log = roles.start("exact", "ex-a")
        deadline = time.monotonic() + 120  # (its signal handlers set)
        while "role started" not in ex_a_log.read_text() and time.monotonic() < deadline:
            check_alive(roles.procs)
            await asyncio.sleep(0.5)
        # both exact processes stopped cleanly and started again: the partitions come back
        # to the stores that held them (claims), kept, not restored
        for proc in (ex_a, ex_b):
            proc.send_signal(signal.SIGTERM)
        for proc in (ex_a, ex_b):
            assert proc.wait(60) == 0
        roles.start("exact", "ex-a")
        roles.start("exact", "ex-b")
        await roles.send(third)
        batches, decided = await roles.settled(len(pages), 300)
        sent = await roles.read(roles.kc.input_topic, 2)
        want_decisions, want_answers = oracle(roles, sent, batches)
        deadline = time.monotonic() + 120
        while len(answered := await roles.read(roles.topics.exact, SHAPE.exact)) < len(
                want_answers) and time.monotonic() < deadline:
            check_alive(roles.procs)
            await asyncio.sleep(1)
        check_alive(roles.procs)
    finally:
        stop_all(roles.procs)
    got = {record_ordinal(r): r.value for r in decided}
    assert len(got) == len(decided)  # each page decided once
    assert got == want_decisions
    got_answers = {record_ordinal(r): r.value for r in answered}
    assert len(got_answers) == len(answered)
    assert got_answers == want_answers
    kinds = {Decision.from_bytes(v).kind for v in got.values()}
    assert {"stored", "delete", "unchanged", "replay"} <= kinds, kinds
    assert any(ExactAnswer.from_bytes(v).original is not None for v in got_answers.values())
    # the partitions of the processes killed were taken over with their stores restored
    taken = [line for _, lg in roles.procs for line in lg.read_text().splitlines()
             if "taken:" in line and "changelog records restored" in line
             and " 0 changelog" not in line]
    assert taken, "no partition was restored from a changelog"
    kept = [line for _, lg in roles.procs for line in lg.read_text().splitlines()
            if "taken: store kept" in line]
    assert kept, "no store was kept over the clean restart"
