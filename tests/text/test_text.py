"""Text extraction, decoding and tokenization with offsets."""

from __future__ import annotations

import re

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.text.hashing import content_hash, token_hashes
from dupalign.text.tokens import decode_body, html_to_text, normalize_token, page_text, tokenize


def test_tokens_keep_offsets_into_the_given_text() -> None:
    text = "Héllo, WORLD! ﬁne straße 42"
    toks = tokenize(text)
    assert toks.tokens == ["héllo", "world", "fine", "strasse", "42"]
    for tok, s, e in zip(toks.tokens, toks.starts, toks.ends, strict=True):
        assert normalize_token(text[s:e]) == tok


@given(st.text(max_size=200))
@settings(max_examples=200, deadline=None)
def test_offsets_round_trip_on_any_text(text: str) -> None:
    toks = tokenize(text)
    assert len(toks.starts) == len(toks.tokens)
    prev_end = 0
    for tok, s, e in zip(toks.tokens, toks.starts, toks.ends, strict=True):
        assert prev_end <= s < e <= len(text)
        assert normalize_token(text[s:e]) == tok
        prev_end = e


def test_char_range_of_token_range() -> None:
    toks = tokenize("alpha beta  gamma delta")
    assert toks.char_range(1, 3) == (6, 17)
    assert toks.char_range(2, 2) == (0, 0)


@pytest.mark.parametrize(
    ("raw", "declared", "html", "expected"),
    [
        ("naïve café".encode("cp1252"), None, False, "naïve café"),
        ("naïve café".encode(), None, False, "naïve café"),
        ("Grüße".encode("utf-16"), None, False, "Grüße"),
        ("Приве́т мир".encode("koi8-r", errors="ignore"), "koi8-r", False, "Привет мир"),
        (b'<meta charset="latin-1">caf\xe9', None, True, '<meta charset="latin-1">café'),
        ("日本語のテキスト".encode("shift_jis"), "shift_jis", False, "日本語のテキスト"),
    ],
)
def test_decoding_order(raw: bytes, declared: str | None, html: bool, expected: str) -> None:
    assert decode_body(raw, declared, html) == expected


def test_wrong_declared_charset_falls_back() -> None:
    assert decode_body("café".encode(), "no-such-charset") == "café"


@pytest.mark.parametrize(
    ("charset", "raw"),
    [
        # Python codecs that are no character set: they raise UnicodeError, or read the
        # bytes as something else (escapes, domain names) and return the wrong text
        ("undefined", b"plain words here"),
        ("punycode", b"plain words here"),
        ("idna", b"xn--plain words here"),
        ("unicode_escape", "café au lait".encode()),
        ("rot13", b"plain words here"),
    ],
)
def test_a_declared_charset_that_is_no_text_encoding_falls_back(charset: str, raw: bytes) -> None:
    assert decode_body(raw, charset) == raw.decode("utf-8")


def test_a_meta_charset_that_is_no_text_encoding_falls_back() -> None:
    page = Page(id="p", body=b'<meta charset="undefined"><p>plain words here</p>',
                content_type="text/html")
    assert page_text(page).strip() == "plain words here"


def test_binary_is_rejected_not_crashed() -> None:
    with pytest.raises(PageRejected) as err:
        decode_body(bytes(range(256)) * 40)
    assert err.value.reason == "undecodable"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "é", "\x00", "\x07", "\t", "\n", "\x1b", "\x1f", " ",
                                 "\ud800", "—"]), max_size=60).map("".join))
def test_binary_text_is_told_as_the_regex_counts_its_controls(text: str) -> None:
    controls = len(re.findall("[\x00-\x08\x0e-\x1f]", text))
    if controls > 0.05 * len(text):
        with pytest.raises(PageRejected):
            decode_body(text)
    else:
        assert decode_body(text) == text


def test_html_text_drops_scripts_and_keeps_blocks_apart() -> None:
    html = ("<html><head><style>p{}</style><script>var x=1</script></head><body><nav>menu</nav>"
            "<p>Hello <b>wor</b>ld</p><p>next</p></body></html>")
    text = html_to_text(html)
    assert tokenize(text).tokens == ["hello", "world", "next"]


def test_broken_html_does_not_crash() -> None:
    text = page_text(Page(id="x", body=b"<p>unclosed <b>bold <div>text</p></i>&amp",
                          content_type="text/html"))
    assert tokenize(text).tokens == ["unclosed", "bold", "text"]


def test_page_limits_and_types() -> None:
    with pytest.raises(PageRejected) as err:
        page_text(Page(id="x", body=b"a" * 2000), max_bytes=1000)
    assert err.value.reason == "too_large"
    with pytest.raises(PageRejected) as err:
        page_text(Page(id="x", body=b"%PDF", content_type="application/pdf"))
    assert err.value.reason == "unsupported_type"
    with pytest.raises(PageRejected) as err:
        tokenize("a b c d", max_tokens=3)
    assert err.value.reason == "too_many_tokens"


def _tokenize_twin(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The obvious tokenizer: one regex match at a time (the implementation before numpy)."""
    scanned = text.lower()
    if len(scanned) != len(text):
        scanned = text
    toks, spans = [], []
    for m in re.finditer(r"\w+", scanned):
        toks.append(normalize_token(m.group()))
        spans.append(m.span())
    return toks, spans


# (punctuation that lower() keeps, "©—•" and NBSP, with A-Z: text read without its
# lower-cased copy)
_letters = st.sampled_from(list("aZ9_ -.,\n\tÉéßİıǅﬁ²Ⅻ　中文字\u0301\ud800😀ΣσςÅ©—•\xa0QX"))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40), st.lists(_letters, max_size=40).map("".join)))
def test_tokenize_matches_regex_twin(text: str) -> None:
    toks = tokenize(text)
    exp_toks, exp_spans = _tokenize_twin(text)
    assert toks.tokens == exp_toks
    assert list(zip(toks.starts.tolist(), toks.ends.tolist(), strict=True)) == exp_spans


_ascii = st.text(alphabet=st.characters(max_codepoint=127), max_size=60)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_ascii, st.lists(st.sampled_from(["Ab", "z_9", " ", "-", "\n", "É", "x"]),
                                  max_size=30).map("".join),
                 st.lists(_letters, max_size=40).map("".join)),
       st.integers(min_value=0, max_value=2**40))
def test_tokens_hash_as_their_strings(text: str, seed: int) -> None:
    """ASCII text is tokenized without a string per token (its bytes joined, hashed in
    place), other text through the strings: either way the tokens, their offsets, their
    hashes and the content hash are those of the regex twin's token strings."""
    toks = tokenize(text)
    exp_toks, exp_spans = _tokenize_twin(text)
    assert len(toks) == len(exp_toks)
    assert toks.hashes(seed).tolist() == [mmh3.hash64(t, seed & 0xFFFFFFFF, signed=False)[0]
                                          for t in exp_toks]
    assert toks.content_hash(seed) == content_hash(exp_toks, seed)
    assert toks.tokens == exp_toks
    assert list(zip(toks.starts.tolist(), toks.ends.tolist(), strict=True)) == exp_spans


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=6), st.text(min_size=7, max_size=40),
                          st.sampled_from(["a", "the", "é", "", "a\x00b"])),
                max_size=30), st.integers(min_value=0, max_value=2**40))
def test_token_hashes_hash_each_token(tokens: list[str], seed: int) -> None:
    """The murmur3 kernel (every length: 16-byte blocks and tails) against mmh3 itself."""
    seed32 = seed & 0xFFFFFFFF
    expected = [mmh3.hash64(t, seed32, signed=False)[0] for t in tokens]
    assert token_hashes(tokens, seed).tolist() == expected
    assert token_hashes(iter(tokens), seed).tolist() == expected
    assert token_hashes(tokens, seed).dtype == np.uint64
