"""The partitioned pipeline in one process (docs/pipeline.md, build order step 5): every
stage of the shape, each partition over a store of its own, fed through the stages' wire
messages (``to_bytes``/``from_bytes``: what their roles on Kafka will carry), so that its
matches can be checked against the single engine's (``scan``):

    sketch -> directory x D -> exact x E -> router x R -> near x P -> lists x S -> combine x C
    -> align -> combine

Every consumer of the decisions (exact, router, lists, combine, the forward records) runs
its own ``Ledger`` over all of them, and applies a retention sweep (``sweep``) between the
decisions below its point and the next, as its role will. A page goes through every stage
before the next one starts: here only the order of the work is a pipeline's, not its
overlap. The sketch stage sketches every page under the uniform idf table, as the sketch
role, which runs ahead of the learner, does: the router of the page's id makes its
fingerprint again under the table in force (``refresh``: rule 7) and relates a changed
revisit to the version it replaces (``Router.relate``, for the combine). The learner is a
stage of its own, fed in sequence order with the pages added to the near table; the
routers take its ``Frozen`` records (``InForce``), needed at the freeze points alone.

The stage's state is not reopened: the ledgers and the learner are in memory, so a
pipeline starts on empty stores (``open``) and lives as long as its process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.match import Match, Span
from dupalign.near.idf import IdfTable
from dupalign.page import Page
from dupalign.stages.align import Aligner
from dupalign.stages.combine import Combined, CombineShard
from dupalign.stages.directory import (
    Decision,
    DirectoryEntry,
    DirectoryShard,
    directory_owner,
    entry_of,
)
from dupalign.stages.exact import ExactAnswer, ExactShard
from dupalign.stages.forward_stage import ForwardStage, forward_value
from dupalign.stages.index import engine_info
from dupalign.stages.ledger import Expired, Ledger
from dupalign.stages.list_shard import ListPartial, ListShard, ListWindows, list_windows
from dupalign.stages.messages import AlignRequest
from dupalign.stages.near_shard import NearOps, NearShard, answer_from_bytes, answer_to_bytes
from dupalign.stages.router import Frozen, InForce, Learner, Router, prefix_bits
from dupalign.stages.sketch import PageSketch, Sketcher
from dupalign.store.database import Store
from dupalign.store.forward_reader import StoreForward
from dupalign.wire.forward_record import decode_forward


@dataclass(frozen=True)
class Shape:
    """Partitions of each stage: directory, exact, near (a power of 2), lists, combine,
    router, align (its roles on Kafka; one ``ForwardStage`` here: the answers do not depend
    on how the candidates are split)."""

    directory: int = 1
    exact: int = 1
    near: int = 1
    lists: int = 1
    combine: int = 1
    router: int = 1
    align: int = 1

    @classmethod
    def parse(cls, text: str) -> Shape:
        """``D,E,P,S,C``, ``D,E,P,S,C,R`` or ``D,E,P,S,C,R,A``."""
        parts = text.split(",")
        if len(parts) not in (5, 6, 7) or not all(p.strip().isdigit() and int(p) >= 1
                                                  for p in parts):
            raise ValueError(f"partitions {text!r}: counts D,E,P,S,C[,R[,A]], each >= 1")
        shape = cls(*(int(p) for p in parts))
        prefix_bits(shape.near)
        return shape


class Partitioned:
    """The pipeline over stores under ``root`` (one directory per partition)."""

    def __init__(self, config: EngineConfig, shape: Shape, store: Callable[[str], Store]
                 ) -> None:
        """``store``: the empty store of the partition it names (``open``: under a root)."""
        self.config, self.shape = config, shape
        self.engine = engine_info(config)
        self.sketcher = Sketcher(config)
        self.dirs = [DirectoryShard(store(f"directory{k}"), config, k, shape.directory)
                     for k in range(shape.directory)]
        self.dir_ledger = Ledger()
        self.exacts = [(ExactShard(store(f"exact{k}"), k, shape.exact), Ledger())
                       for k in range(shape.exact)]
        self.learner = Learner(config)
        self.routers = [(Router(config, InForce(config), shape.near, k, shape.router),
                         Ledger()) for k in range(shape.router)]
        self.uniform = IdfTable.uniform()
        b = prefix_bits(shape.near)
        self.nears = [NearShard(store(f"near{k}"), config, k, b) for k in range(shape.near)]
        self.lists = [(ListShard(store(f"lists{k}"), config, k, shape.lists), Ledger())
                      for k in range(shape.lists)]
        self.combines = [(CombineShard(store(f"combine{k}"), config, k, shape.combine,
                                       shape.lists), Ledger())
                         for k in range(shape.combine)]
        self.forward, self.forward_ledger = ForwardStage(store("forward"), config), Ledger()
        self.aligner = Aligner(config, StoreForward(self.forward.store))
        self.seq = 0
        self.replayed = False  # the last page was a replay

    @property
    def alive(self) -> int:
        """Pages stored (current versions)."""
        return self.dir_ledger.alive

    @staticmethod
    def refuse_used(root: Path) -> None:
        """ValueError if ``root`` holds anything: the pipeline starts on empty stores (its
        ledgers are not kept yet, so it cannot reopen them)."""
        if root.exists() and any(root.iterdir()):
            raise ValueError(f"{root} is not empty: the partitioned pipeline starts on empty "
                             "stores (its ledgers are not kept yet)")

    @classmethod
    @contextlib.contextmanager
    def open(cls, root: str | Path, config: EngineConfig, shape: Shape = Shape()
             ) -> Iterator[Partitioned]:
        """A pipeline on new stores under ``root`` (ValueError if it holds anything)."""
        path = Path(root)
        cls.refuse_used(path)
        params = config.frozen_params()
        stores: list[Store] = []

        def store(name: str) -> Store:
            stores.append(Store(path / name, params))
            return stores[-1]

        try:
            yield cls(config, shape, store)
        finally:
            for s in stores:
                s.close()

    # -- a page through every stage -------------------------------------------------------
    def process(self, page: Page) -> list[Match]:
        """The page's matches (``Engine.process``'s); PageRejected for a rejected page."""
        seq = self.seq
        self.seq += 1
        sk = self.sketcher.sketch(page, self.uniform)
        sketch_raw = sk.to_bytes()  # to the router (the combine gets to_combine_bytes)
        entry = DirectoryEntry.from_bytes(entry_of(seq, sk).to_bytes())
        # (ordinal 0 on the wire: the sketch role cannot know it; the list shard sets it)
        windows = {w.shard: w.to_bytes() for w in list_windows(0, sk.passage,
                                                                self.shape.lists)}
        raw = self.dirs[directory_owner(entry.doc_id, self.shape.directory)].decide(
            entry).to_bytes()
        d = self._decision(raw)
        self.dir_ledger.apply(d)
        self.replayed = d.kind == "replay"
        exact = self._exact(d)
        near_raw, hamming = self._near(d, exact, sketch_raw)
        # (the run form, as the list role applies a turn's pages: here a run of one)
        partials = [ListPartial.from_bytes(p.to_bytes()) for shard, ledger in self.lists
                    if (p := shard.apply_run([(self._decision(raw), ledger.apply(d), exact,
                                               self._windows(windows, shard.shard, seq))])[0])
                    is not None]
        forward = forward_value(sk.id, sk.passage)  # (the align stage's wire form)
        self.forward.apply(d, self.forward_ledger.apply(d), exact,
                           None if forward is None else decode_forward(forward))
        near = [answer_from_bytes(a)[2] for a in near_raw]
        mine: tuple[CombineShard, Combined] | None = None
        for combine, ledger in self.combines:
            owned = combine.owns(d.doc_id)
            out = combine.apply(self._decision(raw), ledger.apply(d),
                                PageSketch.from_bytes(sk.to_combine_bytes()) if owned else None,
                                exact, near if near else None, partials or None, hamming)
            if out is not None:
                mine = (combine, out)
        assert mine is not None
        combine, page_out = mine
        passages: list[tuple[str, list[Span]]] = []
        if page_out.align is not None:
            passages = self.aligner.align(AlignRequest.from_bytes(
                page_out.align.to_bytes(forward=False)))
        return combine.finish(page_out, passages)

    def _decision(self, raw: bytes) -> Decision:
        return Decision.from_bytes(raw, self.engine)

    def _exact(self, d: Decision) -> ExactAnswer | None:
        answer = None
        for shard, ledger in self.exacts:
            a = shard.apply(d, ledger.apply(d))
            if a is not None:
                answer = ExactAnswer.from_bytes(a.to_bytes())
        return answer

    def _near(self, d: Decision, exact: ExactAnswer | None, sketch_raw: bytes
              ) -> tuple[list[bytes], int | None]:
        """The near answers of the page, and its revisit distance (``Router.relate``)."""
        ops, hamming = [], None
        for router, ledger in self.routers:
            placed = ledger.apply(d)
            near = (PageSketch.from_bytes(sketch_raw, passage=False).near
                    if router.owns(d.doc_id) else None)
            if near is not None and Router.relates(d):
                hamming = router.relate(d, placed, near)
            ops += router.route(d, placed, exact, near)
        if (d.kind == "stored" and d.near and exact is not None and exact.original is None):
            learned = PageSketch.from_bytes(sketch_raw, passage=False).near
            assert learned is not None
            frozen = self.learner.learn(learned)
            if frozen is not None:
                frozen = Frozen.from_bytes(frozen.to_bytes())  # (its wire form)
                for router, _ in self.routers:
                    router.in_force.take(frozen)
        out = []
        for op in ops:
            answer = self.nears[op.shard].apply(NearOps.from_bytes(op.to_bytes()))
            if answer is not None:
                out.append(answer_to_bytes(op.seq, op.shard, answer))
        return out, hamming

    @staticmethod
    def _windows(windows: dict[int, bytes], shard: int, seq: int) -> ListWindows | None:
        raw = windows.get(shard)
        if raw is None:
            return None
        w = ListWindows.from_bytes(raw)
        w.seq = seq
        return w

    # -- retention ------------------------------------------------------------------------
    def sweep(self, max_pages: int, max_age_s: int, now_ms: int) -> list[Expired]:
        """A retention sweep before the next page, in every stage (each from its own ledger:
        the same pages everywhere). Returns the pages swept."""
        swept = self.dir_ledger.sweep(max_pages, max_age_s, now_ms)
        for shard in self.dirs:
            shard.forget(e.seq for e in swept)

        def same(ledger: Ledger) -> list[Expired]:
            mine = ledger.sweep(max_pages, max_age_s, now_ms)
            if mine != swept:
                raise RuntimeError("a stage's ledger swept other pages than the directory's")
            return mine

        for exact, ledger in self.exacts:
            exact.forget(same(ledger))
        for router, ledger in self.routers:
            for op in router.forget(self.seq, same(ledger)):
                self.nears[op.shard].apply(NearOps.from_bytes(op.to_bytes()))
        for lists, ledger in self.lists:
            lists.forget(same(ledger))
        for combine, ledger in self.combines:
            combine.forget(same(ledger))
        self.forward.forget(same(self.forward_ledger))
        return swept

    def process_many(self, pages: Iterable[Page]
                     ) -> Iterator[tuple[Page, list[Match] | PageRejected]]:
        """``process`` over a stream, a rejected page with its ``PageRejected``."""
        for page in pages:
            try:
                yield page, self.process(page)
            except PageRejected as exc:
                yield page, exc
