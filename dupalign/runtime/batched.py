"""Near-only pages on one core, many at a time: the sketch stage over a batch, then the index
stage page by page into one WriteBatch, written before any of the batch's matches leave
(issue #44).

On short pages (Boost's docs: ~375 tokens) most of a near-only page was a cost per page,
not per token: the calls around the sketch kernels and the index stage's WriteBatch with
RocksDB's write (docs/performance/scan.md). A batch pays the write once
(dupalign.stages.pending) and the sketch stage's kernels once (``Sketcher.sketch_many``).

Same matches, in the same order, as ``Engine.process`` page by page: the index stage sees
the pages in input order, each against every page before it (those of its own batch are
answered from the pending batch), and a page sketched under an idf table that froze
before its turn gets its fingerprint again, as in the pipeline. A crash loses the whole
batch or nothing (one WriteBatch) and the caller gets the batch's matches only after it
is written, so a run again after a crash stores and outputs the same. Passages are off:
align reads the candidates' forward records from the store, where a pending page's are
not yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dupalign.errors import StoreError
from dupalign.match import Match, Span
from dupalign.page import Page
from dupalign.stages.index import Indexer
from dupalign.stages.messages import IndexResult
from dupalign.stages.sketch import PageSketch

BATCH_PAGES = 64  # pages a WriteBatch: RocksDB's write 15 µs a page at 64, 20 at 8, 36 at 1

Source = tuple[str, int, int]
SketchMany = Callable[[list[Page], list[bytes | None]], list[PageSketch | Exception]]
Finish = Callable[[IndexResult, list[tuple[str, list[Span]]]], list[Match]]


@dataclass
class Done:
    """A page of the batch: its matches or its exception, and what it cost (CPU seconds of
    this thread; the batch's shared parts split evenly over its pages)."""

    page: Page
    found: list[Match] | BaseException
    result: IndexResult | None = None
    cpu_sketch: float = 0.0
    cpu_index: float = 0.0


def stored_hashes(indexer: Indexer, pages: list[Page]) -> list[bytes | None]:
    """The content hash of each page's stored version, for the sketch stage to skip an
    unchanged revisit; None for a page whose id came earlier in the batch (that page's
    turn may replace the version: it is sketched in full, as the index would see it)."""
    out: list[bytes | None] = []
    seen: set[str] = set()
    for page in pages:
        stored = None
        if not page.deleted and page.id not in seen:
            version = indexer.current(page.id)
            stored = None if version is None else version.content_hash
        seen.add(page.id)
        out.append(stored)
    return out


def process_batch(indexer: Indexer, sketch_many: SketchMany, finish: Finish,
                  items: list[tuple[Page, Source | None]]) -> list[Done]:
    """The pages ``items`` sketched, indexed into one WriteBatch and written; a page's own
    failure is its ``found``. A ``StoreError`` raises (no later page may be indexed past
    it), and so does anything that stops the batch: then nothing of it is written and the
    index stage takes no more pages (memory is ahead of the store)."""
    pages = [page for page, _ in items]
    c0 = time.thread_time()
    sketches = sketch_many(pages, stored_hashes(indexer, pages))
    sketch_cpu = (time.thread_time() - c0) / max(1, len(pages))
    out: list[Done] = []
    indexer.begin_batch()
    try:
        for (page, source), sk in zip(items, sketches, strict=True):
            c1 = time.thread_time()
            done = Done(page, [], cpu_sketch=sketch_cpu)
            try:
                if isinstance(sk, Exception):  # (as Engine.sketch: the offset advances)
                    indexer.finish(indexer.skip(page.id, source), [])
                    raise sk
                done.result = indexer.index(sk, source, defer=True)
                done.found = finish(done.result, [])
            except StoreError:
                raise
            except Exception as exc:
                indexer.writes.check()  # (a page that failed halfway through its staging)
                done.found = exc
            done.cpu_index = time.thread_time() - c1
            out.append(done)
        c2 = time.thread_time()
        # (written, and the pending batch closed: whatever the caller does with the engine
        # between two pages it is given writes at once, as before)
        indexer.end_batch()
        flush_cpu = (time.thread_time() - c2) / max(1, len(out))
    except BaseException:
        indexer.drop_batch()
        raise
    for done in out:
        done.cpu_index += flush_cpu
    return out
