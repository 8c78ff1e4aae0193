"""The recall audit of the index stage: capture what the index answered for a sampled page,
then, off the page's path, the exact answer beside it.

A page is sampled when a hash of the seed and its ordinal falls below ``audit.sample``
(deterministic: the same stream audits the same pages). While the index stage handles it
(``Indexer._decide``), the auditor keeps the page's near answer, its passages' sketches and
what the passage query saw (which of its lists were stop lists, which pages its lists held
before and after the ``max_list_read`` cut, which pages became tasks); once its matches are
known (``Indexer.finish``) the case is ready, and ``run_pending`` (called by the owner of
the engine after the page's output is delivered: ``scan`` after each page, the worker after
each commit) computes:

- near: every page before it within ``near.hamming`` by exhaustive search of the
  fingerprint table whose verification sketch passes the same CWS filter; a page found so
  and not by PSM is a miss of the probe budget;
- passages: every page of the reservoir (dupalign.audit.reservoir) before it that the exact
  alignment finds (dupalign.audit.exact); a page found so and not among the page's matches
  is a miss, told apart by cause: the alignment without the stop lists' bins finds
  nothing (``stop_list``); the page was a task (``align_cap``: max_matches, max_repeats);
  its entries were past the head of a list (``list_cut``); it was counted but not chosen
  (``candidate_cut``); else ``other``.

Counts go to a ``Tally`` kept in the store (dupalign.audit.recall).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dupalign.audit.exact import Windows, aligned, within_hamming
from dupalign.audit.recall import Tally
from dupalign.audit.reservoir import Reservoir, draw
from dupalign.config import EngineConfig
from dupalign.match import Match
from dupalign.near.cws import CwsFilter
from dupalign.near.index import NearIndex, NearState
from dupalign.passage import forward
from dupalign.passage.sketch import PassageState
from dupalign.passage.tasks import PassageTrace
from dupalign.store import records, tables
from dupalign.store.database import Store

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
MAX_PENDING = 64  # cases kept for run_pending; more (nobody runs them) are dropped


@dataclass
class Case:
    ordinal: int
    skip: frozenset[int]  # pages the page never matches (the version it replaces)
    fingerprint: int | None = None
    sketch: U64 | None = None
    near_found: frozenset[int] = frozenset()
    q_keys: U64 | None = None
    q_empty: npt.NDArray[np.bool_] | None = None
    trace: PassageTrace | None = None
    found: frozenset[int] | None = None  # every page the page matched (finish)
    population: int = 0  # pages stored before it (what the reservoir samples)
    unknown: npt.NDArray[np.bool_] | None = None  # [passage, bin] not known: not counted


@dataclass
class CaseResult:
    """One audited page: true pairs found and missed (by cause), per kind."""

    ordinal: int
    near: tuple[int, dict[str, int]] | None = None
    passage: tuple[int, dict[str, int]] | None = None
    missed: dict[str, list[int]] = field(default_factory=dict)  # kind -> missed pages


class Auditor:
    def __init__(self, store: Store, config: EngineConfig, sample: float,
                 read_only: bool = False) -> None:
        self.store = store
        self.config = config
        self.sample = sample
        self.seed = config.seed
        self._limit = int(sample * float(1 << 64))
        self.reservoir = Reservoir(store, config.audit.reservoir, config.seed, read_only)
        self.filter = CwsFilter(config.near.cws_samples, config.near.cws_threshold,
                                config.near.cws_error)
        theta = config.passage.theta_fraction
        self.p, self.q = theta.numerator, theta.denominator
        raw = records.log_get(store, "audit_tally", 0)
        self.tally = Tally() if raw is None else Tally.from_bytes(raw)
        self._parsed: dict[int, Windows] = {}  # the reservoir's pages, unpacked
        self.open: dict[int, Case] = {}
        self.ready: list[Case] = []
        self.dropped = 0

    # -- the index stage's side ----------------------------------------------------------
    def wants(self, ordinal: int) -> bool:
        return self.sample > 0 and draw(self.seed, ordinal, 2) < self._limit

    def capture(self, ordinal: int, skip: frozenset[int], near_state: NearState | None,
                near_found: Iterable[int], passage_state: PassageState | None,
                trace: PassageTrace | None, population: int) -> None:
        case = Case(ordinal, skip, near_found=frozenset(near_found), trace=trace,
                    population=population)
        if near_state is not None and near_state.indexed and near_state.fingerprint is not None:
            case.fingerprint, case.sketch = near_state.fingerprint, near_state.sketch
        if (passage_state is not None and passage_state.keys is not None
                and self.config.passage.mode == "oph"):
            case.q_keys, case.q_empty = passage_state.keys, passage_state.empty
        self.open[ordinal] = case

    def close(self, ordinal: int, matches: list[Match]) -> None:
        """The page's matches are known: the case waits for ``run_pending``."""
        case = self.open.pop(ordinal, None)
        if case is None:
            return
        found = {tables.ids.get(self.store, m.match_doc_id) for m in matches
                 if m.kind in ("exact", "near", "passage")}
        case.found = frozenset(o for o in found if o is not None)
        if len(self.ready) >= MAX_PENDING:
            self.ready.pop(0)
            self.dropped += 1
        self.ready.append(case)

    def offer(self, ordinal: int, state: PassageState | None) -> None:
        """A page was stored: the reservoir may keep it, with all its windows."""
        if state is None or state.rects is None or self.config.passage.mode != "oph":
            return
        if self.reservoir.slot_for(ordinal) is None:
            return
        r = state.rects
        self.reservoir.offer(ordinal, forward.pack_rects(
            r.bin, r.key, r.i_lo, r.i_hi, r.j_lo, r.j_hi, r.empty, np.flatnonzero(~r.empty)))

    def removed(self, ordinals: list[int]) -> None:
        self.reservoir.removed(ordinals)

    # -- off the page's path ---------------------------------------------------------------
    def run_pending(self, near: NearIndex) -> list[CaseResult]:
        """Audit the ready cases; their counts are added to the tally (kept in the store)."""
        if not self.ready:
            return []
        cases, self.ready = self.ready, []
        fps, ords = near.table.all_arrays()
        out = [self.audit_case(c, fps, ords, near.sketch_of) for c in cases]
        batch = self.store.batch()
        records.log_put(batch, "audit_tally", 0, self.tally.to_bytes())
        self.store.write(batch)
        return out

    def audit_case(self, case: Case, fps: U64, ords: I64, sketch_of: Any) -> CaseResult:
        res = CaseResult(case.ordinal)
        if case.fingerprint is not None and case.sketch is not None:
            truth = self.near_truth(case, fps, ords, sketch_of)
            missed = sorted(truth - case.near_found)
            res.near = (len(truth) - len(missed), {"budget": len(missed)})
            res.missed["near"] = missed
            self.tally.add("near", *res.near)
        if case.q_keys is not None and case.q_empty is not None and case.found is not None:
            hits, misses, missed, checked = self.passage_truth(case)
            res.passage = (hits, misses)
            res.missed["passage"] = missed
            # each pair checked stands for population / checked pairs of the page
            self.tally.add("passage", hits, misses, max(case.population, checked) / max(
                checked, 1))
        return res

    def near_truth(self, case: Case, fps: U64, ords: I64, sketch_of: Any) -> set[int]:
        assert case.fingerprint is not None and case.sketch is not None
        out = set()
        for o in within_hamming(fps, ords, case.fingerprint, self.config.near.hamming,
                                case.ordinal).tolist():
            other = sketch_of(o)
            if (o not in case.skip and other is not None
                    and self.filter.compare(case.sketch, other).decision == "similar"):
                out.add(o)
        return out

    def _windows(self, ordinal: int, raw: bytes) -> Windows:
        w = self._parsed.get(ordinal)
        if w is None:
            if len(self._parsed) >= 2 * self.reservoir.size:  # pages that left it go
                kept = {o for o, _ in self.reservoir.slots.values()}
                self._parsed = {o: v for o, v in self._parsed.items() if o in kept}
            w = self._parsed[ordinal] = Windows.from_record(raw)
        return w

    def passage_truth(self, case: Case) -> tuple[int, dict[str, int], list[int], int]:
        """Hits, misses by cause, the pages missed, and how many reservoir pages were
        checked."""
        assert case.q_keys is not None and case.q_empty is not None and case.found is not None
        min_len = self.config.passage.min_len
        hits, misses, missed = 0, dict.fromkeys(("stop_list", "list_cut", "candidate_cut",
                                                 "align_cap", "other"), 0), []
        t = case.trace or PassageTrace()
        checked = 0
        for o, raw in self.reservoir.pages(case.ordinal):
            if o in case.skip:
                continue
            checked += 1
            w = self._windows(o, raw)
            if not aligned(case.q_keys, case.q_empty, w, self.p, self.q, min_len,
                           case.unknown):
                continue
            if o in case.found:
                hits += 1
                continue
            missed.append(o)
            if t.stopped is not None and t.stopped.any() and not aligned(
                    case.q_keys, case.q_empty, w, self.p, self.q, min_len, t.stopped):
                misses["stop_list"] += 1
            elif o in t.tasks:
                misses["align_cap"] += 1
            elif o in t.beyond:
                misses["list_cut"] += 1
            elif t.heads_known and o in t.heads:
                misses["candidate_cut"] += 1
            else:
                misses["other"] += 1
        return hits, misses, missed, checked
