"""The passage sketch of a page: what the passage index needs from the page alone.

A page's units (its words, or w-word shingles) are cut into query passages of
``query_len`` units with a ``stride`` (the last one flush right); each passage gets its
sketch (OPH: k min-hashes and empty bins; MonoActive, ``mode = "weighted"``: k hash
functions; ``mode = "weighted_oph"``: k bins of weight elements and empty bins), and the
page its compact windows (``Rects``), the units ranges on which a min-hash stays the same. All
of it is pure (no store, no index state): the sketch stage computes it
(``PassageSketcher.sketch_page``) on any core, and the distinct inverted lists that the
passages and the windows name (``query_lists``, ``window_lists``) with it, off the index
thread. The index stage (dupalign.passage.index) reads and writes the lists; the align
stage (dupalign.stages.align) scans the candidates' windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.passage import batch_align as passage_align
from dupalign.passage import monoactive, monoactive_query, weighted_oph
from dupalign.passage.distinct import distinct_lists
from dupalign.passage.oph import compact_windows, oph_bins, oph_values
from dupalign.passage.oph_page import oph_page, unit_keys
from dupalign.passage.positions import pack_positions, positions_record
from dupalign.text.hashing import mix64
from dupalign.text.tokens import Tokens

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
_SHINGLE_SALT = 0x5348494E


@dataclass
class Rects:
    """Windows as rectangles: subsequences T[i..j] with i in [i_lo, i_hi], j in [j_lo, j_hi]
    (0-based, inclusive), sharing min-hash ``key`` in ``bin`` (OPH bin or MonoActive hash
    function). ``empty`` marks OPH empty windows (their key is 0)."""

    bin: I64
    key: U64
    i_lo: I64
    i_hi: I64
    j_lo: I64
    j_hi: I64
    empty: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.bin.shape[0])


@dataclass
class PassageState:
    """The page's passage sketch (``PassageSketcher.sketch_page``: pure) and what it adds to
    the index (written by ``PassageIndex.stage``): its windows, its query passages
    ``[starts, ends)`` (units) with their sketches ``keys[P, k]`` / ``empty[P, k]``, its
    positions record (dupalign.passage.positions)."""

    rects: Rects | None
    n_units: int
    positions: bytes = b""  # the page's token character offsets, for spans that cite it
    starts: I64 | None = None
    ends: I64 | None = None
    keys: U64 | None = None
    empty: npt.NDArray[np.bool_] | None = None
    # the distinct lists of the passages and of the windows (``query_lists``,
    # ``window_lists``): page-only, so the sketch stage computes them off the index thread
    # (and the pickle between the pipeline's processes carries them)
    lists: tuple[I64, U64, I64] | None = None
    window_lists: tuple[I64, U64, I64] | None = None
    # the page's unit hashes: the forward stage keeps their high halves, from which it
    # rebuilds the windows (dupalign.passage.forward_units); the sketch stage's own, neither
    # pickled nor on the wire
    units: U64 | None = None


class PassageSketcher:
    """The passage sketch code for one engine configuration (no store: the sketch stage)."""

    def __init__(self, config: EngineConfig) -> None:
        self.cfg = config.passage
        self.k = self.cfg.k
        self._tf = cast(monoactive.TfMode, self.cfg.tf_mode)  # validated by PassageConfig
        self._unit_keys = unit_keys(self.cfg.shingle, _SHINGLE_SALT)

    # -- units: the tokens the alignment sees ------------------------------------------------
    def units(self, hashes: U64) -> U64:
        """Word hashes, or hashes of w-word shingles (unit i covers words [i, i + w))."""
        w = self.cfg.shingle
        if w == 1 or len(hashes) < w:
            return hashes if w == 1 else np.empty(0, dtype=np.uint64)
        acc = np.zeros(len(hashes) - w + 1, dtype=np.uint64)
        for x in range(w):
            acc = mix64(acc ^ hashes[x : len(hashes) - w + 1 + x], _SHINGLE_SALT + x)
        return acc

    def word_range(self, start: int, end: int) -> tuple[int, int]:
        """The words ``[start, end)`` of the units ``[start, end)``."""
        return word_range(start, end, self.cfg.shingle)

    # -- windows and sketches ---------------------------------------------------------------
    def windows(self, units: U64) -> Rects:
        if self.cfg.mode == "oph":
            w = compact_windows(oph_values(units), self.k)
            emp = w.empty
            return Rects(w.bin, w.value, w.l, np.where(emp, w.r, w.c), np.where(emp, w.l, w.c),
                         w.r, emp)
        if self.cfg.mode == "weighted_oph":
            ww = weighted_oph.compact_windows(units, self.k, self._tf)
            return Rects(ww.bin, ww.key, ww.a, ww.b, ww.c, ww.d, ww.empty)
        mw = monoactive.compact_windows(units, self.k, "weighted", tf=self._tf)
        return Rects(mw.fn.astype(np.int64), mw.key, mw.a.astype(np.int64),
                     mw.b.astype(np.int64), mw.c.astype(np.int64), mw.d.astype(np.int64),
                     np.zeros(len(mw), dtype=np.bool_))

    # -- the page's passages ----------------------------------------------------------------
    def sketch_page(self, hashes: U64, tokens: Tokens) -> PassageState:
        """Everything the passage index needs from the page alone (no store access): OPH
        pages in one kernel (dupalign.passage.oph_page), the other modes step by step."""
        cfg = self.cfg
        if not cfg.enabled or cfg.mode != "oph":
            return self.sketch_page_steps(hashes, tokens)
        n = len(hashes) - cfg.shingle + 1 if len(hashes) >= cfg.shingle else 0
        if n == 0 or n + cfg.shingle - 1 < cfg.min_len:
            return PassageState(None, n)
        o = oph_page(np.ascontiguousarray(hashes, dtype=np.uint64), self._unit_keys, self.k,
                     cfg.query_len, cfg.stride, np.asarray(tokens.starts, dtype=np.int64),
                     np.asarray(tokens.ends, dtype=np.int64))
        return PassageState(Rects(*o.windows), n, positions_record(o.fit, o.record), o.starts,
                            o.ends, o.keys, o.empty, o.lists, o.window_lists, o.units)

    def sketch_page_steps(self, hashes: U64, tokens: Tokens) -> PassageState:
        """``sketch_page`` step by step (the oracle of the OPH kernel in the tests)."""
        if not self.cfg.enabled:
            return PassageState(None, 0)
        units = self.units(hashes)
        n = len(units)
        if not self.cfg.enabled or n == 0 or n + self.cfg.shingle - 1 < self.cfg.min_len:
            return PassageState(None, n)
        starts = np.asarray(passage_starts(n, self.cfg.query_len, self.cfg.stride),
                            dtype=np.int64)
        ends = np.minimum(n, starts + self.cfg.query_len)
        keys, empty = self.sketches(units, starts, ends)
        state = PassageState(self.windows(units), n, pack_positions(tokens, units), starts,
                             ends, keys, empty, units=units)
        query_lists(state)  # both kept in the state: found here, off the index thread
        window_lists(state)
        return state

    def sketches(self, units: U64, starts: I64, ends: I64) -> tuple[U64, npt.NDArray[np.bool_]]:
        """The sketch of every passage: ``(mins[P, k], empty[P, k])``."""
        if self.cfg.mode == "oph":
            hvals = oph_values(units)
            return passage_align.passage_sketches(hvals, oph_bins(hvals, self.k), starts, ends,
                                                  self.k)
        if self.cfg.mode == "weighted_oph":
            return weighted_oph.sketches(weighted_oph.samples(units, self.k, self._tf), starts,
                                         ends, self.k)
        keys = monoactive_query.query_minhashes_many(units, starts, ends, self.k, "weighted",
                                               tf=self._tf)
        return keys, np.zeros(keys.shape, dtype=np.bool_)


def word_range(start: int, end: int, shingle: int) -> tuple[int, int]:
    """The words covered by the units ``[start, end)`` of w-word shingles (w = ``shingle``)."""
    return start, end - 1 + shingle


def query_lists(state: PassageState) -> tuple[I64, I64, I64, U64, I64]:
    """The distinct inverted lists named by the page's passage sketches, in key order
    (``l_bins``, ``l_keys``), with the (passage, bin) cells that name them (``rows``,
    ``bins``) and each cell's list (``inverse``): what ``find_tasks`` reads the heads of."""
    assert state.keys is not None and state.empty is not None
    rows, bins = np.nonzero(~state.empty)
    if state.lists is None:
        state.lists = distinct_lists(bins.astype(np.int64), state.keys[rows, bins])
    l_bins, l_keys, inverse = state.lists
    return rows, bins, l_bins, l_keys, inverse


def window_lists(state: PassageState) -> tuple[I64, U64, I64]:
    """The distinct inverted lists of the page's non-empty windows (in key order), and the
    list of each such window: the lists ``stage`` appends the page to."""
    assert state.rects is not None
    if state.window_lists is None:
        r = state.rects
        nonempty = np.flatnonzero(~r.empty)
        state.window_lists = distinct_lists(r.bin[nonempty], r.key[nonempty])
    return state.window_lists


def passage_starts(n: int, length: int, stride: int) -> list[int]:
    """Starts of query passages covering [0, n): every ``stride``, the last one flush right."""
    if n <= length:
        return [0]
    starts = list(range(0, n - length + 1, stride))
    if starts[-1] != n - length:
        starts.append(n - length)
    return starts
