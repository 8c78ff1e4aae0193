"""``LedgerSteps.run`` (a stage role's decisions of a turn taken and placed at once, the
sequence read in windows that double) takes the decisions ``next`` one by one takes, the
oracle: every decision read from the next ordinal on, in the sequence's batches, while
``fits`` says so and up to the next sweep point, placed alike, the same left held."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, RetentionConfig
from dupalign.service.config import KafkaConfig
from dupalign.service.roles import stage_ledger
from dupalign.service.roles.stage_ledger import LedgerSteps
from dupalign.service.roles.stage_role import StagePartition
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.stage_topics import StageTopics
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.ledger import Ledger
from dupalign.stages.partitioned import Shape
from dupalign.wire.versions import DIRECTORY_DECISION
from tests.reused_stores import Stores, temporary_stores
from tests.stages.test_ledger_store import stream


def _steps(stores: Stores, name: str, seed: int, n_dirs: int, every: int, missing: set[int],
           known: int) -> tuple[LedgerSteps, list[Decision]]:
    """A partition's ledger over the decisions of ``stream`` (sweeps left out: the test
    stops at sweep points), ``known`` of them in the sequence (batches of 1-40), every one
    read but ``missing``; ``stream``'s sweeps left out (the steps stop at sweep points)."""
    rng, ledger, decisions = random.Random(seed), Ledger(), []
    for item in stream(rng, 120, ledger):  # (the sweeps left out: the steps stop before)
        if isinstance(item, Decision):
            ledger.apply(item)
            decisions.append(item)
    config = EngineConfig(retention=RetentionConfig(max_pages=3, every=every))
    part = StagePartition(StageTopics(KafkaConfig(), Shape(n_dirs, 1, 1, 1, 1)), 0,
                          stores.store(name, {"p": 1}))
    steps = LedgerSteps(part, config, part.store)
    at, offset = 0, 0
    while at < min(known, len(decisions)):
        size = min(rng.randint(1, 40), known - at, len(decisions) - at)
        chunk = decisions[at:at + size]
        part.seq.add(offset, SequenceBatch(
            "pages", 0, tuple(range(size)),
            tuple(directory_owner(d.doc_id, n_dirs) for d in chunk), n_dirs, 0))
        at, offset = at + size, offset + 1
    for p in range(n_dirs):
        for d in decisions:
            if directory_owner(d.doc_id, n_dirs) == p and d.seq not in missing:
                steps.decisions.add(p, d.seq, d.seq, d.to_bytes())
    return steps, decisions


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 2, 3]), st.sampled_from([4, 32, 1000]),
       st.sets(st.integers(0, 119), max_size=3), st.integers(0, 120), st.sampled_from([1, 2]),
       st.sampled_from([0, 3]))
def test_a_run_takes_the_decisions_next_takes_one_by_one(
        seed: int, n_dirs: int, every: int, missing: set[int], known: int, window: int,
        owner: int) -> None:
    fits = (lambda f: directory_owner(f["id"], 3) != owner) if owner else (lambda f: True)
    was, stage_ledger.RUN_WINDOW = stage_ledger.RUN_WINDOW, window
    try:
        with temporary_stores("ledger-steps-") as stores:
            ran, decisions = _steps(stores, "ran", seed, n_dirs, every, missing, known)
            one, _ = _steps(stores, "one", seed, n_dirs, every, missing, known)
            got = ran.run(fits)
            taken = []  # the oracle: peek, then next, while each fits
            while (d := one.peek()) is not None and fits(DIRECTORY_DECISION.unpack(
                    d.to_bytes())):
                step = one.next(d)
                assert step is not None
                taken.append(step)
    finally:
        stage_ledger.RUN_WINDOW = was
    if got is None:
        assert taken == []
    else:
        run, placed = got
        assert run.seq == [d.seq for d, _ in taken]
        assert [placed.placed(k) for k in range(len(run))] == [p for _, p in taken]
    assert ran.next_seq == one.next_seq
    assert ran.ledger.ledger.alive == one.ledger.ledger.alive
    assert ran.decisions.low_water() == one.decisions.low_water()
    assert ran.decisions.taken == one.decisions.taken
    assert len(decisions) > 0
