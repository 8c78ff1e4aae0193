"""The random page streams of the stage oracles (tests/stages/test_directory.py,
test_exact.py): a few ids, each with a few bodies (some bodies shared between ids: exact
copies), sent again as the same bytes (a replay), as other bytes of the same text (upper
case, trailing blanks, read as HTML: an unchanged revisit, or a new page once the stored
version is gone), or as another body (a changed revisit); deletes of stored and unknown
ids; rejected pages (empty, or not valid Unicode); retention sweeps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.page import Page
from dupalign.stages.index import engine_info

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
_TEXTS = [
    "alpha beta gamma delta epsilon zeta eta theta",
    "alpha beta gamma delta epsilon zeta eta iota",  # a near copy of the first
    "kappa lambda mu nu xi omicron pi rho",
    "sigma tau upsilon phi chi psi omega one",
    "short page",  # not near-indexed
]


def body_of(doc: int, b: int) -> str:
    """Body ``b`` (0-2) of id ``doc``: texts of the shared pool, so ids share some."""
    return _TEXTS[(2 * doc + b) % len(_TEXTS)]


def page_of(step: int, doc: int, b: int, variant: int, dated: bool) -> Page:
    """Variants of one text: the same bytes, upper case, trailing blanks, read as HTML;
    and bytes that are two texts (a word more read as plain text than as HTML)."""
    body = body_of(doc, b)
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


def pages_of(stream: list[Any]) -> Iterator[tuple[int, Page | tuple[int, int]]]:
    """(step, page) or (step, (max_pages, max_age_s)) for a sweep."""
    for step, op in enumerate(stream):
        if op[0] == "page":
            yield step, page_of(step, *op[1:])
        elif op[0] == "delete":
            yield step, Page(f"d{op[1]}", "", deleted=True)
        elif op[0] == "reject":
            yield step, Page(f"d{op[1]}", "\ud800" if op[2] else "", fetched_at=step * 1000)
        else:
            yield step, (op[1], op[2])
