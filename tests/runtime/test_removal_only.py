"""An engine opened for removal only (``dupalign delete``): it indexes nothing, and the store
its removal leaves is the one a full engine's removal leaves."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.store.keys import FAMILIES

_RNG = random.Random(40)
_VOCAB = [f"w{i}" for i in range(300)]


def _config() -> EngineConfig:
    # idf not frozen yet: the removal-only open skips its pending counts too
    return EngineConfig(
        near=NearConfig(idf_freeze_at=(100_000,)),
        passage=PassageConfig(mode="oph", k=16, query_len=16, stride=8, min_len=8),
    ).validate()


def _words(n: int) -> list[str]:
    return [_RNG.choice(_VOCAB) for _ in range(n)]


def _dump(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of the store."""
    with Engine.open(path, read_only=True) as eng:
        return {family: list(eng.store.items(family)) for family in FAMILIES
                if eng.store.has_family(family)}


def test_a_removal_only_engine_indexes_nothing_and_removes_as_a_full_one(
        tmp_path: Path) -> None:
    base, other = _words(200), _words(200)
    near = list(base)
    near[50] = "changed"
    pages = [Page("a", " ".join(base)), Page("b", " ".join(other)),
             Page("c", " ".join(near)),  # a near copy of a
             Page("d", " ".join(other[:120] + _words(80)))]  # a passage of b
    with Engine.open(tmp_path / "built", _config()) as eng:
        for page in pages:
            eng.process(page)
    full, removal = tmp_path / "full", tmp_path / "removal"
    shutil.copytree(tmp_path / "built", full)
    shutil.copytree(tmp_path / "built", removal)

    with Engine.open(full, _config()) as eng:
        assert eng.delete(["a", "b", "nope"]) == 2
    with Engine.open(removal, _config(), removal_only=True) as eng:
        with pytest.raises(RuntimeError, match="removal only"):
            _ = eng.near.table  # never read from the store
        for index in (lambda: eng.process(Page("e", " ".join(base))),
                      lambda: list(eng.process_many([(Page("e", " ".join(base)), None)])),
                      lambda: eng.indexer.index(eng.sketcher.sketch(
                          Page("e", " ".join(base)), eng.near.idf))):
            with pytest.raises(RuntimeError, match="removal only"):
                index()
        assert eng.delete(["a", "b", "nope"]) == 2
        assert eng.alive == 2  # counted from the store when asked
    assert _dump(removal) == _dump(full)

    # a later page, against each store opened in full: the table built from the family
    later = [Page("e", " ".join(base)), Page("f", " ".join(other)),
             Page("g", " ".join(near[:150] + _words(50)))]
    found = {}
    for path in (full, removal):
        with Engine.open(path, _config()) as eng:
            assert len(eng.near.table) == 2  # c and d
            found[path] = [[(m.kind, m.match_doc_id) for m in eng.process(p)] for p in later]
    assert found[removal] == found[full]
    assert found[full][0] == [("near", "c")]  # a is gone: its near copy c answers
