"""The page directory partitioned by id (dupalign.stages.directory) and the ledger every
consumer of its decisions runs (dupalign.stages.ledger), against the oracle: the single
``Indexer`` on the same stream.

Random streams over a few ids, each with a few bodies (some bodies shared between ids:
exact copies), sent again as the same bytes (a replay), as other bytes of the same text
(upper case, trailing blanks, read as HTML: an unchanged revisit, or a new page once the
stored version is gone), or as another body (a changed revisit); deletes of stored and
unknown ids; rejected pages (empty, or not valid Unicode); retention sweeps. Per page: the
same kind, store ordinal, replayed page, removed page (and its content hash and simhash)
and revisit match; per sweep, the same pages removed; with 1, 2 and 3 shards, each shard
deciding its pages up to the next sweep point before the next shard starts (a shard never
waits for its peers between sweep points), every message through its wire form. A
changed revisit of an exact copy relates to it in both (docs/pipeline.md, rule 5).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dupalign.errors import PageRejected
from dupalign.match import Match
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.directory import (
    Decision,
    DirectoryEntry,
    DirectoryShard,
    Version,
    directory_owner,
    entry_of,
)
from dupalign.stages.ledger import Expired, Ledger
from dupalign.store import tables
from dupalign.store.database import Store
from tests.reused_stores import Stores, temporary_stores
from tests.stages.streams import CONFIG, ENGINE, N_IDS, PARAMS, ops, pages_of


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    with temporary_stores("directory-") as stores:
        yield stores


def single(engine: Engine, stream: list[Any]) -> tuple[list[Any], list[DirectoryEntry]]:
    """The single engine's outcome of every page and sweep, and the directory entries of
    the pages (from the sketches it indexed)."""
    out: list[Any] = []
    entries: list[DirectoryEntry] = []
    for step, item in pages_of(stream):
        if not isinstance(item, Page):
            swept = []
            while expired := engine.expired(item[0], item[1], step * 1000, 2):
                engine.indexer.remove(expired)
                swept += [v.ordinal for v in expired]
            out.append(("sweep", swept, engine.alive))
            continue
        prev = engine.indexer.current(item.id)
        sk = engine.sketch(item)
        entry = entry_of(len(entries), sk)
        entries.append(entry)
        alive = engine.alive
        result = engine.index(sk, defer=True)
        with contextlib.suppress(PageRejected):  # (its outcome is in ``result``)
            engine.finish(result, engine.align(result))
        if result.replay_of is not None:
            kind = "replay"
        elif sk.deleted:
            kind = "delete"
        elif result.rejected is not None:
            kind = "rejected"
        else:
            kind = "unchanged" if result.ordinal is None else "stored"
        # the version the page removed, read from the store (and no other: the count)
        removed = [] if prev is None or tables.docs.get(engine.store, prev.ordinal) else [
            prev.ordinal]
        assert removed == ([] if prev is None or kind not in ("delete", "stored")
                           else [prev.ordinal])
        assert engine.alive == alive + (kind == "stored") - len(removed)
        gone = [(o, prev.content_hash, prev.simhash) for o in removed if prev is not None]
        # (a changed revisit's distance is the router's: Router.relate, tests/stages/
        # test_partitioned.py)
        revisits = [replace(m, hamming=None).to_dict() for m in result.matches
                    if m.kind == "revisit"]
        out.append((kind, result.ordinal, result.replay_of, gone, revisits, engine.alive))
    return out, entries


def sharded(stores: Stores, n: int, stream: list[Any], entries: list[DirectoryEntry],
            reverse: bool) -> list[Any]:
    """The same stream through ``n`` directory shards and their ledgers (one per shard,
    and one more: any consumer's). Between two sweep points each shard decides all its
    pages before the next one starts; the ledgers apply the decisions in sequence order."""
    shards = [DirectoryShard(stores.store(f"shard{k}of{n}", PARAMS), CONFIG, k, n)
              for k in range(n)]
    ledgers = [Ledger() for _ in range(n + 1)]
    versions: dict[int, Version] = {}  # alive, by store ordinal (what the near and exact
    # stages keep of their own pages)
    out: list[Any] = []
    segment: list[DirectoryEntry] = []
    pages = iter(entries)

    def decide_segment() -> None:
        decided: list[Decision] = []
        for shard in (reversed(shards) if reverse else shards):
            for e in segment:
                if shard.owns(e.doc_id):
                    d = shard.decide(DirectoryEntry.from_bytes(e.to_bytes()))
                    decided.append(Decision.from_bytes(d.to_bytes(), ENGINE))
        for d in sorted(decided, key=lambda d: d.seq):
            placed = {ledger.apply(d) for ledger in ledgers}
            assert len(placed) == 1
            p = placed.pop()
            gone = []
            if p.removed is not None:
                assert d.removed is not None and versions.pop(p.removed) == d.removed
                gone = [(p.removed, d.removed.content_hash, d.removed.simhash)]
            assert d.content_hash == (entries[d.seq].content_hash if d.kind == "stored"
                                      else None)
            if p.ordinal is not None:
                versions[p.ordinal] = Version(d.seq, *_content(entries[d.seq]))
            revisits = [] if d.revisit is None else [d.revisit.to_dict()]
            out.append((d.kind, p.ordinal, p.replay_of, gone, revisits, ledgers[0].alive))
        segment.clear()

    for step, item in pages_of(stream):
        if isinstance(item, Page):
            segment.append(next(pages))
            continue
        decide_segment()  # every decision below the sweep point
        sweeps = [ledger.sweep(item[0], item[1], step * 1000, 2) for ledger in ledgers]
        assert all(s == sweeps[0] for s in sweeps)
        for shard in shards:
            shard.forget(e.seq for e in sweeps[0])
        for e in sweeps[0]:
            del versions[e.ordinal]
        out.append(("sweep", [e.ordinal for e in sweeps[0]], ledgers[0].alive))
    decide_segment()
    return out


def _content(e: DirectoryEntry) -> tuple[bytes, int | None]:
    return e.content_hash, e.fingerprint


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, reverse=st.booleans())
# the worked cases: a delete of an id never stored; a replay of a page a sweep removed (a
# new page); a new version after a delete; a changed revisit (to a near copy) of an exact
# copy (d2's body 1 is d0's body 0); an unchanged revisit read as HTML, then its bytes again
# read as text
@example([("delete", N_IDS), ("page", 0, 0, 0, True), ("delete", N_IDS)], False)
@example([("page", 0, 0, 0, True), ("page", 1, 1, 0, True), ("sweep", 1, 0),
          ("page", 0, 0, 0, True)], False)
@example([("page", 0, 0, 0, True), ("delete", 0), ("page", 0, 1, 0, True)], True)
@example([("page", 0, 0, 0, True), ("page", 2, 1, 0, True), ("page", 2, 2, 0, True)], False)
@example([("page", 2, 0, 0, True), ("page", 2, 0, 3, True), ("page", 2, 0, 0, False)], False)
def test_directory_shards_and_ledger_decide_as_the_single_indexer(
        stores: Stores, stream: list[Any], reverse: bool) -> None:
    engine = Engine(stores.store("engine", PARAMS), CONFIG)
    want, entries = single(engine, stream)
    for n in (1, 2, 3):
        assert sharded(stores, n, stream, entries, reverse) == want, n


# -- the worked cases ----------------------------------------------------------------------
def _entry(seq: int, doc_id: str, body: str = "one two three four five", **fields: Any
           ) -> DirectoryEntry:
    return DirectoryEntry(seq, doc_id, replay_key=f"{doc_id}/{body}".encode(),
                          read_as="plain;", content_hash=body.encode(),
                          fetched_at=seq * 1000, **fields)


@pytest.fixture()
def shard(tmp_path: Path) -> Iterator[DirectoryShard]:
    store = Store(tmp_path / "d", CONFIG.frozen_params())
    yield DirectoryShard(store, CONFIG)
    store.close()


def test_a_delete_of_an_unknown_id_removes_nothing(shard: DirectoryShard) -> None:
    d = shard.decide(DirectoryEntry(0, "a", deleted=True))
    assert (d.kind, d.removed) == ("delete", None)
    ledger = Ledger()
    placed = ledger.apply(d)
    assert (placed.ordinal, placed.removed, ledger.alive) == (None, None, 0)


def test_a_replay_after_a_sweep_removed_the_page_is_a_new_page(shard: DirectoryShard) -> None:
    ledger = Ledger()
    assert ledger.apply(shard.decide(_entry(0, "a"))).ordinal == 0
    assert ledger.apply(shard.decide(_entry(1, "b"))).ordinal == 1
    replay = shard.decide(_entry(2, "a"))
    assert (replay.kind, replay.replay_of) == ("replay", 0)
    assert ledger.apply(replay).replay_of == 0
    swept = ledger.sweep(max_pages=1, max_age_s=0, now_ms=0)
    assert swept == [Expired(0, 0)]
    assert shard.forget(e.seq for e in swept) == ["a"]
    again = shard.decide(_entry(3, "a"))
    assert (again.kind, again.removed, again.revisit) == ("stored", None, None)
    assert ledger.apply(again).ordinal == 2


def test_a_new_version_after_a_delete_replaces_nothing(shard: DirectoryShard) -> None:
    ledger = Ledger()
    ledger.apply(shard.decide(_entry(0, "a")))
    d = shard.decide(DirectoryEntry(1, "a", deleted=True))
    assert d.removed == Version(0, b"one two three four five", None)
    assert ledger.apply(d).removed == 0
    new = shard.decide(_entry(2, "a", "six seven"))
    assert (new.kind, new.removed, new.revisit) == ("stored", None, None)
    assert (ledger.apply(new).ordinal, ledger.alive) == (1, 1)


def test_a_changed_revisit_removes_the_old_version_and_relates_to_it(
        shard: DirectoryShard) -> None:
    ledger = Ledger()
    old = np.arange(16, dtype=np.uint64)
    new = old.copy()
    new[:4] += 100
    ledger.apply(shard.decide(_entry(0, "a", url="u0", fingerprint=0b1011, sketch=old)))
    d = shard.decide(_entry(1, "a", "other words", fingerprint=0b0001, sketch=new))
    assert d.kind == "stored" and d.removed == Version(0, b"one two three four five", 0b1011)
    assert d.revisit is not None
    assert (d.revisit.revisit, d.revisit.est_jaccard, d.revisit.hamming,
            d.revisit.previous_url, d.revisit.previous_fetched_at) == ("changed", 0.75, None,
                                                                       "u0", 0)
    placed = ledger.apply(d)
    assert (placed.ordinal, placed.removed) == (1, 0)


def test_a_shard_refuses_other_shards_ids_and_pages_out_of_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "d", CONFIG.frozen_params())
    try:
        ids = [f"id{i}" for i in range(20)]
        mine = [i for i in ids if directory_owner(i, 2) == 1]
        other = next(i for i in ids if directory_owner(i, 2) == 0)
        shard = DirectoryShard(store, CONFIG, 1, 2)
        with pytest.raises(ValueError, match="belongs to directory shard 0"):
            shard.decide(_entry(0, other))
        shard.decide(_entry(5, mine[0]))
        with pytest.raises(ValueError, match="comes after"):
            shard.decide(_entry(4, mine[1]))
        assert DirectoryShard(store, CONFIG, 1, 2).next_seq == 6  # kept in its store
    finally:
        store.close()


def test_the_owner_of_an_id_does_not_change() -> None:
    """Ids hashed to shards must stay where they are stored: a change of the hash moves
    them."""
    assert [directory_owner(f"http://x/{i}", 7) for i in range(8)] == [5, 4, 1, 6, 1, 2, 6, 5]


def test_a_ledger_refuses_a_decision_naming_a_page_not_stored() -> None:
    ledger = Ledger()
    with pytest.raises(ValueError, match="not stored"):
        ledger.apply(Decision(0, "a", "delete", removed=Version(7, b"h", None)))


# -- the ledger against a brute-force twin -----------------------------------------------------
class TwinLedger:
    """The pages alive in a dict, in store ordinal order, swept as ``Indexer.expired``."""

    def __init__(self) -> None:
        self.next_ordinal = 0
        self.pages: dict[int, tuple[int, int | None]] = {}  # seq -> (ordinal, fetched_at)

    def apply(self, d: Decision) -> tuple[int | None, int | None, int | None]:
        removed = None if d.removed is None else self.pages.pop(d.removed.seq)[0]
        replay_of = None if d.replay_of is None else self.pages[d.replay_of][0]
        ordinal = None
        if d.kind == "stored":
            ordinal, self.next_ordinal = self.next_ordinal, self.next_ordinal + 1
            self.pages[d.seq] = (ordinal, d.fetched_at)
        return ordinal, removed, replay_of

    def sweep(self, max_pages: int, max_age_s: int, now_ms: int) -> list[Expired]:
        out = []
        for seq, (ordinal, fetched) in list(self.pages.items()):
            too_many = max_pages and len(self.pages) > max_pages
            too_old = max_age_s and fetched is not None and fetched < now_ms - max_age_s * 1000
            if not (too_many or too_old):
                break
            del self.pages[seq]
            out.append(Expired(ordinal, seq))
        return out


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 1 << 20), st.integers(0, 30),
                          st.integers(0, 20)), max_size=300),
       st.integers(1, 3), st.integers(1, 4))
def test_the_ledger_places_and_sweeps_as_its_twin(ops: list[tuple[int, int, int, int]],
                                                  batch: int, slots: int) -> None:
    """Many pages in few slots: the arrays grow and drop removed pages' slots often."""
    ledger, twin = Ledger(slots=slots), TwinLedger()
    for seq, (op, pick, a, b) in enumerate(ops):
        alive = list(twin.pages)
        if op >= 9:  # max_pages 0-9 (0: no bound) and max_age 0-20 s (0: none)
            now = seq * 1000
            assert ledger.sweep(a % 10, b, now, batch) == twin.sweep(a % 10, b, now)
            continue
        old = alive[pick % len(alive)] if alive else None
        fetched = None if a == 0 else seq * 1000 - a * 100
        if op < 5 or old is None:  # new page, or a changed revisit (op 3, 4)
            removed = Version(old, b"", None) if op in (3, 4) and old is not None else None
            d = Decision(seq, "x", "stored", removed, fetched_at=fetched)
        elif op < 7:
            d = Decision(seq, "x", "delete", Version(old, b"", None))
        else:
            d = Decision(seq, "x", "replay", replay_of=old)
        placed = ledger.apply(d)
        assert (placed.ordinal, placed.removed, placed.replay_of) == twin.apply(d)
        assert ledger.alive == len(twin.pages)
        assert all(ledger.ordinal_of(s) == o for s, (o, _) in twin.pages.items())


# -- wire forms ------------------------------------------------------------------------------
entries_st = st.builds(
    DirectoryEntry, seq=st.integers(0, 1 << 40), doc_id=st.text(max_size=8),
    deleted=st.booleans(), rejected=st.booleans(),
    replay_key=st.none() | st.binary(min_size=16, max_size=16), read_as=st.text(max_size=8),
    content_hash=st.binary(max_size=16), url=st.none() | st.text(max_size=8),
    fetched_at=st.none() | st.integers(0, 1 << 50),
    fingerprint=st.none() | st.integers(0, (1 << 64) - 1),
    sketch=st.none() | st.lists(st.integers(0, (1 << 64) - 1), min_size=1, max_size=8).map(
        lambda v: np.array(v, dtype=np.uint64)),
    unchanged=st.booleans())


@given(entries_st)
def test_an_entry_survives_its_wire_form(e: DirectoryEntry) -> None:
    back = DirectoryEntry.from_bytes(e.to_bytes())
    assert (back.sketch is None) == (e.sketch is None)
    if e.sketch is not None:
        assert back.sketch is not None and back.sketch.tolist() == e.sketch.tolist()
    back.sketch = e.sketch
    assert back == e


@given(st.integers(0, 1 << 40), st.text(max_size=8),
       st.sampled_from(["replay", "delete", "rejected", "unchanged", "stored"]),
       st.none() | st.builds(Version, st.integers(0, 1 << 40), st.binary(max_size=16),
                             st.none() | st.integers(0, (1 << 64) - 1)),
       st.none() | st.integers(0, 1 << 40),
       st.none() | st.tuples(st.sampled_from(["changed", "unchanged"]),
                             st.none() | st.floats(0, 1), st.none() | st.integers(0, 64),
                             st.none() | st.text(max_size=8),
                             st.none() | st.integers(0, 1 << 50)),
       st.none() | st.integers(0, 1 << 50), st.none() | st.binary(min_size=16, max_size=16))
def test_a_decision_survives_its_wire_form(seq: int, doc_id: str, kind: Any,
                                           removed: Version | None, replay_of: int | None,
                                           revisit: Any, fetched_at: int | None,
                                           content_hash: bytes | None) -> None:
    match = None if revisit is None else Match(
        doc_id=doc_id, kind="revisit", match_doc_id=doc_id, engine=ENGINE, revisit=revisit[0],
        est_jaccard=revisit[1], hamming=revisit[2], previous_url=revisit[3],
        previous_fetched_at=revisit[4])
    d = Decision(seq, doc_id, kind, removed, replay_of, match, fetched_at, content_hash)
    back = Decision.from_bytes(d.to_bytes(), ENGINE)
    assert back == d
    assert (None if back.revisit is None else back.revisit.to_dict()) == (
        None if match is None else match.to_dict())


def test_a_message_of_an_unknown_version_is_refused() -> None:
    raw = msgpack.packb({"v": 99, "seq": 0, "id": "a", "kind": 0})
    with pytest.raises(ValueError, match="directory decision version 99"):
        Decision.from_bytes(raw)
    with pytest.raises(ValueError, match="directory entry version 99"):
        DirectoryEntry.from_bytes(raw)
