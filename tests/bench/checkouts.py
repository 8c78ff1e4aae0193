"""A baseline checkout for benchmarks that compare this one with another revision, and a
child process run in a checkout (its own ``dupalign`` imported, one JSON line printed).

``warm_checkout``: a revision checked out once per commit and its numba kernels compiled
before any clock starts. A fresh checkout has an empty kernel cache, so every kernel its
benchmark's warm-up did not reach compiled inside the baseline's clock (a bias against the
baseline: docs/performance/scan.md, issue #44)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# checkouts kept between runs, one per commit (``warm_checkout``)
CHECKOUTS = Path(os.environ.get("DUPALIGN_BENCH_CHECKOUTS",
                                Path(tempfile.gettempdir()) / "dupalign-bench-checkouts"))


def commit_of(rev: str) -> str:
    """The full hash of the commit ``rev`` names."""
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def shared_env(checkout: Path) -> dict[str, str]:
    """The environment of a child that imports ``checkout``'s dupalign and tests."""
    return dict(os.environ, PYTHONPATH=str(checkout),
                DUPALIGN_SHARED=os.environ.get("DUPALIGN_SHARED", str(REPO.parent / "shared")))


def warm_kernels_in(checkout: Path) -> bool:
    """Compile ``checkout``'s numba kernels into its cache with its own warm-up module
    (``python -m tests.warm_kernels``, its dupalign imported); False when it has none."""
    if not (checkout / "tests" / "warm_kernels.py").is_file():
        return False
    subprocess.run([sys.executable, "-m", "tests.warm_kernels"], cwd=checkout,
                   env=shared_env(checkout), check=True, capture_output=True)
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (two benchmarks that want one checkout make it once)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # (closing the file releases the lock)


def _checked_out(tree: Path, sha: str) -> bool:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], check=False,
                         capture_output=True, text=True)
    return tree.is_dir() and out.returncode == 0 and out.stdout.strip() == sha and (
        tree / "dupalign").is_dir()


def warm_checkout(rev: str, root: Path = CHECKOUTS,
                  warm: Callable[[Path], bool] = warm_kernels_in) -> Path:
    """``rev`` checked out at ``root/<commit>`` (a detached git worktree, kept: a second run
    finds it, its kernel cache filled) and warmed (``warm``) once, before any timing."""
    sha = commit_of(rev)
    root.mkdir(parents=True, exist_ok=True)
    tree, warmed = root / sha, root / f"{sha}.warmed"
    with _locked(root / f"{sha}.lock"):
        if not _checked_out(tree, sha):
            shutil.rmtree(tree, ignore_errors=True)
            warmed.unlink(missing_ok=True)
            subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False,
                           capture_output=True)
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree),
                            sha], check=True, capture_output=True)
        if not warmed.exists():
            done = warm(tree)
            warmed.write_text("tests.warm_kernels\n" if done else "no warm-up module\n")
    return tree


@contextlib.contextmanager
def baseline_checkout(given: Path | None, rev: str) -> Iterator[Path]:
    """``given``, or else ``rev`` checked out in a temporary git worktree (removed after)."""
    if given is not None:
        yield given
        return
    tree = Path(tempfile.mkdtemp(prefix="bench-baseline-")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                   check=True, capture_output=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       check=False, capture_output=True)
        shutil.rmtree(tree.parent, ignore_errors=True)


def run_in(checkout: Path, script: Path, *args: str) -> dict[str, Any]:
    """``script`` with ``args`` in a child process that imports ``checkout``'s dupalign; its
    last stdout line, a JSON object whose ``module`` (``dupalign.__file__``) proves it. The
    shared test data is the one beside this checkout (a temporary worktree has none)."""
    res = subprocess.run([sys.executable, str(script), *args], env=shared_env(checkout),
                         cwd=str(checkout),
                         check=True, capture_output=True, text=True)
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    if not str(out["module"]).startswith(str(checkout)):
        raise SystemExit(f"{checkout}: imported {out['module']} instead")
    return out
