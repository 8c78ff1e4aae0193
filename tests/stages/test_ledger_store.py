"""A ledger kept in a store (dupalign.stages.ledger_store): reopened from the store at any
point of a random stream of decisions and sweeps, it places every later decision and sweeps
the same pages as a ledger that never stopped."""

from __future__ import annotations

import random
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.stages.directory import Decision, Version
from dupalign.stages.ledger import Ledger
from dupalign.stages.ledger_store import StoredLedger
from dupalign.store.database import Store
from tests.reused_stores import Stores, temporary_stores


def stream(rng: random.Random, n: int, ledger: Ledger
           ) -> Iterator[Decision | tuple[int, int, int]]:
    """Decisions over a few ids (new pages, new versions, deletes, replays, others' kinds)
    and sweeps (max_pages, max_age_s, now_ms); ``ledger``: the pages alive so far."""
    alive: dict[str, int] = {}  # id -> sequence ordinal of its stored version
    for seq in range(n):
        if rng.random() < 0.15:
            yield rng.randrange(0, 6), rng.randrange(0, 3), seq * 1000
        doc = f"d{rng.randrange(6)}"
        prev = alive.get(doc)
        if prev is not None and ledger.ordinal_of(prev) is None:  # swept
            prev = None
            del alive[doc]
        old = None if prev is None else Version(prev, b"h" * 16, None)
        r = rng.random()
        fetched = None if rng.random() < 0.2 else seq * 1000 - rng.randrange(3000)
        if r < 0.5:
            alive[doc] = seq
            yield Decision(seq, doc, "stored", old, fetched_at=fetched, content_hash=b"c" * 16)
        elif r < 0.65 and prev is not None:
            del alive[doc]
            yield Decision(seq, doc, "delete", old)
        elif r < 0.8 and prev is not None:
            yield Decision(seq, doc, "replay", replay_of=prev)
        else:
            yield Decision(seq, doc, "unchanged" if prev is not None else "rejected")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(0, 60), max_size=4))
def test_a_reopened_ledger_goes_on_as_one_that_never_stopped(seed: int, stops: list[int]
                                                             ) -> None:
    with temporary_stores("ledger-store-") as stores:
        run(stores, seed, set(stops))


def run(stores: Stores, seed: int, stops: set[int]) -> None:
    plain = Ledger()
    store = stores.store("ledger", {"p": 1})
    kept = StoredLedger(store)
    for step, item in enumerate(stream(random.Random(seed), 60, plain)):
        if isinstance(item, Decision):
            assert kept.apply(item) == plain.apply(item)
        else:
            assert kept.sweep(*item) == plain.sweep(*item)
        batch = store.batch()
        kept.write(batch)
        store.write(batch)
        if step in stops:
            kept = StoredLedger(store)
            assert kept.next_seq == plain.next_seq
            assert kept.ledger.alive == plain.alive
    fresh = Store(store.path.with_name("other"), {"p": 1})
    assert StoredLedger(fresh).next_seq == 0 and StoredLedger(fresh).ledger.alive == 0
    fresh.close()
