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

Not yet: the router as several partitions by id. Each would need every page's "is a row"
(a flag of the decision) to count the rows; here one router sees every page's sketch.
The learner's state is in memory (the single engine keeps it in its store).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from dupalign.config import EngineConfig
from dupalign.near.idf import IdfBuilder, IdfTable
from dupalign.near.index import NearState, refresh
from dupalign.near.prefix_shards import route, shard_of_fingerprint
from dupalign.near.psm_probes import probe_headers
from dupalign.near.simhash_table import SimhashTable
from dupalign.near.vosh import VolatilityModel
from dupalign.stages.directory import Decision
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
    """The router over ``n_near`` = 2^b near shards, reading every decision in sequence
    order (``route``) and every sweep (``forget``)."""

    def __init__(self, config: EngineConfig, learner: Learner, n_near: int) -> None:
        self.cfg = config.near
        self.learner = learner
        self.n_near, self.b = n_near, prefix_bits(n_near)
        self.rows: dict[int, int] = {}  # store ordinal -> fingerprint of every row
        self._width = SimhashTable()  # (its header width of a row count)

    def route(self, d: Decision, placed: Placed, exact: ExactAnswer | None,
              near: NearState | None) -> list[NearOps]:
        """The near shards' ops for decision ``d`` (placed by the ledger), with the stored
        page's exact answer and its near sketch (None: it has none). A query goes to every
        shard (each answers, so the combine knows how many to wait for)."""
        removed = None
        if placed.removed is not None and placed.removed in self.rows:
            removed = (placed.removed, self.rows[placed.removed])
        query = (d.kind == "stored" and exact is not None and exact.original is None
                 and near is not None and near.indexed)
        if not query:
            if removed is None:
                return []
            del self.rows[removed[0]]
            return [NearOps(d.seq, self._shard(removed[1]), removed=[removed])]
        assert near is not None and placed.ordinal is not None
        refresh(near, self.learner.idf, self.cfg.tf_mode)
        assert near.fingerprint is not None and near.W is not None and near.sketch is not None
        fp = near.fingerprint
        t = self._width.header_width(len(self.rows))
        offsets, headers = probe_headers([fp], near.W[None, :], t, self.cfg.hamming,
                                         self.cfg.probe_budget, self.learner.model)
        routed = route(offsets, headers, t, self.b)
        self.learner.learn(near)  # (after its probes: the model of the pages before)
        if removed is not None:
            del self.rows[removed[0]]
        self.rows[placed.ordinal] = fp
        q = NearQuery(fp, near.sketch, placed.ordinal)
        mine = self._shard(fp)
        return [NearOps(d.seq, s, q, t, p.rank, p.header,
                        [removed] if removed is not None and self._shard(removed[1]) == s
                        else None, s == mine)
                for s, p in enumerate(routed)]

    def forget(self, seq: int, expired: Iterable[Expired]) -> list[NearOps]:
        """A sweep before the page of sequence ordinal ``seq``: the rows it removes, by
        shard."""
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for e in expired:
            fp = self.rows.pop(e.ordinal, None)
            if fp is not None:
                by_shard.setdefault(self._shard(fp), []).append((e.ordinal, fp))
        return [NearOps(seq, s, removed=rows) for s, rows in sorted(by_shard.items())]

    def _shard(self, fingerprint: int) -> int:
        return int(shard_of_fingerprint(np.array([fingerprint], dtype=np.uint64), self.b)[0])
