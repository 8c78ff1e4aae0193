"""The index stage: the only one that reads and writes shared index state, page by page in
ordinal order. ``PageSketch`` in, ``IndexResult`` out.

For one page: the replay check, the exact lookup, the PSM probes and CWS verification
(dupalign.near.index), the inverted-list lookups that turn the page's passages into alignment
tasks naming candidate pages (dupalign.passage.index ``find_tasks``; align reads their windows
from their forward records, dupalign.passage.forward), then everything
the page adds to the store in one WriteBatch, then the in-memory indexes. The tasks go to
the align stage (dupalign.stages.align), possibly on other cores; ``finish`` stores the page's
matches once they are known, in ordinal order.

Crash safety. When the caller aligns the page before indexing the next one
(``Engine.process``: ``defer``), the page is written in one batch with its matches. In a
pipeline, a page with alignment tasks (or one behind such a page) is written in two
batches: its index entries with its ``IndexResult`` under ``unfinished``, then, after
align, its matches and offset (deleting the ``unfinished`` record). A page whose first
batch is in the store is found by the replay check like any stored page; the engine
finishes every ``unfinished`` page when it opens (its tasks are in the record), so a
replay always finds the matches the page produced. Other pages write one batch.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import msgpack
import numpy as np

from dupalign.audit.auditor import Auditor
from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.match import Match, Span, best_span
from dupalign.near.index import U64, NearIndex, NearState
from dupalign.passage.forward import RecordCache
from dupalign.passage.index import PassageIndex, Removal
from dupalign.passage.sketch import PassageState
from dupalign.passage.tasks import PassageTrace
from dupalign.stages.messages import (
    AlignRequest,
    IndexResult,
    IndexTimes,
    LifecycleCounters,
    Query,
    StoredVersion,
)
from dupalign.stages.pending import PageWrites
from dupalign.stages.sketch import PageSketch
from dupalign.store import tables
from dupalign.store.database import Batch, Store
from dupalign.store.records import put_offset

ENGINE_NAME = "dupalign"
_NO_MATCHES = msgpack.packb([])


def _read_alike(read_as: str | None, sk: PageSketch) -> bool:
    """Whether the stored page was read into text (``read_as``) as ``sk``'s page is: the
    same id and body with another type or charset is another text, a new version (a replay
    would answer it with the old text's matches and never index it). Stores that did not
    keep how a page was read (None) answer any."""
    return read_as is None or read_as == sk.read_as


def engine_info(config: EngineConfig) -> dict[str, Any]:
    """The ``engine`` field of the matches found under ``config``."""
    return {
        "name": ENGINE_NAME,
        "h": config.near.hamming,
        "cws_K": config.near.cws_samples,
        "cws_threshold": config.near.cws_threshold,
        "passage_mode": config.passage.mode,
        "k": config.passage.k,
        "theta": config.passage.theta,
    }


def passage_matches(doc_id: str, passages: list[tuple[str, list[Span]]],
                    engine: dict[str, Any]) -> list[Match]:
    """The ``passage`` matches of what align found (earlier page id, spans)."""
    out = []
    for other_id, spans in passages:
        best = best_span(spans)
        out.append(Match(doc_id=doc_id, kind="passage", match_doc_id=other_id,
                         est_jaccard=best.est_jaccard, jaccard=best.jaccard,
                         spans=tuple(spans), engine=engine))
    return out


def resemblance(sketch: U64, old: U64, fingerprint: int | None, old_fingerprint: int | None
                ) -> tuple[float, int | None]:
    """A changed revisit's relation to the version it replaces: the share of equal
    verification min-hashes (no early stop), and the simhash distance when both versions
    have a fingerprint."""
    est = round(float(np.count_nonzero(sketch == old)) / len(old), 4)
    hamming = (None if fingerprint is None or old_fingerprint is None
               else (int(fingerprint) ^ int(old_fingerprint)).bit_count())
    return est, hamming


def next_ordinal(store: Store) -> int:
    """The ordinal the store's next page gets. An ordinal is never given twice, even when
    the newest pages were removed: from the last stored page alone, a reopened store would
    give their ordinals again, and a copy that replays the same records without the reopen,
    a standby, would number the pages differently from the shards and partials of the
    first (tests/runtime/test_lifecycle.py). Stores without the mark: after their last
    page."""
    last, mark = tables.docs.last(store), tables.next_ordinal.count(store)
    return max(0 if last is None else last + 1, mark or 0)


class Indexer:
    """The index stage over one store. Not thread-safe: one thread calls ``index`` and
    ``finish``, each in ordinal order. ``removal_only``: an index stage that only removes
    pages (``delete``, ``remove``: ``dupalign delete``), opened without what only indexing
    needs (``NearIndex``: the PSM table); ``index`` raises."""

    def __init__(self, store: Store, config: EngineConfig, removal_only: bool = False
                 ) -> None:
        self.config = config
        self.store = store
        self.removal_only = removal_only
        self.next_ordinal = next_ordinal(store)
        self.near = NearIndex(store, config, self.next_ordinal, removal_only)
        self.passages = PassageIndex(store, config)
        self.unfinished = 0  # pages indexed whose matches are not stored yet
        # pages stored (current versions), counted on first ask (``alive``): a count of
        # every stored id, which a delete does not need
        self._alive: int | None = None
        self.counters = LifecycleCounters()
        self.times = IndexTimes()
        # candidates' forward records kept between align requests that carry them
        # (``with_forward``: the benchmarks' requests for an align stage without a store), as
        # the align stage keeps them
        self.forward_records = RecordCache(config.cache.budgets_mb()["forward"] << 20)
        # the recall audit (dupalign.audit), when on: told of sampled pages, stored pages and
        # removals, it never changes what the stage answers
        self.audit: Auditor | None = None
        self.engine_info = engine_info(config)
        # the last ``current`` answer, until the next write: ``Engine.sketch`` asks it of
        # the page ``index`` then asks it of again (one store read a page less)
        self._looked_up: tuple[str, StoredVersion | None] | None = None
        # each page's WriteBatch, or one for many (``begin_batch``), and the reads of them
        self.writes = PageWrites(store, self.near)

    @property
    def alive(self) -> int:
        """Pages stored (current versions)."""
        if self._alive is None:
            self._alive = tables.ids.count(self.store)
        return self._alive

    def _count_alive(self, change: int) -> None:
        if self._alive is not None:  # (else counted from the store when first asked)
            self._alive += change

    def index(self, sk: PageSketch, source: tuple[str, int, int] | None = None,
              defer: bool = False) -> IndexResult:
        """Index the page (next ordinal) and find its exact and near matches and passage
        tasks. A rejected or replayed page gets no ordinal and writes nothing here.
        ``defer``: the caller aligns the page and calls ``finish`` before indexing another,
        so a page with tasks can be written in one batch with its matches, by ``finish``."""
        if self.removal_only:  # (a tombstone too: it would be answered out of order)
            raise RuntimeError("the index stage was opened for removal only: it indexes no "
                               "page")
        self.writes.check()
        times = self.times = IndexTimes()
        result = IndexResult(sk.id, source, times=times)
        if sk.replay_key is not None:
            seen = self.writes.replay(sk.replay_key)
            if (seen is not None and _read_alike(seen[1], sk)
                    and self.writes.doc(seen[0]) is not None):  # not removed
                result.replay_of = seen[0]
                return self._maybe_done(result)
        if sk.deleted:
            self.counters.deletes += self.delete([sk.id])
            return self._maybe_done(result)
        if sk.rejected is not None:
            result.rejected = sk.rejected
            return self._maybe_done(result)
        assert sk.replay_key is not None
        t0 = time.perf_counter()
        prev = self._current_once(sk.id)  # the version this page replaces, if any
        if prev is not None and prev.content_hash == sk.content_hash:
            self.counters.unchanged += 1
            result.matches.append(self._revisit(sk, prev, "unchanged", est_jaccard=1.0))
            return self._maybe_done(result)
        if sk.unchanged:  # sketched against a version that is no longer the stored one
            raise RuntimeError(f"page {sk.id!r} was sketched as an unchanged revisit of a "
                               "version that is no longer stored")
        if prev is not None:
            self.counters.changed += 1
        ordinal = result.ordinal = self.next_ordinal
        original = self._exact_original(sk.content_hash)
        if original is not None and sk.near is not None:  # kept for revisits (``_write``)
            self.near.refresh(sk.near)
        t1 = time.perf_counter()
        times.exact = t1 - t0
        query = Query(result, sk, prev, original, ordinal)
        self._decide(query)
        near_state, passage_state = query.near_state, query.passage_state
        t3 = time.perf_counter()
        write = partial(self._write, result, sk, near_state, passage_state, prev)
        if result.align is None and not self.unfinished:  # one batch
            result.done = True
            write(result.matches)
        elif defer and not self.unfinished:  # finish writes it all, after align
            result.deferred = write
        else:
            self.unfinished += 1
            write(None)
        times.store = time.perf_counter() - t3
        return result

    def _decide(self, q: Query) -> None:
        """The page's matches and alignment tasks: the revisit relation to the version it
        replaces, then the exact match, or the near search and the passage tasks (``q``:
        what ``index`` found in the page directory)."""
        result, sk, prev, ordinal, times = q.result, q.sk, q.prev, q.ordinal, self.times
        skip = q.skip
        t1 = time.perf_counter()
        if prev is not None:
            result.matches.append(self._changed(sk, prev))
        if q.original is not None:
            result.matches.append(self._match(sk.id, "exact", q.original, est_jaccard=1.0))
            t2 = t1
        else:
            near_state, passage_state = q.near_state, q.passage_state
            assert near_state is not None and passage_state is not None
            c = self.near.counters
            before = (c.probes, c.candidates, c.filter.pairs, c.filter.samples_saved)
            # never against its own earlier version (removed in the page's batch); in
            # ordinal order: the order a store without the removed pages finds them in
            near_found = sorted(x for x in self.near.search(near_state, ordinal)
                                if x[0] not in skip)
            times.psm_probes = c.probes - before[0]
            times.near_candidates = c.candidates - before[1]
            times.cws_pairs = c.filter.pairs - before[2]
            times.cws_samples_saved = c.filter.samples_saved - before[3]
            audit = self.audit if self.audit is not None and self.audit.wants(ordinal) else None
            trace = None if audit is None else PassageTrace()
            matched = set()
            for other, hamming, est in near_found:
                matched.add(other)
                result.matches.append(self._match(sk.id, "near", other, hamming=hamming,
                                                  est_jaccard=est))
            t2 = time.perf_counter()
            # one message per matched pair: near duplicates are not aligned again as passages
            if passage_state.rects is not None:
                self.passages.trace = trace
                try:
                    tasks = self.passages.find_tasks(passage_state, ordinal,
                                                     frozenset(matched) | skip,
                                                     None if prev is None else prev.ordinal)
                finally:
                    self.passages.trace = None
                if tasks is not None:
                    assert passage_state.starts is not None and passage_state.ends is not None
                    result.align = AlignRequest(
                        ordinal, passage_state.starts, passage_state.ends,
                        passage_state.positions, tasks)
            if audit is not None:
                audit.capture(ordinal, frozenset(skip) | (
                    frozenset() if prev is None else frozenset([prev.ordinal])),
                    near_state, matched, passage_state, trace, self.alive)
        t3 = time.perf_counter()
        times.near, times.passage = t2 - t1, t3 - t2

    def _write(self, result: IndexResult, sk: PageSketch, near_state: NearState | None,
               passage_state: PassageState | None, prev: StoredVersion | None,
               matches: list[Match] | None) -> None:
        """One WriteBatch: the removal of the version ``prev`` the page replaces, everything
        the page adds to the index, then its matches and offset (or, when they are not
        known yet, its ``unfinished`` record); then the in-memory indexes. Between
        ``begin_batch`` and ``flush``, a page that removes nothing goes into the pending
        batch instead (the in-memory indexes at once: the batch's later pages search them
        as they would after the write)."""
        assert result.ordinal is not None and sk.replay_key is not None
        ordinal = result.ordinal
        self._looked_up = None
        pending = self.writes.pending
        if prev is not None and pending is not None:
            # (a removal is written alone, after the pages before it: dupalign.stages.pending)
            self.flush()
            assert self.writes.pending is not None
            self.writes.pending.first = ordinal + 1  # (this page goes in a batch of its own)
            pending = None
        batch = self.store.batch() if pending is None else pending.batch
        try:
            removal = None if prev is None else self._stage_removal(batch, [prev])
            self.near.stage(batch, ordinal, near_state)
            if near_state is None:  # an exact copy: its near state is kept for a revisit alone
                self.near.keep(batch, ordinal, sk.near)
            self.passages.stage(batch, ordinal, passage_state)
            record = msgpack.packb({
                "id": sk.id,
                "url": sk.url,
                "n_tokens": sk.n_tokens,
                "content_hash": sk.content_hash,
                # (an exact copy's too: no row in the near table has it, and removing the
                # page removes none)
                "simhash": None if sk.near is None else sk.near.fingerprint,
                "fetched_at": sk.fetched_at,
                "source": list(result.source) if result.source is not None else None,
                "replay_key": sk.replay_key,  # deleted with the page
            })
            tables.docs.put(batch, ordinal, record)
            tables.ids.put(batch, sk.id, ordinal)
            tables.replay.put(batch, sk.replay_key, ordinal, sk.read_as)
            tables.exact.put(batch, sk.content_hash, ordinal)
            if matches is not None:
                self._put_matches(batch, ordinal, matches, result.source)
            else:
                tables.unfinished.put(batch, ordinal, result.to_bytes())
        except BaseException as exc:
            if pending is not None:  # (the batch holds part of the page: never written)
                self.writes.failed(sk.id, exc)
            raise
        if pending is None:
            tables.next_ordinal.put_count(batch, ordinal + 1)
            self.store.write(batch)
        else:  # (``flush`` puts the next ordinal, once)
            self.writes.add_page(ordinal, sk.id, record, sk.replay_key, sk.read_as,
                                 sk.content_hash)
        self.next_ordinal = ordinal + 1
        if removal is not None:
            self._commit_removal(removal)
        self._count_alive(1)
        self.near.commit(ordinal, near_state)
        self.passages.commit(ordinal, passage_state)
        if self.audit is not None:
            self.audit.offer(ordinal, passage_state)

    # -- many pages in one WriteBatch (dupalign.stages.pending) ------------------------------
    def begin_batch(self) -> None:
        """Stage the pages indexed from now on in one WriteBatch, written by ``flush``;
        their matches must not leave before it (a crash loses the batch)."""
        self.writes.begin(self.next_ordinal)

    def flush(self) -> None:
        """Write the pages staged since ``begin_batch`` or the last flush."""
        self.writes.flush(self.next_ordinal)

    def end_batch(self) -> None:
        """``flush``, then each page in a WriteBatch of its own again."""
        self.flush()
        self.writes.end(self.next_ordinal)

    def drop_batch(self) -> None:
        """Forget the pending batch unwritten: this index stage takes no more pages."""
        self.writes.drop(self.next_ordinal)

    def finish(self, result: IndexResult, passages: list[tuple[str, list[Span]]]) -> list[Match]:
        """Store the page's matches (``passages``: what align found) and return them, in
        ordinal order; a rejected page raises PageRejected (its offset is stored)."""
        if result.replay_of is not None:
            raw = self.writes.matches(result.replay_of)
            matches = [] if raw is None else [Match.from_dict(d) for d in msgpack.unpackb(raw)]
        else:
            matches = list(result.matches)
        matches += passage_matches(result.doc_id, passages, self.engine_info)
        if result.deferred is not None:
            result.deferred(matches)
        elif not result.done:
            batch = self.writes.batch()
            if result.ordinal is not None:
                self._put_matches(batch, result.ordinal, matches, result.source)
                tables.unfinished.delete(batch, result.ordinal)
                self.unfinished -= 1
            elif result.source is not None:
                _put_offset(batch, result.source)
            self.writes.written(batch)
        if self.audit is not None and result.ordinal is not None:
            self.audit.close(result.ordinal, matches)
        if result.rejected is not None:
            raise PageRejected(*result.rejected)
        return matches

    def unfinished_results(self) -> list[IndexResult]:
        """Pages whose first batch was written but not their matches (a crash came
        between); ``self.unfinished`` counts them until they are finished."""
        if not tables.unfinished.in_store(self.store):  # a read-only store made before it
            return []
        out = [IndexResult.from_bytes(v) for _, v in tables.unfinished.items(self.store)]
        self.unfinished = len(out)
        return out

    def with_forward(self, request: AlignRequest) -> AlignRequest:
        """Attach what align would read of the candidate pages' forward records (their
        windows in the request's lists and empty bins, ids, positions records), for an
        align stage without store access (``AlignRequest.to_bytes(forward=True)``)."""
        request.tasks.gather(self.passages.read_forward, self.forward_records)
        others = request.others.tolist()
        request.other_ids = [self.doc_id(o) for o in others]
        request.other_positions = [v or b"" for v in tables.positions.get_many(
            self.store, others)]
        return request

    def skip(self, doc_id: str, source: tuple[str, int, int] | None) -> IndexResult:
        """A page that failed before the index: only its offset advances, in order."""
        return self._maybe_done(IndexResult(doc_id, source))

    # -- versions and removal -------------------------------------------------------------
    def current(self, doc_id: str) -> StoredVersion | None:
        """The stored version of the page ``doc_id`` (None: not in the store)."""
        ordinal = self.writes.ordinal(doc_id)
        version = None if ordinal is None else self._version(ordinal)
        self._looked_up = (doc_id, version)
        return version

    def current_many(self, doc_ids: list[str]) -> list[StoredVersion | None]:
        """``current`` of each id, in two reads of the store (ids, then docs)."""
        ordinals = self.writes.ordinals(doc_ids)
        known = [o for o in ordinals if o is not None]
        records = dict(zip(known, self.writes.docs(known), strict=True))
        return [None if o is None else self._version_of(o, records[o]) for o in ordinals]

    def copy_sketches(self, content_hashes: list[bytes]) -> list[U64 | None]:
        """The verification sketch stored with a page of each content hash (None: no such
        page is stored, or it has none), read at once: a page with that content has the
        same tokens, so the same sketch, which the sketch stage then takes instead of its K
        min-hashes (``Sketcher.sketch_many``: an exact copy's). Any stored page of the
        content will do, so the store alone is read, not a pending batch; with one open,
        what it read answers the index stage's exact lookups of the batch
        (``PageWrites.read_exacts``)."""
        distinct = list(dict.fromkeys(content_hashes))
        self.writes.read_exacts(distinct)
        stored_exact = self.writes.pending.stored_exact if self.writes.pending else {}
        first = {c: stored_exact[c] if c in stored_exact else tables.exact.first(self.store, c)
                 for c in distinct}
        stored = sorted({o for o in first.values() if o is not None})
        raw = dict(zip(stored, tables.cws.get_many(self.store, stored), strict=True))
        sketches = [raw.get(o) if o is not None else None for o in map(first.get,
                                                                        content_hashes)]
        return [None if r is None else np.frombuffer(r, dtype="<u8") for r in sketches]

    def remember(self, doc_id: str, version: StoredVersion | None) -> None:
        """What ``current`` of ``doc_id`` answers now (read since nothing was written of
        it: ``current_many``), for ``index`` to take instead of reading it again."""
        self._looked_up = (doc_id, version)

    def _current_once(self, doc_id: str) -> StoredVersion | None:
        """``current``, answered by the last lookup if it was of ``doc_id`` and nothing
        was written since (only this stage writes the ids and docs families: ``_write``
        and ``remove`` forget it)."""
        looked_up, self._looked_up = self._looked_up, None
        if looked_up is not None and looked_up[0] == doc_id:
            return looked_up[1]
        return self.current(doc_id)

    def _version(self, ordinal: int) -> StoredVersion | None:
        return self._version_of(ordinal, self.writes.doc(ordinal))

    @staticmethod
    def _version_of(ordinal: int, rec: bytes | None) -> StoredVersion | None:
        if rec is None:
            return None
        d = msgpack.unpackb(rec)
        return StoredVersion(ordinal, str(d["id"]), bytes(d["content_hash"]), d.get("simhash"),
                             d.get("url"), d.get("fetched_at"), d.get("replay_key"))

    def _revisit(self, sk: PageSketch, prev: StoredVersion, status: str,
                 **fields: Any) -> Match:
        return Match(doc_id=sk.id, kind="revisit", match_doc_id=prev.doc_id,
                     engine=self.engine_info, revisit=status, previous_url=prev.url,
                     previous_fetched_at=prev.fetched_at, **fields)

    def _changed(self, sk: PageSketch, prev: StoredVersion) -> Match:
        """The relation of a new version to ``prev``: the resemblance of their word shingles
        (the near index's verification sketches, without the filter's early stop) and the
        simhash distance; both None when a version is too short to be near-indexed."""
        est = hamming = None
        near = sk.near
        old = self.near.sketch_of(prev.ordinal)
        if near is not None and near.sketch is not None and old is not None:
            self.near.refresh(near)  # as Engine.process sketches it: the table in force
            est, hamming = resemblance(near.sketch, old, near.fingerprint, prev.simhash)
        return self._revisit(sk, prev, "changed", est_jaccard=est, hamming=hamming)

    def removes(self, sk: PageSketch) -> list[int]:
        """The stored page that indexing ``sk`` removes (the version it replaces or the
        page it deletes), if any: the pipeline finishes the alignments in flight that read
        its forward record or docs record first (dupalign.runtime.pipeline)."""
        if not sk.deleted and (sk.rejected is not None or sk.replay_key is None):
            return []
        prev = self.current(sk.id)
        if prev is None or (not sk.deleted and prev.content_hash == sk.content_hash):
            return []
        return [prev.ordinal]

    def delete(self, doc_ids: list[str]) -> int:
        """Remove the pages ``doc_ids`` from every index (ids not stored are ignored);
        returns how many were removed. Matches published before stay true."""
        versions = [v for v in map(self.current, doc_ids) if v is not None]
        self.remove(versions)
        return len({v.ordinal for v in versions})

    def remove(self, versions: list[StoredVersion]) -> None:
        """Remove stored pages from every index in one WriteBatch, then from memory."""
        if not versions:
            return
        versions = list({v.ordinal: v for v in versions}.values())
        self._looked_up = None
        if self.writes.pending is not None:  # (the pages before it first)
            self.flush()
        batch = self.store.batch()
        removal = self._stage_removal(batch, versions)
        self.store.write(batch)
        self._commit_removal(removal)

    def expired(self, max_pages: int = 0, max_age_s: int = 0, now_ms: int | None = None,
                limit: int = 1000) -> list[StoredVersion]:
        """Retention: the oldest pages (lowest ordinals: ordinals grow with time) that must
        leave, at most ``limit``: while more than ``max_pages`` are stored, or while the
        oldest was fetched (``fetched_at``) more than ``max_age_s`` ago. A page without
        ``fetched_at`` never expires by age (and the age sweep stops at it)."""
        if not max_pages and not max_age_s:
            return []
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cutoff = now_ms - max_age_s * 1000
        out: list[StoredVersion] = []
        for ordinal, raw in tables.docs.items(self.store):
            if len(out) >= limit:
                break
            d = msgpack.unpackb(raw)
            fetched = d.get("fetched_at")
            too_many = max_pages and self.alive - len(out) > max_pages
            too_old = max_age_s and fetched is not None and fetched < cutoff
            if not (too_many or too_old):
                break
            out.append(StoredVersion(ordinal, str(d["id"]), bytes(d["content_hash"]),
                                     d.get("simhash"), d.get("url"), fetched,
                                     d.get("replay_key")))
        return out

    def _stage_removal(self, batch: Batch, versions: list[StoredVersion]) -> Removal:
        """Everything the pages ``versions`` hold in the store, deleted in ``batch``: the
        per-page records (by ordinal ranges), their id, replay and exact keys, then their
        entries in the near index and the passage index (their own ``stage_removal``)."""
        ordinals = [v.ordinal for v in versions]
        for v in versions:
            tables.ids.delete(batch, v.doc_id)  # a new version puts it after
            tables.exact.delete(batch, v.content_hash, v.ordinal)
            if v.replay_key is not None:  # (pages of format <= 5: see index's replay check)
                tables.replay.delete(batch, v.replay_key)
        # (a page removed while still being aligned gets its matches record written by
        # ``finish`` afterwards: an orphan that replay never reads)
        for table in (tables.docs, tables.matches, tables.unfinished):
            table.remove(batch, ordinals)
        self.near.stage_removal(batch, [(v.ordinal, v.simhash) for v in versions])
        return self.passages.stage_removal(batch, ordinals)

    def _commit_removal(self, removal: Removal) -> None:
        ordinals = removal.ordinals.tolist()
        self.near.commit_removal(ordinals)
        self.passages.commit_removal(removal)
        if self.audit is not None:
            self.audit.removed(ordinals)
        self._count_alive(-len(ordinals))
        self.counters.removed += len(ordinals)

    # -- helpers --------------------------------------------------------------------------
    def _maybe_done(self, result: IndexResult) -> IndexResult:
        """A page that adds nothing to the index: done at once unless an earlier page is
        still unfinished (its offset must not be stored before theirs)."""
        if not self.unfinished:
            result.done = True
            if result.source is not None:
                batch = self.writes.batch()
                _put_offset(batch, result.source)
                self.writes.written(batch)
        return result

    def _put_matches(self, batch: Batch, ordinal: int, matches: list[Match],
                     source: tuple[str, int, int] | None) -> None:
        # (most pages have none: msgpack's empty array without a Packer)
        packed = msgpack.packb([m.to_dict() for m in matches]) if matches else _NO_MATCHES
        self.writes.put_matches(batch, ordinal, packed)
        if source is not None:
            _put_offset(batch, source)

    def _match(self, doc_id: str, kind: Any, other: int, **fields: Any) -> Match:
        return Match(doc_id=doc_id, kind=kind, match_doc_id=self.doc_id(other),
                     engine=self.engine_info, **fields)

    def doc_id(self, ordinal: int) -> str:
        raw = self.writes.doc(ordinal)
        if raw is None:
            raise KeyError(f"no document with ordinal {ordinal}")
        return str(msgpack.unpackb(raw)["id"])

    def _exact_original(self, chash: bytes) -> int | None:
        return self.writes.exact(chash)


def _put_offset(batch: Batch, source: tuple[str, int, int]) -> None:
    topic, partition, offset = source
    put_offset(batch, topic, partition, offset + 1)

