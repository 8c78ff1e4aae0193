"""One call per page: text → tokens → exact, near and passage matches against earlier pages.

``Engine.process`` is the whole pipeline for one page. Everything the page adds to the store
(its doc record, index entries, the matches it produced and, for Kafka input, the next
offset) goes into one WriteBatch; in-memory indexes are updated only after that write
succeeds. Each page gets the next ordinal and matches only smaller ordinals, so replaying a
page yields exactly what it yielded the first time (the matches are stored and returned).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import mmh3
import msgpack

from dupalign.config import IMPLIED_PARAMS, PARAM_UPGRADES, EngineConfig
from dupalign.errors import PageRejected
from dupalign.hashing import content_hash, token_hashes
from dupalign.match import Match, best_span
from dupalign.near import NearIndex
from dupalign.page import Page
from dupalign.passages import PassageIndex
from dupalign.store import Store, offsets_key, parse_offsets_key, read_u64, u64
from dupalign.text import page_text, tokenize

ENGINE_NAME = "dupalign"


@dataclass
class PageReport:
    """What the last ``process`` call did, for metrics: seconds per stage and counts."""

    replayed: bool = False  # answered from the store (page seen before)
    text: float = 0.0
    exact: float = 0.0
    near: float = 0.0
    passage: float = 0.0
    store: float = 0.0
    psm_probes: int = 0
    near_candidates: int = 0
    cws_pairs: int = 0
    cws_samples_saved: int = 0


class Engine:
    """The duplicate engine over one store. Not thread-safe: call from one thread."""

    def __init__(self, store: Store, config: EngineConfig, read_only: bool = False) -> None:
        self.config = config
        self.store = store
        self.read_only = read_only
        last = store.last_key("docs")
        self.next_ordinal = 0 if last is None else read_u64(last) + 1
        self.near = NearIndex(store, config, self.next_ordinal)
        self.passages = PassageIndex(store, config)
        self.last_report = PageReport()
        self._engine_info = {
            "name": ENGINE_NAME,
            "h": config.near.hamming,
            "cws_K": config.near.cws_samples,
            "cws_threshold": config.near.cws_threshold,
            "passage_mode": config.passage.mode,
            "k": config.passage.k,
            "theta": config.passage.theta,
        }

    @classmethod
    def open(
        cls, store_dir: str | Path, config: EngineConfig | None = None, read_only: bool = False
    ) -> Engine:
        """Open (or create) the store in directory ``store_dir`` and load its in-memory
        indexes (the simhash table, idf counts) from it.

        ``config``: defaults if None. A new store records the config's frozen parameters;
        an existing one must have been made with the same (older store formats are
        upgraded in place when opened for writing), else StoreMismatch. ``read_only``: no
        write, no lock, the store must exist, and the engine takes the store's frozen
        parameters whatever ``config`` says (``process`` then raises). Raises
        StoreUnavailable if the directory cannot be used (missing for a reader, a file,
        not writable, locked by another process). Close the engine (or use ``with``).
        Library users may prefer the facade ``dupalign.open`` (dupalign/api.py).
        """
        config = (config or EngineConfig()).validate()
        store = Store(store_dir, config.frozen_params(), read_only=read_only,
                      implied=IMPLIED_PARAMS, upgrades=PARAM_UPGRADES,
                      block_cache_bytes=config.cache.blocks_mb << 20)
        try:
            if read_only:  # a reader takes the store's frozen parameters, whatever it asked
                config = config.with_frozen(store.params)
            return cls(store, config, read_only)
        except BaseException:
            store.close()
            raise

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.store.close()

    # -- the pipeline ---------------------------------------------------------------------
    def process(self, page: Page, source: tuple[str, int, int] | None = None) -> list[Match]:
        """Matches of ``page`` against every earlier page; stores the page. Raises
        PageRejected for pages that cannot be processed (nothing is written then, except
        that ``source``'s offset still advances so the caller can move on)."""
        if self.read_only:
            raise RuntimeError("engine opened read-only")
        times = PageReport()
        self.last_report = times
        try:
            _check_unicode(page)
        except PageRejected:
            if source is not None:
                self._write_offset_only(source)
            raise
        replay_key = _replay_key(page)
        seen = self.store.get("replay", replay_key)
        if seen is not None:
            times.replayed = True
            if source is not None:
                self._write_offset_only(source)
            return self._stored_matches(read_u64(seen))

        t0 = time.perf_counter()
        try:
            text = page_text(page, self.config.text.main_content, self.config.text.max_page_bytes)
            tokens = tokenize(text, self.config.text.max_tokens)
            if not len(tokens):
                raise PageRejected("empty", "no words in the page text")
        except Exception:
            if source is not None:
                self._write_offset_only(source)
            raise
        t1 = time.perf_counter()
        times.text = t1 - t0

        ordinal = self.next_ordinal
        batch = self.store.batch()
        matches: list[Match] = []

        chash = content_hash(tokens.tokens, self.config.seed)
        original = self._exact_original(chash)
        t2 = time.perf_counter()
        times.exact = t2 - t1
        near_state = passage_state = None
        if original is not None:
            matches.append(self._match(page.id, "exact", original, est_jaccard=1.0))
        else:
            hashes = token_hashes(tokens.tokens, self.config.seed)
            c = self.near.counters
            before = (c.probes, c.candidates, c.filter.pairs, c.filter.samples_saved)
            near_found, near_state = self.near.search(hashes, ordinal)
            times.psm_probes = c.probes - before[0]
            times.near_candidates = c.candidates - before[1]
            times.cws_pairs = c.filter.pairs - before[2]
            times.cws_samples_saved = c.filter.samples_saved - before[3]
            matched = set()
            for other, hamming, est in near_found:
                matched.add(other)
                matches.append(self._match(page.id, "near", other, hamming=hamming,
                                           est_jaccard=est))
            t3 = time.perf_counter()
            times.near = t3 - t2
            # one message per matched pair: near duplicates are not aligned again as passages
            passage_found, passage_state = self.passages.search(hashes, tokens, ordinal,
                                                                frozenset(matched))
            for other, spans in passage_found:
                best = best_span(spans)
                matches.append(self._match(page.id, "passage", other,
                                           est_jaccard=best.est_jaccard,
                                           jaccard=best.jaccard, spans=tuple(spans)))
            times.passage = time.perf_counter() - t3
            self.near.stage(batch, ordinal, near_state)
            self.passages.stage(batch, ordinal, passage_state)
        t4 = time.perf_counter()

        record = {
            "id": page.id,
            "url": page.url,
            "n_tokens": len(tokens),
            "content_hash": chash,
            "simhash": None if near_state is None else near_state.fingerprint,
            "fetched_at": page.fetched_at,
            "source": list(source) if source is not None else None,
        }
        batch.put("docs", u64(ordinal), msgpack.packb(record))
        batch.put("ids", page.id.encode("utf-8"), u64(ordinal))
        batch.put("replay", replay_key, u64(ordinal))
        batch.put("exact", chash + u64(ordinal), b"")
        batch.put("matches", u64(ordinal), msgpack.packb([m.to_dict() for m in matches]))
        if source is not None:
            topic, partition, offset = source
            batch.put("offsets", offsets_key(topic, partition), u64(offset + 1))
        self.store.write(batch)
        self.next_ordinal = ordinal + 1
        self.near.commit(ordinal, near_state)
        self.passages.commit(ordinal, passage_state)
        times.store = time.perf_counter() - t4
        return matches

    def query_text(self, text: str) -> list[Match]:
        """Passages of ``text`` aligned against the store (nothing is written)."""
        tokens = tokenize(text, self.config.text.max_tokens)
        hashes = token_hashes(tokens.tokens, self.config.seed)
        found, _ = self.passages.search(hashes, tokens, self.next_ordinal)
        return [
            self._match("<query>", "passage", other, est_jaccard=best_span(spans).est_jaccard,
                        jaccard=best_span(spans).jaccard, spans=tuple(spans))
            for other, spans in found
        ]

    # -- helpers --------------------------------------------------------------------------
    def _match(self, doc_id: str, kind: Any, other: int, **fields: Any) -> Match:
        return Match(doc_id=doc_id, kind=kind, match_doc_id=self.doc_id(other),
                     engine=self._engine_info, **fields)

    def doc_id(self, ordinal: int) -> str:
        raw = self.store.get("docs", u64(ordinal))
        if raw is None:
            raise KeyError(f"no document with ordinal {ordinal}")
        return str(msgpack.unpackb(raw)["id"])

    def _exact_original(self, chash: bytes) -> int | None:
        for key, _ in self.store.prefix("exact", chash):
            return read_u64(key, len(chash))
        return None

    def _stored_matches(self, ordinal: int) -> list[Match]:
        raw = self.store.get("matches", u64(ordinal))
        return [] if raw is None else [Match.from_dict(d) for d in msgpack.unpackb(raw)]

    def _write_offset_only(self, source: tuple[str, int, int]) -> None:
        topic, partition, offset = source
        batch = self.store.batch()
        batch.put("offsets", offsets_key(topic, partition), u64(offset + 1))
        self.store.write(batch)

    def stored_offsets(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for key, value in self.store.items("offsets"):
            out[parse_offsets_key(key)] = read_u64(value)
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "pages": self.next_ordinal,
            "store_bytes": self.store.size_bytes(),
            "params": self.store.params,
            **self.near.stats(),
            **self.passages.stats(),
        }


def _check_unicode(page: Page) -> None:
    """The page's strings are stored as UTF-8, which cannot hold a lone surrogate (JSON's
    escapes can): reject such a page before anything is computed."""
    for name in ("id", "url", "body", "content_type", "encoding", "lang"):
        value = getattr(page, name)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise PageRejected("bad_unicode", f"page {name} is not valid Unicode "
                                   f"({exc.reason} at character {exc.start})") from None


def _replay_key(page: Page) -> bytes:
    body = page.body.encode("utf-8") if isinstance(page.body, str) else page.body
    return mmh3.hash_bytes(page.id.encode("utf-8") + b"\x00" + body)
