"""The combine role's partitions (dupalign/service/roles/stage_combine.py) without a broker:
C = 2 combine partitions fed the wire messages ``Partitioned`` makes for a random stream
(D = E = P = S = 2: decisions, exact answers, sketches, near answers, list partials), as
Kafka could hand them over (each writer's records in its order, the writers of a partition
interleaved at random, every partition read in chunks at random), with turns that commit,
turns that abort and crashes (a fresh store restored from the committed changelog records),
and an align role that answers the requests committed, late and in any order. What the
partitions publish, by ordinal, is ``Partitioned``'s: each page's matches once, and its
align request; and what their changelogs restore at the end (stored matches, the ids alive)
is what its combine partitions hold."""

from __future__ import annotations

import functools
import random
from collections import defaultdict
from typing import Any

import msgpack
import numpy as np
from aiokafka import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.match import Match, Span
from dupalign.near.idf import IdfTable
from dupalign.page import Page
from dupalign.service.config import Config, KafkaConfig
from dupalign.service.roles.stage_align import record_upto
from dupalign.service.roles.stage_combine import CombinePartition
from dupalign.service.roles.stage_sketch import StageSketchRole
from dupalign.service.sequence_batch import SequenceBatch, page_header
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import (
    aligned_part,
    decode_aligned,
    encode_aligned,
    encode_aligned_part,
    ordinal_header,
    record_ordinal,
)
from dupalign.stages.align import RankedPage
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.exact import exact_owner
from dupalign.stages.forward_stage import forward_value
from dupalign.stages.list_shard import ListPartial
from dupalign.stages.near_shard import (
    NearAnswer,
    answer_from_bytes,
    answer_shard,
    answer_to_bytes,
)
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.stages.sketch import PageSketch, Sketcher
from dupalign.store import tables
from dupalign.wire import messages
from tests.reused_stores import Stores, temporary_stores
from tests.service.test_stage_partitions import CONFIG, Log, Owner, _record, recorded
from tests.stages.streams import SHARED_TEXTS, ops, pages_of

SHAPE = Shape(2, 2, 2, 2, 2)
KC = KafkaConfig()
TOPICS = StageTopics(KC, SHAPE)
STEPS = 6_000


class Oracle:
    """``Partitioned`` on the pages, swept as the roles sweep, and what it makes: the
    upstream wire messages by ordinal (the combine's inputs) and per page its matches
    (``finish``), its align request and align's passages."""

    def __init__(self, stores: Stores, pages: list[Page]) -> None:
        p = Partitioned(CONFIG, SHAPE, functools.partial(stores.store,
                                                         params=CONFIG.frozen_params()))
        self.p = p
        self.decisions, self.exact = recorded(p)
        self.sketches: dict[int, bytes] = {}
        self.forwards: dict[int, bytes | None] = {}  # the sketch role's (``forward_value``)
        self.near: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.partials: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.matches: dict[int, list[dict[str, Any]]] = {}
        self.requests: dict[int, bytes] = {}
        self.passages: dict[int, Any] = {}
        self.revisits: dict[int, bytes] = {}  # the routers' revisit distances
        self._wrap()
        r = CONFIG.retention
        for o, page in enumerate(pages):
            if o and o % r.every == 0:
                p.sweep(r.max_pages, r.max_age, 0)
            sk = p.sketcher.sketch(page, p.uniform)
            self.sketches[o] = sk.to_bytes()
            self.forwards[o] = forward_value(page.id, sk.passage)
            for _ in p.process_many([page]):
                pass

    def _wrap(self) -> None:
        def near(real: Any, ops: Any) -> Any:
            a = real(ops)
            if a is not None:
                self.near[ops.seq].append((ops.shard, answer_to_bytes(ops.seq, ops.shard, a)))
            return a

        def partials(real: Any, *args: Any) -> Any:
            got = real(*args)
            for partial in got:
                if partial is not None:
                    self.partials[partial.seq].append((partial.shard, partial.to_bytes()))
            return got

        def apply(real: Any, *args: Any) -> Any:
            out = real(*args)
            if out is not None and out.align is not None:
                self.requests[out.seq] = out.align.to_bytes(forward=False)
            return out

        def finish(real: Any, out: Any, passages: Any) -> Any:
            self.passages[out.seq] = passages
            got = real(out, passages)
            self.matches[out.seq] = [m.to_dict() for m in got]
            return got

        def relate(real: Any, d: Any, *args: Any) -> Any:
            got = real(d, *args)
            self.revisits[d.seq] = msgpack.packb(got)
            return got

        p = self.p
        for router, _ in p.routers:
            router.relate = functools.partial(relate, router.relate)  # type: ignore
        for shard in p.nears:
            shard.apply = functools.partial(near, shard.apply)  # type: ignore[method-assign]
        for lists, _ in p.lists:
            lists.apply_run = functools.partial(  # type: ignore[method-assign]
                partials, lists.apply_run)
        for combine, _ in p.combines:
            combine.apply = functools.partial(apply, combine.apply)  # type: ignore
            combine.finish = functools.partial(finish, combine.finish)  # type: ignore

    def stored(self, c: int) -> dict[int, bytes]:
        return dict(tables.matches.items(self.p.combines[c][0].store))


def _interleaved(streams: list[list[tuple[int, bytes, int]]], rng: random.Random
                 ) -> list[tuple[int, bytes, int]]:
    """Several writers' records (each stream in its order) in one partition, interleaved."""
    out, at = [], [0] * len(streams)
    while any(a < len(s) for a, s in zip(at, streams, strict=True)):
        k = rng.choice([k for k, s in enumerate(streams) if at[k] < len(s)])
        out.append(streams[k][at[k]])
        at[k] += 1
    return out


def inputs(pages: list[Page], oracle: Oracle, rng: random.Random) -> Log:
    """The combine's input partitions: the sequence, the sketches (nearby batches' in any
    commit order), the decisions and exact answers (ordinal order per partition), the near
    answers and partials (each near or list partition's in ordinal order, interleaved), the
routers' revisit distances."""
    log: Log = defaultdict(list)
    batches, at = [], 0
    while at < len(pages):
        n = rng.randint(1, 3)
        batches.append(list(range(at, min(at + n, len(pages)))))
        at += n
    ids = [p.id for p in pages]
    for b, chunk in enumerate(batches):
        seq = SequenceBatch("pages", 0, tuple(range(len(chunk))),
                            tuple(directory_owner(ids[o], SHAPE.directory) for o in chunk),
                            SHAPE.directory, 1_000 * b)
        log[(TOPICS.batches, 0)].append(_record(TOPICS.batches, 0, b, seq.to_bytes(), []))
    for b in sorted(range(len(batches)), key=lambda b: b + rng.uniform(0, 2.5)):
        for i, o in enumerate(batches[b]):
            _append(log, TOPICS.sketches, directory_owner(ids[o], SHAPE.combine),
                    PageSketch.from_bytes(oracle.sketches[o]).to_combine_bytes(),
                    [page_header(b, i)])
    for o in range(len(pages)):
        d = Decision.from_bytes(oracle.decisions[o])
        _append(log, TOPICS.decisions, directory_owner(d.doc_id, SHAPE.directory),
                oracle.decisions[o], [ordinal_header(o)])
        if o in oracle.exact:
            assert d.content_hash is not None
            _append(log, TOPICS.exact, exact_owner(d.content_hash, SHAPE.exact),
                    oracle.exact[o], [ordinal_header(o)])
    for o, raw in sorted(oracle.revisits.items()):
        _append(log, TOPICS.revisits, directory_owner(ids[o], SHAPE.combine), raw,
                [ordinal_header(o)])
    for topic, by_seq, n in ((TOPICS.near_answers, oracle.near, SHAPE.near),
                             (TOPICS.partials, oracle.partials, SHAPE.lists)):
        for c in range(SHAPE.combine):
            streams = [[(o, raw, s) for o in sorted(by_seq) for s, raw in by_seq[o]
                        if s == k and directory_owner(ids[o], SHAPE.combine) == c]
                       for k in range(n)]
            for o, raw, _ in _interleaved(streams, rng):
                _append(log, topic, c, raw, [ordinal_header(o)])
    return log


def _append(log: Log, topic: str, partition: int, value: bytes, headers: list[Any]) -> None:
    part = log[(topic, partition)]
    part.append(_record(topic, partition, len(part), value, headers))


def run(stores: Stores, stream: list[Any], seed: int) -> None:
    rng = random.Random(seed)
    sketcher_pages = [page for _, page in pages_of(stream, SHARED_TEXTS)
                      if isinstance(page, Page)]
    oracle_pages = _sequenced(sketcher_pages)
    oracle = Oracle(stores, oracle_pages)
    log = inputs(oracle_pages, oracle, rng)
    owners = [Owner(f"combine{c}", functools.partial(CombinePartition, TOPICS, c,
                                                      config=CONFIG), stores)
              for c in range(SHAPE.combine)]
    asked: list[tuple[int, int]] = []  # (combine partition, ordinal) the align role owes
    published: dict[int, list[dict[str, Any]]] = defaultdict(list)
    requests: dict[int, bytes] = {}
    n = len(oracle_pages)
    for _ in range(STEPS):
        if all(isinstance(w.part, CombinePartition) and w.part.ledger.next_seq == n
               and not w.part.pending for w in owners):
            break
        if asked and rng.random() < 0.3:  # the align role answers a request, late
            c, o = asked.pop(rng.randrange(len(asked)))
            _append(log, TOPICS.aligned, c, encode_aligned(o, oracle.passages[o]),
                    [ordinal_header(o)])
            continue
        c = rng.randrange(len(owners))
        owner, r = owners[c], rng.random()
        if r < 0.05:
            owner.restart()
            continue
        outputs = owner.turn(log, rng)
        if r < 0.12:
            owner.restart()
            continue
        owner.commit()
        for out in outputs:
            o = record_ordinal(out)
            if out.topic == TOPICS.align_requests:
                if record_upto(out) is not None:
                    continue  # (the combine's progress, for the align stage)
                assert o not in requests
                requests[o] = out.value or b""
                asked.append((c, o))
            else:
                assert out.topic == KC.output_topic and out.key == oracle_pages[o].id.encode()
                m = messages.decode_match(out.value or b"")
                published[o].append(Match.from_dict(m).to_dict())
    else:
        raise AssertionError("the combine partitions did not finish")
    assert requests == oracle.requests
    assert dict(published) == {o: m for o, m in oracle.matches.items() if m}
    for c, w in enumerate(owners):
        w.restart()  # (what the changelog restores)
        assert isinstance(w.part, CombinePartition)
        assert w.part.shard.ids == oracle.p.combines[c][0].ids
        assert dict(tables.matches.items(w.part.store)) == oracle.stored(c)


def _sequenced(pages: list[Page]) -> list[Page]:
    """The pages the sketch role sequences (a rejected one is dead-lettered)."""
    sketcher, idf = Sketcher(CONFIG), IdfTable.uniform()
    return [p for p in pages if sketcher.sketch(p, idf).rejected is None]


_FROZEN = Config(engine=CONFIG)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, seed=st.integers(0, 2**32))
def test_combine_partitions_publish_as_the_pipeline_in_one_process_across_crashes(
        stream: list[Any], seed: int) -> None:
    with temporary_stores("stage-combine-") as stores:
        run(stores, stream, seed)


def test_the_sketch_role_sends_each_page_sketch_to_the_combine_partition_of_its_id() -> None:
    tp = TopicPartition(KC.input_topic, 0)
    pages = [Page(f"p{k}", f"text of page {k} " * 3) for k in range(6)]
    recs = [_record(tp.topic, 0, o, messages.encode_page(p), []) for o, p in enumerate(pages)]
    for r, p in zip(recs, pages, strict=True):
        r.key = p.id.encode()
    out = StageSketchRole(_FROZEN, SHAPE).prepare(tp, recs)
    assert [PageSketch.from_bytes(s.value or b"").id for s in out.sketches] == [
        p.id for p in pages]
    assert [s.partition for s in out.sketches] == [directory_owner(p.id, SHAPE.combine)
                                                   for p in pages]




def test_the_combine_keys_answers_by_shard_and_part_without_decoding_them() -> None:
    """``ListPartial.shard_of``, ``answer_shard`` and ``aligned_part`` read the key the
    combine's merges hold a record by: the same as the whole record decoded."""
    z, span = np.zeros(2, dtype=np.int64), Span((0, 4), (0, 20), (1, 5), (5, 25), 0.9)
    for shard in (0, 3, 7):
        raw = ListPartial(9, 4, shard, np.zeros(2, np.bool_), z, z).to_bytes()
        assert ListPartial.shard_of(raw) == ListPartial.from_bytes(raw).shard == shard
        near = answer_to_bytes(9, shard, NearAnswer(z, z, z, z, np.zeros(2), np.zeros(2, bool)))
        assert answer_shard(near) == answer_from_bytes(near)[1] == shard
        for ranked in ([RankedPage(3, 10, 0.5, [span], "d3")], None):
            part = encode_aligned_part(9, shard, ranked)
            assert aligned_part(part) == decode_aligned(part).part == shard
    whole = encode_aligned(9, [("d3", [span])])
    assert aligned_part(whole) is decode_aligned(whole).part is None
