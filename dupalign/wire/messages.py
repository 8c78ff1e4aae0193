"""The wire contract: JSON Schemas from ``schemas/`` beside this file, msgpack encoding and
decoding.

Every message is a msgpack map with a version field ``v``. The schemas are compiled once
(fastjsonschema, on first use or by :func:`compile_all` at start-up). Properties marked
``"x-bytes": true`` are strings in JSON but may be msgpack bin on the wire; they are validated
as strings without copying the bytes.

Decoding failures raise :class:`MessageRejected` with a short machine ``reason`` — the same
codes the dead-letter topic carries.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import fastjsonschema
import msgpack

from dupalign.match import Match
from dupalign.page import Page
from dupalign.wire.versions import SERVICE_MESSAGE

SCHEMA_NAMES = ("page", "match", "dead_letter", "page_sketch", "align_request")
VERSION = SERVICE_MESSAGE.writes
# A dead letter carries the record's key (in its value, and as its own key) and the page
# id at most this long: a page id is at most 8,192 characters (dupalign/wire/schemas/page.json),
# and a
# record whose key alone was near the broker's limit made a dead letter over it, refused
# at every restart (the worker could never get past that record)
KEY_MAX_BYTES = 8192
ID_MAX_CHARS = 8192  # a page id's maxLength in dupalign/wire/schemas/page.json
DETAIL_MAX_CHARS = 4096
# Room a dead letter needs besides ``raw``: detail, key twice, page id (up to 4 UTF-8
# bytes a character), fields (worker.dlq_raw_max_bytes must leave it: dupalign.service.config)
DEAD_LETTER_OVERHEAD = 4 * DETAIL_MAX_CHARS + 2 * KEY_MAX_BYTES + 4 * ID_MAX_CHARS + 4096


class MessageRejected(Exception):
    """A message that cannot be used; ``reason`` is the dead-letter ``error`` code."""

    def __init__(self, reason: str, detail: str, doc_id: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.doc_id = doc_id


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    if name not in SCHEMA_NAMES:
        raise KeyError(f"unknown schema {name!r}; known: {', '.join(SCHEMA_NAMES)}")
    text = resources.files("dupalign.wire").joinpath("schemas", f"{name}.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@functools.cache
def bytes_fields(name: str) -> frozenset[str]:
    """Top-level properties that may be bytes on the wire (``x-bytes`` in the schema)."""
    props = load_schema(name).get("properties", {})
    return frozenset(k for k, v in props.items() if v.get("x-bytes"))


@functools.cache
def _validator(name: str) -> Callable[[Any], Any]:
    validator: Callable[[Any], Any] = fastjsonschema.compile(load_schema(name))
    return validator


def compile_all() -> None:
    """Compile every schema now, so that a broken schema stops start-up, not the first page."""
    for name in SCHEMA_NAMES:
        _validator(name)


def validate(name: str, obj: Any) -> None:
    """Validate a decoded message (JSON or msgpack view); raises MessageRejected('schema')."""
    if isinstance(obj, dict):
        binary = [k for k in bytes_fields(name) if isinstance(obj.get(k), bytes)]
        if binary:
            # Validate bytes as strings without decoding them: a shallow copy with stand-ins.
            obj = dict(obj)
            for k in binary:
                obj[k] = ""
    try:
        _validator(name)(obj)
    except fastjsonschema.JsonSchemaValueException as exc:
        raise MessageRejected("schema", exc.message) from None


def _unpack(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except UnicodeDecodeError as exc:
        raise MessageRejected("undecodable", f"msgpack str is not valid UTF-8: {exc}") from None
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise MessageRejected("not_msgpack", f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # msgpack raises a few others (e.g. TypeError on bad ext)
        raise MessageRejected("not_msgpack", f"{type(exc).__name__}: {exc}") from None


def _check_version(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise MessageRejected("schema", f"data must be a map, got {type(obj).__name__}")
    v = obj.get("v")
    if v != VERSION:
        doc_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        raise MessageRejected("unsupported_version", f"v={v!r}, supported: {VERSION}", doc_id)


def pack(obj: dict[str, Any]) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


# --- page -------------------------------------------------------------------------------


def page_to_wire(page: Page) -> dict[str, Any]:
    out: dict[str, Any] = {"v": VERSION, "id": page.id, "content_type": page.content_type}
    for key in ("url", "fetched_at", "encoding", "lang", "meta"):
        value = getattr(page, key)
        if value is not None:
            out[key] = value
    if page.deleted:
        out["deleted"] = True
    else:
        out["body"] = page.body
    return out


def encode_page(page: Page) -> bytes:
    return pack(page_to_wire(page))


def page_from_wire(obj: dict[str, Any]) -> Page:
    return Page(
        id=obj["id"],
        body=obj.get("body", ""),
        deleted=bool(obj.get("deleted", False)),
        content_type=obj.get("content_type", "text/plain"),
        url=obj.get("url"),
        fetched_at=obj.get("fetched_at"),
        encoding=obj.get("encoding"),
        lang=obj.get("lang"),
        meta=obj.get("meta"),
    )


def decode_record(key: bytes | None, value: bytes | None) -> Page:
    """A Page from a ``pages`` record: its value, or for a tombstone (null value, Kafka's
    delete convention) a delete of the page whose id is the key; raises MessageRejected."""
    if value is not None:
        return decode_page(value)
    if not key:
        raise MessageRejected("schema", "a tombstone (null value) needs the page id as key")
    try:
        doc_id = key.decode("utf-8")
    except UnicodeDecodeError:
        raise MessageRejected("undecodable", "tombstone key is not valid UTF-8") from None
    return Page(id=doc_id, body="", deleted=True)


def decode_page(raw: bytes) -> Page:
    """A Page from a ``pages`` message value; raises MessageRejected."""
    obj = _unpack(raw)
    _check_version(obj)
    try:
        validate("page", obj)
    except MessageRejected as exc:
        exc.doc_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        raise
    return page_from_wire(obj)


# --- match ------------------------------------------------------------------------------


def match_to_wire(match: Match, detected_at_ms: int) -> dict[str, Any]:
    out = match.to_dict(detected_at_ms)
    out["v"] = VERSION
    return out


def encode_match(match: Match, detected_at_ms: int) -> bytes:
    return pack(match_to_wire(match, detected_at_ms))


def decode_match(raw: bytes) -> dict[str, Any]:
    obj = _unpack(raw)
    _check_version(obj)
    validate("match", obj)
    out: dict[str, Any] = obj
    return out


# --- dead letter ------------------------------------------------------------------------


def dead_letter_to_wire(
    *,
    error: str,
    detail: str,
    topic: str,
    partition: int,
    offset: int,
    raw: bytes,
    key: bytes | None,
    failed_at_ms: int,
    doc_id: str | None = None,
    raw_max_bytes: int | None = None,
) -> dict[str, Any]:
    truncated = raw_max_bytes is not None and len(raw) > raw_max_bytes
    out = {
        "v": VERSION,
        "error": error,
        "detail": detail[:DETAIL_MAX_CHARS],
        "source": {"topic": topic, "partition": partition, "offset": offset},
        "raw": raw[:raw_max_bytes] if truncated else raw,
        "raw_size": len(raw),
        "raw_truncated": truncated,
        "key": dead_letter_key(key),
        "doc_id": None if doc_id is None else doc_id[:ID_MAX_CHARS],
        "failed_at": failed_at_ms,
    }
    if key is not None and len(key) > KEY_MAX_BYTES:
        out["key_size"], out["key_truncated"] = len(key), True
    return out


def dead_letter_key(key: bytes | None) -> bytes | None:
    """The Kafka key of a record's dead letter (and its ``key`` field): the record's key,
    its first ``KEY_MAX_BYTES`` if longer."""
    return None if key is None else key[:KEY_MAX_BYTES]


def decode_dead_letter(raw: bytes) -> dict[str, Any]:
    obj = _unpack(raw)
    _check_version(obj)
    validate("dead_letter", obj)
    out: dict[str, Any] = obj
    return out
