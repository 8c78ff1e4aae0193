"""The process pool's pickles of ``PageSketch`` and ``AlignRequest`` (their arrays as one
buffer: dupalign.wire.packed) give back every field, with its dtype and shape, for any
sketch or request: rejected, deleted, unchanged pages, empty arrays, missing parts."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dupalign.near.index import NearState
from dupalign.passage.sketch import PassageState, Rects
from dupalign.passage.tasks import Tasks
from dupalign.stages.messages import AlignRequest
from dupalign.stages.sketch import PageSketch
from dupalign.wire import packed

I64, U64 = np.dtype(np.int64), np.dtype(np.uint64)


def same(a: Any, b: Any, where: str = "") -> None:
    """Equal field by field; arrays of the same dtype, shape and bytes (NaN too), writable."""
    assert type(a) is type(b), where
    if isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert a.tobytes() == b.tobytes(), where
        assert b.flags.writeable and b.flags.aligned, where  # (consumers write into some)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for x, (u, v) in enumerate(zip(a, b, strict=True)):
            same(u, v, f"{where}[{x}]")
    else:
        assert a == b, where


def arr(dtype: Any, shape: Any = None, hi: int | None = None) -> st.SearchStrategy[Any]:
    """Arrays of ``dtype``, 1-D of 0–12 unless ``shape``; values in [0, hi) if ``hi``."""
    elements = None if hi is None else st.integers(0, hi - 1)
    return hnp.arrays(dtype, shape if shape is not None else st.integers(0, 12),
                      elements=elements)


def optional(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | s


near_states = st.builds(
    NearState, st.booleans(), optional(arr(U64)), optional(arr(I64)), st.integers(0, 9),
    optional(st.integers(0, 2**64 - 1)), optional(arr(np.float64)), optional(arr(U64)))


@st.composite
def rects(draw: Any) -> Rects:
    n = draw(st.integers(0, 10))
    cells = [draw(arr(I64, n, 2**31)) for _ in range(4)]
    return Rects(draw(arr(I64, n, 2**16)), draw(arr(U64, n)), *cells, draw(arr(np.bool_, n)))


@st.composite
def distinct_lists(draw: Any) -> tuple[Any, ...]:
    n = draw(st.integers(0, 8))
    return draw(arr(I64, n, 2**16)), draw(arr(U64, n)), draw(arr(I64, None, 2**31))


@st.composite
def passage_states(draw: Any) -> PassageState:
    p, k = draw(st.integers(0, 5)), draw(st.integers(0, 4))
    return PassageState(
        draw(optional(rects())), draw(st.integers(0, 10**6)), draw(st.binary(max_size=40)),
        draw(optional(arr(I64, p, 2**31))), draw(optional(arr(I64, p, 2**31))),
        draw(optional(arr(U64, (p, k)))), draw(optional(arr(np.bool_, (p, k)))),
        draw(optional(distinct_lists())), draw(optional(distinct_lists())))


texts = st.text(max_size=12)
sketches = st.builds(
    PageSketch, texts, optional(texts), optional(st.integers(0, 2**62)),
    optional(st.binary(min_size=16, max_size=16)), optional(st.tuples(texts, texts)),
    st.integers(0, 10**6), st.binary(max_size=16), optional(near_states),
    optional(passage_states()), st.booleans(), st.booleans(), texts)


@st.composite
def tasks(draw: Any) -> Tasks:
    p, k = draw(st.integers(0, 5)), draw(st.integers(0, 4))
    t = Tasks(draw(arr(I64)), draw(arr(I64)), draw(arr(I64, (p, k))),
              draw(arr(np.bool_, (p, k))), draw(arr(I64)), draw(arr(U64)))
    if draw(st.booleans()):  # as ``gather`` leaves it
        t.gathered = True
        t.start, t.count, t.ords = draw(arr(I64)), draw(arr(I64)), draw(arr(I64))
        t.rects = draw(arr(np.int32, (draw(st.integers(0, 6)), 4)))
        t.empty_keys, t.empty_off = draw(arr(I64)), draw(arr(I64))
        t.empty_lr = draw(arr(I64, (draw(st.integers(0, 6)), 3)))
        t._records = draw(optional(st.tuples(arr(I64), arr(np.uint8), arr(I64))))
    return t


requests = st.builds(AlignRequest, st.integers(0, 2**40), arr(I64), arr(I64),
                     st.binary(max_size=40), tasks(), st.lists(texts, max_size=3),
                     st.lists(st.binary(max_size=8), max_size=3))


@settings(max_examples=300, deadline=None)
@given(sketches)
def test_a_pickled_sketch_comes_back_whole(sk: PageSketch) -> None:
    same(sk, pickle.loads(pickle.dumps(sk, protocol=pickle.HIGHEST_PROTOCOL)))


@settings(max_examples=100, deadline=None)
@given(st.lists(sketches, max_size=4))
def test_a_chunk_of_sketches_comes_back_whole(chunk: list[PageSketch]) -> None:
    same(chunk, pickle.loads(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)))


@settings(max_examples=300, deadline=None)
@given(requests)
def test_a_pickled_align_request_comes_back_whole(request: AlignRequest) -> None:
    same(request, pickle.loads(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)))


dtypes = st.sampled_from([np.bool_, np.uint8, np.uint16, np.int32, np.int64, np.uint64,
                          np.float32, np.float64])


@settings(max_examples=300, deadline=None)
@given(st.lists(optional(dtypes.flatmap(lambda d: hnp.arrays(
    d, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))), max_size=8))
def test_packed_arrays_come_back_as_they_went(arrays: list[Any]) -> None:
    out = packed.unpack(*pickle.loads(pickle.dumps(packed.pack(arrays))))
    same(arrays, out)
    for a in out:  # (views of one buffer: writing one leaves the others)
        if a is not None and a.size:
            a.fill(1)
    same([None if a is None else np.ones_like(a) if a.size else a for a in arrays], out)


def test_a_strided_array_is_packed_as_its_values() -> None:
    a = np.arange(24, dtype=np.int64).reshape(4, 6)
    out = packed.unpack(*packed.pack([a[:, 1], a.T, a[::2, ::3]]))
    same([a[:, 1].copy(), a.T.copy(), a[::2, ::3].copy()], out)
