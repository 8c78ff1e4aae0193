"""The unit of input: one fetched page, as a crawler publishes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dupalign.errors import PageRejected


@dataclass(frozen=True)
class Page:
    """A crawled page. ``id`` is the crawler's document id (often the canonical URL); a page
    whose id is stored with other content is its new version (it replaces the old one)."""

    id: str
    body: bytes | str
    content_type: str = "text/plain"
    url: str | None = None
    fetched_at: int | None = None
    encoding: str | None = None
    lang: str | None = None
    meta: dict[str, Any] | None = field(default=None, compare=False)
    # a delete (a tombstone): the page ``id`` leaves every index; ``body`` is ignored
    deleted: bool = False


def check_unicode(page: Page) -> bytes | None:
    """The page's strings are stored as UTF-8, which cannot hold a lone surrogate (JSON's
    escapes can): reject such a page before anything is computed. (``meta`` is not
    checked: the engine stores none of it.) Returns the body's UTF-8 bytes when it had to
    encode them (a non-ASCII text body), for the caller's replay key."""
    body = None
    for name in ("id", "url", "body", "content_type", "encoding", "lang"):
        value = getattr(page, name)
        if isinstance(value, str) and not value.isascii():  # (ASCII holds no surrogate)
            try:
                encoded = value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise PageRejected("bad_unicode", f"page {name} is not valid Unicode "
                                   f"({exc.reason} at character {exc.start})") from None
            if name == "body":
                body = encoded
    return body
