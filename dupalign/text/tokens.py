"""Page bytes → text → normalized word tokens with character offsets.

Offsets are 0-based, half-open, and refer to the text this module returns (the decoded
body for text/plain, the extracted plain text for text/html), so spans can be shown to a
reader in the coordinates of the text they were computed on.
"""

from __future__ import annotations

import codecs
import functools
import re
import unicodedata

import charset_normalizer
import numpy as np
import numpy.typing as npt
from resiliparse.extract.html2text import extract_plain_text

from dupalign.errors import PageRejected
from dupalign.kernel_cache import njit
from dupalign.page import Page
from dupalign.text.hashing import (
    SEP,
    content_hash,
    content_hash_joined,
    hash_joined,
    token_hashes,
)

_WORD = re.compile(r"\w+")
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0E, 0x20)])
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_SEP = SEP.encode("ascii")
HTML_TYPES = ("text/html", "application/xhtml+xml")
PLAIN_TYPES = ("text/plain",)


class Tokens:
    """Normalized tokens of a text and where each one stands in it.

    ``tokenize`` writes the tokens' UTF-8 bytes, ``SEP`` after each but the last (``joined``),
    without a Python string per token: hashing reads those bytes, and the strings
    (``tokens``) are made only if asked for (a third of the near-only sketch went to
    making, splitting and joining them again). Tokens that NFKC or case folding changed
    are given as strings (``joined`` None)."""

    __slots__ = ("_joined", "_tokens", "ends", "starts", "text")

    def __init__(self, text: str, tokens: list[str] | None, starts: npt.NDArray[np.int64],
                 ends: npt.NDArray[np.int64], joined: bytes | None = None) -> None:
        self.text, self.starts, self.ends = text, starts, ends
        self._tokens, self._joined = tokens, joined

    @property
    def tokens(self) -> list[str]:
        if self._tokens is None:
            self._tokens = self._joined.decode("utf-8").split(SEP) if self._joined else []
        return self._tokens

    def __len__(self) -> int:
        return len(self.starts) if self._tokens is None else len(self._tokens)

    def hashes(self, seed: int) -> npt.NDArray[np.uint64]:
        """``token_hashes(self.tokens, seed)``."""
        if self._joined is None:
            return token_hashes(self.tokens, seed)
        return hash_joined(self._joined, len(self.starts), seed)

    def content_hash(self, seed: int) -> bytes:
        """``content_hash(self.tokens, seed)``."""
        if self._joined is None:
            return content_hash(self.tokens, seed)
        return content_hash_joined(self._joined, seed)

    @staticmethod
    def hashes_many(pages: list[Tokens], seed: int) -> list[npt.NDArray[np.uint64]]:
        """``hashes`` of each page's tokens (its oracle in the tests), the pages given as
        bytes hashed by one kernel call (their tokens joined by ``SEP``, as within a page)."""
        out: list[npt.NDArray[np.uint64] | None] = [None] * len(pages)
        joined = [x for x, t in enumerate(pages) if t._joined is not None and len(t)]
        if joined:
            every = hash_joined(_SEP.join([pages[x]._joined or b"" for x in joined]),
                                sum(len(pages[x]) for x in joined), seed)
            at = 0
            for x in joined:
                n = len(pages[x])
                out[x], at = every[at:at + n], at + n
        return [t.hashes(seed) if h is None else h for t, h in zip(pages, out, strict=True)]

    def char_range(self, start: int, end: int) -> tuple[int, int]:
        """Characters covered by the half-open token range [start, end)."""
        if end <= start:
            return (0, 0)
        return int(self.starts[start]), int(self.ends[end - 1])


# Python codecs that decode bytes to str but are no character set of a document: a page
# declaring one (``charset=undefined`` is seen on the web) is read as if it declared none.
_NOT_CHARSETS = frozenset({"undefined", "punycode", "idna", "unicode-escape",
                           "raw-unicode-escape"})


def _known_codec(name: str | None) -> str | None:
    if not name:
        return None
    try:
        info = codecs.lookup(name)
    except LookupError:
        return None
    # bytes-to-bytes codecs (base64, rot13, zlib...) are marked so by Python itself
    if not getattr(info, "_is_text_encoding", True) or info.name in _NOT_CHARSETS:
        return None
    return info.name


def decode_body(body: bytes | str, declared: str | None = None, html: bool = False,
                encoded: bytes | None = None) -> str:
    """Decode page bytes: BOM, then the declared charset, then an HTML meta charset, then UTF-8,
    then statistical detection. Binary data raises PageRejected('undecodable').
    ``encoded``: a text body's UTF-8 bytes, if the caller has them."""
    if isinstance(body, str):
        _reject_binary(body, encoded)
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
        except (UnicodeError, LookupError):  # UnicodeError: some codecs raise no subclass
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


def _reject_binary(text: str, encoded: bytes | None = None) -> None:
    """``encoded``: ``text`` in UTF-8 (so without surrogates), if the caller has it."""
    sample = text[:65536]
    if not sample:
        return
    # counted in UTF-8, where these characters are the only bytes of those values (a
    # regex over the text costs 4x)
    raw = encoded if encoded is not None and len(sample) == len(text) else sample.encode(
        "utf-8", "surrogatepass")
    controls = len(raw) - len(raw.translate(None, _CONTROL_BYTES))
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


def _main_type(content_type: str | None) -> str:
    return (content_type or "text/plain").split(";")[0].strip().lower()


def reading(page: Page) -> str:
    """What ``page_text`` takes of the page besides its body: read as HTML or as plain
    text, and the charset it declares (bytes only). One body read two ways is two texts."""
    is_bytes = isinstance(page.body, bytes)
    return _reading(page.content_type, page.encoding if is_bytes else None, is_bytes)


@functools.lru_cache(maxsize=256)
def _reading(content_type: str | None, encoding: str | None, is_bytes: bool) -> str:
    """``reading`` by what it reads of the page (a stream repeats a few)."""
    kind = "html" if _main_type(content_type) in HTML_TYPES else "plain"
    charset = _known_codec(encoding) if is_bytes else None
    return f"{kind};{charset or ''}"


def page_text(page: Page, main_content: bool = False, max_bytes: int = 1 << 30,
              encoded: bytes | None = None) -> str:
    """The text of a page that tokens and spans refer to. ``encoded``: a text body's UTF-8
    bytes, if the caller has them (``dupalign.page.check_unicode``)."""
    body = page.body
    # (a character takes at most 4 bytes: a text that short is within the limit uncounted)
    size = len(body) if isinstance(body, bytes) or 4 * len(body) <= max_bytes else len(
        body.encode("utf-8") if encoded is None else encoded)
    if size > max_bytes:
        raise PageRejected("too_large", f"body is {size} bytes, limit is {max_bytes}")
    ctype = _main_type(page.content_type)
    is_html = ctype in HTML_TYPES
    if not is_html and ctype not in PLAIN_TYPES:
        raise PageRejected("unsupported_type", f"content_type {page.content_type!r}")
    text = decode_body(page.body, page.encoding, html=is_html, encoded=encoded)
    return html_to_text(text, main_content) if is_html else text


def normalize_token(token: str) -> str:
    """Unicode NFKC and case folding; ASCII takes the fast path."""
    if token.isascii():
        return token.lower()
    return unicodedata.normalize("NFKC", token).casefold()


# What each code point is, learned as pages bring them (one byte a code point, so bounded
# whatever pages come): known yet, a word character (exactly ``\w+``'s: classified by the
# regex itself), kept as it is by ``str.lower`` (wherever it stands: the one rule that looks
# at neighbours, the final sigma, is for a character it changes). A page's characters are
# looked up in the tokenizer's kernel, in its one pass: finding a page's distinct non-ASCII
# characters and classifying them as a set cost a third of the tokenizer on Boost pages
# (nearly all of them hold a "©" or an NBSP). Shared by every thread, without a lock: the
# kernel reads it without the GIL while ``_learn`` writes it, so a character's byte is 0 until
# one store writes it whole (a reader sees 0, learns it too, or the whole byte, never a
# part), threads that learn one character at once store the same byte, and none is ever
# cleared (tests/text/test_tokens_threads.py).
_KNOWN, _WORDY, _KEEPS = 1, 2, 4
_FLAGS = np.zeros(0x110000, dtype=np.uint8)
_UNKNOWN, _LOWERS = -1, -2  # the kernel met a character not known yet, or one lower() changes


def _learn(codes: npt.NDArray[np.uint8] | npt.NDArray[np.uint32]) -> None:
    """Classify the code points of ``codes`` not known yet."""
    for cp in np.unique(codes[_FLAGS[codes] == 0]).tolist():
        ch = chr(cp)
        flags = (_KNOWN | (_WORDY if _WORD.fullmatch(ch) else 0)
                 | (_KEEPS if ch.lower() == ch else 0))
        _FLAGS[cp] = flags  # (whole, in one store: see above)


_learn(np.arange(128, dtype=np.uint32))


def _codes(text: str) -> npt.NDArray[np.uint8] | npt.NDArray[np.uint32]:
    """The code points of ``text`` (bytes for ASCII text)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


@njit(cache=True, nogil=True)
def _word_bytes(codes: npt.NDArray[np.uint8] | npt.NDArray[np.uint32],
                flags: npt.NDArray[np.uint8], lower_ascii: bool, width: int
                ) -> tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """The runs of word characters of the code points ``codes``: a status, their number t,
    their starts, ends and the runs holding a non-ASCII character in one array (t, t and
    the rest: numba boxes each array it returns, ~0.5 µs), and their UTF-8 bytes joined by
    ``SEP`` (A-Z lower-cased if ``lower_ascii``). The status is 0, or ``_UNKNOWN`` (the rest
    unfinished) when a character is not in ``flags`` yet, or ``_LOWERS`` when
    ``lower_ascii`` and lower-casing changes a non-ASCII character. ``width``: the most
    UTF-8 bytes a code point takes (1 for ASCII text, else 4)."""
    n = codes.shape[0]
    starts = np.empty(n // 2 + 1, dtype=np.int64)
    ends = np.empty(n // 2 + 1, dtype=np.int64)
    high = np.zeros(n // 2 + 1, dtype=np.bool_)
    joined = np.empty(width * n, dtype=np.uint8)  # (SEP replaces a non-word character)
    m = 0
    t = 0
    n_high = 0
    inside = False
    for i in range(n):
        c = np.uint32(codes[i])
        f = flags[c]
        if c >= 128:
            if not f & _KNOWN:
                return _UNKNOWN, 0, starts[:0], joined[:0]
            if lower_ascii and not f & _KEEPS:
                return _LOWERS, 0, starts[:0], joined[:0]
        if f & _WORDY:
            if not inside:
                if t > 0:
                    joined[m] = 0x1F  # (SEP)
                    m += 1
                starts[t] = i
                inside = True
            if c < 0x80:
                joined[m] = c + 32 if lower_ascii and 65 <= c <= 90 else c
                m += 1
                continue
            if not high[t]:
                high[t] = True
                n_high += 1
            if c < 0x800:
                joined[m] = 0xC0 | (c >> 6)
                joined[m + 1] = 0x80 | (c & 0x3F)
                m += 2
            elif c < 0x10000:
                joined[m] = 0xE0 | (c >> 12)
                joined[m + 1] = 0x80 | ((c >> 6) & 0x3F)
                joined[m + 2] = 0x80 | (c & 0x3F)
                m += 3
            else:
                joined[m] = 0xF0 | (c >> 18)
                joined[m + 1] = 0x80 | ((c >> 12) & 0x3F)
                joined[m + 2] = 0x80 | ((c >> 6) & 0x3F)
                joined[m + 3] = 0x80 | (c & 0x3F)
                m += 4
        elif inside:
            ends[t] = i
            t += 1
            inside = False
    if inside:
        ends[t] = n
        t += 1
    out = np.empty(2 * t + n_high, dtype=np.int64)
    out[:t] = starts[:t]
    out[t:2 * t] = ends[:t]
    at = 2 * t
    for x in range(t):
        if high[x]:
            out[at] = x
            at += 1
    return 0, t, out, joined[:m]


def _words(codes: npt.NDArray[np.uint8] | npt.NDArray[np.uint32], lower_ascii: bool
           ) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
                      npt.NDArray[np.uint8]]:
    """``_word_bytes`` of ``codes`` (their characters learned first if need be): the
    status, the runs' starts, ends, the runs holding a non-ASCII character, their bytes."""
    width = 1 if codes.dtype == np.uint8 else 4
    status, t, out, joined = _word_bytes(codes, _FLAGS, lower_ascii, width)
    if status == _UNKNOWN:
        _learn(codes)
        status, t, out, joined = _word_bytes(codes, _FLAGS, lower_ascii, width)
        if status == _UNKNOWN:  # (no page's characters are unknown once it is learned)
            raise RuntimeError("the tokenizer's table lost a character it had learned")
    return status, out[:t], out[t:2 * t], out[2 * t:], joined


def tokenize(text: str, max_tokens: int | None = None) -> Tokens:
    """Word tokens (Unicode ``\\w+``), normalized, with their character offsets in ``text``."""
    # Lower-casing keeps offsets when it keeps the length (always for ASCII, lower-cased
    # in the kernel), so one pass serves tokens and offsets; only tokens holding a
    # non-ASCII character may then need NFKC and case folding.
    # Text whose non-ASCII characters all stay as they are lower-cased (most non-ASCII text
    # of a page is punctuation: "©", "—", NBSP) is read as is, A-Z lower-cased in the
    # kernel: what its lower-cased copy would give, at a quarter of the cost.
    codes = _codes(text)
    status, starts, ends, high, joined = _words(codes, True)
    scanned, lowered, lower_ascii = text, True, status != _LOWERS
    if not lower_ascii:
        scanned = text.lower()
        lowered = len(scanned) == len(text)
        if not lowered:
            scanned = text
        status, starts, ends, high, joined = _words(_codes(scanned) if lowered else codes,
                                                    False)
    if max_tokens is not None and len(starts) > max_tokens:
        raise PageRejected("too_many_tokens", f"{len(starts)} tokens, limit is {max_tokens}")
    raw = joined.tobytes()
    if not lowered:  # e.g. "İ" lower-cases to two characters: ASCII tokens need it too
        tokens = [normalize_token(t) for t in raw.decode("utf-8").split(SEP)] if len(
            starts) else []
        return Tokens(text, tokens, starts, ends)
    odd = []
    for x in high.tolist():
        # (read as is: a token with a non-ASCII character then changes only in A-Z, by
        # lower(), as in the copy: no character it holds has a rule that looks around it)
        token = scanned[starts[x]:ends[x]]
        if lower_ascii:
            token = token.lower()
        if normalize_token(token) != token:
            odd.append(x)
    if odd:  # (rare: a ligature, a sharp s, a final sigma)
        tokens = raw.decode("utf-8").split(SEP)
        for x in odd:
            tokens[x] = normalize_token(tokens[x])
        return Tokens(text, tokens, starts, ends)
    return Tokens(text, None, starts, ends, raw)
