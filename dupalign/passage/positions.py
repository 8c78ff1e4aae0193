"""The positions record of a page (column family ``positions``): its tokens' character
offsets and its units' hashes, written by the sketch stage (``pack_positions``), read by the
align stage for the spans that cite the page (``unpack_positions``).
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

from dupalign.passage.forward import fits
from dupalign.text.tokens import Tokens

U64 = npt.NDArray[np.uint64]

# The positions record of a page: its tokens' (start, end) character offsets, then the low
# 32 bits of its unit hashes (for span refinement and exact similarity), their number and a
# marker: ``_UNITS_MARK`` after int32 (start, end) pairs, ``_STEPS_MARK`` after <u2 steps
# (each token's gap from the previous token's end, then its length) when every step fits
# (store format 7: 8 bytes a token instead of 12 with its unit); records written before
# units were kept end with an offset (never negative).
_UNITS_MARK = b"\xff\xff\xff\xff"
_STEPS_MARK = b"\xfe\xff\xff\xff"


def has_units(positions: bytes) -> bool:
    """Whether a positions record holds its page's unit hashes."""
    return positions.endswith(_UNITS_MARK) or positions.endswith(_STEPS_MARK)


def pack_positions(tokens: Tokens, units: U64) -> bytes:
    """The positions record of a page's ``tokens`` and ``units``."""
    low = (units & np.uint64(0xFFFFFFFF)).astype("<u4")
    tail = low.tobytes() + struct.pack("<i", len(low))
    starts, ends = np.asarray(tokens.starts, np.int64), np.asarray(tokens.ends, np.int64)
    steps = np.empty(2 * len(starts), dtype=np.int64)
    steps[0::2] = starts - np.concatenate(([0], ends[:-1]))
    steps[1::2] = ends - starts
    if fits("<u2", steps):
        return steps.astype("<u2").tobytes() + tail + _STEPS_MARK
    both = np.empty(2 * len(starts), dtype="<i4")
    both[0::2], both[1::2] = starts, ends
    return both.tobytes() + tail + _UNITS_MARK


def positions_record(fit: bool, body: npt.NDArray[np.uint8]) -> bytes:
    """``pack_positions`` of a record laid out already but its closing mark (a kernel's:
    dupalign.passage.oph_page): its tokens' <u2 steps if every step ``fit``, else their
    int32 (start, end) pairs, then the units' low halves and their number."""
    return body.tobytes() + (_STEPS_MARK if fit else _UNITS_MARK)


def unpack_positions(data: bytes) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32],
                                            npt.NDArray[np.uint32] | None]:
    """Token starts, ends and unit hashes (None in records without them)."""
    units = None
    if has_units(data):
        steps = data.endswith(_STEPS_MARK)
        (n_units,) = struct.unpack_from("<i", data, len(data) - 8)
        at = len(data) - 8 - 4 * n_units
        units = np.frombuffer(data, dtype="<u4", offset=at, count=n_units)
        data = data[:at]
        if steps:
            bounds = np.cumsum(np.frombuffer(data, dtype="<u2"), dtype=np.int64)
            return bounds[0::2].astype(np.int32), bounds[1::2].astype(np.int32), units
    both = np.frombuffer(data, dtype="<i4")
    return both[0::2], both[1::2], units
