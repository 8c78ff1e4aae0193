"""``infer_between`` (tests.bench.align_infer, a rule of the align stage tried on recorded
requests, not in the engine: tasks between two scanned tasks of the same page that hit it
in as many ranges are inferred to hit, unscanned) against a brute-force twin written from
its docstring (per page, per run of consecutive passages, the bisection done recursively,
one task at a time), on random tasks and random scans; and the properties it is built on:
the hits of the tasks it scans are the scan's, each task is scanned at most once, every
inferred task lies between two hits of its page, with stride 1 nothing is inferred."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bench.align_infer import INFERRED, infer_between

Hits = tuple[Any, Any, Any, Any]


def fake_scan(table: dict[int, list[tuple[int, int, float]]], log: list[int]) -> Any:
    """A scan whose hits per task are given (ranges by start), logging what it scanned."""
    def scan(tasks: Any) -> Hits:
        rows = [(int(x), s, e, est) for x in tasks.tolist() for s, e, est in table[x]]
        log.extend(int(x) for x in tasks.tolist())
        cols = np.array(rows, dtype=np.float64).reshape(-1, 4)
        return (cols[:, 0].astype(np.int64), cols[:, 1].astype(np.int64),
                cols[:, 2].astype(np.int64), cols[:, 3])
    return scan


Row = tuple[int, int, int, float]


def brute_force(t_p: list[int], t_o: list[int], stride: int, viable: set[int],
                table: dict[int, list[tuple[int, int, float]]]) -> list[Row]:
    """The rule, one task at a time."""
    out: list[Row] = []
    united: dict[int, list[tuple[int, int]]] = {}  # scanned task -> its united ranges

    def scan_one(x: int) -> None:
        if x not in viable:
            return
        groups: list[tuple[int, int]] = []
        for s, e, est in table[x]:  # (by start) ranges that overlap or touch: one
            out.append((x, s, e, est))
            if groups and s <= groups[-1][1]:
                groups[-1] = (groups[-1][0], max(groups[-1][1], e))
            else:
                groups.append((s, e))
        united[x] = groups

    def between(run: list[int], a: int, z: int) -> None:
        if z - a <= 1:
            return
        left, right = united.get(run[a], []), united.get(run[z], [])
        if left and len(left) == len(right):
            for y in range(a + 1, z):
                for (s_a, e_a), (s_z, e_z) in zip(left, right, strict=True):
                    out.append((run[y], s_a + (s_z - s_a) * (y - a) // (z - a),
                                e_a + (e_z - e_a) * (y - a) // (z - a), INFERRED))
            return
        mid = (a + z) // 2
        scan_one(run[mid])
        between(run, a, mid)
        between(run, mid, z)

    tasks = sorted(range(len(t_p)), key=lambda x: (t_o[x], t_p[x]))
    runs: list[list[int]] = []
    for x in tasks:
        if runs and t_o[runs[-1][-1]] == t_o[x] and t_p[runs[-1][-1]] + 1 == t_p[x]:
            runs[-1].append(x)
        else:
            runs.append([x])
    for run in runs:
        anchors = sorted({*range(0, len(run), stride), len(run) - 1})
        for y in anchors:
            scan_one(run[y])
    for run in runs:  # (the order of the runs does not matter: each is its own)
        anchors = sorted({*range(0, len(run), stride), len(run) - 1})
        for a, z in itertools.pairwise(anchors):
            between(run, a, z)
    return sorted(out, key=lambda h: (h[0], h[1]))


tasks_st = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), min_size=0,
                    max_size=120, unique=True)


@settings(max_examples=300, deadline=None)
@given(tasks=tasks_st, stride=st.sampled_from([1, 2, 4, 8, 16]), data=st.data())
def test_infer_between_equals_brute_force(tasks: list[tuple[int, int]], stride: int,
                                          data: st.DataObject) -> None:
    tasks.sort()  # (the index's order: by passage, then page)
    t_p = [p for p, _ in tasks]
    t_o = [o for _, o in tasks]
    n = len(tasks)
    # most tasks hit, as on templated siblings; some do not, some are not viable
    table = {x: sorted(data.draw(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30),
                                                    st.sampled_from([0.3, 0.5, 1.0])),
                                          max_size=3)))
             for x in range(n)}
    table = {x: [(s, s + ln, est) for s, ln, est in hits] for x, hits in table.items()}
    viable = {x for x in range(n) if data.draw(st.integers(0, 9)) > 0}
    log: list[int] = []
    got = infer_between(
        np.array(t_p, dtype=np.int64), np.array(t_o, dtype=np.int64), stride,
        lambda xs: np.array([x for x in xs.tolist() if x in viable], dtype=np.int64),
        fake_scan(table, log))
    rows = list(zip(*(c.tolist() for c in got), strict=True))
    assert rows == brute_force(t_p, t_o, stride, viable, table)
    # the tasks scanned get the scan's hits; each task is scanned at most once
    assert len(log) == len(set(log))
    for x in set(log):
        assert [(s, e, est) for y, s, e, est in rows if y == x] == table[x]
    # an inferred task: not scanned, between two hits of its page's run
    hit_tasks = {y for y, *_ in rows}
    for y, _, _, est in rows:
        if est == INFERRED:
            assert y not in log
            assert any(t_o[a] == t_o[y] and t_p[a] < t_p[y] for a in hit_tasks)
            assert any(t_o[a] == t_o[y] and t_p[a] > t_p[y] for a in hit_tasks)
    if stride == 1:
        assert all(est != INFERRED for *_, est in rows)
        assert sorted(log) == sorted(viable)
