"""Alignment tasks as self-contained rectangles: gathered by the index, scanned by align.

The index stage (dupalign.passages ``find_tasks``) knows the inverted lists and reads the
empty windows; the align stage must run without them (on other cores, later on other
machines). So each (passage, earlier page) task carries its rectangles, gathered here
with ``passage_align._gather``, and ``scan_gathered`` runs the interval scan on them alone.
Same rectangles in the same order as ``passage_align.scan_tasks``, so the same hits.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from dupalign.interval_scan import scan_kernel
from dupalign.passage_align import I64, Bools, Ints, _drop_unreachable, _gather, _grow


@njit(cache=True)
def gather_tasks(
    task_p: I64, task_o: I64, lid: I64, n_before: I64, start: I64, ords: I64, rects: Ints,
    q_empty: Bools, empty_keys: I64, empty_off: I64, empty_lr: I64, w_match: int,
    w_empty: int,
) -> tuple[I64, I64]:  # fmt: skip
    """Every task's rectangles as CSR ``(off, rows)``: rows ``off[t]:off[t + 1]`` are
    ``(i_lo, i_hi, j_lo, j_hi, weight)``, weight ``-w_empty`` for an empty window."""
    per_task = n_before.sum() + empty_lr.shape[0]
    buf = np.empty((max(1, per_task), 5), dtype=np.int64)
    off = np.zeros(task_p.shape[0] + 1, dtype=np.int64)
    out = np.empty((max(1, per_task), 5), dtype=np.int64)
    for t in range(task_p.shape[0]):
        m = _gather(buf, task_p[t], task_o[t], lid, n_before, start, ords, rects, q_empty,
                    empty_keys, empty_off, empty_lr, w_match, w_empty)
        if off[t] + m > out.shape[0]:
            grown = np.empty((2 * (off[t] + m), 5), dtype=np.int64)
            grown[: off[t]] = out[: off[t]]
            out = grown
        out[off[t] : off[t] + m] = buf[:m]
        off[t + 1] = off[t] + m
    return off, out[: off[-1]].copy()


@njit(cache=True)
def scan_gathered(
    off: I64, rows: I64, rest: I64, w_match: int, need: int, min_len: int, k: int,
) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:  # fmt: skip
    """Interval scan of every task over its rectangles (``rest[t]``: the weight its matched
    windows must reach beyond the jointly empty bins).

    Returns ``(hit_task, start, end, estimate)``: every longest near-duplicate range of the
    earlier page (half-open units) per task, with ``N_mat / (k − N_emp)`` at its cell.
    """
    h_t = np.empty(16, dtype=np.int64)
    h_s = np.empty(16, dtype=np.int64)
    h_e = np.empty(16, dtype=np.int64)
    h_x = np.empty(16, dtype=np.float64)
    n_h = 0
    for t in range(off.shape[0] - 1):
        buf = rows[off[t] : off[t + 1]].copy()
        m = _drop_unreachable(buf, buf.shape[0], max(1, -(-rest[t] // w_match)))
        w = np.abs(buf[:m, 4])
        if m == 0 or w.sum() < need:
            continue
        s_out, e_out = scan_kernel(buf[:m, 0].copy(), buf[:m, 1].copy(), buf[:m, 2].copy(),
                                   buf[:m, 3].copy(), w, need, min_len)
        for y in range(s_out.shape[0]):
            i = s_out[y]
            j = e_out[y] - 1
            n_emp = 0
            n_all = 0
            for r in range(m):
                if buf[r, 0] <= i <= buf[r, 1] and buf[r, 2] <= j <= buf[r, 3]:
                    n_all += 1
                    if buf[r, 4] < 0:
                        n_emp += 1
            denom = k - n_emp
            if n_h == h_t.shape[0]:
                h_t, h_s, h_e = _grow(h_t, 2 * n_h), _grow(h_s, 2 * n_h), _grow(h_e, 2 * n_h)
                h_x2 = np.empty(2 * n_h, dtype=np.float64)
                h_x2[:n_h] = h_x
                h_x = h_x2
            h_t[n_h] = t
            h_s[n_h] = s_out[y]
            h_e[n_h] = e_out[y]
            h_x[n_h] = (n_all - n_emp) / denom if denom > 0 else 0.0
            n_h += 1
    return h_t[:n_h].copy(), h_s[:n_h].copy(), h_e[:n_h].copy(), h_x[:n_h].copy()
