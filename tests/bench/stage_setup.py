"""The stage roles of bench_stage_roles over fresh topics (issue 43): ``copies`` processes of
every role, how far every stage partition has applied the sequence (``Applied``), when every
stage is done, and how many pages each committed turn applied (stage_turns.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, TopicPartition

from dupalign.service.changelog import encode_key
from dupalign.service.roles.stage_align import record_upto
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.stages.partitioned import Shape
from dupalign.store.keys import read_u64
from tests.bench.stage_turns import turn_pages
from tests.role_processes import check_alive, cpu_seconds, read_topic
from tests.service.test_stage_roles_kafka import Roles

# every role of the shape, in pipeline order
ROLES = ("sketch", "directory", "exact", "learner", "router", "near", "lists", "combine",
         "align")
ENGINE = ""  # the default engine configuration (idf tables learned: the learner role runs)
NO_PASSAGES = """
[engine.passage]
enabled = false
"""
QUIET_S = 3.0  # no record on any topic for this long: every stage is done
NEXT_SEQ = encode_key("meta", b"ledger_next_seq")  # (a ledger's next ordinal, records.NOTES)
CURSOR = encode_key("meta", b"stage_cursor")  # (the near partition's: "next")


class Applied:
    """How far every stage partition has applied the sequence, as committed: the last
    ledger ``next_seq`` note (the near partition's cursor "next") in its changelog, read
    as it comes. A role still busy with the pages sent writes no record on a topic for a
    while (its first pages load its kernels): quiet topics alone do not say it is done."""

    def __init__(self, setup: Setup) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=setup.kc.bootstrap_servers, group_id=None,
            isolation_level="read_committed", enable_auto_commit=False,
            auto_offset_reset="earliest")
        self.tps = [TopicPartition(setup.topics.changelog(role), p) for role in ROLES[1:]
                    for p in range(setup.topics.partitions(role))]
        self.at = dict.fromkeys(self.tps, 0)
        self.seen: dict[TopicPartition, float] = {}  # when a record of each last came

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)

    async def lowest(self) -> int:
        """The lowest ordinal any stage partition is still to apply."""
        while True:
            got = await self.consumer.getmany(timeout_ms=100, max_records=100_000)
            if not any(got.values()):
                return min(self.at.values())
            for tp, recs in got.items():
                if recs:
                    self.seen[tp] = time.monotonic()
                for r in recs:
                    if r.key == NEXT_SEQ and r.value is not None:
                        self.at[tp] = read_u64(r.value)
                    elif r.key == CURSOR and ".near." in tp.topic and r.value is not None:
                        self.at[tp] = msgpack.unpackb(r.value)["next"]


class Setup(Roles):
    """``copies`` processes of every role over fresh topics, ``partitions`` partitions for
    every stage."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int, copies: int,
                 batch: int, engine: str = ENGINE) -> None:
        where = tmp / f"c{copies}-{uuid.uuid4().hex[:8]}"
        where.mkdir(parents=True)
        p = partitions
        super().__init__(bootstrap, where, Shape(p, p, p, p, p, p, p), engine, batch, p)
        self.copies = copies

    def start_all(self) -> None:
        for role in ROLES:
            for i in range(self.copies):
                self.start(role, None if role == "sketch" else f"{role}-{i}")

    def of(self, role: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
        return [(p, log) for p, log in self.procs if log.name.startswith(f"{role}-")]

    def held(self, role: str) -> list[list[str]] | None:
        """What each copy of ``role`` holds now: the partitions of its last "role assigned"
        line (eager rebalances: each names the whole set); None while a copy has none."""
        sets = []
        for _, log in self.of(role):
            lines = [ln for ln in log.read_text().splitlines() if " role assigned " in ln]
            if not lines:
                return None
            named = lines[-1].split(" role assigned [")[1].split("]")[0]
            sets.append([tp for tp in named.split(", ") if tp])
        return sets

    async def started(self, timeout: float = 300) -> None:
        """Every role consuming, every stage partition taken, each copy holding some (or
        standing by, past the partitions): a
        copy that joins late makes the group move partitions (a restore), which must not
        fall inside the measurement."""
        deadline = time.monotonic() + timeout
        while True:
            check_alive(self.procs)
            ready = True
            for role in ROLES:
                sets = self.held(role)
                want = self.kc.topic_partitions if role == "sketch" else \
                    self.topics.partitions(role)
                # (copies past the partitions, the learner's, stand by with none)
                ready &= (sets is not None and sum(1 for s in sets if s) == min(len(sets), want)
                          and len({tp for s in sets for tp in s}) == want
                          and sum(map(len, sets)) == want)
            for role in ROLES[1:]:
                taken = {line.split(" partition ")[1].split(" ")[0]
                         for _, log in self.of(role) for line in log.read_text().splitlines()
                         if "taken:" in line}
                ready &= len(taken) == self.topics.partitions(role)
            if ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("roles not started:\n" + "\n".join(
                    f"== {lg.name}\n{lg.read_text()[-2000:]}" for _, lg in self.procs))
            await asyncio.sleep(0.5)

    def topic_names(self) -> dict[str, tuple[str, int]]:
        t, s = self.topics, self.shape
        return {"batches": (t.batches, 1), "entries": (t.entries, s.directory),
                "decisions": (t.decisions, s.directory), "exact": (t.exact, s.exact),
                "near_state": (t.near_state, s.router), "near_ops": (t.near_ops, s.near),
                "near_answers": (t.near_answers, s.combine), "windows": (t.windows, s.lists),
                "partials": (t.partials, s.combine), "sketches": (t.sketches, s.combine),
                "matches": (self.kc.output_topic, self.kc.topic_partitions),
                "align": (t.align_requests, s.align), "passages": (t.passages, s.align),
                "aligned": (t.aligned, s.combine)}

    async def done(self, n_pages: int, applied: Applied, timeout: float = 1800
                   ) -> dict[str, list[Any]]:
        """Once every page is applied by every stage partition (``Applied``) and no topic
        got a record for ``QUIET_S``: the records of each topic between the roles."""
        deadline = time.monotonic() + timeout
        bootstrap = self.kc.bootstrap_servers
        last: dict[str, int] = {}
        since = time.monotonic()
        while True:
            check_alive(self.procs)
            got = {name: await read_topic(bootstrap, topic, n)
                   for name, (topic, n) in self.topic_names().items()}
            # (the combines' UPTO records to the align partitions are not requests)
            got["align"] = [r for r in got["align"] if record_upto(r) is None]
            counts = {name: len(recs) for name, recs in got.items()}
            dead = await read_topic(bootstrap, self.kc.dlq_topic, self.kc.topic_partitions)
            sequenced = sum(SequenceBatch.from_bytes(r.value).n for r in got["batches"])
            if counts != last:
                last, since = counts, time.monotonic()
            elif (sequenced + len(dead) == n_pages and counts["decisions"] == sequenced
                  and await applied.lowest() == sequenced
                  and time.monotonic() - since > QUIET_S):
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sequenced} sequenced, {len(dead)} dead, {counts}, "
                                   f"of {n_pages}")
            await asyncio.sleep(0.5)

    def cpu(self) -> dict[str, float]:
        return {role: sum(cpu_seconds(p.pid) for p, _ in self.of(role)) for role in ROLES}


def spied(procs: list[tuple[subprocess.Popen[bytes], Path]], profile: Path, prefix: str
          ) -> list[subprocess.Popen[bytes]]:
    """A py-spy recorder on each process (raw collapsed stacks, one file each:
    DIR/<prefix>-<its log's stem>.txt; ``python -m tests.bench.spy_summary`` sums them)."""
    profile.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    return [subprocess.Popen([str(spy), "record", "--pid", str(p.pid), "--format", "raw",
                              "--rate", "200", "--nonblocking", "-o",
                              str(profile / f"{prefix}-{log.stem}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for p, log in procs]


def moves(setup: Setup) -> int:
    """Stage partitions taken so far, in every process (a move after the start: more)."""
    return sum(log.read_text().count(" taken: ") for _, log in setup.procs)




def progress(record: Any) -> int | None:
    """The ordinal a stage's changelog record says its partition has reached (the ledger's
    ``next_seq``, the near partition's cursor "next"), None for any other record."""
    if record.value is None:
        return None
    if record.key == NEXT_SEQ:
        return read_u64(record.value)
    if record.key == CURSOR and ".near." in record.topic:
        return int(msgpack.unpackb(record.value)["next"])
    return None


def sketch_turns(batches: list[Any], since: int, until: float) -> list[int]:
    """The pages of each sketch transaction (one ``<in>.batches`` record each) whose first
    ordinal is in [since, until)."""
    out, at = [], 0
    for r in sorted(batches, key=lambda r: r.offset):
        n = SequenceBatch.from_bytes(r.value).n
        if since <= at < until:
            out.append(n)
        at += n
    return out


async def changelogs(setup: Setup) -> dict[str, list[Any]]:
    """Every committed record of each stage's changelog, by stage."""
    return {role: await read_topic(setup.kc.bootstrap_servers, setup.topics.changelog(role),
                                   setup.topics.partitions(role)) for role in ROLES[1:]}


def turns(logs: dict[str, list[Any]], batches: list[Any], since: int, until: float
          ) -> dict[str, list[int]]:
    """Pages per committed turn of each stage between ordinals ``since`` and ``until``
    (stage_turns.turn_pages), the sketch's from its batch records."""
    return {"sketch": sketch_turns(batches, since, until),
            **{role: turn_pages(recs, progress, since, until) for role, recs in logs.items()}}
