"""The exact stage partitioned by content hash (dupalign.stages.exact), behind the page
directory's shards and the ledger, against the oracle: the single ``Indexer``'s ``exact``
matches on the same stream (tests/stages/streams.py: shared bodies across ids are exact
copies; deletes, new versions, replays and retention sweeps remove or keep originals).

Per stored page: the same original (store ordinal and id) as the engine's ``exact`` match,
none where the engine has none, with 1, 2 and 3 exact shards behind 2 directory shards;
each exact shard runs its own ledger and applies a whole segment between sweep points
before the next shard starts (it never waits for a peer), every message through its wire
form. The same on the 5,000-page synthetic stream, the RFCs and Clough with new versions,
deletes and sweeps (``corpus_items``: 377 exact copies, 28 of them of a later original
than the first page with their text, which was removed), with 1 and 3 exact shards, in
tests/stages/test_partitioned.py (the stages' corpora oracles share one engine run).
And the shards against a brute-force twin on long random decision streams.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.directory import Decision, DirectoryEntry, DirectoryShard, Version
from dupalign.stages.exact import ExactAnswer, ExactShard, exact_owner
from dupalign.stages.ledger import Ledger
from dupalign.stages.messages import IndexResult
from dupalign.store.database import Store
from dupalign.text.hashing import content_hash
from tests.corpora import clough_answers, clough_original
from tests.reused_stores import Stores, temporary_stores
from tests.stages.streams import CONFIG, ENGINE, PARAMS, engine_pages, ops, pages_of

Outcome = tuple[int, int | None, str | None] | None  # a stored page's (ordinal, original, id)


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    with temporary_stores("exact-") as stores:
        yield stores


Item = tuple[int, Page | tuple[int, int]]  # (step, page) or (step, (max_pages, max_age_s))


def single(engine: Engine, items: list[Item]) -> tuple[list[Outcome], list[DirectoryEntry]]:
    """Per page, the single engine's ``exact_outcome``. And the pages' directory entries."""
    out: list[Outcome] = []
    entries: list[DirectoryEntry] = []
    for entry, _, result, _ in engine_pages(engine, items):
        entries.append(entry)
        out.append(exact_outcome(engine, result))
    return out, entries


def exact_outcome(engine: Engine, result: IndexResult) -> Outcome:
    """For a page just stored, its store ordinal and its exact original's ordinal and id
    (None, None: no exact match); None for a page not stored."""
    if result.ordinal is None:
        return None
    exact = [m.match_doc_id for m in result.matches if m.kind == "exact"]
    assert len(exact) <= 1
    original = None
    if exact:  # the original is alive: its id's current version
        version = engine.indexer.current(exact[0])
        assert version is not None and version.ordinal < result.ordinal
        original = version.ordinal
    return result.ordinal, original, exact[0] if exact else None


def sharded(stores: Stores, n: int, items: list[Item], entries: list[DirectoryEntry],
            config: EngineConfig = CONFIG) -> list[Outcome]:
    """The same stream through 2 directory shards, their ledger, and ``n`` exact shards,
    each with its own ledger."""
    params = config.frozen_params()
    dirs = [DirectoryShard(stores.store(f"dir{k}", params), config, k, 2) for k in range(2)]
    shards = [ExactShard(stores.store(f"exact{k}of{n}", params), k, n) for k in range(n)]
    dir_ledger, ledgers = Ledger(), [Ledger() for _ in shards]
    answers: dict[int, ExactAnswer] = {}
    kinds: list[str] = []
    segment: list[DirectoryEntry] = []
    pages = iter(entries)

    def run_segment() -> None:
        decided = [Decision.from_bytes(shard.decide(e).to_bytes(), ENGINE)
                   for shard in dirs for e in segment if shard.owns(e.doc_id)]
        decided.sort(key=lambda d: d.seq)
        for d in decided:
            dir_ledger.apply(d)
            kinds.append(d.kind)
        for shard, ledger in zip(shards, ledgers, strict=True):
            for d in decided:
                answer = shard.apply(d, ledger.apply(d))
                if answer is None:
                    continue
                assert d.kind == "stored" and d.content_hash is not None
                assert exact_owner(d.content_hash, n) == shard.shard
                assert answer.seq not in answers  # one answer per stored page
                answers[answer.seq] = ExactAnswer.from_bytes(answer.to_bytes())
        segment.clear()

    for step, item in items:
        if isinstance(item, Page):
            segment.append(next(pages))
            continue
        run_segment()
        swept = dir_ledger.sweep(item[0], item[1], step * 1000, 2)
        for shard in dirs:
            shard.forget(e.seq for e in swept)
        for shard, ledger in zip(shards, ledgers, strict=True):
            assert ledger.sweep(item[0], item[1], step * 1000, 2) == swept
            shard.forget(swept)
    run_segment()
    out: list[Outcome] = []
    for seq, kind in enumerate(kinds):
        a = answers.pop(seq, None)
        assert (a is not None) == (kind == "stored")
        out.append(None if a is None else (a.ordinal, a.original, a.original_id))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops)
# d0's body 0, d2's body 1 and d4's body 2 are one text: the original deleted, then a copy
# (the next alive copy is the original); a sweep removes the original; a changed revisit
# replaces the original; a copy in upper case (another replay key, the same text)
@example([("page", 0, 0, 0, True), ("page", 2, 1, 0, True), ("delete", 0),
          ("page", 4, 2, 0, True), ("delete", 2), ("page", 0, 0, 1, True)])
@example([("page", 0, 0, 0, True), ("page", 2, 1, 0, True), ("sweep", 1, 0),
          ("page", 4, 2, 0, True)])
@example([("page", 0, 0, 0, True), ("page", 2, 1, 0, True), ("page", 0, 1, 0, True),
          ("page", 4, 2, 1, True)])
def test_exact_shards_answer_as_the_single_indexer(stores: Stores, stream: list[Any]) -> None:
    engine = Engine(stores.store("engine", PARAMS), CONFIG)
    items = list(pages_of(stream))
    want, entries = single(engine, items)
    for n in (1, 2, 3):
        assert sharded(stores, n, items, entries) == want, n


def corpus_items(seed: int = 3) -> list[Item]:
    """The 5,000-page synthetic stream (exact and near copies of earlier pages), the RFCs and
    Clough's answers and originals; after every 11th page a new version of an earlier id
    with another earlier page's body (often an exact copy), after every 13th a delete of an
    earlier id, every 500 pages a sweep to 1,500 pages alive."""
    from tests.role_processes import rfc_pages, synthetic_pages  # (imports the service)

    pages = synthetic_pages(5000) + rfc_pages() + [
        Page(a.file, a.body) for a in clough_answers()] + [
        Page(f"orig_{t}", clough_original(t)) for t in "abcde"]
    rng = np.random.default_rng(seed)
    items: list[Item] = []
    for i, page in enumerate(pages):
        items.append((len(items), page))
        if i and i % 11 == 0:
            other = pages[int(rng.integers(0, i))]
            items.append((len(items), Page(pages[int(rng.integers(0, i))].id, other.body)))
        if i and i % 13 == 0:
            items.append((len(items), Page(pages[int(rng.integers(0, i))].id, "",
                                           deleted=True)))
        if i and i % 500 == 0:
            items.append((len(items), (1500, 0)))
    return items


# -- the worked cases ----------------------------------------------------------------------
def _hash(text: str) -> bytes:
    return content_hash(text.split())


def _stored(seq: int, doc_id: str, text: str, removed: Version | None = None) -> Decision:
    return Decision(seq, doc_id, "stored", removed, fetched_at=seq * 1000,
                    content_hash=_hash(text))


@pytest.fixture()
def shard(tmp_path: Path) -> Iterator[ExactShard]:
    store = Store(tmp_path / "e", PARAMS)
    yield ExactShard(store)
    store.close()


def _run(shard: ExactShard, ledger: Ledger, d: Decision) -> tuple[int | None, str | None]:
    a = shard.apply(d, ledger.apply(d))
    assert a is not None
    return a.original, a.original_id


def test_a_deleted_original_passes_to_the_next_alive_copy(shard: ExactShard) -> None:
    ledger = Ledger()
    assert _run(shard, ledger, _stored(0, "a", "text")) == (None, None)
    assert _run(shard, ledger, _stored(1, "b", "other")) == (None, None)
    assert _run(shard, ledger, _stored(2, "c", "text")) == (0, "a")
    d = Decision(3, "a", "delete", Version(0, _hash("text"), None))
    assert shard.apply(d, ledger.apply(d)) is None
    assert _run(shard, ledger, _stored(4, "d", "text")) == (2, "c")  # not a's
    d = Decision(5, "c", "delete", Version(2, _hash("text"), None))
    shard.apply(d, ledger.apply(d))
    assert _run(shard, ledger, _stored(6, "e", "text")) == (3, "d")
    for seq, doc_id, stored_at in ((7, "d", 4), (8, "e", 6)):
        d = Decision(seq, doc_id, "delete", Version(stored_at, _hash("text"), None))
        shard.apply(d, ledger.apply(d))
    assert shard.original(_hash("text")) is None
    assert _run(shard, ledger, _stored(9, "f", "text")) == (None, None)  # no copy alive


def test_a_sweep_removes_the_original(shard: ExactShard) -> None:
    ledger = Ledger()
    _run(shard, ledger, _stored(0, "a", "text"))
    _run(shard, ledger, _stored(1, "b", "text"))
    swept = ledger.sweep(max_pages=1, max_age_s=0, now_ms=0)
    assert [e.ordinal for e in swept] == [0]
    assert shard.forget(swept) == [0]
    assert _run(shard, ledger, _stored(2, "c", "text")) == (1, "b")


def test_a_new_version_of_the_original_is_not_its_copy(shard: ExactShard) -> None:
    """A changed revisit removes the original (by the decision's removed version) and is
    answered for its own text."""
    ledger = Ledger()
    _run(shard, ledger, _stored(0, "a", "text"))
    _run(shard, ledger, _stored(1, "b", "text"))
    assert _run(shard, ledger, _stored(2, "a", "new", Version(0, _hash("text"), 7))) == (
        None, None)
    assert _run(shard, ledger, _stored(3, "c", "text")) == (1, "b")
    assert _run(shard, ledger, _stored(4, "d", "new")) == (2, "a")


def test_shards_keep_only_their_hashes_and_refuse_pages_out_of_order(tmp_path: Path) -> None:
    texts = [f"t{i}" for i in range(12)]
    mine = [t for t in texts if exact_owner(_hash(t), 2) == 1]
    other = next(t for t in texts if exact_owner(_hash(t), 2) == 0)
    store = Store(tmp_path / "e", PARAMS)
    try:
        shard, ledger = ExactShard(store, 1, 2), Ledger()
        d = _stored(0, "a", other)
        assert shard.apply(d, ledger.apply(d)) is None
        assert _run(shard, ledger, _stored(1, "b", mine[0])) == (None, None)
        assert shard.forget(ledger.sweep(max_pages=0, max_age_s=1, now_ms=10_000)) == [1]
        with pytest.raises(ValueError, match="comes after"):
            shard.apply(_stored(1, "c", mine[1]), ledger.apply(_stored(2, "c", mine[1])))
        with pytest.raises(ValueError, match="content hash"):
            shard.apply(Decision(3, "d", "stored", content_hash=b"short"),
                        ledger.apply(Decision(3, "d", "stored")))
        assert ExactShard(store, 1, 2).next_seq == 2  # kept in its store
    finally:
        store.close()


def test_the_owner_of_a_hash_does_not_change() -> None:
    """Hashes placed in shards must stay where they are stored."""
    hashes = [bytes(range(i, i + 16)) for i in range(8)]
    assert [exact_owner(h, 7) for h in hashes] == [1, 6, 4, 2, 0, 5, 3, 1]


# -- wire form -------------------------------------------------------------------------------
@given(st.integers(0, 1 << 40), st.integers(0, 1 << 40),
       st.none() | st.tuples(st.integers(0, 1 << 40), st.text(max_size=40)))
def test_an_answer_survives_its_wire_form(seq: int, ordinal: int,
                                          of: tuple[int, str] | None) -> None:
    a = ExactAnswer(seq, ordinal, *(of or (None, None)))
    assert ExactAnswer.from_bytes(a.to_bytes()) == a


def test_an_answer_of_an_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match="exact answer version 99"):
        ExactAnswer.from_bytes(msgpack.packb({"v": 99, "seq": 0, "o": 0}))


# -- against a brute-force twin --------------------------------------------------------------
class TwinExact:
    """The pages alive in a dict: the original is the lowest store ordinal with the hash."""

    def __init__(self) -> None:
        self.pages: dict[int, tuple[bytes, str]] = {}  # store ordinal -> (hash, id)

    def apply(self, d: Decision, ordinal: int | None, removed: int | None) -> Outcome:
        if removed is not None:
            del self.pages[removed]
        if d.kind != "stored":
            return None
        assert ordinal is not None and d.content_hash is not None
        same = [o for o, (h, _) in self.pages.items() if h == d.content_hash]
        self.pages[ordinal] = (d.content_hash, d.doc_id)
        first = min(same, default=None)
        return ordinal, first, None if first is None else self.pages[first][1]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 1 << 20), st.integers(0, 5)),
                min_size=8, max_size=200),
       st.integers(1, 3))
def test_exact_shards_answer_as_their_twin(tmp_path_factory: pytest.TempPathFactory,
                                           ops: list[tuple[int, int, int]], n: int) -> None:
    """Many pages over few hashes, removed by deletes, new versions and sweeps; the shards
    reopened on their stores every 16 decisions (their state is in the store)."""
    root = tmp_path_factory.mktemp("twin")
    stores = [Store(root / f"e{k}", PARAMS) for k in range(n)]
    try:
        shards = [ExactShard(s, k, n) for k, s in enumerate(stores)]
        ledgers, twin, twin_ledger = [Ledger() for _ in shards], TwinExact(), Ledger()
        seqs: dict[int, tuple[int, bytes]] = {}  # alive: store ordinal -> (seq, hash)
        for seq, (op, pick, h) in enumerate(ops):
            if seq % 16 == 15:
                shards = [ExactShard(s, k, n) for k, s in enumerate(stores)]
            alive = sorted(seqs)
            old = alive[pick % len(alive)] if alive else None
            removed = None if old is None else Version(*seqs[old], None)
            if op >= 10:  # a sweep: at most 0-5 pages alive, none older than 0-7 s (0: no bound)
                bounds = (pick % 6, (pick >> 3) % 8, seq * 1000)
                swept = twin_ledger.sweep(*bounds)
                for shard, ledger in zip(shards, ledgers, strict=True):
                    assert ledger.sweep(*bounds) == swept
                    shard.forget(swept)
                for e in swept:
                    del twin.pages[e.ordinal], seqs[e.ordinal]
                continue
            chash = _hash(f"text{h}")
            if op < 6 and (removed is None or removed.content_hash == chash or op < 3):
                d = _stored(seq, f"p{seq}", f"text{h}")  # a new page
            elif op < 6:  # a new version of the page ``old``
                d = _stored(seq, f"p{seq}", f"text{h}", removed)
            elif op < 8 and removed is not None:
                d = Decision(seq, "x", "delete", removed)
            else:  # replayed, unchanged or rejected: nothing changes
                d = Decision(seq, "x", "unchanged")
            placed = twin_ledger.apply(d)
            want = twin.apply(d, placed.ordinal, placed.removed)
            if placed.removed is not None:
                del seqs[placed.removed]
            if placed.ordinal is not None:
                seqs[placed.ordinal] = (seq, chash)
            answers = [s.apply(d, ledger.apply(d)) for s, ledger in zip(shards, ledgers,
                                                                        strict=True)]
            got = [(a.ordinal, a.original, a.original_id) for a in answers if a is not None]
            assert got == ([] if want is None else [want])
    finally:
        for s in stores:
            s.close()


def test_a_stored_page_cannot_replace_its_own_text(shard: ExactShard) -> None:
    ledger = Ledger()
    _run(shard, ledger, _stored(0, "a", "text"))
    d = _stored(1, "a", "text", Version(0, _hash("text"), None))
    with pytest.raises(ValueError, match="unchanged revisit"):
        shard.apply(d, ledger.apply(d))
