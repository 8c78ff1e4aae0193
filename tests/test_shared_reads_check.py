"""The conftest check that a test reading the shared folder carries ``@pytest.mark.testdata``:
pytest run in a subprocess on probe tests, with tests/conftest.py as a plugin and
DUPALIGN_SHARED pointing at a folder made here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.corpora import REPO

pytest_plugins = ["pytester"]

PROBES = '''
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(os.environ["DUPALIGN_SHARED"])
CORPUS = SHARED / "testdata" / "corpus.txt"


def test_unmarked_open():
    CORPUS.read_text()


def test_unmarked_listing():
    assert sorted(os.listdir(SHARED / "testdata")) is not None


def test_unmarked_relative_path(monkeypatch):
    monkeypatch.chdir(SHARED)
    open("testdata/../testdata/corpus.txt").close()


def test_unmarked_subprocess_argument():
    subprocess.run([sys.executable, "-c", "pass", str(CORPUS)], check=True)


@pytest.fixture
def corpus():
    return CORPUS.read_text()


def test_unmarked_fixture(corpus):
    assert corpus


@pytest.mark.testdata
def test_marked(corpus):
    assert CORPUS.read_text() == corpus == "words"


@pytest.mark.testdata
class TestMarkedClass:
    def test_in_class(self):
        assert sorted(p.name for p in (SHARED / "testdata").glob("*.txt")) == ["corpus.txt"]


def test_elsewhere(tmp_path):
    (tmp_path / "x.txt").write_text("words")
    assert (tmp_path / "x.txt").read_text() == "words"
'''

AT_IMPORT = '''
import os
from pathlib import Path

WORDS = (Path(os.environ["DUPALIGN_SHARED"]) / "testdata" / "corpus.txt").read_text()


def test_uses_words():
    assert WORDS
'''

UNMARKED = ["test_unmarked_open", "test_unmarked_listing", "test_unmarked_relative_path",
            "test_unmarked_subprocess_argument"]
UNMARKED_FIXTURE = "test_unmarked_fixture"  # fails in setup: an error


def reasons(out: str, shared: Path) -> dict[str, str]:
    """The check's message for each probe it failed, by probe name."""
    found = {}
    for line in out.splitlines():
        head, _, rest = line.partition(" reads the shared folder ")
        prefix = f"{shared} without @pytest.mark.testdata: "
        if rest.startswith(prefix):
            found[head.rpartition("::")[2]] = rest.removeprefix(prefix)
    return found


def run_probes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
               shared: Path) -> pytest.RunResult:
    monkeypatch.setenv("DUPALIGN_SHARED", str(shared))
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    pytester.makeini("[pytest]\nmarkers =\n    testdata: reads the shared corpora\n")
    pytester.makepyfile(test_probes=PROBES, test_at_import=AT_IMPORT)
    return pytester.runpytest_subprocess("-p", "tests.conftest", "-p", "no:cacheprovider",
                                         "-rfEs", "-p", "no:xdist",
                                         "--continue-on-collection-errors")


def test_an_unmarked_test_reading_the_shared_folder_fails_a_marked_one_passes(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "testdata").mkdir(parents=True)
    (shared / "testdata" / "corpus.txt").write_text("words")
    result = run_probes(pytester, monkeypatch, shared)
    result.assert_outcomes(passed=3, failed=len(UNMARKED), errors=2)
    found = reasons(result.stdout.str(), shared)
    corpus = f"{shared}/testdata/corpus.txt"
    assert found == {
        "test_unmarked_open": f"{corpus}. Add @pytest.mark.testdata to the test (or a "
                              "pytestmark to its module) so that it is skipped where the "
                              "corpora are missing.",
        "test_unmarked_listing": f"{shared}/testdata. Add @pytest.mark.testdata to the test "
                                 "(or a pytestmark to its module) so that it is skipped where "
                                 "the corpora are missing.",
        "test_unmarked_relative_path": f"{corpus}. Add @pytest.mark.testdata to the test (or "
                                       "a pytestmark to its module) so that it is skipped "
                                       "where the corpora are missing.",
        "test_unmarked_subprocess_argument": f"{corpus} (given to a subprocess). Add @pytest."
                                             "mark.testdata to the test (or a pytestmark to "
                                             "its module) so that it is skipped where the "
                                             "corpora are missing.",
        UNMARKED_FIXTURE: f"{corpus}. Add @pytest.mark.testdata to the test (or a pytestmark "
                          "to its module) so that it is skipped where the corpora are missing.",
        "test_at_import.py (at import)": f"{corpus}. Read it in a test or fixture marked "
                                         "@pytest.mark.testdata instead so that it is skipped "
                                         "where the corpora are missing.",
    }

def test_without_the_corpora_a_marked_test_is_skipped_an_unmarked_one_still_fails(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shared = tmp_path / "empty"
    shared.mkdir()
    result = run_probes(pytester, monkeypatch, shared)
    result.assert_outcomes(passed=1, skipped=2, failed=len(UNMARKED), errors=2)
    out = result.stdout.str()
    assert out.count("needs the shared test corpora") == 1  # the summary's SKIPPED [2] line
    assert "SKIPPED [2]" in out
    # the missing marker is the reason given, rather than only the FileNotFoundError
    assert set(reasons(out, shared)) == {*UNMARKED, UNMARKED_FIXTURE,
                                         "test_at_import.py (at import)"}
