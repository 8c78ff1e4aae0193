"""The index stage's writes, one WriteBatch a page or one for many pages, and its reads of
what it wrote (issue #44).

A near-only page wrote ~10 keys in a WriteBatch of its own, and RocksDB's write plus the
batch around it were about a third of its index stage on short pages (Boost: 36 µs of
~150). Between ``begin`` and ``flush`` the index stage stages every page into one pending
batch instead: RocksDB applies it atomically, so a crash loses the whole batch or nothing,
and the caller publishes the batch's matches only after ``flush`` (dupalign.runtime.batched),
so that a run again after a crash processes the same pages into the same store and gives
the same output.

What the index stage reads of a page (its replay key, id, content hash, doc record,
verification sketch, matches) is kept here while it is pending, so that a later page of
the same batch finds it as it would in the store: every read of those goes through
``PageWrites``. Only pages that remove nothing are staged: a removal (a new version, a
delete) is written after the pending batch, alone, as before (the store would otherwise
still hold the keys it deletes when they are read).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dupalign.errors import StoreError
from dupalign.near.index import NearIndex
from dupalign.store import tables
from dupalign.store.database import Batch, Store


@dataclass
class PendingPages:
    """The pending batch and what its pages put, by what the index stage looks up."""

    batch: Batch
    first: int  # the first ordinal staged here: a smaller one is in the store
    docs: dict[int, bytes] = field(default_factory=dict)  # ordinal -> doc record
    ids: dict[str, int] = field(default_factory=dict)  # doc id -> ordinal
    replay: dict[bytes, tuple[int, str]] = field(default_factory=dict)  # key -> (ordinal, read_as)
    exact: dict[bytes, int] = field(default_factory=dict)  # content hash -> lowest ordinal
    matches: dict[int, bytes] = field(default_factory=dict)  # ordinal -> packed matches
    # the store's answers to the batch's replay keys, read at once (``read_replays``): the
    # store changes only when a batch is written, and then a new one starts without them
    stored_replay: dict[bytes, tuple[int, str | None] | None] = field(default_factory=dict)
    # the same for the batch's content hashes (``read_exacts``): the lowest stored ordinal
    stored_exact: dict[bytes, int | None] = field(default_factory=dict)

    def staged(self, ordinal: int) -> bool:
        """Whether the page ``ordinal`` is staged here, not in the store."""
        return ordinal >= self.first


class PageWrites:
    """The index stage's batches over one store: each page's own (``pending`` None) or the
    pending one, and the reads that must see it."""

    def __init__(self, store: Store, near: NearIndex) -> None:
        self.store, self.near = store, near
        self.pending: PendingPages | None = None
        # why no page may be indexed any more: a page failed halfway through its staging,
        # or the pending batch was not written (memory is ahead of the store)
        self.broken: str | None = None

    def check(self) -> None:
        if self.broken is not None:
            raise StoreError("index", self.store.path, self.broken)

    def begin(self, next_ordinal: int) -> None:
        """Stage the pages that remove nothing into one batch from now on."""
        if self.pending is None:
            self.pending = PendingPages(self.store.batch(), next_ordinal)
            self.near.pending_sketches = {}

    def flush(self, next_ordinal: int) -> None:
        """Write the pending batch (``next_ordinal``: the index stage's next ordinal, put
        once for all its pages) and go on staging into a new one."""
        pending = self.pending
        if pending is None:
            return
        self.check()
        if pending.first < next_ordinal:
            tables.next_ordinal.put_count(pending.batch, next_ordinal)
        if len(pending.batch):
            try:
                self.store.write(pending.batch)
            except BaseException as exc:
                self.broken = f"a batch of pages was not written ({exc!r})"
                raise
        self.pending = PendingPages(self.store.batch(), next_ordinal)
        self.near.pending_sketches = {}

    def end(self, next_ordinal: int) -> None:
        """``flush``, then a batch for each page again."""
        self.flush(next_ordinal)
        self.pending = None
        self.near.pending_sketches = None

    def drop(self, next_ordinal: int) -> None:
        """Forget the pending batch unwritten (its pages were indexed in memory: no page may
        be indexed after them)."""
        if self.broken is None and self.pending is not None and (
                self.pending.first < next_ordinal or len(self.pending.batch)):
            self.broken = "a batch of pages was dropped before it was written"
        self.pending = None
        self.near.pending_sketches = None

    def failed(self, doc_id: str, exc: BaseException) -> None:
        """A page failed while it was staged into the pending batch (part of it is there)."""
        self.broken = (f"page {doc_id!r} failed while it was staged ({exc!r}): its batch "
                       "was not written; open the store again")

    def batch(self) -> Batch:
        """The pending batch, or a new one (``written``)."""
        return self.pending.batch if self.pending is not None else self.store.batch()

    def written(self, batch: Batch) -> None:
        """Write ``batch`` unless it is the pending one (``flush`` writes that)."""
        if (self.pending is None or batch is not self.pending.batch) and len(batch):
            self.store.write(batch)

    # -- reads --------------------------------------------------------------------------
    def replay(self, key: bytes) -> tuple[int, str | None] | None:
        pending = self.pending
        if pending is not None:
            if (seen := pending.replay.get(key)) is not None:
                return seen
            if key in pending.stored_replay:
                return pending.stored_replay[key]
        return tables.replay.get(self.store, key)

    def read_replays(self, keys: list[bytes]) -> None:
        """Read the store's answers to ``keys`` at once, for ``replay`` to give while the
        pending batch is not written."""
        if self.pending is not None and keys:
            self.pending.stored_replay = dict(zip(keys, tables.replay.get_many(self.store, keys),
                                                  strict=True))

    def read_exacts(self, content_hashes: list[bytes]) -> None:
        """Read the store's answers to ``exact`` of ``content_hashes`` at once, through one
        iterator, for ``exact`` to give while the pending batch is not written."""
        if self.pending is not None and content_hashes:
            hashes = list(dict.fromkeys(content_hashes))
            self.pending.stored_exact = dict(zip(
                hashes, tables.exact.first_many(self.store, hashes), strict=True))

    def doc(self, ordinal: int) -> bytes | None:
        """The page's doc record."""
        pending = self.pending
        if pending is not None and pending.staged(ordinal):
            return pending.docs.get(ordinal)
        return tables.docs.get(self.store, ordinal)

    def ordinal(self, doc_id: str) -> int | None:
        """The ordinal of the stored version of ``doc_id``."""
        pending = self.pending
        found = None if pending is None else pending.ids.get(doc_id)
        return tables.ids.get(self.store, doc_id) if found is None else found

    def ordinals(self, doc_ids: list[str]) -> list[int | None]:
        """``ordinal`` of each id, the store's in one read."""
        pending = self.pending
        found = [None if pending is None else pending.ids.get(d) for d in doc_ids]
        stored = iter(tables.ids.get_many(
            self.store, [d for d, f in zip(doc_ids, found, strict=True) if f is None]))
        return [next(stored) if f is None else f for f in found]

    def docs(self, ordinals: list[int]) -> list[bytes | None]:
        """``doc`` of each ordinal, the store's in one read."""
        pending = self.pending
        staged = [pending is not None and pending.staged(o) for o in ordinals]
        stored = iter(tables.docs.get_many(
            self.store, [o for o, s in zip(ordinals, staged, strict=True) if not s]))
        return [pending.docs.get(o) if s and pending is not None else next(stored)
                for o, s in zip(ordinals, staged, strict=True)]

    def exact(self, content_hash: bytes) -> int | None:
        """The lowest ordinal with ``content_hash`` (the store's come before the pending)."""
        pending = self.pending
        if pending is not None and content_hash in pending.stored_exact:
            first = pending.stored_exact[content_hash]
        else:
            first = tables.exact.first(self.store, content_hash)
        if first is None and pending is not None:
            return pending.exact.get(content_hash)
        return first

    def matches(self, ordinal: int) -> bytes | None:
        pending = self.pending
        if pending is not None and pending.staged(ordinal):
            return pending.matches.get(ordinal)
        return tables.matches.get(self.store, ordinal)

    # -- what a staged page adds --------------------------------------------------------
    def put_matches(self, batch: Batch, ordinal: int, packed: bytes) -> None:
        tables.matches.put(batch, ordinal, packed)
        if self.pending is not None and batch is self.pending.batch:
            self.pending.matches[ordinal] = packed

    def add_page(self, ordinal: int, doc_id: str, record: bytes, replay_key: bytes,
                 read_as: str, content_hash: bytes) -> None:
        assert self.pending is not None
        p = self.pending
        p.docs[ordinal] = record
        p.ids[doc_id] = ordinal
        p.replay[replay_key] = (ordinal, read_as)
        p.exact.setdefault(content_hash, ordinal)
