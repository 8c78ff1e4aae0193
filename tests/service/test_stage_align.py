"""The align stage's partitions (dupalign/service/roles/stage_align.py) without a broker, with
the combine partitions that ask them (A = C = 2, the other stages' messages as
``Partitioned`` makes them: tests/service/test_stage_combine.py): the sequence (with each
page's passages bit), the decisions, exact answers and the sketch role's forward records
(in parts, nearby batches in any commit order), every partition read in chunks at random,
turns that commit, turns that abort, crashes (a fresh store restored from the committed
changelog records). The combines' requests (split by the candidates' owners, in parts)
and their progress records, and align's answers, flow between them through the same log.
What the combines publish is ``Partitioned``'s matches, by ordinal, each once; what each
align partition's changelog restores is ``Partitioned``'s forward records of its ids."""

from __future__ import annotations

import functools
import random
from collections import defaultdict
from dataclasses import replace
from typing import Any

import msgpack
import pytest
from aiokafka import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.match import Match
from dupalign.near.idf import IdfTable
from dupalign.page import Page
from dupalign.service.config import Config, KafkaConfig
from dupalign.service.parts import in_parts
from dupalign.service.roles.stage_align import AlignPartition, record_upto
from dupalign.service.roles.stage_combine import CombinePartition
from dupalign.service.roles.stage_sketch import StageSketchRole
from dupalign.service.sequence_batch import SequenceBatch, page_header
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import RECORD_OVERHEAD, Outgoing, record_ordinal
from dupalign.stages.directory import directory_owner
from dupalign.stages.forward_stage import forward_value
from dupalign.stages.partitioned import Shape
from dupalign.stages.sketch import Sketcher
from dupalign.store import tables
from dupalign.wire import messages
from tests.reused_stores import Stores, temporary_stores
from tests.service.test_stage_combine import Oracle, _sequenced, inputs
from tests.service.test_stage_partitions import CONFIG, Log, Owner, _record, drive
from tests.stages.streams import N_IDS, SHARED_TEXTS, ops, pages_of

SHAPE = Shape(2, 2, 2, 2, 2, 1, 2)
# records of at most 300 bytes of value: requests and forward records go in parts
KC = KafkaConfig(max_request_size=RECORD_OVERHEAD + 300)
TOPICS = StageTopics(KC, SHAPE)
STEPS = 20_000


def with_passages(log: Log, pages: list[Page], oracle: Oracle, rng: random.Random) -> None:
    """The sequence with each page's passages bit, and the sketch role's forward records
    in the align partition of each id (in parts), nearby batches in any commit order."""
    batches, at = [], 0
    for r in log[(TOPICS.batches, 0)]:
        batch = SequenceBatch.from_bytes(r.value)
        fwd = [oracle.forwards[o] for o in range(at, at + batch.n)]
        r.value = replace(batch, windows=tuple(f is not None for f in fwd)).to_bytes()
        batches.append(fwd)
        at += batch.n
    for b in sorted(range(len(batches)), key=lambda b: b + rng.uniform(0, 2.5)):
        first = sum(len(f) for f in batches[:b])
        for i, value in enumerate(batches[b]):
            if value is None:
                continue
            a = directory_owner(pages[first + i].id, SHAPE.align)
            part = log[(TOPICS.passages, a)]
            for rec in in_parts(Outgoing(TOPICS.passages, value, partition=a,
                                         headers=[page_header(b, i)]), KC.max_request_size):
                part.append(_record(TOPICS.passages, a, len(part), rec.value or b"",
                                    rec.headers))


def _done(part: Any, n: int) -> bool:
    if isinstance(part, CombinePartition):
        return part.ledger.next_seq == n and not part.pending
    assert isinstance(part, AlignPartition)
    return part.ledger.next_seq == n and part.asking is None


def run(stores: Stores, stream: list[Any], seed: int, make: Any = AlignPartition
        ) -> tuple[dict[int, list[dict[str, Any]]], Oracle, Log]:
    """The combine and align partitions to the end of the stream: what was published by
    ordinal, the oracle, the log."""
    rng = random.Random(seed)
    pages = _sequenced([p for _, p in pages_of(stream, SHARED_TEXTS) if isinstance(p, Page)])
    oracle = Oracle(stores, pages)
    log = inputs(pages, oracle, rng)
    with_passages(log, pages, oracle, rng)
    owners = [Owner(f"combine{c}", functools.partial(CombinePartition, TOPICS, c,
                                                      config=CONFIG), stores)
              for c in range(SHAPE.combine)]
    owners += [Owner(f"align{a}", functools.partial(make, TOPICS, a, config=CONFIG), stores)
               for a in range(SHAPE.align)]
    n = len(pages)
    assert drive(owners, log, rng, lambda: all(_done(w.part, n) for w in owners), STEPS), (
        "the combine and align partitions did not finish")
    published: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in log.get((KC.output_topic, 0), []):
        o = record_ordinal(rec)
        published[o].append(Match.from_dict(messages.decode_match(rec.value)).to_dict())
    for w in owners[SHAPE.combine:]:
        w.restart()  # (what the changelog restores)
        assert isinstance(w.part, AlignPartition)
        a = w.part.partition
        want = {f: {o: v for o, v in rows.items()
                    if directory_owner(_id(oracle, o), SHAPE.align) == a}
                for f, rows in _forward(oracle.p.forward.store).items()}
        assert _forward(w.part.store) == want
    return dict(published), oracle, log


def _forward(store: Any) -> dict[str, dict[int, bytes]]:
    return {t.family: dict(t.items(store))
            for t in (tables.forward, tables.positions, tables.units, tables.docs)}


def _id(oracle: Oracle, ordinal: int) -> str:
    raw = tables.docs.get(oracle.p.forward.store, ordinal)
    assert raw is not None
    return str(msgpack.unpackb(raw)["id"])


def check(stream: list[Any], seed: int, make: Any = AlignPartition
          ) -> tuple[dict[int, list[dict[str, Any]]], Log]:
    with temporary_stores("stage-align-") as stores:
        try:
            published, oracle, log = run(stores, stream, seed, make)
            assert published == {o: m for o, m in oracle.matches.items() if m}
        except BaseException:
            stores.close()  # (else a shrinking hypothesis runs out of file descriptors)
            raise
    return published, log


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, seed=st.integers(0, 2**32))
def test_align_partitions_answer_as_the_pipeline_in_one_process_across_crashes(
        stream: list[Any], seed: int) -> None:
    check(stream, seed)


def long_stream(seed: int, n: int) -> list[Any]:
    """Pages of the shared texts (revisits, copies, passages shared) and deletes."""
    rng = random.Random(seed)
    return [("page", rng.randrange(N_IDS), rng.choice([0, 0, 1, 2]),
             rng.choice([0, 1, 2, 3, 4, 5]), rng.random() < 0.7)
            if rng.random() < 0.85 else ("delete", rng.randrange(N_IDS)) for _ in range(n)]


def test_a_long_stream_aligns_in_both_partitions_with_requests_in_parts() -> None:
    """A fixed stream with passage matches, requests to both align partitions, split into
    parts, and progress records from both combines (the random ones may have none)."""
    published, log = check(long_stream(3, 40), 5)
    kinds = {m["kind"] for ms in published.values() for m in ms}
    assert "passage" in kinds, kinds
    requests = [r for a in range(SHAPE.align) for r in log[(TOPICS.align_requests, a)]
                if record_upto(r) is None]
    assert {r.partition for r in requests} == {0, 1}
    assert any(dict(r.headers).get("dupalign-part") for r in requests)
    assert {record_upto(r) for r in log[(TOPICS.align_requests, 0)]} >= {0, 1}


# d0's text, then d1's (its first four words shared: a passage match, not a near one), then
# d0 deleted: d1's request names d0, whose removal comes at the very next ordinal
REMOVED_NEXT = [("page", 0, 0, 0, True), ("page", 1, 0, 0, True), ("delete", 0),
                ("page", 0, 0, 0, True), ("page", 1, 1, 0, True), ("page", 0, 1, 1, True),
                ("delete", 1), ("page", 1, 0, 0, True), ("page", 3, 0, 0, True)]


@pytest.mark.parametrize("seed", range(4))
def test_a_candidate_removed_at_the_next_ordinal_is_there_when_its_request_is_answered(
        seed: int) -> None:
    published, _ = check(REMOVED_NEXT, seed)
    assert any(m["kind"] == "passage" and m["match_doc_id"] == "d0"
               for m in published.get(1, [])), published


def test_the_sketch_role_sends_each_page_with_passages_its_forward_record() -> None:
    """To the align partition of its id, the value ``Partitioned``'s forward stage reads, in
    parts over ``kafka.max_request_size``."""
    tp = TopicPartition(KC.input_topic, 0)
    pages = [Page(f"p{k}", " ".join(SHARED_TEXTS[k % 4].split()[k % 3:]) + f" w{k}")
             for k in range(8)]
    recs = [_record(tp.topic, 0, o, messages.encode_page(p), []) for o, p in enumerate(pages)]
    for r, p in zip(recs, pages, strict=True):
        r.key = p.id.encode()
    role = StageSketchRole(Config(kafka=KC, engine=CONFIG), SHAPE)
    out = role.prepare(tp, recs)
    sketcher = Sketcher(CONFIG)
    want = [forward_value(p.id, sketcher.sketch(p, IdfTable.uniform()).passage) for p in pages]
    assert all(w is not None for w in want)
    assert [None if f is None else f.value for f in out.passages] == want
    assert [f.partition for f in out.passages if f is not None] == [
        directory_owner(p.id, SHAPE.align) for p in pages]
    assert {f.partition for f in out.passages if f is not None} == {0, 1}
    sent = [o for o in role.outgoing(out) if o.topic == TOPICS.passages]
    assert len(sent) > len(pages)  # (in parts)
