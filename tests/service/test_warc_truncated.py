"""A WARC file cut mid-record (a half-written or half-copied crawl): every whole record is
read, the cut one is reported with its file and byte offset and never becomes a page, and
records after a corrupt stretch are still read."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest

from dupalign.service.cli import main
from dupalign.service.inputs import InputError, iter_warc
from dupalign.wire import messages
from tests.corpora import DEMO

FULL = DEMO / "web" / "creativecommons.org.warc.gz"  # 46,024 bytes, 4 response records
DATA = FULL.read_bytes()
RAW = gzip.decompress(DATA)
# byte offsets of the gzip members of the four response records (one member a record)
RESPONSES = (856, 12746, 24218, 35216)
ENDS = (12331, 23742, 34743, 46024)  # where their members end (a request record's starts)


def whole_pages() -> dict[str, bytes]:
    return {p.id: p.body for _, p in iter_warc(FULL) if not isinstance(p, InputError)}


def read(path: Path) -> tuple[list[tuple[str, bytes]], list[InputError]]:
    pages, errors = [], []
    for _, item in iter_warc(path):
        if isinstance(item, InputError):
            errors.append(item)
        else:
            pages.append((item.id, item.body))
    return pages, errors


def assert_only_whole_records(pages: list[tuple[str, bytes]]) -> None:
    full = whole_pages()
    for doc_id, body in pages:  # byte-identical to the same record of the whole file
        assert full[doc_id] == body, f"{doc_id}: {len(body)} of {len(full[doc_id])} bytes"


def test_the_whole_demo_file_reads_without_errors() -> None:
    pages, errors = read(FULL)
    assert len(pages) == 4 and errors == []


@pytest.mark.parametrize("cut", [30_000, 30_720, 35_000, 35_300, 35_840, 40_000, 40_960,
                                 24_223, 24_500, 45_990])
def test_a_gzip_warc_cut_mid_record_reports_the_cut_and_keeps_the_records_before(
    tmp_path: Path, cut: int
) -> None:
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(DATA[:cut])
    pages, errors = read(path)
    assert_only_whole_records(pages)
    whole = sum(1 for end in ENDS if end <= cut)
    assert len(pages) == whole
    assert len(errors) == 1, errors
    (error,) = errors
    assert error.code == "truncated_warc" and "truncated WARC record" in error.reason
    assert str(path) in error.where and f"byte {error.offset}" in error.where
    # the offset is that of the record the file ends in: the last record start before the cut
    assert error.offset is not None and error.offset < cut
    assert error.offset in (*RESPONSES, 34743) and not any(error.offset < s < cut
                                                              for s in RESPONSES)


def test_a_gzip_warc_missing_only_its_gzip_trailer_keeps_its_whole_last_record(
    tmp_path: Path
) -> None:
    """The content of the last record is all there (its Content-Length, its digest): only
    the member's CRC and size are cut. Nothing is lost, so the page is read."""
    path = tmp_path / "trailer.warc.gz"
    path.write_bytes(DATA[:-4])
    pages, errors = read(path)
    assert len(pages) == 4 and errors == []
    assert_only_whole_records(pages)


@pytest.mark.parametrize("cut", [100_000, 82_600, 82_507 + 900])
def test_a_plain_warc_cut_mid_record_reports_the_cut(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "cut.warc"
    path.write_bytes(RAW[:cut])
    pages, errors = read(path)
    assert_only_whole_records(pages)
    assert len(pages) == 2
    assert [(e.code, e.offset) for e in errors] == [("truncated_warc", 82507)]
    assert f"{path}#record 3 (byte 82507)" == errors[0].where


def test_later_records_of_a_gzip_warc_with_a_cut_member_in_the_middle_are_read(
    tmp_path: Path
) -> None:
    path = tmp_path / "mid.warc.gz"
    path.write_bytes(DATA[:30_000] + DATA[34743:])  # record 3's member cut, then record 4
    pages, errors = read(path)
    assert_only_whole_records(pages)
    assert [p[0] for p in pages] == [list(whole_pages())[i] for i in (0, 1, 3)]
    assert [e.code for e in errors] == ["corrupt_warc"]
    assert str(path) in errors[0].where and "byte 23742" in errors[0].where


def test_later_records_of_a_plain_warc_with_a_cut_record_in_the_middle_are_read(
    tmp_path: Path
) -> None:
    """Record 3 is cut and record 4 follows: by its Content-Length record 3 swallows the
    head of record 4; its sha1 block digest tells, and reading finds record 4's page."""
    start4 = RAW.index(b"WARC/1.", 82507 + 100)
    path = tmp_path / "mid.warc"
    path.write_bytes(RAW[:100_000] + RAW[start4 - 40_000:])
    pages, errors = read(path)
    assert_only_whole_records(pages)
    ids = list(whole_pages())
    assert [p[0] for p in pages][:2] == ids[:2] and ids[2] not in [p[0] for p in pages[:2]]
    assert ids[3] in [p[0] for p in pages]
    assert errors[0].code == "corrupt_warc" and errors[0].offset == 82507
    assert "WARC-Block-Digest" in errors[0].reason


def legacy_warc(bodies: list[bytes]) -> bytes:
    """A WARC/0.18 file with LF line ends (as ClueWeb09's), which fastwarc does not read."""
    out = [b"WARC/0.18\nWARC-Type: warcinfo\nContent-Length: 3\n\nx=1\n\n"]
    for i, body in enumerate(bodies):
        block = b"HTTP/1.1 200 OK\nContent-Type: text/html\n\n" + body
        out.append(b"WARC/0.18\nWARC-Type: response\nWARC-Target-URI: http://x.org/%d\n"
                   b"Content-Type: application/http;msgtype=response\n"
                   b"Content-Length: %d\n\n" % (i, len(block)) + block + b"\n\n")
    return b"".join(out)


@pytest.mark.parametrize("gz", [False, True])
def test_the_legacy_reader_reports_a_cut_record(tmp_path: Path, gz: bool) -> None:
    bodies = [(b"<p>page %d " % i) + b"word " * 2000 + b"</p>" for i in range(3)]
    blob = legacy_warc(bodies)
    cut = blob.index(b"page 2") + 500
    path = tmp_path / ("old.warc.gz" if gz else "old.warc")
    path.write_bytes(gzip.compress(blob) if gz else blob)
    assert [b for _, b in read(path)[0]] == bodies  # read whole: the legacy reader
    path.write_bytes(gzip.compress(blob[:cut]) if gz else blob[:cut])
    pages, errors = read(path)
    assert [b for _, b in pages] == bodies[:2]
    assert [e.code for e in errors] == ["truncated_warc"]
    assert errors[0].where.startswith(f"{path}#record 3 (")
    assert errors[0].offset == blob.rindex(b"WARC/0.18")
    # a gzip stream cut (EOFError inside the member): the cut record is reported too
    if gz:
        path.write_bytes(gzip.compress(blob)[: len(gzip.compress(blob)) * 9 // 10])
        pages, errors = read(path)
        assert all(b in bodies for _, b in pages) and len(pages) < 3
        assert [e.code for e in errors] == ["truncated_warc"]


def test_scan_reports_the_cut_record_and_stores_only_whole_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(DATA[:40_000])
    store = tmp_path / "store"
    assert main(["scan", str(cut), "--store", str(store), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"skipped {cut}#record 4 (byte 35216): truncated WARC record" in err
    assert "scan: 3 pages (3 new, 0 already in the store)" in err
    assert err.rstrip().endswith("matches, 1 rejected or skipped")
    # the whole file into the same store: record 4 is new (it was not stored half), and the
    # three whole ones are replays of what was stored
    assert main(["scan", str(FULL), "--store", str(store), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "scan: 4 pages (1 new, 3 already in the store)" in err
    assert main(["stats", "--store", str(store), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["pages"] == 4


def test_scan_of_a_file_cut_in_its_first_record_processes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(DATA[:5_000])
    assert main(["scan", str(cut), "--store", str(tmp_path / "s"), "--quiet"]) == 6
    err = capsys.readouterr().err
    assert f"skipped {cut}#record 1 (byte 856): truncated WARC record" in err
    assert "nothing was processed: every page was rejected or skipped" in err


@pytest.mark.kafka
def test_produce_dead_letters_the_cut_record_and_sends_the_whole_ones(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiokafka import AIOKafkaConsumer

    cut = tmp_path / "cut.warc.gz"
    cut.write_bytes(DATA[:40_000])
    suffix = tmp_path.name.replace("_", "-")
    pages_topic, dlq = f"pages-{suffix}", f"dlq-{suffix}"
    config = tmp_path / "c.toml"
    config.write_text(f'[kafka]\nbootstrap_servers = "{kafka_bootstrap}"\n'
                      f'input_topic = "{pages_topic}"\ndlq_topic = "{dlq}"\n')
    assert main(["produce", str(cut), "--config", str(config), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"skipped {cut}#record 4 (byte 35216): truncated WARC record" in err
    assert f"produced 3 pages to {pages_topic}, skipped 1 (1 of them cut or corrupt " \
        f"records, sent to {dlq})" in err

    async def read_all(topic: str, n: int) -> list[bytes]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        out: list[bytes] = []
        try:
            async with asyncio.timeout(60):
                while len(out) < n:
                    for recs in (await consumer.getmany(timeout_ms=1000)).values():
                        out.extend(r.value for r in recs)
            await asyncio.sleep(1)  # nothing more arrives
            for recs in (await consumer.getmany(timeout_ms=1000)).values():
                out.extend(r.value for r in recs)
        finally:
            await consumer.stop()
        return out

    sent = [messages.decode_page(v) for v in asyncio.run(read_all(pages_topic, 3))]
    full = whole_pages()
    assert len(sent) == 3 and all(full[p.id] == p.body for p in sent)
    (letter,) = [messages.decode_dead_letter(v) for v in asyncio.run(read_all(dlq, 1))]
    assert letter["error"] == "truncated_warc"
    assert letter["source"] == {"file": str(cut), "offset": 35216, "record": 4}
    assert letter["doc_id"] == list(full)[3] and "truncated WARC record" in letter["detail"]
    assert 0 < letter["raw_size"] < len(full[list(full)[3]]) + 1000
