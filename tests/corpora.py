"""Real text for tests and benchmarks: the demo corpus shipped in ``demo/``, the larger
corpora of the shared test data (Clough, RFCs, WARC crawls) and Debian documentation in two
releases (llvm, Boost) for the scan benchmark.

The shared test data lives in ``$DUPALIGN_SHARED/testdata``, by default ``../shared`` beside
the repository. Tests that need it carry ``@pytest.mark.testdata``: without it they are
skipped with the reason, except under ``CI=true``, where they fail (tests/conftest.py). A
test that reads it without the marker fails, also where it is present: the helpers here read
it when called, never at import, so only the tests calling them need the marker.

Text comes back exactly as the engine sees it (``dupalign.text.tokens.page_text``), so character
ranges in a Match's spans index into the strings returned here.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dupalign.page import Page
from dupalign.text.tokens import page_text

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "demo"  # shipped with the repository: always there
SHARED = Path(os.environ.get("DUPALIGN_SHARED") or REPO.parent / "shared")
TESTDATA = SHARED / "testdata"
CLOUGH = TESTDATA / "clough"
RFC = TESTDATA / "rfc"
WARC = TESTDATA / "warc"
LLVM_DOCS = Path.home() / ".cache" / "dupalign-docs"  # every docs corpus unpacks here
FETCH_DOCS = SHARED / "scripts" / "fetch-debian-docs.sh"

_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class CloughAnswer:
    file: str
    task: str  # a..e
    category: str  # cut | light | heavy | non
    body: bytes


def plain_text(body: bytes | str, content_type: str = "text/plain") -> str:
    """The text the engine tokenizes for a body (decoding as the engine does)."""
    return page_text(Page(id="-", body=body, content_type=content_type))


@cache
def clough_answers() -> tuple[CloughAnswer, ...]:
    with open(CLOUGH / "file_information.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return tuple(  # the csv also lists the originals (category "orig")
        CloughAnswer(r["File"], r["Task"], r["Category"], (CLOUGH / r["File"]).read_bytes())
        for r in rows
        if r["Category"] != "orig"
    )


@cache
def clough_original(task: str) -> bytes:
    return (CLOUGH / f"orig_task{task}.txt").read_bytes()


@cache
def rfc_text(number: int) -> str:
    return plain_text((RFC / f"rfc{number}.txt").read_bytes())


def rfc_numbers() -> list[int]:
    return sorted(int(p.stem[3:]) for p in RFC.glob("rfc[0-9]*.txt"))


def llvm_doc_files(limit: int | None = None) -> list[Path]:
    """HTML pages of the llvm docs unpacked by scripts/fetch-debian-docs.sh (may be none)."""
    files = sorted(f for d in sorted(LLVM_DOCS.glob("llvm-*-doc")) for f in d.rglob("*.html"))
    return files[:limit] if limit is not None else files


@dataclass(frozen=True)
class Release:
    """One release of a Debian documentation package: its pages are ``label/<path>``."""

    label: str
    package: str
    html: str  # the HTML directory inside the unpacked package

    def root(self, docs: Path) -> Path:
        return docs / self.package / self.html


# Two releases of the same documentation each: the later release's pages repeat, exactly or
# with edits, many pages of the earlier one (the exact and near copies the scan benchmark
# finds). Boost: the two releases Debian 12 carries, 7,709 pages, none of them used to tune
# the engine.
DOCS_CORPORA: dict[str, tuple[Release, Release]] = {
    "llvm": (Release("llvm-13", "llvm-13-doc", "usr/share/doc/llvm-13-doc/html"),
             Release("llvm-14", "llvm-14-doc", "usr/share/doc/llvm-14-doc/html")),
    "boost": (Release("boost-1.74", "libboost1.74-doc", "usr/share/doc/libboost1.74-doc/doc/html"),
              Release("boost-1.81", "libboost1.81-doc", "usr/share/doc/libboost1.81-doc/doc/html")),
}


def docs_releases(name: str, docs: Path = LLVM_DOCS,
                  limit: int | None = None) -> tuple[list[Page], list[Page]]:
    """The HTML pages of both releases of ``DOCS_CORPORA[name]``, in path order, unpacked from
    their Debian packages (apt-get download, dpkg -x: ``FETCH_DOCS``) on first use."""
    releases = DOCS_CORPORA[name]
    missing = [r.package for r in releases if not r.root(docs).is_dir()]
    if missing:
        subprocess.run(["bash", str(FETCH_DOCS), str(docs), *missing], check=True)
    old, new = ([Page(id=f"{r.label}/{f.relative_to(r.root(docs)).as_posix()}",
                      body=f.read_bytes(), content_type="text/html")
                 for f in sorted(r.root(docs).rglob("*.html"))[:limit]] for r in releases)
    return old, new


def words(text: str) -> list[str]:
    """Lower-cased \\w+ words (the engine's tokens for ASCII text)."""
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def copied_mask(tokens: list[str], other: list[str], n: int = 5) -> list[bool]:
    """Which positions of ``tokens`` lie in a word n-gram that also occurs in ``other``."""
    grams = ngrams(other, n)
    out = [False] * len(tokens)
    for i in range(len(tokens) - n + 1):
        if tuple(tokens[i : i + n]) in grams:
            out[i : i + n] = [True] * n
    return out


def containment(part: list[str], whole: list[str], n: int) -> float:
    """Share of ``part``'s distinct word n-grams that also occur in ``whole`` (0 if none)."""
    a = ngrams(part, n)
    return len(a & ngrams(whole, n)) / len(a) if a else 0.0


def demo_pages() -> list[Page]:
    """The demo corpus as `make demo` sends it: LLVM doc pages of two releases, the RFCs, the
    WARC crawl (32 pages with exact, near and passage matches; demo/README.md)."""
    from dupalign.service.inputs import InputError, iter_input

    pages = []
    for source in (DEMO / "llvm-docs", DEMO / "rfc", DEMO / "web" / "creativecommons.org.warc.gz"):
        pages += [item for _, item in iter_input(source) if not isinstance(item, InputError)]
    return pages
