"""Near-only pages in batches on one core (dupalign.runtime.batched, issue #44): the same
matches and the same store as ``Engine.process`` page by page (the oracle), and a batch
whose write fails is lost whole, so that a run again gives the same output."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.errors import PageRejected, StoreError
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.store.database import Store
from dupalign.store.keys import FAMILIES
from tests.runtime.test_engine import edit
from tests.runtime.test_pipeline import random_pages

pytestmark = pytest.mark.testdata

NEAR_ONLY = EngineConfig(near=NearConfig(idf_freeze_at=(6, 20)),
                         passage=PassageConfig(enabled=False)).validate()


def lifecycle_pages(seed: int, n: int) -> list[Page]:
    """``random_pages`` (near and exact copies, replays, rejected pages) with new versions
    of earlier ids (changed and unchanged), deletes, and pages too short to be near-indexed,
    some of them close together (within one batch)."""
    rng = random.Random(seed)
    pages = random_pages(seed, n)
    out: list[Page] = []
    for p in pages:
        out.append(p)
        texts = [q for q in out if isinstance(q.body, str) and not q.deleted]
        roll = rng.random()
        if texts and roll < 0.08:  # a new version of an earlier id
            old = rng.choice(texts)
            out.append(Page(id=old.id, body=" ".join(edit(str(old.body).split(), 0.05,
                                                          rng.randrange(10**6)))))
        elif texts and roll < 0.12:  # the same version again, under a new fetch
            old = rng.choice(texts)
            out.append(Page(id=old.id, body=str(old.body) + " ", url="http://again"))
        elif texts and roll < 0.15:
            out.append(Page(id=rng.choice(texts).id, body="", deleted=True))
        elif roll < 0.18:
            out.append(Page(id=f"short{len(out)}", body="a few words"))
        elif roll < 0.35 and (long := [q for q in texts if len(str(q.body).split()) > 60]):
            out.append(Page(id=f"near{len(out)}",  # a near copy under a new id
                            body=str(rng.choice(long).body) + f" and {rng.randrange(10**6)}"))
    return out


def outputs(found: list[Any] | BaseException) -> Any:
    if isinstance(found, PageRejected):
        return ("rejected", found.reason)
    assert not isinstance(found, BaseException), found
    return [{k: v for k, v in m.to_dict().items() if k != "detected_at"} for m in found]


def one_by_one(store: Path, pages: list[Page]) -> list[Any]:
    out: list[Any] = []
    with Engine.open(store, NEAR_ONLY) as engine:
        for n, p in enumerate(pages):
            try:
                out.append(outputs(engine.process(p, ("pages", 0, n))))
            except PageRejected as exc:
                out.append(outputs(exc))
    return out


def batched(store: Path, pages: list[Page], size: int, start: int = 0) -> list[Any]:
    out: list[Any] = []
    with Engine.open(store, NEAR_ONLY) as engine:
        engine.batch_pages = size
        assert engine._batches()
        items = [(p, ("pages", 0, n)) for n, p in enumerate(pages) if n >= start]
        for _, found in engine.process_many(items, jobs=1):
            out.append(outputs(found))
    return out


def contents(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every family of the store, key by key."""
    store = Store(path, NEAR_ONLY.frozen_params(), read_only=True)
    try:
        return {f: list(store.items_from(f, None)) for f in FAMILIES if store.has_family(f)}
    finally:
        store.close()


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), size=st.integers(1, 9))
def test_batches_give_the_matches_and_store_of_one_page_at_a_time(
        tmp_path_factory: pytest.TempPathFactory, seed: int, size: int) -> None:
    tmp = tmp_path_factory.mktemp("batched")
    pages = lifecycle_pages(seed, 45)
    straight = one_by_one(tmp / "one", pages)
    assert batched(tmp / "many", pages, size) == straight
    assert contents(tmp / "many") == contents(tmp / "one")


def test_a_batch_whose_write_fails_is_lost_whole_and_a_run_again_gives_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The third batch's write fails (a full disk, say): the two batches before it were
    given and stored, nothing of the third was given or stored, and the engine takes no
    more pages; opened again and given the pages from the first one not given (its
    caller's checkpoint), it gives what a run without the failure gives, and stores the
    same."""
    pages = lifecycle_pages(7, 40)
    straight = one_by_one(tmp_path / "one", pages)
    kinds = {m["kind"] for out in straight if isinstance(out, list) for m in out}
    assert {"exact", "near", "revisit"} <= kinds, "the stream must exercise these kinds"
    assert any(p.deleted for p in pages) and ("rejected", "undecodable") in straight
    given_before: list[Any] = []
    writes = 0
    real_write = Store.write

    def failing_write(self: Store, batch: Any) -> None:
        nonlocal writes
        if len(batch) > 1:  # (the pages' batches, not a lone offset)
            writes += 1
            if writes == 3:
                raise StoreError("write", self.path, "No space left on device")
        real_write(self, batch)

    with Engine.open(tmp_path / "many", NEAR_ONLY) as engine:
        engine.batch_pages = 5
        monkeypatch.setattr(Store, "write", failing_write)
        items = [(p, ("pages", 0, n)) for n, p in enumerate(pages)]
        with pytest.raises(StoreError, match="No space"):
            for _, found in engine.process_many(items, jobs=1):
                given_before.append(outputs(found))
        with pytest.raises(StoreError, match="not written"):
            next(iter(engine.process_many(items, jobs=1)))
        monkeypatch.undo()
        stored = engine.stored_offsets()
    assert given_before == straight[:len(given_before)]
    assert stored == {("pages", 0): len(given_before)}
    # from the first page not given (the caller's checkpoint: what it got)
    assert batched(tmp_path / "many", pages, 5, len(given_before)) == straight[len(given_before):]
    assert contents(tmp_path / "many") == contents(tmp_path / "one")
