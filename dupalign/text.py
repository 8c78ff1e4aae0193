"""Page bytes → text → normalized word tokens with character offsets.

Offsets are 0-based, half-open, and refer to the text this module returns (the decoded
body for text/plain, the extracted plain text for text/html), so spans can be shown to a
reader in the coordinates of the text they were computed on.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from dataclasses import dataclass

import charset_normalizer
import numpy as np
import numpy.typing as npt
from resiliparse.extract.html2text import extract_plain_text

from dupalign.errors import PageRejected
from dupalign.page import Page

_WORD = re.compile(r"\w+")
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f]")
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
HTML_TYPES = ("text/html", "application/xhtml+xml")
PLAIN_TYPES = ("text/plain",)


@dataclass(frozen=True)
class Tokens:
    """Normalized tokens of a text and where each one stands in it."""

    text: str
    tokens: list[str]
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.tokens)

    def char_range(self, start: int, end: int) -> tuple[int, int]:
        """Characters covered by the half-open token range [start, end)."""
        if end <= start:
            return (0, 0)
        return int(self.starts[start]), int(self.ends[end - 1])


def _known_codec(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def decode_body(body: bytes | str, declared: str | None = None, html: bool = False) -> str:
    """Decode page bytes: BOM, then the declared charset, then an HTML meta charset, then UTF-8,
    then statistical detection. Binary data raises PageRejected('undecodable')."""
    if isinstance(body, str):
        _reject_binary(body)
        return body
    candidates: list[str] = []
    for bom, bom_codec in _BOMS:
        if body.startswith(bom):
            candidates.append(bom_codec)
            break
    for name in (declared, _sniff_meta_charset(body) if html else None, "utf-8"):
        codec = _known_codec(name)
        if codec and codec not in candidates:
            candidates.append(codec)
    for candidate in candidates:
        try:
            text = body.decode(candidate)
        except (UnicodeDecodeError, LookupError):
            continue
        _reject_binary(text)
        return text
    if len(body) < 4096:
        # Too short for statistics to be reliable; windows-1252 is the web's de facto default.
        try:
            text = body.decode("cp1252")
            _reject_binary(text)
            return text
        except UnicodeDecodeError:
            pass
    best = charset_normalizer.from_bytes(body[: 1 << 20]).best()
    if best is None:
        raise PageRejected("undecodable", "no text encoding fits the bytes (binary content?)")
    text = body.decode(best.encoding, errors="replace")
    _reject_binary(text)
    return text


def _sniff_meta_charset(body: bytes) -> str | None:
    m = _META_CHARSET.search(body[:4096])
    return m.group(1).decode("ascii") if m else None


def _reject_binary(text: str) -> None:
    sample = text[:65536]
    if not sample:
        return
    controls = len(_CONTROL.findall(sample))
    if controls > 0.05 * len(sample):
        raise PageRejected("undecodable", f"{controls} control characters in the first "
                           f"{len(sample)}: binary content, not text")


def html_to_text(html: str, main_content: bool = False) -> str:
    """Plain text of an HTML page: block-aware, scripts/styles dropped; optionally only the
    main content (navigation, headers, footers and other boilerplate removed)."""
    return extract_plain_text(
        html,
        main_content=main_content,
        alt_texts=False,
        skip_elements=["script", "style", "noscript", "template", "svg", "nav"],
    )


def page_text(page: Page, main_content: bool = False, max_bytes: int = 1 << 30) -> str:
    """The text of a page that tokens and spans refer to."""
    size = len(page.body) if isinstance(page.body, bytes) else len(page.body.encode("utf-8"))
    if size > max_bytes:
        raise PageRejected("too_large", f"body is {size} bytes, limit is {max_bytes}")
    ctype = (page.content_type or "text/plain").split(";")[0].strip().lower()
    is_html = ctype in HTML_TYPES
    if not is_html and ctype not in PLAIN_TYPES:
        raise PageRejected("unsupported_type", f"content_type {page.content_type!r}")
    text = decode_body(page.body, page.encoding, html=is_html)
    return html_to_text(text, main_content) if is_html else text


def normalize_token(token: str) -> str:
    """Unicode NFKC and case folding; ASCII takes the fast path."""
    if token.isascii():
        return token.lower()
    return unicodedata.normalize("NFKC", token).casefold()


# \w for the ASCII range as a lookup table; other code points are classified once per
# distinct character by the regex itself (and remembered), so the result is exactly ``\w+``.
_ASCII_WORD = np.array([bool(_WORD.fullmatch(chr(c))) for c in range(128)], dtype=np.bool_)
_ASCII_WORD_OR_HIGH = np.append(_ASCII_WORD, False)  # index 128: any non-ASCII code point
_HIGH_IS_WORD: dict[int, bool] = {}


def _is_word(cp: int) -> bool:
    known = _HIGH_IS_WORD.get(cp)
    if known is None:
        known = _WORD.fullmatch(chr(cp)) is not None
        if len(_HIGH_IS_WORD) < 1 << 16:  # bounded, whatever pages come
            _HIGH_IS_WORD[cp] = known
    return known


def _word_runs(
    scanned: str,
) -> tuple[list[str], npt.NDArray[np.bool_], npt.NDArray[np.intp] | None]:
    """The ``\\w+`` runs of ``scanned``, the per-character word mask and the positions of
    its non-ASCII characters (None for ASCII text).

    Non-word characters are overwritten with spaces in a numpy copy of the code points and
    the result is split on whitespace (never a word character), all at C speed.
    """
    if scanned.isascii():
        codes = np.frombuffer(scanned.encode("ascii"), dtype=np.uint8)
        mask = _ASCII_WORD[codes]
        return np.where(mask, codes, np.uint8(32)).tobytes().decode("ascii").split(), mask, None
    cps = np.frombuffer(scanned.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    mask = _ASCII_WORD_OR_HIGH[np.minimum(cps, 128)]
    high = np.flatnonzero(cps >= 128)
    mask[high] = np.fromiter(map(_is_word, cps[high].tolist()), dtype=np.bool_,
                             count=high.size)
    spaced = np.where(mask, cps, np.uint32(32)).tobytes().decode("utf-32-le")
    return spaced.split(), mask, high


def tokenize(text: str, max_tokens: int | None = None) -> Tokens:
    """Word tokens (Unicode ``\\w+``), normalized, with their character offsets in ``text``."""
    # Lower-casing keeps offsets when it keeps the length (always for ASCII), so one pass
    # serves tokens and offsets; only non-ASCII tokens then need NFKC and case folding.
    scanned = text.lower()
    lowered = len(scanned) == len(text)
    if not lowered:
        scanned = text
    tokens, mask, high = _word_runs(scanned)
    if max_tokens is not None and len(tokens) > max_tokens:
        raise PageRejected("too_many_tokens", f"{len(tokens)} tokens, limit is {max_tokens}")
    # Offsets: the edges of the runs of word characters (what finditer would report),
    # found with numpy instead of one Match object per token.
    edges = np.diff(mask.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts = np.flatnonzero(edges == 1).astype(np.int64)
    ends = np.flatnonzero(edges == -1).astype(np.int64)
    if starts.size != len(tokens):  # cannot happen while \\w is a per-character class
        raise AssertionError("word runs and regex tokens disagree")
    if not lowered:  # e.g. "İ" lower-cases to two characters: ASCII tokens need it too
        tokens = [normalize_token(t) for t in tokens]
    elif high is not None and high.size:  # only the tokens holding a non-ASCII character
        inside = high[mask[high]]  # the token holding character p ends after p
        for x in np.unique(np.searchsorted(ends, inside, side="right")).tolist():
            tokens[x] = normalize_token(tokens[x])
    return Tokens(text=text, tokens=tokens, starts=starts, ends=ends)
