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
serial computation over the added pages; at each freeze it hands the routers a ``Frozen``
record (the table and the model taken then: rule 7), and nothing between freezes. Each
router's ``InForce`` counts the pages learned from the decisions and exact answers and
needs the learner's record only when that count reaches a freeze.

The router is partitioned by page id: a partition reads the sketches of its ids' pages
only, and counts the rows of every id from the decisions (``Decision.near``) and exact
answers. The learner is one, fed by every partition's pages in sequence order (a role's
state: dupalign/service/roles/stage_learner.py). A router's rows are in memory, or in a
store (``StoredRows``, dupalign.stages.router_store: a role's, which its changelog
restores).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass

import msgpack
import numpy as np
import numpy.typing as npt

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


@dataclass(frozen=True)
class Frozen:
    """What the learner sends at a freeze: table ``version`` (v >= 1), frozen when
    ``idf_freeze_at[v - 1]`` pages had been learned, and the volatility model learned from
    the same pages; both in force from the next page on (rule 7)."""

    version: int
    table: IdfTable
    model: VolatilityModel

    def to_bytes(self) -> bytes:
        return bytes(msgpack.packb([self.version, self.table.to_bytes(),
                                    self.model.to_bytes()]))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Frozen:
        version, table, model = msgpack.unpackb(raw)
        return cls(int(version), IdfTable.from_bytes(table), VolatilityModel.from_bytes(model))


class Learner:
    """What ``NearIndex`` learns from the pages added to the near table, in sequence
    order (``learn``), until the last freeze: the idf document counts and the volatility
    model (each page's weights under the table in force). One serial computation, upstream
    of the routers, which need its ``Frozen`` records only (``InForce``)."""

    def __init__(self, config: EngineConfig) -> None:
        self.freeze_at = tuple(config.near.idf_freeze_at)
        self.tf_mode = config.near.tf_mode
        self.tables: list[IdfTable] = [IdfTable.uniform()]
        self.builder: IdfBuilder | None = IdfBuilder() if self.freeze_at else None
        self.model = VolatilityModel()

    @classmethod
    def restored(cls, config: EngineConfig, tables: Iterable[IdfTable],
                 pending: Iterable[npt.NDArray[np.uint64]], model: VolatilityModel | None
                 ) -> Learner:
        """A learner as it was: the tables it froze, the distinct tokens of each page it
        learned (in order; none needed past the last freeze) and its model."""
        learner = cls(config)
        learner.tables += list(tables)
        if len(learner.tables) > len(learner.freeze_at):
            learner.builder = None
        elif learner.builder is not None:
            for unique in pending:
                learner.builder.add_document(unique, distinct=True)
        if model is not None:
            learner.model = model
        return learner

    @property
    def idf(self) -> IdfTable:
        return self.tables[-1]

    @property
    def learning(self) -> bool:
        return self.builder is not None

    def learn(self, state: NearState) -> Frozen | None:
        """A page added to the near table (its fingerprint made again under the table in
        force if it was sketched under another); the freeze it completes, if any."""
        if self.builder is None:
            return None
        refresh(state, self.idf, self.tf_mode)
        assert state.W is not None and state.unique is not None
        self.model.update(state.W)
        self.builder.add_document(state.unique, distinct=True)
        version = len(self.tables)
        if self.builder.n_docs < self.freeze_at[version - 1]:
            return None
        self.tables.append(self.builder.freeze(version))
        if version == len(self.freeze_at):
            self.builder = None
        return Frozen(version, self.tables[-1], VolatilityModel.from_bytes(self.model.to_bytes()))


class InForce:
    """The idf table and the volatility model in force at a router's next page: it counts
    the pages learned (``learned``: every stored page that is near-indexed and not an
    exact copy, from the decisions and exact answers, which every router reads) and takes
    the learner's ``Frozen`` records (``take``). When the count reaches a freeze, the
    page after it needs that freeze's record (``ready``): the routers wait for the learner
    at the freeze points alone."""

    def __init__(self, config: EngineConfig, learned: int = 0) -> None:
        self.freeze_at = tuple(config.near.idf_freeze_at)
        self.learned = learned
        self.frozen: dict[int, Frozen] = {}
        self._uniform, self._prior = IdfTable.uniform(), VolatilityModel()

    @property
    def version(self) -> int:
        """The version in force: the freezes the learned pages have reached."""
        return sum(1 for n in self.freeze_at if n <= self.learned)

    def ready(self) -> bool:
        v = self.version
        return v == 0 or v in self.frozen

    def take(self, frozen: Frozen) -> None:
        self.frozen[frozen.version] = frozen

    @property
    def idf(self) -> IdfTable:
        v = self.version
        return self._uniform if v == 0 else self._frozen(v).table

    @property
    def model(self) -> VolatilityModel:
        v = self.version
        return self._prior if v == 0 else self._frozen(v).model

    def _frozen(self, v: int) -> Frozen:
        got = self.frozen.get(v)
        if got is None:
            raise RuntimeError(f"idf table {v} in force ({self.learned} pages learned) "
                               "and not received from the learner")
        return got


class Router:
    """Partition ``shard`` of ``n_shards`` of the router (by page id, as the directory), over
    ``n_near`` = 2^b near shards, reading every decision in sequence order (``route``) and
    every sweep (``forget``). It counts every row of the table (a stored page that is
    near-indexed, ``Decision.near``, and not an exact copy) and knows the fingerprints of
    its own ids' rows: a version removed is of the same id, and a sweep's rows are removed
    by the partitions of their ids. It also keeps the fingerprint of its ids' exact copies
    (``kept``), so that a changed revisit's distance to the version it replaces
    (``relate``) is the engine's: the directory, upstream of the idf tables, leaves it out."""

    def __init__(self, config: EngineConfig, in_force: InForce, n_near: int, shard: int = 0,
                 n_shards: int = 1, rows: MutableMapping[int, int | None] | None = None,
                 kept: MutableMapping[int, int | None] | None = None) -> None:
        """``rows``, ``kept``: where the rows and the copies' fingerprints are kept (a
        role's: dupalign.stages.router_store; None: dicts, in memory)."""
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} of {n_shards}")
        self.cfg = config.near
        self.in_force = in_force
        self.shard, self.n_shards = shard, n_shards
        self.n_near, self.b = n_near, prefix_bits(n_near)
        # store ordinal -> fingerprint of every row (None: of another partition's id)
        self.rows: MutableMapping[int, int | None] = {} if rows is None else rows
        # store ordinal -> fingerprint of an exact copy of this partition's ids
        self.kept: MutableMapping[int, int | None] = {} if kept is None else kept
        self._width = SimhashTable()  # (its header width of a row count)

    def owns(self, doc_id: str) -> bool:
        return directory_owner(doc_id, self.n_shards) == self.shard

    @staticmethod
    def relates(d: Decision) -> bool:
        """Whether the page of ``d`` has a revisit distance from the router of its id (the
        combine waits for it): a changed revisit of a near-indexed page."""
        return d.kind == "stored" and d.removed is not None and d.near

    def relate(self, d: Decision, placed: Placed, near: NearState | None) -> int | None:
        """The Hamming distance of a changed revisit (``relates``, of this partition's
        ids) to the version it replaces, the fingerprints under the tables in force at
        their turns (None: the old version had none), as ``Indexer._changed``. Before
        ``route`` of the same decision."""
        if near is None or not near.indexed:
            raise ValueError(f"page {d.seq} needs its near sketch")
        old = placed.removed
        old_fp = None if old is None else self.rows.get(old, self.kept.get(old))
        if old_fp is None:
            return None
        refresh(near, self.in_force.idf, self.cfg.tf_mode)
        assert near.fingerprint is not None
        return (int(near.fingerprint) ^ int(old_fp)).bit_count()

    def route(self, d: Decision, placed: Placed, exact: ExactAnswer | None,
              near: NearState | None = None) -> list[NearOps]:
        """The near shards' ops for decision ``d`` (placed by the ledger), with the stored
        page's exact answer and, for a page of this partition's ids, its near sketch (None:
        it has none). A query goes to every shard (each answers, so the combine knows how
        many to wait for)."""
        removed = None
        if placed.removed is not None and placed.removed in self.rows:
            removed = (placed.removed, self.rows[placed.removed])
        if placed.removed is not None:
            self.kept.pop(placed.removed, None)
        row = (d.kind == "stored" and d.near and exact is not None and exact.original is None)
        if (d.kind == "stored" and d.near and not row and self.owns(d.doc_id)
                and near is not None and near.indexed and placed.ordinal is not None):
            refresh(near, self.in_force.idf, self.cfg.tf_mode)  # (a copy: for a revisit)
            self.kept[placed.ordinal] = near.fingerprint
        if row and not self.owns(d.doc_id):  # (its removed version is of the same id)
            assert placed.ordinal is not None
            if removed is not None:
                del self.rows[removed[0]]
            self.rows[placed.ordinal] = None
            self.in_force.learned += 1
            return []
        if not row:
            if removed is None:
                return []
            del self.rows[removed[0]]
            return self._removal(d.seq, [removed])
        if near is None or not near.indexed or placed.ordinal is None:
            raise ValueError(f"near-indexed page {d.seq} needs its near sketch")
        refresh(near, self.in_force.idf, self.cfg.tf_mode)
        assert near.fingerprint is not None and near.W is not None and near.sketch is not None
        fp = near.fingerprint
        t = self._width.header_width(len(self.rows))  # (the replaced version still one)
        offsets, headers = probe_headers([fp], near.W[None, :], t, self.cfg.hamming,
                                         self.cfg.probe_budget, self.in_force.model)
        routed = route(offsets, headers, t, self.b)
        self.in_force.learned += 1  # (after its probes: the learner adds it)
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
        gone = list(expired)
        for e in gone:
            self.kept.pop(e.ordinal, None)
        return self._removal(seq, [(e.ordinal, self.rows.pop(e.ordinal)) for e in gone
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
