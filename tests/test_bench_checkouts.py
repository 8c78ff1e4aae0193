"""The benchmarks' baseline checkouts: kept by commit and warmed once before any clock
(tests.bench.checkouts ``warm_checkout``), and the kernels a run compiled inside its clock
(tests.bench.bench_scan ``_COMPILES``)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from numba import njit

from tests.bench.bench_scan import _COMPILES
from tests.bench.checkouts import REPO, commit_of, warm_checkout, warm_kernels_in


def test_a_checkout_is_made_and_warmed_once_per_commit(tmp_path: Path) -> None:
    warmed: list[Path] = []

    def warm(tree: Path) -> bool:
        warmed.append(tree)
        return True

    root = tmp_path / "checkouts"
    try:
        first = warm_checkout("HEAD", root, warm)
        (first / "left-by-the-first-run").write_text("x")
        again = warm_checkout("HEAD", root, warm)
        sha = commit_of("HEAD")
        assert first == again == root / sha
        assert warmed == [first]  # the second run reused the checkout and its cache
        assert (again / "left-by-the-first-run").exists()
        head = subprocess.run(["git", "-C", str(again), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        assert head == sha and (again / "dupalign" / "__init__.py").is_file()
        # a checkout that is gone is made again, and warmed again
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(again)],
                       check=True, capture_output=True)
        assert warm_checkout(sha, root, warm) == first
        assert warmed == [first, first]
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                        str(root / commit_of("HEAD"))], check=False, capture_output=True)


def test_the_warm_up_is_the_checkouts_own(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "dupalign").mkdir(parents=True)
    (tree / "tests").mkdir()
    (tree / "dupalign" / "__init__.py").write_text("")
    (tree / "tests" / "__init__.py").write_text("")
    (tree / "tests" / "warm_kernels.py").write_text(
        "import pathlib, dupalign\n"
        "pathlib.Path('warmed').write_text(dupalign.__file__)\n")
    assert warm_kernels_in(tree)
    assert Path((tree / "warmed").read_text()) == tree / "dupalign" / "__init__.py"
    (tree / "tests" / "warm_kernels.py").unlink()  # an old revision without the module
    assert not warm_kernels_in(tree)


def test_kernels_compiled_inside_the_clock_are_named() -> None:
    space: dict[str, object] = {}
    exec(_COMPILES, space)
    compiled_since = space["compiled_since"]
    assert callable(compiled_since)

    @njit(cache=False)
    def _fresh_kernel(x: int) -> int:
        return x + 1

    t0 = time.time()
    assert _fresh_kernel(1) == 2
    inside = compiled_since(time.time() - t0 + 1.0)
    assert any(name.endswith("_fresh_kernel") for name in inside)
    time.sleep(0.01)
    assert _fresh_kernel(2) == 3  # (compiled before this clock: not named)
    assert not any(name.endswith("_fresh_kernel") for name in compiled_since(0.005))
    space["recorder"].__exit__(None, None, None)  # type: ignore[attr-defined]
