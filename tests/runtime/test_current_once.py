"""The index stage answers the stored version of a page from the lookup ``Engine.sketch``
made of it (``Indexer._current_once``): the same matches as a stage that reads the store
again, whatever removals (deletes, retention sweeps) come between a page's sketch and its
index (the oracle: the same stream through an engine whose stage always reads)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from tests.stages.streams import CONFIG, ops, pages_of


def _outputs(engine: Engine, items: list[Any], between: list[bool]) -> list[Any]:
    """Each page's matches (without the time) or rejection; a removal op is done between
    the next page's sketch and its index when ``between`` says so."""
    out: list[Any] = []
    removal = None
    for (step, item), late in zip(items, between, strict=True):
        if not isinstance(item, Page) or item.deleted:
            removal = (step, item)
            if late:
                continue  # done after the next page's sketch
            _remove(engine, step, item, out)
            removal = None
            continue
        try:
            sk = engine.sketch(item)
        except PageRejected as exc:
            out.append(("rejected", exc.reason))
            continue
        if removal is not None:
            _remove(engine, *removal, out)
            removal = None
        try:
            result = engine.index(sk, defer=True)
            found = engine.finish(result, engine.align(result))
        except PageRejected as exc:
            out.append(("rejected", exc.reason))
            continue
        except RuntimeError as exc:  # sketched as unchanged, its stored version removed since
            out.append(("error", str(exc)))
            continue
        out.append(sorted(str({k: v for k, v in m.to_dict().items() if k != "detected_at"})
                          for m in found))
    if removal is not None:
        _remove(engine, *removal, out)
    out.append(engine.stats()["pages"])
    return out


def _remove(engine: Engine, step: int, item: Any, out: list[Any]) -> None:
    if isinstance(item, Page):
        out.append(("deleted", engine.delete([item.id])))
    else:
        expired = engine.expired(item[0], item[1], step * 1000, 2)
        engine.indexer.remove(expired)
        out.append(("swept", [v.ordinal for v in expired]))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=ops, late=st.lists(st.booleans(), min_size=30, max_size=30))
def test_a_version_looked_up_at_the_sketch_is_the_one_a_new_read_gives(
        tmp_path: Path, stream: list[Any], late: list[bool]) -> None:
    items = list(pages_of(stream))
    between = late[:len(items)]
    runs = []
    for name, once in (("once", True), ("reads", False)):
        store = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
        with Engine.open(store, CONFIG) as engine:
            if not once:  # the oracle: every lookup reads the store
                engine.indexer._current_once = engine.indexer.current  # type: ignore[method-assign]
            runs.append(_outputs(engine, items, between))
    assert runs[0] == runs[1]


def test_a_delete_between_the_sketch_and_the_index_is_seen(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s", CONFIG) as engine:
        engine.process(Page("a", "alpha beta gamma delta epsilon zeta"))
        sk = engine.sketch(Page("a", "alpha beta gamma delta epsilon eta"))  # a new version
        assert engine.delete(["a"]) == 1
        result = engine.index(sk, defer=True)
        with contextlib.suppress(PageRejected):
            found = engine.finish(result, engine.align(result))
        assert [m.kind for m in found] == []  # a new page, not a changed revisit
        assert engine.stats()["pages"] == 1
