"""The library API: a persistent store of pages that you add text to and get matches from.

A thin facade over :class:`dupalign.runtime.engine.Engine` for programs that use dupalign the way
one uses datasketch's ``MinHashLSH``, without Kafka and without the command line::

    import dupalign

    with dupalign.open("pages.store") as store:
        store.add("a", "some text ...")           # -> [] (nothing earlier to match)
        for match in store.add("b", "some text ..."):
            print(match.kind, match.match_doc_id, match.est_jaccard)

Pages are matched against the pages added before them, in that order; everything is on
disk (RocksDB) when ``add`` returns. One process at a time can have a store open for
writing (others get :class:`~dupalign.errors.StoreUnavailable`); readers
(``read_only=True``) may be many.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import msgpack

from dupalign.config import EngineConfig
from dupalign.match import Match
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.store import tables


@dataclass(frozen=True)
class StoredPage:
    """A page as the store keeps it (its text is not kept, only what matching needs)."""

    id: str
    ordinal: int  # 0, 1, 2 ... in the order pages were added
    n_tokens: int
    url: str | None = None
    fetched_at: int | None = None  # ms since the epoch, as given to ``add``


class Detector:
    """An open store: add pages, get their matches, query texts, list pages.

    Use :func:`dupalign.open` to get one; close it (or use ``with``) when done. Not
    thread-safe: call it from one thread.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @property
    def engine(self) -> Engine:
        """The engine underneath, for what this facade does not offer (e.g. its metrics)."""
        return self._engine

    @property
    def config(self) -> EngineConfig:
        """The parameters in force (a reader's frozen ones come from the store)."""
        return self._engine.config

    def add(self, doc_id: str, body: str | bytes, *, content_type: str = "text/plain",
            url: str | None = None, fetched_at: int | None = None) -> list[Match]:
        """Store a page and return its matches against every page added before it.

        ``body`` is the text, or the bytes as fetched (the charset is detected);
        ``content_type="text/html"`` extracts the main text of HTML first. Adding the same
        ``doc_id`` with the same body again stores nothing and returns the same matches;
        with another body it is a new version of the page: it replaces the stored one
        (never matching it) and its matches start with one ``revisit`` match.
        Raises :class:`~dupalign.errors.PageRejected` (with ``reason``) for a page that
        cannot be processed, e.g. one without words; nothing is stored then.
        """
        return self.add_page(Page(id=doc_id, body=body, content_type=content_type, url=url,
                                  fetched_at=fetched_at))

    def add_page(self, page: Page) -> list[Match]:
        """:meth:`add` for a :class:`~dupalign.page.Page` you already have."""
        return self._engine.process(page)

    def delete(self, *doc_ids: str) -> int:
        """Remove pages from every index (later pages never match them); returns how many
        were stored."""
        return self._engine.delete(list(doc_ids))

    def compact(self, now_ms: int | None = None) -> int:
        """Apply the configured retention (``retention.max_age``, ``retention.max_pages``);
        returns how many pages left."""
        return self._engine.compact(now_ms)

    def query(self, text: str) -> list[Match]:
        """Passages of ``text`` copied from stored pages (``kind == "passage"``, spans in
        ``text`` and in the stored page); nothing is stored. Works on a read-only store."""
        return self._engine.query_text(text)

    def matches(self, doc_id: str) -> list[Match]:
        """The matches the page ``doc_id`` got when it was added (KeyError if unknown)."""
        ordinal = self._ordinal(doc_id)
        raw = tables.matches.get(self._engine.store, ordinal)
        return [] if raw is None else [Match.from_dict(d) for d in msgpack.unpackb(raw)]

    def pages(self) -> Iterator[StoredPage]:
        """Every stored page, in the order they were added."""
        for ordinal, value in tables.docs.items(self._engine.store):
            record = msgpack.unpackb(value)
            yield StoredPage(id=record["id"], ordinal=ordinal,
                             n_tokens=record["n_tokens"], url=record.get("url"),
                             fetched_at=record.get("fetched_at"))

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self._engine.has_page(doc_id)

    def __len__(self) -> int:
        """How many pages the store holds (current versions; deleted pages left)."""
        return self._engine.alive

    def stats(self) -> dict[str, Any]:
        """The store's sizes and frozen parameters (what ``dupalign stats --json`` prints),
        and the counters of what this handle did since it was opened."""
        return self._engine.stats()

    def close(self) -> None:
        """Close the store (everything added is already on disk)."""
        self._engine.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _ordinal(self, doc_id: str) -> int:
        ordinal = tables.ids.get(self._engine.store, doc_id)
        if ordinal is None:
            raise KeyError(doc_id)
        return ordinal


def open(  # as gzip.open: the module names what is opened (shadows the builtin here only)
    path: str | Path, config: EngineConfig | Mapping[str, Any] | None = None, *,
    read_only: bool = False,
) -> Detector:
    """Open the store at ``path`` (a directory; created if missing, unless ``read_only``).

    ``config``: an :class:`~dupalign.config.EngineConfig`, or a mapping shaped like the
    ``[engine]`` table of the TOML config (``{"near": {"hamming": 4}}``); default
    parameters if None. A store keeps the frozen parameters it was made with: opening it
    for writing with other ones raises :class:`~dupalign.errors.StoreMismatch`; a reader
    takes the store's. Raises :class:`~dupalign.errors.StoreUnavailable` if the store is
    missing (read-only), not a directory, not writable or locked by another process, and
    :class:`~dupalign.errors.ConfigError` for an invalid parameter.
    """
    if config is not None and not isinstance(config, EngineConfig):
        config = EngineConfig.from_dict(dict(config))
    return Detector(Engine.open(path, config, read_only=read_only))
