"""The messages between the index fan-in and its shard processes, and a shard's side.

The Kafka topology (dupalign/service/roles/index.py, dupalign/service/roles/shard.py,
docs/topology.md) runs the in-process split of dupalign/stages/shards.py across processes. The
index role is the fan-in (dupalign/service/roles/fan_in.py ``FanInIndexer``): for each record of
the sequence (``seq``, its offset there) it does what ``ShardedIndexer`` does to the page
directory, and sends each shard s a *keys message* (``ShardMessage``) with what
``ShardedIndexer`` would have asked of and written to shard s for that record; the shard process
applies it (``answer``, ``settle``, through ``ShardStore``) and answers with its *partial*
(``Partial``) for a page that got an ordinal; the fan-in decides the page from the S partials
(``FanInIndexer.decide``), with ``Indexer._decide``: the same code as one process.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign.config import IMPLIED_PARAMS, PARAM_UPGRADES, EngineConfig
from dupalign.errors import StoreMismatch
from dupalign.near.index import NearState
from dupalign.passage.sketch import PassageState, Rects
from dupalign.stages.list_shard import copy_heads
from dupalign.stages.shards import IndexShard, check_shard, shard_dir
from dupalign.store.database import Store
from dupalign.store.records import (
    get_note,
    get_offset,
    log_delete,
    log_get,
    log_items,
    log_put,
    put_note,
    put_offset,
)
from dupalign.wire.versions import KEYS_MESSAGE, PARTIAL, pack_array

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

# a version 1 keys message's windows: whole rectangles
_RECT_DTYPES = {"bin": "<i8", "key": "<u8", "i_lo": "<i8", "i_hi": "<i8", "j_lo": "<i8",
                "j_hi": "<i8", "empty": "?"}  # version 1


@dataclass
class ShardQuery:
    """What the fan-in asks shard s about the page at ``ordinal`` (its partial's inputs)."""

    sketch: U64 | None = None  # the page's verification sketch (verify; kept by its owner)
    candidates: list[tuple[int, int]] = field(default_factory=list)  # PSM's, owned here
    bins: I64 | None = None  # the page's lists owned here (None: no passage query)
    keys: U64 | None = None
    replaced: int | None = None  # the version the page replaces
    prev: int | None = None  # its verification sketch is asked (a changed revisit)


@dataclass
class ShardMessage:
    """Everything shard s does for one sequence record, in the order ``ShardedIndexer``
    does it: ``pre`` removals (a retention sweep before the page, a delete), then, for a
    page that got ``ordinal``, its ``query`` (the partial, from the state before the page),
    then in the page's batch the ``post`` removal (the version it replaces), its
    verification sketch (``put_sketch``: this shard owns the ordinal) and its ``windows``
    in this shard's lists."""

    seq: int
    ordinal: int | None = None
    pre: list[int] = field(default_factory=list)
    query: ShardQuery | None = None
    post: list[int] = field(default_factory=list)
    put_sketch: bool = False
    windows: PassageState | None = None
    # the version it was read in (not sent: ``to_bytes`` writes its own)
    wire: int = KEYS_MESSAGE.writes

    @property
    def empty(self) -> bool:
        return self.ordinal is None and not self.pre

    @property
    def partial_wire(self) -> int:
        """The partial version its sender reads: one that sends version 1 keys messages
        predates version 2 partials."""
        return 1 if self.wire == 1 else PARTIAL.writes

    def to_bytes(self) -> bytes:
        q = self.query
        w = None
        if self.windows is not None and self.windows.rects is not None:
            r = self.windows.rects
            if r.empty.any():  # (``owned_part`` keeps only windows that are in a list)
                raise ValueError("a keys message carries no empty window")
            w = {"n_units": self.windows.n_units, "bin": pack_array(r.bin, "<u2"),
                 "key": pack_array(r.key, "<u8")}
        return bytes(msgpack.packb({
            "v": KEYS_MESSAGE.writes, "seq": self.seq, "ordinal": self.ordinal,
            "pre": self.pre,
            "post": self.post, "put_sketch": self.put_sketch, "windows": w,
            "query": None if q is None else {
                "sketch": pack_array(q.sketch, "<u8"),
                "candidates": [list(c) for c in q.candidates],
                "bins": pack_array(q.bins, "<u2"),
                "keys": pack_array(q.keys, "<u8"),
                "replaced": q.replaced, "prev": q.prev}}, use_bin_type=True))

    @classmethod
    def from_bytes(cls, raw: bytes) -> ShardMessage:
        d = msgpack.unpackb(raw, raw=False)
        v = d.get("v")
        KEYS_MESSAGE.check(v)
        q, w = d["query"], d["windows"]
        bin_dtype = "<i8" if v == 1 else "<u2"
        query = None if q is None else ShardQuery(
            None if q["sketch"] is None else np.frombuffer(q["sketch"], "<u8").copy(),
            [(int(o), int(h)) for o, h in q["candidates"]],
            None if q["bins"] is None else np.frombuffer(q["bins"], bin_dtype).astype(np.int64),
            None if q["keys"] is None else np.frombuffer(q["keys"], "<u8").copy(),
            q["replaced"], q["prev"])
        windows = None
        if w is not None and v == 1:
            windows = PassageState(Rects(**{f: np.frombuffer(w[f], d).copy()
                                            for f, d in _RECT_DTYPES.items()}), w["n_units"])
        elif w is not None:
            bins = np.frombuffer(w["bin"], "<u2").astype(np.int64)
            n = len(bins)  # rectangles (zeros): not a shard's business
            i_lo, i_hi, j_lo, j_hi = np.zeros((4, n), dtype=np.int64)
            windows = PassageState(Rects(bins, np.frombuffer(w["key"], "<u8").copy(), i_lo,
                                         i_hi, j_lo, j_hi, np.zeros(n, dtype=bool)),
                                   w["n_units"])
        return cls(d["seq"], d["ordinal"], list(d["pre"]), query, list(d["post"]),
                   bool(d["put_sketch"]), windows, v)


@dataclass
class Partial:
    """Shard s's answer for the page at sequence record ``seq``: the PSM candidates it owns
    that its sketches verify, the heads of the page's lists it owns (``IndexShard
    .list_heads``, copied out: ``ords[sum(n[:i]):][:n[i]]`` for list i), and the
    verification sketch of the version the page replaces, if asked and owned here."""

    seq: int
    shard: int
    near: list[tuple[int, int, float]] = field(default_factory=list)
    long: npt.NDArray[np.bool_] | None = None
    n: I64 | None = None
    ords: I64 | None = None
    prev_sketch: U64 | None = None

    def to_bytes(self, version: int = PARTIAL.writes) -> bytes:
        if version not in PARTIAL.reads:
            raise ValueError(f"partial version {version!r}, not one of {PARTIAL.reads}")
        def counts(a: I64) -> Any:
            return _narrow(a) if version == 2 else pack_array(a, "<i8")

        return bytes(msgpack.packb({
            "v": version, "seq": self.seq, "shard": self.shard,
            "near": [list(x) for x in self.near],
            "long": pack_array(self.long, "?"),
            "n": None if self.n is None else counts(self.n),
            "ords": None if self.ords is None else counts(self.ords),
            "prev_sketch": pack_array(self.prev_sketch, "<u8"),
        }, use_bin_type=True))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Partial:
        d = msgpack.unpackb(raw, raw=False)
        v = d.get("v")
        PARTIAL.check(v)

        def arr(key: str, dtype: str) -> Any:
            return None if d[key] is None else np.frombuffer(d[key], dtype).copy()

        def counts(key: str) -> Any:
            if v == 1 or d[key] is None:
                return arr(key, "<i8")
            raw, width = d[key]
            return np.frombuffer(raw, "<u4" if width == 4 else "<i8").astype(np.int64)

        return cls(d["seq"], d["shard"], [(int(o), int(h), float(e)) for o, h, e in d["near"]],
                   arr("long", "?"), counts("n"), counts("ords"), arr("prev_sketch", "<u8"))


def _narrow(a: I64) -> tuple[bytes, int]:
    """Non-negative integers as <u4 when they all fit, else <i8; with the width."""
    if not len(a) or (int(a.min()) >= 0 and int(a.max()) < 1 << 32):
        return pack_array(a, "<u4"), 4
    return pack_array(a, "<i8"), 8


def answer(shard: IndexShard, msg: ShardMessage) -> Partial | None:
    """Shard s's part of a sequence record (``msg``), as ``ShardedIndexer`` runs it in one
    process: the removals before the page (written at once), the partial, then the page's
    batch staged in ``shard.batch()`` (the caller adds its own records to it, writes it with
    ``shard.flush()``, then calls ``settle``)."""
    if msg.pre:
        removal = shard.stage_removal(msg.pre)
        shard.flush()
        shard.passages.commit_removal(removal)
    shard.settling = None
    if msg.ordinal is None:
        return None
    ordinal, q = msg.ordinal, msg.query
    assert q is not None
    out = Partial(msg.seq, shard.shard)
    if q.prev is not None:
        out.prev_sketch = shard.near.sketch_of(q.prev)
    if q.candidates:
        assert q.sketch is not None
        out.near = shard.verify(NearState(indexed=True, sketch=q.sketch), q.candidates)
    if q.bins is not None and len(q.bins):
        assert q.keys is not None
        long, start, n, ords = shard.list_heads(q.bins, q.keys, ordinal, q.replaced)
        out.long, out.n, out.ords = long.copy(), n.copy(), copy_heads(start, n, ords)
    post = shard.stage_removal(msg.post) if msg.post else None
    if msg.put_sketch:
        assert q.sketch is not None
        shard.near.put_sketch(shard.batch(), ordinal, q.sketch)
    mine = shard.stage(ordinal, msg.windows)
    shard.settling = (ordinal, post, mine)
    return out


def settle(shard: IndexShard) -> None:
    """After the batch ``answer`` staged is written: the shard's memory follows."""
    if shard.settling is None:
        return
    ordinal, post, mine = shard.settling
    shard.settling = None
    if post is not None:
        shard.passages.commit_removal(post)
    shard.commit(ordinal, mine)


# (in a shard's store: the note "applied_seq", the last sequence record applied, and the log
# "partials", seq -> the partial it answered)


class ShardStore:
    """One index shard as a process of its own keeps it (dupalign/service/roles/shard.py): its
    ``IndexShard`` over ``<store_dir>/shards/<shard>``, the last sequence record it applied,
    and the partials of its last ``kept`` pages, written in the batch of each page with the
    input offset: a keys message read again (the store ran ahead of the committed input
    before a crash, or the fan-in sent it again) is answered with the same partial."""

    def __init__(self, store_dir: str | Path, config: EngineConfig, shard: int, n_shards: int,
                 kept: int) -> None:
        config = config.validate()
        self.store = Store(shard_dir(store_dir, shard), config.frozen_params(),
                           implied=IMPLIED_PARAMS, upgrades=PARAM_UPGRADES,
                           **config.cache.store_bytes())
        try:
            check_shard(self.store, shard, n_shards, False)
        except BaseException:
            self.store.close()
            raise
        self.shard = IndexShard(self.store, config, shard, n_shards)
        applied = get_note(self.store, "applied_seq")
        self.applied = -1 if applied is None else applied
        self.kept_max = kept
        self.kept = deque(seq for seq, _ in log_items(self.store, "partials"))

    def offset(self, topic: str, partition: int) -> int | None:
        """The next input offset after the last record applied (None: a new store)."""
        return get_offset(self.store, topic, partition)

    def apply(self, msg: ShardMessage, source: tuple[str, int, int]) -> Partial | None:
        """Apply the keys message read at ``source`` (its partial, if it is a page's); one
        read before (``seq`` at or below the last applied) is answered from the store."""
        if msg.seq <= self.applied:
            if msg.ordinal is None:
                return None
            raw = log_get(self.store, "partials", msg.seq)
            if raw is None:
                raise StoreMismatch(
                    f"shard {self.shard.shard}: the keys message of sequence record {msg.seq} "
                    f"came again, but its partial is not kept any more (the last "
                    f"{self.kept_max}: kafka.shard_partials_kept)")
            return Partial.from_bytes(raw)
        out = answer(self.shard, msg)
        batch = self.shard.batch()
        put_note(batch, "applied_seq", msg.seq)
        put_offset(batch, source[0], source[1], source[2] + 1)
        if out is not None:
            log_put(batch, "partials", msg.seq, out.to_bytes())
            self.kept.append(msg.seq)
            while len(self.kept) > self.kept_max:
                log_delete(batch, "partials", self.kept.popleft())
        self.shard.flush()
        settle(self.shard)
        self.applied = msg.seq
        return out

    def close(self) -> None:
        self.store.close()
