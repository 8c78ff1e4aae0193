"""The whole chain of stage roles on a real broker (issue 43, tests (a) and (b); with passages
off, no page waits for align; with passages on, the align stage closes the loop): 2
processes of every role (sketch, directory, exact, learner, router, near, lists, combine,
align), 2 partitions of every stage but the learner's one, idf tables learned and frozen at
5, 20 and 60 pages (the routers wait for the learner's freezes), on the Clough + RFC pages with
exact copies, new versions, unchanged revisits, replays, deletes, rejected pages and
retention sweeps. The matches the combine publishes on ``kafka.output_topic`` (read
committed), by ordinal, are ``Partitioned``'s (= ``scan``'s) for the same pages in sequence
order: none missing, none twice. Mid stream one process of each role in turn is SIGKILLed
and started again on its store directory (its partitions restored from the changelogs)."""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.topology import ensure_topics, new_producer, record_ordinal
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.wire import messages
from tests.bench.bench_worker import corpus
from tests.role_processes import check_alive, lifecycle_stream, stop_all
from tests.service.test_stage_roles_kafka import Roles, oracle

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.testdata]

SHAPE = Shape(2, 2, 2, 2, 2, 2, 2)
STAGES = ("directory", "exact", "learner", "router", "near", "lists", "combine")
WITH_ALIGN = (*STAGES, "align")
ENGINE_TOML = """
[engine.near]
idf_freeze_at = [5, 20, 60]
[engine.retention]
max_pages = 70
every = 25
"""
NO_PASSAGES = """
[engine.passage]
enabled = false
"""
RECENT = 50  # the pages copied, revisited or deleted: among the ids sent last
LONG_TESTS = os.environ.get("DUPALIGN_LONG_TESTS") == "1"  # the long runs, opt-in (README)
Procs = list[tuple[subprocess.Popen[bytes], Path]]


def chain_pages(n: int, seed: int = 11) -> list[Page]:
    """``corpus(n)`` (the Clough answers and originals, then RFCs cut into ~3 KB pages),
    dated, with after some pages one of: an exact or a near copy of an earlier page under a
    new id, a new version of an earlier id with another page's body, an unchanged revisit (the same
    words, other whitespace), a replay (a page sent again as it was), a delete, an empty
    page (dead-lettered)."""
    rng = random.Random(seed)
    out: list[Page] = []
    current: dict[str, Page] = {}  # id -> its page sent last

    def send(page: Page) -> None:
        page = Page(page.id, page.body, content_type="text/plain",
                    fetched_at=1_700_000_000_000 + 1000 * len(out))
        out.append(page)
        current.pop(page.id, None)
        current[page.id] = page  # (last: the newest)

    for i, page in enumerate(corpus(n)):
        send(page)
        alive = list(current)[-RECENT:]  # (older ones are likely swept)
        other = current[rng.choice(alive)]
        r = rng.random()
        if r < 0.10:
            send(Page(f"copy-{i}", other.body))
        elif r < 0.18:
            send(Page(rng.choice(alive), current[rng.choice(alive)].body))
        elif r < 0.24:
            body = other.body
            send(Page(other.id, "\n".join(body.split()) if isinstance(body, str)
                      else b"\n".join(body.split())))
        elif r < 0.30:
            out.append(other)  # (the same record again)
        elif r < 0.38:
            out.append(Page(other.id, "", deleted=True))
            del current[other.id]
        elif r < 0.40:
            out.append(Page(f"empty-{i}", ""))
        elif r < 0.50:
            send(Page(f"near-{i}", edited(other.body, rng)))
    return out


def edited(body: str | bytes, rng: random.Random) -> str:
    """``body`` with a word in two hundred changed (a near copy)."""
    words = (body if isinstance(body, str) else body.decode("utf-8", "replace")).split()
    for _ in range(len(words) // 200 + 1):
        words[rng.randrange(len(words))] = f"edit{rng.randrange(1000)}"
    return " ".join(words)


def matches_by_ordinal(records: list[Any]) -> dict[int, list[dict[str, Any]]]:
    """The output topic's matches by the ordinal of their page, in the order published,
    without the time they were found."""
    out: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        m = messages.decode_match(r.value)
        del m["detected_at"], m["v"]
        out.setdefault(record_ordinal(r), []).append(m)
    return out


def oracle_matches(roles: Roles, sent: list[Any], batches: list[Any]
                   ) -> dict[int, list[dict[str, Any]]]:
    """``Partitioned``'s matches for the sequenced pages in ordinal order, swept where the
    roles sweep (``oracle``), by ordinal (pages with none left out)."""
    found: dict[int, list[dict[str, Any]]] = {}

    def record(p: Partitioned) -> None:
        real = p.process

        def process(page: Page) -> Any:
            seq = p.seq
            try:
                got = real(page)
            except PageRejected:
                raise
            if got:
                found[seq] = [m.to_dict() for m in got]
            return got

        p.process = process  # type: ignore[method-assign]

    oracle(roles, sent, batches, record)
    return found


class Chain:
    """Every role's processes (2 of each), a stage role's on a store directory of its
    own."""

    def __init__(self, roles: Roles, stages: tuple[str, ...]) -> None:
        self.roles, self.stages = roles, stages
        self.of: dict[str, list[tuple[subprocess.Popen[bytes], Path, str | None]]] = {}
        self.killed: set[int] = set()  # (pids)

    def start(self, role: str, store: str | None = None) -> None:
        proc, log = self.roles.start(role, store)
        self.of.setdefault(role, []).append((proc, log, store))

    def start_all(self) -> None:
        for i in range(2):
            self.start("sketch")
            for stage in self.stages:
                self.start(stage, f"{stage}-{i}")

    def kill_one(self, role: str) -> None:
        """SIGKILL a live process of ``role`` that holds a partition (its log's last
        assignment names one), and start it again on the same store."""
        live = [(p, lg, s) for p, lg, s in self.of[role] if p.poll() is None]
        holding = [(p, lg, s) for p, lg, s in live
                   if (said := [line for line in lg.read_text().splitlines()
                                if " role assigned " in line]) and "[]" not in said[-1]]
        proc, _, store = (holding or live)[0]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        self.killed.add(proc.pid)
        self.start(role, store)

    async def started(self, timeout: float = 300) -> None:
        """Every sketch process consuming, every stage partition taken."""
        deadline = time.monotonic() + timeout
        while True:
            check_alive(self.procs())
            logs = {role: [lg.read_text() for _, lg, _ in procs]
                    for role, procs in self.of.items()}
            ready = all("role assigned" in text for text in logs["sketch"])
            for stage in self.stages:
                taken = {line.split(" partition ")[1].split(" ")[0]
                         for text in logs[stage] for line in text.splitlines()
                         if "taken:" in line}
                ready &= len(taken) == self.roles.topics.partitions(stage)
            if ready:
                return
            assert time.monotonic() < deadline, "\n".join(
                f"== {lg.name}\n{lg.read_text()[-2000:]}" for _, lg in self.roles.procs)
            await asyncio.sleep(0.5)

    def procs(self) -> Procs:
        """Every process but those killed here (``check_alive``: none of them exited)."""
        return [(p, lg) for procs in self.of.values() for p, lg, _ in procs
                if p.pid not in self.killed]


async def decided(roles: Roles, chain: Chain, n_pages: int, timeout: float = 120) -> None:
    """Until the first ``n_pages`` sent are decided or dead-lettered."""
    deadline = time.monotonic() + timeout
    kc = roles.kc
    while (len(await roles.read(roles.topics.decisions, roles.shape.directory))
           + len(await roles.read(kc.dlq_topic, kc.topic_partitions))) < n_pages:
        check_alive(chain.procs())
        assert time.monotonic() < deadline, f"{n_pages} pages not decided"
        await asyncio.sleep(0.5)


async def published(roles: Roles, chain: Chain, n_pages: int, timeout: float
                    ) -> tuple[list[Any], list[Any], list[Any], dict[int, list[Any]]]:
    """Once every page is sequenced or dead-lettered and the output topic holds as many
    matches as the oracle finds (and a few seconds more, for any published twice): the
    input, the batches, the output records and the oracle's matches."""
    deadline = time.monotonic() + timeout
    kc = roles.kc
    want: dict[int, list[Any]] | None = None
    sent: list[Any] = []
    while True:
        check_alive(chain.procs())
        assert time.monotonic() < deadline, "\n".join(
            f"== {lg.name}\n{lg.read_text()[-3000:]}" for _, lg in roles.procs)
        batches = await roles.read(roles.topics.batches, 1)
        if want is None:
            dead = await roles.read(kc.dlq_topic, kc.topic_partitions)
            sequenced = sum(SequenceBatch.from_bytes(r.value).n for r in batches)
            if sequenced + len(dead) == n_pages:
                sent = await roles.read(kc.input_topic, kc.topic_partitions)
                want = oracle_matches(roles, sent, batches)
        if want is not None:
            out = await roles.read(kc.output_topic, kc.topic_partitions)
            if len(out) >= sum(len(m) for m in want.values()):
                await asyncio.sleep(3)
                out = await roles.read(kc.output_topic, kc.topic_partitions)
                return sent, batches, out, want
        await asyncio.sleep(1)


async def test_every_role_twice_publishes_scan_s_matches_across_a_sigkill_of_each(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    roles = Roles(kafka_bootstrap, tmp_path, SHAPE, ENGINE_TOML + NO_PASSAGES, batch_size=4)
    kinds = await run_chain(roles, [page_record(p) for p in chain_pages(130)], 300, STAGES)
    assert min(kinds[k] for k in ("exact", "near", "revisit")) >= 5, kinds


async def test_with_passages_every_role_and_align_twice_publish_scan_s_matches_across_kills(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The same with passages on: pages with align tasks wait in the combine for the align
    stage's answers (2 align partitions, one process of it SIGKILLed too)."""
    roles = Roles(kafka_bootstrap, tmp_path, SHAPE, ENGINE_TOML, batch_size=4)
    kinds = await run_chain(roles, [page_record(p) for p in chain_pages(130)], 300,
                            WITH_ALIGN)
    assert min(kinds[k] for k in ("exact", "near", "revisit", "passage")) >= 5, kinds


@pytest.mark.timeout(1800)
@pytest.mark.skipif(not LONG_TESTS, reason="5,000 pages through every role take several "
                                           "minutes: set DUPALIGN_LONG_TESTS=1")
async def test_every_role_twice_on_the_synthetic_stream_across_a_sigkill_of_each(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The same on the 5,000-page synthetic stream with its revisits, replays, deletes and
    pages sent again (``lifecycle_stream``), swept to 1,500 pages alive."""
    roles = Roles(kafka_bootstrap, tmp_path, SHAPE, ENGINE_TOML.replace(
        "max_pages = 70", "max_pages = 1500").replace("every = 25", "every = 250")
                  + NO_PASSAGES, batch_size=32)
    records, _ = lifecycle_stream(5000)
    kinds = await run_chain(roles, records, 1500, STAGES)
    assert min(kinds[k] for k in ("exact", "near", "revisit")) >= 50, kinds


def page_record(page: Page) -> tuple[bytes, bytes | None]:
    return page.id.encode("utf-8"), messages.encode_page(page)


async def send_records(roles: Roles, records: list[tuple[bytes, bytes | None]]) -> None:
    """(key, value) records on the pages topic: a None value is a tombstone."""
    producer = new_producer(roles.kc)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(roles.kc.input_topic, value, key=key)
                               for key, value in records])
    finally:
        await producer.stop()


async def run_chain(roles: Roles, records: list[tuple[bytes, bytes | None]], timeout: float,
                    stages: tuple[str, ...]) -> collections.Counter[str]:
    """``records`` through 2 processes of every role, sent in chunks; after each chunk but
    the first one process of each role in turn SIGKILLed and started again. Checks the
    matches published against the oracle's; the oracle's count of each kind."""
    await ensure_topics(roles.kc, roles.topics.wanted())
    kills = (*stages, "sketch")
    cut = len(records) // (len(kills) + 1)
    chain = Chain(roles, stages)
    try:
        chain.start_all()
        await chain.started()
        await send_records(roles, records[:cut])
        for k, role in enumerate(kills, start=1):
            await decided(roles, chain, k * cut, timeout)  # (the stream flowing through)
            await send_records(roles, records[k * cut:(k + 1) * cut if k < len(kills)
                                              else None])
            await asyncio.sleep(1)  # (mid stream: the chunk on its way)
            chain.kill_one(role)
        _, _, out, want = await published(roles, chain, len(records), timeout)
    finally:
        stop_all(roles.procs)
    got = matches_by_ordinal(out)
    assert sorted(got) == sorted(want)  # (every page with matches, none for the others)
    for o in want:
        assert got[o] == want[o], o  # (a page published twice would have them twice)
    # (each kill mattered: the partitions it held were restored by the next owner)
    restored = {lg.name.split("-")[0] for _, lg in roles.procs
                for line in lg.read_text().splitlines()
                if "taken:" in line and "changelog records restored" in line
                and " 0 changelog" not in line}
    assert restored == set(stages), restored
    return collections.Counter(m["kind"] for ms in want.values() for m in ms)
