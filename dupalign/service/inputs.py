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

from fastwarc.warc import ArchiveIterator, WarcRecord, WarcRecordType

from dupalign.page import Page

SUPPORTED_TYPES = ("text/html", "application/xhtml+xml", "text/plain")


@dataclass(frozen=True)
class InputError:
    """An input item that is not a usable page, with why."""

    where: str  # "file.jsonl:12" or "file.warc.gz#record 7 (byte 35216)"
    reason: str
    # set for input that is lost, not merely unusable (a WARC record cut or corrupt):
    # a machine code (``truncated_warc``, ``corrupt_warc``) and what could be read of it
    code: str | None = None
    doc_id: str | None = None
    raw: bytes = b""
    offset: int | None = None  # the record's byte offset in the file


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
    ClueWeb09's WARC/0.18) are read by a small tolerant reader.

    A record the file holds only part of (cut in its header or content, shorter than its
    Content-Length, or failing its sha1 WARC-Block-Digest) is an InputError with code
    ``truncated_warc`` naming its byte offset, never a page: a half-written or half-copied
    crawl file must not store its last page half. Data that cannot be read at all (a gzip
    member cut and followed by others) is an InputError with code ``corrupt_warc``; the
    records after it are still read where a record start can be found again."""
    try:
        yield from _iter_fastwarc(path)
    except _OlderWarc:
        yield from _iter_legacy_warc(path)


class _OlderWarc(Exception):
    """fastwarc cannot read the file's first record header (a WARC version before 1.0)."""


def _cut(where: str, got: int, declared: int, doc_id: str | None, raw: bytes,
         offset: int) -> InputError:
    return InputError(
        where, f"truncated WARC record: the file holds {got} of its {declared} bytes "
        "(Content-Length); not stored", code="truncated_warc", doc_id=doc_id, raw=raw,
        offset=offset)


def _iter_fastwarc(path: str | Path) -> Iterator[tuple[int, Page | InputError]]:
    number = 0
    start = 0  # where the current ArchiveIterator started reading (0, or a resumed record)
    last: tuple[int, int] | None = None  # the last record read: offset, Content-Length
    last_cut = False
    whole = False  # a record with a header fastwarc could read was seen
    with open(path, "rb") as fh:
        while True:
            fh.seek(start)
            try:
                for rec in ArchiveIterator(fh, parse_http=False, strict_mode=False):
                    pos = start + rec.stream_pos
                    last_cut = False
                    last = (pos, int(rec.headers.get("Content-Length") or 0))
                    is_response = rec.record_type == WarcRecordType.response
                    if is_response:
                        number += 1
                        where = f"{path}#record {number} (byte {pos})"
                    else:
                        where = f"{path}#{_record_type(rec)} record at byte {pos}"
                    if start == 0 and not whole and rec.headers.get("Content-Length") is None:
                        raise _OlderWarc  # fastwarc read no header line of the first record
                    whole = True
                    uri = _clean_uri(rec.headers.get("WARC-Target-URI"))
                    item = _fastwarc_record(rec, where, uri, is_response, pos)
                    if isinstance(item, InputError) and item.code is not None:
                        last_cut = True
                        yield number, item
                    elif is_response and item is not None:
                        yield number, item
            except OSError as exc:
                if start == 0 and not whole and "Invalid WARC header" in str(exc):
                    raise _OlderWarc from None
                after = max(start, last[0] if last else 0) + 1
                gz = str(path).lower().endswith(".gz")
                resume = _next_record_start(fh, after, gz)
                if last is not None or start == 0:  # else: a false start of the same stretch
                    yield number, InputError(
                        f"{path} after byte {after - 1}",
                        f"corrupt or cut WARC data ({exc}): not stored; the records after "
                        "it that can be found are read", code="corrupt_warc",
                        offset=after - 1)
                if resume is None:
                    return
                start, last = resume, None
                continue
            if last is not None and not last_cut:
                tail = _tail_after(fh, last[0], last[1], gz=str(path).lower().endswith(".gz"))
                if tail is not None:
                    yield number, InputError(
                        f"{path} at byte {tail}",
                        "truncated WARC record: the file ends inside a record's first bytes "
                        "(its header or gzip member); not stored", code="truncated_warc",
                        offset=tail)
            return


def _record_type(rec: WarcRecord) -> str:
    return str(rec.headers.get("WARC-Type") or "unknown")


def _fastwarc_record(
    rec: WarcRecord, where: str, uri: str | None, is_response: bool, pos: int
) -> Page | InputError | None:
    """The page of a response record, an InputError with a code for a record the file
    holds only part of, None for a whole record of another type; checks lengths (and a sha1
    block digest) because fastwarc yields a cut record's bytes as if they were all of it."""
    declared = rec.content_length  # the WARC Content-Length, before anything is read
    if rec.headers.get("Content-Length") is None:  # the file ends inside the header
        return InputError(where, "truncated WARC record: the file ends inside its header; "
                          "not stored", code="truncated_warc", doc_id=uri, offset=pos)
    digest = rec.headers.get("WARC-Block-Digest") or ""
    if digest.lower().startswith("sha1:") and not rec.verify_block_digest():
        if rec.content_length < declared:  # fastwarc has buffered what the file holds
            return _cut(where, rec.content_length, declared, uri, rec.reader.read(), pos)
        return InputError(where, "WARC-Block-Digest does not match the record's content "
                          "(a corrupt record); not stored", code="corrupt_warc", doc_id=uri,
                          raw=rec.reader.read(), offset=pos)
    if not is_response:
        got = len(rec.reader.read())
        return _cut(where, got, declared, uri, b"", pos) if got < declared else None
    rec.parse_http()
    remaining = rec.content_length  # the block after the HTTP header parse_http has read
    body = rec.reader.read()
    if len(body) < remaining:
        return _cut(where, declared - remaining + len(body), declared, uri, body, pos)
    if rec.http_headers is not None:
        if rec.http_headers.status_code not in (None, 200):
            return InputError(where, f"HTTP status {rec.http_headers.status_code}")
        ctype = rec.http_headers.get("Content-Type")
    else:  # payload is the document itself (e.g. Wayback exports)
        ctype = rec.headers.get("Content-Type")
    return _page_or_error(where, uri, ctype, body, None)


_GZIP_MAGIC = b"\x1f\x8b\x08"
_CHUNK = 1 << 20


def _next_record_start(fh: IO[bytes], after: int, gz: bool) -> int | None:
    """The first offset at or after ``after`` where a WARC record (gz: a gzip member holding
    one) starts, or None: where reading resumes after data that cannot be read."""
    marker = _GZIP_MAGIC if gz else b"\nWARC/1."
    base = after - (0 if gz else 1)  # plain: a record starts a line
    while True:
        fh.seek(base)
        data = fh.read(_CHUNK + 64)
        if len(data) < len(marker):
            return None
        at = 0
        while (at := data.find(marker, at)) >= 0:
            start = base + at + (0 if gz else 1)
            if not gz or start >= after:
                if not gz:
                    return start
                fh.seek(start)
                if _starts_warc(fh.read(4096)):
                    return start
            at += 1
        base += _CHUNK


def _starts_warc(data: bytes) -> bool:
    try:
        return zlib.decompressobj(wbits=31).decompress(data, 16).startswith(b"WARC/")
    except zlib.error:
        return False


def _tail_after(fh: IO[bytes], pos: int, length: int, gz: bool) -> int | None:
    """The offset of bytes after the whole last record (at ``pos``, ``length`` bytes of
    content) that are not
    a whole record, or None if the file ends with it: a record cut so early that fastwarc
    saw no header of it (in its gzip member's first bytes) is not yielded at all."""
    fh.seek(pos)
    if gz:
        if fh.read(len(_GZIP_MAGIC)) != _GZIP_MAGIC:
            return None  # not one member per record: where a record ends is not known here
        fh.seek(pos)
        d = zlib.decompressobj(wbits=31)
        try:
            while not d.eof and (chunk := fh.read(_CHUNK)):
                while chunk and not d.eof:  # bounded output: a member may inflate a lot
                    d.decompress(chunk, _CHUNK)
                    chunk = d.unconsumed_tail
        except zlib.error:
            return None
        if not d.eof:
            return None  # the last record's own member is cut: its length check reported it
        end = fh.tell() - len(d.unused_data)  # the last input ended where the file was read
        fh.seek(end)
        return end if fh.read(1) else None
    head = fh.read(1 << 16)
    head_end = head.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    end = pos + head_end + 4 + length
    fh.seek(end)
    rest = fh.read(4096)
    return None if not rest.strip() else end + len(rest) - len(rest.lstrip())


def _clean_uri(uri: str | None) -> str | None:
    if uri is None:
        return None
    uri = uri.strip()
    return uri[1:-1] if uri.startswith("<") and uri.endswith(">") else uri


def _page_or_error(
    where: str, uri: str | None, ctype: str | None, body: bytes, date: int | None
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


def _iter_legacy_warc(path: str | Path) -> Iterator[tuple[int, Page | InputError]]:
    number = 0
    gz = str(path).endswith(".gz")
    at = "uncompressed byte" if gz else "byte"
    fh: IO[bytes] | gzip.GzipFile
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
        while True:
            pos = fh.tell()
            headers: dict[str, str] | None = None
            block, length = b"", -1
            try:
                pos, headers = _read_warc_headers(fh)
                if headers is None:
                    return
                length = int(headers.get("content-length", "0") or 0)
                block = fh.read(length)
            except EOFError:  # the file (or its gzip stream) ends inside the record
                length = -1  # what was read of it is not known
            is_response = headers is not None and headers.get("warc-type") == "response"
            if is_response:
                number += 1
            cut = (headers is None or "content-length" not in headers or length < 0
                   or len(block) < length)
            if cut:
                uri = None if headers is None else _clean_uri(headers.get("warc-target-uri"))
                where = (f"{path}#record {number} ({at} {pos})" if is_response
                         else f"{path} at {at} {pos}")
                yield number, (
                    _cut(where, len(block), length, uri, block, pos) if length >= 0
                    else InputError(where, "truncated WARC record: the file ends inside it "
                                    "(its header or gzip member); not stored",
                                    code="truncated_warc", doc_id=uri, offset=pos))
                return
            if not is_response:
                continue
            assert headers is not None
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
            yield number, _page_or_error(where, uri, ctype, body, None)


def _read_warc_headers(fh: IO[bytes] | gzip.GzipFile) -> tuple[int, dict[str, str] | None]:
    """Where the next record starts and its WARC headers (None at the end of the file);
    raises EOFError if the file ends inside them (a cut record)."""
    start = fh.tell()
    line = fh.readline()
    while line and not line.strip():
        start = fh.tell()
        line = fh.readline()
    if not line:
        return start, None
    if not line.startswith(b"WARC/"):
        raise OSError(f"not a WARC record header: {line[:40]!r}")
    lines = []
    while True:
        line = fh.readline()
        if not line:
            raise EOFError("the file ends inside a WARC header")
        if not line.strip():
            break
        lines.append(line)
    return start, _parse_header_lines(lines)


def _parse_header_lines(lines: list[bytes]) -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in lines:
        name, sep, value = raw.decode("latin-1").partition(":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out
