"""MonoActive, the query side: a query's k min-hashes, the compact windows of a text that
collide with them, and the alignment of a query against a text (Zhang et al., VLDB'26).

The windows and the hash functions are built in :mod:`dupalign.passage.monoactive`, whose
conventions (inclusive rectangles, half-open results, keys and their order) hold here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dupalign.passage.interval_scan import scan_rectangles
from dupalign.passage.monoactive import (
    I64,
    U64,
    IdfFn,
    Mode,
    TfFn,
    TfMode,
    Windows,
    compact_windows,
    icws_hash,
    idf_values,
    multiset_hash,
    tf_weights,
)


def query_minhashes(
    token_hashes: U64,
    k: int,
    mode: Mode = "multiset",
    tf: TfMode | TfFn = "raw",
    idf: IdfFn | Mapping[int, float] | None = None,
) -> U64:
    """The k min-hash keys of a whole sequence (the query), comparable with window keys."""
    th = np.asarray(token_hashes, dtype=np.uint64)
    return query_minhashes_many(th, np.zeros(1, np.int64), np.full(1, th.size, np.int64), k,
                                mode, tf, idf)[0]


def query_minhashes_many(
    token_hashes: U64,
    starts: I64,
    ends: I64,
    k: int,
    mode: Mode = "multiset",
    tf: TfMode | TfFn = "raw",
    idf: IdfFn | Mapping[int, float] | None = None,
) -> U64:
    """``query_minhashes`` of every range ``token_hashes[starts[p]:ends[p]]`` (a page's
    query passages), shape ``(P, k)``. All ranges go through each hash function in one
    numpy pass: a passage is a few dozen tokens, so one pass per passage and function cost
    its numpy call overhead many times over (the weighted lifecycle oracle spent ~80 % of
    its time there)."""
    th = np.asarray(token_hashes, dtype=np.uint64)
    lo, hi = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if np.any(hi <= lo) or np.any(lo < 0) or np.any(hi > th.size):
        raise ValueError("empty query" if np.any(hi <= lo) else "range outside the sequence")
    n_p, lengths = len(lo), hi - lo
    if n_p == 0:
        return np.empty((0, k), dtype=np.uint64)
    off = np.concatenate(([0], np.cumsum(lengths)))
    pid = np.repeat(np.arange(n_p, dtype=np.int64), lengths)
    tok = th[np.arange(off[-1], dtype=np.int64) - np.repeat(off[:-1] - lo, lengths)]
    order = np.lexsort((tok, pid))  # by passage, then token
    tok, pid = tok[order], pid[order]
    first = np.ones(len(tok), dtype=np.bool_)
    first[1:] = (tok[1:] != tok[:-1]) | (pid[1:] != pid[:-1])
    run = np.flatnonzero(first)  # each (passage, distinct token)
    counts = np.diff(np.append(run, len(tok)))
    out = np.empty((n_p, k), dtype=np.uint64)
    if mode == "multiset":
        # all (t, x) with x <= f(t, Q), each passage's rows at off[p]:off[p + 1]
        ent_x = np.arange(len(tok), dtype=np.int64) - np.repeat(run, counts) + 1
        for fn in range(k):
            out[:, fn] = np.minimum.reduceat(multiset_hash(tok, ent_x, fn), off[:-1])
        return out
    if mode != "weighted":
        raise ValueError(f"unknown mode {mode!r}")
    u_tok, u_pid = tok[run], pid[run]
    w = tf_weights(counts.astype(np.int64), tf) * idf_values(u_tok, idf)
    if not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError("weights must be finite and positive")
    u_off = np.searchsorted(u_pid, np.arange(n_p, dtype=np.int64))  # each passage's first
    for fn in range(k):
        ln_a, z, key = icws_hash(u_tok, w, fn)
        # the min of each passage: by ln a, then larger z, then token hash
        out[:, fn] = key[np.lexsort((u_tok, -z, ln_a, u_pid))[u_off]]
    return out


def colliding(windows: Windows, query_keys: U64) -> Windows:
    """Windows whose key equals the query's min-hash for the same hash function."""
    q = np.asarray(query_keys, dtype=np.uint64)
    return windows.select(windows.key == q[windows.fn])


def threshold_count(k: int, theta: tuple[int, int]) -> int:
    """⌈k p / q⌉: collisions needed for an estimate ``m / k >= p / q`` (exact integers)."""
    p, q = theta
    if not (isinstance(p, int | np.integer) and isinstance(q, int | np.integer)) or not (
        0 < p <= q
    ):
        raise ValueError("theta must be a fraction p/q of integers with 0 < p <= q")
    return -((-k * int(p)) // int(q))


def align_weighted(
    query_token_hashes: U64,
    text_token_hashes: U64,
    k: int,
    theta: tuple[int, int] = (1, 2),
    mode: Mode = "multiset",
    tf: TfMode | TfFn = "raw",
    idf: IdfFn | Mapping[int, float] | None = None,
    min_len: int = 1,
    windows: Windows | None = None,
) -> list[tuple[int, int]]:
    """Longest text subsequences whose estimated (multiset or weighted) Jaccard with the query
    is at least ``theta = p/q``: half-open ``(text_start, text_end)`` ranges, sorted.

    A subsequence qualifies iff at least ⌈k p/q⌉ of its k min-hashes equal the query's and it
    has at least ``min_len`` tokens; only those not strictly inside another qualifying one
    are reported. ``windows`` may pass the text's precomputed ``compact_windows``.
    """
    need = threshold_count(k, theta)
    if windows is None:
        windows = compact_windows(text_token_hashes, k, mode, tf, idf)
    hit = colliding(windows, query_minhashes(query_token_hashes, k, mode, tf, idf))
    if len(hit) < need:
        return []
    return _scan(hit, need, min_len)


def _scan(hit: Windows, need: int, min_len: int) -> list[tuple[int, int]]:
    return [
        (int(s), int(e))
        for s, e in scan_rectangles(
            hit.a.astype(np.int64),
            hit.b.astype(np.int64),
            hit.c.astype(np.int64),
            hit.d.astype(np.int64),
            np.ones(len(hit), dtype=np.int64),
            need,
            min_len,
        )
    ]
