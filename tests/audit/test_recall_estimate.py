"""The audit's estimate against the truth of a planted stream: its interval contains the
true recall, with the index's cuts at their defaults and set low on purpose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dupalign.audit.recall import Tally, wilson
from dupalign.config import EngineConfig
from dupalign.runtime.engine import Engine
from tests.audit.planted import Stream, planted_stream


def _run(tmp: Path, stream: Stream, cfg: dict[str, Any]) -> tuple[Tally, set[tuple[int, int]]]:
    ids = {p.id: i for i, p in enumerate(stream.pages)}
    found = set()
    with Engine.open(tmp, EngineConfig.from_dict(cfg)) as engine:
        # PSM scans a table's append buffer whole (its first 1,024 rows): a buffer that stays
        # small makes this small table probe as a large one does, budget and all
        table = engine.near.table
        table.buffer_min = 1
        table.flush()
        for i, page in enumerate(stream.pages):
            for m in engine.process(page):
                found.add((i, ids[m.match_doc_id]))
            engine.run_audits()
        return engine.audit_tally(), found


def _inside(t: Tally, kind: str, truth: float) -> None:
    est = t.kinds[kind].estimate()
    assert est["low"] <= truth <= est["high"], (kind, truth, est)


CAPS = {"passage": {"max_list": 4}, "near": {"probe_budget": 1, "hamming": 6}}


@pytest.mark.parametrize("caps", [{}, CAPS], ids=["defaults", "caps-low"])
def test_interval_contains_true_recall(tmp_path: Path, caps: dict[str, Any]) -> None:
    stream = planted_stream(20, 5, near_each=3, edits=4)
    # every page audited against every earlier page: the exact answer over the whole stream
    full, found = _run(tmp_path / "full", stream, caps | {"audit": {"sample": 1.0,
                                                                    "reservoir": 10_000}})
    p = full.kinds["passage"]
    # the exact alignment finds exactly the planted copies, and the hits are those found
    assert p.pairs == len(stream.copies)
    true_passage = len(stream.copies & found) / len(stream.copies)
    assert p.hits / p.pairs == pytest.approx(true_passage)
    n = full.kinds["near"]
    true_near = n.hits / n.pairs
    assert {a for a, _ in stream.near & found} <= {a for a, _ in stream.near}
    # a sample of the pages against a reservoir of a third of them
    part, _ = _run(tmp_path / "part", stream, caps | {"audit": {"sample": 0.4,
                                                                "reservoir": 50}})
    assert 0 < part.kinds["passage"].pages < len(stream.pages)
    _inside(part, "passage", true_passage)
    _inside(part, "near", true_near)
    if caps:  # the loss is seen, and told by its cause
        assert true_passage < 0.9 and p.misses.get("stop_list", 0) > 0
        assert true_near < 1 and n.misses.get("budget", 0) > 0
    else:
        assert true_passage == 1.0 and true_near == 1.0


def test_wilson_known_values() -> None:
    lo, hi = wilson(81, 263)  # a textbook case (Newcombe 1998): 0.2553, 0.3662
    assert lo == pytest.approx(0.2553, abs=1e-4) and hi == pytest.approx(0.3662, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(10, 10)[1] == pytest.approx(1.0)


def test_the_audit_changes_no_match(tmp_path: Path) -> None:
    """Its trace of the passage query and its reservoir leave the matches as they were, stop
    lists included."""
    stream = planted_stream(8, 4, near_each=1, edits=2)
    caps = {"passage": {"max_list": 3}}
    _, off = _run(tmp_path / "off", stream, caps | {"audit": {"sample": 0.0}})
    tally, on = _run(tmp_path / "on", stream, caps | {"audit": {"sample": 1.0}})
    assert on == off and tally.kinds["passage"].pages > 0
