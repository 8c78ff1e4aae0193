"""A retention sweep's pages (``Ledger.expired``) start at a cursor past the dead slots at
the front and read only as many live slots as the sweep can take: the same pages as the
scan of every used slot it replaced (``scanned``, kept here as the oracle), at every point
of a random stream of decisions (one by one and in runs), sweeps and compactions."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.stages.directory import NO_TIME, Decision, Decisions, Version
from dupalign.stages.ledger import Expired, Ledger
from tests.stages.test_ledger_runs import _runs, _short_run, _stream


def scanned(ledger: Ledger, max_pages: int, max_age_s: int, now_ms: int, limit: int = 1000
            ) -> list[Expired]:
    """``Ledger.expired`` as it was: every used slot scanned for the live ones."""
    if not max_pages and not max_age_s:
        return []
    slots = np.flatnonzero(ledger._live[:ledger._used])[:limit]
    leaves = np.zeros(len(slots), dtype=np.bool_)
    if max_pages:
        leaves |= ledger.alive - np.arange(len(slots)) > max_pages
    if max_age_s:
        fetched = ledger._fetched[slots]
        leaves |= (fetched != NO_TIME) & (fetched < now_ms - max_age_s * 1000)
    n = len(slots) if leaves.all() else int(np.argmin(leaves))
    return [Expired(o, q) for o, q in zip(ledger._ordinal[slots[:n]].tolist(),
                                          ledger._seq[slots[:n]].tolist(), strict=True)]


sweeps = st.tuples(st.integers(0, 8), st.integers(0, 4), st.integers(0, 200_000),
                   st.integers(0, 12))


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 2, 8, 1024]), st.sampled_from([0, 1000]),
       st.lists(sweeps, min_size=1, max_size=6))
def test_a_sweep_from_the_cursor_takes_the_pages_the_scan_takes(
        seed: int, slots: int, short: int, asked: list[tuple[int, int, int, int]]) -> None:
    rng = random.Random(seed)
    ledger = Ledger(slots=slots)
    with _short_run(short):  # (0: runs in arrays, their removals killing slots at once)
        for item in _runs(rng, _stream(rng, 120)):
            for max_pages, max_age_s, now_ms, limit in asked:
                assert (ledger.expired(max_pages, max_age_s, now_ms, limit)
                        == scanned(ledger, max_pages, max_age_s, now_ms, limit))
            if isinstance(item, tuple):
                max_pages, max_age_s, now_ms = item
                batch = rng.choice([1, 2, 1000])
                while expired := scanned(ledger, max_pages, max_age_s, now_ms, batch):
                    # (a sweep's batches: ``Ledger.sweep``'s, each checked)
                    assert ledger.expired(max_pages, max_age_s, now_ms, batch) == expired
                    ledger.remove(expired)
                    if len(expired) < batch:
                        break
                continue
            ledger.apply_run(Decisions.of(item))


def test_a_sweep_passes_the_dead_front_once() -> None:
    """Pages removed from the front (by new versions, not sweeps) are passed by the cursor:
    the next sweep starts at the first page alive."""
    ledger = Ledger()
    for seq in range(10):
        ledger.apply(Decision(seq, f"d{seq}", "stored", fetched_at=seq))
    for seq in range(10, 14):  # new versions of d0-d3: their slots die at the front
        ledger.apply(Decision(seq, f"d{seq - 10}", "stored", Version(seq - 10, b"h" * 16, None),
                              fetched_at=seq))
    assert ledger.expired(9, 0, 0) == [Expired(4, 4)] == scanned(ledger, 9, 0, 0)
    assert ledger._first == 4
