"""The random page streams of the stage oracles (tests/stages/test_directory.py,
test_exact.py, test_list_shard.py), and the directory stage that decides them for the
stages downstream of it (``segments``). A few ids, each with a few bodies (some bodies
shared between ids: exact copies), sent again as the same bytes (a replay), as other
bytes of the same text (upper case, trailing blanks, read as HTML: an unchanged revisit,
or a new page once the stored version is gone), or as another body (a changed revisit);
deletes of stored and unknown ids; rejected pages (empty, or not valid Unicode);
retention sweeps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.errors import PageRejected
from dupalign.match import Match
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.directory import Decision, DirectoryEntry, DirectoryShard, entry_of
from dupalign.stages.index import engine_info
from dupalign.stages.ledger import Expired, Ledger
from dupalign.stages.messages import IndexResult
from dupalign.stages.partitioned import Partitioned
from dupalign.stages.sketch import PageSketch

# short pages, near-indexed (min_tokens) so that changed revisits carry a resemblance; no
# passages; an idf freeze early in the stream (Engine.process sketches under the table in
# force, as the directory's input must be)
CONFIG = EngineConfig(
    near=NearConfig(min_tokens=4, cws_samples=16, idf_freeze_at=(4,)),
    passage=PassageConfig(enabled=False),
).validate()
ENGINE = engine_info(CONFIG)
PARAMS = CONFIG.frozen_params()
N_IDS = 5
TEXTS = [
    "alpha beta gamma delta epsilon zeta eta theta",
    "alpha beta gamma delta epsilon zeta eta iota",  # a near copy of the first
    "kappa lambda mu nu xi omicron pi rho",
    "sigma tau upsilon phi chi psi omega one",
    "short page",  # not near-indexed
]
# texts that share more of their passages (tests/stages/test_list_shard.py: lists that
# several pages are in, so stop lists): the pool's first four words in four of them
SHARED_TEXTS = [
    TEXTS[0],
    TEXTS[1],
    "alpha beta gamma delta kappa lambda mu nu",
    "sigma tau alpha beta gamma delta phi chi",
    "short page",
]


def body_of(doc: int, b: int, texts: list[str] = TEXTS) -> str:
    """Body ``b`` (0-2) of id ``doc``: texts of the shared pool, so ids share some."""
    return texts[(2 * doc + b) % len(texts)]


def page_of(step: int, doc: int, b: int, variant: int, dated: bool,
            texts: list[str] = TEXTS) -> Page:
    """Variants of one text: the same bytes, upper case, trailing blanks, read as HTML;
    and bytes that are two texts (a word more read as plain text than as HTML)."""
    body = body_of(doc, b, texts)
    body = [body, body.upper(), body + "  \n", body, f"<i>{body}</i>", f"<i>{body}</i>"][variant]
    return Page(f"d{doc}", body, content_type="text/html" if variant in (3, 5) else "text/plain",
                url=f"http://x/{doc}/{step}", fetched_at=step * 1000 if dated else None)


pages = st.tuples(st.just("page"), st.integers(0, N_IDS - 1), st.sampled_from([0, 0, 1, 2]),
                  st.sampled_from([0, 0, 1, 2, 3, 4, 5]), st.sampled_from([True, True, False]))
others = [
    st.tuples(st.just("delete"), st.integers(0, N_IDS)),  # N_IDS: never stored
    st.tuples(st.just("reject"), st.integers(0, N_IDS - 1), st.booleans()),
    st.tuples(st.just("sweep"), st.integers(0, 4), st.integers(0, 6)),
]
# two pages in three ops
ops = st.lists(st.integers(0, 8).flatmap(lambda k: pages if k < 6 else others[k - 6]),
               min_size=4, max_size=30)


def pages_of(stream: list[Any], texts: list[str] = TEXTS
             ) -> Iterator[tuple[int, Page | tuple[int, int]]]:
    """(step, page) or (step, (max_pages, max_age_s)) for a sweep."""
    for step, op in enumerate(stream):
        if op[0] == "page":
            yield step, page_of(step, *op[1:], texts=texts)
        elif op[0] == "delete":
            yield step, Page(f"d{op[1]}", "", deleted=True)
        elif op[0] == "reject":
            yield step, Page(f"d{op[1]}", "\ud800" if op[2] else "", fetched_at=step * 1000)
        else:
            yield step, (op[1], op[2])


def through(p: Partitioned, items: list[tuple[int, Page | tuple[int, int]]], cuts: set[int]
            ) -> Iterator[int]:
    """``items`` through the pipeline ``p`` (pages processed, sweeps at time 0), yielding
    after each item of ``cuts`` and after the last one its index."""
    for at, (_, item) in enumerate(items):
        if isinstance(item, Page):
            for _ in p.process_many([item]):
                pass
        else:
            p.sweep(*item, 0)
        if at in cuts or at == len(items) - 1:
            yield at


@dataclass(frozen=True)
class Sweep:
    """A sweep point of a stream: the arguments of ``Ledger.sweep`` and what it removed."""

    max_pages: int
    max_age_s: int
    now_ms: int
    swept: list[Expired]

    def apply(self, ledger: Ledger) -> list[Expired]:
        """The same sweep in a consumer's ledger (it must remove the same pages)."""
        assert ledger.sweep(self.max_pages, self.max_age_s, self.now_ms, 2) == self.swept
        return self.swept


def segments(items: list[tuple[int, Page | tuple[int, int]]], entries: list[DirectoryEntry],
             dirs: list[DirectoryShard]) -> Iterator[tuple[list[Decision], Sweep | None]]:
    """The stream through the directory shards ``dirs`` and their ledger, one segment
    between sweep points at a time (each shard decides all its pages of the segment before
    the next one starts): the segment's decisions in sequence order, through their wire
    form, and the sweep after it (None: the stream's end)."""
    ledger = Ledger()
    segment: list[DirectoryEntry] = []
    pages = iter(entries)

    def decide() -> list[Decision]:
        decided = sorted((Decision.from_bytes(shard.decide(e).to_bytes(), ENGINE)
                          for shard in dirs for e in segment if shard.owns(e.doc_id)),
                         key=lambda d: d.seq)
        for d in decided:
            ledger.apply(d)
        segment.clear()
        return decided

    for step, item in items:
        if isinstance(item, Page):
            segment.append(next(pages))
            continue
        decided = decide()
        swept = ledger.sweep(item[0], item[1], step * 1000, 2)
        for shard in dirs:
            shard.forget(e.seq for e in swept)
        yield decided, Sweep(item[0], item[1], step * 1000, swept)
    yield decide(), None


def engine_pages(engine: Engine, items: list[tuple[int, Page | tuple[int, int]]],
                 align: bool = True) -> Iterator[tuple[
                     DirectoryEntry, PageSketch, IndexResult, list[Match] | PageRejected]]:
    """The single engine on the stream, sweeps included (2 pages a batch, as ``Sweep``):
    each page sketched, indexed and finished, with its directory entry, sketch, result and
    matches (``Engine.process``'s; its PageRejected for a rejected page). ``align=False``
    finishes each page without its passage spans, for an oracle that reads only what the
    index stage decides (the spans change no index state)."""
    seq = 0
    for step, item in items:
        if not isinstance(item, Page):
            while expired := engine.expired(item[0], item[1], step * 1000, 2):
                engine.indexer.remove(expired)
            continue
        sk = engine.sketch(item)
        entry = entry_of(seq, sk)
        seq += 1
        result = engine.index(sk, defer=True)
        found: list[Match] | PageRejected
        try:
            found = engine.finish(result, engine.align(result) if align else [])
        except PageRejected as exc:  # (its outcome is in ``result`` too)
            found = exc
        yield entry, sk, result, found
