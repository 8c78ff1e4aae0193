"""Inverted-list entries written behind the index thread (dupalign.passage.lists.files): the same
lists and matches as entries written in each page's batch, with files built here or by the
pool, through revisits, deletes and crashes."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import STORE_FORMAT, EngineConfig
from dupalign.errors import PageRejected, StoreError
from dupalign.page import Page
from dupalign.passage.lists import files as list_files
from dupalign.runtime.engine import Engine
from dupalign.store import tables
from dupalign.store.database import Store
from dupalign.store.lists import LIST_KEY
from tests.passage.test_passages import _stored_lists
from tests.runtime.test_pipeline import lifecycle_pages, random_pages


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2**64 - 1),
                                   st.integers(1, 300)), min_size=1, max_size=12,
                         unique_by=lambda t: (t[0], t[1])), min_size=1, max_size=6))
def test_a_list_file_holds_what_a_batch_of_its_entries_writes(
        pages: list[list[tuple[int, int, int]]]) -> None:
    """The twin: the same entries put one by one in a batch."""
    with tempfile.TemporaryDirectory() as tmp:
        entries, counts = [], []
        for ordinal, lists in enumerate(pages):
            e = np.empty(len(lists), dtype=LIST_KEY)
            e["bin"] = [b for b, _, _ in lists]
            e["key"] = [k for _, k, _ in lists]
            e["ordinal"] = ordinal
            entries.append(e)
            counts.append(np.array([n for _, _, n in lists], dtype=np.int64))
        raw = b"".join(e.tobytes() for e in entries)
        filed, batched = Store(Path(tmp, "f"), {}), Store(Path(tmp, "b"), {})
        path = list_files.build_list_file((str(Path(tmp, "x.sst")), raw,
                                           np.concatenate(counts).astype("<u4").tobytes()))
        filed.ingest("oph", [path])
        batch = batched.batch()
        for e, c in zip(entries, counts, strict=True):
            for record, n in zip(e, c.tolist(), strict=True):
                batch.put("oph", record.tobytes(), b"" if n == 1 else n.to_bytes(4, "little"))
        batched.write(batch)
        assert list(filed.items("oph")) == list(batched.items("oph"))
        filed.close()
        batched.close()


def _process(engine: Engine, pages: list[Page], clear_every: int = 7) -> list[Any]:
    """Each page's matches (or rejection); the list cache emptied now and then, so that
    lists are read from the store and the pending entries."""
    out: list[Any] = []
    for n, page in enumerate(pages):
        if n % clear_every == clear_every - 1:
            engine.passages.cache.clear()
        try:
            out.append((page.id, [m.to_dict() for m in engine.process(page)]))
        except PageRejected as exc:
            out.append((page.id, "rejected", exc.reason))
    return out


def _lists(store: Path, cfg: EngineConfig) -> dict[bytes, list[Any]]:
    """The store's inverted lists (their packing into runs is layout: it may differ)."""
    lists, _ = _stored_lists(store, cfg)
    assert lists
    return lists


def _inline(store: Path, pages: list[Page], cfg: EngineConfig) -> list[Any]:
    """The twin: every page's entries in its own batch."""
    with Engine.open(store, cfg) as engine:
        engine.passages.pending = None
        return _process(engine, pages)


@pytest.mark.parametrize(("seed", "file_pages"), [(3, 1), (5, 3)])
def test_entries_written_behind_give_the_lists_and_matches_of_entries_in_batches(
        tmp_path: Path, seed: int, file_pages: int) -> None:
    cfg = EngineConfig()
    pages = lifecycle_pages(seed, 60)
    expected = _inline(tmp_path / "inline", pages, cfg)
    with Engine.open(tmp_path / "behind", cfg) as engine:
        pending = engine.passages.pending
        assert pending is not None
        pending.file_pages = file_pages
        assert _process(engine, pages) == expected
        assert pending.files > 1  # files were ingested, and removals drained the rest
    assert any(p.deleted for p in pages)
    assert _lists(tmp_path / "behind", cfg) == _lists(tmp_path / "inline", cfg)


def test_a_crash_loses_no_list_entry(tmp_path: Path) -> None:
    """A process that dies after a file's ingest, before a batch wrote its mark, with the
    entries of later pages pending: the store opened again reads them back from the
    forward records (the file's again: the same keys), for writing (into the lists) and
    for reading only (in memory)."""
    cfg = EngineConfig()
    pages = [p for p in random_pages(9, 60) if not p.id.startswith("bad")]
    expected = _inline(tmp_path / "inline", pages, cfg)
    engine = Engine.open(tmp_path / "crashed", cfg)
    pending = engine.passages.pending
    assert pending is not None
    pending.file_pages = 4
    got: list[Any] = []
    for page in pages:
        got += _process(engine, [page])
        if len(got) >= 20 and pending.mark_due is not None and pending.pages:
            break
    else:
        pytest.fail("no page ended with a file ingested and unmarked")
    cut = len(got)
    mark = tables.lists_through.get(engine.store)
    engine.store.close()  # the process dies: nothing drained, the last file unmarked
    # a page of its own words, whose entries were pending
    last = next(p for p in reversed(pages[:cut]) if p.id.startswith("p"))
    _inline(tmp_path / "half", pages[:cut], cfg)
    with Engine.open(tmp_path / "half", cfg, read_only=True) as reader:
        found = [m.to_dict() for m in reader.query_text(str(last.body))]
    assert any(m["match_doc_id"] == last.id for m in found)
    with Engine.open(tmp_path / "crashed", cfg, read_only=True) as reader:
        assert tables.lists_through.get(reader.store) == mark
        assert reader.passages.pending is not None and len(reader.passages.pending)
        assert [m.to_dict() for m in reader.query_text(str(last.body))] == found
    with Engine.open(tmp_path / "crashed", cfg) as engine:
        got += _process(engine, pages[cut:])
    assert got == expected
    assert _lists(tmp_path / "crashed", cfg) == _lists(tmp_path / "inline", cfg)


def test_a_file_that_cannot_be_built_is_a_store_error_and_its_pages_stay_pending(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(A full disk, say.) The page whose commit started the file raises StoreError (the
    stream stops there; it is stored, and a restart replays it); the entries stay pending
    and the next file holds them."""
    cfg = EngineConfig()
    pages = [p for p in random_pages(13, 40) if not p.id.startswith("bad")]
    expected = _inline(tmp_path / "inline", pages, cfg)
    build = list_files.build_list_file
    failures: list[int] = []

    def failing(arg: tuple[str, bytes, bytes]) -> str:
        if not failures:
            failures.append(1)
            raise OSError(28, "No space left on device")
        return build(arg)

    monkeypatch.setattr(list_files, "build_list_file", failing)
    got: list[Any] = []
    with Engine.open(tmp_path / "full", cfg) as engine:
        pending = engine.passages.pending
        assert pending is not None
        pending.file_pages = 3
        for page in pages:
            try:
                got += _process(engine, [page])
            except StoreError as exc:
                assert "no space" in str(exc).lower()
                assert pending.flight is None and len(pending.pages) == 3
                got += _process(engine, [page])  # the restart: a replay
                assert engine.last_report.replayed
        assert failures and pending.files
    assert got == expected
    assert _lists(tmp_path / "full", cfg) == _lists(tmp_path / "inline", cfg)


def test_list_files_built_by_the_pool_give_the_same_matches(tmp_path: Path) -> None:
    cfg = EngineConfig()
    pages = lifecycle_pages(11, 60)
    expected = _inline(tmp_path / "inline", pages, cfg)
    got: list[Any] = []
    with Engine.open(tmp_path / "pool", cfg) as engine:
        pending = engine.passages.pending
        assert pending is not None
        pending.file_pages = 2
        for page, found in engine.process_many(((p, None) for p in pages), jobs=2):
            if isinstance(found, PageRejected):
                got.append((page.id, "rejected", found.reason))
            else:
                assert not isinstance(found, BaseException), found
                got.append((page.id, [m.to_dict() for m in found]))
        assert pending.files > 1 and pending.flight is None  # (ingested at the run's end)
        assert pending.build_seconds == 0.0 or pending.files > 2  # most built by the pool
    assert got == expected
    assert _lists(tmp_path / "pool", cfg) == _lists(tmp_path / "inline", cfg)


def test_a_format_7_store_is_upgraded_in_place(tmp_path: Path) -> None:
    """Format 7 wrote every entry in its page's batch and kept no mark: read as it is, and
    marked when opened for writing (every page before the mark, none read back)."""
    cfg = EngineConfig()
    pages = [p for p in random_pages(2, 40) if not p.id.startswith("bad")]
    expected = _inline(tmp_path / "inline", pages, cfg)
    with Engine.open(tmp_path / "old", cfg) as engine:
        engine.passages.pending = None
        got = _process(engine, pages[:25])
        engine.store.put("meta", b"params", msgpack.packb({**engine.store.params, "format": 7}))
        batch = engine.store.batch()
        tables.lists_through.delete(batch)
        engine.store.write(batch)
    with Engine.open(tmp_path / "old", cfg, read_only=True) as reader:
        assert reader.store.params["format"] == 7 and reader.passages.pending is None
    with Engine.open(tmp_path / "old", cfg) as engine:
        assert engine.store.params["format"] == STORE_FORMAT
        assert tables.lists_through.get(engine.store) is not None
        assert engine.passages.pending is not None and not len(engine.passages.pending)
        got += _process(engine, pages[25:])
    assert got == expected


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 300)),
                min_size=1, max_size=60), st.integers(1, 4))
def test_the_split_of_a_file_holds_its_entries_in_disjoint_key_ranges(
        rows: list[tuple[int, int, int]], parts: int) -> None:
    """``split_entries`` against the whole: every entry in exactly one part, in the order it
    had, a list's entries all in one part, and the parts' names in ascending ranges."""
    records = np.empty(len(rows), dtype=LIST_KEY)
    records["bin"] = [b for b, _, _ in rows]
    records["key"] = [k * (2**61) for _, k, _ in rows]  # (keys of the whole u64 range)
    records["ordinal"] = np.arange(len(rows))
    counts = np.array([n for _, _, n in rows], dtype=np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(list_files, "SPLIT_ENTRIES", 0)
        pieces = list_files.split_entries(records, counts, parts)
    assert 1 <= len(pieces) <= parts
    assert sorted(o for r, _ in pieces for o in r["ordinal"].tolist()) == list(range(len(rows)))
    names = []
    for r, c in pieces:
        assert len(r) and r["ordinal"].tolist() == sorted(r["ordinal"].tolist())
        assert c.tolist() == counts[r["ordinal"]].tolist()
        names.append(sorted((int(b), int(k)) for b, k in zip(r["bin"], r["key"], strict=True)))
    for lo, hi in itertools.pairwise(names):
        assert lo[-1] < hi[0]


@pytest.mark.parametrize("executor", ["process", "thread"])
def test_the_last_file_split_over_the_pool_at_close_gives_the_same_lists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str) -> None:
    """``Engine.close`` after ``--jobs 2``: the last file in two parts of disjoint keys, one
    built by the pool; the same lists as every entry in its page's batch."""
    cfg = EngineConfig()
    pages = [p for p in random_pages(17, 50) if not p.id.startswith("bad")]
    _inline(tmp_path / "inline", pages, cfg)
    monkeypatch.setattr(list_files, "SPLIT_ENTRIES", 0)
    ingested: list[list[str]] = []
    ingest = list_files.lists.ingest
    monkeypatch.setattr(list_files.lists, "ingest",
                        lambda store, paths: (ingested.append(paths), ingest(store, paths)))
    with Engine.open(tmp_path / "split", cfg) as engine:
        for _ in engine.process_many(((p, None) for p in pages), jobs=2,
                                     executor=executor):  # type: ignore[arg-type]
            pass
        pending = engine.passages.pending
        assert pending is not None and pending.pages and not pending.files  # (one file: below)
    assert [len(paths) for paths in ingested] == [2]
    assert _lists(tmp_path / "split", cfg) == _lists(tmp_path / "inline", cfg)
