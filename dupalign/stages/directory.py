"""The page directory as a stage partitioned by page id: for each id, the version of it that
is stored, and what each page of that id is, decided by the one shard that owns the id
(``directory_owner``) from its own state alone. ``DirectoryEntry`` in, ``Decision`` out.

Two ordinals. Every page has a *sequence ordinal* (its place in the sequence: the
``sequence`` topic's offset), replays, deletes and rejected pages too. Only stored pages
have a *store ordinal*, consecutive over every shard's pages (the single engine's
``Indexer.next_ordinal``). A shard sees only its own ids, so it cannot count store
ordinals: it names versions by sequence ordinal, and the ``Ledger``
(dupalign.stages.ledger), which every consumer of all shards' decisions runs in sequence
order, gives stored pages their store ordinals, keeps the set of pages alive and computes
the retention sweeps.

The rules for a page of id ``d``, in ``Indexer.index``'s order:
1. replay: its replay key is the stored version's, and the page was read as that one was;
2. delete: removes the stored version of ``d``, if there is one;
3. rejected;
4. unchanged revisit: the stored version has its content hash (a ``revisit`` match; not
   stored);
5. stored: a new page, or a changed revisit that removes the stored version (a
   ``revisit`` match: the resemblance of the two verification sketches, the distance of
   the two fingerprints).
Each reads the stored version of ``d`` alone: the single engine's replay table holds the
keys of stored pages only, each page is the current version of its id, and a replay key
hashes the id with the body, so no rule needs another id's state.

Retention. The caller names sweep points: a sweep at sequence ordinal ``p`` (with its
``now_ms``, the same everywhere: carried by the sequence, not read from a clock) removes
what ``Indexer.expired`` would after every page below ``p``, and the Ledger computes it from
the decisions below ``p`` alone. So a directory shard, before it decides its first page at
or after ``p``: waits until its own Ledger has applied every shard's decisions below ``p``,
sweeps that Ledger, and ``forget``s the expired versions of its ids (a forgotten id is not
stored: a later page of it, even a replay of the same body, is a new page). It waits only
for its peers' decisions below a sweep point, which never depend on a page at or after it
(each peer is at the same point at worst: no cycle), and never for a stage downstream.
Between sweep points a shard decides as far ahead as its input goes.

The shard's own store (dupalign.store.tables): ``ids``: doc id -> sequence ordinal of its
stored version; ``docs``: sequence ordinal -> the version's record; ``cws``: sequence
ordinal -> its verification sketch; ``next_ordinal``: the next sequence ordinal to decide.
One WriteBatch per page.

The directory keeps every stored version's verification sketch and relates two versions
by it, as the single engine does (it keeps an exact copy's too: docs/pipeline.md, rule
5), so the exact stage, downstream, never changes a revisit relation. The Hamming distance
of the two versions' fingerprints is left out (None): it needs the idf tables in force at
both pages' turns, which are learned from exact answers, downstream; the router of the id
computes it (``Router.relate``) and the combine puts it in the match. So a decision does
not depend on the idf table a page was sketched under.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast

import mmh3
import msgpack
import numpy as np

from dupalign.config import EngineConfig
from dupalign.match import Match
from dupalign.near.index import U64
from dupalign.stages.index import engine_info, resemblance
from dupalign.stages.sketch import PageSketch
from dupalign.store import tables
from dupalign.store.database import Batch, Store
from dupalign.wire.versions import DIRECTORY_DECISION, DIRECTORY_ENTRY

DecisionKind = Literal["replay", "delete", "rejected", "unchanged", "stored"]
KINDS: tuple[DecisionKind, ...] = ("replay", "delete", "rejected", "unchanged", "stored")
OWNER_SEED = EngineConfig().seed  # the id's hash that picks its shard: never changes


def directory_owner(doc_id: str, n_shards: int) -> int:
    """The directory shard that holds the id ``doc_id``, of ``n_shards``: a stable hash."""
    return int(mmh3.hash(doc_id.encode("utf-8"), OWNER_SEED, signed=False)) % n_shards


@dataclass
class DirectoryEntry:
    """What the directory needs of one page (``entry_of``). ``fingerprint`` and ``sketch``:
    the page's simhash and verification sketch when it is near-indexed (else None)."""

    seq: int
    doc_id: str
    deleted: bool = False
    rejected: bool = False
    replay_key: bytes | None = None
    read_as: str = ""
    content_hash: bytes = b""
    url: str | None = None
    fetched_at: int | None = None
    fingerprint: int | None = None
    sketch: U64 | None = None
    unchanged: bool = False  # sketched as an unchanged revisit: no fingerprint or sketch

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {"seq": self.seq, "id": self.doc_id,
                             "replay_key": self.replay_key, "read_as": self.read_as,
                             "content_hash": self.content_hash, "url": self.url,
                             "fetched_at": self.fetched_at}
        for name in ("deleted", "rejected", "unchanged"):
            if getattr(self, name):
                d[name] = True
        if self.fingerprint is not None:
            d["fingerprint"] = self.fingerprint
        if self.sketch is not None:
            d["sketch"] = self.sketch.astype("<u8").tobytes()
        return DIRECTORY_ENTRY.pack(d)

    @classmethod
    def from_bytes(cls, raw: bytes) -> DirectoryEntry:
        d = DIRECTORY_ENTRY.unpack(raw)
        sketch = d.get("sketch")
        return cls(d["seq"], d["id"], bool(d.get("deleted")), bool(d.get("rejected")),
                   d["replay_key"], d["read_as"], d["content_hash"], d["url"], d["fetched_at"],
                   d.get("fingerprint"),
                   None if sketch is None else np.frombuffer(sketch, "<u8").astype(np.uint64),
                   bool(d.get("unchanged")))


def entry_of(seq: int, sk: PageSketch) -> DirectoryEntry:
    """The directory's part of the page ``sk``, the ``seq``-th of the sequence."""
    near = sk.near
    indexed = near is not None and near.indexed and near.fingerprint is not None
    return DirectoryEntry(
        seq, sk.id, sk.deleted, sk.rejected is not None, sk.replay_key, sk.read_as,
        sk.content_hash, sk.url, sk.fetched_at,
        near.fingerprint if indexed and near is not None else None,
        near.sketch if indexed and near is not None else None, sk.unchanged)


@dataclass(frozen=True)
class Version:
    """A stored version, named by its sequence ordinal, with what the exact and near stages
    need to remove it (the Ledger gives its store ordinal)."""

    seq: int
    content_hash: bytes
    simhash: int | None


@dataclass
class Decision:
    """What the directory made of one page. ``removed``: the version a delete or a changed
    revisit removes; ``replay_of``: the sequence ordinal of the stored version a replay
    repeats; ``revisit``: the revisit match of an unchanged or changed revisit;
    ``fetched_at``: a stored page's (retention by age); ``near``: a stored page is
    near-indexed (it has a fingerprint: a row of the near table unless an exact copy)."""

    seq: int
    doc_id: str
    kind: DecisionKind
    removed: Version | None = None
    replay_of: int | None = None
    revisit: Match | None = None
    fetched_at: int | None = None
    content_hash: bytes | None = None
    near: bool = False

    def to_bytes(self) -> bytes:
        """The wire form: the revisit match as its own fields (the consumer adds its
        ``engine``: ``from_bytes``)."""
        d: dict[str, Any] = {"seq": self.seq, "id": self.doc_id,
                             "kind": KINDS.index(self.kind)}
        if self.removed is not None:
            r = self.removed
            d["removed"] = [r.seq, r.content_hash, r.simhash]
        if self.replay_of is not None:
            d["replay_of"] = self.replay_of
        if self.revisit is not None:
            m = self.revisit
            d["revisit"] = [m.revisit, m.est_jaccard, m.hamming, m.previous_url,
                            m.previous_fetched_at]
        if self.fetched_at is not None:
            d["fetched_at"] = self.fetched_at
        if self.content_hash is not None:
            d["hash"] = self.content_hash
        if self.near:
            d["near"] = True
        return DIRECTORY_DECISION.pack(d)

    @classmethod
    def from_bytes(cls, raw: bytes, engine: dict[str, Any] | None = None) -> Decision:
        """``engine``: the revisit match's ``engine`` field (``engine_info``)."""
        d = DIRECTORY_DECISION.unpack(raw)
        removed = d.get("removed")
        revisit = d.get("revisit")
        return cls(d["seq"], d["id"], KINDS[d["kind"]],
                   None if removed is None else Version(removed[0], removed[1], removed[2]),
                   d.get("replay_of"),
                   None if revisit is None else _revisit_match(
                       d["id"], revisit[0], revisit[1], revisit[2], revisit[3], revisit[4],
                       engine or {}),
                   d.get("fetched_at"), d.get("hash"), bool(d.get("near")))


NONE = -1  # a column's "none" (no removed version, no replay; NO_TIME: no fetched_at)
NO_TIME = int(np.iinfo(np.int64).min)
STORED = KINDS.index("stored")


@dataclass
class Decisions:
    """Consecutive decisions as columns, what the ledger and a partition that does not own
    the pages need of them (the revisit match and ``near`` left out): ``kind`` the index in
    ``KINDS``, ``removed`` the sequence ordinal of the version removed, NONE or NO_TIME where
    a ``Decision`` has None."""

    seq: list[int]
    doc_id: list[str]
    kind: list[int]
    removed: list[int]
    replay_of: list[int]
    fetched_at: list[int]
    content_hash: list[bytes | None]

    def __len__(self) -> int:
        return len(self.seq)

    def stored(self) -> list[int]:
        """The indices of the stored pages."""
        return [i for i, k in enumerate(self.kind) if k == STORED]

    @classmethod
    def of_fields(cls, fields: list[dict[str, Any]]) -> Decisions:
        """The columns of decisions read as their wire fields (``DIRECTORY_DECISION.unpack``,
        as ``Decision.from_bytes`` reads them)."""
        return cls([d["seq"] for d in fields], [d["id"] for d in fields],
                   [d["kind"] for d in fields],
                   [NONE if (r := d.get("removed")) is None else r[0] for d in fields],
                   [d.get("replay_of", NONE) for d in fields],
                   [NO_TIME if (t := d.get("fetched_at")) is None else t for d in fields],
                   [d.get("hash") for d in fields])

    @classmethod
    def of(cls, decisions: list[Decision]) -> Decisions:
        return cls.of_fields([DIRECTORY_DECISION.unpack(d.to_bytes()) for d in decisions])


def _revisit_match(doc_id: str, status: str, est: float | None, hamming: int | None,
                   url: str | None, fetched_at: int | None, engine: dict[str, Any]) -> Match:
    """As ``Indexer._revisit``."""
    return Match(doc_id=doc_id, kind="revisit", match_doc_id=doc_id, engine=engine,
                 revisit=status, previous_url=url, previous_fetched_at=fetched_at,
                 est_jaccard=est, hamming=hamming)


@dataclass
class DirectoryVersion:
    """The stored version of an id, as a shard's ``docs`` record has it."""

    seq: int
    replay_key: bytes
    read_as: str
    content_hash: bytes
    url: str | None
    fetched_at: int | None
    fingerprint: int | None

    @property
    def version(self) -> Version:
        return Version(self.seq, self.content_hash, self.fingerprint)


class DirectoryShard:
    """Shard ``shard`` of ``n_shards`` of the page directory, over its own store. Not
    thread-safe: one thread calls ``decide`` (in sequence order) and ``forget``."""

    def __init__(self, store: Store, config: EngineConfig, shard: int = 0,
                 n_shards: int = 1) -> None:
        if not 0 <= shard < n_shards:
            raise ValueError(f"shard {shard} of {n_shards}")
        self.store, self.shard, self.n_shards = store, shard, n_shards
        self.engine = engine_info(config)
        self.next_seq = tables.next_ordinal.count(store) or 0

    def owns(self, doc_id: str) -> bool:
        return directory_owner(doc_id, self.n_shards) == self.shard

    def decide(self, entry: DirectoryEntry) -> Decision:
        """The decision for the page ``entry`` (of an id this shard owns; sequence ordinals
        ascending), written to the store with what it changes."""
        if entry.seq < self.next_seq:
            raise ValueError(f"page {entry.seq} comes after page {self.next_seq - 1}")
        if not self.owns(entry.doc_id):
            raise ValueError(f"page id {entry.doc_id!r} belongs to directory shard "
                             f"{directory_owner(entry.doc_id, self.n_shards)}, not {self.shard}")
        prev = self.current(entry.doc_id)
        decision = self._rules(entry, prev)
        batch = self.store.batch()
        if decision.removed is not None:
            assert prev is not None
            tables.docs.delete(batch, prev.seq)
            tables.cws.delete(batch, prev.seq)
            tables.ids.delete(batch, entry.doc_id)  # a stored page puts it after
        if decision.kind == "stored":
            self._put(batch, entry)
        tables.next_ordinal.put_count(batch, entry.seq + 1)
        self.store.write(batch)
        self.next_seq = entry.seq + 1
        return decision

    def _rules(self, e: DirectoryEntry, prev: DirectoryVersion | None) -> Decision:
        seq, doc_id = e.seq, e.doc_id
        if (e.replay_key is not None and prev is not None and prev.replay_key == e.replay_key
                and prev.read_as == e.read_as):
            return Decision(seq, doc_id, "replay", replay_of=prev.seq)
        if e.deleted:
            return Decision(seq, doc_id, "delete",
                            removed=None if prev is None else prev.version)
        if e.rejected:
            return Decision(seq, doc_id, "rejected")
        if e.replay_key is None:
            raise ValueError(f"page {doc_id!r} has no replay key and is neither deleted "
                             "nor rejected")
        if prev is not None and prev.content_hash == e.content_hash:
            return Decision(seq, doc_id, "unchanged", revisit=_revisit_match(
                doc_id, "unchanged", 1.0, None, prev.url, prev.fetched_at, self.engine))
        if e.unchanged:  # (as Indexer.index: the topology must not let this happen)
            raise RuntimeError(f"page {doc_id!r} was sketched as an unchanged revisit of a "
                               "version that is no longer stored")
        revisit = None
        if prev is not None:
            est = hamming = None
            old = self._sketch(prev.seq)
            if e.sketch is not None and old is not None:  # (the distance: the router's)
                est, hamming = resemblance(e.sketch, old, None, None)
            revisit = _revisit_match(doc_id, "changed", est, hamming, prev.url,
                                     prev.fetched_at, self.engine)
        return Decision(seq, doc_id, "stored", None if prev is None else prev.version,
                        revisit=revisit, fetched_at=e.fetched_at, content_hash=e.content_hash,
                        near=e.fingerprint is not None)

    def _put(self, batch: Batch, e: DirectoryEntry) -> None:
        record = {"id": e.doc_id, "url": e.url, "content_hash": e.content_hash,
                  "simhash": e.fingerprint, "fetched_at": e.fetched_at,
                  "replay_key": e.replay_key, "read_as": e.read_as}
        tables.docs.put(batch, e.seq, msgpack.packb(record))
        tables.ids.put(batch, e.doc_id, e.seq)
        if e.sketch is not None:
            tables.cws.put(batch, e.seq, e.sketch.astype("<u8").tobytes())

    def forget(self, seqs: Iterable[int]) -> list[str]:
        """Apply a retention sweep (``Ledger.sweep``: the sequence ordinals of the versions
        it removes, of every shard): the versions of this shard's ids leave its store.
        Returns their ids."""
        batch, gone = self.store.batch(), []
        for seq in seqs:
            raw = tables.docs.get(self.store, seq)
            if raw is None:  # another shard's
                continue
            doc_id = str(msgpack.unpackb(raw)["id"])
            tables.docs.delete(batch, seq)
            tables.cws.delete(batch, seq)
            if tables.ids.get(self.store, doc_id) == seq:
                tables.ids.delete(batch, doc_id)
            gone.append(doc_id)
        if len(batch):
            self.store.write(batch)
        return gone

    def current(self, doc_id: str) -> DirectoryVersion | None:
        """The stored version of ``doc_id`` (None: none)."""
        seq = tables.ids.get(self.store, doc_id)
        raw = None if seq is None else tables.docs.get(self.store, seq)
        if seq is None or raw is None:
            return None
        d = msgpack.unpackb(raw)
        return DirectoryVersion(seq, bytes(d["replay_key"]), str(d["read_as"]),
                                bytes(d["content_hash"]), d["url"], d["fetched_at"],
                                d["simhash"])

    def _sketch(self, seq: int) -> U64 | None:
        raw = tables.cws.get(self.store, seq)
        return None if raw is None else cast(U64, np.frombuffer(raw, dtype="<u8"))
