"""The sketch stage over a batch of pages (``Sketcher.sketch_many``, issue #44) against the
per-page functions it replaces, its oracles: ``near_sketch_many`` against ``near_sketch``,
``Tokens.hashes_many`` against ``Tokens.hashes``, and the whole batch's sketches against
``Sketcher.sketch`` of each page."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.near.idf import IdfBuilder, IdfTable
from dupalign.near.index import NearState, near_sketch, near_sketch_many
from dupalign.page import Page
from dupalign.stages.sketch import Sketcher
from dupalign.text.tokens import Tokens, tokenize

CONFIG = EngineConfig(passage=PassageConfig(enabled=False)).validate()

# pages of token hashes from a small alphabet (repeats, shared shingles), some shorter than
# ``near.min_tokens`` or than a shingle, one with a count past the tf table (unweighted)
page_st = st.lists(st.integers(0, 40).map(lambda x: (x * 0x9E3779B97F4A7C15) % 2**64),
                   min_size=0, max_size=300).map(lambda xs: np.array(xs, dtype=np.uint64))


def idf_table(pages: list[np.ndarray]) -> IdfTable:
    builder = IdfBuilder()
    for h in pages[:3]:
        builder.add_document(h)
    return builder.freeze(1)


def same_state(a: NearState, b: NearState) -> None:
    assert (a.indexed, a.fingerprint, a.idf_version) == (b.indexed, b.fingerprint, b.idf_version)
    for name in ("unique", "counts", "W", "sketch"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), name


@settings(max_examples=150, deadline=None)
@given(st.lists(page_st, min_size=1, max_size=8), st.booleans(), st.sampled_from([1, 3, 5]))
@example([np.full(5000, 7, dtype=np.uint64), np.arange(40, dtype=np.uint64)], True, 3)
def test_near_sketch_many_is_near_sketch_of_each_page(pages: list[np.ndarray], frozen: bool,
                                                      shingle: int) -> None:
    config = EngineConfig(near=NearConfig(shingle=shingle),
                          passage=PassageConfig(enabled=False)).validate()
    idf = idf_table(pages) if frozen else IdfTable.uniform()
    for a, h in zip(near_sketch_many(pages, idf, config), pages, strict=True):
        same_state(a, near_sketch(h, idf, config))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(page_st, st.sampled_from(["computed", "given", "planted"])),
                min_size=1, max_size=8), st.booleans())
def test_a_known_sketch_is_taken_and_the_rest_computed(pages: list[tuple[np.ndarray, str]],
                                                       frozen: bool) -> None:
    """``known``: a page's verification sketch given (an exact copy's, read from the
    store) is taken as it is, its other arrays computed as ``near_sketch``'s; a page
    without one is ``near_sketch``'s. A planted sketch shows it is not computed again."""
    hashes = [h for h, _ in pages]
    idf = idf_table(hashes) if frozen else IdfTable.uniform()
    expected = [near_sketch(h, idf, CONFIG) for h in hashes]
    known: list[np.ndarray | None] = []
    for (_, how), e in zip(pages, expected, strict=True):
        if how == "computed" or e.sketch is None:
            known.append(None)
        else:
            known.append(e.sketch.copy() if how == "given" else e.sketch ^ np.uint64(1))
    for a, e, k in zip(near_sketch_many(hashes, idf, CONFIG, known), expected, known,
                       strict=True):
        if k is not None:
            assert a.sketch is not None and np.array_equal(a.sketch, k)
            a.sketch = e.sketch
        same_state(a, e)


words_st = st.lists(st.sampled_from(["a", "Word", "ÉTÉ", "straße", "ﬁne", "x1", "©", "İs",
                                     "the", "ΣΑΣ", "\x00", "日本"]), min_size=0, max_size=60)


@settings(max_examples=150, deadline=None)
@given(st.lists(words_st, min_size=1, max_size=6), st.integers(0, 2**32 - 1))
def test_hashes_many_is_hashes_of_each_page(pages: list[list[str]], seed: int) -> None:
    tokens = [tokenize(" ".join(words)) for words in pages]
    for a, t in zip(Tokens.hashes_many(tokens, seed), tokens, strict=True):
        b = t.hashes(seed)
        assert a.dtype == b.dtype and np.array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(words_st, st.sampled_from(["text", "deleted", "html", "unchanged"])),
                min_size=1, max_size=8))
def test_sketch_many_is_sketch_of_each_page(pages: list[tuple[list[str], str]]) -> None:
    sketcher = Sketcher(CONFIG)
    idf = IdfTable.uniform()
    given_pages, stored = [], []
    for n, (words, kind) in enumerate(pages):
        body = " ".join(words)
        given_pages.append(Page(id=f"p{n}", body=f"<p>{body}</p>" if kind == "html" else body,
                                content_type="text/html" if kind == "html" else "text/plain",
                                deleted=kind == "deleted"))
        stored.append(sketcher.sketch(given_pages[-1], idf).content_hash
                      if kind == "unchanged" else None)
    many = sketcher.sketch_many(given_pages, idf, stored)
    for sk, page, stored_hash in zip(many, given_pages, stored, strict=True):
        assert not isinstance(sk, Exception)
        one = sketcher.sketch(page, idf, stored_hash)
        assert sk.to_bytes() == one.to_bytes()
