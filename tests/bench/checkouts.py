"""A baseline checkout for benchmarks that compare this one with another revision, and a
child process run in a checkout (its own ``dupalign`` imported, one JSON line printed)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


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
    env = dict(os.environ, PYTHONPATH=str(checkout),
               DUPALIGN_SHARED=os.environ.get("DUPALIGN_SHARED", str(REPO.parent / "shared")))
    res = subprocess.run([sys.executable, str(script), *args], env=env, cwd=str(checkout),
                         check=True, capture_output=True, text=True)
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    if not str(out["module"]).startswith(str(checkout)):
        raise SystemExit(f"{checkout}: imported {out['module']} instead")
    return out
