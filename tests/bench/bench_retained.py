"""What the compacted changelogs of every stage of the partitioned pipeline keep per page
(issue 43, "retained bytes per page <= 2 KB"): ``Partitioned`` (dupalign/stages/partitioned.py)
over a real stream, every stage partition's store observed by a ``Changelog``
(dupalign/service/changelog.py) as its role will send it, and at the end, per stage, the
bytes that a fully compacted changelog holds per page alive.

    python -m tests.bench.bench_retained [--corpus llvm,boost,stream] [--limit N]
        [--shape 2,2,2,2,2,2] [--turn 64] [--near-only] [--broker PARTITION] [--entries]
        [--restore]

Corpora: ``llvm`` and ``boost``, both releases' HTML pages as tests/bench/bench_scan.py loads
them; ``stream``: tests/stages/test_exact.py ``corpus_items`` (the 5,000-page synthetic stream,
the RFCs and Clough, with new versions, deletes and retention sweeps to 1,500 pages alive).
The default engine configuration (``--near-only``: passages off).

The model of the broker (no broker needed): a turn of ``--turn`` pages is one transaction;
its records (``Changelog.outgoing``: the last value per key changed in the turn) go out in
Kafka batches of up to 16 KB (aiokafka's ``max_batch_size``), each record in the v2 record
format (length, attributes, timestamp and offset deltas, key and value lengths as varints,
no headers), a batch with its 61-byte header, and each transaction with a commit marker
(a 78-byte control batch) in every partition it wrote. Compaction keeps the last record
per key and drops tombstones (after ``delete.retention.ms``); the cleaner keeps a surviving
record in its batch (rewritten without the others, compressed again with the batch's
codec) and a commit marker while its transaction has records left. "zstd": each surviving
batch's records compressed with zstd at level 3 (Kafka's default level), what a topic of
``kafka.retained_compression = zstd`` holds on disk. The records that survive are checked
equal, key for key, to the stores' contents at the end (the store parameters aside, which
``restore`` expects in a fresh store).

The list shards' changelogs leave out their entries and runs, as the list role's do
(``ListsPartition.leave_out``; ``--entries``: kept, the layout before); the forward stage's
leaves out its ``forward`` records, as the align role's (``AlignPartition.leave_out``).
``--restore``: each list and forward partition's store written into a fresh one in the
layout before against the kept keys and then the stage opened on it (what it derives
rebuilt), timed, store side only (tests/bench/retained_restore.py).

Smaller encodings (``ALTERS``), estimated on the same records by the same model, each
record's value re-encoded or left out: verification sketches of 32-bit samples; a list
shard's forward record reduced to its lists. Neither is built (docs/pipeline.md, "State and
what Kafka keeps").

``--broker directory0`` (a store partition's name): the model checked on a real broker for
that partition of the last corpus: its records sent to a compacted changelog topic (a
broker started with deploy/kafka/broker.sh), one transaction a turn, the cleaner made
eager (tests/bench/bench_changelog.py ``admin_roll``), then the records, key + value bytes
and log segment bytes it holds, next to the model's.

Not in a store yet, so not in a changelog (docs/pipeline.md): every consumer's ``Ledger``
and the router's rows, in memory; their rows here are what they would take as records
(a ledger slot: key u64 sequence ordinal, value u64 store ordinal + i64 fetched_at; a
router row: key u64 store ordinal, value u64 fingerprint), estimated, not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import cramjam
import numpy as np

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.passage import forward
from dupalign.passage.sketch import distinct_lists
from dupalign.service.changelog import (
    Changelog,
    LeaveOut,
    changelog_topic,
    decode_key,
    ensure_changelog,
)
from dupalign.service.config import KafkaConfig
from dupalign.service.loop import Checkpoint
from dupalign.service.topology import Outgoing, new_producer
from dupalign.stages.forward_stage import DERIVED
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.store import lists
from dupalign.store.database import Change, Store
from dupalign.store.keys import FAMILIES
from tests.bench.bench_changelog import admin_roll, disk_bytes, log_stats
from tests.bench.bench_worker import run_with_broker
from tests.bench.retained_restore import Restore, time_forward_restore, time_restore

BATCH_BYTES = 16 * 1024  # aiokafka's default max_batch_size
BATCH_HEADER = 61  # a v2 record batch's header
MARKER = BATCH_HEADER + 17  # a commit marker: a control batch of one record
ZSTD_LEVEL = 3
STAGES = ("directory", "exact", "near", "lists", "combine", "forward")
LEDGER_RECORD = 8 + 16 + 8  # key, value, record overhead (estimated)
ROUTER_RECORD = 8 + 8 + 8


def varint_size(n: int) -> int:
    """Bytes of ``n`` as a zig-zag varint (Kafka's record fields)."""
    z = (n << 1) ^ (n >> 63)
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def _varint(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def record_bytes(key: bytes, value: bytes | None, offset_delta: int) -> bytes:
    """One record in Kafka's v2 format (timestamp delta 0, no headers)."""
    body = b"".join((b"\x00", _varint(0), _varint(offset_delta), _varint(len(key)), key,
                     _varint(-1) if value is None else _varint(len(value)), value or b"",
                     _varint(0)))
    return _varint(len(body)) + body


def record_size(key: bytes, value: bytes | None, offset_delta: int) -> int:
    n = len(value) if value is not None else 0
    body = (1 + 1 + varint_size(offset_delta) + varint_size(len(key)) + len(key)
            + varint_size(n if value is not None else -1) + n + 1)
    return varint_size(body) + body


@dataclass
class Held:
    """What a compacted changelog holds, summed: records, key and value bytes, the record
    format's overhead (record fields, batch headers, markers) and the zstd size."""

    records: int = 0
    keys: int = 0
    values: int = 0
    overhead: int = 0
    zstd: int = 0
    largest: int = 0  # the largest record

    @property
    def plain(self) -> int:
        return self.keys + self.values + self.overhead

    def add(self, other: Held) -> None:
        for name in ("records", "keys", "values", "overhead", "zstd"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.largest = max(self.largest, other.largest)


@dataclass
class Recorder:
    """One stage partition's changelog: for each key, where its last record went (its
    batch and offset in it; -1: a tombstone)."""

    store: Store
    name: str
    log: Changelog = field(init=False)
    last: dict[bytes, int] = field(default_factory=dict)  # batch << 24 | offset; -1: none
    batch_turn: list[int] = field(default_factory=list)  # batch -> its transaction
    written: int = 0  # records sent
    turns: int = 0
    keep: bool = False  # keep every turn's records (``sent``: for a broker)
    sent: list[list[tuple[bytes, bytes | None]]] = field(default_factory=list)
    # the keys the changelog leaves out: a list shard's entries, as the list role's
    # (``ListsPartition.leave_out``; ``--entries``: none), the forward stage's windows, as
    # the align role's (``AlignPartition.leave_out``)
    leave_out: LeaveOut | None = None

    def __post_init__(self) -> None:
        # (every value one record, as the model counts: no parts at a record size limit)
        self.log = Changelog(self.store, "changelog", 0, limit=1 << 40,
                             leave_out=self.leave_out)

    def turn(self) -> None:
        """A transaction: the records of the changes since the last one."""
        out = self.log.outgoing()
        self.turns += 1
        if self.keep:
            self.sent.append([(o.key or b"", o.value) for o in out])
        if not out:
            return
        size = at = 0
        for o in out:
            assert o.key is not None
            r = record_size(o.key, o.value, at)
            if at and size + r > BATCH_BYTES:  # (the batch is full: the next one)
                size = at = 0
                r = record_size(o.key, o.value, 0)
            if at == 0:
                self.batch_turn.append(self.turns)
            self.last[o.key] = -1 if o.value is None else (len(self.batch_turn) - 1) << 24 | at
            size += r
            at += 1
        self.written += len(out)

    def held(self, alter: Alter | None = None) -> dict[str, Held]:
        """Per family, what the compacted log holds (checked against the store); ``alter``:
        with each kept record's value given by it instead (None: left out)."""
        batches: dict[int, list[tuple[int, bytes, bytes]]] = defaultdict(list)
        stage = stage_of(self.name)
        for key, where in self.last.items():
            if where >= 0:
                family, k = decode_key(key)
                value = self.store.get(family, k)
                assert value is not None, (family, k)
                if alter is not None and (value := alter(stage, family, k, value)) is None:
                    continue
                batches[where >> 24].append((where & 0xFFFFFF, key, value))
        if alter is None:
            out_ = self.leave_out or (lambda f, k: False)
            stored = {(f, k) for f in FAMILIES if self.store.has_family(f)
                      for k in self.store.keys(f) if not out_(f, k)} - {("meta", b"params")}
            kept = {decode_key(k) for k, w in self.last.items() if w >= 0}
            assert stored == kept, (len(stored), len(kept), sorted(stored ^ kept)[:5])
        out: dict[str, Held] = defaultdict(Held)
        for b in sorted(batches):
            raws = []
            by_family: dict[str, int] = defaultdict(int)
            for at, key, value in sorted(batches[b]):
                family = decode_key(key)[0]
                raws.append(raw := record_bytes(key, value, at))
                by_family[family] += len(raw)
                h = out[family]
                h.records += 1
                h.keys += len(key)
                h.values += len(value)
                h.overhead += len(raw) - len(key) - len(value)
                h.largest = max(h.largest, len(raw))
            whole = sum(by_family.values())
            packed = len(cramjam.zstd.compress(b"".join(raws), level=ZSTD_LEVEL))
            for family, size in by_family.items():  # (header and zstd shared by bytes)
                out[family].overhead += round(BATCH_HEADER * size / whole)
                out[family].zstd += round((packed + BATCH_HEADER) * size / whole)
        markers = len({self.batch_turn[b] for b in batches}) * MARKER
        if batches:
            first = max(out, key=lambda f: out[f].plain)
            out[first].overhead += markers
            out[first].zstd += markers
        return out


# -- smaller encodings, estimated on the same records -----------------------------------------
Alter = Callable[[str, str, bytes, bytes], "bytes | None"]  # stage, family, key, value


def cws32(stage: str, family: str, key: bytes, value: bytes) -> bytes | None:
    """Verification sketches of 32-bit samples (the low half of each)."""
    if family == "cws":
        return np.frombuffer(value, "<u8").astype("<u4").tobytes()
    return value


def list_names(stage: str, family: str, key: bytes, value: bytes) -> bytes | None:
    """A list shard's forward record reduced to what removal and a rebuild read: its lists
    (bin <u2, key <u8, the page's windows in it <u2), no rectangles; and no empty positions
    record."""
    if stage != "lists":
        return value
    if family == "positions" and not value:
        return None
    if family == "forward":
        bins, keys, _, _, _ = forward.unpack_windows(value)
        b, k, inverse = distinct_lists(bins, keys.astype(np.uint64))
        n = np.bincount(inverse, minlength=len(b))
        return b.astype("<u2").tobytes() + k.astype("<u8").tobytes() + n.astype("<u2").tobytes()
    return value


def all_of(*alters: Alter) -> Alter:
    def alter(stage: str, family: str, key: bytes, value: bytes) -> bytes | None:
        v: bytes | None = value
        for a in alters:
            if v is None:
                return None
            v = a(stage, family, key, v)
        return v
    return alter


ALTERS: dict[str, Alter] = {
    "cws 32-bit samples": cws32,
    "lists: forward = its lists": list_names,
    "both": all_of(cws32, list_names),
}


def stage_of(name: str) -> str:
    return name.rstrip("0123456789")


@contextlib.contextmanager
def observed(root: Path, config: EngineConfig, shape: Shape, keep: str | None = None,
             entries: bool = False) -> Iterator[tuple[Partitioned, dict[str, Recorder]]]:
    """The pipeline on new stores under ``root``, each observed by a ``Recorder`` (the one
    of partition ``keep`` keeps its records; ``entries``: the list shards' changelogs with
    their entries, the layout before)."""
    params = config.frozen_params()
    recorders: dict[str, Recorder] = {}

    def store(name: str) -> Store:
        out = (lists.derived if stage_of(name) == "lists" and not entries
               else DERIVED if stage_of(name) == "forward" else None)
        r = recorders[name] = Recorder(Store(root / name, params), name, keep=name == keep,
                                       leave_out=out)
        if stage_of(name) == "forward":  # (and the layout before, of the same writes)
            before = recorders[BEFORE + name] = Recorder(r.store, BEFORE + name,
                                                         leave_out=_units)
            notes = (r.log._note, before.log._note)

            def both(changes: list[Change]) -> None:
                for note in notes:
                    note(changes)

            r.store.observe(both)
        return r.store

    try:
        yield Partitioned(config, shape, store), recorders
    finally:
        for name, r in recorders.items():
            r.log.close()
            if not name.startswith(BEFORE):
                r.store.close()


BEFORE = "before-"  # a forward stage's changelog in the layout before: its windows kept


def _units(family: str, key: bytes) -> bool:
    """What the layout before did not have: the units' high halves."""
    return family == "units"


Item = tuple[int, Page | tuple[int, int]]


def corpus(name: str, limit: int | None) -> list[Item]:
    if name == "stream":
        from tests.stages.test_exact import corpus_items
        items: list[Item] = corpus_items()
        return items[:limit] if limit else items
    from tests.bench.bench_scan import load_pages
    from tests.corpora import LLVM_DOCS
    old, new = load_pages(LLVM_DOCS, limit, name)
    return list(enumerate(old + new))


@dataclass
class Result:
    corpus: str
    pages: int  # sequenced
    alive: int
    rejected: int
    seconds: float
    held: dict[str, dict[str, Held]]  # stage -> family -> held
    written: dict[str, int]
    ledgers: int  # ledger copies
    router_rows: int
    kept: Recorder | None  # the partition whose records were kept
    kept_held: Held | None
    alts: dict[str, dict[str, Held]]  # ALTERS' name -> stage -> held
    restores: list[Restore]  # ``--restore``: each list and forward partition's


def measure(name: str, items: list[Item], config: EngineConfig, shape: Shape, turn: int,
            tmp: Path, keep: str | None = None, entries: bool = False,
            restores: bool = False) -> Result:
    t0 = time.perf_counter()
    rejected = pages = 0
    with observed(tmp / name, config, shape, keep, entries) as (p, recorders):
        for i, (step, item) in enumerate(items):
            if isinstance(item, Page):
                pages += 1
                try:
                    p.process(item)
                except PageRejected:
                    rejected += 1
            else:
                p.sweep(item[0], item[1], step * 1000)
            if (i + 1) % turn == 0 or i + 1 == len(items):
                for r in recorders.values():
                    r.turn()
                print(f"  {name}: {i + 1:,} of {len(items):,} items, "
                      f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        seconds = time.perf_counter() - t0
        held: dict[str, dict[str, Held]] = defaultdict(lambda: defaultdict(Held))
        written: dict[str, int] = defaultdict(int)
        kept = kept_held = None
        for part, r in recorders.items():
            for family, h in (mine := r.held()).items():
                held[stage_of(part)][family].add(h)
            written[stage_of(part)] += r.written
            if part == keep:
                kept, kept_held = r, Held()
                for h in mine.values():
                    kept_held.add(h)
        alts: dict[str, dict[str, Held]] = {a: defaultdict(Held) for a in ALTERS}
        for a, alter in ALTERS.items():
            for part, r in recorders.items():
                for h in r.held(alter).values():
                    alts[a][stage_of(part)].add(h)
        ledgers = 1 + len(p.exacts) + len(p.routers) + len(p.lists) + len(p.combines) + 1
        rows = sum(len(router.rows) for router, _ in p.routers)
        timed = [time_restore(part, r.store, config, shape, tmp / f"{name}-restore")
                 for part, r in recorders.items() if restores and stage_of(part) == "lists"]
        timed += [time_forward_restore(part, r.store, config, tmp / f"{name}-restore")
                  for part, r in recorders.items() if restores and stage_of(part) == "forward"]
        return Result(name, pages, p.alive, rejected, seconds, held, written, ledgers, rows,
                      kept, kept_held, alts, timed)


def _sum(held: dict[str, Held]) -> Held:
    total = Held()
    for h in held.values():
        total.add(h)
    return total


def report(r: Result, turn: int) -> None:
    n = max(1, r.alive)
    print(f"\n{r.corpus}: {r.pages:,} pages sequenced ({r.rejected:,} rejected), {r.alive:,} "
          f"alive at the end; {r.seconds:.0f} s; turns of {turn} pages")
    print(f"{'stage':<12}{'records':>10}{'rec/page':>9}{'key B':>8}{'value B':>9}"
          f"{'overhead B':>11}{'B/page':>8}{'zstd B/page':>12}{'written rec/page':>17}")
    total = Held()
    for stage in STAGES:
        h = Held()
        for fh in r.held.get(stage, {}).values():
            h.add(fh)
        total.add(h)
        print(f"{stage:<12}{h.records:>10,}{h.records / n:>9.2f}{h.keys / n:>8.0f}"
              f"{h.values / n:>9.0f}{h.overhead / n:>11.0f}{h.plain / n:>8.0f}"
              f"{h.zstd / n:>12.0f}{r.written[stage] / n:>17.2f}")
    print(f"{'total':<12}{total.records:>10,}{total.records / n:>9.2f}{total.keys / n:>8.0f}"
          f"{total.values / n:>9.0f}{total.overhead / n:>11.0f}{total.plain / n:>8.0f}"
          f"{total.zstd / n:>12.0f}")
    ledger = r.ledgers * LEDGER_RECORD * r.alive / n
    router = ROUTER_RECORD * r.router_rows / n
    h = _sum(r.held.get(BEFORE + "forward", {}))
    was = Held()
    was.add(total)
    was.add(h)
    for fh in r.held.get("forward", {}).values():
        was.add(Held(-fh.records, -fh.keys, -fh.values, -fh.overhead, -fh.zstd))
    print("the layout before (the forward stage's windows kept, no units):")
    print(f"{'  forward':<12}{h.records:>10,}{h.records / n:>9.2f}{h.keys / n:>8.0f}"
          f"{h.values / n:>9.0f}{h.overhead / n:>11.0f}{h.plain / n:>8.0f}{h.zstd / n:>12.0f}")
    print(f"{'  total':<12}{was.records:>10,}{was.records / n:>9.2f}{was.keys / n:>8.0f}"
          f"{was.values / n:>9.0f}{was.overhead / n:>11.0f}{was.plain / n:>8.0f}"
          f"{was.zstd / n:>12.0f}")
    print(f"not in a store (estimated as records, uncompressed): {r.ledgers} ledgers "
          f"{ledger:.0f} B/page, router rows {router:.0f} B/page")
    print(f"against 2,048 B/page: {total.plain / n:.0f} B as records, {total.zstd / n:.0f} B "
          f"with zstd; with the ledgers and router rows {total.plain / n + ledger + router:.0f} B")
    print("\nsmaller encodings, estimated on the same records (B/page, zstd B/page):")
    print(f"{'':<30}" + "".join(f"{s:>16}" for s in (*STAGES, "total")))
    for a, held in (("as stored", {s: _sum(r.held.get(s, {})) for s in STAGES}),
                    *r.alts.items()):
        cells = [held.get(s, Held()) for s in STAGES]
        cells.append(_sum({s: c for s, c in zip(STAGES, cells, strict=True)}))
        print(f"{a:<30}" + "".join(f"{c.plain / n:>9.0f} {c.zstd / n:>6.0f}" for c in cells))
    for t in r.restores:
        print(f"\nrestore of {t.name} ({t.pages:,} forward records), store writes only (no "
              f"broker): before, every key: {t.records_before:,} records in "
              f"{t.seconds_before:.2f} s; now: {t.records:,} records in {t.seconds_apply:.2f} s "
              f"+ rebuilt at open in {t.seconds_rebuild:.2f} s")
    print(f"\n{'stage/family':<20}{'rec/page':>9}{'key B':>8}{'value B':>9}{'B/page':>8}"
          f"{'zstd B/page':>12}{'largest B':>11}")
    for stage in (*STAGES, BEFORE + "forward"):
        for family, h in sorted(r.held.get(stage, {}).items()):
            print(f"{stage + '/' + family:<20}{h.records / n:>9.2f}{h.keys / n:>8.0f}"
                  f"{h.values / n:>9.0f}{h.plain / n:>8.0f}{h.zstd / n:>12.0f}"
                  f"{h.largest:>11,}")


async def on_broker(bootstrap: str, tmp: Path, r: Result, wait: float) -> None:
    """Send the kept partition's records to a compacted topic of a real broker, one
    transaction a turn, let the cleaner compact it, and print what it holds next to the
    model's figures."""
    assert r.kept is not None and r.kept_held is not None
    kc = KafkaConfig(bootstrap_servers=bootstrap)
    topic = changelog_topic(kc, f"retained-{uuid.uuid4().hex[:8]}")
    await ensure_changelog(kc, topic, 1)
    producer = new_producer(kc, f"bench-retained-{topic}")
    await producer.start()
    turns = [t for t in r.kept.sent if t]

    async def send(records: list[tuple[bytes, bytes | None]]) -> None:
        await Checkpoint({}, [Outgoing(topic, v, key=k, partition=0) for k, v in records]
                         ).commit(producer, f"bench-retained-{topic}")

    try:
        for records in turns:
            await send(records)
        await admin_roll(kc, topic)  # (an eager cleaner; the active segment rolled)
        last = turns[-1][-1]
        await send([last])  # (the last record again, in a segment of its own)
        deadline = time.monotonic() + wait
        tombstones = sum(1 for w in r.kept.last.values() if w < 0)
        # (+ 1: the record sent again, whose older copy stays until the active segment that
        # holds the newer one is cleaned)
        while (held := await log_stats(kc, topic))[0] > r.kept_held.records + tombstones + 1:
            if time.monotonic() > deadline:
                print(f"not compacted after {wait} s: {held[0]} records")
                break
            await asyncio.sleep(5)
    finally:
        await producer.stop()
    disk = disk_bytes(tmp / "broker" / "data", topic)
    m = r.kept_held
    print(f"\n{r.corpus}, partition {r.kept.name} on a broker, compacted ({tombstones:,} "
          f"tombstones in the model, dropped from its figures): records {held[0]:,} (model "
          f"{m.records:,} + the one sent again), key + value bytes {held[1]:,} (model "
          f"{m.keys + m.values:,} + {len(last[0]) + len(last[1] or b''):,}), log segments on "
          f"disk {disk:,.0f} B (model with zstd {m.zstd:,}, + a batch and a marker for the "
          "record sent again)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="llvm,boost,stream",
                        help="comma-separated: llvm, boost, stream")
    parser.add_argument("--limit", type=int, default=None,
                        help="pages per release (llvm, boost), items (stream)")
    parser.add_argument("--shape", type=Shape.parse, default=Shape(2, 2, 2, 2, 2, 2),
                        help="partitions D,E,P,S,C[,R]")
    parser.add_argument("--turn", type=int, default=64, help="pages per transaction")
    parser.add_argument("--near-only", action="store_true", help="passages off")
    parser.add_argument("--broker", metavar="PARTITION",
                        help="also send this store partition's changelog (e.g. directory0) "
                        "to a broker started with deploy/kafka/broker.sh, last corpus")
    parser.add_argument("--wait", type=float, default=300,
                        help="seconds to wait for the cleaner")
    parser.add_argument("--entries", action="store_true",
                        help="the list shards' changelogs with their entries (the layout "
                        "before: every key of the store)")
    parser.add_argument("--restore", action="store_true",
                        help="time each list and forward partition's restore, the layout "
                        "before against the kept keys and the rebuild")
    args = parser.parse_args()
    config = EngineConfig()
    if args.near_only:
        config = replace(config, passage=replace(config.passage, enabled=False)).validate()
    print(f"shape {args.shape}, default engine configuration"
          + (", passages off" if args.near_only else ""))
    result = None
    with tempfile.TemporaryDirectory(prefix="bench-retained-") as tmp:
        for name in args.corpus.split(","):
            items = corpus(name, args.limit)
            result = measure(name, items, config, args.shape, args.turn, Path(tmp),
                             args.broker, args.entries, args.restore)
            report(result, args.turn)
    if args.broker and result is not None:
        done = result
        return run_with_broker(None, "bench-retained-",
                               lambda b, tmp: on_broker(b, tmp, done, args.wait))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
