"""The stage roles' partitions (dupalign/service/roles/stage_directory.py, stage_exact.py) without
a broker: D = 2 directory and E = 2 exact partitions fed a random stream's records as Kafka
could hand them over (the batches in offset order, each batch's entries in a partition in
any commit order of nearby batches, every partition read in chunks interleaved at random),
with turns that commit (their outputs and changelog records become visible), turns that
abort and crashes (a fresh store restored from the committed changelog records). Their
decisions and exact answers are ``Partitioned``'s for the pages in sequence order."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.config import RetentionConfig
from dupalign.near.idf import IdfTable
from dupalign.page import Page
from dupalign.service.changelog import Changelog, decode_key
from dupalign.service.changelog_parts import Rejoin
from dupalign.service.config import KafkaConfig
from dupalign.service.parts import PART_HEADER, record_part
from dupalign.service.roles.stage_directory import DirectoryPartition
from dupalign.service.roles.stage_exact import ExactPartition
from dupalign.service.roles.stage_role import StagePartition, parted_outputs
from dupalign.service.sequence_batch import SequenceBatch, page_header
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import RECORD_OVERHEAD, Outgoing, record_ordinal
from dupalign.stages.directory import directory_owner, entry_of
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.stages.sketch import Sketcher
from tests.reused_stores import Stores, temporary_stores
from tests.stages.streams import SHARED_TEXTS, ops, pages_of
from tests.stages.test_list_shard import LISTS

CONFIG = replace(LISTS, near=replace(LISTS.near, idf_freeze_at=()),
                 retention=RetentionConfig(max_pages=3, every=4)).validate()
SHAPE = Shape(2, 2, 1, 1, 1)
TOPICS = StageTopics(KafkaConfig(), SHAPE)
# records of at most this many bytes: most store values and big outputs go in parts of 300
LIMIT = RECORD_OVERHEAD + 300
STEPS = 3_000  # turns at most (a stream of 30 ops needs a few hundred)
Log = dict[tuple[str, int], list[Any]]  # (topic, partition) -> committed records


def sequenced(stream: list[Any], rng: random.Random, texts: list[str] = SHARED_TEXTS
              ) -> tuple[list[Page], Log]:
    """The pages that sketch (empty ones are dead-lettered), in batches of 1-3; the topics
    the sketch role would fill: ``batches`` in offset order, each entries partition with
    the batches' entries in an order nearby batches could commit in. ``texts``: the pool
    of bodies (tests/stages/streams.py ``pages_of``)."""
    sketcher, idf = Sketcher(CONFIG), IdfTable.uniform()
    pages = []
    for _, page in pages_of(stream, texts):
        if isinstance(page, Page) and sketcher.sketch(page, idf).rejected is None:
            pages.append(page)
    log: Log = {(TOPICS.batches, 0): []}
    for d in range(SHAPE.directory):
        log[(TOPICS.entries, d)] = []
    batches, at = [], 0
    while at < len(pages):
        n = rng.randint(1, 3)
        batches.append(pages[at:at + n])
        at += n
    commit = sorted(range(len(batches)), key=lambda b: b + rng.uniform(0, 2.5))
    for b, chunk in enumerate(batches):
        dirs = tuple(directory_owner(p.id, SHAPE.directory) for p in chunk)
        seq = SequenceBatch("pages", 0, tuple(range(len(chunk))), dirs, SHAPE.directory,
                            1_000 * b)
        log[(TOPICS.batches, 0)].append(_record(TOPICS.batches, 0, b, seq.to_bytes(), []))
    for b in commit:
        for i, page in enumerate(batches[b]):
            d = directory_owner(page.id, SHAPE.directory)
            part = log[(TOPICS.entries, d)]
            raw = entry_of(0, sketcher.sketch(page, idf)).to_bytes()
            part.append(_record(TOPICS.entries, d, len(part), raw, [page_header(b, i)]))
    return pages, log


def _record(topic: str, partition: int, offset: int, value: bytes, headers: list[Any],
            key: bytes | None = None) -> Any:
    return SimpleNamespace(topic=topic, partition=partition, offset=offset, value=value,
                           headers=headers, key=key)


@dataclass
class Owner:
    """One stage partition as its owner runs it: the store, its changelog, its reader's
    positions; what its committed changelog records hold."""

    name: str
    make: Any
    stores: Stores
    committed: list[Any] = field(default_factory=list)  # the changelog's records
    generation: int = 0

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new owner: a fresh store restored from the committed changelog records (what
        the log cleaner keeps of them: the last per key), values in parts put together."""
        self.generation += 1
        store = self.stores.store(f"{self.name}-{self.generation}", CONFIG.frozen_params())
        if self.generation % 2:  # (the log cleaner ran: the last record per key, in order)
            last = {r.key: i for i, r in enumerate(self.committed)}
            self.committed = [r for i, r in enumerate(self.committed) if last[r.key] == i]
        rejoin = Rejoin()
        store.apply([(*decode_key(k), v) for k, v in rejoin.add(self.committed)])
        done = rejoin.finish()
        store.apply([(*decode_key(k), v) for k, v in done.changes])
        self.part: StagePartition = self.make(store)
        self.changelog = Changelog(store, "changelog", 0, LIMIT, done.counts, done.stale,
                                   self.part.leave_out())
        self.read = {(tp.topic, tp.partition): o for tp, o in self.part.positions().items()}

    def turn(self, log: Log, rng: random.Random) -> list[Outgoing]:
        """What the reader fetches (a chunk of some inputs), applied; the outputs."""
        fetched: dict[Any, list[Any]] = {}
        for (topic, p), at in self.read.items():
            if rng.random() < 0.6:
                chunk = log.get((topic, p), [])[at:at + rng.randint(1, 4)]
                if chunk:
                    fetched[_Tp(topic, p)] = chunk
                    self.read[(topic, p)] = at + len(chunk)
        out = parted_outputs(self.part.turn(fetched), TOPICS.parted(), self.name, LIMIT)
        # (what ``dupalign acls --stage`` grants the role: StageTopics.outputs)
        allowed = self.part.topics.outputs(stage_of(self.part))
        assert {o.topic for o in out} <= set(allowed), (self.name, allowed)
        return out

    def commit(self) -> None:
        self.committed += self.changelog.outgoing()


def stage_of(part: StagePartition) -> str:
    """The stage role of ``part``: its module's (dupalign/service/roles/stage_<role>.py)."""
    for cls in type(part).__mro__:
        module = cls.__module__.rpartition(".")[2]
        if module.startswith("stage_") and module not in ("stage_role", "stage_ledger"):
            return module.removeprefix("stage_")
    raise AssertionError(f"{type(part)} is no stage role's partition")


def wholes(records: list[Any]) -> list[Any]:
    """``records`` of a partition with the values in parts put together (as the merges of
    the stages do: ``StagePartition._add``), each where its last part is."""
    out, pending = [], {}
    for r in records:
        part = record_part(r)
        if part is None:
            out.append(r)
            continue
        headers = tuple((k, v) for k, v in r.headers if k != PART_HEADER)
        got = pending.setdefault(headers, {})
        got[part[0]] = r.value
        if len(got) == part[1]:
            del pending[headers]
            out.append(_record(r.topic, r.partition, r.offset,
                               b"".join(got[i] for i in range(part[1])), list(headers), r.key))
    assert not pending, "a value sent in parts, not all of them"
    return out


@dataclass(frozen=True)
class _Tp:
    topic: str
    partition: int


def step(owner: Owner, log: Log, rng: random.Random) -> None:
    """A crash of ``owner`` (the next owner restores what was committed), or a turn that
    aborts or commits (its outputs appended to their partitions)."""
    r = rng.random()
    if r < 0.05:
        owner.restart()
        return
    outputs = owner.turn(log, rng)
    if r < 0.12:
        owner.restart()  # the turn's transaction aborted: its store is not used again
        return
    owner.commit()
    for o in outputs:
        part = log[(o.topic, o.partition or 0)]
        part.append(_record(o.topic, o.partition or 0, len(part), o.value or b"", o.headers,
                            o.key))


def run(stores: Stores, stream: list[Any], seed: int) -> tuple[dict[int, bytes],
                                                                 dict[int, bytes], list[Page]]:
    rng = random.Random(seed)
    pages, log = sequenced(stream, rng)
    for d in range(SHAPE.directory):
        log[(TOPICS.decisions, d)] = []
    for e in range(SHAPE.exact):
        log[(TOPICS.exact, e)] = []
    owners = [Owner(f"dir{d}", functools.partial(DirectoryPartition, TOPICS, d,
                                                 config=CONFIG), stores)
              for d in range(SHAPE.directory)]
    owners += [Owner(f"exact{e}", functools.partial(ExactPartition, TOPICS, e, config=CONFIG),
                     stores) for e in range(SHAPE.exact)]

    def decided() -> int:
        return sum(len(log[(TOPICS.decisions, d)]) for d in range(SHAPE.directory))

    def done() -> bool:
        return decided() == len(pages) and all(
            not isinstance(w.part, ExactPartition)
            or w.part.ledger.next_seq == len(pages) for w in owners)

    assert drive(owners, log, rng, done), f"{decided()} of {len(pages)} decided"
    got = {_ordinal(r): r.value for d in range(SHAPE.directory)
           for r in log[(TOPICS.decisions, d)]}
    answers = {_ordinal(r): r.value for e in range(SHAPE.exact) for r in log[(TOPICS.exact, e)]}
    assert len(got) == len(pages)
    return got, answers, pages


def drive(owners: list[Owner], log: Log, rng: random.Random, done: Callable[[], bool],
          steps: int = STEPS) -> bool:
    """``step``s of owners picked at random until ``done()`` (False: not in ``steps``)."""
    for _ in range(steps):
        step(rng.choice(owners), log, rng)
        if done():
            return True
    return False


def _ordinal(record: Any) -> int:
    return record_ordinal(record)


def recorded(p: Partitioned) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """The decisions and exact answers ``p`` makes from now on, by ordinal, in their wire
    form (filled as it runs): what the directory and exact roles publish."""
    decisions: dict[int, bytes] = {}
    answers: dict[int, bytes] = {}

    def decide(real: Any, entry: Any) -> Any:
        d = real(entry)
        decisions[d.seq] = d.to_bytes()
        return d

    def apply(real: Any, d: Any, placed: Any) -> Any:
        a = real(d, placed)
        if a is not None:
            answers[a.seq] = a.to_bytes()
        return a

    for shard in p.dirs:
        shard.decide = functools.partial(decide, shard.decide)  # type: ignore[method-assign]
    for exact, _ in p.exacts:
        exact.apply = functools.partial(apply, exact.apply)  # type: ignore[method-assign]
    return decisions, answers


def oracle(stores: Stores, pages: list[Page]) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """``Partitioned`` on the pages, swept before every multiple of ``every`` ordinals (by
    page count only: no ``max_age``, so the batches' clock does not matter)."""
    p = Partitioned(CONFIG, SHAPE, functools.partial(stores.store,
                                                     params=CONFIG.frozen_params()))
    decisions, answers = recorded(p)
    process(p, pages)
    return decisions, answers


def process(p: Partitioned, pages: list[Page]) -> None:
    """The pages through ``p``, swept before every multiple of ``every`` ordinals (by page
    count only: no ``max_age``, so the batches' clock does not matter)."""
    r = p.config.retention
    for o, page in enumerate(pages):
        if o and o % r.every == 0:
            p.sweep(r.max_pages, r.max_age, 0)
        for _ in p.process_many([page]):
            pass


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, seed=st.integers(0, 2**32))
def test_stage_partitions_decide_as_the_pipeline_in_one_process_across_crashes(
        stream: list[Any], seed: int) -> None:
    with temporary_stores("stage-parts-") as stores:
        got, answers, pages = run(stores, stream, seed)
        want, want_answers = oracle(stores, pages)
        assert got == want
        assert answers == want_answers
