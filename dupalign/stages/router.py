"""The router of the near stage and the learner upstream of it (docs/pipeline.md, "The
shape": ``[router]``). The page's near sketch and the upstream outputs in, ``NearOps`` for
the near shards out (dupalign.stages.near_shard).

For a stored page that is not an exact copy and is near-indexed, the router does what
``NearIndex.search`` does before its lookup: the fingerprint under the idf table in force
(``refresh``), the probes of a lookup on one table of all the rows (``probe_headers`` at
the width of their count: rule 2, with the volatility model in force), split between the
``2^b`` prefix shards (``route``); then the page's row goes to the shard of its prefix.
It keeps the rows of the near table (store ordinal -> fingerprint: their count is the
probes' width, and a removal names the row's fingerprint) from upstream data alone: the
decisions placed by its ``Ledger`` (a changed revisit's or a delete's removed version, in
the decision's order: the replaced version is still a row during the page's query), the
exact answers (a copy adds no row), the pages' sketches (only near-indexed pages have
one) and the sweeps.

The ``Learner`` keeps what ``NearIndex`` learns while pages arrive, until the last of
``near.idf_freeze_at``'s counts (rule 3): the idf document counts (each added page's
distinct tokens; a table frozen at each count is in force from the next page on) and the
volatility model (each added page's weight sums, after its own probes were made). It is one
serial computation over the added pages, which the router reads page by page until the
last freeze, and never after.

The router is partitioned by page id: a partition reads the sketches of its ids' pages
only, and counts the rows of every id from the decisions (``Decision.near``) and exact
answers. The learner is one, fed by every partition's pages in sequence order. Its state
is in memory (the single engine keeps the learner's in its store); a router's rows are in
memory too, or in a store (``StoredRows``, dupalign.stages.router_store: a role's, which its
changelog restores).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

import numpy as np

from dupalign.config import EngineConfig
from dupalign.near.idf import IdfBuilder, IdfTable
from dupalign.near.index import NearState, refresh
from dupalign.near.prefix_shards import route, shard_of_fingerprint
from dupalign.near.psm_probes import probe_headers
from dupalign.near.simhash_table import SimhashTable
from dupalign.near.volatility import VolatilityModel
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.ledger import Expired, Placed
from dupalign.stages.near_shard import NearOps, NearQuery


def prefix_bits(n_shards: int) -> int:
    """b for ``n_shards`` = 2^b near shards."""
    b = n_shards.bit_length() - 1
    if n_shards < 1 or 1 << b != n_shards:
        raise ValueError(f"near shards must be a power of 2, got {n_shards}")
    return b


class Learner:
    """The idf tables and the volatility model in force, learned from the pages added to
    the near table in order (``learn``) until the last freeze, as ``NearIndex`` learns."""

    def __init__(self, config: EngineConfig) -> None:
        self.freeze_at = tuple(config.near.idf_freeze_at)
        self.tables: list[IdfTable] = [IdfTable.uniform()]
        self.builder: IdfBuilder | None = IdfBuilder() if self.freeze_at else None
        self.model = VolatilityModel()

    @property
    def idf(self) -> IdfTable:
        return self.tables[-1]

    @property
    def learning(self) -> bool:
        return self.builder is not None

    def learn(self, state: NearState) -> None:
        """A page added to the near table, its fingerprint under the table in force."""
        if self.builder is None:
            return
        assert state.W is not None and state.unique is not None
        self.model.update(state.W)
        self.builder.add_document(state.unique, distinct=True)
        version = len(self.tables)
        if self.builder.n_docs >= self.freeze_at[version - 1]:
            self.tables.append(self.builder.freeze(version))
            if version == len(self.freeze_at):
                self.builder = None


class Router:
    """Partition ``shard`` of ``n_shards`` of the router (by page id, as the directory), over
    ``n_near`` = 2^b near shards, reading every decision in sequence order (``route``) and
    every sweep (``forget``). It counts every row of the table (a stored page that is
    near-indexed, ``Decision.near``, and not an exact copy) and knows the fingerprints of
    its own ids' rows: a version removed is of the same id, and a sweep's rows are removed
    by the partitions of their ids."""

    def __init__(self, config: EngineConfig, learner: Learner, n_near: int, shard: int = 0,
                 n_shards: int = 1, rows: MutableMapping[int, int | None] | None = None
                 ) -> None:
        """``rows``: where the rows are kept (a role's: dupalign.stages.router_store; None:
        a dict, in memory)."""
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} of {n_shards}")
        self.cfg = config.near
        self.learner = learner
        self.shard, self.n_shards = shard, n_shards
        self.n_near, self.b = n_near, prefix_bits(n_near)
        # store ordinal -> fingerprint of every row (None: of another partition's id)
        self.rows: MutableMapping[int, int | None] = {} if rows is None else rows
        self._width = SimhashTable()  # (its header width of a row count)

    def owns(self, doc_id: str) -> bool:
        return directory_owner(doc_id, self.n_shards) == self.shard

    def route(self, d: Decision, placed: Placed, exact: ExactAnswer | None,
              near: NearState | None = None) -> list[NearOps]:
        """The near shards' ops for decision ``d`` (placed by the ledger), with the stored
        page's exact answer and, for a page of this partition's ids, its near sketch (None:
        it has none). A query goes to every shard (each answers, so the combine knows how
        many to wait for)."""
        removed = None
        if placed.removed is not None and placed.removed in self.rows:
            removed = (placed.removed, self.rows[placed.removed])
        row = (d.kind == "stored" and d.near and exact is not None and exact.original is None)
        if row and not self.owns(d.doc_id):  # (its removed version is of the same id)
            assert placed.ordinal is not None
            if removed is not None:
                del self.rows[removed[0]]
            self.rows[placed.ordinal] = None
            return []
        if not row:
            if removed is None:
                return []
            del self.rows[removed[0]]
            return self._removal(d.seq, [removed])
        if near is None or not near.indexed or placed.ordinal is None:
            raise ValueError(f"near-indexed page {d.seq} needs its near sketch")
        refresh(near, self.learner.idf, self.cfg.tf_mode)
        assert near.fingerprint is not None and near.W is not None and near.sketch is not None
        fp = near.fingerprint
        t = self._width.header_width(len(self.rows))  # (the replaced version still one)
        offsets, headers = probe_headers([fp], near.W[None, :], t, self.cfg.hamming,
                                         self.cfg.probe_budget, self.learner.model)
        routed = route(offsets, headers, t, self.b)
        self.learner.learn(near)  # (after its probes: the model of the pages before)
        removals = {op.shard: op.removed for op in self._removal(d.seq, [removed] if removed
                                                                 else [])}
        if removed is not None:
            del self.rows[removed[0]]
        self.rows[placed.ordinal] = fp
        q = NearQuery(fp, near.sketch, placed.ordinal)
        mine = self._shard(fp)
        return [NearOps(d.seq, s, q, t, p.rank, p.header, removals.get(s), s == mine)
                for s, p in enumerate(routed)]

    def forget(self, seq: int, expired: Iterable[Expired]) -> list[NearOps]:
        """A sweep before the page of sequence ordinal ``seq``: the rows it removes of this
        partition's ids, by shard."""
        return self._removal(seq, [(e.ordinal, self.rows.pop(e.ordinal)) for e in expired
                                   if e.ordinal in self.rows])

    def _removal(self, seq: int, rows: list[tuple[int, int | None]]) -> list[NearOps]:
        """The removal of ``rows`` (ordinal, fingerprint: None of another partition's id)."""
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for ordinal, fp in rows:
            if fp is not None:
                by_shard.setdefault(self._shard(fp), []).append((ordinal, fp))
        return [NearOps(seq, s, removed=r) for s, r in sorted(by_shard.items())]

    def _shard(self, fingerprint: int) -> int:
        return int(shard_of_fingerprint(np.array([fingerprint], dtype=np.uint64), self.b)[0])
