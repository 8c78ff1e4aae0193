"""This checkout's align stage against another revision's ``dupalign/stages/align.py`` on a
run's recorded requests (``align_replay record``), in one process: each request aligned by
both, alternating which goes first, thread CPU summed per side, and every request's ranked
pages (keys and spans) compared. The other revision's module is loaded from git beside
this one and runs on this checkout's kernels: it measures a change to the stage's own
code (Python and the calls it makes), not to the kernels.

    python -m tests.bench.align_ab R [--ref main] [--limit N]
"""

from __future__ import annotations

import argparse
import importlib.util
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from dupalign.stages.align import Aligner
from dupalign.stages.messages import AlignRequest
from tests.bench.align_replay import config

REPO = Path(__file__).resolve().parents[2]


def module_at(ref: str, tmp: Path) -> ModuleType:
    """``dupalign/stages/align.py`` as of ``ref``, imported as a module of its own."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:dupalign/stages/align.py"],
                            check=True, capture_output=True, text=True).stdout
    path = tmp / "align_at_ref.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("align_at_ref", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["align_at_ref"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--ref", default="main")
    ap.add_argument("--limit", type=int, default=None, help="requests")
    args = ap.parse_args()
    requests = pickle.loads(args.path.read_bytes())[0][:args.limit]
    cfg = config()
    with tempfile.TemporaryDirectory() as tmp:
        old = module_at(args.ref, Path(tmp)).Aligner(cfg)
    new = Aligner(cfg)
    for al in (old, new):  # (kernels loaded before any clock)
        al.align_ranked(AlignRequest.from_bytes(requests[0][0]))
    cpu = {id(old): 0.0, id(new): 0.0}
    differ = 0
    for n, (raw, _) in enumerate(requests):
        got = {}
        for al in (old, new) if n % 2 else (new, old):
            req = AlignRequest.from_bytes(raw)
            c0 = time.thread_time()
            got[id(al)] = [(p.ordinal, p.covered, p.best_est, p.spans, p.doc_id)
                           for p in al.align_ranked(req)]
            cpu[id(al)] += time.thread_time() - c0
        differ += got[id(old)] != got[id(new)]
    print(f"{len(requests)} requests: align CPU {args.ref} {cpu[id(old)]:.2f} s, this checkout "
          f"{cpu[id(new)]:.2f} s ({cpu[id(new)] / cpu[id(old)]:.3f}×); requests whose ranked "
          f"pages differ: {differ}")


if __name__ == "__main__":
    main()
