"""Versions, deletes and retention: removal is exact.

The oracle: after any sequence of adds, revisits (unchanged and changed), deletes and
retention sweeps, the pages that come next get exactly the matches they get in a fresh store
built only from the pages still alive, in the same order (near duplicates and passages, OPH
and weighted). The configuration is the one under which removal is exact (README, "Lifecycle
of indexed pages"): no stop lists (``max_list`` above any list here), idf frozen after the
sequence (``idf_freeze_at``), and no page removed while an exact copy of it is alive (every
version here carries a token of its own; unchanged revisits re-send the same words).
Packed runs are exercised (``pack_min`` 2) and so is a list cache that holds almost nothing.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import mmh3
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.config import (
    STORE_FORMAT,
    EngineConfig,
    NearConfig,
    PassageConfig,
    RetentionConfig,
)
from dupalign.match import Match
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.sketch import replay_key
from tests.reused_stores import Stores, temporary_stores

_RNG = random.Random(13)
_VOCAB = [f"w{i}" for i in range(60)]
# shared passages: pages made of them copy from each other
# (short: a page costs about its number of passages, and weighted mode sketches each query
# passage with k ICWS hashes: thousands of sequences must fit in CI time)
_CHUNKS = [" ".join(_RNG.choice(_VOCAB) for _ in range(20)) for _ in range(8)]


def config(mode: str, max_list: int = 100_000) -> EngineConfig:
    return EngineConfig(
        near=NearConfig(idf_freeze_at=(100_000,)),
        passage=PassageConfig(mode=mode, k=16 if mode == "oph" else 8, query_len=16,
                              stride=8, min_len=8, max_list=max_list),
    ).validate()


def text_of(chunks: list[int], edits: int, tag: str) -> str:
    """Chunks of the shared pool, ``edits`` words replaced, and a token of its own."""
    words = " ".join(_CHUNKS[c] for c in chunks).split()
    rng = random.Random(hash((tuple(chunks), edits, tag)))
    for _ in range(edits):
        words[rng.randrange(len(words))] = rng.choice(_VOCAB)
    return f"{tag} " + " ".join(words)


texts = st.builds(lambda chunks, edits: (chunks, edits),
                  st.lists(st.integers(0, len(_CHUNKS) - 1), min_size=1, max_size=3),
                  st.integers(0, 6))
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), texts),
    st.tuples(st.just("changed"), st.integers(0, 50), texts),
    st.tuples(st.just("unchanged"), st.integers(0, 50)),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("max_pages"), st.integers(0, 6)),
    st.tuples(st.just("max_age"), st.integers(0, 6)),
), min_size=1, max_size=14)


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    with temporary_stores("lifecycle-") as stores:
        yield stores


# random sequences per mode in make test, a new draw each run (the slow marker runs 10,000;
# 1,000 took 35 s of CPU with OPH and 68 s weighted on the 2-core test machine; 600 took
# 44 s and 56 s of wall time in a loaded CI run)
EXAMPLES = 300


def wire(matches: list[Match]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in matches]


class Model:
    """The pages alive, in ordinal order: id -> (body of the version, fetched_at)."""

    def __init__(self) -> None:
        self.alive: dict[str, tuple[str, int]] = {}

    def pick(self, n: int) -> str | None:
        return list(self.alive)[n % len(self.alive)] if self.alive else None


def run_sequence(engine: Engine, sequence: list[Any],
                 out: list[Any] | None = None) -> Model:
    """Applies ``sequence``; ``out`` gets what each operation returned."""
    model = Model()
    out = [] if out is None else out
    for clock, op in enumerate(sequence):
        kind = op[0]
        if kind == "add":
            doc_id = f"p{clock}"
            body = text_of(*op[1], tag=f"t{clock}")
            out.append(wire(engine.process(Page(doc_id, body, fetched_at=clock * 1000))))
            model.alive[doc_id] = (body, clock * 1000)
        elif kind in ("changed", "unchanged", "delete"):
            doc_id = model.pick(op[1])
            if doc_id is None:
                continue
            if kind == "delete":
                assert engine.delete([doc_id]) == 1
                del model.alive[doc_id]
                continue
            if kind == "unchanged":  # other bytes, same words: not a replay
                body = model.alive[doc_id][0]
                found = engine.process(Page(doc_id, body.upper() + f" {' ' * clock}",
                                            fetched_at=clock * 1000))
                assert [(m.kind, m.revisit) for m in found] == [("revisit", "unchanged")]
                out.append(wire(found))
                continue
            body = text_of(*op[2], tag=f"t{clock}")
            found = engine.process(Page(doc_id, body, fetched_at=clock * 1000))
            assert [(m.kind, m.revisit) for m in found][:1] == [("revisit", "changed")]
            assert all(m.match_doc_id != doc_id for m in found[1:])
            out.append(wire(found))
            del model.alive[doc_id]  # the new version comes last
            model.alive[doc_id] = (body, clock * 1000)
        else:
            bound = op[1]
            r = (RetentionConfig(max_pages=bound) if kind == "max_pages" else
                 RetentionConfig(max_age=bound))
            # max_pages 0 turns the bound off: nothing leaves
            engine.config = replace(engine.config, retention=r)
            out.append(engine.compact(now_ms=clock * 1000))
            if kind == "max_pages" and bound:
                for doc_id in list(model.alive)[: max(0, len(model.alive) - bound)]:
                    del model.alive[doc_id]
            elif kind == "max_age" and bound:
                cutoff = clock * 1000 - bound * 1000
                for doc_id, (_, fetched) in list(model.alive.items()):
                    if fetched >= cutoff:
                        break
                    del model.alive[doc_id]
    return model


def stop_marks(engine: Engine) -> list[tuple[bytes, bytes]]:
    """The marks of the stop lists (``oph`` keys that are a list's name alone)."""
    return [(k, v) for k, v in engine.store.items("oph") if len(k) == 10]


def check_against_fresh(stores: Stores, cfg: EngineConfig, sequence: list[Any],
                        probes: list[tuple[list[int], int]], pack_min: int,
                        small_cache: bool) -> None:
    """A fresh store of the pages alive, with the same stop lists (a list that became one
    stays one, whatever removals take from it: dupalign.passage.index, step 1)."""
    ours = stores.engine("ours", cfg)
    ours.passages.pack_min = pack_min
    if small_cache:  # every list is read again from the store after each page
        ours.passages.cache.budget = 0
    model = run_sequence(ours, sequence)
    assert ours.indexer.alive == len(model.alive)
    assert [p.id for p in _pages(ours)] == list(model.alive)
    # next: a changed revisit of the oldest page alive, then new pages
    revised = model.pick(0)
    nexts = [Page(f"probe{i}", text_of(*t, tag=f"probe{i}")) for i, t in enumerate(probes)]
    if revised is not None:
        nexts.insert(0, Page(revised, text_of(*probes[0], tag="revised")))
    marks = stop_marks(ours)
    got = [wire(ours.process(p)) for p in nexts]
    if revised is not None:
        assert got[0][0]["kind"] == "revisit"
        got[0] = got[0][1:]
    fresh = stores.engine("fresh", cfg)
    fresh.passages.pack_min = pack_min
    batch = fresh.store.batch()
    for key, value in marks:
        batch.put("oph", key, value)
    fresh.store.write(batch)
    for doc_id, (body, fetched) in model.alive.items():
        if doc_id != revised:
            fresh.process(Page(doc_id, body, fetched_at=fetched))
    want = [wire(fresh.process(p)) for p in nexts]
    assert got == want


def _pages(engine: Engine) -> list[Page]:
    return [Page(msgpack.unpackb(v)["id"], "") for _, v in engine.store.items("docs")]


def _oracle(examples: int) -> Any:
    @settings(max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(sequence=ops, probes=st.lists(texts, min_size=1, max_size=2),
           small_cache=st.booleans(), pack_min=st.sampled_from([2, 8]),
           max_list=st.sampled_from([1, 3, 100_000]))
    def check(stores: Stores, mode: str, sequence: list[Any], probes: list[Any],
              small_cache: bool, pack_min: int, max_list: int) -> None:
        check_against_fresh(stores, config(mode, max_list), sequence, probes, pack_min,
                            small_cache)
    return check


@pytest.mark.parametrize("mode", ["oph", "weighted", "weighted_oph"])
def test_matches_after_removals_equal_a_fresh_store_of_the_pages_alive(
        stores: Stores, mode: str) -> None:
    _oracle(EXAMPLES)(stores, mode)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DUPALIGN_LONG_TESTS") != "1",
                    reason="about 15 minutes of CPU (make test runs slow tests too): set "
                           "DUPALIGN_LONG_TESTS=1")
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mode", ["oph", "weighted", "weighted_oph"])
def test_matches_after_removals_equal_a_fresh_store_many_sequences(
        stores: Stores, mode: str) -> None:
    _oracle(10_000)(stores, mode)


def test_stop_lists_do_not_depend_on_the_list_cache(stores: Stores) -> None:
    """The same operations with every list kept in memory and with few or none: the same
    matches at every step, stop lists (``max_list`` small) and removals included."""
    @settings(max_examples=200, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(sequence=ops, probes=st.lists(texts, min_size=1, max_size=2),
           max_list=st.integers(1, 4), mode=st.sampled_from(["oph", "weighted", "weighted_oph"]),
           small=st.sampled_from([0, 3000]))
    def check(sequence: list[Any], probes: list[Any], max_list: int, mode: str,
              small: int) -> None:
        outs = []
        for budget in (1 << 30, small):
            eng = stores.engine(f"budget{budget}", config(mode, max_list))
            eng.passages.cache.budget = budget
            out: list[Any] = []
            run_sequence(eng, sequence, out)
            out += [wire(eng.process(Page(f"probe{i}", text_of(*t, tag=f"probe{i}"))))
                    for i, t in enumerate(probes)]
            outs.append(out)
        assert outs[0] == outs[1]
    check()


def test_a_stop_list_that_left_memory_is_still_one_after_removals(tmp_path: Path) -> None:
    """The gap this closes: p1's page makes a list long; it leaves memory (budget 0), p0's
    delete brings it back to max_list entries. Every budget then agrees: a list becomes a
    stop list when a query finds it long (p1's found 1 entry: not long), so p2 finds p1."""
    outs = []
    for budget in (1 << 30, 0):
        with Engine.open(tmp_path / str(budget), config("oph", max_list=1)) as eng:
            eng.passages.cache.budget = budget
            eng.process(Page("p0", text_of([0, 1], 0, "t0")))
            eng.process(Page("p1", text_of([0, 2], 0, "t1")))
            assert eng.delete(["p0"]) == 1
            outs.append(kinds(eng.process(Page("p2", text_of([0, 3], 0, "t2")))))
    assert outs == [[("passage", "p1")]] * 2


# -- versions, deletes, retention: the behaviours one by one ---------------------------------
def _words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


@pytest.fixture()
def engine(tmp_path: Path) -> Any:
    with Engine.open(tmp_path / "s", config("oph")) as eng:
        yield eng


def kinds(found: list[Match]) -> list[tuple[str, str]]:
    return [(m.kind, m.match_doc_id) for m in found]


def test_a_new_version_never_matches_its_old_one_and_replaces_it(engine: Engine) -> None:
    base = _words(200, 1)
    engine.process(Page("a", base, url="http://x/a", fetched_at=1000))
    edited = base.replace("w1 ", "w2 ", 3)
    found = engine.process(Page("a", edited, fetched_at=2000))
    assert kinds(found) == [("revisit", "a")]
    rv = found[0]
    assert rv.revisit == "changed" and rv.previous_url == "http://x/a"
    assert rv.previous_fetched_at == 1000 and rv.est_jaccard is not None
    assert 0.5 < rv.est_jaccard < 1 and rv.hamming is not None
    # the old version left every index: a copy of it matches the new version only
    assert kinds(engine.process(Page("b", base))) == [("near", "a")]
    assert engine.indexer.alive == 2 and len(engine.near.table) == 2


def test_a_changed_revisit_of_an_exact_copy_relates_to_it(engine: Engine) -> None:
    """A page stored as an exact copy keeps its verification sketch and fingerprint for
    the revisits of its id (docs/pipeline.md, rule 5), and nothing else: no row in the
    near table, so later pages find the original only."""
    base = _words(200, 9)
    engine.process(Page("a", base))
    assert kinds(engine.process(Page("b", base))) == [("exact", "a")]
    assert len(engine.near.table) == 1
    found = engine.process(Page("b", base.replace("w1 ", "w2 ", 3)))
    assert [(m.kind, m.revisit) for m in found[:1]] == [("revisit", "changed")]
    assert found[0].est_jaccard is not None and 0.5 < found[0].est_jaccard < 1
    assert found[0].hamming is not None
    assert engine.indexer.delete(["b"]) == 1 and len(engine.near.table) == 1
    assert kinds(engine.process(Page("c", base))) == [("exact", "a")]


def test_an_unchanged_revisit_is_only_hashed_and_reports_unchanged(engine: Engine) -> None:
    base = _words(200, 2)
    engine.process(Page("a", base, url="http://x/a", fetched_at=1000))
    before = engine.next_ordinal
    sk = engine.sketch(Page("a", base.upper()))
    assert sk.unchanged and sk.near is None and sk.passage is None  # no sketching
    found = engine.process(Page("a", base.upper(), fetched_at=5000))
    assert [(m.kind, m.revisit, m.previous_fetched_at) for m in found] == [
        ("revisit", "unchanged", 1000)]
    assert engine.next_ordinal == before  # nothing written


def test_the_same_id_and_body_is_still_a_replay(engine: Engine) -> None:
    base = _words(200, 3)
    engine.process(Page("a", base))
    first = engine.process(Page("b", base + " w5 w6 w7"))
    v2 = engine.process(Page("b", _words(200, 4)))
    assert engine.process(Page("b", _words(200, 4))) == v2  # a replay of the new version
    assert v2[0].kind == "revisit"
    # the first body again: its version was replaced, so it is a new version, not a replay
    again = engine.process(Page("b", base + " w5 w6 w7"))
    assert again[0].revisit == "changed" and again[1:] == first


def test_one_body_read_another_way_is_a_new_version_not_a_replay(engine: Engine) -> None:
    """The same id and bytes with another charset (a crawler that corrects one) or type are
    another text: indexed as a new version, not answered with the first reading's matches
    (which would leave the first text indexed for good). Read the same way again: a replay."""
    body = (_words(200, 6) + " café naïve façade").encode("utf-8")
    engine.process(Page("a", body, encoding="latin-1"))  # read as "cafÃ©"
    fixed = engine.process(Page("a", body, encoding="utf-8"))
    assert not engine.last_report.replayed
    assert [(m.kind, m.revisit) for m in fixed] == [("revisit", "changed")]
    assert engine.process(Page("a", body, encoding="UTF8")) == fixed  # the same charset
    assert engine.last_report.replayed
    markup = f"<html><body><p>{_words(200, 7)}</p></body></html>"
    engine.process(Page("h", markup, content_type="text/plain"))
    as_html = engine.process(Page("h", markup, content_type="text/html; charset=utf-8"))
    assert not engine.last_report.replayed and as_html[0].revisit == "changed"
    # (a str body has no charset to declare; xhtml is read as HTML)
    engine.process(Page("h", markup, content_type="application/xhtml+xml", encoding="ascii"))
    assert engine.last_report.replayed


def test_a_format_6_store_is_upgraded_in_place_and_its_pages_replay_as_before(
        tmp_path: Path) -> None:
    """Format 6 kept no reading in its replay values: such a store is read as it is,
    upgraded when opened for writing, and its pages replay however they are read (as
    they did), so a worker restarted on a new version still answers the pages it stored
    but had not published."""
    markup = f"<html><body><p>{_words(200, 8)}</p></body></html>"
    with Engine.open(tmp_path / "s", config("oph")) as engine:
        first = engine.process(Page("h", markup, content_type="text/html"))
        key = replay_key(Page("h", markup))
        engine.store.put("replay", key, cast(bytes, engine.store.get("replay", key))[:8])
        engine.store.put("meta", b"params",
                         msgpack.packb({**engine.store.params, "format": 6}))
    with Engine.open(tmp_path / "s", config("oph"), read_only=True) as reader:
        assert reader.store.params["format"] == 6
    with Engine.open(tmp_path / "s", config("oph")) as engine:
        assert engine.store.params["format"] == STORE_FORMAT
        assert engine.process(Page("h", markup, content_type="text/plain")) == first
        assert engine.last_report.replayed


def test_an_id_with_a_nul_is_never_taken_for_another_page_s_replay(engine: Engine) -> None:
    """(id "a\\0b", body T) and (id "a", body "b\\0" T) are two pages: the second is
    stored and matched, not answered as a replay of the first."""
    text = _words(200, 11)
    engine.process(Page("c", text))
    assert kinds(engine.process(Page("a\x00b", text))) == [("exact", "c")]
    assert kinds(engine.process(Page("a", "b\x00" + text))) == [("near", "c")]
    assert not engine.last_report.replayed and engine.indexer.current("a") is not None
    assert kinds(engine.process(Page("a\x00b", text))) == [("exact", "c")]  # a replay
    assert engine.last_report.replayed
    # ids without a NUL keep their replay keys (stores written before still answer them)
    assert replay_key(Page("a", "T")) == bytes(mmh3.hash_bytes(b"a\x00T"))


def test_a_deleted_page_leaves_every_index(engine: Engine) -> None:
    base = _words(200, 5)
    engine.process(Page("a", base))
    assert engine.delete(["a", "nope"]) == 1
    assert engine.store.get("ids", b"a") is None and len(engine.near.table) == 0
    assert all(False for _ in engine.store.items("oph"))  # no inverted-list entry is left
    assert all(False for _ in engine.store.items("positions"))
    assert all(False for _ in engine.store.items("forward"))  # nor forward record
    assert engine.process(Page("b", base)) == []  # nothing to match
    # a tombstone through the pipeline (Kafka's null value) does the same, in order
    out = list(engine.process_many([(Page("b", "", deleted=True), ("pages", 0, 7)),
                                    (Page("c", base), ("pages", 0, 8))]))
    assert [found for _, found in out] == [[], []]
    assert engine.stored_offsets() == {("pages", 0): 9}
    # the same body under its old id again is a new page, not a replay of the deleted one
    assert engine.process(Page("a", base)) == [Match("a", "exact", "c", est_jaccard=1.0)]


def test_an_ordinal_is_never_given_twice_not_even_after_the_newest_page_left_and_a_reopen(
        tmp_path: Path) -> None:
    """Reopened or not, the store numbers the pages alike: a standby that replays the same
    records without a reopen must number them as the store that was reopened did (its
    shards' lists and partials name pages by these ordinals)."""
    def ids(eng: Engine) -> dict[str, int]:
        return {k.decode(): int.from_bytes(v, "big") for k, v in eng.store.items("ids")}

    with Engine.open(tmp_path / "s", config("oph")) as eng:
        for name in "abc":
            eng.process(Page(name, _words(100, ord(name))))
        assert eng.delete(["c"]) == 1  # the newest page
    with Engine.open(tmp_path / "s", config("oph")) as eng:
        eng.process(Page("d", _words(100, 7)))
        assert ids(eng) == {"a": 0, "b": 1, "d": 3}
        eng.process(Page("e", _words(100, 8)))
        assert eng.delete(["d", "e"]) == 2  # and with every page after a gap gone
    with Engine.open(tmp_path / "s", config("oph")) as eng:
        eng.process(Page("f", _words(100, 9)))
        assert ids(eng) == {"a": 0, "b": 1, "f": 5}


def test_retention_removes_the_oldest_pages_in_ordinal_order(engine: Engine) -> None:
    for i in range(6):
        engine.process(Page(f"p{i}", _words(100, 10 + i), fetched_at=i * 60_000))
    engine.config = replace(engine.config, retention=RetentionConfig(max_pages=4))
    assert engine.compact() == 2
    assert [p.id for p in _pages(engine)] == ["p2", "p3", "p4", "p5"]
    engine.config = replace(engine.config, retention=RetentionConfig(max_age=150))
    assert engine.compact(now_ms=5 * 60_000) == 1  # p2 fetched 3 min before: too old
    assert [p.id for p in _pages(engine)] == ["p3", "p4", "p5"]
    assert engine.stats()["pages"] == 3 and engine.stats()["pages_expired"] == 3


def test_a_retention_sweep_gives_back_the_space_of_the_pages_it_removes(
        engine: Engine) -> None:
    """The sweep compacts the ordinal ranges it deleted: without that, the forward records
    of removed pages stay in memtables and files (behind a range tombstone) until RocksDB's
    background compaction reaches them, and the store saws up and down in a long run."""
    for i in range(200):
        engine.process(Page(f"p{i}", _words(300, 1000 + i)))

    def live(family: str) -> int:
        cf = engine.store._cfs[family]
        return sum(int(cf.property_int_value(p) or 0) for p in (
            "rocksdb.total-sst-files-size", "rocksdb.size-all-mem-tables"))

    before = live("forward") + live("positions")
    engine.config = replace(engine.config, retention=RetentionConfig(max_pages=20))
    assert engine.compact() == 180
    after = live("forward") + live("positions")
    assert after < before / 3, (before, after)


def test_delete_and_compact_from_the_command_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from dupalign.service.cli import main

    lines = [json.dumps({"id": f"p{i}", "body": _words(120, 40 + i), "fetched_at": i * 1000})
             for i in range(5)]
    lines.append(json.dumps({"id": "p1", "deleted": True}))
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    store = str(tmp_path / "s")
    assert main(["scan", str(tmp_path / "in.jsonl"), "--store", store, "--quiet"]) == 0
    assert main(["delete", "p0", "nope", "--store", store]) == 0
    assert "1 of 2 pages deleted" in capsys.readouterr().err
    assert main(["compact", "--store", store, "--max-pages", "2"]) == 0
    assert "1 pages removed by retention, 2 left" in capsys.readouterr().err
    with Engine.open(store, read_only=True) as engine:
        assert [p.id for p in _pages(engine)] == ["p3", "p4"]
    assert main(["delete", "p3", "--store", str(tmp_path / "none")]) == 4


def test_a_worker_batch_is_cut_before_a_record_that_removes_a_page_of_the_same_part() -> None:
    """``removal_cut``: the first part ends before a tombstone or a new body of an id
    stored earlier in the part (an unchanged copy, a rejected record, a delete of a page
    of an earlier part do not cut)."""
    pytest.importorskip("aiokafka")
    from dupalign.service.worker import removal_cut
    from dupalign.wire.messages import MessageRejected

    bad = MessageRejected("schema", "no id")
    gone = Page("old", "", deleted=True)  # a page of an earlier part
    assert removal_cut([gone, Page("a", "x"), bad, Page("a", "x"), Page("b", "y")]) == 5
    assert removal_cut([Page("a", "x"), bad, Page("b", "y"), Page("a", "", deleted=True),
                        Page("c", "z")]) == 3
    assert removal_cut([Page("a", "x"), Page("a", "x2"), Page("a", "x3")]) == 1
    assert removal_cut([Page("a", "", deleted=True), Page("a", "x"),
                        Page("a", "", deleted=True)]) == 2
    assert removal_cut([bad]) == 1


def test_a_worker_batch_cut_into_parts_is_decoded_once(tmp_path: Path) -> None:
    """A micro-batch of revisits (each page, then its new version) is cut before every new
    version; its records are decoded once, not once per part before them."""
    pytest.importorskip("aiokafka")
    from types import SimpleNamespace

    from aiokafka import TopicPartition

    from dupalign.service.config import Config, WorkerConfig
    from dupalign.service.worker import Worker
    from dupalign.wire import messages

    n = 64
    records = [SimpleNamespace(offset=i, key=None, timestamp=0, value=messages.encode_page(
        Page(f"p{i // 2}", _words(100, 70 + i)))) for i in range(n)]
    worker = Worker(Config(worker=WorkerConfig(jobs=1)), tmp_path / "s")
    with Engine.open(tmp_path / "s", EngineConfig()) as eng:
        worker.engine = eng
        rest, decoded, parts, handled = records, None, 0, 0
        while rest:
            result, rest, decoded = worker._process_batch(
                TopicPartition("pages", 0), rest, decoded, -1)
            parts += 1
            handled = result.next_offset
    worker.executor.shutdown()
    assert parts == n // 2 + 1 and handled == n
    assert worker.metrics.registry.get_sample_value(
        "dupalign_stage_seconds_count", {"stage": "decode"}) == n


def test_the_worker_sweeps_retention_between_batches(tmp_path: Path) -> None:
    """The worker's schedule (``[engine.retention]``): at most one sweep per ``every``
    seconds, in the engine thread, counted in the lifecycle metric."""
    pytest.importorskip("aiokafka")
    from dupalign.service.config import load_config
    from dupalign.service.worker import Worker

    path = tmp_path / "w.toml"
    path.write_text("[engine.retention]\nmax_pages = 2\nevery = 3600\n")
    cfg = load_config(path, env={})
    worker = Worker(cfg, tmp_path / "s")
    with Engine.open(tmp_path / "s", cfg.engine) as eng:
        for i in range(4):
            eng.process(Page(f"p{i}", _words(100, 60 + i)))
        worker._retention(eng)  # not due yet: the first sweep comes one period after start
        assert eng.indexer.alive == 4
        worker._last_sweep -= 3600
        worker._retention(eng)
        assert eng.indexer.alive == 2
        eng.process(Page("p9", _words(100, 69)))
        worker._retention(eng)  # swept a moment ago
        assert eng.indexer.alive == 3
    labels = {"event": "expired"}
    assert worker.metrics.registry.get_sample_value(
        "dupalign_lifecycle_pages_total", labels) == 2
    worker.executor.shutdown()
