"""Exact duplicates as a stage partitioned by content hash: for each content hash, the pages
alive with it, held by the one shard that owns the hash (``exact_owner``). The page
directory's decisions in (every directory shard's, in sequence order, each with its place
in the ``Ledger``: dupalign.stages.directory, dupalign.stages.ledger), an ``ExactAnswer``
out for each stored page of a hash the shard owns.

The rule is the single engine's (``Indexer.index``, ``_exact_original``): a stored page (a
new page or a changed revisit) is an exact duplicate of the alive page with the same
content hash that has the lowest store ordinal, and its ``exact`` match names that page's
id; a page removed (deleted, replaced by a new version, swept by retention) no longer
counts. A stored page always has another content hash than the version it replaces (else
it is an unchanged revisit, not stored), so the removal and the lookup of one decision
never meet.

What the shard reads, all upstream of it: every decision (the directory's), placed by its
own ``Ledger`` (store ordinals, the removed version's store ordinal), and at each sweep
point the ``Ledger``'s sweep (``forget``), which depends on the decisions below the point
alone. So to answer the page of sequence ordinal ``n`` it waits only for the decisions
below ``n`` and the one of ``n``: never for a peer exact shard (each owns its hashes and
reads no other's state) and never for a stage downstream (near, lists and combine read its
answers; it reads nothing of theirs). The stored page's content hash comes with its
decision (``Decision.content_hash``); a removed version's with the removal
(``Decision.removed``); a sweep names store ordinals only (``Expired``), so the shard keeps
the content hash of each page it holds, by store ordinal.

The shard's own store (dupalign.store.tables): ``exact``: content hash ‖ store ordinal of
each page alive with a hash it owns (the engine's own table); ``docs``: store ordinal ->
the page's content hash (16 bytes) ‖ its id (UTF-8), to name the original and to forget a
swept page; ``next_ordinal``: the sequence ordinal after the last decision that changed
the store. One WriteBatch per decision that changes it and per sweep; the decisions after
``next_ordinal`` changed nothing here, so applying them again after a restart is harmless.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dupalign.stages.directory import Decision
from dupalign.stages.ledger import Expired, Placed
from dupalign.store import tables
from dupalign.store.database import Batch, Store
from dupalign.wire.versions import EXACT_ANSWER

HASH_BYTES = 16  # a content hash (dupalign.text.hashing.content_hash): the exact keys' prefix


def exact_owner(content_hash: bytes, n_shards: int) -> int:
    """The exact shard that holds the pages with ``content_hash``, of ``n_shards``. The
    hash is uniform already: its first 8 bytes, little-endian, modulo the shards."""
    return int.from_bytes(content_hash[:8], "little") % n_shards


@dataclass(frozen=True)
class ExactAnswer:
    """What the exact stage found for the stored page of sequence ordinal ``seq`` and store
    ordinal ``ordinal``: the alive page it is a copy of (store ordinal ``original`` and id
    ``original_id``), or None: not a copy."""

    seq: int
    ordinal: int
    original: int | None = None
    original_id: str | None = None

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {"seq": self.seq, "o": self.ordinal}
        if self.original is not None:
            d["of"] = [self.original, self.original_id]
        return EXACT_ANSWER.pack(d)

    @classmethod
    def from_bytes(cls, raw: bytes) -> ExactAnswer:
        d = EXACT_ANSWER.unpack(raw)
        of = d.get("of")
        return cls(d["seq"], d["o"], *(of if of is not None else (None, None)))


class ExactShard:
    """Shard ``shard`` of ``n_shards`` of the exact stage, over its own store. Not
    thread-safe: one thread calls ``apply`` (in sequence order) and ``forget``."""

    def __init__(self, store: Store, shard: int = 0, n_shards: int = 1) -> None:
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} of {n_shards}")
        self.store, self.shard, self.n_shards = store, shard, n_shards
        self.next_seq = tables.next_ordinal.count(store) or 0

    def owns(self, content_hash: bytes) -> bool:
        return exact_owner(content_hash, self.n_shards) == self.shard

    def apply(self, d: Decision, placed: Placed) -> ExactAnswer | None:
        """The next decision (of any directory shard, sequence ordinals ascending) with its
        place in the ledger (``Ledger.apply(d)``): the removed version leaves if its hash is
        this shard's; a stored page of a hash of this shard is answered and recorded. None:
        the decision stores no page of this shard's."""
        if d.seq < self.next_seq:
            raise ValueError(f"decision {d.seq} comes after decision {self.next_seq - 1}")
        removes = d.removed is not None and self.owns(d.removed.content_hash)
        stores = d.kind == "stored" and self.owns(self._checked(d, placed))
        self.next_seq = d.seq + 1
        if not (removes or stores):  # most decisions, other shards': no read, no write
            return None
        batch, answer = self.store.batch(), None
        if removes:
            assert d.removed is not None
            if placed.removed is None:
                raise ValueError(f"decision {d.seq} removes a page the ledger does not place")
            self._drop(batch, d.removed.content_hash, placed.removed)
        if stores:
            answer = self._stored(batch, d, placed)
        tables.next_ordinal.put_count(batch, d.seq + 1)
        self.store.write(batch)
        return answer

    @staticmethod
    def _checked(d: Decision, placed: Placed) -> bytes:
        """The content hash of the stored page ``d``, if the decision is well formed."""
        chash = d.content_hash
        if chash is None or len(chash) != HASH_BYTES or placed.ordinal is None:
            raise ValueError(f"stored page {d.seq} has no {HASH_BYTES}-byte content hash or "
                             "no store ordinal")
        if d.removed is not None and d.removed.content_hash == chash:
            raise ValueError(f"stored page {d.seq} replaces a version with its own content "
                             "hash (an unchanged revisit)")
        return chash

    def _stored(self, batch: Batch, d: Decision, placed: Placed) -> ExactAnswer:
        assert d.content_hash is not None and placed.ordinal is not None
        chash = d.content_hash
        original = tables.exact.first(self.store, chash)
        original_id = None
        if original is not None:
            raw = tables.docs.get(self.store, original)
            assert raw is not None, f"exact key of page {original} without its record"
            original_id = raw[HASH_BYTES:].decode("utf-8")
        tables.exact.put(batch, chash, placed.ordinal)
        tables.docs.put(batch, placed.ordinal, chash + d.doc_id.encode("utf-8"))
        return ExactAnswer(d.seq, placed.ordinal, original, original_id)

    @staticmethod
    def _drop(batch: Batch, chash: bytes, ordinal: int) -> None:
        tables.exact.delete(batch, chash, ordinal)
        tables.docs.delete(batch, ordinal)

    def forget(self, expired: Iterable[Expired]) -> list[int]:
        """Apply a retention sweep (``Ledger.sweep``: the pages it removes, of every
        shard), between the decisions below its sweep point and the next: the pages of
        this shard's hashes leave its store. Returns their store ordinals."""
        ordinals = [e.ordinal for e in expired]
        batch, gone = self.store.batch(), []
        for ordinal, raw in zip(ordinals, tables.docs.get_many(self.store, ordinals),
                                strict=True):
            if raw is not None:  # else another shard's
                self._drop(batch, raw[:HASH_BYTES], ordinal)
                gone.append(ordinal)
        if len(batch):
            self.store.write(batch)
        return gone

    def original(self, content_hash: bytes) -> int | None:
        """The store ordinal of the first alive page with ``content_hash`` (None: none)."""
        return tables.exact.first(self.store, content_hash)
