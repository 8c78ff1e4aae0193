"""The staged engine: matches never depend on the number of workers, messages survive the
wire, and a page interrupted between its index batch and its matches is finished at open."""

from __future__ import annotations

import contextlib
import pickle
import random
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.errors import ConfigError, PageRejected
from dupalign.match import Match
from dupalign.page import Page
from dupalign.passage.sketch import query_lists, window_lists
from dupalign.runtime import engine as engine_module
from dupalign.runtime import pipeline
from dupalign.runtime.engine import Engine
from dupalign.runtime.pipeline import ExecutorKind
from dupalign.stages.align import Aligner
from dupalign.stages.messages import AlignRequest, IndexResult
from dupalign.stages.sketch import PageSketch, Sketcher
from dupalign.wire import messages
from tests.runtime.test_engine import edit, rfc_words


def random_pages(seed: int, n: int) -> list[Page]:
    """Pages cut from RFC text, many of them copying (with edits) regions of earlier ones,
    some exact repeats, some replays (same id and body), some rejected."""
    rng = random.Random(seed)
    sources = [rfc_words(name, 0, 6000) for name in ("rfc2821.txt", "rfc5321.txt", "rfc5322.txt")]
    pages: list[Page] = []
    for i in range(n):
        roll = rng.random()
        if pages and roll < 0.08:
            pages.append(rng.choice(pages))  # a replay
            continue
        if roll < 0.12:
            pages.append(Page(id=f"bad{i}", body=bytes(range(256)) * 20))  # undecodable
            continue
        texts = [p for p in pages if isinstance(p.body, str)]
        if texts and roll < 0.3:  # an exact or near copy of an earlier page under a new id
            body = str(rng.choice(texts).body).split()
            pages.append(Page(id=f"c{i}", body=" ".join(
                edit(body, rng.choice([0.0, 0.01]), rng.randrange(10**6)))))
            continue
        words: list[str] = []
        for _ in range(rng.randint(1, 3)):
            src = rng.choice(sources)
            a = rng.randrange(len(src) - 400)
            words += edit(src[a:a + rng.randint(60, 400)], rng.choice([0.0, 0.03, 0.1]),
                          rng.randrange(10**6))
        pages.append(Page(id=f"p{i}", body=" ".join(words)))
    pages.insert(n // 2, Page(id="blank", body="<p> </p>", content_type="text/html"))
    return pages


def run(store: Path, pages: list[Page], jobs: int, cfg: EngineConfig,
        executor: ExecutorKind = "process") -> list[object]:
    out: list[object] = []
    with Engine.open(store, cfg) as engine:
        items = [(p, ("pages", 0, n)) for n, p in enumerate(pages)]
        for page, found in engine.process_many(items, jobs=jobs, executor=executor):
            if isinstance(found, PageRejected):
                out.append((page.id, "rejected", found.reason))
            else:
                assert not isinstance(found, BaseException), found
                out.append((page.id, [m.to_dict() for m in found]))
        assert engine.stored_offsets() == {("pages", 0): len(pages)}
    return out


@pytest.mark.parametrize("seed", [4, 6])
def test_matches_do_not_depend_on_the_number_of_workers(tmp_path: Path, seed: int) -> None:
    # idf freezes inside the run: pages sketched under an older table are re-fingerprinted
    cfg = EngineConfig(near=NearConfig(idf_freeze_at=(10, 30))).validate()
    pages = random_pages(seed, 60)
    one = run(tmp_path / "one", pages, 1, cfg)
    four = run(tmp_path / "four", pages, 4, cfg)
    assert four == one
    kinds = {m["kind"] for _, *rest in one if rest and isinstance(rest[0], list)
             for m in rest[0]}
    assert {"exact", "near", "passage"} <= kinds, "the stream must exercise every kind"
    assert any(r[1] == "rejected" for r in one)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_one_pool_serves_a_run_across_idf_freezes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: ExecutorKind) -> None:
    """The workers read each new idf table from the store: no second pool, and (threads:
    seen here) the pages sketched in the pool after the last freeze use the last table."""
    made: list[object] = []

    class Counted(engine_module.WorkerPool):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.append(self)

    versions: list[int] = []
    real = pipeline.sketch_in_worker

    def recorded(page: Page) -> Any:
        sk = real(page)
        if sk.near is not None and sk.near.indexed:
            versions.append(sk.near.idf_version)
        return sk

    monkeypatch.setattr(engine_module, "WorkerPool", Counted)
    monkeypatch.setattr(pipeline, "sketch_in_worker", recorded)
    monkeypatch.setattr(pipeline, "DEPTH", 8)  # (sent ahead: every page, at 64)
    cfg = EngineConfig(near=NearConfig(idf_freeze_at=(10, 30))).validate()
    pages = random_pages(4, 60)
    assert run(tmp_path / "s", pages, 2, cfg, executor) == run(tmp_path / "one", pages, 1, cfg)
    assert len(made) == 1
    if executor == "thread":
        assert versions and versions[-1] == 2


_SLOW_WORKER = """
import sys, time
from pathlib import Path
from dupalign.runtime import engine as engine_module
from dupalign.runtime import pipeline
from dupalign.runtime.engine import Engine
from tests.runtime.test_pipeline import random_pages

calls = Path(sys.argv[2])
real_sketch, real_align = pipeline.sketch_chunk_in_worker, pipeline.align_in_worker

def slow(name):  # (forked into the pool: only its process runs this)
    with calls.open("a") as f:
        f.write(name + chr(10))
    time.sleep(2)

def slow_sketch(pages):
    slow("sketch")
    return real_sketch(pages)

def slow_align(request):
    slow("align")
    return real_align(request)

pipeline.sketch_chunk_in_worker = slow_sketch
pipeline.align_in_worker = slow_align
with Engine.open(sys.argv[1]) as engine:
    n = sum(1 for _ in engine.process_many(((p, None) for p in random_pages(6, 60)), jobs=2))
print(n)
"""


def test_the_calling_thread_takes_back_the_work_of_a_slow_pool(tmp_path: Path) -> None:
    """With ``jobs`` = 2 the pool has one process and the calling thread is the second
    core: whenever it would wait for the pool it cancels work no worker has started and
    does it itself. A pool process that takes 2 s per call does a few calls, the calling
    thread all the rest, and the matches are those of one thread."""
    import subprocess
    import sys

    calls = tmp_path / "calls"
    run_ = subprocess.run([sys.executable, "-c", _SLOW_WORKER, str(tmp_path / "slow"),
                           str(calls)], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    pages = random_pages(6, 60)
    assert run_.returncode == 0 and run_.stdout.split() == [str(len(pages))], run_.stderr[-3000:]
    pool_calls = calls.read_text().split()
    with Engine.open(tmp_path / "slow") as engine:
        slow = _stored_matches(engine)
    with Engine.open(tmp_path / "one") as engine:
        for _ in engine.process_many(((p, None) for p in pages), jobs=1):
            pass
        assert slow == _stored_matches(engine)
    assert any(v[1] and any(m["kind"] == "passage" for m in v[1]) for v in slow.values())
    # 16 chunks of 4 sketches and ~35 alignments (51 calls in all when the pool does
    # everything): the pool's process, which holds two calls at a time (CPython's call
    # queue), did a few (5-6 here, unloaded)
    assert 1 <= len(pool_calls) <= 12, pool_calls


def test_work_taken_back_is_the_whole_chunk_of_sketches(tmp_path: Path) -> None:
    """The calling thread takes back the chunk of sketches of the page it waits for when no
    worker has started it, with its first pages already off the queue: it sketches the
    whole chunk, so that every page gets its own sketch. Here the pool's one worker is
    busy with other work when the run starts, so the first chunk waits in the pool."""
    pages = random_pages(9, 40)
    items = [(p, None) for p in pages]
    with Engine.open(tmp_path / "two") as engine:
        engine.worker_pool("thread", 1).executor.submit(time.sleep, 1.0)  # busy
        two = [(p.id, repr(f) if isinstance(f, BaseException) else [m.to_dict() for m in f])
               for p, f in pipeline.run_pipeline(engine.stages(), items, 2, "thread", depth=8)]
    with Engine.open(tmp_path / "one") as engine:
        one = [(p.id, repr(f) if isinstance(f, BaseException) else [m.to_dict() for m in f])
               for p, f in engine.process_many(items, jobs=1)]
    assert two == one


def lifecycle_pages(seed: int, n: int) -> list[Page]:
    """``random_pages`` with revisits (the same words in other bytes: unchanged; edited:
    changed) and deletes of earlier ids mixed in."""
    rng = random.Random(seed)
    pages: list[Page] = []
    for page in random_pages(seed, n):
        pages.append(page)
        texts = [p for p in pages if isinstance(p.body, str) and not p.deleted]
        roll = rng.random()
        if texts and roll < 0.15:
            old = rng.choice(texts)
            body = str(old.body)
            pages.append(Page(id=old.id, body=body + "  " if roll < 0.07 else " ".join(
                edit(body.split(), 0.05, rng.randrange(10**6)))))
        elif texts and roll < 0.22:
            pages.append(Page(id=rng.choice(texts).id, body="", deleted=True))
    return pages


def test_a_broken_pool_stops_the_stream_before_the_page_it_could_not_sketch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker process that dies (the OOM killer, say) breaks the pool: that is no fault
    of the page whose sketch it took, so the page is not skipped as a failed page (its
    offset would advance and a restart would never read it again): the stream stops, no
    later page is indexed, and a restart from the stored offset gives the matches of an
    unbroken run."""
    pages = [p for p in random_pages(8, 40) if not p.id.startswith("bad")]
    victim = pages[17].id
    sketch = Sketcher.sketch

    def dying(self: Sketcher, page: Page, *args: Any) -> PageSketch:
        # (the page's chunk may be sketched by the pool or taken back by the caller)
        if page.id == victim:
            raise BrokenProcessPool("a child process terminated abruptly")
        return sketch(self, page, *args)

    monkeypatch.setattr(Sketcher, "sketch", dying)
    items = [(p, ("pages", 0, n)) for n, p in enumerate(pages)]
    with Engine.open(tmp_path / "broken") as engine:
        with pytest.raises(BrokenProcessPool):
            for _ in engine.process_many(items, jobs=2, executor="thread"):
                pass
        assert engine.stored_offsets()[("pages", 0)] == 17
        assert engine.indexer.current(victim) is None
    monkeypatch.setattr(Sketcher, "sketch", sketch)
    with Engine.open(tmp_path / "broken") as engine:  # the restart, from the stored offset
        for _ in engine.process_many(items[17:], jobs=2, executor="thread"):
            pass
        restarted = _stored_matches(engine)
    with Engine.open(tmp_path / "whole") as engine:
        for _ in engine.process_many(items, jobs=1):
            pass
        assert restarted == _stored_matches(engine)
    assert victim in restarted


def _stored_matches(engine: Engine) -> dict[str, Any]:
    """Every stored page's ordinal and stored matches, by id."""
    out = {}
    for key, value in engine.store.items("ids"):
        raw = engine.store.get("matches", value)
        out[key.decode()] = (value, None if raw is None else msgpack.unpackb(raw))
    return out


def test_revisits_and_deletes_do_not_depend_on_the_number_of_workers(tmp_path: Path) -> None:
    """Deletes and unchanged revisits cross the pool as sketches with their flags."""
    pages = lifecycle_pages(7, 50)
    one = run(tmp_path / "one", pages, 1, EngineConfig())
    assert run(tmp_path / "four", pages, 4, EngineConfig()) == one
    revisits = {m["revisit"] for _, *rest in one if rest and isinstance(rest[0], list)
                for m in rest[0] if m["kind"] == "revisit"}
    assert revisits == {"unchanged", "changed"}, "the stream must exercise both revisits"
    assert any(p.deleted for p in pages)


def test_threads_read_the_forward_records_of_the_store_itself(tmp_path: Path) -> None:
    """With threads the align workers read the store the index writes (no secondary)."""
    pages = random_pages(5, 30)
    assert (run(tmp_path / "t", pages, 2, EngineConfig(), "thread")
            == run(tmp_path / "one", pages, 1, EngineConfig()))


def _check_combine_form(sk: PageSketch) -> None:
    """The combine's copy: valid, whether near-indexed, the passages without the windows."""
    raw = sk.to_combine_bytes()
    messages.validate("page_sketch", msgpack.unpackb(raw, raw=False))
    back = PageSketch.from_bytes(raw)
    assert back.id == sk.id and back.content_hash == sk.content_hash
    assert (back.near is None) == (sk.near is None)
    if sk.near is not None and back.near is not None:
        assert back.near.indexed == sk.near.indexed and back.near.unique is None
    if sk.passage is None or back.passage is None:
        assert back.passage is sk.passage is None
        return
    assert back.passage.rects is None and back.passage.positions == sk.passage.positions
    assert (back.passage.keys is None) == (sk.passage.rects is None)
    for name in ("starts", "ends", "keys", "empty"):
        got, want = getattr(back.passage, name), getattr(sk.passage, name)
        assert (got is None and want is None) or np.array_equal(got, want)
    assert len(raw) < len(sk.to_bytes()) or sk.passage.rects is None


@pytest.mark.parametrize("mode", ["oph", "weighted_oph"])  # weighted_oph: 3-column empty rows
def test_messages_round_trip_and_match_their_schemas(tmp_path: Path, mode: str) -> None:
    pages = random_pages(3, 12)
    cfg = EngineConfig(passage=PassageConfig(mode=mode)).validate()
    with Engine.open(tmp_path / "s", cfg) as engine:
        requests = 0
        for page in pages:
            sk = engine.sketch(page)
            messages.validate("page_sketch", msgpack.unpackb(sk.to_bytes(), raw=False))
            back = PageSketch.from_bytes(sk.to_bytes())
            assert back.to_bytes() == sk.to_bytes()
            # the router's read: all but the passage sketch
            near_only = PageSketch.from_bytes(sk.to_bytes(), passage=False)
            assert near_only.passage is None
            back.passage = None
            assert near_only.to_bytes() == back.to_bytes()
            back = PageSketch.from_bytes(sk.to_bytes())
            _check_combine_form(sk)
            # a sketch of the version before (no reading) is read; the one before, refused
            earlier = {k: v for k, v in msgpack.unpackb(sk.to_bytes(), raw=False).items()
                       if k != "read_as"}
            assert PageSketch.from_bytes(msgpack.packb({**earlier, "v": 1})).read_as == ""
            with pytest.raises(ValueError, match="page sketch version 0"):
                PageSketch.from_bytes(msgpack.packb({**earlier, "v": 0}))
            if sk.passage is not None and sk.passage.rects is not None:
                # the distinct lists the sketch stage found for the index are not on the
                # wire: the index finds the same ones from the sketches
                assert sk.passage.lists is not None and sk.passage.window_lists is not None
                assert back.passage is not None and back.passage.lists is None
                _assert_same(query_lists(back.passage)[2:], sk.passage.lists)
                _assert_same(window_lists(back.passage), sk.passage.window_lists)
            # the pool's compact form: all but the unit hashes, which only the forward
            # stage of the partitioned pipeline reads (from the sketch stage's own)
            pooled = pickle.loads(pickle.dumps(sk))
            if sk.passage is None:
                _assert_same(pooled, sk)
            else:
                assert pooled.passage is not None and pooled.passage.units is None
                _assert_same(pooled, replace(sk, passage=replace(sk.passage, units=None)))
            result = engine.index(back)
            assert IndexResult.from_bytes(result.to_bytes()).to_bytes() == result.to_bytes()
            if result.align is not None:
                requests += 1
                with pytest.raises(ValueError, match="forward data is not attached"):
                    result.align.to_bytes(forward=True)
                # what the index keeps (align reads the forward records from the store) and
                # what an align stage without store access receives: the same matches
                bare = AlignRequest.from_bytes(result.align.to_bytes(forward=False))
                carried = engine.indexer.with_forward(
                    AlignRequest.from_bytes(result.align.to_bytes(forward=False)))
                for forward in (True, False):
                    messages.validate("align_request", msgpack.unpackb(
                        carried.to_bytes(forward), raw=False))
                broken = carried.to_dict()
                del broken["t_p"]
                with pytest.raises(messages.MessageRejected):
                    messages.validate("align_request", {"v": 2, **broken})
                wire = AlignRequest.from_bytes(carried.to_bytes())
                assert wire.to_bytes() == carried.to_bytes()
                _assert_every_width_round_trips(AlignRequest.from_bytes(carried.to_bytes()))
                no_store = Aligner(engine.config)  # (align_replay's view)
                assert (no_store.align(wire) == engine.aligner.align(bare)
                        == engine.aligner.align(result.align))
                with pytest.raises(KeyError, match="no store"):
                    no_store.align(AlignRequest.from_bytes(result.align.to_bytes(False)))
            with contextlib.suppress(PageRejected):
                engine.indexer.finish(result, engine.align(result))
        assert requests


def _assert_every_width_round_trips(request: AlignRequest) -> None:
    """The gathered windows go in the narrowest types that hold them (u2 positions, u4
    ordinals: small pages, few pages), else wide; requests of earlier versions, which
    name no types (i4 positions, u8 ordinals), read as before."""
    t = request.tasks

    def fields(r: AlignRequest) -> list[Any]:
        return [r.tasks.ords.tolist(), r.tasks.rects.tolist(), r.tasks.empty_lr.tolist()]

    d = request.to_dict()
    assert (d["pos_type"], d["ord_type"]) == ("<u2", "<u4")
    steps = bool(np.any(t.empty_lr[:, 1] != t.empty_lr[:, 2]))
    assert d.get("empty_cols", 2) == (3 if steps else 2)
    earlier = {**d, "ords": t.ords.astype("<u8").tobytes(),
               "rects": t.rects.astype("<i4").tobytes(),
               "empty_lr": t.empty_lr[:, [0, 2]].astype("<i4").tobytes()}  # (gaps: l, r)
    del earlier["pos_type"], earlier["ord_type"]
    earlier.pop("empty_cols", None)
    if not steps:  # (earlier versions carried gaps only)
        assert fields(AlignRequest.from_dict(earlier)) == fields(request)
    # as the wire gives it: version 2 read, version 1 (older still) refused
    wire = msgpack.packb({**earlier, "v": 2}, use_bin_type=True)
    if not steps:
        assert fields(AlignRequest.from_bytes(wire)) == fields(request)
    with pytest.raises(ValueError, match="message version 1"):
        AlignRequest.from_bytes(msgpack.packb({**earlier, "v": 1}, use_bin_type=True))
    if len(t.ords):
        t.rects = t.rects.copy()
        t.rects[0, 3] = 70_000
        t.ords = t.ords + 2**32
        d = request.to_dict()
        assert (d["pos_type"], d["ord_type"]) == ("<i4", "<u8")
        assert fields(AlignRequest.from_dict(d)) == fields(request)


def _assert_same(a: Any, b: Any) -> None:
    """Equal values, numpy arrays of the same dtype and shape included."""
    if isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(b, tuple):
        assert isinstance(a, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif hasattr(b, "__dataclass_fields__"):
        assert type(a) is type(b)
        for name in b.__dataclass_fields__:
            _assert_same(getattr(a, name), getattr(b, name))
    else:
        assert a == b


def test_a_crash_between_index_and_matches_is_finished_at_open(tmp_path: Path) -> None:
    pages = random_pages(4, 20)
    straight: list[list[Match]] = []
    with Engine.open(tmp_path / "a") as engine:
        for p in pages:
            try:
                straight.append(engine.process(p))
            except PageRejected:
                straight.append([])
    # the same stream, but the process "dies" after the index batch of a page with tasks
    cut = None
    with Engine.open(tmp_path / "b") as engine:
        for n, p in enumerate(pages):
            result = engine.index(engine.sketch(p))
            if result.align is not None and n > 5:
                cut = n
                break
            with contextlib.suppress(PageRejected):
                engine.indexer.finish(result, engine.align(result))
    assert cut is not None
    with Engine.open(tmp_path / "b") as engine:  # finishes the page at open
        assert engine.indexer.unfinished == 0
        again = [engine.process(p) for p in pages[cut:cut + 1]]  # a replay now
        assert again == straight[cut:cut + 1] and again[0]


def test_passage_matches_per_page_are_capped_keeping_the_best(tmp_path: Path) -> None:
    words = rfc_words("rfc2821.txt", 0, 900)
    # eight earlier pages copy more and more of the text, each with words of its own
    earlier = [Page(id=f"e{i}", body=" ".join(
        edit(words[: 120 + 90 * i], 0.03, i) + [f"own{i}x{j}" for j in range(80)]))
        for i in range(8)]
    query = Page(id="q", body=" ".join(edit(words, 0.02, 99)))

    def passages(cap: int, store: Path) -> list[Match]:
        cfg = EngineConfig(near=NearConfig(enabled=False),
                           passage=PassageConfig(max_matches=cap)).validate()
        with Engine.open(store, cfg) as engine:
            for p in earlier:
                engine.process(p)
            return [m for m in engine.process(query) if m.kind == "passage"]

    every = passages(1000, tmp_path / "all")
    capped = passages(3, tmp_path / "capped")
    assert len(every) == 8 and len(capped) == 3

    def covered(m: Match) -> int:
        assert m.spans
        return sum(s.tokens[1] - s.tokens[0] for s in m.spans)

    best = sorted(every, key=lambda m: (-covered(m), -(m.est_jaccard or 0), m.match_doc_id))
    assert [m.match_doc_id for m in capped] == sorted(m.match_doc_id for m in best[:3])
    assert capped == [m for m in every if m in best[:3]]
    with pytest.raises(ConfigError, match=r"passage\.max_matches"):
        EngineConfig(passage=PassageConfig(max_matches=0)).validate()


@pytest.mark.parametrize("executor", ["process", "thread"])
def test_revisits_and_deletes_in_flight_do_not_depend_on_the_workers(
        tmp_path: Path, executor: ExecutorKind) -> None:
    """New versions and tombstones of pages that pages still being aligned copy from: the
    pipeline finishes those alignments before the removal deletes the forward records
    they read, so the matches are those of one page at a time."""
    rng = random.Random(7)
    pages: list[Page] = []
    for page in random_pages(8, 40):
        pages.append(page)
        texts = [p for p in pages if isinstance(p.body, str) and not p.deleted]
        if len(texts) > 3 and rng.random() < 0.4:
            target = rng.choice(texts[-6:])  # a recent page: likely a candidate in flight
            if rng.random() < 0.5:
                pages.append(Page(id=target.id, body="", deleted=True))
            else:
                body = str(rng.choice(texts).body).split()
                pages.append(Page(id=target.id, body=" ".join(
                    edit(body, 0.05, rng.randrange(10**6)))))
    assert sum(p.deleted for p in pages) >= 3
    one = run(tmp_path / "one", pages, 1, EngineConfig())
    assert run(tmp_path / "two", pages, 2, EngineConfig(), executor) == one
    kinds = [m["kind"] for _, *rest in one if rest and isinstance(rest[0], list)
             for m in rest[0]]
    assert "revisit" in kinds and "passage" in kinds


@pytest.mark.parametrize("removal", ["delete", "new version"])
def test_a_replay_in_flight_keeps_its_matches_when_a_later_record_removes_its_page(
        tmp_path: Path, removal: str) -> None:
    """B (near A) is read again while C, which copies a passage of A, is still being
    aligned; then B is deleted or replaced. The replay (answered from B's stored matches)
    waits behind C, so the removal must wait for it too: it deleted B's stored matches
    first, and the replay answered no match with 2 workers, 'B near A' with one."""
    words = rfc_words("rfc2821.txt", 0, 6000)
    a = " ".join(words[:1500])
    b = a + " extra words at the end of the copy"
    c = " ".join(words[3000:3800] + words[200:500])
    last = Page("B", "", deleted=True) if removal == "delete" else Page(
        "B", " ".join(words[5000:6000]))
    pages = [Page("A", a), Page("B", b), Page("C", c), Page("B", b), last]
    one = run(tmp_path / "one", pages, 1, EngineConfig())
    assert [(m["doc_id"], m["kind"], m["match_doc_id"]) for _, found in one[3:4]
            for m in found] == [("B", "near", "A")]  # type: ignore[union-attr, index]
    # (C is still aligning when the replay is indexed: it differed in every run before)
    assert run(tmp_path / "two", pages, 2, EngineConfig()) == one


def test_a_page_whose_worker_fails_is_aligned_on_the_store(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers without a view of the store (as if their secondary instance failed) cannot
    read the candidates' forward records: those pages are aligned by the calling process,
    and the matches stay those of one process."""
    monkeypatch.setattr(pipeline, "_worker_store", lambda: None)  # forked into the workers
    pages = random_pages(7, 30)
    blind = run(tmp_path / "blind", pages, 2, EngineConfig())
    assert blind == run(tmp_path / "one", pages, 1, EngineConfig())
    assert any(m["kind"] == "passage" for _, *rest in blind if rest and isinstance(rest[0], list)
               for m in rest[0])


def test_a_page_whose_sketch_fails_fails_alone(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages go to the sketch workers in chunks: a page whose sketch raises gets its error
    and the other pages of its chunk their matches, as in one process; offsets advance."""
    from dupalign.stages.sketch import Sketcher

    pages = random_pages(4, 30)
    failing = {p.id for p in pages[5:7]}  # neighbours: in one chunk
    real = Sketcher.sketch

    def sketch(self: Sketcher, page: Page, *args: Any) -> PageSketch:
        if page.id in failing:
            raise RuntimeError(f"no sketch for {page.id}")
        return real(self, page, *args)

    monkeypatch.setattr(Sketcher, "sketch", sketch)  # forked into the workers

    def outcomes(store: Path, jobs: int) -> list[object]:
        out: list[object] = []
        with Engine.open(store) as engine:
            items = [(p, ("pages", 0, n)) for n, p in enumerate(pages)]
            for page, found in engine.process_many(items, jobs=jobs):
                out.append((page.id, repr(found) if isinstance(found, BaseException)
                            else [m.to_dict() for m in found]))
            assert engine.stored_offsets() == {("pages", 0): len(pages)}
        return out

    one = outcomes(tmp_path / "one", 1)
    assert outcomes(tmp_path / "two", 2) == one
    assert [x for x in one if "no sketch for" in str(x[1])] == [
        (p.id, repr(RuntimeError(f"no sketch for {p.id}"))) for p in pages if p.id in failing]


_KILLED_PARENT = """
import sys
from dupalign.runtime.engine import Engine
from tests.runtime.test_pipeline import random_pages
with Engine.open(sys.argv[1]) as engine:
    items = ((p, None) for p in random_pages(4, 40))
    next(iter(engine.process_many(items, jobs=3)))  # two pool processes
    print("running", flush=True)
    sys.stdin.read()  # until killed
"""


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_pool_processes_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the engine's process (or the OOM killer) leaves no pool process behind."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _KILLED_PARENT, str(tmp_path / "s")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        children = _children(proc.pid)
        assert len(children) >= 2, "the pool has its processes"
    finally:
        alive = _kill_and_wait(proc, children)
    assert not alive, f"pool processes outlived their parent: {alive}"


def _kill_and_wait(proc: Any, children: set[int]) -> list[int]:
    """SIGKILL ``proc``; its ``children`` left alive 20 s later."""
    import signal
    import time

    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{c}").exists() for c in children):
        time.sleep(0.2)
    return [c for c in children if Path(f"/proc/{c}").exists()]


_ALIGNS_THEN_WAITS = """
import sys
from dupalign.runtime.engine import Engine
from dupalign.runtime.pipeline import run_pipeline
from tests.runtime.test_pipeline import random_pages
with Engine.open(sys.argv[1]) as engine:  # (all the work in the pool: none taken back)
    items = ((p, None) for p in random_pages(4, 40))
    for _ in run_pipeline(engine.stages(), items, 2, caller_works=False):
        pass
    print("aligned", flush=True)
    if sys.argv[2] == "wait":
        print(engine._pool.executor._shared.spill, flush=True)  # its large calls' files
        sys.stdin.read()  # until killed
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_secondary_files_of_a_killed_pool_are_removed_by_the_next_pool(tmp_path: Path) -> None:
    """Each pool process keeps its secondary instance's files in a temporary directory,
    and the pool its large calls' files in another (in /dev/shm), removed when the pool
    ends. Killed (SIGKILL, the OOM killer), its processes could not remove them, and every
    restart left more; now the next pool removes the directories whose process is gone."""
    import os
    import signal
    import subprocess
    import sys

    from dupalign.runtime.pipeline import SECONDARY_PREFIX

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", _ALIGNS_THEN_WAITS, str(tmp_path / "a"),
                             "wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=repo, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "aligned"
        spill = Path(proc.stdout.readline().strip())
        children = _children(proc.pid)
        left = sorted(tmp.glob(SECONDARY_PREFIX + "*"))
        assert left, "the pool processes aligned, each on its own secondary instance"
        assert spill.is_dir()
    finally:  # all of them at once (a container's OOM kill): none can clean up
        for child in children:
            os.kill(child, signal.SIGKILL)
        _kill_and_wait(proc, children)
    assert all(p.exists() for p in left), "killed, the pool could not remove its files"

    again = subprocess.run([sys.executable, "-c", _ALIGNS_THEN_WAITS, str(tmp_path / "b"),
                            "exit"], capture_output=True, text=True, timeout=120, cwd=repo,
                           env=env)
    assert again.returncode == 0 and again.stdout.split() == ["aligned"], again.stderr[-3000:]
    # (in /dev/shm, shared with other tests: their pools may remove it first)
    assert not any(p.exists() for p in [*left, spill])
    assert not list(tmp.glob(SECONDARY_PREFIX + "*")), "its own are removed at its end"


_DIES_WHILE_SENDING = """
import dataclasses, os, signal, struct, sys, tempfile
from pathlib import Path
from dupalign.runtime import engine as engine_module
from dupalign.runtime import pipeline
from dupalign.runtime.engine import Engine
from tests.runtime.test_pipeline import random_pages

real = pipeline.sketch_chunk_in_worker

def dying(pages):
    out = real(pages)
    if any(p.id == "victim" for p in pages):  # half a result message, then SIGKILL
        frame = sys._getframe()
        while frame.f_code.co_name != "_serve":
            frame = frame.f_back
        shared, call_id = frame.f_locals["shared"], frame.f_locals["call_id"]
        os.write(shared.results_w, struct.pack("<qq", call_id, 0x7FFFFFF0) + b"x" * 100)
        os.kill(os.getpid(), signal.SIGKILL)
    return out

pipeline.sketch_chunk_in_worker = dying  # forked into the workers
pages = random_pages(4, 30)
pages[12] = dataclasses.replace(pages[12], id="victim")
items = [(p, ("pages", 0, n)) for n, p in enumerate(pages)]
with tempfile.TemporaryDirectory() as tmp, Engine.open(Path(tmp) / "s") as engine:
    try:  # (all the work in the pool, the victim's too: none taken back by the caller)
        for _ in pipeline.run_pipeline(engine.stages(), items, 2, caller_works=False):
            pass
        print("finished", flush=True)
    except Exception as exc:
        print(type(exc).__name__, flush=True)
    pipeline.sketch_chunk_in_worker = real  # the caller starts again from the stored offset
    for _ in engine.process_many(items[engine.stored_offsets().get(("pages", 0), 0):], jobs=2):
        pass
    print("finished", engine.stored_offsets()[("pages", 0)] == len(items), flush=True)
"""


def test_a_pool_process_killed_while_it_sends_a_result_stops_the_run_instead_of_hanging(
        tmp_path: Path) -> None:
    """The OOM killer can kill a worker process in the middle of writing its result: the
    half-written message is never completed (CPython's process pool waited on it forever
    and never marked itself broken). The wait notices the dead process: BrokenProcessPool,
    as for a worker killed any other time, and the process exits; the next run on the same
    engine gets new workers."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _DIES_WHILE_SENDING], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["BrokenProcessPool", "finished", "True"], (
        run.stdout + run.stderr[-3000:])


@pytest.mark.parametrize(("executor", "blind"), [("process", False), ("thread", False),
                                                 ("process", True)])
def test_alignments_in_parts_give_the_matches_of_one_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: ExecutorKind,
        blind: bool) -> None:
    """Every request of 2 tasks or more split by candidate page (``align_parts``), its
    parts aligned by the pool or taken back, and merged: the matches of one thread; also
    when the workers cannot read the store (``blind``: every part aligned here)."""
    monkeypatch.setattr(pipeline, "SPLIT_TASKS", 1)
    split: list[int] = []
    parts = pipeline.align_parts
    monkeypatch.setattr(pipeline, "align_parts", lambda request, most: (
        lambda out: (split.append(len(out)), out)[1])(parts(request, most)))
    if blind:
        monkeypatch.setattr(pipeline, "_worker_store", lambda: None)  # forked into the workers
    pages = random_pages(5, 50)
    one = run(tmp_path / "one", pages, 1, EngineConfig())
    assert run(tmp_path / "two", pages, 2, EngineConfig(), executor) == one
    assert split and max(split) == 2  # (up to jobs parts)
    assert any(m["kind"] == "passage" for _, *rest in one if rest and isinstance(rest[0], list)
               for m in rest[0])


def test_align_parts_split_the_tasks_by_candidate_page(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Each task in one part, each candidate page's tasks all in one, at most ``most`` parts,
    and the parts' task counts within the largest candidate's of each other (each
    candidate goes to the part with fewest tasks so far)."""
    monkeypatch.setattr(pipeline, "SPLIT_TASKS", 1)
    seen = 0
    with Engine.open(tmp_path / "s") as engine:
        for page in random_pages(5, 50):
            try:
                result = engine.indexer.index(engine.sketch(page), defer=True)
            except PageRejected:
                continue
            request = result.align
            if request is not None:
                t_o = request.tasks.t_o
                for most in (2, 3, 8):
                    parts = pipeline.align_parts(request, most)
                    assert 1 <= len(parts) <= most
                    assert len(parts) > 1 or len(set(t_o.tolist())) == 1 or len(t_o) < 2
                    got = sorted(zip(*(np.concatenate([getattr(p.tasks, n) for p in parts])
                                       .tolist() for n in ("t_o", "t_p")), strict=True))
                    assert got == sorted(zip(t_o.tolist(), request.tasks.t_p.tolist(),
                                             strict=True))
                    owners = [set(p.tasks.t_o.tolist()) for p in parts]
                    assert sum(map(len, owners)) == len(set().union(*owners))
                    sizes = [len(p.tasks.t_o) for p in parts]
                    biggest = max(np.unique(t_o, return_counts=True)[1])
                    assert max(sizes) - min(sizes) <= biggest
                seen += len(t_o) > 1
            with contextlib.suppress(PageRejected):
                engine.indexer.finish(result, engine.align(result))
    assert seen
