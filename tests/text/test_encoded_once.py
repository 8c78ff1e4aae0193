"""A text body is encoded to UTF-8 once a page (``check_unicode``) and those bytes serve the
replay key and the binary check: the same key, text and rejections as each step encoding
the body itself."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dupalign.errors import PageRejected
from dupalign.page import Page, check_unicode
from dupalign.stages.sketch import replay_key
from dupalign.text.tokens import page_text

# ASCII, punctuation of pages ("©", "•", NBSP), other scripts, control characters (the
# binary check), NUL, and lone surrogates (check_unicode rejects those)
_CHARS = st.sampled_from([*"ab Z\n\t", "©", "•", "\xa0", "é", "Ж", "中", "😀", "\x01", "\x00",
                          "\ud800"])
bodies = st.one_of(st.lists(_CHARS, max_size=60).map("".join), st.text(max_size=40))


def _text(page: Page, **kw: Any) -> str | tuple[str, str]:
    try:
        return page_text(page, False, 1 << 20, **kw)
    except PageRejected as exc:
        return (exc.reason, exc.detail)


@given(body=bodies, html=st.booleans(), doc_id=st.sampled_from(["a", "ж", "a\x00b"]))
def test_the_body_encoded_once_gives_the_same_key_and_text(body: str, html: bool,
                                                          doc_id: str) -> None:
    page = Page(doc_id, body, content_type="text/html" if html else "text/plain")
    try:
        encoded = check_unicode(page)
    except PageRejected:
        return  # rejected before anything is computed
    if encoded is not None:
        assert encoded == body.encode("utf-8")
    else:
        assert body.isascii()
    assert replay_key(page, encoded) == replay_key(page)
    assert _text(page, encoded=encoded) == _text(page)


def test_a_long_body_checks_its_first_characters_only() -> None:
    # past 65,536 characters the check reads a prefix: the bytes given are not its own
    body = "é" * 70_000 + "\x01" * 10_000
    page = Page("a", body)
    assert _text(page, encoded=check_unicode(page)) == _text(page) == body
