"""Reading pages from files: JSON Lines (one page per line), WARC (response records),
directories of documents and single documents.

Every item comes with its line or record number, so a bad one can be reported precisely
and skipped without stopping the run. Page ids of documents read from files are their path
as given (``docs/a.txt``; pathlib's spelling: ``./a.txt`` is ``a.txt``), or for files found
in a directory argument their path relative to it; ``check_inputs`` refuses, before anything
is read, inputs that are missing or unreadable and two different files with one id.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from fastwarc.warc import ArchiveIterator, WarcRecordType

from dupalign.page import Page

SUPPORTED_TYPES = ("text/html", "application/xhtml+xml", "text/plain")


@dataclass(frozen=True)
class InputError:
    """An input item that is not a usable page, with why."""

    where: str  # "file.jsonl:12" or "file.warc.gz#record 7"
    reason: str


def is_warc(path: str | Path) -> bool:
    name = str(path).lower()
    return name.endswith((".warc", ".warc.gz", ".arc.gz"))


def is_jsonl(path: str | Path) -> bool:
    return str(path).lower().endswith((".jsonl", ".jsonl.gz", ".ndjson", ".json"))


class InputsUnusable(Exception):
    """The inputs cannot be used as given (missing, unreadable, no pages, ids that clash);
    raised before anything is read or written. The message is one line."""


def iter_input(path: str | Path) -> Iterator[tuple[int, Page | InputError]]:
    """Pages of one input, numbered from 1: by line (JSON Lines), by record (WARC), by file
    (a directory: every .txt/.html/.htm/.xhtml file below it in path order; id = path
    relative to the directory); any other file is one page (id = its path as given; HTML for
    .html/.htm/.xhtml, else plain text)."""
    p = Path(path)
    if p.is_dir():
        for number, f in enumerate(doc_files(p), start=1):
            yield number, _file_page(f, f.relative_to(p).as_posix())
    elif is_warc(p):
        yield from iter_warc(p)
    elif is_jsonl(p):
        yield from iter_jsonl(p)
    else:
        yield 1, _file_page(p, p.as_posix())


DOC_SUFFIXES = (".txt", ".html", ".htm", ".xhtml")


def doc_files(directory: Path) -> list[Path]:
    """The documents a directory input holds, in path order."""
    return sorted(f for f in directory.rglob("*")
                  if f.is_file() and f.suffix.lower() in DOC_SUFFIXES)


def check_inputs(paths: Sequence[str | Path]) -> None:
    """Raise InputsUnusable unless every input exists and opens, every directory holds at
    least one document, and no two different files would get the same page id (they would
    be taken for one page: the second a replay or a new version of the first)."""
    owners: dict[str, Path] = {}
    for arg in paths:
        p = Path(arg)
        if p.is_dir():
            files = doc_files(p)
            if not files:
                raise InputsUnusable(
                    f"{arg}: no {'/'.join(DOC_SUFFIXES)} file in this directory (a directory "
                    "is read for those only; give other files one by one)")
            named = [(f.relative_to(p).as_posix(), f) for f in files]
        else:
            try:
                with open(p, "rb"):
                    pass
            except OSError as exc:
                raise InputsUnusable(f"cannot read input {arg}: {exc.strerror}") from None
            if is_warc(p) or is_jsonl(p):
                _check_format(p, arg)
            named = [] if is_warc(p) or is_jsonl(p) else [(p.as_posix(), p)]
        for doc_id, file in named:
            first = owners.setdefault(doc_id, file)
            if first != file and first.resolve() != file.resolve():
                raise InputsUnusable(
                    f"page id {doc_id!r} names two different files, {first} and {file}: "
                    "give them as paths that differ (ids of files in a directory argument "
                    "are relative to it)")


GZIP_MAGIC = b"\x1f\x8b"


def _check_format(p: Path, arg: str | Path) -> None:
    """Raise InputsUnusable for a file whose name promises gzip or WARC and whose first
    bytes are neither: read as named it would fail at its first byte, after the store was
    opened, as an internal error."""
    with open(p, "rb") as fh:
        head = fh.read(2)
    gz = str(p).lower().endswith(".gz")
    if gz and head and head != GZIP_MAGIC:
        raise InputsUnusable(f"input {arg} is not a gzip file, though its name ends in .gz "
                             "(uncompressed? then name it without .gz)")
    if not is_warc(p):
        return
    try:
        with (gzip.open(p, "rb") if gz else open(p, "rb")) as fh:
            line = fh.readline(64)
            while line and not line.strip():
                line = fh.readline(64)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputsUnusable(f"input {arg} is not a readable gzip file: {exc}") from None
    if line and not line.startswith(b"WARC/"):
        raise InputsUnusable(f"input {arg} is not a WARC file: it starts with {line[:24]!r}, "
                             "not a WARC record header")


def _file_page(path: Path, doc_id: str) -> Page | InputError:
    html = path.suffix.lower() in (".html", ".htm", ".xhtml")
    try:
        body = path.read_bytes()
    except OSError as exc:
        return InputError(str(path), f"cannot read: {exc.strerror}")
    return Page(id=doc_id, url=None, body=body,
                content_type="text/html" if html else "text/plain")


def page_from_mapping(obj: Any) -> Page:
    """A Page from a decoded JSON/msgpack mapping; raises ValueError naming the bad field."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    doc_id = obj.get("id")
    if not isinstance(doc_id, str) or not doc_id:
        raise ValueError("'id' must be a non-empty string")
    if obj.get("deleted") is True:  # a delete of the page ``id``
        return Page(id=doc_id, body="", deleted=True)
    body = obj.get("body")
    if not isinstance(body, str | bytes):
        raise ValueError("'body' must be a string")
    content_type = obj.get("content_type", "text/plain")
    if not isinstance(content_type, str):
        raise ValueError("'content_type' must be a string")
    for key in ("url", "encoding", "lang"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise ValueError(f"'{key}' must be a string")
    fetched_at = obj.get("fetched_at")
    if fetched_at is not None and (not isinstance(fetched_at, int) or isinstance(fetched_at, bool)):
        raise ValueError("'fetched_at' must be an integer (ms)")
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError("'meta' must be an object")
    return Page(
        id=doc_id,
        body=body,
        content_type=content_type,
        url=obj.get("url"),
        fetched_at=fetched_at,
        encoding=obj.get("encoding"),
        lang=obj.get("lang"),
        meta=meta,
    )


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Page | InputError]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield lineno, page_from_mapping(json.loads(raw))
            except (ValueError, UnicodeDecodeError) as exc:
                yield lineno, InputError(where, str(exc))
            except RecursionError:  # json.loads recurses once per level of nesting
                yield lineno, InputError(where, "JSON nested too deeply to read")


def iter_warc(path: str | Path) -> Iterator[tuple[int, Page | InputError]]:
    """Response records of a WARC file. fastwarc reads WARC 1.0/1.1; older files (such as
    ClueWeb09's WARC/0.18) are read by a small tolerant reader."""
    try:
        yield from _iter_fastwarc(path)
    except OSError as exc:
        if "Invalid WARC header" not in str(exc):
            raise
        yield from _iter_legacy_warc(path)


def _clean_uri(uri: str | None) -> str | None:
    if uri is None:
        return None
    uri = uri.strip()
    return uri[1:-1] if uri.startswith("<") and uri.endswith(">") else uri


def _page_or_error(
    number: int, where: str, uri: str | None, ctype: str | None, body: bytes, date: int | None
) -> Page | InputError:
    if not uri:
        return InputError(where, "response record without WARC-Target-URI")
    mime = (ctype or "").split(";")[0].strip().lower()
    if mime not in SUPPORTED_TYPES:
        return InputError(where, f"content type {ctype!r} is not text")
    charset = None
    for part in (ctype or "").split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip("\"'")
    return Page(id=uri, url=uri, body=body, content_type=mime, encoding=charset, fetched_at=date)


def _iter_fastwarc(path: str | Path) -> Iterator[tuple[int, Page | InputError]]:
    number = 0
    with open(path, "rb") as fh:
        for rec in ArchiveIterator(
            fh, record_types=WarcRecordType.response, parse_http=True, strict_mode=False
        ):
            number += 1
            where = f"{path}#record {number}"
            if rec.http_headers is not None:
                if rec.http_headers.status_code not in (None, 200):
                    yield number, InputError(where, f"HTTP status {rec.http_headers.status_code}")
                    continue
                ctype = rec.http_headers.get("Content-Type")
            else:  # payload is the document itself (e.g. Wayback exports)
                ctype = rec.headers.get("Content-Type")
            uri = _clean_uri(rec.headers.get("WARC-Target-URI"))
            yield number, _page_or_error(number, where, uri, ctype, rec.reader.read(), None)


def _iter_legacy_warc(path: str | Path) -> Iterator[tuple[int, Page | InputError]]:
    number = 0
    fh: IO[bytes] | gzip.GzipFile
    with (gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")) as fh:
        while True:
            headers = _read_warc_headers(fh)
            if headers is None:
                return
            length = int(headers.get("content-length", "0") or 0)
            block = fh.read(length)
            if headers.get("warc-type") != "response":
                continue
            number += 1
            where = f"{path}#record {number}"
            ctype = headers.get("content-type", "")
            if ctype.startswith("application/http"):
                head, _, body = block.partition(b"\r\n\r\n")
                if not _:
                    head, _, body = block.partition(b"\n\n")
                http = _parse_header_lines(head.split(b"\n")[1:])
                ctype = http.get("content-type", "")
            else:
                body = block
            uri = _clean_uri(headers.get("warc-target-uri"))
            yield number, _page_or_error(number, where, uri, ctype, body, None)


def _read_warc_headers(fh: IO[bytes] | gzip.GzipFile) -> dict[str, str] | None:
    line = fh.readline()
    while line and not line.strip():
        line = fh.readline()
    if not line:
        return None
    if not line.startswith(b"WARC/"):
        raise OSError(f"not a WARC record header: {line[:40]!r}")
    lines = []
    while True:
        line = fh.readline()
        if not line or not line.strip():
            break
        lines.append(line)
    return _parse_header_lines(lines)


def _parse_header_lines(lines: list[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in lines:
        name, sep, value = raw.decode("latin-1").partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out
