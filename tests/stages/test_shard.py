"""Index shards by key (dupalign.stages.shards): the same matches whatever the shard count.

The oracle is the single ``Indexer``: random streams of adds, changed and unchanged
revisits, deletes and retention sweeps give, page by page, exactly its matches with S in
{1, 2, 3, 4} shards: exact, near (with an idf freeze inside the stream) and passages, OPH
and weighted, with stop lists (a small ``max_list``), a small ``max_candidates`` and a small
``max_list_read`` so that the caps decide. The list cache differs between the sides (one
holds nothing, the other the default budget): a stop list has one definition whatever the
cache holds (dupalign.passage.index, step 1), and shards hold other subsets of the lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig, RetentionConfig
from dupalign.errors import StoreMismatch
from dupalign.match import Match
from dupalign.page import Page
from dupalign.passage.sketch import PassageState, Rects
from dupalign.runtime.engine import Engine
from dupalign.service.roles.fan_in import FanInIndexer
from dupalign.service.roles.shard_protocol import Partial, ShardMessage, ShardStore, answer, settle
from dupalign.stages.list_shard import owned_part, owned_parts
from dupalign.stages.shards import IndexShard, ShardedIndexer, shard_dir
from dupalign.store import tables
from dupalign.store.database import Store
from dupalign.store.keys import u64
from dupalign.store.records import LOGS
from tests.corpora import demo_pages
from tests.reused_stores import Stores, temporary_stores
from tests.runtime.test_lifecycle import _CHUNKS, _VOCAB, text_of

ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, len(_CHUNKS) - 1), min_size=1,
                                       max_size=3), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("changed"), st.integers(0, 50), st.lists(
        st.integers(0, len(_CHUNKS) - 1), min_size=1, max_size=3), st.integers(0, 40)),
    st.tuples(st.just("unchanged"), st.integers(0, 50)),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("max_pages"), st.integers(1, 8)),
), min_size=1, max_size=16)


COPY_REVISIT = [("add", [0, 1, 2], 0, False), ("add", [0, 1, 2], 0, True),
                ("changed", 1, [0, 3, 4], 0)]


def config(mode: str, max_list: int, max_candidates: int,
           max_list_read: int = 64) -> EngineConfig:
    return EngineConfig(
        near=NearConfig(idf_freeze_at=(6,)),
        passage=PassageConfig(mode=mode, k=16, query_len=16, stride=8, min_len=8,
                              max_list=max_list, max_candidates=max_candidates,
                              max_list_read=max_list_read),
    ).validate()


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    with temporary_stores("shards-") as stores:
        yield stores


def sharded(stores: Stores, cfg: EngineConfig, n: int) -> Engine:
    """An engine over ``n`` shards, on reused stores (their opening was most of an example's
    CPU): the ShardedIndexer that ``Engine.open(shards=n)`` builds, also for n = 1 (there a
    plain open is the single Indexer). Not closed: closing would close the reused stores."""
    params = cfg.frozen_params()
    engine = Engine(stores.store(f"fan-in-of-{n}", params), cfg, shards=1)
    engine.indexer = ShardedIndexer(engine.store, cfg, [
        stores.store(f"shard-{k}-of-{n}", params) for k in range(n)])
    return engine


def wire(matches: list[Match]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in matches]


def run(engine: Engine, sequence: list[Any]) -> list[Any]:
    """Every page's matches and alignment tasks (and every removal's count), in order: the
    tasks too, since align drops candidates that cannot reach θ, and so would hide a
    wrong candidate count."""
    alive: dict[str, str] = {}
    out: list[Any] = []
    index = engine.indexer.index

    def spy(sk: Any, source: Any = None, defer: bool = False) -> Any:
        result = index(sk, source, defer)
        t = None if result.align is None else result.align.tasks
        out.append(None if t is None else [a.tolist() for a in (
            t.t_p, t.t_o, t.lid, t.list_bin, t.list_key)])
        return result

    engine.indexer.index = spy  # type: ignore[method-assign]
    try:
        for clock, op in enumerate(sequence):
            out += step(engine, alive, clock, op)
    finally:
        del engine.indexer.index  # the method again
    return out


def step(engine: Engine, alive: dict[str, str], clock: int, op: Any) -> list[Any]:
    """One operation of a stream: what it returned (nothing when there was nothing alive to
    revisit or delete)."""
    kind = op[0]
    if kind == "page":  # a given page
        return [wire(engine.process(op[1]))]
    if kind == "add":
        _, chunks, edits, exact_copy = op
        doc_id = f"p{clock}"
        # an exact copy of the page alive picked by ``edits`` (exact-before-near)
        body = (alive[list(alive)[edits % len(alive)]] if exact_copy and alive
                else text_of(chunks, edits, tag=f"t{clock}"))
        alive[doc_id] = body
        return [wire(engine.process(Page(doc_id, body, fetched_at=clock)))]
    if kind == "max_pages":
        engine.config = replace(engine.config, retention=RetentionConfig(max_pages=op[1]))
        for doc_id in list(alive)[: max(0, len(alive) - op[1])]:
            del alive[doc_id]
        return [engine.compact(now_ms=clock)]
    if not alive:
        return []
    doc_id = list(alive)[op[1] % len(alive)]
    if kind == "delete":
        del alive[doc_id]
        return [engine.delete([doc_id])]
    if kind == "unchanged":
        return [wire(engine.process(Page(doc_id, alive[doc_id].upper() + " " * clock)))]
    alive[doc_id] = text_of(op[2], op[3], tag=f"v{clock}")
    return [wire(engine.process(Page(doc_id, alive[doc_id])))]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=ops, mode=st.sampled_from(["oph", "weighted", "weighted_oph"]),
       max_list=st.sampled_from([2, 4, 100_000]), max_candidates=st.sampled_from([1, 2, 16]),
       max_list_read=st.sampled_from([1, 2, 64]), single_cached=st.booleans())
# a changed revisit whose shared passage's lists hold max_list + 1 entries with its old
# version: not a stop list, since the version it replaces does not count (dupalign.passage.index
# step 1), so the revisit's passage finds both earlier pages
@example(sequence=[("add", [0, 1, 2], 0, False), ("add", [0, 3, 4], 0, False),
                   ("add", [0, 5, 6], 0, False), ("changed", 2, [0, 7, 1], 0)],
         mode="oph", max_list=2, max_candidates=16, max_list_read=64, single_cached=True)
# the same with only each list's earliest entry counted: the revisit finds the first page
@example(sequence=[("add", [0, 1, 2], 0, False), ("add", [0, 3, 4], 0, False),
                   ("add", [0, 5, 6], 0, False), ("changed", 2, [0, 7, 1], 0)],
         mode="oph", max_list=2, max_candidates=16, max_list_read=1, single_cached=False)
# a changed revisit of an exact copy: the copy's sketch is kept for it (docs/pipeline.md,
# rule 5), in the shard that owns the copy's ordinal
@example(sequence=COPY_REVISIT, mode="oph", max_list=100_000, max_candidates=16,
         max_list_read=64, single_cached=True)
def test_any_shard_count_gives_the_matches_of_the_single_indexer(
        stores: Stores, sequence: list[Any], mode: str, max_list: int, max_candidates: int,
        max_list_read: int, single_cached: bool) -> None:
    cfg = config(mode, max_list, max_candidates, max_list_read)
    single = stores.engine("single", cfg)
    assert not isinstance(single.indexer, ShardedIndexer)
    if not single_cached:  # every list is read again from the store
        single.passages.cache.budget = 0
    want = run(single, sequence)
    for n in (1, 2, 3, 4):
        engine = sharded(stores, cfg, n)
        assert isinstance(engine.indexer, ShardedIndexer)
        if single_cached:  # the other budget than the single Indexer's
            for shard in engine.indexer.shards:
                shard.passages.cache.budget = 0
        assert run(engine, sequence) == want, f"{n} shards"


def _body(seed: int) -> str:
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(_VOCAB) for _ in range(120))


def test_keys_are_spread_over_the_shards_and_not_kept_by_the_fan_in(tmp_path: Path) -> None:
    cfg = config("oph", 100_000, 16)
    with Engine.open(tmp_path / "s", cfg, shards=3) as engine:
        for i in range(12):
            engine.process(Page(f"d{i}", _body(i)))
        ix = engine.indexer
        assert isinstance(ix, ShardedIndexer)
        lists = [sum(1 for _ in s.store.items("oph")) for s in ix.shards]
        sketches = [sorted(int.from_bytes(k, "big") for k, _ in s.store.items("cws"))
                    for s in ix.shards]
        assert all(n > 0 for n in lists)
        assert sketches == [[o for o in range(12) if o % 3 == s] for s in range(3)]
        assert next(engine.store.items("oph"), None) is None  # lists live in the shards
        assert next(engine.store.items("cws"), None) is None
        assert engine.store.get("forward", u64(5)) is not None  # align reads the fan-in's


def test_a_store_refuses_another_shard_count_and_names_the_rebuild(tmp_path: Path) -> None:
    cfg = config("oph", 100_000, 16)
    with Engine.open(tmp_path / "s", cfg, shards=2) as engine:
        engine.process(Page("a", _body(1)))
    assert msgpack.unpackb(tables.shard_count.get(
        Store(tmp_path / "s", {}, read_only=True))) == 2
    for asked in (1, 3):
        with pytest.raises(StoreMismatch, match=f"built for 2 index shard.*asked for {asked}"
                                                f".*dupalign scan --store NEW_STORE "
                                                f"--shards {asked}"):
            Engine.open(tmp_path / "s", cfg, shards=asked)
    # without a count, the store's: a second page matches the first across the shards
    with Engine.open(tmp_path / "s", cfg) as engine:
        assert isinstance(engine.indexer, ShardedIndexer)
        assert [m.kind for m in engine.process(Page("b", _body(1) + " tail"))] == ["near"]
    with Engine.open(tmp_path / "s", cfg, read_only=True) as reader:
        assert len(reader.indexer.shards) == 2  # type: ignore[attr-defined]
        assert reader.query_text(_body(1))
    # a store made before shard counts were recorded (pages, no count) is one shard
    with Engine.open(tmp_path / "one", cfg) as engine:
        engine.process(Page("a", _body(1)))
        batch = engine.store.batch()
        tables.shard_count.delete(batch)
        engine.store.write(batch)
    with pytest.raises(StoreMismatch, match="built for 1 index shard"):
        Engine.open(tmp_path / "one", cfg, shards=2)


def test_shard_entries_of_a_page_the_fan_in_never_stored_are_rolled_back(
        tmp_path: Path) -> None:
    """A crash between the shards' batches and the fan-in's: the shards hold entries of an
    ordinal the fan-in does not have; they are removed at open, and the page indexed
    again gives the matches of a store that never saw the crash."""
    cfg = config("oph", 100_000, 16)
    pages = [Page(f"d{i}", _body(i % 4) + f" own{i}") for i in range(8)]
    with Engine.open(tmp_path / "ref", cfg, shards=2) as ref:
        want = [[m.to_dict() for m in ref.process(p)] for p in pages]
    with Engine.open(tmp_path / "s", cfg, shards=2) as engine:
        got = [[m.to_dict() for m in engine.process(p)] for p in pages[:5]]
        # the shards' writes of a sixth page (another text), not the fan-in's batch
        ix = engine.indexer
        assert isinstance(ix, ShardedIndexer)
        sk = engine.sketch(Page("ghost", _body(9) + " ghost"))
        assert sk.near is not None and sk.passage is not None
        ix.near.put_sketch(engine.store.batch(), 5, sk.near.sketch)
        mine = [shard.stage(5, sk.passage) for shard in ix.shards]
        for shard in ix.shards:
            shard.flush()
        assert any(m is not None for m in mine)
        assert any(s.needs_roll_back(5) for s in ix.shards)
    with Engine.open(tmp_path / "s", cfg) as engine:
        ix = engine.indexer
        assert isinstance(ix, ShardedIndexer)
        assert not any(s.needs_roll_back(5) for s in ix.shards)
        got += [[m.to_dict() for m in engine.process(p)] for p in pages[5:]]
    assert got == want


def test_the_demo_corpus_through_the_pipeline_gives_the_single_engines_matches(
        tmp_path: Path) -> None:
    """The demo (exact, near and passage matches on real text), scanned with 2 shards and
    the sketch/align pool of 2 processes, against one Indexer on one thread."""
    pages = demo_pages()
    with Engine.open(tmp_path / "single") as single:
        want = [wire(single.process(p)) for p in pages]
    with Engine.open(tmp_path / "sharded", shards=2) as engine:
        got = [wire(found) if isinstance(found, list) else found
               for _, found in engine.process_many(((p, None) for p in pages), jobs=2)]
    for matches in (*want, *got):
        for m in matches:
            m.pop("detected_at", None)
    assert sum(map(len, want)) == 25  # demo/README.md
    assert got == want


def test_a_page_that_fails_after_the_shards_wrote_leaves_nothing_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fan-in's batch of a page fails after the shards wrote theirs: the next page
    takes the same ordinal, and the shards' entries of the failed page are rolled back
    first, so later pages get the tasks and matches of a store that never saw it (a page
    copying the failed one's text would otherwise find the next page as a candidate)."""
    cfg = config("oph", 100_000, 16)
    ghost = _body(7)
    pages = [Page(f"d{i}", _body(i) + f" own{i}") for i in range(4)]
    later = [Page("d5", _body(2) + " again"), Page("copy", ghost + " copy")]
    with Engine.open(tmp_path / "ref", cfg, shards=2) as ref:
        want = run_pages(ref, pages + later)
    with Engine.open(tmp_path / "s", cfg, shards=2) as engine:
        got = run_pages(engine, pages)
        real_write = engine.store.write

        def failing_write(batch: Any) -> None:
            raise RuntimeError("the fan-in's write failed")

        monkeypatch.setattr(engine.store, "write", failing_write)
        with pytest.raises(RuntimeError, match="fan-in's write failed"):
            engine.process(Page("ghost", ghost))
        monkeypatch.setattr(engine.store, "write", real_write)
        ix = engine.indexer
        assert isinstance(ix, ShardedIndexer)
        assert any(s.needs_roll_back(len(pages)) for s in ix.shards)  # the ghost's entries
        got += run_pages(engine, later)
    assert got == want


def run_pages(engine: Engine, pages: list[Page]) -> list[Any]:
    return run(engine, [("page", p) for p in pages])


class Loopback(FanInIndexer):
    """The fan-in of the Kafka topology with its S shards in this process, every keys
    message and partial through its bytes (``ShardMessage``, ``Partial``): what the index
    and shard roles do, without Kafka; each page is decided as soon as it is indexed."""

    def __init__(self, store: Store, cfg: EngineConfig, n: int,
                 shard_stores: list[Store] | None = None) -> None:
        """``shard_stores``: the shards' (reused ones, which ``close`` leaves open); else
        new ones beside ``store``."""
        super().__init__(store, cfg, n)
        self.own_stores = shard_stores is None
        stores = shard_stores or [Store(shard_dir(store.path, i), store.params)
                                  for i in range(n)]
        self.shards = [IndexShard(s, cfg, i, n) for i, s in enumerate(stores)]
        self.seq = 0

    def deliver(self) -> list[Partial]:
        partials = []
        for s, msg in self.take():
            shard = self.shards[s]
            p = answer(shard, ShardMessage.from_bytes(msg.to_bytes()))
            shard.flush()
            settle(shard)
            if p is not None:
                partials.append(Partial.from_bytes(p.to_bytes()))
        return partials

    def index(self, sk: Any, source: Any = None, defer: bool = False) -> Any:
        self.seq += 1
        self.begin(self.seq)
        result = super().index(sk, source, defer)
        partials = self.deliver()
        if self.awaits(self.seq):
            assert len(partials) == self.n_shards
            self.decide(self.seq, partials)
        else:
            assert not partials
        return result

    def remove(self, versions: list[Any]) -> None:
        """A delete (inside ``index``) or a retention sweep: sent at once."""
        super().remove(versions)
        assert not self.deliver()

    def close(self) -> None:
        for shard in self.shards if self.own_stores else []:
            shard.store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=ops, mode=st.sampled_from(["oph", "weighted", "weighted_oph"]),
       max_list=st.sampled_from([2, 4, 100_000]), max_candidates=st.sampled_from([1, 2, 16]),
       max_list_read=st.sampled_from([1, 2, 64]), n=st.sampled_from([2, 3]))
@example(sequence=[("add", [0, 1, 2], 0, False), ("add", [0, 3, 4], 0, False),
                   ("add", [0, 5, 6], 0, False), ("changed", 2, [0, 7, 1], 0)],
         mode="oph", max_list=2, max_candidates=16, max_list_read=64, n=2)
# near duplicates (a few words apart), then a changed revisit of the first
@example(sequence=[("add", [0, 1, 2], 0, False), ("add", [0, 1, 2], 1, False),
                   ("add", [0, 1, 2], 2, False), ("add", [0, 1, 2], 1, False),
                   ("changed", 0, [0, 1, 2], 3)],
         mode="weighted", max_list=100_000, max_candidates=16, max_list_read=64, n=3)
@example(sequence=COPY_REVISIT, mode="oph", max_list=100_000, max_candidates=16,
         max_list_read=64, n=2)
def test_the_shards_as_processes_give_the_matches_of_the_single_indexer(
        stores: Stores, sequence: list[Any], mode: str, max_list: int, max_candidates: int,
        max_list_read: int, n: int) -> None:
    """The fan-in (``FanInIndexer``: the page directory, decided from partials) and S
    shards that only see keys messages (``answer``, ``settle``), every message through its
    bytes: page by page the single Indexer's matches and tasks. (On reused stores, as
    the any-shard-count oracle.)"""
    cfg = config(mode, max_list, max_candidates, max_list_read)
    params = cfg.frozen_params()
    want = run(stores.engine("single", cfg), sequence)
    engine = Engine(stores.store(f"fan-in-{n}", params), cfg, shards=n,
                    remote_shards=FanInIndexer)
    assert isinstance(engine.indexer, FanInIndexer)
    engine.indexer = Loopback(engine.store, cfg, n, [
        stores.store(f"loopback-{k}-of-{n}", params) for k in range(n)])
    assert run(engine, sequence) == want
    assert next(engine.store.items("oph"), None) is None  # lists: the shards'
    assert next(engine.store.items("cws"), None) is None


class Recording(Loopback):
    """``Loopback`` whose shards are ``ShardStore``s (what the shard role keeps), with
    every keys message kept, in order, per shard."""

    def __init__(self, store: Store, cfg: EngineConfig, n: int, root: Path) -> None:
        FanInIndexer.__init__(self, store, cfg, n)
        self.stores = [ShardStore(root, cfg, i, n, kept=16) for i in range(n)]
        self.seq = 0
        self.log: list[list[bytes]] = [[] for _ in range(n)]
        self.answers: list[list[bytes]] = [[] for _ in range(n)]

    def deliver(self) -> list[Partial]:
        partials = []
        for s, msg in self.take():
            raw = msg.to_bytes()
            self.log[s].append(raw)
            p = self.stores[s].apply(ShardMessage.from_bytes(raw),
                                     ("keys", s, len(self.log[s]) - 1))
            if p is not None:
                self.answers[s].append(p.to_bytes())
                partials.append(Partial.from_bytes(p.to_bytes()))
        return partials

    def close(self) -> None:
        for store in self.stores:
            store.close()


def _contents(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    return {f: list(store.items(f)) for f in ("oph", "cws", "forward", "meta", "offsets")}


def test_a_shard_store_reads_its_keys_again_after_a_crash_and_answers_the_same(
        tmp_path: Path) -> None:
    """The shard role after a crash (its store ahead of the committed input) and after a
    move to an empty directory (a rebuild from the first keys message): every message
    read again is answered with the partial it had, and the store ends as it was."""
    cfg = config("oph", 4, 16)
    with Engine.open(tmp_path / "fan-in", cfg, shards=2, remote_shards=FanInIndexer) as engine:
        engine.indexer = ix = Recording(engine.store, cfg, 2, tmp_path / "a")
        try:
            for i in range(24):  # copies and near copies of 4 bodies, then deletes
                engine.process(Page(f"d{i}", _body(i % 4) + f" extra{i % 3}"))
            engine.delete(["d1", "d2"])
            engine.process(Page("d3", _body(9)))  # a changed revisit
            want = [_contents(s.store) for s in ix.stores]
        finally:
            ix.close()
    assert all(len(a) > 16 for a in ix.answers)  # more than the partials kept
    for s in range(2):
        log = ix.log[s]
        store = ShardStore(tmp_path / "b", cfg, s, 2, kept=16)
        got = [store.apply(ShardMessage.from_bytes(r), ("keys", s, i))
               for i, r in enumerate(log[:12])]
        store.close()  # the crash: the input committed up to message 5 only
        store = ShardStore(tmp_path / "b", cfg, s, 2, kept=16)
        assert store.offset("keys", s) == 12
        again = [store.apply(ShardMessage.from_bytes(r), ("keys", s, 5 + i))
                 for i, r in enumerate(log[5:])]
        answers = [p.to_bytes() for p in got[:5] + again if p is not None]
        assert answers == ix.answers[s]
        assert _contents(store.store) == {**want[s], "offsets": want[s]["offsets"]}
        store.close()
    # a repeat older than the partials kept cannot be answered: said, not guessed
    store = ShardStore(tmp_path / "b", cfg, 0, 2, kept=16)
    with pytest.raises(StoreMismatch, match="its partial is not kept any more"):
        store.apply(ShardMessage.from_bytes(ix.log[0][0]), ("keys", 0, 0))
    store.close()


_V1_RECTS = {"bin": "<i8", "key": "<u8", "i_lo": "<i8", "i_hi": "<i8", "j_lo": "<i8",
              "j_hi": "<i8", "empty": "?"}


def _as_version_1(msg: ShardMessage) -> bytes:
    """``msg`` as the fan-in wrote keys messages before version 2: every window's whole
    rectangle, the query's bins as int64."""
    d = msgpack.unpackb(msg.to_bytes(), raw=False)
    d["v"] = 1
    if msg.windows is not None and msg.windows.rects is not None:
        r = msg.windows.rects
        d["windows"] = {"n_units": msg.windows.n_units, **{
            f: np.ascontiguousarray(getattr(r, f), dtype=t).tobytes()
            for f, t in _V1_RECTS.items()}}
    if msg.query is not None and msg.query.bins is not None:
        d["query"]["bins"] = np.asarray(msg.query.bins, dtype="<i8").tobytes()
    return bytes(msgpack.packb(d, use_bin_type=True))


class TwoWires(Recording):
    """``Recording`` whose every keys message also goes, as version 1, to a second set of
    shard stores (a keys topic written before the upgrade)."""

    def __init__(self, store: Store, cfg: EngineConfig, n: int, root: Path) -> None:
        super().__init__(store, cfg, n, root / "v2")
        self.old = [ShardStore(root / "v1", cfg, i, n, kept=16) for i in range(n)]
        self.sizes = [0, 0]  # bytes of the version 1 and 2 messages

    def deliver(self) -> list[Partial]:
        partials = []
        for s, msg in self.take():
            raw, old = msg.to_bytes(), _as_version_1(msg)
            self.sizes[0] += len(old)
            self.sizes[1] += len(raw)
            at = ("keys", s, len(self.log[s]))
            self.log[s].append(raw)
            new_msg, old_msg = ShardMessage.from_bytes(raw), ShardMessage.from_bytes(old)
            # answered in the version the sender reads: 1 for a fan-in from before
            assert (new_msg.partial_wire, old_msg.partial_wire) == (2, 1)
            p = self.stores[s].apply(new_msg, at)
            q = self.old[s].apply(old_msg, at)
            assert (p is None) == (q is None)
            if p is not None:
                assert q is not None and p.to_bytes() == q.to_bytes()
                partials.append(Partial.from_bytes(p.to_bytes()))
        return partials

    def close(self) -> None:
        super().close()
        for store in self.old:
            store.close()


def test_keys_messages_of_version_1_are_answered_as_version_2_and_2_is_smaller(
        tmp_path: Path) -> None:
    """Version 2 sends a window as its list only (the shard needs no rectangle). A shard
    reading version 1 messages (retained before an upgrade) answers the same partials and
    holds the same lists; version 2 is under half the bytes."""
    cfg = config("oph", 4, 16)
    with Engine.open(tmp_path / "fan-in", cfg, shards=2, remote_shards=FanInIndexer) as engine:
        engine.indexer = ix = TwoWires(engine.store, cfg, 2, tmp_path)
        try:
            for i in range(24):
                engine.process(Page(f"d{i}", _body(i % 4) + f" extra{i % 3}"))
            engine.delete(["d1", "d2"])
            engine.process(Page("d3", _body(9)))  # a changed revisit
            stores = [(a.store, b.store) for a, b in zip(ix.stores, ix.old, strict=True)]
            for new, old in stores:
                for family in ("oph", "cws", "meta", "offsets"):
                    assert list(new.items(family)) == list(old.items(family)), family
                assert ([k for k, _ in new.items("forward")]
                        == [k for k, _ in old.items("forward")])
            assert sum(1 for new, _ in stores for _ in new.items("oph")) > 24
        finally:
            ix.close()
    assert ix.sizes[1] < 0.5 * ix.sizes[0], ix.sizes


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 5), max_size=6), data=st.data(),
       big=st.booleans())
def test_partials_of_both_versions_read_back_as_sent(counts: list[int], data: Any,
                                                    big: bool) -> None:
    """Version 2 sends the list heads' counts and ordinals as <u4 when they fit (else
    <i8); version 1 sent <i8 and is still read: both give back the arrays sent."""
    top = (1 << 40) if big else (1 << 32) - 1
    ords = np.array(data.draw(st.lists(st.integers(0, top), min_size=sum(counts),
                                       max_size=sum(counts))), dtype=np.int64)
    p = Partial(7, 1, [(3, 2, 0.5)], np.array([c > 4 for c in counts], dtype=bool),
                np.array(counts, dtype=np.int64), ords, np.arange(4, dtype=np.uint64))
    d = msgpack.unpackb(p.to_bytes(), raw=False)
    d.update(v=1, n=p.n.astype("<i8").tobytes(), ords=ords.astype("<i8").tobytes())  # type: ignore[union-attr]
    # what a shard writes for a fan-in from before version 2 is version 1 as it was
    assert p.to_bytes(1) == msgpack.packb(d, use_bin_type=True)
    for raw in (p.to_bytes(), msgpack.packb(d, use_bin_type=True)):
        q = Partial.from_bytes(raw)
        assert (q.seq, q.shard, q.near) == (p.seq, p.shard, p.near)
        for f in ("long", "n", "ords", "prev_sketch"):
            a, b = getattr(q, f), getattr(p, f)
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), f
    width = 8 if len(ords) and int(ords.max()) >= 1 << 32 else 4
    # 4 bytes a count and 8 - width an ordinal fewer; 4 more for the two widths sent
    assert len(p.to_bytes()) <= (len(msgpack.packb(d, use_bin_type=True)) - 4 * len(counts)
                                 - (8 - width) * len(ords) + 4)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 40), shards=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_the_fan_in_s_split_of_a_page_is_each_shard_s_own_part(n: int, shards: int,
                                                             seed: int) -> None:
    """``owned_parts`` (the owners computed once) gives every shard ``owned_part``."""
    rng = np.random.default_rng(seed)
    cols = [rng.integers(0, 50, n) for _ in range(4)]
    state = PassageState(Rects(rng.integers(0, 8, n), rng.integers(0, 2**63, n).astype(np.uint64),
                               *cols, rng.random(n) < 0.2), n + 3)
    for shard, got in enumerate(owned_parts(state, shards)):
        want = owned_part(state, shard, shards)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.n_units == want.n_units and got.positions == want.positions
            for f in ("bin", "key", "i_lo", "i_hi", "j_lo", "j_hi", "empty"):
                assert getattr(got.rects, f).tolist() == getattr(want.rects, f).tolist()


def _fan_in_with_a_sweep(path: Path, cut: int | None) -> tuple[list[Any], list[Any]]:
    """Ten sequence records through a fan-in and two ``ShardStore`` as the index role runs
    them, a retention sweep (2 pages kept, every 4 records) before records 4 and 8; page i copies
    half of page i - 2. ``cut``: a SIGKILL once ``cut`` of the sweep's removals at record 4
    are written, before its page is; the store is then taken over as the role does
    (``recover``, the messages from E = 4 sent again, record 4 read again). Returns the
    partials and matches of every page and the shards' stores."""
    cfg = replace(config("oph", 4, 16), retention=RetentionConfig(max_pages=2, every=4))
    shards = [ShardStore(path / "shards", cfg, s, 2, kept=64) for s in range(2)]
    offsets = [0, 0]
    answered: list[Any] = []
    found: list[Any] = []

    def deliver(messages: list[tuple[int, ShardMessage]]) -> list[Partial]:
        partials = []
        for s, m in messages:
            p = shards[s].apply(ShardMessage.from_bytes(m.to_bytes()), ("keys", s, offsets[s]))
            offsets[s] += 1
            if p is not None:
                partials.append(Partial.from_bytes(p.to_bytes()))
        return partials

    def record(engine: Engine, seq: int, sweep: bool) -> None:
        ix = engine.indexer
        assert isinstance(ix, FanInIndexer)
        ix.begin(seq)
        if sweep:
            engine.compact(now_ms=seq)
        text = _body(seq) + ("" if seq < 2 else " " + _body(seq - 2))
        result = ix.index(engine.sketch(Page(f"d{seq}", text, fetched_at=seq)),
                          ("sequence", 0, seq))
        partials = deliver(ix.take())
        answered.append(sorted(p.to_bytes() for p in partials))
        if ix.awaits(seq):
            ix.decide(seq, partials)
        found.append([m.to_dict() for m in ix.finish(result, engine.align(result))])

    with Engine.open(path / "fan-in", cfg, shards=2, remote_shards=FanInIndexer) as engine:
        for seq in range(4):
            record(engine, seq, False)
        if cut is None:
            record(engine, 4, True)
        else:
            ix = engine.indexer
            assert isinstance(ix, FanInIndexer)
            ix.begin(4)
            ix.remove(ix.expired(2, 0, 4, limit=cut))  # one write batch of the sweep
    if cut is None:
        first = 5
    else:
        with Engine.open(path / "fan-in", cfg, shards=2, remote_shards=FanInIndexer) as engine:
            ix = engine.indexer
            assert isinstance(ix, FanInIndexer)
            stored, again = ix.recover(engine.stored_offsets().get(("sequence", 0)), 4)
            # record 4 was never sent: it is read again (the role's retention schedule
            # goes on from record 3, so its sweep is due there again and finishes)
            assert (stored, again) == (4, [])
            record(engine, 4, True)
        first = 5
    with Engine.open(path / "fan-in", cfg, shards=2, remote_shards=FanInIndexer) as engine:
        for seq in range(first, 10):
            record(engine, seq, seq == 8)
    contents = [_contents(s.store) for s in shards]
    for s in shards:
        s.close()
    return [answered, found], contents


@pytest.mark.parametrize("cut", [1, 2])
def test_a_fan_in_killed_in_a_retention_sweep_sends_the_record_once_and_finishes_the_sweep(
        tmp_path: Path, cut: int) -> None:
    """A SIGKILL of the fan-in inside the sweep before record 4 (cut = 1: after the first
    of its write batches, the sweep not finished; cut = 2: after the whole sweep, before
    the page). The shards must see record 4 once, with all of the sweep's removals: they
    took the sweep's part, sent again, then the page's own message under the same record
    for a repeat whose partial they never made ("its partial is not kept"), at every
    start; a sweep cut after its first batch was not finished. Every partial, match and
    shard store is then the one of the run without the kill."""
    want, want_shards = _fan_in_with_a_sweep(tmp_path / "whole", None)
    got, got_shards = _fan_in_with_a_sweep(tmp_path / "killed", cut)
    assert sum(len(m) for m in want[1]) > 4  # pages match the ones the sweeps leave
    assert got == want
    assert got_shards == want_shards


@pytest.mark.parametrize("marked", [True, False])
def test_a_takeover_takes_a_record_for_one_cut_short_only_if_its_entry_is_not_marked_complete(
        tmp_path: Path, marked: bool) -> None:
    """d1 waits for align when a sweep before record 2 removes d0 and record 2 is d1 again
    (a replay: it writes nothing, and behind d1 it stores no sequence offset). ``index``
    marks the sweep's entry complete in a batch of its own, so a takeover counts record 2
    in the store's offset, nothing carried. An entry without the mark (written by the
    version before it) is read as that version read it: not covered by the offset, not
    an unfinished page, so cut short and not counted."""
    cfg = config("oph", 4, 16)
    shards = [ShardStore(tmp_path / "shards", cfg, s, 2, kept=8) for s in range(2)]
    with Engine.open(tmp_path / "fan-in", cfg, shards=2, remote_shards=FanInIndexer) as engine:
        ix = engine.indexer
        assert isinstance(ix, FanInIndexer)
        for seq, body in enumerate([0, 1, 1]):
            ix.begin(seq)
            if seq == 2:
                ix.remove(ix.expired(max_pages=1))  # the sweep due before record 2
            result = ix.index(engine.sketch(Page(f"d{body}", _body(body))), ("sequence", 0, seq))
            partials = [shards[s].apply(m, ("keys", s, seq)) for s, m in ix.take()]
            if ix.awaits(seq):
                ix.decide(seq, [p for p in partials if p is not None])
            if seq == 0:
                ix.finish(result, [])
        assert result.replay_of is not None
        if not marked:
            for key, raw in list(engine.store.prefix("meta", LOGS["outbox"])):
                entry = msgpack.unpackb(raw, raw=False)
                del entry["complete"]
                engine.store.put("meta", key, msgpack.packb(entry, use_bin_type=True))
    for shard in shards:
        shard.close()
    with Engine.open(tmp_path / "fan-in", cfg, shards=2, remote_shards=FanInIndexer) as engine:
        ix = engine.indexer
        assert isinstance(ix, FanInIndexer)
        stored = engine.stored_offsets().get(("sequence", 0))
        assert stored == 1  # d0's
        stored, again = ix.recover(stored, 1)
        carried = None if ix.carried is None else ix.carried[0]
        assert (stored, carried) == ((3, None) if marked else (2, 2))
        assert sorted({seq for seq, _, _ in again}) == ([1, 2] if marked else [1])
        assert ix.first_resumable() == 1


@pytest.mark.parametrize("layout", ["shards elsewhere", "shards under the fan-in",
                                    "unmarked, shards elsewhere"])
def test_the_fan_in_of_the_kafka_topology_is_not_opened_with_local_shards(
        tmp_path: Path, layout: str) -> None:
    """Review D, bug 4: `dupalign compact` on the index role's store (kafka.index_shards = 2)
    opened it with local shards: it made new empty shard stores and finished d1, which
    waited for its partials, with the directory's matches alone (published so by the role
    after it). A local open of the fan-in is refused, read-only too when its shards are not
    there; the role still resumes d1. "unmarked": a store the role used before the mark."""
    cfg = config("oph", 4, 16)
    fan_in = tmp_path / "fan-in"
    shard_root = fan_in if layout == "shards under the fan-in" else tmp_path / "shards"
    shards = [ShardStore(shard_root, cfg, s, 2, kept=8) for s in range(2)]
    with Engine.open(fan_in, cfg, shards=2, remote_shards=FanInIndexer) as engine:
        ix = engine.indexer
        assert isinstance(ix, FanInIndexer)
        for seq in range(2):
            ix.begin(seq)
            result = ix.index(engine.sketch(Page(f"d{seq}", _body(seq))), ("sequence", 0, seq))
            for s, m in ix.take():
                shards[s].apply(m, ("keys", s, seq))
            if seq == 0:
                ix.finish(result, [])  # d1 is left waiting
        if layout == "unmarked, shards elsewhere":
            batch = engine.store.batch()
            tables.fan_in.delete(batch)
            engine.store.write(batch)
    for shard in shards:
        shard.close()
    with pytest.raises(StoreMismatch, match=r"only the index role opens it \(dupalign worker "
                                            r"--roles index, kafka.index_shards = 2\)"):
        Engine.open(fan_in, cfg)
    if layout == "shards under the fan-in":
        with Engine.open(fan_in, cfg, read_only=True) as reader:  # writes nothing
            assert reader.stats()["pages"] == 2
    else:
        with pytest.raises(StoreMismatch, match="shards/0 is missing"):
            Engine.open(fan_in, cfg, read_only=True)
        assert not (fan_in / "shards").exists()
    with Engine.open(fan_in, cfg, shards=2, remote_shards=FanInIndexer) as engine:
        ix = engine.indexer
        assert isinstance(ix, FanInIndexer)
        ix.recover(engine.stored_offsets().get(("sequence", 0)), 1)
        assert ix.first_resumable() == 1
