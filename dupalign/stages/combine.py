"""The combine stage, partitioned by page id (docs/pipeline.md, "The shape": ``[combine
×C]``): a page's matches from what the stages upstream answered for it, as the single
``Indexer`` finds them (``_decide``, ``finish``).

Per page of an id it owns (``directory_owner`` of C), in sequence order: its decision (the
directory's, placed by the stage's own ``Ledger``), its sketch, its exact answer, the near
shards' answers (joined by ``combine_near``) and the list shards' partials (joined by
``combine_lists``, the tasks selected by ``PassageIndex.tasks_of``). The matches, in the
engine's order:

- a replay: the matches stored for the version it repeats, which this partition stored
  (the same id);
- a delete: none; a rejected page: ``PageRejected``;
- an unchanged revisit: its ``revisit`` match (the directory's);
- a stored page: the changed revisit's match (the distance of its fingerprints: the
  router's, ``Router.relate``), then the ``exact`` match, or the ``near``
  matches (the version it replaces excluded) and the passage tasks (near matches and the
  replaced version excluded) as an ``AlignRequest``; ``finish`` adds align's passages and
  stores the matches by store ordinal.

Every decision, every partition's, also keeps the ids of the pages alive by store ordinal
(a near match names the page it matches). A removed version's matches leave with it (the
removal of a version of an id of this partition), a swept page's with the sweep
(``forget``). Nothing here waits for a stage downstream but align, whose answer for page
n only this page's ``finish`` reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.match import Match, Span
from dupalign.passage.index import PassageIndex
from dupalign.passage.sketch import query_lists
from dupalign.stages.directory import NONE, Decision, Decisions, directory_owner
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.index import engine_info, passage_matches
from dupalign.stages.ledger import Expired, Placed, Placements
from dupalign.stages.list_shard import ListPartial, combine_lists
from dupalign.stages.messages import AlignRequest
from dupalign.stages.near_shard import NearAnswer, combine_near
from dupalign.stages.router import Router
from dupalign.stages.sketch import PageSketch
from dupalign.store import tables
from dupalign.store.database import Store


@dataclass
class Combined:
    """A page's matches so far and its align request (None: nothing to align)."""

    seq: int
    doc_id: str
    ordinal: int | None = None
    matches: list[Match] = field(default_factory=list)
    align: AlignRequest | None = None
    rejected: tuple[str, str] | None = None


class CombineShard:
    """Partition ``shard`` of ``n_shards`` of the combine stage, over its own store (``matches``
    by store ordinal, as the engine's; ``next_ordinal``: the next sequence ordinal)."""

    def __init__(self, store: Store, config: EngineConfig, shard: int = 0,
                 n_shards: int = 1, n_lists: int = 1) -> None:
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} of {n_shards}")
        self.store, self.shard, self.n_shards, self.n_lists = store, shard, n_shards, n_lists
        self.engine = engine_info(config)
        self.first = config.near.mode == "first"
        self.passages = PassageIndex(store, config)  # (tasks_of only: it writes nothing)
        self.ids: dict[int, str] = {}  # store ordinal -> id of every page alive

    def owns(self, doc_id: str) -> bool:
        return directory_owner(doc_id, self.n_shards) == self.shard

    def apply(self, d: Decision, placed: Placed, sk: PageSketch | None = None,
              exact: ExactAnswer | None = None, near: list[NearAnswer] | None = None,
              partials: list[ListPartial] | None = None, hamming: int | None = None
              ) -> Combined | None:
        """The next decision (every partition's, in sequence order) placed by the ledger;
        for a page of an id of this partition, its sketch and what the stages answered
        for it (``hamming``: the router's revisit distance when ``Router.relates``), and
        its matches so far (None: another partition's page)."""
        self._removed(placed.removed, d.doc_id)
        if placed.ordinal is not None:
            self.ids[placed.ordinal] = d.doc_id
        if not self.owns(d.doc_id):
            return None
        if sk is None or sk.id != d.doc_id:
            raise ValueError(f"page {d.seq} of id {d.doc_id!r} needs its sketch")
        out = Combined(d.seq, d.doc_id, placed.ordinal)
        if d.kind == "replay":
            assert placed.replay_of is not None
            raw = tables.matches.get(self.store, placed.replay_of)
            out.matches = [] if raw is None else [Match.from_dict(m)
                                                  for m in msgpack.unpackb(raw)]
        elif d.kind == "rejected":
            out.rejected = sk.rejected or ("rejected", "")
        elif d.kind == "unchanged":
            assert d.revisit is not None
            out.matches.append(d.revisit)
        elif d.kind == "stored":
            self._stored(out, d, placed, sk, exact, near, partials, hamming)
        return out

    def apply_others(self, run: Decisions, placed: Placements) -> None:
        """Decisions of pages of ids another partition owns (``apply`` of each returns
        None), placed at once (``Ledger.apply_run``): the ids of the pages alive as they
        change (a removed version is of an id this partition does not own: no matches)."""
        ids = self.ids
        for doc_id, ordinal, removed in zip(run.doc_id, placed.ordinal, placed.removed,
                                            strict=True):
            if removed != NONE:
                ids.pop(removed, None)
            if ordinal != NONE:
                ids[ordinal] = doc_id

    def _stored(self, out: Combined, d: Decision, placed: Placed, sk: PageSketch,
                exact: ExactAnswer | None, near: list[NearAnswer] | None,
                partials: list[ListPartial] | None, hamming: int | None) -> None:
        assert placed.ordinal is not None
        if exact is None or exact.seq != d.seq:
            raise ValueError(f"stored page {d.seq} needs its exact answer")
        if d.revisit is not None:  # (the directory leaves the distance to the router)
            out.matches.append(dataclasses.replace(d.revisit, hamming=hamming)
                               if Router.relates(d) else d.revisit)
        if exact.original is not None:
            assert exact.original_id is not None
            out.matches.append(self._match(d.doc_id, "exact", exact.original_id,
                                           est_jaccard=1.0))
            return
        skip = frozenset() if placed.removed is None else frozenset((placed.removed,))
        matched = set()
        if sk.near is not None and sk.near.indexed:
            if near is None:
                raise ValueError(f"near-indexed page {d.seq} needs the near shards' answers")
            for other, hamming, est in combine_near(near, 1, self.first)[0]:
                if other not in skip:
                    matched.add(other)
                    out.matches.append(self._match(d.doc_id, "near", self.ids[other],
                                                   hamming=hamming, est_jaccard=est))
        state = sk.passage
        if state is None or state.keys is None:  # (no passages: rects is None too)
            return
        if partials is None or len(partials) != self.n_lists:
            raise ValueError(f"page {d.seq} needs {self.n_lists} list partials")
        _, _, l_bins, l_keys, _ = query_lists(state)
        heads = combine_lists(partials, l_bins, l_keys, self.n_lists)
        tasks = self.passages.tasks_of(state, heads, frozenset(matched) | skip)
        if tasks is not None:
            assert state.starts is not None and state.ends is not None
            out.align = AlignRequest(placed.ordinal, state.starts, state.ends,
                                     state.positions, tasks)

    def finish(self, out: Combined, passages: list[tuple[str, list[Span]]]) -> list[Match]:
        """The page's matches with align's ``passages``, stored if the page was; a
        rejected page raises ``PageRejected``."""
        matches = out.matches + passage_matches(out.doc_id, passages, self.engine)
        if out.ordinal is not None:
            batch = self.store.batch()
            tables.matches.put(batch, out.ordinal, msgpack.packb([m.to_dict() for m in matches]))
            self.store.write(batch)
        if out.rejected is not None:
            raise PageRejected(*out.rejected)
        return matches

    def _removed(self, ordinal: int | None, doc_id: str) -> None:
        if ordinal is None:
            return
        self.ids.pop(ordinal, None)
        if self.owns(doc_id):  # (the removed version is of the same id)
            batch = self.store.batch()
            tables.matches.remove(batch, [ordinal])
            self.store.write(batch)

    def forget(self, expired: Iterable[Expired]) -> None:
        """A sweep: the swept pages' ids, and their matches stored here (those of the ids
        this partition owns: no other page has matches here)."""
        ordinals = [o for e in expired
                    if (doc_id := self.ids.pop(o := e.ordinal, None)) is None
                    or self.owns(doc_id)]
        if ordinals:
            batch = self.store.batch()
            tables.matches.remove(batch, ordinals)
            self.store.write(batch)

    def _match(self, doc_id: str, kind: Any, other_id: str, **fields: Any) -> Match:
        return Match(doc_id=doc_id, kind=kind, match_doc_id=other_id, engine=self.engine,
                     **fields)
