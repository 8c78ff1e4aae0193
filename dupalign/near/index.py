"""Whole-document near duplicates: weighted simhash + PSM lookup + CWS verification.

State kept across pages, and how it survives a restart:
- the PSM table (fingerprint → ordinal), rebuilt from the ``simhash`` family at open;
- the volatility model (bit flip probabilities): each page's update logged in ``meta`` with
  the page (512 bytes), the whole model (4.6 KB) written instead every ``MODEL_CHECKPOINT``
  updates, when the log is cleared; at open, the checkpoint and the log replayed in order
  give the model exactly as it was after the last page written. It learns only until the
  last idf freeze (``idf_freeze_at[-1]`` pages), then stays: learned from consecutive pages,
  it is a serial computation that a pipeline split by key can run during a warm-up only
  (docs/pipeline.md, rule 3). The probes use the model *in force* (``in_force``): the one
  learned up to the latest idf freeze, taken with the table (the prior before the first),
  written to ``meta`` at each freeze; so the pipeline's routers need the learner at the
  freeze points only, never page by page (docs/pipeline.md, rule 7);
- idf tables: version 0 is uniform; version v is frozen from the document frequencies of
  the first ``idf_freeze_at[v-1]`` indexed pages and written to ``meta``. Until the last
  freeze the pages' distinct token hashes are kept in ``idf_pending`` so that the counts
  can be rebuilt at open. A page's fingerprint is computed with the version current when
  it arrived; the verification sketch does not depend on idf.

Verification: a candidate is a near duplicate if the resemblance (Jaccard) of the two pages'
word ``near.shingle``-shingle sets reaches ``cws_threshold``, estimated from K-min-hash sketches
under the CWS early-termination filter. Shingles and not the weighted bag of words, because
a bag of words ignores order: on llvm-13/14 docs, 20-word templated pages listing operands
("src … xnack_mask vcc trap m0 …") and long pages with reordered tables had weighted word
Jaccard ≥ 0.8 but 5-shingle Jaccard 0.4–0.8, and made most false positives. Binary
shingles and not ICWS over weighted shingles, because ICWS takes logarithms and
exponentials for every (feature, sample) and a page has ~1 shingle per token; a min-hash is
one mix per (feature, sample), and min-hash is consistent sampling with unit weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.kernel_cache import njit
from dupalign.near.cws import (
    CwsFilter,
    FilterStats,
    shingle_minhash_into,
    shingle_minhash_keys,
    shingle_minhash_sketch,
)
from dupalign.near.idf import (
    IdfBuilder,
    IdfTable,
    TfMode,
    counted_weights,
    tf_table,
    weights_by_directory,
)
from dupalign.near.psm import psm_search_one
from dupalign.near.simhash import BITS, simhash_into, weighted_simhash
from dupalign.near.simhash_table import SimhashTable
from dupalign.near.volatility import VolatilityModel
from dupalign.store import tables
from dupalign.store.database import Batch, Store

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
_SHINGLE_SALT = 0x5A1
MODEL_CHECKPOINT = 1024  # volatility model updates between two writes of the whole model


def verification_sketch(hashes: U64, K: int, seed: int, shingle: int) -> U64:
    """The page's K-min-hash sketch of its word ``shingle``-shingles (token order kept)."""
    return shingle_minhash_sketch(hashes, shingle, _SHINGLE_SALT, K, seed)


@dataclass
class NearState:
    """The page's whole-document sketch (``near_sketch``: pure) and what it adds to the index,
    written by ``stage``. ``idf_version`` names the idf table the fingerprint was computed
    with; the index recomputes it if another table is in force by the page's turn."""

    indexed: bool
    unique: U64 | None = None  # distinct token hashes (ascending) and their counts
    counts: npt.NDArray[np.int64] | None = None
    idf_version: int = 0
    fingerprint: int | None = None
    W: npt.NDArray[np.float64] | None = None
    sketch: U64 | None = None
    frozen: IdfTable | None = None
    frozen_model: bytes | None = None  # the volatility model taken with ``frozen``


def distinct_counts(hashes: U64) -> tuple[U64, npt.NDArray[np.int64]]:
    """``np.unique(hashes, return_counts=True)`` (its twin in the tests) in one kernel:
    numpy's unique costs more in calls than in work on a page's ~1,000 tokens."""
    return _distinct_kernel(np.ascontiguousarray(hashes, dtype=np.uint64))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a slot from the top bits
_PROBES_PER_TOKEN = 8  # past this many probes a token on average: sort all instead


@njit(cache=True, nogil=True)
def _distinct_kernel(h: U64) -> tuple[U64, npt.NDArray[np.int64]]:
    """Distinct values of ``h`` ascending and their counts, counted in a hash table so that
    only the distinct values are sorted: a page has about half as many as tokens, and
    numba's sort of all of them took 27-32 % of the near kernel (Boost, llvm). Values that
    collide in the table (a page made to: token hashes are public functions) make long
    probes; past ``_PROBES_PER_TOKEN`` a token, all values are sorted instead."""
    n = h.shape[0]
    bits = 1
    while (1 << bits) < 2 * n:  # at most half full
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    keys = np.empty(mask + 1, dtype=np.uint64)
    counts = np.zeros(mask + 1, dtype=np.int64)
    found = np.empty(n, dtype=np.uint64)
    m = 0
    budget = _PROBES_PER_TOKEN * n
    for i in range(n):
        x = h[i]
        j = np.int64((x * _GOLDEN) >> shift)
        while counts[j] != 0 and keys[j] != x:
            j = (j + 1) & mask
            budget -= 1
        if budget < 0:
            return _sorted_runs(h)
        if counts[j] == 0:
            keys[j] = x
            found[m] = x
            m += 1
        counts[j] += 1
    uniq = np.sort(found[:m])
    out = np.empty(m, dtype=np.int64)
    for t in range(m):
        x = uniq[t]
        j = np.int64((x * _GOLDEN) >> shift)
        while keys[j] != x:  # (every distinct value is in the table)
            j = (j + 1) & mask
        out[t] = counts[j]
    return uniq, out


@njit(cache=True, nogil=True)
def _sorted_runs(h: U64) -> tuple[U64, npt.NDArray[np.int64]]:
    ordered = np.sort(h)
    uniq = np.empty(h.shape[0], dtype=np.uint64)
    counts = np.empty(h.shape[0], dtype=np.int64)
    n = _runs_kernel(ordered, uniq, counts)
    return uniq[:n], counts[:n]


@njit(cache=True, nogil=True)
def _runs_kernel(ordered: U64, uniq: U64, counts: npt.NDArray[np.int64]) -> int:
    n = 0
    for i in range(ordered.shape[0]):
        if n and ordered[i] == uniq[n - 1]:
            counts[n - 1] += 1
        else:
            uniq[n] = ordered[i]
            counts[n] = 1
            n += 1
    return n


def near_sketch(hashes: U64, idf: IdfTable, config: EngineConfig) -> NearState:
    """Everything the near index needs from the page alone: simhash + W under ``idf``, the
    verification sketch, the distinct tokens (idf counts). One kernel (``distinct_counts``,
    ``counted_weights``, ``weighted_simhash`` and ``verification_sketch`` are its twins):
    as their calls, the page paid more for the calls than for the work."""
    cfg = config.near
    state = NearState(indexed=cfg.enabled and len(hashes) >= cfg.min_tokens)
    if not state.indexed:
        return state
    h = np.ascontiguousarray(hashes, dtype=np.uint64).ravel()
    W = np.empty(BITS, dtype=np.float64)
    state.sketch = np.empty(cfg.cws_samples, dtype=np.uint64)
    state.unique, state.counts, fp, weighted = _near_kernel(
        h, idf.keys, idf.values, idf.directory, float(idf.default_idf),
        tf_table(cast(TfMode, cfg.tf_mode)), min(cfg.shingle, h.size),
        *shingle_minhash_keys(_SHINGLE_SALT, cfg.cws_samples, config.seed), W, state.sketch)
    if weighted:
        state.fingerprint, state.W, state.idf_version = int(fp), W, idf.version
    else:  # a count past the tf table: numpy's weights
        _fingerprint(state, idf, cfg.tf_mode)
    return state


@njit(cache=True, nogil=True)
def _near_kernel(h: U64, keys: U64, values: npt.NDArray[np.float32],
                 directory: npt.NDArray[np.int32], default: float,
                 tf: npt.NDArray[np.float64], span: int, mixes: U64, sample_keys: U64,
                 W: npt.NDArray[np.float64], sketch: U64, minhash: bool = True
                 ) -> tuple[U64, npt.NDArray[np.int64], np.uint64, bool]:
    """(distinct hashes, counts, fingerprint, weighted); W and the verification sketch into
    theirs (not ``minhash``: ``sketch`` is the page's already). Not weighted (fingerprint 0,
    W unset): a count outside the tf table."""
    uniq, counts = _distinct_kernel(h)
    n = uniq.shape[0]
    if minhash:
        shingle_minhash_into(h, span, mixes, sample_keys, sketch)
    weights = np.empty(n, dtype=np.float64)
    if not weights_by_directory(uniq, counts, keys, values, directory, default, tf, weights):
        return uniq, counts, np.uint64(0), False
    return uniq, counts, simhash_into(uniq, weights, W), True


def near_sketch_many(hashes: list[U64], idf: IdfTable, config: EngineConfig,
                     known: list[U64 | None] | None = None) -> list[NearState]:
    """``near_sketch`` of each page's token hashes (its oracle in the tests), the pages'
    kernels in one call: on short pages (Boost: ~375 tokens) the calls around the kernel
    cost about a fifth of it. The pages' arrays are views of the batch's. ``known``: a
    page's verification sketch where the caller has it already (a page with the same
    tokens stored: an exact copy), its K min-hashes not computed again: they were most of
    an exact copy's kernel."""
    cfg = config.near
    states = [NearState(indexed=cfg.enabled and len(h) >= cfg.min_tokens) for h in hashes]
    page = [x for x, s in enumerate(states) if s.indexed]
    if not page:
        return states
    given = [None] * len(page) if known is None else [known[x] for x in page]
    parts = [np.ascontiguousarray(hashes[x], dtype=np.uint64).ravel() for x in page]
    bounds = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in parts], out=bounds[1:])
    W = np.empty((len(parts), BITS), dtype=np.float64)
    sketches = np.empty((len(parts), cfg.cws_samples), dtype=np.uint64)
    uniq, counts = np.empty(bounds[-1], dtype=np.uint64), np.empty(bounds[-1], dtype=np.int64)
    ends, fps = np.empty(len(parts), dtype=np.int64), np.empty(len(parts), dtype=np.uint64)
    weighted = np.empty(len(parts), dtype=np.bool_)
    minhash = np.ones(len(parts), dtype=np.bool_)
    for i, sketch in enumerate(given):
        if sketch is not None and sketch.shape == (cfg.cws_samples,):
            sketches[i], minhash[i] = sketch, False
    _near_many_kernel(np.concatenate(parts), bounds, idf.keys, idf.values, idf.directory,
                      float(idf.default_idf), tf_table(cast(TfMode, cfg.tf_mode)), cfg.shingle,
                      *shingle_minhash_keys(_SHINGLE_SALT, cfg.cws_samples, config.seed), W,
                      sketches, minhash, uniq, counts, ends, fps, weighted)
    for i, x in enumerate(page):
        state, a, b = states[x], bounds[i], ends[i]
        state.unique, state.counts, state.sketch = uniq[a:b], counts[a:b], sketches[i]
        if weighted[i]:
            state.fingerprint, state.W, state.idf_version = int(fps[i]), W[i], idf.version
        else:  # a count past the tf table: numpy's weights
            _fingerprint(state, idf, cfg.tf_mode)
    return states


@njit(cache=True, nogil=True)
def _near_many_kernel(h: U64, bounds: I64, keys: U64, values: npt.NDArray[np.float32],
                      directory: npt.NDArray[np.int32], default: float,
                      tf: npt.NDArray[np.float64], shingle: int, mixes: U64, sample_keys: U64,
                      W: npt.NDArray[np.float64], sketches: U64,
                      minhash: npt.NDArray[np.bool_], uniq: U64, counts: I64, ends: I64,
                      fps: U64, weighted: npt.NDArray[np.bool_]) -> None:
    """``_near_kernel`` of each page ``h[bounds[i]:bounds[i + 1]]``: its distinct hashes and
    counts into ``uniq`` and ``counts`` from ``bounds[i]`` to ``ends[i]``, W, sketch (unless
    not ``minhash[i]``: given), fingerprint and ``weighted`` into row or item i."""
    for i in range(bounds.shape[0] - 1):
        a, b = bounds[i], bounds[i + 1]
        u, c, fp, ok = _near_kernel(h[a:b], keys, values, directory, default, tf,
                                    min(shingle, b - a), mixes, sample_keys, W[i], sketches[i],
                                    minhash[i])
        m = u.shape[0]
        uniq[a:a + m] = u
        counts[a:a + m] = c
        ends[i], fps[i], weighted[i] = a + m, fp, ok


def refresh(state: NearState, idf: IdfTable, tf_mode: str) -> None:
    """The fingerprint of ``state`` under ``idf``, if it was sketched under another table."""
    if state.indexed and state.idf_version != idf.version:
        _fingerprint(state, idf, tf_mode)


def _fingerprint(state: NearState, idf: IdfTable, tf_mode: str) -> None:
    assert state.unique is not None and state.counts is not None
    weights = counted_weights(state.unique, state.counts, idf,
                              cast(TfMode, tf_mode))  # validated by NearConfig
    fp, W = weighted_simhash(state.unique, weights)
    state.fingerprint, state.W, state.idf_version = fp, W, idf.version


@dataclass
class NearCounters:
    lookups: int = 0
    probes: int = 0
    candidates: int = 0
    filter: FilterStats = field(default_factory=FilterStats)


class NearIndex:
    """``removal_only``: for an engine that only removes pages (``dupalign delete``): the PSM
    table (a read of the whole ``simhash`` family, about 1.4 s at 2M pages) and the idf
    counts are not loaded, since a removal deletes the pages' rows from the families alone
    and the next full open builds the table from them; searching or adding pages raises."""

    def __init__(self, store: Store, config: EngineConfig, next_ordinal: int,
                 removal_only: bool = False) -> None:
        self.store = store
        self.removal_only = removal_only
        self.cfg = config.near
        self.seed = config.seed
        self.filter = CwsFilter(self.cfg.cws_samples, self.cfg.cws_threshold, self.cfg.cws_error)
        self.counters = NearCounters()
        self.tables: list[IdfTable] = [IdfTable.uniform()]
        while (raw := tables.idf_tables.get(store, len(self.tables))) is not None:
            self.tables.append(IdfTable.from_bytes(raw))
        self.builder: IdfBuilder | None = None
        if len(self.tables) <= len(self.cfg.idf_freeze_at) and not removal_only:
            self.builder = IdfBuilder()
            for _, value in tables.idf_pending.items(store):
                self.builder.add_document(np.frombuffer(value, dtype="<u8"))
        raw_model = tables.volatility.get(store)
        self.model = VolatilityModel.from_bytes(raw_model) if raw_model else VolatilityModel()
        self._logged = 0  # updates in the log since the checkpoint
        for raw in tables.volatility_log.values(store):
            self.model.replay(np.frombuffer(raw, dtype="<f8").astype(np.float64))
            self._logged += 1
        self.in_force = self._model_in_force(store)
        self._table: SimhashTable | None = None
        if not removal_only:
            fps, ords = tables.simhash.load(store)  # by (fingerprint, ordinal)
            self._table = SimhashTable.from_arrays(fps, ords, ordered=True)
        self._staged: dict[int, int] = {}  # ordinal -> fingerprint of a staged removal
        # the verification sketches of pages staged but not written yet (the index stage's
        # pending batch: dupalign.stages.pending), None when each page is written at once
        self.pending_sketches: dict[int, bytes] | None = None

    def _model_in_force(self, store: Store) -> VolatilityModel:
        """The model taken at the latest freeze (the prior before the first). A store
        written before the model was taken (none kept, a table frozen) uses the model
        learned so far: the same past the last freeze, close to it before."""
        raw = tables.volatility_frozen.get(store)
        if raw is not None:
            return VolatilityModel.from_bytes(raw)
        if len(self.tables) > 1:
            return VolatilityModel.from_bytes(self.model.to_bytes())
        return VolatilityModel()

    @property
    def table(self) -> SimhashTable:
        """The PSM table: fingerprint -> ordinal of every near-indexed page."""
        if self._table is None:
            raise RuntimeError("the near index was opened for removal only: it has no "
                               "fingerprint table to search or add to")
        return self._table

    @property
    def idf(self) -> IdfTable:
        return self.tables[-1]

    def refresh(self, state: NearState) -> None:
        """The fingerprint under the idf table in force, if ``state`` was sketched under an
        older one (before the last freeze, or by a sketch role, which has no store)."""
        refresh(state, self.idf, self.cfg.tf_mode)

    def search(self, state: NearState, ordinal: int) -> list[tuple[int, int, float]]:
        """Verified near duplicates among pages before ``ordinal``: (ordinal, hamming, est)."""
        return self.verify(state, self.candidates(state, ordinal))

    def candidates(self, state: NearState, ordinal: int) -> list[tuple[int, int]]:
        """The PSM lookup: (ordinal, hamming) of the pages before ``ordinal`` within the
        hamming bound in the probed buckets (the near stage's shards verify them:
        dupalign.stages.near_shard)."""
        if not state.indexed:
            return []
        self.refresh(state)
        assert state.fingerprint is not None and state.W is not None
        self.counters.lookups += 1
        candidates, probes = psm_search_one(
            self.table, state.fingerprint, np.ascontiguousarray(state.W, dtype=np.float64),
            self.cfg.hamming, self.cfg.probe_budget, self.cfg.mode == "first", self.in_force,
            ordinal)
        self.counters.probes += probes
        self.counters.candidates += len(candidates)
        return [(other, hamming) for other, hamming in candidates if other < ordinal]

    def verify(self, state: NearState, candidates: list[tuple[int, int]]
               ) -> list[tuple[int, int, float]]:
        """The candidates whose stored verification sketch says they are near duplicates
        (a candidate without one here is skipped: not near-indexed, or another shard's)."""
        found = []
        for other, hamming in candidates:
            other_sketch = self.sketch_of(other)
            if other_sketch is None:
                continue
            assert state.sketch is not None
            result = self.filter.compare(state.sketch, other_sketch)
            self.counters.filter.add(result)
            if result.decision == "similar":
                found.append((other, hamming, round(result.est_jaccard, 4)))
        return found

    def stage(self, batch: Batch, ordinal: int, state: NearState | None) -> None:
        """Put the page's entries into ``batch`` (the in-memory side waits for ``commit``)."""
        if state is None or not state.indexed or state.fingerprint is None:
            return
        if self.removal_only:  # (its idf counts are not loaded: it would freeze wrong ones)
            raise RuntimeError("the near index was opened for removal only: it adds no page")
        assert state.sketch is not None and state.unique is not None and state.W is not None
        tables.simhash.put(batch, state.fingerprint, ordinal)
        self.put_sketch(batch, ordinal, state.sketch)
        if self.builder is None:  # past the last idf freeze: the model stays as it is
            return
        w = self.model.update(state.W)
        if self._logged + 1 >= MODEL_CHECKPOINT:
            tables.volatility.put(batch, self.model.to_bytes())
            tables.volatility_log.clear(batch)
            self._logged = 0
        else:
            tables.volatility_log.put(batch, ordinal, w.astype("<f8", copy=False).tobytes())
            self._logged += 1
        tables.idf_pending.put(batch, ordinal, state.unique.astype("<u8", copy=False).tobytes())
        version = len(self.tables)
        if self.builder.n_docs + 1 >= self.cfg.idf_freeze_at[version - 1]:
            builder = IdfBuilder.from_bytes(self.builder.to_bytes())
            builder.add_document(state.unique, distinct=True)
            state.frozen = builder.freeze(version)
            tables.idf_tables.put(batch, version, state.frozen.to_bytes())
            state.frozen_model = self.model.to_bytes()  # (after this page's update)
            tables.volatility_frozen.put(batch, state.frozen_model)
            if version == len(self.cfg.idf_freeze_at):
                tables.idf_pending.delete_through(batch, ordinal)

    def keep(self, batch: Batch, ordinal: int, state: NearState | None) -> None:
        """A page stored as an exact copy of another: only its verification sketch, so that
        a later version of its id relates to it (``Indexer._changed``; docs/pipeline.md,
        rule 5). No row in the table, nothing learned: a copy adds nothing to the search."""
        if state is not None and state.indexed and state.sketch is not None:
            self.put_sketch(batch, ordinal, state.sketch)

    def put_sketch(self, batch: Batch, ordinal: int, sketch: U64) -> None:
        """Store the page's verification sketch."""
        raw = sketch.astype("<u8", copy=False).tobytes()
        tables.cws.put(batch, ordinal, raw)
        if self.pending_sketches is not None:
            self.pending_sketches[ordinal] = raw

    def commit(self, ordinal: int, state: NearState | None) -> None:
        if state is None or not state.indexed or state.fingerprint is None:
            return
        self.table.add(state.fingerprint, ordinal)
        if self.builder is not None:
            assert state.unique is not None
            self.builder.add_document(state.unique, distinct=True)
            if state.frozen is not None:
                self.tables.append(state.frozen)
                assert state.frozen_model is not None
                self.in_force = VolatilityModel.from_bytes(state.frozen_model)
                if len(self.tables) > len(self.cfg.idf_freeze_at):
                    self.builder = None

    # -- removal (revisits, deletes, retention) --------------------------------------------
    def stage_removal(self, batch: Batch, pages: list[tuple[int, int | None]]) -> None:
        """Delete the entries of ``pages`` (ordinal, fingerprint or None) from ``batch``: the
        fingerprint row and the verification sketch. Not undone (README, "Known limits"):
        the volatility model, which only orders probes, and the idf document counts."""
        for ordinal, fingerprint in pages:
            if fingerprint is not None:
                tables.simhash.delete(batch, fingerprint, ordinal)
                self._staged[ordinal] = fingerprint
        tables.cws.remove(batch, (o for o, _ in pages))

    def commit_removal(self, ordinals: list[int]) -> None:
        """After the removal's batch is written: the PSM table without those pages (their
        fingerprints known from ``stage_removal``: the table finds rows by fingerprint)."""
        rows = [(self._staged.pop(o), o) for o in ordinals if o in self._staged]
        if self._table is not None:  # (removal only: the family alone; a full open reads it)
            self._table.remove([f for f, _ in rows], [o for _, o in rows])

    def sketch_of(self, ordinal: int) -> U64 | None:
        """A stored page's verification sketch (None: the page is not near-indexed)."""
        pending = self.pending_sketches
        raw = pending.get(ordinal) if pending else None
        if raw is None:
            raw = tables.cws.get(self.store, ordinal)
        return None if raw is None else np.frombuffer(raw, dtype="<u8")

    def stats(self) -> dict[str, Any]:
        f = self.counters.filter
        return {
            "near_table_size": len(self.table),
            "near_table_bytes": self.table.nbytes,
            "idf_version": len(self.tables) - 1,
            "near_lookups": self.counters.lookups,
            "near_candidates": self.counters.candidates,
            "cws_pairs": f.pairs,
            "cws_samples_saved": f.samples_saved,
        }
