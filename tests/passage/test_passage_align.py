"""The batched alignment kernels (dupalign.passage.batch_align) against brute force.

test_passages.py checks the whole store path against pairwise alignment; here the kernels
get many (passage, page) tasks at once, on pages with repeated text (many windows per list,
many empty windows per bin), and each task must equal the pairwise aligner over ALL the
page's colliding windows: the pruning inside the kernels (reachable spans, empty windows
found by binary search) may drop only windows that change no result.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage import batch_align as pa
from dupalign.passage.interval_scan import align_sketch
from dupalign.passage.oph import OPHWindows, compact_windows, oph_sketch, oph_values


def _hvals(words: list[int]) -> np.ndarray:
    return oph_values(np.array([1000 + w for w in words], dtype=np.uint64))


class Batch:
    """Inputs of ``select_candidates``/``viable_tasks``/``scan_tasks`` built in memory the
    way dupalign.passage.index builds them from the store: one inverted list per distinct
    (bin, min-hash) of the passages, entries sorted by ordinal; a stop list has no entries."""

    def __init__(self, pages: list[list[int]], passages: list[list[int]], k: int,
                 stopped: set[int]) -> None:
        self.k = k
        self.windows = [compact_windows(_hvals(p), k) for p in pages]
        sk = [oph_sketch(_hvals(q), k) for q in passages]
        self.mins = np.array([m for m, _ in sk], dtype=np.uint64)
        self.q_empty = np.array([e for _, e in sk], dtype=np.bool_)
        names = sorted({(b, int(self.mins[p, b])) for p in range(len(passages)) for b in range(k)
                        if not self.q_empty[p, b]})
        self.stop = {names[x] for x in stopped if x < len(names)}
        ids = {name: x for x, name in enumerate(names)}
        self.lid = np.full((len(passages), k), -1, dtype=np.int64)
        for p in range(len(passages)):
            for b in range(k):
                if not self.q_empty[p, b]:
                    self.lid[p, b] = ids[(b, int(self.mins[p, b]))]
        entries: list[list[tuple[int, list[int]]]] = [[] for _ in names]
        empty_rows: dict[int, list[tuple[int, int, int]]] = {}
        for o, w in enumerate(self.windows):
            for x in range(len(w)):
                b = int(w.bin[x])
                if w.empty[x]:
                    empty_rows.setdefault((o << pa.EMPTY_KEY_SHIFT) | b, []).append(
                        (int(w.l[x]), int(w.r[x]), int(w.r[x])))
                elif (b, int(w.value[x])) in ids and (b, int(w.value[x])) not in self.stop:
                    entries[ids[(b, int(w.value[x]))]].append(
                        (o, [int(w.l[x]), int(w.c[x]), int(w.c[x]), int(w.r[x])]))
        self.n_before = np.array([len(e) for e in entries], dtype=np.int64)
        self.start = np.concatenate(([0], np.cumsum(self.n_before)[:-1])).astype(np.int64)
        flat = [e for es in entries for e in es]
        self.ords = np.array([o for o, _ in flat], dtype=np.int64)
        # int32, as the list cache and the forward records give them: the kernels' machine
        # code is the product's (and cached by warm_kernels), not an int64 twin of it
        self.rects = np.array([r for _, r in flat], dtype=np.int32).reshape(-1, 4)
        self.empty_keys = np.array(sorted(empty_rows), dtype=np.int64)
        counts = [len(empty_rows[key]) for key in sorted(empty_rows)]
        self.empty_off = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self.empty_lr = np.array([r for key in sorted(empty_rows) for r in empty_rows[key]],
                                 dtype=np.int64).reshape(-1, 3)

    def kernel_args(self) -> tuple[np.ndarray, ...]:
        return (self.lid, self.n_before, self.start, self.ords, self.rects, self.q_empty)

    def pairwise(self, p: int, o: int, theta: tuple[int, int],
                 min_len: int) -> list[tuple[int, int, float]]:
        """Every colliding window of page ``o`` (stop lists aside) into the pairwise
        aligner, and the estimate counted at each reported range's cell."""
        w = self.windows[o]
        keep = np.array([bool(e) or (int(b), int(v)) not in self.stop for b, v, e in zip(
            w.bin, w.value, w.empty, strict=True)], dtype=np.bool_)
        w = OPHWindows(w.bin[keep], w.value[keep], w.empty[keep], w.l[keep], w.c[keep],
                       w.r[keep])
        # a stop list's bin is neither a collision nor an empty bin: no query value matches
        mins = self.mins[p].copy()
        for b in range(self.k):
            if (b, int(mins[b])) in self.stop:
                mins[b] = 0
        out = []
        for s, e in align_sketch(mins, self.q_empty[p], w, self.k, theta, min_len):
            i, j = s, e - 1
            qe = self.q_empty[p][w.bin]
            hit = np.where(w.empty, qe, ~qe & (mins[w.bin] == w.value))
            cover = hit & (w.l <= i) & (np.where(w.empty, w.r, w.c) >= i) & (
                np.where(w.empty, w.l, w.c) <= j) & (w.r >= j)
            n_emp = int(np.count_nonzero(cover & w.empty))
            n_mat = int(np.count_nonzero(cover)) - n_emp
            out.append((s, e, n_mat / (self.k - n_emp)))
        return out


word_lists = st.lists(st.integers(0, 5), min_size=1, max_size=70)


@settings(max_examples=150, deadline=None)
@given(pages=st.lists(word_lists, min_size=1, max_size=4),
       data=st.data(), k=st.integers(2, 16), theta=st.sampled_from(
           [Fraction(1, 10), Fraction(3, 10), Fraction(1, 2), Fraction(4, 5), Fraction(1)]),
       min_len=st.integers(1, 16))
def test_scan_tasks_equal_pairwise_alignment(
    pages: list[list[int]], data: st.DataObject, k: int, theta: Fraction, min_len: int
) -> None:
    # passages: slices of the pages (copies, templated text) and fresh words
    passages = []
    for _ in range(data.draw(st.integers(1, 4))):
        src = pages[data.draw(st.integers(0, len(pages) - 1))]
        a = data.draw(st.integers(0, len(src) - 1))
        passages.append(src[a : data.draw(st.integers(a + 1, len(src)))]
                        + data.draw(st.lists(st.integers(0, 9), max_size=6)))
    stopped = set(data.draw(st.lists(st.integers(0, 3 * k), max_size=3)))
    batch = Batch(pages, passages, k, stopped)
    p_, q_ = theta.numerator, theta.denominator
    need = k * p_
    task_p = np.repeat(np.arange(len(passages), dtype=np.int64), len(pages))
    task_o = np.tile(np.arange(len(pages), dtype=np.int64), len(passages))
    viable = pa.viable_tasks(task_p, task_o, *batch.kernel_args(), q_, p_, need, pa.NO_CAP)
    h_t, h_s, h_e, h_x = pa.scan_tasks(
        task_p, task_o, *batch.kernel_args(), batch.empty_keys, batch.empty_off,
        batch.empty_lr, q_, p_, need, min_len, k, pa.NO_CAP)
    for t in range(len(task_p)):
        want = batch.pairwise(int(task_p[t]), int(task_o[t]), (p_, q_), min_len)
        got = [(int(s), int(e), float(x)) for s, e, x in zip(
            h_s[h_t == t], h_e[h_t == t], h_x[h_t == t], strict=True)]
        assert [(s, e) for s, e, _ in got] == [(s, e) for s, e, _ in want]
        assert [x for *_, x in got] == pytest.approx([x for *_, x in want])
        if not viable[t]:  # a necessary condition only: what it drops has no result
            assert not want


def _capped_rows(batch: Batch, p: int, o: int, cap: int, min_len: int) -> list[list[int]]:
    """The rows ``_gather_matched`` gives with ``max_repeats`` = ``cap``, the obvious way: a
    list with at most ``cap`` windows of page ``o`` gives them all; a list with more gives
    its first ``cap`` and those whose start interval shares a position with the start
    interval of a window of the first kind; those covering a subsequence of ``min_len``."""
    per_list = []
    for b in range(batch.k):
        x = int(batch.lid[p, b])
        if x >= 0:
            rows = range(int(batch.start[x]), int(batch.start[x] + batch.n_before[x]))
            per_list.append([batch.rects[r].tolist() for r in rows if batch.ords[r] == o])
    rare = [w for ws in per_list if len(ws) <= cap for w in ws]
    at_rare = {i for w in rare for i in range(w[0], w[1] + 1)}
    kept = rare + [w for ws in per_list if len(ws) > cap for y, w in enumerate(ws)
                   if y < cap or at_rare & set(range(w[0], w[1] + 1))]
    return [w for w in kept if w[0] <= w[1] and w[2] <= w[3] and w[3] - w[0] + 1 >= min_len]


@settings(max_examples=200, deadline=None)
@given(pages=st.lists(word_lists, min_size=1, max_size=3), data=st.data(),
       k=st.integers(2, 16), cap=st.integers(1, 4), min_len=st.integers(1, 8))
def test_max_repeats_gathers_the_first_windows_and_those_where_rarer_units_are(
    pages: list[list[int]], data: st.DataObject, k: int, cap: int, min_len: int
) -> None:
    """``passage.max_repeats`` in the kernels' gather, against its obvious twin (pages
    of few distinct words, so that units repeat and the cap binds); the viability filter
    stays a necessary condition of the capped scan."""
    passages = [pages[data.draw(st.integers(0, len(pages) - 1))][:data.draw(
        st.integers(1, 70))] for _ in range(data.draw(st.integers(1, 3)))]
    batch = Batch(pages, passages, k, set())
    buf = np.empty((max(1, int(batch.n_before.sum())), 5), dtype=np.int64)
    for p in range(len(passages)):
        for o in range(len(pages)):
            m = pa._gather_matched(buf, p, o, batch.lid, batch.n_before, batch.start,
                                   batch.ords, batch.rects, 7, min_len, cap)
            assert buf[:m, :4].tolist() == _capped_rows(batch, p, o, cap, min_len)
    task_p = np.repeat(np.arange(len(passages), dtype=np.int64), len(pages))
    task_o = np.tile(np.arange(len(pages), dtype=np.int64), len(passages))
    viable = pa.viable_tasks(task_p, task_o, *batch.kernel_args(), 10, 3, 3 * k, cap)
    h_t, *_ = pa.scan_tasks(task_p, task_o, *batch.kernel_args(), batch.empty_keys,
                            batch.empty_off, batch.empty_lr, 10, 3, 3 * k, min_len, k, cap)
    assert not set(h_t.tolist()) - set(np.flatnonzero(viable).tolist())


def _brute_reachable(rects: np.ndarray, col: int, m_min: int) -> set[int]:
    cover: dict[int, int] = {}
    for r in rects:
        for x in range(int(r[col]), int(r[col + 1]) + 1):
            cover[x] = cover.get(x, 0) + 1
    return {x for x, c in cover.items() if c >= m_min}


intervals = st.tuples(st.integers(0, 40), st.integers(0, 12))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(intervals, intervals), max_size=25), st.integers(1, 5),
       st.sampled_from([1, 3, 50]))
def test_keep_reachable_equals_brute_force(
    spans: list[tuple[tuple[int, int], tuple[int, int]]], m_min: int, spread: int
) -> None:
    # spread: intervals over few positions (spans found by counting) or many (by sorting)
    rects = np.array([[a * spread, a * spread + la, b * spread, b * spread + lb, 1]
                      for (a, la), (b, lb) in spans], dtype=np.int64).reshape(-1, 5)
    ok_i = _brute_reachable(rects, 0, m_min)
    ok_j = _brute_reachable(rects, 2, m_min)
    buf = rects.copy()
    kept, i_s, i_e, j_s, j_e = pa._keep_reachable(buf, len(rects), m_min,
                                                  np.empty((6, len(rects)), dtype=np.int64))
    for s, e, ok in ((i_s, i_e, ok_i), (j_s, j_e, ok_j)):
        assert {x for a, z in zip(s.tolist(), e.tolist(), strict=True) for x in range(a, z)} == ok
        assert (s[1:] > e[:-1]).all()  # disjoint, not even touching: maximal spans
    want = [r for r in rects.tolist()
            if ok_i & set(range(r[0], r[1] + 1)) and ok_j & set(range(r[2], r[3] + 1))]
    assert buf[:kept].tolist() == want
    # the viability filter's shortcut: the same answer to "is any rectangle kept"
    assert pa._any_reachable(rects.copy(), len(rects), m_min,
                             np.empty((6, len(rects)), dtype=np.int64)) == bool(want)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 9)), max_size=15),
       st.lists(st.integers(0, 50), max_size=6), st.lists(st.integers(0, 50), max_size=6),
       st.integers(1, 4))
def test_gather_empty_equals_linear_filter(gaps: list[tuple[int, int]], i_cuts: list[int],
                                           j_cuts: list[int], min_len: int) -> None:
    """Empty windows found by binary search per reachable span = every row of ``min_len``
    or more positions that meets both span sets, each once."""
    rows, x = [], 0
    for g, more in gaps:  # rows (l, i_hi, j_hi) disjoint in i, as a bin's gaps or steps
        rows.append((x, x + g - 1, x + g - 1 + more))
        x += g + 1
    lr = np.array(rows, dtype=np.int64).reshape(-1, 3)

    def spans(cuts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        c = sorted(set(cuts))
        c = c[: len(c) // 2 * 2]
        return np.array(c[0::2], dtype=np.int64), np.array(c[1::2], dtype=np.int64)

    i_s, i_e = spans(i_cuts)
    j_s, j_e = spans(j_cuts)
    key = (7 << pa.EMPTY_KEY_SHIFT) | 3
    q_empty = np.zeros((1, 4), dtype=np.bool_)
    q_empty[0, 3] = True
    buf = np.zeros((len(rows) + 1, 5), dtype=np.int64)
    m = pa._gather_empty(buf, 0, 0, 7, q_empty, np.array([key], dtype=np.int64),
                         np.array([0, len(rows)], dtype=np.int64), lr, 2, i_s, i_e, j_s, j_e,
                         min_len)

    def meets(s: np.ndarray, e: np.ndarray, lo: int, hi: int) -> bool:
        return any(a <= hi and lo < z for a, z in zip(s.tolist(), e.tolist(), strict=True))

    want = [[lo, i_hi, lo, j_hi, -2] for lo, i_hi, j_hi in rows if j_hi - lo + 1 >= min_len
            and meets(i_s, i_e, lo, i_hi) and meets(j_s, j_e, lo, j_hi)]
    assert buf[:m].tolist() == want


def test_unsorted_empty_windows_are_refused() -> None:
    lr = np.array([[5, 8, 8], [0, 3, 6]], dtype=np.int64)
    with pytest.raises(ValueError, match="sorted disjoint"):
        pa._check_empty_rows(np.array([0, 2], dtype=np.int64), lr)
    pa._check_empty_rows(np.array([0, 1, 2], dtype=np.int64), lr)  # two keys: fine
    with pytest.raises(ValueError, match="sorted disjoint"):  # a step ends before its i_hi
        pa._check_empty_rows(np.array([0, 1], dtype=np.int64), np.array([[0, 3, 2]]))


@pytest.mark.parametrize("kernel", ["passage_sketches", "entries_before", "select_candidates",
                                    "viable_tasks", "scan_tasks"])
def test_kernels_release_the_gil(kernel: str) -> None:
    """A thread pool runs the align stage in parallel only if these release the GIL."""
    assert getattr(pa, kernel).targetoptions.get("nogil") is True
