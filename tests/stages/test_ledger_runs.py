"""Decisions applied as a run (``Ledger.apply_run``, ``StoredLedger.apply_run``: a turn's
decisions of pages a partition does not own, at once) place every decision, change the
same rows in the same order and leave the same ledger as ``apply`` one by one, the oracle,
whether the run is applied in array operations (``_vectors``) or one by one; a run holding
a decision ``apply`` refuses raises ``apply``'s error, and ``_vectors`` refuses it whole."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.stages import ledger as ledger_module
from dupalign.stages.directory import KINDS, NO_TIME, NONE, Decision, Decisions, Version
from dupalign.stages.ledger import Ledger
from dupalign.stages.ledger_store import StoredLedger
from dupalign.wire.versions import DIRECTORY_DECISION
from tests.reused_stores import temporary_stores
from tests.stages.test_ledger_store import stream


@contextmanager
def _short_run(n: int) -> Iterator[None]:
    """Runs shorter than ``n`` applied one by one (0: every run in arrays)."""
    was, ledger_module.SHORT_RUN = ledger_module.SHORT_RUN, n
    try:
        yield
    finally:
        ledger_module.SHORT_RUN = was


def _stream(rng: random.Random, n: int) -> list[Decision | tuple[int, int, int]]:
    """``stream``'s decisions and sweeps, each applied to the ledger it reads as it goes."""
    ledger, out = Ledger(), []
    for item in stream(rng, n, ledger):
        if isinstance(item, Decision):
            ledger.apply(item)
        else:
            ledger.sweep(*item)
        out.append(item)
    return out


def _runs(rng: random.Random, items: list[Decision | tuple[int, int, int]]
          ) -> list[list[Decision] | tuple[int, int, int]]:
    """The decisions between sweeps cut into runs of random lengths."""
    out: list[list[Decision] | tuple[int, int, int]] = []
    run: list[Decision] = []
    for item in items:
        if isinstance(item, Decision) and (not run or rng.random() < 0.8):
            run.append(item)
            continue
        if run:
            out.append(run)
        run = [item] if isinstance(item, Decision) else []
        if not isinstance(item, Decision):
            out.append(item)
    return out + ([run] if run else [])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 2, 4, 1024]), st.sampled_from([0, 4]))
def test_a_run_applied_at_once_is_the_decisions_applied_one_by_one(seed: int, slots: int,
                                                                   short: int) -> None:
    rng = random.Random(seed)
    items = _stream(rng, 80)
    with temporary_stores("ledger-runs-") as stores, _short_run(short):
        one = StoredLedger(stores.store("one", {"p": 1}))
        at_once = StoredLedger(stores.store("run", {"p": 1}))
        one.ledger, at_once.ledger = Ledger(slots=slots), Ledger(slots=slots)
        plain = Ledger(slots=slots)  # (every run in arrays)
        for item in _runs(rng, items):
            if isinstance(item, tuple):
                assert at_once.sweep(*item) == one.sweep(*item) == plain.sweep(*item)
                continue
            placed = at_once.apply_run(Decisions.of(item))  # (one by one if short)
            vectors = plain._vectors(Decisions.of(item))
            assert vectors is not None
            expected = [one.apply(d) for d in item]
            assert [placed.placed(i) for i in range(len(item))] == expected
            assert [vectors.placed(i) for i in range(len(item))] == expected
            assert list(at_once._changed.items()) == list(one._changed.items())
            at_once._changed.clear()
            one._changed.clear()
            assert one.ledger.next_seq == item[-1].seq + 1
            for ledger in (at_once.ledger, plain):
                assert (ledger.next_seq, ledger.next_ordinal, ledger.alive) == (
                    one.ledger.next_seq, one.ledger.next_ordinal, one.ledger.alive)
                assert ledger.expired(1, 0, 0, 10_000) == one.ledger.expired(1, 0, 0, 10_000)


def _wrong(rng: random.Random, run: list[Decision]) -> list[Decision]:
    """``run`` with one decision naming a page that is not alive when it comes: one the
    run stores at or after it, one an earlier decision of the run removed, one never
    stored."""
    i = rng.randrange(len(run))
    d = run[i]
    later = [x.seq for x in run[i:] if x.kind == "stored"] + [d.seq]
    removed = [x.removed.seq for x in run[:i] if x.removed is not None]
    named = rng.choice(rng.choice([later, removed or later, [10**6]]))
    if rng.random() < 0.5:
        wrong = Decision(d.seq, d.doc_id, "delete", Version(named, b"h" * 16, None))
    else:
        wrong = Decision(d.seq, d.doc_id, "replay", replay_of=named)
    return [*run[:i], wrong, *run[i + 1:]]


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([0, 1000]))
def test_a_run_with_a_decision_apply_refuses_raises_its_error(seed: int, short: int) -> None:
    rng = random.Random(seed)
    items = [d for d in _stream(rng, 40) if isinstance(d, Decision)]
    cut = rng.randrange(len(items))
    before, run = items[:cut], _wrong(rng, items[cut:cut + rng.randint(1, 12)])
    one, at_once, untouched = Ledger(), Ledger(), Ledger()
    for d in before:
        for ledger in (one, at_once, untouched):
            ledger.apply(d)
    error = None
    try:
        for d in run:
            one.apply(d)
    except ValueError as exc:
        error = str(exc)
    if error is None:  # (the name was of a page alive then after all)
        assert at_once._vectors(Decisions.of(run)) is not None
        return
    assert at_once._vectors(Decisions.of(run)) is None  # (nothing applied)
    assert (at_once.next_seq, at_once.next_ordinal, at_once.alive) == (
        untouched.next_seq, untouched.next_ordinal, untouched.alive)
    assert at_once.expired(1, 0, 0) == untouched.expired(1, 0, 0)
    with temporary_stores("ledger-refused-") as stores, _short_run(short):
        kept = StoredLedger(stores.store("s", {"p": 1}))
        for d in before:
            kept.apply(d)
        with pytest.raises(ValueError) as raised:
            kept.apply_run(Decisions.of(run))
        assert str(raised.value) == error


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_the_columns_of_decisions_read_as_each_decision_reads(seed: int) -> None:
    items = [d for d in _stream(random.Random(seed), 30) if isinstance(d, Decision)]
    run = Decisions.of_fields([DIRECTORY_DECISION.unpack(d.to_bytes()) for d in items])
    for i, d in enumerate(Decision.from_bytes(d.to_bytes()) for d in items):
        assert (run.seq[i], run.doc_id[i], KINDS[run.kind[i]], run.content_hash[i]) == (
            d.seq, d.doc_id, d.kind, d.content_hash)
        assert run.removed[i] == (NONE if d.removed is None else d.removed.seq)
        assert run.replay_of[i] == (NONE if d.replay_of is None else d.replay_of)
        assert run.fetched_at[i] == (NO_TIME if d.fetched_at is None else d.fetched_at)
    assert run.stored() == [i for i, d in enumerate(items) if d.kind == "stored"]
