"""The pending pages' chained list entries against a plain dict of Python lists."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage.lists.chains import ListChains

List = tuple[int, int]  # (bin, min-hash)

names = st.tuples(st.integers(0, 1023), st.sampled_from([0, 1, 7, 2**63, 2**64 - 1]))
pages = st.lists(st.dictionaries(names, st.integers(1, 4), min_size=1, max_size=30),
                 min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(pages=pages, reset_at=st.integers(0, 40), probe=st.lists(names, max_size=20))
def test_chains_equal_dict_of_lists(pages: list[dict[List, int]], reset_at: int,
                                    probe: list[List]) -> None:
    """Pages add their windows per list (the tables grow from their smallest size, keys
    above 2^63 too); a reset forgets everything; reads of any lists, present or not, in
    any order and repeated, give each list's ordinals in page order, once per window."""
    chains = ListChains()
    twin: dict[List, list[int]] = {}
    for ordinal, page in enumerate(pages):
        if ordinal == reset_at:
            chains.reset()
            twin.clear()
        lists = list(page)
        chains.add(np.array([b for b, _ in lists], dtype=np.int64),
                   np.array([k for _, k in lists], dtype=np.uint64),
                   np.array([page[x] for x in lists], dtype=np.int64), 3 * ordinal + 1)
        for name, windows in page.items():
            twin.setdefault(name, []).extend([3 * ordinal + 1] * windows)
    asked = list(twin)[::-1] + probe + list(twin)[:2]
    n, ords = chains.entries(np.array([b for b, _ in asked], dtype=np.int64),
                             np.array([k for _, k in asked], dtype=np.uint64))
    assert n.tolist() == [len(twin.get(name, [])) for name in asked]
    assert ords.tolist() == [o for name in asked for o in twin.get(name, [])]


def test_chains_read_nothing() -> None:
    """An empty table and an empty read."""
    chains = ListChains()
    n, ords = chains.entries(np.array([5], dtype=np.int64), np.array([9], dtype=np.uint64))
    assert n.tolist() == [0] and len(ords) == 0
    n, ords = chains.entries(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64))
    assert len(n) == 0 and len(ords) == 0
