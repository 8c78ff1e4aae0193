"""The near stage as shards by fingerprint prefix (docs/pipeline.md, step 3).

Shard s of ``2^b`` holds, for the near-indexed pages whose fingerprint's top b bits are s,
their PSM rows (fingerprint, store ordinal) and their verification sketches, in a store of
its own. A query page's probes are made once, with the width of all the rows together and
the volatility model in force (``dupalign.near.psm_probes.probe_headers``), and routed to
the shards their range meets (``dupalign.near.prefix_shards.route``). Each shard answers its
probes from its rows and verifies its candidates with the CWS filter itself: it holds their
sketches, so no candidate travels. ``combine_near`` joins the answers into what the single
``NearIndex.search`` finds: every verified row (PSM_A), or the one table's PSM_F candidate,
if it verifies (PSM_F: the candidate is the best over the shards by probe, distance and
ordinal, verified or not, as one table would pick it before verifying).

A shard's answer for page n depends on its rows below n alone, which the exact stage's
answers and the ledger's removals (upstream) decide: it never waits for a stage downstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.near.cws import CwsFilter
from dupalign.near.prefix_shards import PrefixShard, ShardProbes
from dupalign.near.simhash_table import SimhashTable
from dupalign.store import tables
from dupalign.store.database import Store
from dupalign.wire.versions import NEAR_ANSWER, NEAR_OPS, pack_array, unpack_array

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class NearQuery:
    """What a shard needs of a query page: its fingerprint (under the idf table in force),
    its verification sketch, and its store ordinal (only earlier pages count)."""

    fingerprint: int
    sketch: U64
    before: int


@dataclass(frozen=True)
class NearAnswer:
    """One shard's rows for a batch of queries: row i is ``ordinal[i]`` at ``hamming[i]``
    from query ``query[i]``, found at its probe ``rank[i]``, with the CWS estimate
    ``est[i]`` and whether it passed (PSM_A keeps only those that passed)."""

    query: I64
    ordinal: I64
    hamming: I64
    rank: I64
    est: F64
    similar: npt.NDArray[np.bool_]


@dataclass
class NearOps:
    """What the router (dupalign.stages.router) sends near shard ``shard`` for the page of
    sequence ordinal ``seq``, applied in this order: the ``query`` (the page, stored at
    ``query.before``) with the probes of it routed here (``rank``, t-bit ``header``); the
    rows (ordinal, fingerprint) ``removed`` (the version the page replaces, a deleted page,
    or a sweep's); the page's own row when ``add`` (its fingerprint is of this prefix)."""

    seq: int
    shard: int
    query: NearQuery | None = None
    t: int = 0
    rank: I64 | None = None
    header: U64 | None = None
    removed: list[tuple[int, int]] | None = None
    add: bool = False

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {"seq": self.seq, "shard": self.shard}
        q = self.query
        if q is not None:
            d["q"] = [q.before, q.fingerprint, pack_array(q.sketch, "<u8"), self.t,
                      pack_array(self.rank, "<u4"), pack_array(self.header, "<u8")]
        if self.removed:
            d["removed"] = [list(r) for r in self.removed]
        if self.add:
            d["add"] = True
        return NEAR_OPS.pack(d)

    @classmethod
    def from_bytes(cls, raw: bytes) -> NearOps:
        d = NEAR_OPS.unpack(raw)
        ops = cls(d["seq"], d["shard"], removed=[(o, f) for o, f in d.get("removed", [])],
                  add=bool(d.get("add")))
        if "q" in d:
            before, fp, sketch, ops.t, rank, header = d["q"]
            ops.query = NearQuery(fp, unpack_array(sketch, "<u8"), before)
            ops.rank = unpack_array(rank, "<u4", np.int64)
            ops.header = unpack_array(header, "<u8")
        return ops


def answer_to_bytes(seq: int, shard: int, a: NearAnswer) -> bytes:
    """The wire form of shard ``shard``'s answer for the page of sequence ordinal ``seq``."""
    return NEAR_ANSWER.pack({"seq": seq, "shard": shard, "ordinal": pack_array(a.ordinal, "<i8"),
                             "hamming": pack_array(a.hamming, "u1"),
                             "rank": pack_array(a.rank, "<u4"), "est": pack_array(a.est, "<f8"),
                             "similar": pack_array(a.similar, "?")})


def answer_shard(raw: bytes) -> int:
    """The shard of ``answer_to_bytes``, its arrays left as bytes."""
    return int(NEAR_ANSWER.unpack(raw)["shard"])


def answer_from_bytes(raw: bytes) -> tuple[int, int, NearAnswer]:
    """(seq, shard, answer) of ``answer_to_bytes``: one query, the page's."""
    d = NEAR_ANSWER.unpack(raw)
    ordinal = unpack_array(d["ordinal"], "<i8", np.int64)
    return d["seq"], d["shard"], NearAnswer(
        np.zeros(len(ordinal), dtype=np.int64), ordinal,
        unpack_array(d["hamming"], "u1", np.int64), unpack_array(d["rank"], "<u4", np.int64),
        unpack_array(d["est"], "<f8", np.float64), unpack_array(d["similar"], "?", np.bool_))


class NearShard:
    """Shard ``shard`` of ``2^b`` of the near stage, over its own store."""

    def __init__(self, store: Store, config: EngineConfig, shard: int, b: int) -> None:
        cfg = config.near
        self.store = store
        self.h, self.first = cfg.hamming, cfg.mode == "first"
        self.filter = CwsFilter(cfg.cws_samples, cfg.cws_threshold, cfg.cws_error)
        fps, ords = tables.simhash.load(store)
        self.rows = PrefixShard(shard, b, SimhashTable.from_arrays(fps, ords, ordered=True))

    def __len__(self) -> int:
        return len(self.rows.table)

    def add(self, ordinal: int, fingerprint: int, sketch: U64) -> None:
        """A near-indexed page of this shard's prefix, stored at ``ordinal``."""
        self.rows.check([fingerprint])  # before the write: a refused page leaves no row
        batch = self.store.batch()
        tables.simhash.put(batch, fingerprint, ordinal)
        tables.cws.put(batch, ordinal, np.asarray(sketch, dtype="<u8").tobytes())
        self.store.write(batch)
        self.rows.table.add(fingerprint, ordinal)

    def remove(self, pages: list[tuple[int, int]]) -> None:
        """Pages (ordinal, fingerprint) of this shard that left the store."""
        if not pages:
            return
        batch = self.store.batch()
        for ordinal, fingerprint in pages:
            tables.simhash.delete(batch, fingerprint, ordinal)
        tables.cws.remove(batch, (o for o, _ in pages))
        self.store.write(batch)
        self.rows.remove([f for _, f in pages], [o for o, _ in pages])

    def answer(self, probes: ShardProbes, queries: list[NearQuery], t: int) -> NearAnswer:
        """The rows within h of each query in the buckets of its probes routed here, each
        verified against the query's sketch."""
        found = self.rows.answer(probes, [q.fingerprint for q in queries], t, self.h,
                                 [q.before for q in queries], self.first)
        est = np.zeros(len(found.ordinal))
        similar = np.zeros(len(found.ordinal), dtype=bool)
        sketches = tables.cws.get_many(self.store, found.ordinal.tolist())
        for i, (qi, raw) in enumerate(zip(found.query.tolist(), sketches, strict=True)):
            if raw is None:  # (every row of the table has its sketch, written together)
                raise RuntimeError(f"near shard {self.rows.shard}: no sketch for the row of "
                                   f"ordinal {int(found.ordinal[i])}")
            result = self.filter.compare(queries[qi].sketch, np.frombuffer(raw, dtype="<u8"))
            est[i], similar[i] = round(result.est_jaccard, 4), result.decision == "similar"
        keep = similar | self.first  # PSM_F: the candidate counts even when it fails
        # rows by (query, ordinal): the order within a bucket is the table's layout (a
        # restored shard's differs from one that never stopped), and combine_near reads
        # rows as a set, so the wire form (a changelog, a test's bytes) does not depend on it
        rows = np.flatnonzero(keep)
        rows = rows[np.lexsort((found.ordinal[rows], found.query[rows]))]
        return NearAnswer(found.query[rows], found.ordinal[rows], found.hamming[rows],
                          found.rank[rows], est[rows], similar[rows])

    def apply(self, ops: NearOps) -> NearAnswer | None:
        """The router's ops for one page (or a sweep), in their order; the query's answer."""
        answer = None
        q = ops.query
        if q is not None:
            assert ops.rank is not None and ops.header is not None
            probes = ShardProbes(np.zeros(len(ops.rank), dtype=np.int64), ops.rank, ops.header)
            answer = self.answer(probes, [q], ops.t)
        self.remove(ops.removed or [])
        if ops.add:
            assert q is not None
            self.add(q.before, q.fingerprint, q.sketch)
        return answer


def combine_near(answers: list[NearAnswer], n_queries: int, first: bool
                 ) -> list[list[tuple[int, int, float]]]:
    """Per query, its near duplicates (ordinal, hamming, estimate) by ordinal, as the single
    ``NearIndex.search`` finds them."""
    out: list[list[tuple[int, int, float]]] = [[] for _ in range(n_queries)]
    best: dict[int, tuple[int, int, int, float, bool]] = {}
    for a in answers:
        for q, o, d, r, e, ok in zip(a.query.tolist(), a.ordinal.tolist(), a.hamming.tolist(),
                                     a.rank.tolist(), a.est.tolist(), a.similar.tolist(),
                                     strict=True):
            if not first:
                out[q].append((o, d, e))
            elif q not in best or (r, d, o) < best[q][:3]:
                best[q] = (r, d, o, e, ok)
    for q, (_, d, o, e, ok) in best.items():
        if ok:
            out[q].append((o, d, e))
    return [sorted(rows) for rows in out]
