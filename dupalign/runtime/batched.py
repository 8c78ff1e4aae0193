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
from dupalign.stages.messages import IndexResult, StoredVersion
from dupalign.stages.sketch import CopySketches, PageSketch

BATCH_PAGES = 64  # pages a WriteBatch: RocksDB's write 15 µs a page at 64, 20 at 8, 36 at 1

Source = tuple[str, int, int]
SketchMany = Callable[[list[Page], list[bytes | None], CopySketches],
                      list[PageSketch | Exception]]
Finish = Callable[[IndexResult, list[tuple[str, list[Span]]]], list[Match]]


@dataclass
class Done:
    """A page of the batch: its matches or its exception, and what it cost (CPU seconds of
    this thread: the batch's sketch stage and its index stage each split evenly over its
    pages)."""

    page: Page
    found: list[Match] | BaseException
    result: IndexResult | None = None
    cpu_sketch: float = 0.0
    cpu_index: float = 0.0


@dataclass
class Stored:
    """The stored versions of a batch's pages, read at once before it (two reads of the
    store, not two a page: the sketch stage's and the index stage's)."""

    versions: dict[int, StoredVersion | None]  # by the page's place in the batch

    @classmethod
    def read(cls, indexer: Indexer, pages: list[Page]) -> Stored:
        """Of each page but a tombstone or one whose id came earlier in the batch (that
        page's turn may replace or delete the version: its own turn reads it again)."""
        seen: set[str] = set()
        first = []
        for x, page in enumerate(pages):
            if not page.deleted and page.id not in seen:
                first.append(x)
            seen.add(page.id)
        found = indexer.current_many([pages[x].id for x in first])
        return cls(dict(zip(first, found, strict=True)))

    def hashes(self, n: int) -> list[bytes | None]:
        """The content hash of each page's stored version, for the sketch stage to skip an
        unchanged revisit (None: none, or not read: sketched in full, as the index would
        see it)."""
        versions = [self.versions.get(x) for x in range(n)]
        return [None if v is None else v.content_hash for v in versions]


def process_batch(indexer: Indexer, sketch_many: SketchMany, finish: Finish,
                  items: list[tuple[Page, Source | None]]) -> list[Done]:
    """The pages ``items`` sketched, indexed into one WriteBatch and written; a page's own
    failure is its ``found``. A ``StoreError`` raises (no later page may be indexed past
    it), and so does anything that stops the batch: then nothing of it is written and the
    index stage takes no more pages (memory is ahead of the store)."""
    pages = [page for page, _ in items]
    c0 = time.thread_time()
    stored = Stored.read(indexer, pages)
    indexer.begin_batch()
    try:
        # (the exact copies' verification sketches are read, not computed: the batch's
        # exact lookups with them, which the index stage's then answer from)
        sketches = sketch_many(pages, stored.hashes(len(pages)), indexer.copy_sketches)
        sketch_cpu = (time.thread_time() - c0) / max(1, len(pages))
        out: list[Done] = []
        c1 = time.thread_time()
        indexer.writes.read_replays([sk.replay_key for sk in sketches
                                     if isinstance(sk, PageSketch) and sk.replay_key])
        for x, ((page, source), sk) in enumerate(zip(items, sketches, strict=True)):
            done = Done(page, [], cpu_sketch=sketch_cpu)
            try:
                if isinstance(sk, Exception):  # (as Engine.sketch: the offset advances)
                    indexer.finish(indexer.skip(page.id, source), [])
                    raise sk
                if x in stored.versions:  # (nothing of its id written since it was read)
                    indexer.remember(page.id, stored.versions[x])
                done.result = indexer.index(sk, source, defer=True)
                done.found = finish(done.result, [])
            except StoreError:
                raise
            except Exception as exc:
                indexer.writes.check()  # (a page that failed halfway through its staging)
                done.found = exc
            out.append(done)
        # (written, and the pending batch closed: whatever the caller does with the engine
        # between two pages it is given writes at once, as before)
        indexer.end_batch()
        # (split evenly, as the sketch stage's: a CPU clock here is a system call, ~1.2 µs,
        # and one around each page cost more than a store read)
        index_cpu = (time.thread_time() - c1) / max(1, len(out))
    except BaseException:
        indexer.drop_batch()
        raise
    for done in out:
        done.cpu_index = index_cpu
    return out
