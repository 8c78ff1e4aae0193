"""What a user sees when something is wrong: the installed ``dupalign`` console script, run
as a subprocess, says what in one line and exits with the documented code (README, "Exit
codes"), never with a traceback; and no run loses or merges pages silently."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pytest

from dupalign.config import STORE_FORMAT
from dupalign.page import Page
from dupalign.service.exits import Exit
from dupalign.store.database import Store
from tests.corpora import DEMO

DUPALIGN = Path(sys.executable).with_name("dupalign")
RFC2821 = DEMO / "rfc" / "rfc2821.txt"


def dupalign(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DUPALIGN), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Case:
    name: str
    setup: Callable[[Path], list[str]]  # prepares tmp files, returns the command's arguments
    code: Exit
    message: str


def _jsonl(tmp: Path, *pages: dict[str, str]) -> Path:
    path = tmp / "in.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pages))
    return path


def _missing_input(tmp: Path) -> list[str]:
    return ["scan", "nothere.txt", "--store", "s"]


def _unreadable_input(tmp: Path) -> list[str]:
    (tmp / "plain.txt").write_text("a file, not a directory")
    return ["scan", "plain.txt/page.txt", "--store", "s"]  # ENOTDIR, even for root


def _directory_without_documents(tmp: Path) -> list[str]:
    (tmp / "docs").mkdir()
    (tmp / "docs" / "README").write_text("no suffix: not read from a directory")
    return ["scan", "docs", "--store", "s"]


def _clashing_ids(tmp: Path) -> list[str]:
    for name, text in (("a", "first text of the page"), ("b", "another text entirely")):
        (tmp / name).mkdir()
        (tmp / name / "index.txt").write_text(text)
    return ["scan", "a", "b", "--store", "s"]  # both name their page "index.txt"


def _warc_gz_not_gzip(tmp: Path) -> list[str]:
    (tmp / "crawl.warc.gz").write_text("WARC/1.0\r\nWARC-Type: response\r\n\r\n")
    return ["scan", "crawl.warc.gz", "--store", "s"]


def _jsonl_gz_not_gzip(tmp: Path) -> list[str]:
    _jsonl(tmp, {"id": "a", "body": "some words"}).rename(tmp / "in.jsonl.gz")
    return ["scan", "in.jsonl.gz", "--store", "s"]


def _warc_not_a_warc(tmp: Path) -> list[str]:
    with gzip.open(tmp / "crawl.warc.gz", "wt") as fh:
        fh.write("<html>a page saved under a WARC's name</html>\n")
    return ["scan", "crawl.warc.gz", "--store", "s"]


def _store_is_a_file(tmp: Path) -> list[str]:
    (tmp / "store").write_text("not a store")
    return ["scan", str(RFC2821), "--store", "store"]


def _store_not_writable(tmp: Path) -> list[str]:
    (tmp / "plain").write_text("x")
    return ["scan", str(RFC2821), "--store", "plain/store"]


def _store_other_params(tmp: Path) -> list[str]:
    Store(tmp / "s", {"format": STORE_FORMAT, "seed": 1}).close()
    return ["scan", str(RFC2821), "--store", "s"]


def _store_of_index_shards(tmp: Path) -> list[str]:
    """A store an older dupalign built for 2 index shards (``scan --shards 2``)."""
    import msgpack

    from dupalign.runtime.engine import Engine
    from dupalign.store import tables

    with Engine.open(tmp / "s") as engine:
        tables.shard_count.put(engine.store, msgpack.packb(2))
    return ["scan", str(RFC2821), "--store", "s"]


def _scan_shards(tmp: Path) -> list[str]:
    return ["scan", str(RFC2821), "--store", "s", "--shards", "2"]


def worker_store_ahead_of_its_commit(path: Path) -> None:
    """A Kafka worker's store after a crash: pages stored at offsets 0-2 of pages:0 (p1 a
    near duplicate of p0, p2 an exact copy of p1), the batch of offset 0 committed and
    noted as published, offsets 1-2 not."""
    from dupalign.runtime.engine import Engine

    with Engine.open(path) as engine:
        for offset, page in enumerate(_ahead_pages()):
            engine.process(page, ("pages", 0, offset))
        engine.set_checkpoint("pages", 0, 1)


def _ahead_pages() -> list[Page]:
    text = " ".join(RFC2821.read_text().split()[:1500])
    return [Page("p0", text), Page("p1", text + " a few words more"),
            Page("p2", text + " a few words more")]


def _compact_ahead_of_commit(tmp: Path) -> list[str]:
    worker_store_ahead_of_its_commit(tmp / "s")
    return ["compact", "--store", "s", "--max-pages", "1"]


def _delete_ahead_of_commit(tmp: Path) -> list[str]:
    worker_store_ahead_of_its_commit(tmp / "s")
    return ["delete", "p1", "--store", "s"]


def _store_other_version(tmp: Path) -> list[str]:
    Store(tmp / "s", {"format": 1}).close()  # a format no longer read
    return ["scan", str(RFC2821), "--store", "s"]


def _stats_other_version(tmp: Path) -> list[str]:
    Store(tmp / "s", {"format": 1}).close()
    return ["stats", "--store", "s"]


def _query_missing_store(tmp: Path) -> list[str]:
    return ["query", "some text", "--store", "nostore"]


def _stats_missing_store(tmp: Path) -> list[str]:
    return ["stats", "--store", "nostore"]


def _every_page_rejected(tmp: Path) -> list[str]:
    src = _jsonl(tmp, {"id": "a", "body": "\u0000\u0001" * 300}, {"id": "b", "body": "!!! ..."})
    return ["scan", src.name, "--store", "s"]


def _invalid_config(tmp: Path) -> list[str]:
    (tmp / "bad.toml").write_text("[engine.near]\nhamming = 99\n")
    return ["scan", str(RFC2821), "--store", "s", "--config", "bad.toml"]


def _out_in_missing_directory(tmp: Path) -> list[str]:
    return ["scan", str(RFC2821), "--store", "s", "--out", "no/such/dir/m.jsonl"]


def _produce_unreachable(tmp: Path) -> list[str]:
    return ["produce", str(RFC2821), "--bootstrap", f"127.0.0.1:{closed_port()}"]


def _worker_unreachable(tmp: Path) -> list[str]:
    return ["worker", "--store", "s", "--bootstrap", f"127.0.0.1:{closed_port()}"]


def _stage_unreachable(tmp: Path) -> list[str]:
    return ["stage", "all", "--store", "s", "--bootstrap", f"127.0.0.1:{closed_port()}"]


def _stage_without_store(tmp: Path) -> list[str]:
    return ["stage", "sketch", "near", "--bootstrap", f"127.0.0.1:{closed_port()}"]


def _stage_unknown_role(tmp: Path) -> list[str]:
    return ["stage", "sketch,index", "--store", "s"]


def _worker_roles(tmp: Path) -> list[str]:
    return ["worker", "--roles", "index", "--store", "s"]


def _acls_topology_role(tmp: Path) -> list[str]:
    return ["acls", "--role", "index", "--principal", "User:index"]


def _topology_config(tmp: Path) -> list[str]:
    (tmp / "old.toml").write_text("[kafka]\nindex_shards = 2\n")
    return ["worker", "--store", "s", "--config", "old.toml"]


def _stage_bad_shape(tmp: Path) -> list[str]:
    return ["stage", "all", "--store", "s", "--shape", "2,2,3,2,2"]


CASES = [
    Case("missing input", _missing_input, Exit.INPUT,
         "cannot read input nothere.txt: No such file or directory"),
    Case("unreadable input", _unreadable_input, Exit.INPUT,
         "cannot read input plain.txt/page.txt: Not a directory"),
    Case("directory without documents", _directory_without_documents, Exit.INPUT,
         "docs: no .txt/.html/.htm/.xhtml file in this directory"),
    Case("two files, one id", _clashing_ids, Exit.INPUT,
         "page id 'index.txt' names two different files, a/index.txt and b/index.txt"),
    Case(".warc.gz that is not gzip", _warc_gz_not_gzip, Exit.INPUT,
         "input crawl.warc.gz is not a gzip file, though its name ends in .gz"),
    Case(".jsonl.gz that is not gzip", _jsonl_gz_not_gzip, Exit.INPUT,
         "input in.jsonl.gz is not a gzip file, though its name ends in .gz"),
    Case(".warc.gz that is not a WARC", _warc_not_a_warc, Exit.INPUT,
         "input crawl.warc.gz is not a WARC file: it starts with b'<html>a page saved"),
    Case("store is a file", _store_is_a_file, Exit.STORE,
         "store path store is a file, not a directory"),
    Case("store not writable", _store_not_writable, Exit.STORE,
         "cannot create the store directory plain/store: Not a directory"),
    Case("store with other parameters", _store_other_params, Exit.STORE,
         "seed: store has 1, asked for 24301"),
    Case("store of index shards", _store_of_index_shards, Exit.STORE,
         "rebuild it by replay into a new store, `dupalign scan --store NEW_STORE INPUT...`"),
    Case("scan --shards", _scan_shards, Exit.USAGE,
         "--shards: index shards were removed after commit 4e63f5c: scan keeps one index"),
    Case("compact on a store ahead of its Kafka commit", _compact_ahead_of_commit,
         Exit.UNCOMMITTED, "store s holds pages of pages:0 at offsets 1 to 2 that a Kafka "
         "worker stored but has not recorded as committed"),
    Case("delete on a store ahead of its Kafka commit", _delete_ahead_of_commit,
         Exit.UNCOMMITTED, "run the worker until it has caught up, then retry (--force "
         "removes pages anyway"),
    Case("store of another version", _store_other_version, Exit.STORE,
         "store s has format 1, which this version of dupalign does not read (it reads "
         f"format {STORE_FORMAT} and the ones it upgrades): rebuild it by processing the "
         "pages again"),
    Case("stats on a store of another version", _stats_other_version, Exit.STORE,
         "store s has format 1, which this version of dupalign does not read"),
    Case("query without a store", _query_missing_store, Exit.STORE, "no store at nostore"),
    Case("stats without a store", _stats_missing_store, Exit.STORE, "no store at nostore"),
    Case("every page rejected", _every_page_rejected, Exit.NOTHING_DONE,
         "nothing was processed: every page was rejected or skipped"),
    Case("invalid config", _invalid_config, Exit.USAGE, "near.hamming"),
    Case("--out in a missing directory", _out_in_missing_directory, Exit.USAGE,
         "directory no/such/dir does not exist"),
    Case("produce, broker unreachable", _produce_unreachable, Exit.KAFKA,
         "cannot reach the Kafka broker (127.0.0.1:"),
    Case("worker, broker unreachable", _worker_unreachable, Exit.KAFKA,
         "is the broker running and is the address right? (--bootstrap HOST:PORT"),
    Case("stage, broker unreachable", _stage_unreachable, Exit.KAFKA,
         "is the broker running and is the address right? (--bootstrap HOST:PORT"),
    Case("stage without --store", _stage_without_store, Exit.USAGE,
         "dupalign stage: --store is required (every role but sketch keeps its stores there)"),
    Case("stage, unknown role", _stage_unknown_role, Exit.USAGE,
         "unknown roles ['index']: choose among sketch, directory, exact, learner, router, "
         "near, lists, combine, align, or all"),
    # the index topology was removed: what named it says so, and where to go
    Case("worker --roles", _worker_roles, Exit.USAGE,
         "--roles: the index topology (`dupalign worker --roles`, index shards, their topics "
         "and ACLs) was removed after commit 4e63f5c: run `dupalign worker` for one process, "
         "or `dupalign stage ROLE...|all` to grow to many"),
    Case("acls --role of the topology", _acls_topology_role, Exit.USAGE,
         "--role index: the index topology (`dupalign worker --roles`, index shards"),
    Case("config key of the topology", _topology_config, Exit.USAGE,
         "config key 'kafka.index_shards': the index topology"),
    Case("stage, a near count not a power of 2", _stage_bad_shape, Exit.USAGE,
         "invalid configuration: config key 'kafka.shape': '2,2,3,2,2': the near stage's count "
         "(3) must be a power of 2"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_error_is_one_line_and_an_exit_code(case: Case, tmp_path: Path) -> None:
    run = dupalign(*case.setup(tmp_path), cwd=tmp_path)
    assert run.returncode == case.code, run.stderr
    assert "Traceback" not in run.stderr and "Error:" not in run.stderr.split(": ", 1)[0]
    errors = [line for line in run.stderr.splitlines() if line.startswith("dupalign ")]
    assert len(errors) == 1, run.stderr
    assert case.message in errors[0], errors[0]
    # the few lines besides it are the per-page reasons and the run's summary, nothing else
    assert all(line.startswith(("dupalign ", "skipped ", "rejected ", "scan: "))
               for line in run.stderr.splitlines()), run.stderr
    if case.code in (Exit.INPUT, Exit.USAGE) and case.setup is not _invalid_config:
        assert not (tmp_path / "s").exists(), "nothing may be created before the checks pass"


@contextmanager
def store_held_open(path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process with the store at ``path`` open for writing (it holds the lock)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom dupalign.store.database import Store\n"
         f"s = Store({str(path)!r}, {{'format': 6}})\nprint('open', flush=True)\n"
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        yield holder
    finally:
        holder.communicate("", timeout=30)


def test_a_locked_store_names_the_process_that_holds_it(tmp_path: Path) -> None:
    with store_held_open(tmp_path / "s") as holder:
        run = dupalign("scan", RFC2821, "--store", "s", cwd=tmp_path)
    assert run.returncode == Exit.STORE and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"dupalign scan: store s is locked by pid {holder.pid} ("), line
    assert line.endswith("one process at a time can write a store (stop it, or use another "
                         "--store)"), line


# -- no silent loss -----------------------------------------------------------------------


def test_files_with_one_name_in_different_folders_stay_different_pages(tmp_path: Path) -> None:
    """Issue 14: `scan a/copyright b/copyright ...` named every page `copyright`, so
    byte-identical files were taken for replays and disappeared."""
    text = RFC2821.read_text()
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "copyright").write_text(text if folder != "c" else text[:20000])
    run = dupalign("scan", "a/copyright", "b/copyright", "c/copyright", "--store", "s",
                   "--out", "m.jsonl", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    matches = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    pairs = {(m["doc_id"], m["kind"], m["match_doc_id"]) for m in matches}
    assert ("b/copyright", "exact", "a/copyright") in pairs
    assert any(m["doc_id"] == "c/copyright" and m["match_doc_id"] == "a/copyright"
               for m in matches)
    stats = json.loads(dupalign("stats", "--store", "s", "--json", cwd=tmp_path).stdout)
    assert stats["pages"] == 3
    assert "scan: 3 pages (3 new, 0 already in the store)" in run.stderr


def test_two_directories_with_one_relative_name_are_refused_not_merged(tmp_path: Path) -> None:
    for folder, text in (("v1", "the first version of the text"), ("v2", "quite other words")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "page.txt").write_text(text)
    run = dupalign("scan", "v1", "v2", "--store", "s", cwd=tmp_path)
    assert run.returncode == Exit.INPUT
    assert "page id 'page.txt' names two different files, v1/page.txt and v2/page.txt" in \
        run.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("problem", ["store is a file", "missing input", "locked store"])
def test_a_failed_start_leaves_the_previous_output_alone(problem: str, tmp_path: Path) -> None:
    """Issue 14: `--store FILE` truncated an existing --out file to 0 bytes, then died."""
    out = tmp_path / "matches.jsonl"
    out.write_text('{"kept": true}\n')
    store, inputs = "s", [str(RFC2821)]
    if problem == "store is a file":
        store = "store.txt"
        (tmp_path / store).write_text("a file")
    elif problem == "missing input":
        inputs.append("nothere.txt")
    with store_held_open(tmp_path / store) if problem == "locked store" else nullcontext():
        run = dupalign("scan", *inputs, "--store", store, "--out", out, cwd=tmp_path)
    assert out.read_text() == '{"kept": true}\n'
    assert run.returncode in (Exit.INPUT, Exit.STORE), run.stderr
    assert "Traceback" not in run.stderr


def test_a_missing_store_is_said_before_the_engine_is_imported(tmp_path: Path) -> None:
    """stats and query on a path without a store answer at once: the engine's import
    (numba, its kernels) cost about 2.4 s of CPU before the error."""
    code = ("import sys\nfrom dupalign.service.cli import main\n"
            "print(main(sys.argv[1:]), 'numba' in sys.modules)\n")
    for args in (["stats", "--store", "nostore"], ["query", "--store", ".", "some words"]):
        run = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.stdout.split() == [str(int(Exit.STORE)), "False"], run.stderr
        assert "no store at" in run.stderr


# the failures said before the engine is imported (numba, its kernels: about 1 s of CPU a
# run) besides a reader's missing store (above): a typo in a config, an input or --out
BEFORE_THE_ENGINE = ("missing input", "unreadable input", "directory without documents",
                     "two files, one id", ".warc.gz that is not gzip",
                     ".jsonl.gz that is not gzip", ".warc.gz that is not a WARC",
                     "invalid config", "--out in a missing directory",
                     "produce, broker unreachable")


@pytest.mark.parametrize("case", [c for c in CASES if c.name in BEFORE_THE_ENGINE],
                         ids=lambda c: c.name)
def test_a_bad_config_input_or_out_is_said_before_the_engine_is_imported(
        case: Case, tmp_path: Path) -> None:
    """scan checks its config, inputs and --out before it imports the engine, and produce
    never imports it: a typo fails at once."""
    code = ("import sys\nfrom dupalign.service.cli import main\n"
            "print(main(sys.argv[1:]), 'numba' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code, *case.setup(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.stdout.split() == [str(int(case.code)), "False"], run.stderr
    assert case.message in run.stderr


def test_compact_and_delete_leave_the_pages_a_restarted_worker_reads_again(
        tmp_path: Path) -> None:
    """Review D, bug 3: pages a Kafka worker stored past its commit are read again when it
    restarts and must be answered from the store (replays). An offline removal made them
    new pages again: p1 was published as an exact duplicate of the later p2."""
    from dupalign.runtime.engine import Engine
    from dupalign.service.cli import main

    store = str(tmp_path / "s")
    worker_store_ahead_of_its_commit(tmp_path / "s")
    assert main(["compact", "--store", store, "--max-pages", "1"]) == Exit.UNCOMMITTED
    assert main(["delete", "p1", "--store", store]) == Exit.UNCOMMITTED
    assert main(["compact", "--store", store]) == 0  # no retention: the files only
    with Engine.open(store) as engine:  # the worker restarts, reads offsets 1-2 again
        again = [[(m.kind, m.match_doc_id) for m in engine.process(page, ("pages", 0, n))]
                 for n, page in enumerate(_ahead_pages()) if n >= 1]
        assert again == [[("near", "p0")], [("exact", "p1")]]
        engine.set_checkpoint("pages", 0, 3)  # and commits them
    assert main(["delete", "p0", "--store", store]) == 0
    worker_store_ahead_of_its_commit(tmp_path / "forced")
    assert main(["compact", "--store", str(tmp_path / "forced"), "--max-pages", "1",
                 "--force"]) == 0
    with Engine.open(store, read_only=True) as kept, \
            Engine.open(tmp_path / "forced", read_only=True) as forced:
        assert (kept.indexer.alive, forced.indexer.alive) == (2, 1)


# -- the worker's metrics port --------------------------------------------------------------


@contextmanager
def port_in_use() -> Iterator[int]:
    """A port another process listens on (here: this one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_metrics_port_in_use_is_a_usage_error_said_before_kafka(tmp_path: Path) -> None:
    """Issue 40: the worker died with "internal error: OSError [Errno 98]" (exit 1). The
    broker address here reaches nothing: the port is said first, nothing is opened."""
    with port_in_use() as port:
        run = dupalign("worker", "--store", "s", "--bootstrap", f"127.0.0.1:{closed_port()}",
                       "--metrics-port", str(port), cwd=tmp_path)
    assert run.returncode == Exit.USAGE, run.stderr
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"dupalign worker: cannot listen on 127.0.0.1:{port} for /metrics"), \
        line
    assert f"is another process using port {port}?" in line
    assert not (tmp_path / "s").exists()


def test_the_http_server_says_which_port_it_cannot_listen_on() -> None:
    """A port taken between the start-up check and the worker's listen: the same line."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from dupalign.service.exits import CliError
    from dupalign.service.http import HttpServer

    def ok() -> tuple[bool, str]:
        return True, "ok"

    server = HttpServer(CollectorRegistry(), ok, ok)
    with port_in_use() as port, pytest.raises(CliError) as caught:
        asyncio.run(server.start("127.0.0.1", port))
    assert caught.value.code == Exit.USAGE
    assert f"cannot listen on 127.0.0.1:{port}" in str(caught.value)


# -- arguments, delete, stats, --out ---------------------------------------------------------


@pytest.mark.parametrize("jobs", ["-1", "2000", "two"])
def test_a_jobs_count_out_of_range_is_a_usage_error(jobs: str, tmp_path: Path) -> None:
    """Issue 40: --jobs -1 was taken silently. 0 is all cores (the default), like worker.jobs."""
    run = dupalign("scan", RFC2821, "--store", "s", "--jobs", jobs, cwd=tmp_path)
    assert run.returncode == Exit.USAGE, run.stderr
    assert run.stderr.splitlines()[-1] == (f"dupalign scan: error: argument --jobs: {jobs}: give "
                                           "a count of cores (at most 1024), or 0 for all")
    assert not (tmp_path / "s").exists()


def test_delete_names_the_ids_it_did_not_find_and_succeeds(tmp_path: Path) -> None:
    """Issue 40: `delete` of an unknown id said "0 of 1 pages deleted". As `rm -f`: an id
    not stored is already gone, so exit 0, and the ids not found are named."""
    worker_store_ahead_of_its_commit(tmp_path / "s")
    run = dupalign("delete", "p0", "nope", "p0", "gone too", "--store", "s", "--force",
                   cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        "1 of 3 pages deleted",
        "not in the store s (nothing to delete): 'nope', 'gone too'"]
    again = dupalign("delete", "p0", "--store", "s", "--force", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines() == ["0 of 1 pages deleted",
                                         "not in the store s (nothing to delete): 'p0'"]


def test_stats_shows_the_stores_figures_not_its_own_counters(tmp_path: Path) -> None:
    """Issue 40: after a delete, `stats --json` said "deletes": 0, a counter of the stats
    process itself (which only opened the store) that read as a figure of the store."""
    worker_store_ahead_of_its_commit(tmp_path / "s")
    assert dupalign("delete", "p0", "--store", "s", "--force", cwd=tmp_path).returncode == 0
    run = dupalign("stats", "--store", "s", "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout)
    assert set(stats) == {"pages", "ordinals", "store_bytes", "near_table_size",
                          "near_table_bytes", "idf_version", "params", "audit"}
    assert (stats["pages"], stats["ordinals"]) == (2, 3)


def test_a_run_that_processes_nothing_leaves_the_previous_output(tmp_path: Path) -> None:
    """Issue 40: a run whose every page was rejected truncated --out to 0 bytes. A run that
    processes pages and finds no match writes an empty file: it ran."""
    out = tmp_path / "matches.jsonl"
    out.write_text('{"kept": true}\n')
    run = dupalign(*_every_page_rejected(tmp_path), "--out", out.name, cwd=tmp_path)
    assert run.returncode == Exit.NOTHING_DONE, run.stderr
    assert out.read_text() == '{"kept": true}\n'
    run = dupalign("scan", RFC2821, "--store", "s", "--out", out.name, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert out.read_text() == ""


def test_ctrl_c_on_scan_says_what_was_stored_and_exits_130(tmp_path: Path) -> None:
    """Issue 40: Ctrl-C exited 130 without a word. SIGINT goes to the whole process group
    (the pool's processes too), as a terminal sends it."""
    import os
    import random
    import re
    import signal
    import time

    words = RFC2821.read_text().split()
    rng = random.Random(40)
    src = tmp_path / "in.jsonl"
    with src.open("w") as fh:
        for n in range(5000):
            start = rng.randrange(len(words) - 200)  # slices that overlap: matches
            body = " ".join(words[start:start + 200] + rng.sample(words, 100))
            fh.write(json.dumps({"id": f"p{n}", "body": body}) + "\n")
    out = tmp_path / "m.jsonl"
    out.write_text("previous\n")
    scan = subprocess.Popen([str(DUPALIGN), "scan", src.name, "--store", "s", "--out", out.name,
                             "--jobs", "2", "--quiet"], cwd=tmp_path, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while out.read_text() == "previous\n":  # opened at the first page processed
            assert scan.poll() is None and time.monotonic() < deadline, scan.stderr
            time.sleep(0.2)
        time.sleep(1)
        os.killpg(scan.pid, signal.SIGINT)
        _, err = scan.communicate(timeout=120)
    finally:
        if scan.poll() is None:
            os.killpg(scan.pid, signal.SIGKILL)
    assert scan.returncode == Exit.INTERRUPTED, err
    assert "Traceback" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("scan interrupted: ")]
    got = re.match(r"scan interrupted: (\d+) pages \((\d+) new, 0 already in the store\), "
                   r"(\d+) matches, 0 rejected or skipped; the store holds (\d+) pages: a run "
                   r"again answers those from the store, matches included, and goes on$", line)
    assert got is not None, line
    pages, stored = int(got[1]), int(got[4])
    assert 0 < pages <= stored < 5000 and int(got[2]) == pages
    assert len(out.read_text().splitlines()) == int(got[3])
    stats = json.loads(dupalign("stats", "--store", "s", "--json", cwd=tmp_path).stdout)
    assert stats["pages"] == stored
