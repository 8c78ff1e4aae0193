"""The router and near roles' partitions (dupalign/service/roles/stage_router.py, stage_near.py)
without a broker, downstream of the directory and exact partitions (D = E = R = P = C = 2),
fed a random stream's records as Kafka could hand them over (tests/service/
test_stage_partitions.py: the batches in offset order, the entries and near states of nearby
batches in any commit order, every partition read in chunks interleaved at random), with
turns that commit, turns that abort and crashes (a fresh store restored from the committed
changelog records). Every ``NearOps`` the routers send (by ordinal, kind, router and shard)
and every near answer (by ordinal and shard, in the combine partition of the page's id) are
``Partitioned``'s, byte for byte."""

from __future__ import annotations

import functools
import random
from dataclasses import replace
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig
from dupalign.near.idf import IdfTable
from dupalign.page import Page
from dupalign.service.config import KafkaConfig
from dupalign.service.roles.stage_directory import DirectoryPartition
from dupalign.service.roles.stage_exact import ExactPartition
from dupalign.service.roles.stage_learner import LearnerPartition
from dupalign.service.roles.stage_near import NearPartition
from dupalign.service.roles.stage_router import (
    PAGE,
    SWEEP,
    UPTO,
    RouterPartition,
    record_near_from,
)
from dupalign.service.roles.stage_sketch import near_state
from dupalign.service.sequence_batch import SequenceBatch, page_header
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import RECORD_OVERHEAD, record_ordinal
from dupalign.stages.directory import directory_owner
from dupalign.stages.near_shard import NearOps, answer_from_bytes, answer_to_bytes
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.stages.sketch import Sketcher
from tests.reused_stores import Stores, temporary_stores
from tests.service.test_stage_partitions import (
    CONFIG,
    Log,
    Owner,
    _record,
    drive,
    process,
    sequenced,
    wholes,
)
from tests.stages.streams import N_IDS, ops

SHAPE = Shape(directory=2, exact=2, near=2, lists=1, combine=2, router=2)
# near matches among the streams' 8-word pages (tests/stages/test_partitioned.py's NEAR): a
# wider Hamming bound and a probe budget that leaves probes out; the same frozen parameters
# as the partitions' stores (tests/service/test_stage_partitions.py's Owner)
NEAR = replace(CONFIG, near=replace(CONFIG.near, hamming=7, probe_budget=6)).validate()
FIRST = replace(NEAR, near=replace(NEAR.near, mode="first")).validate()
_GREEK = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
          "rho sigma tau upsilon phi chi psi omega")
_WORDS = [f"{w}{i}" for i, w in enumerate((_GREEK.split() * 2)[:40])]


def _but(changed: set[int]) -> str:
    return " ".join("other" if i in changed else w for i, w in enumerate(_WORDS))


# bodies of 40 words: the first two at Hamming 2 under NEAR (verified similar), the third at
# 7 from both (a candidate that fails verification), a fourth far from all, a short one
NEAR_TEXTS = [_but(set()), _but({20}), _but({8, 30}),
              " ".join(reversed(_WORDS[:20])) + " more words here", "short page"]
TOPICS = StageTopics(KafkaConfig(), SHAPE)
STEPS = 20_000  # turns at most (a stream of 30 ops needs a thousand or two)
Ops = dict[tuple[int, int, int, int], bytes]  # (ordinal, kind, router, shard) -> NearOps
Answers = dict[tuple[int, int], tuple[int, bytes]]  # (ordinal, shard) -> (combine, answer)


def with_near_states(pages: list[Page], log: Log, rng: random.Random) -> None:
    """The sketch role's near states of the pages sequenced in ``log``, each in the router
    partition of its id, the batches in an order nearby batches could commit in."""
    sketcher, idf = Sketcher(CONFIG), IdfTable.uniform()
    batches, at = [], 0
    for r in log[(TOPICS.batches, 0)]:
        n = SequenceBatch.from_bytes(r.value).n
        batches.append(pages[at:at + n])
        at += n
    for k in range(SHAPE.router):
        log[(TOPICS.near_state, k)] = []
    for b in sorted(range(len(batches)), key=lambda b: b + rng.uniform(0, 2.5)):
        for i, page in enumerate(batches[b]):
            part = log[(TOPICS.near_state, directory_owner(page.id, SHAPE.router))]
            part.append(_record(TOPICS.near_state, directory_owner(page.id, SHAPE.router),
                                len(part), near_state(sketcher.sketch(page, idf)),
                                [page_header(b, i)]))


def run(stores: Stores, config: EngineConfig, stream: list[Any], seed: int,
        topics: StageTopics = TOPICS) -> tuple[Ops, Answers, list[Page]]:
    """``topics``: with its Kafka configuration (a smaller ``max_request_size`` sends the
    learner's freezes in parts)."""
    rng = random.Random(seed)
    pages, log = sequenced(stream, rng, NEAR_TEXTS)
    with_near_states(pages, log, rng)
    for topic, n in ((TOPICS.decisions, SHAPE.directory), (TOPICS.exact, SHAPE.exact),
                     (TOPICS.near_ops, SHAPE.near), (TOPICS.near_answers, SHAPE.combine),
                     (TOPICS.idf, 1), (TOPICS.revisits, SHAPE.combine)):
        for k in range(n):
            log[(topic, k)] = []
    roles = [("dir", DirectoryPartition, SHAPE.directory), ("exact", ExactPartition, SHAPE.exact),
             ("router", RouterPartition, SHAPE.router), ("near", NearPartition, SHAPE.near),
             ("learner", LearnerPartition, 1)]
    owners = [Owner(f"{name}{k}", functools.partial(make, topics, k, config=config), stores)
              for name, make, n in roles for k in range(n)]
    assert drive(owners, log, rng, lambda: all(_done(w.part, len(pages)) for w in owners),
                 STEPS), "the near partitions did not apply every ordinal"
    got: Ops = {}
    for k in range(SHAPE.near):
        for rec in log[(TOPICS.near_ops, k)]:
            router, kind, _ = record_near_from(rec)
            if kind != UPTO:
                key = (record_ordinal(rec), kind, router, k)
                assert key not in got  # (each sent once)
                got[key] = rec.value
    answers: Answers = {}
    for c in range(SHAPE.combine):
        for rec in wholes(log[(TOPICS.near_answers, c)]):
            at = (record_ordinal(rec), answer_from_bytes(rec.value)[1])
            assert at not in answers
            answers[at] = (c, rec.value)
        for rec in log[(TOPICS.revisits, c)]:  # (a revisit's distance: as shard -1)
            at = (record_ordinal(rec), -1)
            assert at not in answers
            answers[at] = (c, rec.value)
    return got, answers, pages


def _done(part: Any, n: int) -> bool:
    """The router and near partitions have applied every page (the others' are upstream)."""
    if isinstance(part, NearPartition):
        return part.next_seq == n
    return not isinstance(part, RouterPartition) or part.ledger.next_seq == n


def recorded_near(p: Partitioned) -> tuple[Ops, dict[tuple[int, int], bytes]]:
    """The ``NearOps`` each router of ``p`` makes from now on (a sweep's and a page's) and
    the near answers, by ordinal, in their wire form (filled as it runs): what the router and
    near roles publish."""
    sent: Ops = {}
    answers: dict[tuple[int, int], bytes] = {}

    def routed(real: Any, kind: int, r: int, *args: Any) -> Any:
        out = real(*args)
        for op in out:
            assert (op.seq, kind, r, op.shard) not in sent
            sent[(op.seq, kind, r, op.shard)] = op.to_bytes()
        return out

    def related(real: Any, d: Any, *args: Any) -> Any:
        got = real(d, *args)
        answers[(d.seq, -1)] = msgpack.packb(got)
        return got

    def applied(real: Any, ops: Any) -> Any:
        answer = real(ops)
        if answer is not None:
            answers[(ops.seq, ops.shard)] = answer_to_bytes(ops.seq, ops.shard, answer)
        return answer

    for r, (router, _) in enumerate(p.routers):
        router.route = functools.partial(routed, router.route, PAGE, r)  # type: ignore[method-assign]
        router.forget = functools.partial(routed, router.forget, SWEEP, r)  # type: ignore[method-assign]
        router.relate = functools.partial(related, router.relate)  # type: ignore[method-assign]
    for near in p.nears:
        near.apply = functools.partial(applied, near.apply)  # type: ignore[method-assign]
    return sent, answers


def oracle(stores: Stores, config: EngineConfig, pages: list[Page]) -> tuple[Ops, Answers]:
    """``Partitioned`` on the pages, swept before every multiple of ``every`` ordinals (as
    tests/service/test_stage_partitions.py's oracle)."""
    p = Partitioned(config, SHAPE, functools.partial(stores.store,
                                                     params=config.frozen_params()))
    sent, answers = recorded_near(p)
    process(p, pages)
    return sent, {(o, s): (directory_owner(pages[o].id, SHAPE.combine), raw)
                  for (o, s), raw in answers.items()}


def check(config: EngineConfig, stream: list[Any], seed: int, topics: StageTopics = TOPICS
          ) -> tuple[Ops, Answers]:
    with temporary_stores("stage-near-") as stores:
        try:
            got, answers, pages = run(stores, config, stream, seed, topics)
            want, want_answers = oracle(stores, config, pages)
            assert got == want
            assert answers == want_answers
        except BaseException:
            stores.close()  # (else a shrinking hypothesis runs out of file descriptors)
            raise
    return got, answers


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.sampled_from([NEAR, FIRST]), stream=ops, seed=st.integers(0, 2**32))
def test_router_and_near_partitions_send_what_the_pipeline_in_one_process_does(
        config: EngineConfig, stream: list[Any], seed: int) -> None:
    check(config, stream, seed)


def test_a_long_stream_has_sweeps_removals_and_near_matches() -> None:
    """A fixed stream long enough for every kind of op (the random ones may have none)."""
    rng = random.Random(7)
    stream = [("page", rng.randrange(N_IDS), rng.choice([0, 0, 1, 2]), rng.choice([0, 1, 3]),
               True) if rng.random() < 0.85 else ("delete", rng.randrange(N_IDS))
              for _ in range(40)]
    sent, answers = check(NEAR, stream, 11)
    kinds = {kind for (_, kind, _, _) in sent}
    assert kinds == {SWEEP, PAGE}
    assert any(NearOps.from_bytes(v).removed for (_, kind, _, _), v in sent.items()
               if kind == SWEEP)
    assert len({r for (_, _, r, _) in sent}) == SHAPE.router
    assert any(len(answer_from_bytes(v)[2].ordinal) for (_, s), (_, v) in answers.items()
               if s != -1)
    assert len({c for c, _ in answers.values()}) == SHAPE.combine


# idf tables learned and frozen within the streams (at 2, 5 and 12 pages added to the near
# table): the learner role's freezes, the routers' waits for them, their fingerprints made
# again from the sketch role's uniform ones, and the revisit distances
LEARNED = replace(NEAR, near=replace(NEAR.near, idf_freeze_at=(2, 5, 12))).validate()
# a freeze in 3 parts (a table of these pages and a model: about 5 KB)
SMALL = StageTopics(replace(KafkaConfig(), max_request_size=RECORD_OVERHEAD + 2048), SHAPE)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=st.sampled_from([LEARNED, replace(LEARNED, near=replace(
    LEARNED.near, mode="first"))]), stream=ops, seed=st.integers(0, 2**32),
       topics=st.sampled_from([TOPICS, SMALL]))
def test_learned_idf_tables_route_and_relate_as_the_pipeline_in_one_process(
        config: EngineConfig, stream: list[Any], seed: int, topics: StageTopics) -> None:
    check(config, stream, seed, topics)


def test_a_long_stream_reaches_every_freeze_and_relates_revisits() -> None:
    rng = random.Random(5)
    stream = [("page", rng.randrange(N_IDS), rng.choice([0, 0, 1, 2]), rng.choice([0, 1, 3]),
               True) if rng.random() < 0.9 else ("delete", rng.randrange(N_IDS))
              for _ in range(60)]
    with temporary_stores("stage-learn-") as stores:
        got, answers, pages = run(stores, LEARNED, stream, 3, SMALL)
        want, want_answers = oracle(stores, LEARNED, pages)
        p = Partitioned(LEARNED, SHAPE, functools.partial(stores.store,
                                                          params=LEARNED.frozen_params()))
        process(p, pages)
    assert got == want and answers == want_answers
    assert len(p.learner.tables) == 4  # (every freeze reached)
    assert any(msgpack.unpackb(raw) is not None for (_, s), (_, raw) in answers.items()
               if s == -1)
