"""One call per page: the composition of the three stages, sketch → index → align.

``Engine.process`` runs them one after the other for one page: ``sketch`` (dupalign.stages.sketch:
the page alone), ``index`` (dupalign.stages.index: the only stage that touches the store and the
in-memory indexes, in ordinal order), ``align`` (dupalign.stages.align: the passage tasks the index
found), then ``Indexer.finish`` stores the page's matches. ``Engine.process_many`` runs the
same stages over a stream of pages on several cores (dupalign.runtime.pipeline); the matches do not
depend on how many. Each page gets the next ordinal and matches only smaller ordinals, so
replaying a page yields exactly what it yielded the first time (the matches are stored and
returned).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from types import TracebackType
from typing import Any

import msgpack

from dupalign.audit.auditor import Auditor, CaseResult
from dupalign.audit.recall import Tally
from dupalign.audit.stored import audit_store
from dupalign.config import IMPLIED_PARAMS, PARAM_UPGRADES, EngineConfig
from dupalign.errors import StoreMismatch
from dupalign.match import Match, Span, best_span
from dupalign.near.index import NearIndex
from dupalign.page import Page
from dupalign.passage.index import PassageIndex
from dupalign.runtime import allocator
from dupalign.runtime.batched import BATCH_PAGES, Done, process_batch
from dupalign.runtime.pipeline import ExecutorKind, Source, Stages, WorkerPool, run_pipeline
from dupalign.stages.align import Aligner, merge_ranked
from dupalign.stages.index import Indexer
from dupalign.stages.messages import IndexResult, IndexTimes, StoredVersion
from dupalign.stages.query import PassageQuery
from dupalign.stages.sketch import CopySketches, PageSketch, Sketcher
from dupalign.store import records, tables
from dupalign.store.database import Store
from dupalign.store.forward_reader import StoreForward
from dupalign.text.tokens import tokenize


@dataclass
class PageReport(IndexTimes):
    """What the last ``process`` call did, for metrics: seconds per stage and counts
    (``text`` is the whole sketch stage: text, tokens and the page's sketches; ``passage``
    the index's list lookups and the align stage)."""

    replayed: bool = False  # answered from the store (page seen before)
    text: float = 0.0
    # CPU seconds of this thread per stage (finish, which stores the matches, counts in
    # index: both run on the one thread that owns the store)
    cpu_sketch: float = 0.0
    cpu_index: float = 0.0
    cpu_align: float = 0.0


# pages between two ``allocator.trim`` calls (each walks the allocator's free memory): at
# 1,000, RSS 500 pages after a trim was up to 146 MB above it (docs/performance/memory.md)
TRIM_PAGES = 100


def refuse_sharded(store: Store) -> None:
    """StoreMismatch for a store built for index shards (``scan --shards`` or the index
    topology's fan-in, both removed after commit 4e63f5c): its keys live in shard stores
    that nothing here reads."""
    raw = tables.shard_count.get(store)
    count = 1 if raw is None else int(msgpack.unpackb(raw))
    if count != 1:
        raise StoreMismatch(
            f"store {store.path} was built for {count} index shards, which this version of "
            "dupalign no longer has (removed after commit 4e63f5c): rebuild it by replay "
            "into a new store, `dupalign scan --store NEW_STORE INPUT...`, or run `dupalign "
            "stage` to spread the index over processes (docs/topology.md)")


class Engine:
    """The duplicate engine over one store. Not thread-safe: call from one thread.

    ``removal_only``: an engine that removes pages (``delete``, ``compact``) and indexes
    none (``process``, ``sketch``, ``index`` raise), opened at a cost that does not grow
    with the store (``Indexer``: without the near index's fingerprint table; the store
    afterwards is the one a full engine's removal leaves)."""

    def __init__(self, store: Store, config: EngineConfig, read_only: bool = False,
                 removal_only: bool = False, audit_default: float = 0.0) -> None:
        if removal_only and read_only:
            raise ValueError("removal_only is for an engine that writes its own store")
        self.config = config
        self.store = store
        self.read_only = read_only
        self.removal_only = removal_only
        refuse_sharded(store)
        self.indexer = Indexer(store, config, removal_only)
        self.indexer.passages.write_lists_behind(read_only)
        self.sketcher = Sketcher(config)
        self.aligner = Aligner(config, StoreForward(store))
        self.last_report = PageReport()
        self._pages = 0  # finished by this engine (``_finish``)
        self._pool: WorkerPool | None = None
        self.batch_pages = BATCH_PAGES  # near-only pages a batch on one core (``process_many``)
        # the recall audit (dupalign.audit): ``audit.sample``, or the caller's default
        self.audit: Auditor | None = None
        rate = config.audit.rate(audit_default)
        if rate > 0 and not (read_only or removal_only):
            self.audit = self.indexer.audit = Auditor(store, config, rate)
        if not read_only:
            for result in self.indexer.unfinished_results():  # a crash came before their end
                self.indexer.finish(result, self.align(result))

    @property
    def near(self) -> NearIndex:
        return self.indexer.near

    @property
    def passages(self) -> PassageIndex:
        return self.indexer.passages

    @property
    def next_ordinal(self) -> int:
        return self.indexer.next_ordinal

    @classmethod
    def open(
        cls, store_dir: str | Path, config: EngineConfig | None = None, read_only: bool = False,
        removal_only: bool = False, audit_default: float = 0.0,
    ) -> Engine:
        config = (config or EngineConfig()).validate()
        allocator.configure()  # before the store starts RocksDB's threads
        store = Store(store_dir, config.frozen_params(), read_only=read_only,
                      implied=IMPLIED_PARAMS, upgrades=PARAM_UPGRADES,
                      **config.cache.store_bytes())
        try:
            if read_only:  # a reader takes the store's frozen parameters, whatever it asked
                config = config.with_frozen(store.params)
            return cls(store, config, read_only, removal_only, audit_default)
        except BaseException:
            store.close()
            raise

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        pending = self.indexer.passages.pending
        pool = self._pool
        try:
            if pending is not None and not self.read_only:
                # (if this fails, the next open reads them back from the forward records);
                # the last file in parts, built here and by the pool's idle workers at once
                parts = 1
                if pool is not None and not pool.broken:
                    parts = pool.jobs + 1
                    pending.submit = lambda fn, arg: pool.executor.submit(fn, arg)
                try:
                    pending.drain(into_file=True, parts=parts)
                finally:
                    pending.submit = None
        finally:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
            self.store.close()

    def worker_pool(self, kind: ExecutorKind, jobs: int) -> WorkerPool:
        """The pool of sketch and align workers, made again when the asked shape changed
        (the old one finishes its work in the background), or when a worker died (the run
        that saw it raised; the next one gets new workers)."""
        p = self._pool
        if p is None or p.broken or (p.kind, p.jobs) != (kind, jobs):
            if p is not None:
                p.close(wait=False)
            p = self._pool = WorkerPool(kind, jobs, self.config, self.near.idf, self.store)
        return p

    # -- the pipeline ---------------------------------------------------------------------
    def process(self, page: Page, source: Source | None = None) -> list[Match]:
        """Matches of ``page`` against every earlier page; stores the page. Raises
        PageRejected for pages that cannot be processed (nothing is written then, except
        that ``source``'s offset still advances so the caller can move on)."""
        c0, t0 = time.thread_time(), time.perf_counter()
        sk = self.sketch(page, source)
        c1, t1 = time.thread_time(), time.perf_counter()
        result = self.indexer.index(sk, source, defer=True)
        c2, t2 = time.thread_time(), time.perf_counter()
        found = self.align(result)
        c3, t3 = time.thread_time(), time.perf_counter()
        try:
            return self._finish(result, found)
        finally:
            self._report(result, t1 - t0, t3 - t2, time.perf_counter() - t3)
            r = self.last_report
            r.cpu_sketch, r.cpu_align = c1 - c0, c3 - c2
            r.cpu_index = c2 - c1 + time.thread_time() - c3

    def sketch(self, page: Page, source: Source | None = None) -> PageSketch:
        """The sketch stage in this thread; an unexpected error still advances ``source``'s
        offset (as a rejection does) before it propagates."""
        if self.read_only:
            raise RuntimeError("engine opened read-only")
        self._check_indexes()
        try:
            # an unchanged revisit is only tokenized and hashed (see Indexer.index)
            stored = None if page.deleted else self.indexer.current(page.id)
            return self.sketcher.sketch(page, self.near.idf,
                                        None if stored is None else stored.content_hash)
        except Exception:
            self.indexer.finish(self.indexer.skip(page.id, source), [])
            raise

    def index(self, sk: PageSketch, source: Source | None = None, defer: bool = False
              ) -> IndexResult:
        """The index stage; ``defer``: the page's matches are stored by ``finish`` (after
        align) rather than now when it has no passage tasks."""
        self._check_indexes()
        return self.indexer.index(sk, source, defer)

    def _check_indexes(self) -> None:
        if self.removal_only:
            raise RuntimeError("engine opened for removal only: it indexes no page")

    def align(self, result: IndexResult) -> list[tuple[str, list[Any]]]:
        return [] if result.align is None else self.aligner.align(result.align)

    def process_many(
        self, items: Iterable[tuple[Page, Source | None]], jobs: int = 1,
        executor: ExecutorKind = "process",
    ) -> Iterator[tuple[Page, list[Match] | BaseException]]:
        """``process`` over a stream, in order, sketch and align on ``jobs`` workers: each
        page with its matches or the exception its processing raised (PageRejected...).
        Same matches whatever ``jobs`` (dupalign.runtime.pipeline). Near-only on one core,
        pages go through in batches (dupalign.runtime.batched): the same matches, each
        batch's given once the batch is written."""
        self._check_indexes()
        if jobs <= 1 and self._batches():
            return self._process_batched(items)
        return run_pipeline(self.stages(), items, jobs, executor)

    def _batches(self) -> bool:
        """Whether ``process_many`` on one core takes pages in batches: near-only (align
        reads the stored forward records of candidates, which a pending page has not), one
        index stage of the store's own, no recall audit (it reads what is stored)."""
        return (not self.config.passage.enabled and type(self.indexer) is Indexer
                and self.audit is None and not self.read_only)

    def _process_batched(self, items: Iterable[tuple[Page, Source | None]]
                         ) -> Iterator[tuple[Page, list[Match] | BaseException]]:
        pending = iter(items)
        while batch := list(islice(pending, self.batch_pages)):
            for done in process_batch(self.indexer, self._sketch_many, self._finish, batch):
                self._report_batched(done)
                yield done.page, done.found

    def _sketch_many(self, pages: list[Page], stored: list[bytes | None],
                     copies: CopySketches) -> list[PageSketch | Exception]:
        return self.sketcher.sketch_many(pages, self.near.idf, stored, copies)

    def _report_batched(self, done: Done) -> None:
        result = done.result
        t = (result.times if result is not None else None) or IndexTimes()
        self.last_report = PageReport(
            replayed=result is not None and result.replay_of is not None, exact=t.exact,
            near=t.near, passage=t.passage, store=t.store, psm_probes=t.psm_probes,
            near_candidates=t.near_candidates, cws_pairs=t.cws_pairs,
            cws_samples_saved=t.cws_samples_saved, cpu_sketch=done.cpu_sketch,
            cpu_index=done.cpu_index)

    def stages(self) -> Stages:
        """The stages as ``run_pipeline`` drives them, on this engine's thread."""
        indexer = self.indexer

        def skip(doc_id: str, source: Source | None) -> None:
            indexer.finish(indexer.skip(doc_id, source), [])

        return Stages(
            process=self.process,
            sketch=lambda page: self.sketcher.sketch(page, self.near.idf),
            index=self.index, align=self.align, align_part=self.aligner.align_ranked,
            merge=lambda parts: merge_ranked(parts, self.config.passage.max_matches),
            finish=self._finish, skip=skip,
            removes=indexer.removes, reported=self.report_pipelined, pool=self.worker_pool,
            idf_version=lambda: self.near.idf.version, lists=indexer.passages.pending)

    def _finish(self, result: IndexResult, passages: list[tuple[str, list[Span]]]
                ) -> list[Match]:
        """``Indexer.finish``, and every TRIM_PAGES pages the allocator's free memory back
        to the system (dupalign.runtime.allocator)."""
        self._pages += 1
        if self._pages % TRIM_PAGES == 0:
            allocator.trim()
        return self.indexer.finish(result, passages)

    def _report(self, result: IndexResult, sketch_s: float, align_s: float,
                finish_s: float) -> None:
        t = self.indexer.times
        self.last_report = PageReport(
            replayed=result.replay_of is not None, text=sketch_s, exact=t.exact, near=t.near,
            passage=t.passage + align_s, store=t.store + finish_s, psm_probes=t.psm_probes,
            near_candidates=t.near_candidates, cws_pairs=t.cws_pairs,
            cws_samples_saved=t.cws_samples_saved)

    def report_pipelined(self, result: IndexResult) -> None:
        """``last_report`` of a page of ``process_many`` with workers: the index stage's
        times only (sketch and align ran in other processes, not timed here)."""
        t = result.times or IndexTimes()
        self.last_report = PageReport(**vars(t), replayed=result.replay_of is not None)

    def query_text(self, text: str) -> list[Match]:
        """Passages of ``text`` aligned against the store (nothing is written)."""
        tokens = tokenize(text, self.config.text.max_tokens)
        hashes = tokens.hashes(self.config.seed)
        query = PassageQuery(self.sketcher.passages, self.passages, self.aligner)
        found, _ = query.search(hashes, tokens, self.next_ordinal)
        out = []
        for other, spans in found:
            best = best_span(spans)
            out.append(self.indexer._match("<query>", "passage", other,
                                           est_jaccard=best.est_jaccard, jaccard=best.jaccard,
                                           spans=tuple(spans)))
        return out

    # -- lifecycle: deletes and retention -----------------------------------------------------
    def delete(self, doc_ids: list[str]) -> int:
        """Remove the pages ``doc_ids`` from every index; returns how many were stored."""
        if self.read_only:
            raise RuntimeError("engine opened read-only")
        n = self.indexer.delete(doc_ids)
        self.indexer.counters.deletes += n
        return n

    def compact(self, now_ms: int | None = None, batch_pages: int = 1000) -> int:
        """Retention (``config.retention``): remove the oldest pages, in ordinal ranges of
        at most ``batch_pages`` per WriteBatch, while there are more than ``max_pages`` or
        the oldest is older than ``max_age``. Returns how many left."""
        if self.read_only:
            raise RuntimeError("engine opened read-only")
        r = self.config.retention
        removed, first, last = 0, None, 0
        while expired := self.indexer.expired(r.max_pages, r.max_age, now_ms, batch_pages):
            self.indexer.remove(expired)
            removed += len(expired)
            first = min(v.ordinal for v in expired) if first is None else first
            last = max(last, max(v.ordinal for v in expired))
        if first is not None:
            # the oldest ordinals leave in ranges: compacting just those ranges keeps the
            # store flat (else the ordinal-keyed families saw up and down with RocksDB's
            # background compaction: 154-301 MB at 10,000 pages kept, bench_lifecycle)
            tables.compact_pages(self.store, first, last)
        self.indexer.counters.expired += removed
        return removed

    def doc_id(self, ordinal: int) -> str:
        return self.indexer.doc_id(ordinal)

    def stored_offsets(self) -> dict[tuple[str, int], int]:
        return records.stored_offsets(self.store)

    def checkpoints(self) -> dict[tuple[str, int], int]:
        """Per input partition, the caller's checkpoint (``set_checkpoint``)."""
        return records.checkpoints(self.store)

    def ahead_of_checkpoints(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Per input partition whose stored offset is ahead of its checkpoint: (checkpoint,
        stored). A caller that restarts from its checkpoint reads those pages again and
        gets them from the store as replays, so nothing may remove them before. Empty for
        a store filled without checkpoints (``scan``: it stores no offsets)."""
        noted = self.checkpoints()
        return {tp: (noted.get(tp, 0), stored) for tp, stored in self.stored_offsets().items()
                if stored > noted.get(tp, 0)}

    def set_checkpoint(self, stream: str, partition: int, position: int) -> None:
        """Record the caller's checkpoint of an input partition: the outputs of every page
        read below ``position`` are delivered (the engine only keeps it: a resume point for
        a caller that lost its own, and the bound ``ahead_of_checkpoints`` reports)."""
        if self.read_only:
            raise RuntimeError("engine opened read-only")
        records.put_checkpoint(self.store, stream, partition, position)

    # -- what a service reads and keeps beside the pages ---------------------------------------
    @property
    def alive(self) -> int:
        """Pages stored (not removed)."""
        return self.indexer.alive

    def has_page(self, doc_id: str) -> bool:
        """Whether a version of the page ``doc_id`` is stored."""
        return tables.ids.get(self.store, doc_id) is not None

    def stored_ordinals(self, start: int = 0) -> Iterator[int]:
        """The ordinals of the pages stored, from ``start`` on, ascending."""
        return records.stored_ordinals(self.store, start)

    def forward_record(self, ordinal: int) -> tuple[bytes, bytes] | None:
        """The stored page's forward record, as the align stage reads it: its windows and
        positions (None: a page without passages)."""
        return records.forward_record(self.store, ordinal)

    def note(self, name: str) -> int | None:
        """A caller's count kept in the store (``dupalign.store.records.NOTES`` names them)."""
        return records.get_note(self.store, name)

    def put_note(self, name: str, value: int) -> None:
        if self.read_only:
            raise RuntimeError("engine opened read-only")
        records.put_note(self.store, name, value)

    def removes(self, sk: PageSketch) -> list[int]:
        """The stored page that indexing ``sk`` removes, if any (``Indexer.removes``)."""
        return self.indexer.removes(sk)

    def expired(self, max_pages: int, max_age_s: int, now_ms: int | None, limit: int
                ) -> list[StoredVersion]:
        """The pages retention removes now, at most ``limit`` (``Indexer.expired``)."""
        return self.indexer.expired(max_pages, max_age_s, now_ms, limit)

    def finish(self, result: IndexResult, passages: list[tuple[str, list[Span]]]
               ) -> list[Match]:
        """Store the page's matches (the index stage's last step, after align)."""
        return self.indexer.finish(result, passages)

    def run_audits(self) -> list[CaseResult]:
        """Audit the sampled pages whose matches are stored (dupalign.audit.auditor): call
        it off the pages' path, e.g. after their output is delivered. Same thread as
        ``process``."""
        return [] if self.audit is None else self.audit.run_pending(self.near)

    def audit_tally(self) -> Tally:
        """The audit's counts since the store was made (read from the store)."""
        if self.audit is not None:
            return self.audit.tally
        raw = records.log_get(self.store, "audit_tally", 0)
        return Tally() if raw is None else Tally.from_bytes(raw)

    def audit_store(self, pages: int, reservoir: int | None = None) -> Tally:
        """The audit over ``pages`` stored pages, on demand (dupalign.audit.stored); the
        store is not written."""
        return audit_store(self.store, self.config, self.near, pages,
                           reservoir or self.config.audit.reservoir, self.config.seed)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held by each cache (``cache.memory_mb``'s parts), by the near-duplicate
        table, which grows with the store by design, and free in the allocator's heaps."""
        return {"lists": self.passages.cache.nbytes,
                "forward": self.aligner.records.nbytes + self.indexer.forward_records.nbytes,
                **self.store.memory_bytes(), "near_table": self.near.table.nbytes,
                "allocator_free": allocator.free_bytes()}

    def stats(self) -> dict[str, Any]:
        c = self.indexer.counters
        return {
            "pages": self.indexer.alive,
            "ordinals": self.next_ordinal,
            "revisits_unchanged": c.unchanged,
            "revisits_changed": c.changed,
            "deletes": c.deletes,
            "pages_expired": c.expired,
            "pages_removed": c.removed,
            "store_bytes": self.store.size_bytes(),
            "params": self.store.params,
            **self.near.stats(),
            **self.passages.stats(),
            "audit": self.audit_tally().estimates(),
        }

