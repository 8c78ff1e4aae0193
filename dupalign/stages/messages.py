"""The index stage's typed values: the messages it sends (``AlignRequest`` to the align stage,
``IndexResult`` to ``finish`` and, in the Kafka topology, over the wire), what it reads of a
stored page (``StoredVersion``), what it hands ``Indexer._decide`` (``Query``), and what it
reports (``IndexTimes``, ``LifecycleCounters``). The stage itself: dupalign.stages.index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign.match import Match
from dupalign.near.index import NearState
from dupalign.passage.forward import fits
from dupalign.passage.sketch import PassageState
from dupalign.passage.tasks import Tasks
from dupalign.stages.sketch import PageSketch
from dupalign.wire import packed
from dupalign.wire.versions import INDEX_MESSAGE, pack_array, unpack_array

I64 = npt.NDArray[np.int64]


# the array fields of Tasks, in order (all but ``gathered`` and ``_records``)
_TASK_ARRAYS = tuple(f.name for f in fields(Tasks) if f.name not in ("gathered", "_records"))


def _unpickle_request(ordinal: int, positions: bytes, gathered: bool, other_ids: list[str],
                      other_positions: list[bytes], data: bytearray, codes: str,
                      dims: tuple[int, ...]) -> AlignRequest:
    arrays = packed.unpack(data, codes, dims)
    n = 2 + len(_TASK_ARRAYS)
    tasks = Tasks(**dict(zip(_TASK_ARRAYS, arrays[2:n], strict=True)), gathered=gathered,
                  _records=None if arrays[n] is None else tuple(arrays[n:]))
    return AlignRequest(ordinal, arrays[0], arrays[1], positions, tasks, other_ids,
                        other_positions)


@dataclass
class AlignRequest:
    """A page's alignment tasks (``passage_tasks.Tasks``: candidate pages per passage and the
    lists its sketches name, found by the index) and what align needs besides: the page's
    query passages (units ``[starts[p], ends[p])``) and its positions record (token
    character offsets and unit hashes). Align reads the candidates' forward records itself
    (``Tasks.gather``) from the store or a secondary instance of it; for an align stage
    without store access ``Indexer.with_forward`` attaches what it would read: the tasks
    gathered, and per candidate page (``others``, ascending) its id and positions record.
    Everything about a candidate is keyed by its ordinal, so a request splits by candidate
    for the align partitions that own them (``split_by``)."""

    ordinal: int
    starts: I64
    ends: I64
    positions: bytes
    tasks: Tasks
    other_ids: list[str] = field(default_factory=list)
    other_positions: list[bytes] = field(default_factory=list)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (the process pool's align calls) with its arrays as one buffer
        (dupalign.wire.packed): about 15 of them, pickle's cost being per array."""
        t = self.tasks
        arrays = [self.starts, self.ends, *(getattr(t, name) for name in _TASK_ARRAYS),
                  *(t._records or (None, None, None))]
        return (_unpickle_request, (self.ordinal, self.positions, t.gathered, self.other_ids,
                                    self.other_positions, *packed.pack(arrays)))

    @property
    def others(self) -> I64:
        return self.tasks.pages

    @property
    def has_forward(self) -> bool:
        """Whether the candidates' forward data is attached (``Indexer.with_forward``)."""
        return self.tasks.gathered and len(self.other_positions) == len(self.others)

    def split_by(self, owner: I64) -> dict[int, AlignRequest]:
        """The request split by ``owner`` (the part of each task's earlier page, in
        ``tasks.t_o``'s order): the align stage keyed by the candidate's id gives each
        candidate's owner (``directory_owner``) here. Only the parts with tasks; none
        carries forward data. Each part's ``Aligner.align_ranked``, merged by
        ``align.merge_ranked``, gives the whole's matches."""
        t = self.tasks
        out = {}
        for part in np.unique(owner).tolist():
            mine = owner == part
            tasks = Tasks(t.t_p[mine], t.t_o[mine], t.lid, t.q_empty, t.list_bin, t.list_key)
            out[part] = AlignRequest(self.ordinal, self.starts, self.ends, self.positions,
                                     tasks)
        return out

    def to_dict(self, forward: bool = True) -> dict[str, Any]:
        """``forward=False``: the tasks as the index found them; ``forward=True`` adds the
        candidates' forward data (it must be attached: ``Indexer.with_forward``)."""
        t = self.tasks
        lid_type = "<i2" if t.list_bin.shape[0] < (1 << 15) else "<i4"
        d = {
            "ordinal": self.ordinal, "starts": pack_array(self.starts, "<i4"),
            "ends": pack_array(self.ends, "<i4"), "positions": self.positions,
            "k": int(t.lid.shape[1]), "lid_type": lid_type, "lid": pack_array(t.lid, lid_type),
            "q_empty": np.packbits(t.q_empty).tobytes(),
            "t_p": pack_array(t.t_p, "<u4"), "t_o": pack_array(t.t_o, "<u8"),
            "list_bin": pack_array(t.list_bin, "<u2"),
            "list_key": pack_array(t.list_key, "<u8"),
        }
        if forward:
            if not self.has_forward:
                raise ValueError("the candidates' forward data is not attached "
                                 "(Indexer.with_forward)")
            # the narrowest types that hold them (ordinals below 2^32, positions of pages
            # under 65,536 units: most requests), said by the message
            ord_type = "<u4" if fits("<u4", t.ords) else "<u8"
            pos_type = "<u2" if fits("<u2", t.rects, t.empty_lr) else "<i4"
            # empty rows l, i_hi, j_hi; l, r (2 columns) when every one is a gap
            lr = t.empty_lr
            if np.any(lr[:, 1] != lr[:, 2]):
                d["empty_cols"] = 3
            else:
                lr = lr[:, [0, 2]]
            d.update({
                "count": pack_array(t.count, "<u4"), "ord_type": ord_type,
                "ords": pack_array(t.ords, ord_type), "pos_type": pos_type,
                "rects": pack_array(t.rects, pos_type),
                "empty_keys": pack_array(t.empty_keys, "<u8"),
                "empty_off": pack_array(t.empty_off, "<u4"),
                "empty_lr": pack_array(lr, pos_type),
                "others": pack_array(self.others, "<u8"), "other_ids": self.other_ids,
                "other_positions": self.other_positions})
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AlignRequest:
        k = d["k"]
        lid = _ints(d["lid"], d["lid_type"]).reshape(-1, k)
        q_empty = np.unpackbits(np.frombuffer(d["q_empty"], dtype=np.uint8),
                                count=lid.size).astype(np.bool_).reshape(-1, k)
        tasks = Tasks(_ints(d["t_p"], "<u4"), _ints(d["t_o"], "<u8"), lid, q_empty,
                      _ints(d["list_bin"], "<u2"),
                      np.frombuffer(d["list_key"], dtype="<u8").astype(np.uint64))
        if "rects" in d:
            count = _ints(d["count"], "<u4")
            tasks.gathered = True
            tasks.start, tasks.count = np.cumsum(count) - count, count
            pos_type = d.get("pos_type", "<i4")  # (requests of earlier versions: wide)
            tasks.ords = _ints(d["ords"], d.get("ord_type", "<u8"))
            tasks.rects = np.frombuffer(d["rects"], pos_type).astype(np.int32).reshape(-1, 4)
            tasks.empty_keys = _ints(d["empty_keys"], "<u8")
            tasks.empty_off = _ints(d["empty_off"], "<u4")
            lr = _ints(d["empty_lr"], pos_type).reshape(-1, d.get("empty_cols", 2))
            tasks.empty_lr = lr if lr.shape[1] == 3 else lr[:, [0, 1, 1]]
        return cls(d["ordinal"], _ints(d["starts"], "<i4"), _ints(d["ends"], "<i4"), d["positions"],
                   tasks, list(d.get("other_ids", [])), list(d.get("other_positions", [])))

    def to_bytes(self, forward: bool = True) -> bytes:
        return bytes(msgpack.packb({"v": INDEX_MESSAGE.writes, **self.to_dict(forward)},
                                   use_bin_type=True))

    @classmethod
    def from_bytes(cls, raw: bytes) -> AlignRequest:
        return cls.from_dict(_versioned(raw))


@dataclass
class IndexTimes:
    """Seconds spent by the last ``index`` call, per part, and its near counters."""

    exact: float = 0.0
    near: float = 0.0
    passage: float = 0.0
    store: float = 0.0
    psm_probes: int = 0
    near_candidates: int = 0
    cws_pairs: int = 0
    cws_samples_saved: int = 0


@dataclass
class StoredVersion:
    """What the store says of the current version of a page (its ``docs`` record)."""

    ordinal: int
    doc_id: str
    content_hash: bytes
    simhash: int | None
    url: str | None
    fetched_at: int | None
    replay_key: bytes | None  # None in pages of store format <= 5


@dataclass
class LifecycleCounters:
    """Versions, deletes and removals since the process started (metrics)."""

    unchanged: int = 0  # revisits with the stored content: one revisit message, no work
    changed: int = 0  # revisits with new content: the new version replaced the old one
    deletes: int = 0  # pages removed by a delete (tombstone or API)
    removed: int = 0  # pages removed from every index, for any reason (retention too)
    expired: int = 0  # pages removed by retention


@dataclass
class IndexResult:
    """What the index stage made of one page. ``ordinal`` is None for a page that was
    rejected or replayed (``replay_of``: the stored page it repeats); ``matches`` are the
    exact and near ones; ``align`` the passage tasks, if any; ``done``: the page's matches
    and offset are already stored (nothing left for ``finish`` to write)."""

    doc_id: str
    source: tuple[str, int, int] | None = None
    ordinal: int | None = None
    rejected: tuple[str, str] | None = None
    replay_of: int | None = None
    matches: list[Match] = field(default_factory=list)
    align: AlignRequest | None = None
    done: bool = False
    times: IndexTimes | None = field(default=None, repr=False, compare=False)  # not on the wire
    # index(defer=True): writes the page with its matches (not on the wire)
    deferred: Callable[[list[Match]], None] | None = field(default=None, repr=False,
                                                            compare=False)

    def to_bytes(self) -> bytes:
        d = {"v": INDEX_MESSAGE.writes, "doc_id": self.doc_id,
             "source": None if self.source is None else list(self.source),
             "ordinal": self.ordinal,
             "rejected": None if self.rejected is None else list(self.rejected),
             "replay_of": self.replay_of, "matches": [m.to_dict() for m in self.matches],
             "align": None if self.align is None else self.align.to_dict(forward=False),
             "done": self.done}
        return bytes(msgpack.packb(d, use_bin_type=True))

    @classmethod
    def from_bytes(cls, raw: bytes) -> IndexResult:
        d = _versioned(raw)
        src, rej = d["source"], d["rejected"]
        return cls(d["doc_id"], None if src is None else (src[0], src[1], src[2]), d["ordinal"],
                   None if rej is None else (rej[0], rej[1]), d["replay_of"],
                   [Match.from_dict(m) for m in d["matches"]],
                   None if d["align"] is None else AlignRequest.from_dict(d["align"]), d["done"])


@dataclass
class Query:
    """What ``Indexer.index`` found in the page directory for a page that gets an ordinal,
    and what ``Indexer._decide`` needs to find its matches and tasks."""

    result: IndexResult
    sk: PageSketch
    prev: StoredVersion | None  # the version the page replaces
    original: int | None  # an exact duplicate: the stored page it repeats
    ordinal: int

    @property
    def skip(self) -> frozenset[int]:
        return frozenset() if self.prev is None else frozenset((self.prev.ordinal,))

    @property
    def near_state(self) -> NearState | None:
        return None if self.original is not None else self.sk.near

    @property
    def passage_state(self) -> PassageState | None:
        return None if self.original is not None else self.sk.passage


def _versioned(raw: bytes) -> dict[str, Any]:
    d: dict[str, Any] = msgpack.unpackb(raw, raw=False)
    INDEX_MESSAGE.check(d.get("v"))
    return d


def _ints(raw: bytes, dtype: str) -> I64:
    """An array of the wire as int64 (the stage's working type)."""
    return unpack_array(raw, dtype, np.int64)
