"""dupalign: near-duplicate and copied-passage detection for web pages.

The library API (``dupalign/api.py``)::

    import dupalign

    with dupalign.open("pages.store") as store:
        matches = store.add("page-id", "text ...")

``import dupalign`` stays cheap: the engine (numpy, numba, RocksDB) is imported on first use
of ``open`` or ``Detector``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dupalign.config import EngineConfig
from dupalign.errors import ConfigError, PageRejected, StoreMismatch, StoreUnavailable
from dupalign.match import Match, MatchKind, Span
from dupalign.page import Page

if TYPE_CHECKING:
    from dupalign.api import Detector, StoredPage, open

__all__ = [
    "ConfigError",
    "Detector",
    "EngineConfig",
    "Match",
    "MatchKind",
    "Page",
    "PageRejected",
    "Span",
    "StoreMismatch",
    "StoreUnavailable",
    "StoredPage",
    "open",
]

_LAZY = {"Detector", "StoredPage", "open"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from dupalign import api

        return getattr(api, name)
    raise AttributeError(f"module 'dupalign' has no attribute {name!r}")
