"""The wire contract: schemas compile, examples validate, bad messages get the right reason."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from dupalign.match import Match, Span
from dupalign.page import Page
from dupalign.wire import messages
from dupalign.wire.messages import MessageRejected

EXAMPLES = sorted((Path(messages.__file__).parent / "schemas" / "examples").glob("*.json"))


def test_every_schema_has_an_example() -> None:
    kinds = {p.name.split(".")[0] for p in EXAMPLES}
    assert kinds == set(messages.SCHEMA_NAMES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_as_json_and_as_msgpack(path: Path) -> None:
    kind = path.name.split(".")[0]
    obj = json.loads(path.read_text("utf-8"))
    messages.validate(kind, obj)
    # On the wire the x-bytes fields are msgpack bin; they must validate the same way.
    wire = dict(obj)
    for key in messages.bytes_fields(kind):
        if isinstance(wire.get(key), str):
            wire[key] = wire[key].encode("utf-8")
    decoded = msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False)
    messages.validate(kind, decoded)


def test_bytes_fields_come_from_the_schemas() -> None:
    assert messages.bytes_fields("page") == {"body"}
    assert messages.bytes_fields("dead_letter") == {"raw", "key"}
    assert messages.bytes_fields("match") == frozenset()


def test_page_roundtrip_bytes_and_str() -> None:
    for body in (b"caf\xc3\xa9 bytes", "café text"):
        page = Page(
            id="p1", body=body, content_type="text/html", url="https://x/", fetched_at=5,
            encoding="utf-8", lang="en", meta={"a": [1, 2]},
        )
        back = messages.decode_page(messages.encode_page(page))
        assert back == page
        assert back.meta == {"a": [1, 2]}
        assert type(back.body) is type(body)


def test_page_without_optional_fields() -> None:
    raw = msgpack.packb({"v": 1, "id": "x", "body": b"hi"}, use_bin_type=True)
    page = messages.decode_page(raw)
    assert page == Page(id="x", body=b"hi")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xc1not msgpack", "not_msgpack"),
        (b"", "not_msgpack"),
        (msgpack.packb({"v": 1, "id": "x"}) + b"\x00", "not_msgpack"),  # trailing data
        (b"\x81\xa1v\x01" + b"\x00", "not_msgpack"),
        (b"\x82\xa1v\x01\xa2id\xa3\xff\xfe\xfd", "undecodable"),  # str with invalid UTF-8
        (msgpack.packb([1, 2, 3]), "schema"),
        (msgpack.packb({"id": "x", "body": "b"}), "unsupported_version"),
        (msgpack.packb({"v": 2, "id": "x", "body": "b"}), "unsupported_version"),
        (msgpack.packb({"v": 1, "id": "x"}), "schema"),  # body missing
        (msgpack.packb({"v": 1, "id": "", "body": "b"}), "schema"),
        (msgpack.packb({"v": 1, "id": "x", "body": 7}), "schema"),
        (msgpack.packb({"v": 1, "id": "x", "body": "b", "content_type": "image/png"}), "schema"),
        (msgpack.packb({"v": 1, "id": "x", "body": "b", "fetched_at": -1}), "schema"),
        (msgpack.packb({"v": 1, "id": "x", "body": "b", "surprise": 1}), "schema"),
        (msgpack.packb({"v": 1, "id": "x", "body": "b", "meta": [1]}), "schema"),
    ],
)
def test_bad_pages_are_rejected_with_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(MessageRejected) as info:
        messages.decode_page(raw)
    assert info.value.reason == reason
    assert info.value.detail


def test_schema_detail_names_the_field() -> None:
    with pytest.raises(MessageRejected) as info:
        messages.decode_page(msgpack.packb({"v": 1, "id": "x", "body": "b", "fetched_at": "now"}))
    assert "fetched_at" in info.value.detail
    assert info.value.doc_id == "x"


def test_match_messages_validate() -> None:
    span = Span(tokens=(0, 40), chars=(0, 200), match_tokens=(3, 43), match_chars=(9, 230),
                est_jaccard=0.9, jaccard=0.85, containment=0.9, match_containment=0.95)
    old = Span(tokens=(0, 40), chars=(0, 200), match_tokens=(3, 43), match_chars=(9, 230),
               est_jaccard=0.9)  # against a page indexed before word hashes were kept
    for m in (
        Match("a", "exact", "b", engine={"seed": 1}),
        Match("a", "near", "b", hamming=2, est_jaccard=0.85),
        Match("a", "passage", "b", est_jaccard=0.9, jaccard=0.85, spans=(span, old)),
    ):
        wire = messages.decode_match(messages.encode_match(m, 1234))
        assert wire["v"] == 1 and wire["detected_at"] == 1234
        assert Match.from_dict(wire) == m


_SPAN = {"tokens": [0, 1], "chars": [0, 1], "match_tokens": [0, 1], "match_chars": [0, 1],
         "est_jaccard": 0.5}


def test_match_schema_rejects_inconsistent_kinds() -> None:
    bad = [
        {"kind": "near"},  # no hamming
        {"kind": "passage"},  # no spans
        {"kind": "passage", "spans": []},
        {"kind": "near", "hamming": 65},
        {"kind": "exact", "est_jaccard": 1.5},
        {"kind": "passage", "jaccard": 1.5, "spans": [_SPAN]},
        {"kind": "passage", "spans": [{**_SPAN, "containment": -0.1}]},
        {"kind": "sort of"},
    ]
    for extra in bad:
        obj = {"v": 1, "doc_id": "a", "match_doc_id": "b", "detected_at": 1, "engine": {}}
        obj.update(extra)
        with pytest.raises(MessageRejected):
            messages.validate("match", obj)


def test_dead_letter_truncates_raw_and_keeps_size() -> None:
    raw = bytes(range(256)) * 10
    obj = messages.dead_letter_to_wire(
        error="too_large", detail="2560 bytes > 100", topic="pages", partition=0, offset=9,
        raw=raw, key=b"k", failed_at_ms=1, raw_max_bytes=100,
    )
    back = messages.decode_dead_letter(messages.pack(obj))
    assert back["raw"] == raw[:100] and back["raw_truncated"] is True
    assert back["raw_size"] == 2560 and back["key"] == b"k"
    assert back["source"] == {"topic": "pages", "partition": 0, "offset": 9}


def test_a_dead_letter_of_a_record_with_a_huge_key_fits_in_a_request() -> None:
    """A key near the broker's limit, twice in a dead letter (its value and its key), made
    it too large to send: the worker stopped at that record at every restart."""
    key, raw = b"k" * 900_000, b"\xc1" * 100_000
    obj = messages.dead_letter_to_wire(
        error="not_msgpack", detail="x" * 10_000, topic="pages", partition=0, offset=3,
        raw=raw, key=key, failed_at_ms=1, doc_id="\u00e9" * 100_000, raw_max_bytes=50_000)
    size = len(messages.pack(obj)) + len(messages.dead_letter_key(key) or b"")
    assert size <= 50_000 + messages.DEAD_LETTER_OVERHEAD
    back = messages.decode_dead_letter(messages.pack(obj))
    assert back["key"] == key[:messages.KEY_MAX_BYTES] == messages.dead_letter_key(key)
    assert back["key_size"] == len(key) and back["key_truncated"] is True
    small = messages.dead_letter_to_wire(
        error="schema", detail="d", topic="pages", partition=0, offset=0, raw=b"x", key=b"id",
        failed_at_ms=1)
    assert small["key"] == b"id" and "key_truncated" not in small


def test_dead_letter_requires_source() -> None:
    obj = messages.dead_letter_to_wire(
        error="schema", detail="d", topic="pages", partition=0, offset=0, raw=b"x", key=None,
        failed_at_ms=1,
    )
    del obj["source"]
    with pytest.raises(MessageRejected):
        messages.validate("dead_letter", obj)
