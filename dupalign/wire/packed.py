"""Numpy arrays pickled as one buffer: what the process pool's messages (``PageSketch``,
``AlignRequest``) carry between the processes of one machine.

Pickle writes each array through numpy's own reduce (its dtype, its shape, its bytes) and
rebuilds it the same way, a fixed cost of 5–15 µs an array whatever its size: a page's
messages hold about 18 of them. Here a message's arrays are one bytes object and a header
(a character a dtype, ``-`` for None, and the shapes), and come back as views of one buffer.

The buffer is a bytearray, which pickle (protocol 5) reads back as one: every view is
writable with no copy, and aligned (each array starts at a multiple of 8 bytes) as the
kernels expect; the views keep that whole buffer alive while any of them lives. Native byte
order: the pickle stays on this machine (the wire form between machines is msgpack:
dupalign.wire.versions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

Packed = tuple[bytearray, str, tuple[int, ...]]  # (buffer, dtype characters, ndim and shape each)

_PAD = bytes(8)
_DTYPES: dict[str, np.dtype[Any]] = {}


def pack(arrays: Sequence[np.ndarray[Any, Any] | None]) -> Packed:
    """``arrays`` (None allowed) as one buffer and its header (``unpack`` reverses it)."""
    codes: list[str] = []
    dims: list[int] = []
    parts: list[Any] = []  # (arrays and padding, joined as buffers)
    for a in arrays:
        if a is None:
            codes.append("-")
            continue
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)
        codes.append(a.dtype.char)
        dims.append(a.ndim)
        dims.extend(a.shape)
        if a.nbytes:
            parts.append(a)
            if a.nbytes % 8:
                parts.append(_PAD[:-a.nbytes % 8])
    return bytearray().join(parts), "".join(codes), tuple(dims)


def unpack(data: bytes | bytearray, codes: str, dims: tuple[int, ...]) -> list[Any]:
    """The arrays of ``pack``: writable views of ``data`` (of a copy if it is bytes)."""
    buf = data if isinstance(data, bytearray) else bytearray(data)
    out: list[Any] = []
    at = d = 0
    for c in codes:
        if c == "-":
            out.append(None)
            continue
        dtype = _DTYPES.get(c)
        if dtype is None:
            dtype = _DTYPES[c] = np.dtype(c)
        ndim = dims[d]
        shape = dims[d + 1:d + 1 + ndim]
        d += 1 + ndim
        count = 1
        for n in shape:
            count *= n
        if count:
            a = np.frombuffer(buf, dtype, count, at)
            at += count * dtype.itemsize
            at += -at % 8
        else:
            a = np.empty(0, dtype)
        out.append(a if ndim == 1 else a.reshape(shape))
    return out
