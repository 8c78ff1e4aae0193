"""The inverted lists as a stage partitioned by list key (bin, min-hash): shard s of S owns
the lists ``list_owner`` gives it, over a store of its own, and answers every query page
with its *partial*: the heads of the page's lists it owns (docs/pipeline.md, "The shape":
``[lists ×S]``). The combine joins the S partials (``combine_lists``) and selects the
page's alignment tasks from them (``PassageIndex.tasks_of``), as the single ``Indexer``
does from its own lists.

The shard's list state is a ``PassageIndex`` over its store, as the single ``Indexer``
keeps it (the same code: list heads, the ``max_list_read`` cut, stop lists, appends,
packed runs, and per page a forward record of its windows in these lists, which a removal
visits). What differs is who drives it: the upstream stages' outputs, read in sequence
order:

- every decision of the page directory, placed by the shard's own ``Ledger``
  (dupalign.stages.directory, dupalign.stages.ledger), and at each sweep point the
  ledger's sweep (``forget``);
- the exact stage's answer of every stored page (dupalign.stages.exact): an exact copy
  queries no list and adds no window (exact before near);
- the page's windows and query lists in this shard's lists (``ListWindows``, cut by the
  sketch stage: ``list_windows``).

For a stored page that is not an exact copy, in the single engine's order: its partial,
from the lists as the pages before it left them (the version it replaces is still in
them and does not count towards a stop list); then, in one WriteBatch, the removal of that
version and the page's windows. A delete removes its version, a sweep its pages. So the
partial of page n is a function of the decisions, exact answers and windows up to n
(upstream) and of nothing else: no peer list shard (a list lives in one shard, with its
stop-list decision and its cut) and no stage downstream.

Stop lists need no rule change: a list becomes one at the first query that reads it
holding more than ``max_list`` entries of pages other than the version the query page
replaces, and it holds the windows of the stored pages that were not exact copies, minus
those removed, minus those written after it became one. Every term is upstream data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.passage.index import PassageIndex
from dupalign.passage.list_run import RunPage, query_run
from dupalign.passage.lists import files as list_files
from dupalign.passage.sketch import I64, U64, PassageState, Rects, query_lists
from dupalign.stages.directory import Decision
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.ledger import Expired, Placed
from dupalign.store import tables
from dupalign.store.database import Store
from dupalign.text.hashing import mix64
from dupalign.wire.versions import LIST_PARTIAL, LIST_WINDOWS, pack_array, unpack_array

Bools = npt.NDArray[np.bool_]
Heads = tuple[Bools, I64, I64, I64]  # per list: stop list?, start, head length; the ordinals
_LIST_SALT = 0x5348415244  # "SHARD"


def list_owner(bins: I64, keys: U64, n_shards: int) -> I64:
    """The shard of each inverted list (bin, min-hash)."""
    mixed = mix64(np.asarray(keys, dtype=np.uint64) ^ np.asarray(bins).astype(np.uint64),
                  _LIST_SALT)
    return (mixed % np.uint64(n_shards)).astype(np.int64)


def owned_part(state: PassageState, shard: int, n_shards: int) -> PassageState | None:
    """The page's non-empty windows in the lists of ``shard`` (None: there are none)."""
    r = state.rects
    if r is None:
        return None
    idx = np.flatnonzero(~r.empty)
    return _windows(state, idx[list_owner(r.bin[idx], r.key[idx], n_shards) == shard])


def owned_parts(state: PassageState | None, n_shards: int) -> list[PassageState | None]:
    """``owned_part`` for every shard, the owners computed once (a page is split S ways:
    ``owned_part`` per shard would make S passes over all its windows)."""
    if state is None or state.rects is None:
        return [None] * n_shards
    r = state.rects
    idx = np.flatnonzero(~r.empty)
    owner = list_owner(r.bin[idx], r.key[idx], n_shards)
    return [_windows(state, idx[owner == shard]) for shard in range(n_shards)]


def _windows(state: PassageState, idx: I64) -> PassageState | None:
    """The windows ``idx`` of ``state`` (None: there are none); no positions: a list
    shard has no use for them."""
    if not len(idx):
        return None
    assert state.rects is not None
    return PassageState(Rects(*(getattr(state.rects, f.name)[idx] for f in fields(Rects))),
                        state.n_units)


def copy_heads(start: I64, n: I64, ords: I64) -> I64:
    """The heads ``ords[start[i]:start[i] + n[i]]`` of every list, one after the other."""
    total = int(n.sum())
    return ords[np.repeat(start - np.cumsum(n) + n, n) + np.arange(total)]


def join_heads(n_lists: int, parts: Iterable[tuple[I64, Bools, I64, I64]]) -> Heads:
    """The heads of a page's ``n_lists`` lists from the parts of the shards that own them:
    each part names its lists (indexes into the page's) and gives, for each, whether it is
    a stop list, its head length, and the heads one after the other (``copy_heads``)."""
    long = np.zeros(n_lists, dtype=np.bool_)
    start = np.zeros(n_lists, dtype=np.int64)
    n_head = np.zeros(n_lists, dtype=np.int64)
    out: list[I64] = []
    at = 0
    for mine, s_long, s_n, s_ords in parts:
        long[mine], n_head[mine] = s_long, s_n
        start[mine] = at + np.cumsum(s_n) - s_n
        at += int(s_n.sum())
        out.append(s_ords)
    return long, start, n_head, np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


@dataclass
class ListWindows:
    """What list shard ``shard`` needs of the page of sequence ordinal ``seq``, which has
    passages: the distinct lists its query passages name that the shard owns (``bins``,
    ``keys``, in the page's list order), and the lists of its non-empty windows in the
    shard's lists, one per window (``w_bins``, ``w_keys``: a page is in a list once per
    window it has there; empty: none), of a page of ``n_units`` units."""

    seq: int
    shard: int
    bins: I64
    keys: U64
    w_bins: I64
    w_keys: U64
    n_units: int = 0

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {"seq": self.seq, "shard": self.shard,
                             "bins": pack_array(self.bins, "<u2"),
                             "keys": pack_array(self.keys, "<u8")}
        if len(self.w_bins):
            d["w"] = [self.n_units, pack_array(self.w_bins, "<u2"),
                      pack_array(self.w_keys, "<u8")]
        return LIST_WINDOWS.pack(d)

    @classmethod
    def from_bytes(cls, raw: bytes) -> ListWindows:
        d = LIST_WINDOWS.unpack(raw)
        n_units, wb, wk = d.get("w", _NO_WINDOWS)
        return cls(d["seq"], d["shard"], unpack_array(d["bins"], "<u2", np.int64),
                   unpack_array(d["keys"], "<u8"), unpack_array(wb, "<u2", np.int64),
                   unpack_array(wk, "<u8"), n_units)


_NO_WINDOWS = (0, b"", b"")


def list_windows(seq: int, state: PassageState | None, n_shards: int) -> list[ListWindows]:
    """The page's ``ListWindows`` for each of ``n_shards`` list shards (none: the page has
    no passages, and queries no list)."""
    if state is None or state.rects is None:
        return []
    _, _, l_bins, l_keys, _ = query_lists(state)
    owner = list_owner(l_bins, l_keys, n_shards)
    out = []
    for s, part in enumerate(owned_parts(state, n_shards)):
        r = None if part is None else part.rects
        w_bins = np.zeros(0, np.int64) if r is None else r.bin
        w_keys = np.zeros(0, np.uint64) if r is None else r.key
        out.append(ListWindows(seq, s, l_bins[owner == s], l_keys[owner == s], w_bins,
                               w_keys, state.n_units))
    return out


@dataclass
class ListPartial:
    """Shard ``shard``'s answer for the query page of sequence ordinal ``seq`` (store
    ordinal ``ordinal``): for each of the page's lists it owns (``ListWindows.bins``'
    order), whether it is a stop list and its head length ``n``, and the heads one after
    the other (``ords``)."""

    seq: int
    ordinal: int
    shard: int
    long: Bools
    n: I64
    ords: I64

    def to_bytes(self) -> bytes:
        """Head lengths (at most ``max_list_read``) as <u4; ordinals as <u4 while they
        fit (below 4.3e9), else <i8."""
        width = 8 if len(self.ords) and int(self.ords.max()) >= 1 << 32 else 4
        return LIST_PARTIAL.pack({
            "seq": self.seq, "o": self.ordinal, "shard": self.shard,
            "long": pack_array(self.long, "?"), "n": pack_array(self.n, "<u4"),
            "ords": [pack_array(self.ords, "<i8" if width == 8 else "<u4"), width]})

    @staticmethod
    def shard_of(raw: bytes) -> int:
        """The shard of a partial's wire form, its arrays left as bytes (a combine keys
        each of the S partials of a page by it before it reads them)."""
        return int(LIST_PARTIAL.unpack(raw)["shard"])

    @classmethod
    def from_bytes(cls, raw: bytes) -> ListPartial:
        d = LIST_PARTIAL.unpack(raw)
        ords, width = d["ords"]
        return cls(d["seq"], d["o"], d["shard"], unpack_array(d["long"], "?"),
                   unpack_array(d["n"], "<u4", np.int64),
                   unpack_array(ords, "<i8" if width == 8 else "<u4", np.int64))


def combine_lists(partials: Iterable[ListPartial], bins: I64, keys: U64, n_shards: int
                  ) -> Heads:
    """The heads of the page's lists (``query_lists``: ``bins``, ``keys``) from the
    partials of the shards that own them, as one ``PassageIndex.list_heads`` reads them."""
    owner = list_owner(bins, keys, n_shards)
    parts = []
    for p in partials:
        mine = np.flatnonzero(owner == p.shard)
        if len(p.n) != len(mine):
            raise ValueError(f"list shard {p.shard}'s partial for page {p.seq} has "
                             f"{len(p.n)} lists, the page names {len(mine)} there")
        parts.append((mine, p.long, p.n, p.ords))
    return join_heads(len(bins), parts)


# what ``ListShard.apply`` takes: a decision, its place, the exact answer, the windows
Step = tuple[Decision, Placed, ExactAnswer | None, ListWindows | None]


class ListShard:
    """Shard ``shard`` of ``n_shards`` of the list stage, over its own store (module
    docstring). Not thread-safe: one thread calls ``apply`` (in sequence order) and
    ``forget``. Its store: the lists and forward records of ``PassageIndex``, and
    ``next_ordinal``: the sequence ordinal after the last decision that changed it (those
    after changed nothing here, so applying them again after a restart is harmless).

    The lists' entries and runs are a function of the forward records (a page is in the
    lists its forward record names, as often as it has windows there), so a changelog of
    the store may leave them out (``lists.derived``: ~400 records a page on llvm, for one
    forward record): a store restored without them rebuilds them here, at open
    (``rebuild_entries``); the long marks, which are not derived, stay in the changelog."""

    def __init__(self, store: Store, config: EngineConfig, shard: int = 0,
                 n_shards: int = 1) -> None:
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} of {n_shards}")
        self.store, self.shard, self.n_shards = store, shard, n_shards
        self.rebuilt = list_files.rebuild_entries(store)  # (pages read; 0: entries kept)
        self.passages = PassageIndex(store, config)  # each page's entries in its batch
        self.next_seq = tables.next_ordinal.count(store) or 0

    def apply(self, d: Decision, placed: Placed, exact: ExactAnswer | None = None,
              page: ListWindows | None = None) -> ListPartial | None:
        """``apply_run`` of one step (a run of one page)."""
        return self.apply_run([(d, placed, exact, page)])[0]

    def apply_run(self, steps: Sequence[Step]) -> list[ListPartial | None]:
        """The next decisions (of any directory shard, sequence ordinals ascending), each
        with its place in the ledger (``Ledger.apply(d)``), the exact answer of a stored
        page, and the page's ``ListWindows`` for this shard (None: it has no passages).
        Returns each page's partial if it queries the lists (a stored page with passages,
        not an exact copy), else None. The pages go through the lists in runs
        (dupalign.passage.list_run: one lookup, one kernel, one batch a run): a page that
        removes a version (a changed revisit, a delete) ends its run, or goes alone after
        it when the version is in that run (a removal reads the store)."""
        out: list[ListPartial | None] = []
        run: list[tuple[int, Decision, Placed, ListWindows | None]] = []
        for d, placed, exact, page in steps:
            query = self._query(d, placed, exact, page)
            if placed.removed is not None:
                first = run[0][2].ordinal if run else None
                if first is not None and placed.removed >= first:
                    self._run(run, out)
                run.append((len(out), d, placed, query))
                out.append(None)
                self._run(run, out)
            elif query is not None:
                run.append((len(out), d, placed, query))
                out.append(None)
            else:
                out.append(None)
        self._run(run, out)
        return out

    def _query(self, d: Decision, placed: Placed, exact: ExactAnswer | None,
               page: ListWindows | None) -> ListWindows | None:
        """The step checked and taken (``next_seq``); the page's windows if it queries."""
        if d.seq < self.next_seq:
            raise ValueError(f"decision {d.seq} comes after decision {self.next_seq - 1}")
        if page is not None and (page.seq != d.seq or page.shard != self.shard):
            raise ValueError(f"list windows of page {page.seq} for shard {page.shard} given "
                             f"with decision {d.seq} to shard {self.shard}")
        query = None
        if d.kind == "stored":
            if exact is None or exact.seq != d.seq or exact.ordinal != placed.ordinal:
                raise ValueError(f"stored page {d.seq} needs its exact answer")
            if exact.original is None and page is not None:
                query = page
        self.next_seq = d.seq + 1
        return query

    def _run(self, run: list[tuple[int, Decision, Placed, ListWindows | None]],
             out: list[ListPartial | None]) -> None:
        """Query and stage the pages of ``run`` in one batch (only the last may remove a
        version, stored before the run, or query nothing: a delete); their partials into
        ``out`` at their places. Empties ``run``."""
        if not run:
            return
        p = self.passages
        removed = run[-1][2].removed
        queries: list[tuple[int, Decision, int, ListWindows]] = []
        for at, d, placed, q in run:
            if q is not None:
                assert placed.ordinal is not None
                queries.append((at, d, placed.ordinal, q))
        pages = [RunPage(o, q.bins, q.keys, q.w_bins, q.w_keys) for _, _, o, q in queries]
        batch = self.store.batch()
        heads = []
        if pages:  # (the last page replaces ``removed`` if it is the removal's)
            replaces = removed is not None and queries[-1][0] == run[-1][0]
            heads = query_run(p, batch, pages, removed if replaces else None)
        removal = None if removed is None else p.stage_removal(batch, [removed])
        tables.next_ordinal.put_count(batch, run[-1][1].seq + 1)
        self.store.write(batch)
        if removal is not None:
            p.commit_removal(removal)
        if pages:
            p.commit_run()
        for (at, d, o, _), h in zip(queries, heads, strict=True):
            out[at] = ListPartial(d.seq, o, self.shard, h.long, h.n, h.ords)
        run.clear()

    def forget(self, expired: Iterable[Expired]) -> None:
        """Apply a retention sweep (``Ledger.sweep``: the pages it removes, of every
        shard), between the decisions below its sweep point and the next: their windows
        leave this shard's lists (a page with no forward record here has none)."""
        ordinals = [e.ordinal for e in expired]
        if not ordinals:
            return
        batch = self.store.batch()
        removal = self.passages.stage_removal(batch, ordinals)
        self.store.write(batch)
        self.passages.commit_removal(removal)
