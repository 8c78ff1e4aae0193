"""Decisions applied as a run (``Ledger.apply_run``, ``StoredLedger.apply_run``: a turn's
decisions of pages a partition does not own, at once) place every decision, change the
same rows in the same order and leave the same ledger as ``apply`` one by one, the oracle,
whether the run is applied in array operations (``_vectors``) or one by one; a run holding
a decision ``apply`` refuses raises ``apply``'s error, and ``_vectors`` refuses it whole."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig
from dupalign.stages import ledger as ledger_module
from dupalign.stages.combine import CombineShard
from dupalign.stages.directory import (
    KINDS,
    NO_TIME,
    NONE,
    Decision,
    Decisions,
    Version,
    directory_owner,
)
from dupalign.stages.ledger import Ledger
from dupalign.stages.ledger_store import StoredLedger
from dupalign.store import records, tables
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


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32))
def test_a_combine_partition_keeps_the_ids_of_a_run_as_of_each_decision(seed: int) -> None:
    """``CombineShard.apply_others`` (a run of pages of ids the partition does not own)
    against ``apply`` of each: the same ids alive, nothing stored."""
    rng = random.Random(seed)
    config = EngineConfig()
    # (the pages of ids partition 1 owns, no sweeps among them: a decision names a version
    # of its own id, so each stays alive when it is named)
    items = [i for i in _stream(rng, 60)
             if isinstance(i, Decision) and directory_owner(i.doc_id, 2) == 1]
    with temporary_stores("combine-others-") as stores:
        one, at_once = (CombineShard(stores.store(n, config.frozen_params()), config, 0, 2)
                        for n in ("one", "run"))
        ledgers = Ledger(), Ledger()
        for item in _runs(rng, items):
            assert isinstance(item, list)
            assert all(one.apply(d, ledgers[0].apply(d)) is None for d in item)
            run = Decisions.of(item)
            at_once.apply_others(run, ledgers[1].apply_run(run))
            assert list(at_once.ids.items()) == list(one.ids.items())
        keep = rng.randrange(3)
        for shard, ledger in zip((one, at_once), ledgers, strict=True):
            shard.forget(ledger.sweep(keep, 0, 0))
        assert list(at_once.ids.items()) == list(one.ids.items())
        assert not any(True for _ in tables.matches.items(at_once.store))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ledger", "combine_ids"]), st.integers(0, 20),
                          st.one_of(st.none(), st.binary(max_size=4))), max_size=30))
def test_log_write_changes_the_store_as_each_put_and_delete(
        changes: list[tuple[str, int, bytes | None]]) -> None:
    with temporary_stores("log-write-") as stores:
        one, at_once = stores.store("one", {"p": 1}), stores.store("run", {"p": 1})
        noted: list[list[Any]] = [[], []]
        for store, seen in zip((one, at_once), noted, strict=True):
            store.observe(seen.extend)
        batch = one.batch()
        for log, seq, value in changes:
            if value is None:
                records.log_delete(batch, log, seq)
            else:
                records.log_put(batch, log, seq, value)
        one.write(batch)
        batch = at_once.batch()
        records.log_write(batch, changes)
        at_once.write(batch)
        assert noted[0] == noted[1]  # (the changes in the same order: the changelog's)
        for log in ("ledger", "combine_ids"):
            assert list(records.log_items(one, log)) == list(records.log_items(at_once, log))
