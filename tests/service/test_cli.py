"""`dupalign scan` as a user runs it: real files in, JSON Lines out, bad lines reported."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dupalign.service.cli import main
from dupalign.service.inputs import InputError, iter_input
from tests.corpora import DEMO, WARC

# without the shared corpora, one placeholder item that the `testdata` marker skips (or fails
# under CI) with the reason, rather than an empty parameter set
WARCS = sorted(WARC.glob("*.warc.gz")) or [WARC / "*.warc.gz"]


def test_the_demo_warc_parses() -> None:
    pages = [item for _, item in iter_input(DEMO / "web" / "creativecommons.org.warc.gz")]
    assert [getattr(p, "id", None) for p in pages] == [
        "https://creativecommons.org/", "https://creativecommons.org/mission/",
        "https://creativecommons.org/2024/03/28/cc-joins-civil-society-letter-urging-u-s-to-"
        "support-openness-and-transparency-in-ai/",
        "https://creativecommons.org/2024/04/23/cc-at-wipo-slow-progress-on-copyright-"
        "exceptions-for-cultural-heritage-institutions/"]


@pytest.mark.testdata
@pytest.mark.parametrize("warc", WARCS, ids=[w.name for w in WARCS])
def test_every_warc_file_parses(warc: Path) -> None:
    items = [item for _, item in iter_input(warc)]
    pages = [i for i in items if not isinstance(i, InputError)]
    assert len(pages) >= 10
    assert all(p.id.startswith("http") for p in pages)
    # the few records that are not pages say why
    assert all(i.reason for i in items if isinstance(i, InputError))


def test_scan_twice_gives_the_same_matches(tmp_path: Path) -> None:
    inputs = [str(DEMO / "llvm-docs"), str(DEMO / "web" / "creativecommons.org.warc.gz")]
    outs = []
    for name in ("one", "two"):
        out = tmp_path / f"{name}.jsonl"
        assert main(["scan", *inputs, "--store", str(tmp_path / "store"), "--out", str(out)]) == 0
        outs.append([json.loads(line) for line in out.read_text().splitlines()])
    strip = [[{k: v for k, v in m.items() if k != "detected_at"} for m in o] for o in outs]
    assert strip[0] == strip[1]
    kinds = {m["kind"] for m in strip[0]}
    assert "exact" in kinds and kinds <= {"exact", "near", "passage"}


def test_scan_with_partitions_gives_the_matches_of_scan(tmp_path: Path) -> None:
    """The partitioned pipeline in one process (dupalign.stages.partitioned) as a user runs
    it: the demo pages twice (the second time replays), the matches of ``scan``."""
    inputs = [str(DEMO / "llvm-docs"), str(DEMO / "web" / "creativecommons.org.warc.gz")] * 2
    outs = []
    for name, extra in (("scan", []), ("partitioned", ["--partitions", "2,2,2,3,2,2"])):
        out = tmp_path / f"{name}.jsonl"
        assert main(["scan", *inputs, "--store", str(tmp_path / name), "--out", str(out),
                     "--quiet", "--jobs", "1", *extra]) == 0
        outs.append([{k: v for k, v in json.loads(line).items() if k != "detected_at"}
                     for line in out.read_text().splitlines()])
    assert outs[0] == outs[1] and {m["kind"] for m in outs[0]} >= {"exact", "passage"}
    with pytest.raises(SystemExit):  # (argparse: not a power of 2)
        main(["scan", inputs[0], "--store", str(tmp_path / "x"), "--partitions", "1,1,3,1,1"])
    assert main(["scan", inputs[0], "--store", str(tmp_path / "scan"),
                 "--partitions", "1,1,1,1,1"]) == 2  # (a store that holds pages)


def test_bad_jsonl_lines_are_reported_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = " ".join((DEMO / "rfc" / "rfc2821.txt").read_text().split()[:400])
    lines = [
        json.dumps({"id": "a", "body": text}),
        "{not json",
        json.dumps({"id": 5, "body": "x"}),
        json.dumps({"id": "b", "body": text, "content_type": "text/plain"}),
        json.dumps({"id": "c", "body": "\u0000\u0001" * 500}),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["scan", str(src), "--store", str(tmp_path / "s"), "--out", str(out),
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"{src}:2" in err and f"{src}:3" in err and "'id' must be a non-empty string" in err
    assert "in.jsonl:5" in err and "undecodable" in err
    matches = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(m["doc_id"], m["kind"], m["match_doc_id"]) for m in matches] == [("b", "exact", "a")]


def test_a_line_nested_too_deeply_for_json_is_reported_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = " ".join((DEMO / "rfc" / "rfc2821.txt").read_text().split()[:400])
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([json.dumps({"id": "a", "body": text}),
                              "[" * 100_000 + "]" * 100_000,
                              json.dumps({"id": "b", "body": text})]) + "\n")
    items = [item for _, item in iter_input(src)]
    assert [type(i).__name__ for i in items] == ["Page", "InputError", "Page"]
    assert isinstance(items[1], InputError) and items[1].where == f"{src}:2"
    assert "nested too deeply" in items[1].reason
    out = tmp_path / "out.jsonl"
    assert main(["scan", str(src), "--store", str(tmp_path / "s"), "--out", str(out),
                 "--quiet"]) == 0
    assert f"{src}:2" in capsys.readouterr().err
    matches = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(m["doc_id"], m["kind"], m["match_doc_id"]) for m in matches] == [("b", "exact", "a")]


def test_console_script_and_config_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[engine.near]\nhamming = 99\n")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "body": "hello"}) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "dupalign.service.cli", "scan", str(src),
         "--store", str(tmp_path / "s"),
         "--config", str(cfg)], capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert "near.hamming" in run.stderr and "out of range" in run.stderr


def test_query_reads_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    orig = DEMO / "rfc" / "rfc2821.txt"
    assert main(["scan", str(orig), "--store", str(tmp_path / "s"), "--quiet"]) == 0
    capsys.readouterr()
    rewrite = DEMO / "rfc" / "rfc5321.txt"  # keeps most of 2821's text
    assert main(["query", "--file", str(rewrite), "--store", str(tmp_path / "s")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and rows[0]["match_doc_id"] == orig.as_posix() and rows[0]["spans"]


def test_progress_off_a_terminal_is_whole_lines() -> None:
    """Not a TTY: with --progress, complete lines (a log never gets "\\r"-joined text);
    without it, nothing but the messages."""
    import io

    from dupalign.service.progress import Progress

    for lines in (True, False):
        stream = io.StringIO()
        progress = Progress(stream, enabled=True, lines=lines, every_s=0)
        for _ in range(3):
            progress.update(1, "2 matches")
        progress.write("skipped x.jsonl:3: bad")
        progress.close()
        text = stream.getvalue()
        assert "\r" not in text and text.endswith("\n")
        shown = [line.split(",")[0] for line in text.splitlines()]
        assert shown == (["1 pages", "2 pages", "3 pages"] if lines else []) + [
            "skipped x.jsonl:3: bad"]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_count_the_rate_from_the_first_page(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first run compiles for minutes before its first page: the rate counts from that
    page (it read "0.0 pages/s" with the compile time in it), and no rate is shown before
    a second page gives one."""
    import io

    from dupalign.service import progress as progress_module
    from dupalign.service.cli import COMPILING

    clock = _Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    stream = io.StringIO()
    progress = progress_module.Progress(stream, lines=True, every_s=1, waiting=COMPILING)
    clock.now += 120  # compiling
    progress.update(1, "0 matches")
    for _ in range(4):
        clock.now += 0.5
        progress.update(1, "0 matches")
    progress.close()
    assert stream.getvalue().splitlines() == ["3 pages, 2.0 pages/s, 0 matches",
                                              "5 pages, 2.0 pages/s, 0 matches"]
    assert progress.rate() == 2.0  # a page every 0.5 s


def test_progress_bar_says_it_compiles_until_the_first_page() -> None:
    """On a terminal (a fake one here), the bar names the wait instead of a rate, and
    drops it once a page is done."""
    import io

    from dupalign.service.cli import COMPILING
    from dupalign.service.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = Progress(stream, waiting=COMPILING)
    before = stream.getvalue().split("\r")[-1]
    assert before.startswith(f"{COMPILING}: 0 pages") and "? pages/s" in before, before
    progress.update(1, "2 matches")
    progress.close()
    after = stream.getvalue().split("\r")[-1]
    assert after.startswith("1 pages") and "compiling" not in after and "2 matches" in after, after


def test_stats_is_a_table_or_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    assert main(["scan", str(DEMO / "rfc"), "--store", store, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["stats", "--store", store]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"store {store}"
    assert table[1].split() == ["pages", "4"] and "frozen parameters" in table
    assert main(["stats", "--store", store, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["pages"] == 4 and stats["params"]["seed"] == 24301


def test_audit_and_stats_report_recall(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`scan` with the audit on keeps its tally (`stats` shows it); `audit` audits a sample
    of the stored pages on demand."""
    store, config = str(tmp_path / "s"), tmp_path / "c.toml"
    config.write_text("[engine.audit]\nsample = 1.0\n")
    assert main(["scan", str(DEMO / "llvm-docs"), "--store", store, "--quiet", "--config",
                 str(config)]) == 0
    capsys.readouterr()
    assert main(["stats", "--store", store, "--json"]) == 0
    live = json.loads(capsys.readouterr().out)["audit"]
    assert live["near"]["pages"] > 0 and live["passage"]["pairs"] > 0
    assert main(["stats", "--store", store]) == 0
    assert "recall audit" in capsys.readouterr().out
    assert main(["audit", "--store", store, "--pages", "50", "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert stored["near"]["pages"] > 0 and stored["passage"]["pairs"] > 0
    assert stored["passage"]["recall"] == 1.0  # (the demo's copies are all found)
    assert main(["audit", "--store", store, "--pages", "5"]) == 0
    assert capsys.readouterr().out.startswith(f"store {store}\nrecall audit")


def _commands() -> list[str]:
    from dupalign.service.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


@pytest.mark.parametrize("command", ["", *_commands()])
def test_help_imports_neither_the_engine_nor_kafka(command: str) -> None:
    """Every `--help` stays fast (issue 40: under 0.5 s; `worker --help` took 5 s) because
    it imports no heavy module: timed by hand, not here, this checks the cause. The help
    still lists every option of the command."""
    code = ("import sys\nfrom dupalign.service.cli import main\n"
            f"try:\n    main({[command, '--help'] if command else ['--help']!r})\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            "heavy = {'dupalign.runtime.engine', 'numba', 'numpy', 'rocksdict', 'aiokafka',"
            " 'fastwarc',"
            " 'dupalign.service.worker', 'dupalign.service.produce'}\n"
            "print(sorted(heavy & set(sys.modules)))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    *shown, imported = run.stdout.strip().splitlines()
    assert imported == "[]", run.stdout
    assert shown[0].startswith(f"usage: dupalign {command}".rstrip())
    if command:
        from dupalign.service.cli import build_parser

        sub = next(a for a in build_parser()._actions
                   if isinstance(a, argparse._SubParsersAction))
        options = [o for a in sub.choices[command]._actions if a.help != argparse.SUPPRESS
                   for o in a.option_strings]  # (removed options stay hidden: an error)
        assert "--help" in options and all(o in "\n".join(shown) for o in options)


def test_a_role_process_imports_neither_aiohttp_without_metrics_nor_scipy_linalg() -> None:
    """What a role process imports before and at its first kernel: not aiohttp, which only
    the HTTP endpoint ([metrics]) needs, nor scipy.linalg, which numba imports for its BLAS
    probe (dupalign/kernel_cache.py): ~0.3 s of CPU each at every process start."""
    code = ("import sys\nimport numpy as np\n"
            "from dupalign.service import worker\n"
            "from dupalign.service.roles import launch, stage_command\n"
            "from dupalign.service.roles import stage_align, stage_combine, stage_sketch\n"
            "from dupalign.text.hashing import mix64\n"
            "mix64(np.arange(3, dtype=np.uint64))\n"
            "print(sorted({'aiohttp', 'scipy.linalg'} & set(sys.modules)))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout


def _with_numba_cache(cache: Path, *args: str, code: str | None = None
                      ) -> subprocess.CompletedProcess[str]:
    cmd = ([sys.executable, "-c", code] if code
           else [sys.executable, "-m", "dupalign.service.cli", *args])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, NUMBA_CACHE_DIR=str(cache)))


def test_a_first_run_says_it_compiles_the_kernels(tmp_path: Path) -> None:
    """An empty numba cache (a fresh install): scan says why it is quiet for minutes;
    --quiet says nothing. (An empty input: nothing is compiled, the run stops at once.)"""
    empty = tmp_path / "pages.jsonl"
    empty.write_text("")
    cache = tmp_path / "numba"
    run = _with_numba_cache(cache, "scan", "--store", str(tmp_path / "s"), str(empty))
    assert "compiling the engine's kernels on this first run" in run.stderr, run.stderr
    run = _with_numba_cache(cache, "scan", "--quiet", "--store", str(tmp_path / "s"),
                            str(empty))
    assert "compiling" not in run.stderr and "nothing was processed" in run.stderr


def test_kernels_cached_reads_the_index_numba_writes(tmp_path: Path) -> None:
    """The check reads numba's private cache layout: written here by numba itself (an index
    with one entry per kernel), it answers True; one kernel missing, False."""
    code = """if True:
        from dupalign.near import psm
        from dupalign.passage import batch_align as passage_align, span_refine
        from dupalign.runtime import kernel_status
        print(kernel_status.kernels_cached())
        for k in (span_refine.refine_pages, passage_align.scan_tasks):
            k._cache._cache_file._save_index({"signature": "data file"})
        print(kernel_status.kernels_cached())
        psm._psm_one_kernel._cache._cache_file._save_index({"signature": "data file"})
        print(kernel_status.kernels_cached())"""
    run = _with_numba_cache(tmp_path / "numba", code=code)
    assert run.stdout.split() == ["False", "False", "True"], run.stderr


def test_garbage_input_reports_its_first_rejections_and_counts_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40: 745 bad lines gave 745 stderr lines. The first 20 are shown, the rest counted
    in one line, and the summary counts them all."""
    from dupalign.service.capped import LIMIT

    src = tmp_path / "in.jsonl"
    text = " ".join((DEMO / "rfc" / "rfc2821.txt").read_text().split()[:400])
    src.write_text(json.dumps({"id": "a", "body": text}) + "\n"
                   + "".join(f"garbage line {n}\n" for n in range(745)))
    assert main(["scan", str(src), "--store", str(tmp_path / "s"), "--quiet", "--jobs", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    skipped = [line for line in err if line.startswith("skipped ")]
    assert [line.split()[1] for line in skipped] == [f"{src}:{n}:" for n in range(2, 2 + LIMIT)]
    assert f"... and {745 - LIMIT} more rejected or skipped (not shown: the first {LIMIT} are)" \
        in err
    assert err[-1] == "scan: 1 pages (1 new, 0 already in the store), 0 matches, 745 rejected " \
        "or skipped"
    assert len(err) == LIMIT + 2


def test_every_option_of_every_command_says_what_it_is() -> None:
    """Issue 40: --store and --config had no help text in query, stats, delete, compact."""
    import argparse

    from dupalign.service.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    checked = set()
    for name in commands.choices:  # every command, the Kafka ones too
        for action in commands.choices[name]._actions:
            assert action.help, f"dupalign {name} {'/'.join(action.option_strings)}"
            checked.add((name, action.dest))
    assert {(c, o) for c in ("query", "stats", "delete", "compact")
            for o in ("store", "config")} <= checked


def test_the_stores_the_readme_examples_make_are_ignored_by_git() -> None:
    """Issue 40: the README's Python example left rfc.store/ in the repository root. Stores
    the README's commands name in the working directory, and any ``*.store`` there, are
    ignored by git (the API example itself writes into a temporary directory: test_api)."""
    import re
    import shutil

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    stores = set(re.findall(r'dupalign\.open\("([^"/]+)"', readme))
    stores |= set(re.findall(r"--store ([\w.-]+\.store)\b", readme))
    stores.add("rfc.store")  # the name the example used to leave behind
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    run = subprocess.run(["git", "check-ignore", "--no-index", *(f"{s}/CURRENT" for s in stores)],
                         cwd=root, capture_output=True, text=True, check=False)
    assert set(run.stdout.split()) == {f"{s}/CURRENT" for s in stores}, run.stderr
