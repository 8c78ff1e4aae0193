"""A router's rows kept in a store (dupalign.stages.router_store): reopened from the store at
any point of a random run of the writes a ``Router`` makes (a row set, of its own id or
another's, a row removed), they are the rows of a dict that never stopped."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.stages.router_store import StoredRows
from tests.reused_stores import temporary_stores


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.integers(0, 80), max_size=4))
def test_reopened_rows_are_those_of_a_dict(seed: int, stops: list[int]) -> None:
    rng = random.Random(seed)
    with temporary_stores("router-rows-") as stores:
        plain: dict[int, int | None] = {}
        store = stores.store("rows-0", {"p": 1})
        kept = StoredRows(store)
        for step in range(80):
            r = rng.random()
            if r < 0.5 or not plain:
                ordinal = rng.randrange(40)
                fp = None if rng.random() < 0.3 else rng.randrange(2**64)
                plain[ordinal] = kept[ordinal] = fp
            elif r < 0.75:
                ordinal = rng.choice(list(plain))
                del plain[ordinal], kept[ordinal]
            else:
                ordinal = rng.choice(list(plain))
                assert kept.pop(ordinal) == plain.pop(ordinal)
            if step in stops or rng.random() < 0.1:
                batch = store.batch()
                kept.write(batch)
                store.write(batch)
                kept = StoredRows(store)
                assert dict(kept) == plain
        assert dict(kept) == plain
