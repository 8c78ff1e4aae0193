"""The sketch stage's output, byte for byte (issue #44: its CPU a page was cut with no change
to any sketch). Two oracles, near-only and default: every page's ``PageSketch.to_bytes``
against the step-by-step path (the regex-free tokenizer's own twin is in tests/text, the
OPH kernel's in tests/passage/test_oph_page.py), and the digest of a fixed stream of pages
(unicode, empty, one word, offsets past <u2, long pages) against the one main's sketch
stage gave before the change (f07d03a)."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, PassageConfig
from dupalign.near.idf import IdfBuilder, IdfTable
from dupalign.page import Page
from dupalign.stages.sketch import PageSketch, Sketcher
from dupalign.text.tokens import tokenize

CONFIGS = {"near-only": EngineConfig(passage=PassageConfig(enabled=False)).validate(),
           "default": EngineConfig().validate()}
_WORDS = ["a", "Word", "ÉTÉ", "straße", "ﬁne", "x1", "the", "ΣΑΣ", "日本", "İs", "😀x", "©",
          "\xa0", "—", "café", "ǅ", "²", "Ⅻ", "e\u0301"] + [f"w{i}" for i in range(60)]


def stream() -> list[Page]:
    """Pages of every kind, some near copies of others (fixed: the digests below are
    theirs)."""
    rng = random.Random(44)
    texts = ["", "one", "İ", "   ", "a" + " " * 70_000 + " b c d e f g" * 10,
             " ".join(f"w{i % 997}" for i in range(20_000))]
    for _ in range(40):
        texts.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randrange(1, 600))))
    texts += [t + " edited" for t in texts[-10:]]
    return [Page(id=f"p{i}", body=t, content_type="text/plain") for i, t in enumerate(texts)]


def idf_of(pages: list[Page], seed: int) -> IdfTable:
    builder = IdfBuilder()
    for page in pages:
        tokens = tokenize(str(page.body))
        if len(tokens):
            builder.add_document(np.unique(tokens.hashes(seed)), distinct=True)
    return builder.freeze(1)


def wire(sk: PageSketch | Exception) -> bytes:
    return repr(sk).encode() if isinstance(sk, Exception) else sk.to_bytes()


def stepwise(config: EngineConfig) -> Sketcher:
    """A sketcher whose passage sketch is the numpy steps (``sketch_page_steps``) instead of
    the OPH kernel: with ``Sketcher.sketch``, each page's near sketch on its own."""
    sketcher = Sketcher(config)
    sketcher.passages.sketch_page = sketcher.passages.sketch_page_steps  # type: ignore[method-assign]
    return sketcher


# main's sketch stage (f07d03a) over ``stream()``: sha256 of every page's to_bytes in order
MAIN_DIGESTS = {
    "near-only": "6a7b2db59eda866471d10becc25d70a8d850039f1a78c5f576f6d40859ac510c",
    "default": "b88fafcaec4a0c76c185d227ef4519b857ec0d059d65b081905a1e491b0bc06e"}


@pytest.mark.parametrize("mode", sorted(CONFIGS))
def test_the_stream_sketches_as_main_did(mode: str) -> None:
    config = CONFIGS[mode]
    pages = stream()
    idf = idf_of(pages, config.seed)
    sketcher = Sketcher(config)
    one = [wire(sketcher.sketch(page, idf)) for page in pages]
    many = [wire(sk) for sk in sketcher.sketch_many(pages, idf)]
    assert many == one
    assert [wire(stepwise(config).sketch(page, idf)) for page in pages] == one
    assert hashlib.sha256(b"".join(one)).hexdigest() == MAIN_DIGESTS[mode]


_gaps = st.sampled_from([" ", "\n", " © ", "\xa0", "—", ", ", "  "])
texts = st.one_of(
    st.text(max_size=300),
    st.lists(st.tuples(st.sampled_from(_WORDS), _gaps), max_size=500).map(
        lambda ws: "".join(w + g for w, g in ws)))


@settings(max_examples=100, deadline=None)
@given(st.lists(texts, min_size=1, max_size=5), st.sampled_from(sorted(CONFIGS)))
@example(["", "one", "a" + " " * 70_000 + " b c d e f g" * 10], "default")
def test_sketch_bytes_are_the_steps(bodies: list[str], mode: str) -> None:
    config = CONFIGS[mode]
    pages = [Page(id=f"p{i}", body=b, content_type="text/plain") for i, b in enumerate(bodies)]
    idf = idf_of(pages, config.seed)
    sketcher = Sketcher(config)
    reference = stepwise(config)
    expected = [wire(reference.sketch(page, idf)) for page in pages]
    assert [wire(sketcher.sketch(page, idf)) for page in pages] == expected
    assert [wire(sk) for sk in sketcher.sketch_many(pages, idf)] == expected
