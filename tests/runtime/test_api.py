"""The library API (dupalign.open, Detector): the README's example runs as written, and each
method does what its docstring says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import dupalign
from tests.corpora import DEMO, REPO


def readme_example() -> str:
    """The first ```python block of the README's "Python API" section."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Python API", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "README: no python block under '## Python API'"
    return found.group(1)


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "demo").symlink_to(DEMO)  # the example reads demo/ from the repository root
    (tmp_path / "example.py").write_text(readme_example())
    run = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert re.fullmatch(r"passage rfc2821 0\.\d\d \d+ spans", lines[0]), lines
    assert any(line.startswith("query ~ rfc2821 (") for line in lines[1:-1]), lines
    assert lines[-1] == "2 ['rfc2821', 'rfc5321'] passage", lines
    assert not list(tmp_path.glob("*.store")), (
        "the example leaves no store in the folder it runs from")


def test_import_is_cheap_and_exports_the_api() -> None:
    code = ("import sys, dupalign\n"
            "heavy = [m for m in ('numba', 'numpy', 'rocksdict', 'dupalign.runtime.engine') "
            "if m in sys.modules]\n"
            "assert not heavy, heavy\n"
            "assert callable(dupalign.open) and dupalign.Detector.add.__doc__\n"
            "assert 'dupalign.runtime.engine' in sys.modules\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert all(getattr(dupalign, name) is not None for name in dupalign.__all__)


def test_detector_methods(tmp_path: Path) -> None:
    words = (DEMO / "rfc" / "rfc2822.txt").read_text().split()
    first, copy = " ".join(words[:3000]), " ".join(words[:3000]).upper()
    with dupalign.open(tmp_path / "s", {"near": {"hamming": 3}}) as store:
        assert store.add("a", first, url="https://example.org/a", fetched_at=7) == []
        [exact] = store.add("b", copy)
        assert (exact.kind, exact.doc_id, exact.match_doc_id) == ("exact", "b", "a")
        assert store.add("b", copy) == [exact]  # the same page again: stored once
        with pytest.raises(dupalign.PageRejected) as rejected:
            store.add("c", "!!! ???")
        assert rejected.value.reason == "empty"
        assert len(store) == 2 and "a" in store and "c" not in store
        assert [(p.id, p.ordinal, p.url, p.fetched_at) for p in store.pages()] == [
            ("a", 0, "https://example.org/a", 7), ("b", 1, None, None)]
        assert store.matches("b") == [exact] and store.matches("a") == []
        with pytest.raises(KeyError):
            store.matches("c")
        [passage] = store.query(" ".join(words[1000:1400]))
        assert passage.kind == "passage" and passage.match_doc_id == "a" and passage.spans
    with dupalign.open(tmp_path / "s", read_only=True) as reader:
        # (the default, not the writer's 3: the radius is read at each lookup, not stored)
        assert reader.stats()["pages"] == 2 and reader.config.near.hamming == 5
        with pytest.raises(RuntimeError, match="read-only"):
            reader.add("d", first)
    with pytest.raises(dupalign.StoreMismatch, match="seed"):
        dupalign.open(tmp_path / "s", {"seed": 5})
    with pytest.raises(dupalign.StoreUnavailable, match="no store at"):
        dupalign.open(tmp_path / "none", read_only=True)
    with pytest.raises(dupalign.ConfigError, match=r"near\.hamming"):
        dupalign.open(tmp_path / "t", {"near": {"hamming": 99}})
