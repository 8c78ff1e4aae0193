"""The list role's partitions (dupalign/service/roles/stage_lists.py) without a broker: the
stage sketch role's records of a random stream (its ``prepare``: entries and list windows,
the sequence saying which pages have windows), D = 2 directory, E = 2 exact and S = 2 list
partitions, each fed as Kafka could hand records over (tests/service/test_stage_partitions.py:
entries and windows of nearby batches in any commit order, inputs read in chunks
interleaved at random), with turns that commit, turns that abort and crashes (a fresh store
restored from the committed changelog records). Every list partial, by ordinal and list
partition, is ``Partitioned``'s, byte for byte, and goes to the combine partition of the
page's id."""

from __future__ import annotations

import functools
import random
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.page import Page
from dupalign.service.config import Config, KafkaConfig
from dupalign.service.ordered_merge import OrderedMerge
from dupalign.service.parts import record_part
from dupalign.service.roles.stage_directory import DirectoryPartition
from dupalign.service.roles.stage_exact import ExactPartition
from dupalign.service.roles.stage_lists import ListsPartition
from dupalign.service.roles.stage_sketch import StageSketchRole
from dupalign.service.sequence_batch import SequenceBatch, page_header
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import RECORD_OVERHEAD, record_ordinal
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.list_shard import ListPartial
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.wire import messages
from tests.reused_stores import Stores, temporary_stores
from tests.service.test_stage_partitions import (
    CONFIG,
    Log,
    Owner,
    _record,
    process,
    recorded,
    step,
    wholes,
)
from tests.stages.streams import SHARED_TEXTS, ops, pages_of

SHAPE = Shape(2, 2, 1, 2, 2)
TOPICS = StageTopics(KafkaConfig(), SHAPE)
ROLE_CONFIG = replace(Config(), engine=CONFIG)
# records of at most 64 bytes of value (kafka.max_request_size less the room for the rest):
# most windows records go in parts
SMALL = replace(ROLE_CONFIG, kafka=replace(ROLE_CONFIG.kafka,
                                          max_request_size=RECORD_OVERHEAD + 64))
STEPS = 8_000  # turns at most (a stream of 30 ops needs a thousand or so)


def sketched(stream: list[Any], rng: random.Random, config: Config = ROLE_CONFIG
             ) -> tuple[list[Page], Log]:
    """What the stage sketch role sends for the stream's pages in batches of 1-3 records:
    the pages sequenced (in ordinal order) and the topics it fills, the sequence in offset
    order, the entries and windows of nearby batches in any commit order."""
    role = StageSketchRole(config, SHAPE)
    tp = TopicPartition("pages", 0)
    sent = [p for _, p in pages_of(stream, SHARED_TEXTS) if isinstance(p, Page)]
    recs = [SimpleNamespace(topic="pages", partition=0, offset=o, key=p.id.encode("utf-8"),
                            value=_encoded(p), headers=[])
            for o, p in enumerate(sent)]
    log: Log = {(TOPICS.batches, 0): []}
    for topic, n in ((TOPICS.entries, SHAPE.directory), (TOPICS.windows, SHAPE.lists)):
        log.update({(topic, k): [] for k in range(n)})
    prepared, pages = [], []
    at = 0
    while at < len(recs):
        chunk = recs[at:at + rng.randint(1, 3)]
        at += len(chunk)
        out = role.prepare(tp, chunk)
        if not out.entries:
            continue  # (dead letters only: no sequence record)
        b = len(prepared)
        pages += [sent[o] for o in out.offsets]
        seq = SequenceBatch(tp.topic, tp.partition, tuple(out.offsets), tuple(out.dirs),
                            SHAPE.directory, 1_000 * b, tuple(bool(w) for w in out.lists))
        log[(TOPICS.batches, 0)].append(_record(TOPICS.batches, 0, b, seq.to_bytes(), []))
        prepared.append(out)
    commit = sorted(range(len(prepared)), key=lambda b: b + rng.uniform(0, 2.5))
    for b in commit:
        out = prepared[b]
        for i, entry in enumerate(out.entries):  # (the page headers, as ``produce`` sets them)
            for o in [entry, *out.lists[i]]:
                o.headers = [page_header(b, i)]
        for o in role.outgoing(out):
            # (the list partitions read the entries' decisions and the windows: the near
            # states, the sketches and the forward records are the router's, the combine's
            # and align's)
            if o.topic not in (role.kc.dlq_topic, TOPICS.near_state, TOPICS.sketches,
                               TOPICS.passages):
                part = log[(o.topic, o.partition or 0)]
                part.append(_record(o.topic, o.partition or 0, len(part), o.value or b"",
                                    o.headers))
    return pages, log


def _encoded(page: Page) -> bytes:
    """The page's record (a text that UTF-8 cannot encode: bytes that are no page, which
    the sketch role dead-letters as it does such a page)."""
    try:
        return messages.encode_page(page)
    except UnicodeEncodeError:
        return b"\xc1"


def run(stores: Stores, stream: list[Any], seed: int, sweep: bool = True,
        config: Config = ROLE_CONFIG
        ) -> tuple[dict[tuple[int, int], tuple[int, bytes]], list[Page]]:
    """The list partitions' partials by (ordinal, list partition): (the combine partition
    sent to, the record's value); the pages sequenced."""
    rng = random.Random(seed)
    pages, log = sketched(stream, rng, config)
    if config is SMALL:  # (a record longer than a part went in parts)
        windows = [r for k in range(SHAPE.lists) for r in log[(TOPICS.windows, k)]]
        assert all(len(r.value) <= 64 for r in windows) or any(
            record_part(r) is not None for r in windows)
    for topic, n in ((TOPICS.decisions, SHAPE.directory), (TOPICS.exact, SHAPE.exact),
                     (TOPICS.partials, SHAPE.combine)):
        log.update({(topic, k): [] for k in range(n)})
    made = [("dir", DirectoryPartition, SHAPE.directory), ("exact", ExactPartition, SHAPE.exact),
            ("lists", ListsPartition, SHAPE.lists)]
    owners = [Owner(f"{name}{k}", functools.partial(cls, TOPICS, k, config=CONFIG), stores)
              for name, cls, n in made for k in range(n)]
    lists = [w for w in owners if w.name.startswith("lists")]

    def parts() -> list[ListsPartition]:
        return [cast(ListsPartition, w.part) for w in lists]

    for _ in range(STEPS):
        if not sweep:  # (a test of this test: the list partitions never sweep)
            for part in parts():
                part.ledger.retention = replace(part.ledger.retention, max_pages=0)
        step(rng.choice(owners), log, rng)
        if all(part.ledger.next_seq == len(pages) for part in parts()):
            break
    else:
        raise AssertionError(f"{[part.ledger.next_seq for part in parts()]} of {len(pages)}")
    got: dict[tuple[int, int], tuple[int, bytes]] = {}
    for c in range(SHAPE.combine):
        for rec in wholes(log[(TOPICS.partials, c)]):
            key = (record_ordinal(rec), ListPartial.from_bytes(rec.value).shard)
            assert key not in got  # each partial sent once
            got[key] = (c, rec.value)
    return got, pages


def oracle(stores: Stores, pages: list[Page]) -> dict[tuple[int, int], tuple[int, bytes]]:
    """``Partitioned``'s list partials on the pages, by (ordinal, list shard): the combine
    partition of the page's id, the wire form (swept as tests/service/
    test_stage_partitions.py ``oracle``)."""
    p = Partitioned(CONFIG, SHAPE, functools.partial(stores.store,
                                                     params=CONFIG.frozen_params()))
    decisions, _ = recorded(p)
    partials = recorded_partials(p)
    process(p, pages)
    return {key: (directory_owner(Decision.from_bytes(decisions[key[0]]).doc_id,
                                  SHAPE.combine), raw) for key, raw in partials.items()}


def recorded_partials(p: Partitioned) -> dict[tuple[int, int], bytes]:
    """The list partials ``p`` makes from now on, by (ordinal, list shard), in their wire
    form (filled as it runs): what the list role publishes."""
    partials: dict[tuple[int, int], bytes] = {}

    def apply(real: Any, *args: Any) -> Any:
        got = real(*args)
        for partial in got:
            if partial is not None:
                partials[(partial.seq, partial.shard)] = partial.to_bytes()
        return got

    for shard, _ in p.lists:
        shard.apply_run = functools.partial(  # type: ignore[method-assign]
            apply, shard.apply_run)
    return partials


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, seed=st.integers(0, 2**32), small=st.booleans())
def test_list_partitions_answer_as_the_pipeline_in_one_process_across_crashes(
        stream: list[Any], seed: int, small: bool) -> None:
    """(``small``: the windows records in parts of at most 64 bytes)"""
    with temporary_stores("stage-lists-") as stores:
        got, pages = run(stores, stream, seed, config=SMALL if small else ROLE_CONFIG)
        assert got == oracle(stores, pages)


def test_the_sequence_says_which_pages_have_list_windows() -> None:
    flags = (True, False, False, True, True, False, True, True, False)
    b = SequenceBatch("pages", 0, tuple(range(9)), (0,) * 9, 1, 5, flags)
    assert SequenceBatch.from_bytes(b.to_bytes()) == b
    assert SequenceBatch.from_bytes(replace(b, windows=()).to_bytes()).windows == ()
    with pytest.raises(ValueError, match="every page or none"):
        SequenceBatch("pages", 0, (1, 2), (0, 0), 1, 5, (True,))


def test_a_value_in_parts_is_read_again_from_its_first_part() -> None:
    merge: OrderedMerge[int] = OrderedMerge({0: 0})
    merge.add(0, 3, 1, b"a")
    merge.add(0, 9, 2, b"whole", first=5)  # (its parts at 5..9, another record between)
    assert merge.low_water() == {0: 3}
    assert merge.take(0, 1) == b"a"
    assert merge.low_water() == {0: 5}
    assert merge.take(0, 2) == b"whole"
    assert merge.low_water() == {0: 10}
