"""The sketch stage: a page → everything computable from the page alone (``PageSketch``).

Pure: no store, no index state, only the frozen parameters and the idf table in force, so
any number of copies run in parallel (threads, processes, later machines). Steps: decode
and extract text, tokenize (with character offsets), content hash, token hashes, the
whole-document sketch (weighted simhash + W, verification min-hashes: dupalign.near.index) and
the passage sketch (compact windows, query passages and their OPH/MonoActive sketches:
dupalign.passage.sketch). A page that cannot be processed gives a sketch with ``rejected`` set,
so that the index stage still sees it in order (its offset advances, nothing else).

``PageSketch.to_bytes`` is the wire form (msgpack, dupalign/wire/schemas/page_sketch.json).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mmh3
import msgpack
import numpy as np

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.near.idf import IdfTable
from dupalign.near.index import U64, NearState, near_sketch, near_sketch_many
from dupalign.page import Page, check_unicode
from dupalign.passage.sketch import PassageSketcher, PassageState, Rects
from dupalign.text.tokens import Tokens, page_text, reading, tokenize
from dupalign.wire import packed
from dupalign.wire.versions import PAGE_SKETCH, pack_array, unpack_array

# content hashes -> the verification sketch stored with a page of each (None: none)
CopySketches = Callable[[list[bytes]], list[U64 | None]]


@dataclass
class PageSketch:
    id: str
    url: str | None
    fetched_at: int | None
    replay_key: bytes | None  # None when the page is rejected before it is hashed
    rejected: tuple[str, str] | None = None  # (reason, detail)
    n_tokens: int = 0
    content_hash: bytes = b""
    near: NearState | None = None
    passage: PassageState | None = None
    deleted: bool = False  # a tombstone: remove the page ``id``
    # the content hash equals the stored version's: near and passage were not sketched
    unchanged: bool = False
    # how its body was read into text (dupalign.text.tokens.reading): the replay check answers
    # only a page read the same way as the stored one
    read_as: str = ""

    # -- between the pipeline's processes ---------------------------------------------------
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its arrays as one buffer (dupalign.wire.packed: pickle's cost is per
        array, and a page has up to 18), the windows and passage bounds in small dtypes
        (llvm pages: 51 KB of windows against 92 KB). Unpickled, every array has its dtype
        again."""
        near, passage = self.near, self.passage
        arrays: list[Any] = []
        near_head = passage_head = None
        if near is not None:
            near_head = (near.indexed, near.idf_version, near.fingerprint, near.frozen)
            arrays += (near.unique, near.counts, near.W, near.sketch)
        if passage is not None:
            passage_head = (passage.n_units, passage.positions)
            arrays += _passage_arrays(passage)
        return (_unpickle, (self.id, self.url, self.fetched_at, self.replay_key, self.rejected,
                            self.n_tokens, self.content_hash, near_head, passage_head,
                            self.deleted, self.unchanged, self.read_as, *packed.pack(arrays)))

    # -- wire form ------------------------------------------------------------------------
    def to_dict(self, for_combine: bool = False) -> dict[str, Any]:
        """``for_combine``: what the combine reads of a page (dupalign.stages.combine): of
        the near sketch whether it is indexed, of the passage sketch its passages (its
        windows, the most bytes of a page, go to the list stage and align instead)."""
        out: dict[str, Any] = {"v": PAGE_SKETCH.writes, "id": self.id, "url": self.url,
                               "fetched_at": self.fetched_at, "replay_key": self.replay_key}
        if self.read_as:
            out["read_as"] = self.read_as
        if self.deleted:
            out["deleted"] = True
            return out
        if self.rejected is not None:
            out["rejected"] = list(self.rejected)
            return out
        out["n_tokens"] = self.n_tokens
        out["content_hash"] = self.content_hash
        if self.unchanged:
            out["unchanged"] = True
        if self.near is not None:
            out["near"] = ({"indexed": self.near.indexed} if for_combine
                           else _near_dict(self.near))
        if self.passage is not None:
            out["passage"] = _passage_dict(self.passage, windows=not for_combine)
        return out

    def to_bytes(self) -> bytes:
        return bytes(msgpack.packb(self.to_dict(), use_bin_type=True))

    def to_combine_bytes(self) -> bytes:
        """The wire form the combine gets (``to_dict(for_combine=True)``)."""
        return bytes(msgpack.packb(self.to_dict(for_combine=True), use_bin_type=True))

    @classmethod
    def from_bytes(cls, raw: bytes, passage: bool = True) -> PageSketch:
        """``passage=False``: without the passage sketch (its arrays are most of a page's:
        a reader of the near sketch alone, the router, skips them)."""
        d = msgpack.unpackb(raw, raw=False)
        PAGE_SKETCH.check(d.get("v"))
        sk = cls(d["id"], d["url"], d["fetched_at"], d["replay_key"],
                 read_as=d.get("read_as", ""))
        if d.get("deleted"):
            sk.deleted = True
            return sk
        if d.get("unchanged"):
            sk.unchanged = True
        if "rejected" in d:
            sk.rejected = (d["rejected"][0], d["rejected"][1])
            return sk
        sk.n_tokens, sk.content_hash = d["n_tokens"], d["content_hash"]
        if "near" in d:
            sk.near = _near_from(d["near"])
        if passage and "passage" in d:
            sk.passage = _passage_from(d["passage"])
        return sk


def _passage_arrays(s: PassageState) -> list[Any]:
    """The passage sketch's arrays, 14 (None where it has none), the windows' bins (< 2^16)
    and cell offsets (a page has fewer than 2^31 cells) in small dtypes."""
    r = s.rects
    out: list[Any] = [None] * 4 if r is None else [
        r.bin.astype(np.uint16), r.key,
        np.stack((r.i_lo, r.i_hi, r.j_lo, r.j_hi)).astype(np.int32), r.empty]
    out += (_narrow(s.starts, np.int32), _narrow(s.ends, np.int32), s.keys, s.empty)
    for lists in (s.lists, s.window_lists):
        out += [None] * 3 if lists is None else (
            lists[0].astype(np.uint16), lists[1], lists[2].astype(np.int32))
    return out


def _narrow(a: Any, dtype: Any) -> Any:
    return None if a is None else a.astype(dtype)


def _wide(a: Any) -> Any:
    return None if a is None else a.astype(np.int64)


def _passage_from_arrays(n_units: int, positions: bytes, a: list[Any]) -> PassageState:
    rects = None
    if a[0] is not None:
        rect = a[2].astype(np.int64)
        rects = Rects(a[0].astype(np.int64), a[1], rect[0], rect[1], rect[2], rect[3], a[3])
    lists = None if a[8] is None else (a[8].astype(np.int64), a[9], a[10].astype(np.int64))
    window = None if a[11] is None else (a[11].astype(np.int64), a[12],
                                         a[13].astype(np.int64))
    return PassageState(rects, n_units, positions, _wide(a[4]), _wide(a[5]), a[6], a[7], lists,
                        window)


def _unpickle(id_: str, url: str | None, fetched_at: int | None, replay_key: bytes | None,
              rejected: tuple[str, str] | None, n_tokens: int, content_hash: bytes,
              near_head: tuple[Any, ...] | None, passage_head: tuple[int, bytes] | None,
              deleted: bool, unchanged: bool, read_as: str, data: bytearray, codes: str,
              dims: tuple[int, ...]) -> PageSketch:
    arrays = packed.unpack(data, codes, dims)
    near = state = None
    if near_head is not None:
        indexed, idf_version, fingerprint, frozen = near_head
        near = NearState(indexed, arrays[0], arrays[1], idf_version, fingerprint, arrays[2],
                         arrays[3], frozen)
        arrays = arrays[4:]
    if passage_head is not None:
        state = _passage_from_arrays(*passage_head, arrays)
    return PageSketch(id_, url, fetched_at, replay_key, rejected, n_tokens, content_hash, near,
                      state, deleted, unchanged, read_as)


class Sketcher:
    """The sketch stage for one engine configuration (one per process or thread)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.passages = PassageSketcher(config)

    def sketch(self, page: Page, idf: IdfTable, stored_hash: bytes | None = None) -> PageSketch:
        """The page's sketch under ``idf``; a page that cannot be processed comes back with
        ``rejected`` set (other exceptions propagate). ``stored_hash``: the content hash of
        the version of ``page.id`` in the store, if the caller knows it: a page with that
        content (an unchanged revisit) is only tokenized and hashed, not sketched."""
        sk, tokens = self._read(page, stored_hash)
        if tokens is not None:
            hashes = tokens.hashes(self.config.seed)
            sk.near = near_sketch(hashes, idf, self.config)
            sk.passage = self.passages.sketch_page(hashes, tokens)
        return sk

    def sketch_many(self, pages: list[Page], idf: IdfTable,
                    stored_hashes: list[bytes | None] | None = None,
                    copies: CopySketches | None = None) -> list[PageSketch | Exception]:
        """``sketch`` of each page (``stored_hashes``: each one's ``stored_hash``), or the
        exception it raised for that page. The pages' token hashes and near sketches are
        each one kernel call (``Tokens.hashes_many``, ``near_sketch_many``). ``copies``: the
        verification sketches stored with pages of the given content hashes (None: none),
        taken instead of computing them again (the same tokens give the same sketch)."""
        stored = stored_hashes or [None] * len(pages)
        out: list[PageSketch | Exception] = []
        todo: list[tuple[PageSketch, Tokens]] = []
        for page, stored_hash in zip(pages, stored, strict=True):
            try:
                sk, tokens = self._read(page, stored_hash)
            except Exception as exc:
                out.append(exc)
                continue
            out.append(sk)
            if tokens is not None:
                todo.append((sk, tokens))
        if todo:
            hashes = Tokens.hashes_many([t for _, t in todo], self.config.seed)
            known = None if copies is None else copies([sk.content_hash for sk, _ in todo])
            nears = near_sketch_many(hashes, idf, self.config, known)
            for (sk, tokens), h, near in zip(todo, hashes, nears, strict=True):
                sk.near = near
                sk.passage = self.passages.sketch_page(h, tokens)
        return out

    def _read(self, page: Page, stored_hash: bytes | None) -> tuple[PageSketch, Tokens | None]:
        """The page up to its tokens and content hash; its tokens when it is to be
        sketched (None: rejected, deleted, or an unchanged revisit)."""
        cfg = self.config
        try:
            encoded = check_unicode(page)
        except PageRejected as exc:
            return PageSketch(page.id, None, page.fetched_at, None, (exc.reason, exc.detail)), None
        if page.deleted:
            return PageSketch(page.id, page.url, page.fetched_at, None, deleted=True), None
        sk = PageSketch(page.id, page.url, page.fetched_at, replay_key(page, encoded),
                        read_as=reading(page))
        try:
            text = page_text(page, cfg.text.main_content, cfg.text.max_page_bytes,
                             encoded)
            tokens = tokenize(text, cfg.text.max_tokens)
            if not len(tokens):
                raise PageRejected("empty", "no words in the page text")
        except PageRejected as exc:
            sk.rejected = (exc.reason, exc.detail)
            return sk, None
        sk.n_tokens = len(tokens)
        sk.content_hash = tokens.content_hash(cfg.seed)
        if sk.content_hash == stored_hash:
            sk.unchanged = True
            return sk, None
        return sk, tokens


_LONG_FORM_SEED = 0x1D0  # replay keys of ids with a NUL (any seed but mmh3's default, 0)


def replay_key(page: Page, encoded: bytes | None = None) -> bytes:
    """Hash of (id, body): the same page seen again is answered from the store.
    ``encoded``: the body's UTF-8 bytes, if the caller has them (``check_unicode``)."""
    body = encoded if encoded is not None else (
        page.body.encode("utf-8") if isinstance(page.body, str) else page.body)
    doc_id = page.id.encode("utf-8")
    if b"\x00" in doc_id:
        # id ‖ NUL ‖ body would not say where such an id ends: ("a\0b", T) and ("a",
        # "b\0" T) would be one page, the second answered with the first's matches. Its
        # length goes first, under another seed (the keys of other ids, in stores already
        # written, stay as they were)
        return bytes(mmh3.hash_bytes(len(doc_id).to_bytes(4, "big") + doc_id + body,
                                     _LONG_FORM_SEED))
    return bytes(mmh3.hash_bytes(doc_id + b"\x00" + body))


def _near_dict(s: NearState) -> dict[str, Any]:
    return {"indexed": s.indexed, "unique": pack_array(s.unique, "<u8"),
            "counts": pack_array(s.counts, "<u4"),
            "idf_version": s.idf_version, "fingerprint": s.fingerprint,
            "W": pack_array(s.W, "<f8"), "sketch": pack_array(s.sketch, "<u8")}


def _near_from(d: dict[str, Any]) -> NearState:
    if "unique" not in d:  # (the combine's form)
        return NearState(indexed=d["indexed"])
    return NearState(indexed=d["indexed"], unique=unpack_array(d["unique"], "<u8"),
                     counts=unpack_array(d["counts"], "<u4", "int64"), idf_version=d["idf_version"],
                     fingerprint=d["fingerprint"], W=unpack_array(d["W"], "<f8"),
                     sketch=unpack_array(d["sketch"], "<u8"))


def _passage_dict(s: PassageState, windows: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"n_units": s.n_units}
    if s.rects is None:
        return out
    r = s.rects
    assert s.keys is not None
    if windows:
        out["windows"] = {
            "bin": pack_array(r.bin, "<u2"), "key": pack_array(r.key, "<u8"),
            "rect": pack_array(np.stack((r.i_lo, r.i_hi, r.j_lo, r.j_hi), axis=1), "<i4"),
            "empty": pack_array(r.empty, "u1")}
    out.update({
        "positions": s.positions,
        "starts": pack_array(s.starts, "<i4"), "ends": pack_array(s.ends, "<i4"),
        "k": int(s.keys.shape[1]), "keys": pack_array(s.keys, "<u8"),
        "empty": pack_array(s.empty, "u1"),
    })
    return out


def _passage_from(d: dict[str, Any]) -> PassageState:
    if "keys" not in d:
        return PassageState(None, d["n_units"])
    rects = None  # (the combine's form: passages without windows)
    if "windows" in d:
        w = d["windows"]
        rect = unpack_array(w["rect"], "<i4", "int64").reshape(-1, 4)
        rects = Rects(unpack_array(w["bin"], "<u2", "int64"), unpack_array(w["key"], "<u8"),
                      rect[:, 0].copy(), rect[:, 1].copy(), rect[:, 2].copy(),
                      rect[:, 3].copy(), unpack_array(w["empty"], "u1", "bool"))
    k = d["k"]
    return PassageState(rects, d["n_units"], d["positions"],
                        unpack_array(d["starts"], "<i4", "int64"),
                        unpack_array(d["ends"], "<i4", "int64"),
                        unpack_array(d["keys"], "<u8").reshape(-1, k),
                        unpack_array(d["empty"], "u1", "bool").reshape(-1, k))
