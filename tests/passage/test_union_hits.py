"""``align.union_hits``: a task's hits whose page ranges overlap or touch are merged
before the ranking and the spans (their union, the highest estimate). The align stage
then gives what it gave with every range the scan reported: the same pages, rank keys
and spans."""

from __future__ import annotations

import contextlib
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages import align
from dupalign.stages.messages import AlignRequest

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@contextlib.contextmanager
def every_hit() -> Iterator[None]:
    """The align stage without ``union_hits`` (as before it): every range the scan
    reported goes to the ranking and the spans."""
    saved = align.union_hits
    align.union_hits = lambda *hits: hits
    try:
        yield
    finally:
        align.union_hits = saved


# per task: its hits as (start, length, estimate); starts ascend, as the scan's sweep gives
task_hits = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30),
                               st.sampled_from([0.3, 0.45, 0.5, 0.9, 1.0])), max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), task_hits), max_size=6))
def test_union_hits_equals_the_union_of_each_tasks_ranges(
        tasks: list[tuple[int, list[tuple[int, int, float]]]]) -> None:
    rows, want = [], []
    t = -1
    for gap, hits in tasks:
        t += 1 + gap
        hits = sorted(hits, key=lambda h: h[0])
        rows += [(t, s, s + n, x) for s, n, x in hits]
        merged: list[list[float]] = []  # brute force: sweep the ranges by start
        for s, n, x in hits:
            if merged and s <= merged[-1][2]:
                merged[-1][2] = max(merged[-1][2], s + n)
                merged[-1][3] = max(merged[-1][3], x)
            else:
                merged.append([t, s, s + n, x])
        want += [tuple(m) for m in merged]
    h_t, h_s, h_e = (np.array([r[c] for r in rows], dtype=np.int64) for c in range(3))
    got = align.union_hits(h_t, h_s, h_e, np.array([r[3] for r in rows], dtype=np.float64))
    assert list(zip(*(c.tolist() for c in got), strict=True)) == want


def planted_pages(rng: random.Random, n: int, vocab: int) -> list[Page]:
    """Random pages, each with copies of a few chunks of earlier pages (some edited,
    some repeated inside the page) between random words."""
    out: list[list[str]] = []
    for _ in range(n):
        words = [f"w{rng.randrange(vocab)}" for _ in range(rng.randrange(20, 120))]
        for _ in range(rng.randrange(0, 4) if out else 0):
            src = out[rng.randrange(len(out))]
            a = rng.randrange(len(src))
            chunk = src[a:a + rng.randrange(20, 160)]
            chunk = [w if rng.random() > 0.05 else f"e{rng.randrange(10**6)}" for w in chunk]
            at = rng.randrange(len(words) + 1)
            words[at:at] = chunk * rng.choice([1, 1, 2])
        out.append(words)
    return [Page(id=f"p{x}", body=" ".join(w)) for x, w in enumerate(out)]


def align_both_ways(cfg: EngineConfig, pages: list[Page]) -> tuple[int, int]:
    """Every page's request aligned with ``union_hits`` and without it: the same ranked
    pages. Returns the ranges the scan reported and those left after the unions."""
    scanned = kept = 0
    saved = align.union_hits

    def counted(h_t: I64, h_s: I64, h_e: I64, h_x: F64) -> tuple[I64, I64, I64, F64]:
        nonlocal scanned, kept
        out = saved(h_t, h_s, h_e, h_x)
        scanned, kept = scanned + len(h_t), kept + len(out[0])
        return out

    with tempfile.TemporaryDirectory() as tmp, Engine.open(Path(tmp) / "s", cfg) as engine:
        for page in pages:
            result = engine.index(engine.sketch(page))
            found: list[align.RankedPage] = []
            if result.align is not None:
                raw = result.align.to_bytes(forward=False)
                align.union_hits = counted
                try:
                    found = engine.aligner.align_ranked(AlignRequest.from_bytes(raw))
                finally:
                    align.union_hits = saved
                with every_hit():
                    before = engine.aligner.align_ranked(AlignRequest.from_bytes(raw))
                assert found == before
            engine.indexer.finish(result, [(p.doc_id, p.spans) for p in found if p.spans])
    return scanned, kept


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(4, 14), vocab=st.sampled_from([40, 400]),
       max_matches=st.sampled_from([1, 2, 16]), refine=st.booleans(),
       mode=st.sampled_from(["oph", "oph", "weighted_oph"]))
def test_align_with_unions_gives_what_every_hit_gave(
        seed: int, n: int, vocab: int, max_matches: int, refine: bool, mode: str) -> None:
    cfg = EngineConfig(near=NearConfig(enabled=False), passage=PassageConfig(
        max_matches=max_matches, refine=refine, mode=mode)).validate()
    align_both_ways(cfg, planted_pages(random.Random(seed), n, vocab))


def test_the_unions_leave_fewer_ranges() -> None:
    """(So that the comparison above compares something: planted copies make the scan
    report overlapping ranges.)"""
    cfg = EngineConfig(near=NearConfig(enabled=False)).validate()
    scanned, kept = align_both_ways(cfg, planted_pages(random.Random(7), 14, 400))
    assert 0 < kept < scanned
