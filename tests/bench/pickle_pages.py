"""What the process pool's pickling costs a page, by message: a page's sketch (in chunks as
``sketch_chunk_in_worker`` returns them), its align request and its answer, over real pages
(the extracted text of a docs corpus, each page sketched, indexed, aligned and finished by one
engine, in order). Per page: pickle.dumps + pickle.loads CPU µs (best of a few passes over all
messages), bytes, and numpy arrays in the pickle.

    python -m tests.bench.pickle_pages [--corpus llvm|boost] [--limit N]
"""

from __future__ import annotations

import argparse
import copy
import io
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dupalign.config import EngineConfig, TextConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.runtime.pipeline import SKETCH_CHUNK
from tests.bench.bench_scan import load_pages, main_text
from tests.corpora import DOCS_CORPORA, LLVM_DOCS


class _Counter(pickle.Pickler):
    """Counts the numpy arrays a pickle holds."""

    arrays = 0

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            self.arrays += 1
        return NotImplemented


def arrays_in(obj: Any) -> int:
    p = _Counter(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
    p.dump(obj)
    return p.arrays


def messages(pages: list[Page], store: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """Each page's sketch, its align requests and their answers."""
    sketches, requests, answers = [], [], []
    with Engine.open(str(store), EngineConfig(text=TextConfig(main_content=True))) as engine:
        for page in pages:
            sk = engine.sketch(page)
            sketches.append(sk)
            result = engine.index(sk, defer=True)
            if result.align is not None:  # as submitted: before align gathers its tasks
                requests.append(copy.deepcopy(result.align))
            found = engine.align(result)
            if result.align is not None:
                answers.append(found)
            engine.finish(result, found)
    return sketches, requests, answers


def cost(objs: list[Any], passes: int = 5) -> tuple[float, float, int]:
    """Seconds to dump and to load all of ``objs`` (best pass each), and their bytes."""
    best_d = best_l = float("inf")
    size = 0
    for _ in range(passes):
        t0 = time.thread_time()
        data = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in objs]
        t1 = time.thread_time()
        for d in data:
            pickle.loads(d)
        t2 = time.thread_time()
        best_d, best_l = min(best_d, t1 - t0), min(best_l, t2 - t1)
        size = sum(len(d) for d in data)
    return best_d, best_l, size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="llvm")
    ap.add_argument("--docs", type=Path, default=LLVM_DOCS)
    ap.add_argument("--limit", type=int, default=300, help="pages per release")
    args = ap.parse_args()
    old, new = load_pages(args.docs, args.limit, args.corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    with tempfile.TemporaryDirectory(prefix="pickle-pages-") as tmp:
        sketches, requests, answers = messages(pages, Path(tmp) / "store")
    n = len(pages)
    chunks = [sketches[x:x + SKETCH_CHUNK] for x in range(0, n, SKETCH_CHUNK)]
    print(f"{args.corpus}: {n} pages, {len(requests)} align requests; per page of all {n}:")
    print(f"{'message':<22}{'dumps µs':>9}{'loads µs':>9}{'both µs':>9}{'bytes':>8}"
          f"{'arrays':>8}")
    total = 0.0
    for label, objs in (("sketch chunks", chunks), ("sketches one by one", sketches),
                        ("align requests", requests), ("align answers", answers)):
        d, lo, size = cost(objs)
        arrays = sum(arrays_in(o) for o in objs)
        if label != "sketches one by one":
            total += d + lo
        print(f"{label:<22}{d / n * 1e6:9.1f}{lo / n * 1e6:9.1f}{(d + lo) / n * 1e6:9.1f}"
              f"{size / n:8.0f}{arrays / n:8.1f}")
    print(f"chunks + requests + answers: {total / n * 1e6:.1f} µs a page")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
