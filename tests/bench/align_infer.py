"""A rule of the align stage tried on recorded requests (issue #44), not in the engine:
``passage.infer_stride``-like inference of the hits of tasks between two scanned tasks of the
same candidate page (``infer_between``), and ``InferAligner``, the ``Aligner`` that applies
it. Measured by ``python -m tests.bench.align_rules R --infer 16`` (docs/performance/
passages.md, "Inferring the tasks between two hits"); its brute-force twin and property
tests: tests/passage/test_infer_between.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.passage import batch_align as passage_align
from dupalign.passage.tasks import Tasks
from dupalign.stages.align import Aligner, union_hits

I64 = npt.NDArray[np.int64]


Scan = Callable[[I64], tuple[I64, I64, I64, npt.NDArray[np.float64]]]
INFERRED = -1.0  # the estimate of an inferred hit: never a page's best


def infer_between(t_p: I64, t_o: I64, stride: int, viable: Callable[[I64], I64],
                  scan: Scan) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:
    """The hits of the tasks (passage ``t_p``, page ``t_o``) with ``stride`` (a power of
    two > 1). Per page, its tasks' passages form runs of consecutive passages; in each
    run every ``stride``-th task and the last are scanned (``viable`` picks, of some task
    indices, those the scan needs; ``scan`` scans them). Between two scanned tasks that hit
    the page in as many ranges (their overlapping ranges united: the places the page holds
    the text, c ≥ 1), the tasks are not scanned but inferred to hit, in c ranges each: the
    j-th on the line from the left task's j-th range to the right one's (ends interpolated
    by passage: a copy's diagonal), with estimate ``INFERRED``. Between two that do not,
    the middle task is scanned and each half looked at again. Hits in the scan's order
    (by task, then start)."""
    order = np.lexsort((t_p, t_o))  # by page, then passage
    n = len(order)
    if n == 0:
        return scan(order)
    p, o = t_p[order], t_o[order]
    at = np.arange(n)
    new_run = np.ones(n, dtype=np.bool_)
    new_run[1:] = (o[1:] != o[:-1]) | (p[1:] != p[:-1] + 1)
    run = np.maximum.accumulate(np.where(new_run, at, 0))
    last = np.ones(n, dtype=np.bool_)
    last[:-1] = new_run[1:]
    where = np.empty(n, dtype=np.int64)  # task index -> its place in ``order``
    where[order] = at
    ranges = np.zeros(n, dtype=np.int64)  # per scanned place: its united ranges,
    first = np.zeros(n, dtype=np.int64)  # the first at ``first`` in ``r_s``/``r_e``
    r_s: list[I64] = []
    r_e: list[I64] = []
    size = 0
    parts = []

    def scanned(places: I64) -> None:
        nonlocal size
        tasks = np.sort(viable(order[places]))  # (union_hits: by task)
        h = scan(tasks)
        parts.append(h)
        u_t, u_s, u_e, _ = union_hits(*h)
        x = where[u_t]
        np.add.at(ranges, x, 1)
        head = np.flatnonzero(np.concatenate(([len(x) > 0], x[1:] != x[:-1])))
        first[x[head]] = size + head
        r_s.append(u_s)
        r_e.append(u_e)
        size += len(u_s)

    anchors = np.flatnonzero(((at - run) % stride == 0) | last)
    scanned(anchors)
    left, right = anchors[:-1], anchors[1:]
    while True:
        gap = (run[left] == run[right]) & (right - left > 1)
        left, right = left[gap], right[gap]
        if not len(left):
            break
        both = (ranges[left] > 0) & (ranges[left] == ranges[right])
        a, z = left[both], right[both]
        inside = z - a - 1
        places = np.repeat(a + 1 - np.cumsum(inside) + inside, inside) + np.arange(
            int(inside.sum()))
        a_, z_ = np.repeat(a, inside), np.repeat(z, inside)
        c = ranges[a_]  # each inferred place: c rows, the j-th from the j-th ranges
        j = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
        y, a_, z_ = np.repeat(places, c), np.repeat(a_, c), np.repeat(z_, c)
        all_s, all_e = np.concatenate(r_s), np.concatenate(r_e)
        fa, fz = first[a_] + j, first[z_] + j
        lo = all_s[fa] + (all_s[fz] - all_s[fa]) * (y - a_) // (z_ - a_)
        hi = all_e[fa] + (all_e[fz] - all_e[fa]) * (y - a_) // (z_ - a_)
        parts.append((order[y], lo, hi, np.full(len(y), INFERRED)))
        left, right = left[~both], right[~both]
        mid = (left + right) // 2
        scanned(mid)
        left, right = np.concatenate((left, mid)), np.concatenate((mid, right))
    h_t, h_s, h_e, h_x = (np.concatenate([part[c] for part in parts]) for c in range(4))
    by = np.lexsort((h_s, h_t))
    return h_t[by], h_s[by], h_e[by], h_x[by]


class InferAligner(Aligner):
    """``Aligner`` whose scan is ``infer_between`` with ``stride`` (a power of two > 1)."""

    def __init__(self, config: EngineConfig, stride: int) -> None:
        super().__init__(config)
        self.stride = stride

    def scan(self, t: Tasks) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:
        w = self.weights
        t.gather_empty(np.arange(len(t)))  # (which are scanned is known only later)

        def viable(tasks: I64) -> I64:
            return tasks[passage_align.viable_tasks(
                t.t_p[tasks], t.t_o[tasks], t.lid, t.count, t.start, t.ords, t.rects,
                t.q_empty, w.w_match, w.w_empty, w.need, self.cfg.max_repeats)]

        def scan(tasks: I64) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:
            h_t, h_s, h_e, h_x = passage_align.scan_tasks(
                t.t_p[tasks], t.t_o[tasks], t.lid, t.count, t.start, t.ords, t.rects,
                t.q_empty, t.empty_keys, t.empty_off, t.empty_lr, w.w_match, w.w_empty,
                w.need, self.cfg.min_len, self.spans.k, self.cfg.max_repeats)
            return tasks[h_t], h_s, h_e, h_x

        return infer_between(t.t_p, t.t_o, self.stride, viable, scan)
