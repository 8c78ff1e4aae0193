"""The OPH passage sketch of a page in one kernel (dupalign.passage.oph_page, issue #44)
against its oracle, the step-by-step path (``PassageSketcher.sketch_page_steps``): every
array of the state the same values in the same dtype, the same positions record and the
same wire bytes, on texts of every kind (unicode, empty, one word, offsets past <u2, long
pages) and shapes of the passage parameters."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, PassageConfig
from dupalign.passage.sketch import PassageSketcher, PassageState
from dupalign.stages.sketch import _passage_dict
from dupalign.text.tokens import tokenize


def same(a: object, b: object) -> None:
    """Every field of two states (or of their windows) equal, arrays in the same dtype."""
    assert type(a) is type(b)
    for field in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert (x is None) == (y is None), field.name
        if dataclasses.is_dataclass(x):
            same(x, y)
        elif isinstance(x, tuple):
            assert len(x) == len(y), field.name
            for u, v in zip(x, y, strict=True):
                assert u.dtype == v.dtype and np.array_equal(u, v), field.name
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, field.name
            assert np.array_equal(x, y), field.name
        else:
            assert x == y, field.name


def check(text: str, passage: PassageConfig) -> PassageState:
    sketcher = PassageSketcher(EngineConfig(passage=passage).validate())
    tokens = tokenize(text)
    hashes = tokens.hashes(0)
    fused, steps = sketcher.sketch_page(hashes, tokens), sketcher.sketch_page_steps(hashes, tokens)
    same(fused, steps)
    assert _passage_dict(fused) == _passage_dict(steps)
    return fused


_words = st.sampled_from(["a", "Word", "ÉTÉ", "straße", "ﬁne", "x1", "the", "ΣΑΣ", "日本",
                          "İs", "😀x", "b", "c", "d", "e", "f", "g"])
_gaps = st.sampled_from([" ", "\n", " © ", "\xa0", "—", ", "])
texts = st.one_of(
    st.text(max_size=200),
    st.lists(st.tuples(_words, _gaps), max_size=400).map(
        lambda ws: "".join(w + g for w, g in ws)),
)
passages = st.builds(
    lambda shingle, k, query_len, stride, min_len: PassageConfig(
        shingle=shingle, k=k, query_len=query_len, stride=min(stride, query_len),
        min_len=min_len),
    st.sampled_from([1, 2, 3]), st.sampled_from([4, 7, 16, 64]), st.integers(4, 60),
    st.integers(1, 60), st.sampled_from([1, 4, 24]))


@settings(max_examples=200, deadline=None)
@given(texts, passages)
@example("", PassageConfig())
@example("one", PassageConfig())
@example("one", PassageConfig(shingle=1, min_len=1))
@example("a" + " " * 70_000 + "b c d e f g h i j k l m n o p q r s t u v w x y z " * 2,
         PassageConfig())  # a step past <u2: the positions record's int32 pairs
@example(" ".join(f"w{i % 997}" for i in range(20_000)), PassageConfig())
def test_oph_kernel_is_the_steps(text: str, passage: PassageConfig) -> None:
    check(text, passage)


def test_the_kernel_runs_where_it_should() -> None:
    """Long pages in the default configuration: windows, passages, both offset forms."""
    long = check(" ".join(f"w{i % 997}" for i in range(20_000)), PassageConfig())
    assert long.rects is not None and long.keys is not None and len(long.keys) > 100
    wide = check("a" + " " * 70_000 + " ".join("bcdefghijklmnopqrstuvwxyz" * 2),
                 PassageConfig())
    assert wide.positions.endswith(b"\xff\xff\xff\xff")
