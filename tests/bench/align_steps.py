"""Where the align stage's CPU goes in a real run: both releases of a corpus
(tests.corpora.DOCS_CORPORA) as extracted text through one default engine, the stages one
after the other as ``bench_scan``'s ``--jobs 1`` run has them, with the align stage's
steps wrapped by thread-CPU timers: the candidates' forward records read from the store
and their lists gathered (``Tasks.gather``), the viability cut, the empty windows gathered,
the interval scan, the hits' unions, the ranking and spans (of which span refinement's
kernel), the earlier pages' positions records and ids read from the store. Prints CPU ms a
page per step and the work counts a page (tasks, candidates, hits).

    python -m tests.bench.align_steps --corpus boost [--limit N]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.passage import batch_align, span_refine
from dupalign.passage.tasks import Tasks
from dupalign.runtime.engine import Engine
from dupalign.stages import align
from tests.bench.align_replay import config
from tests.bench.bench_scan import load_pages, main_text, warm_up
from tests.corpora import LLVM_DOCS

SPENT: dict[str, float] = {}
CALLS: Counter[str] = Counter()


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] = SPENT.get(name, 0.0) + time.thread_time() - c0
            CALLS[name] += 1
    return wrapper


def _wrap(owner: Any, attr: str, name: str) -> None:
    setattr(owner, attr, _timed(name, getattr(owner, attr)))


def instrument() -> None:
    """Timers around the align stage's steps (the module attributes the stage calls)."""
    _wrap(align.Aligner, "align_ranked", "align (all)")
    _wrap(Tasks, "gather", "gather lists (store read + decode)")
    _wrap(align.Aligner, "read_forward", "  of which store windows read")
    _wrap(batch_align, "viable_tasks", "viable_tasks")
    _wrap(Tasks, "gather_empty", "gather_empty")
    _wrap(batch_align, "scan_tasks", "scan_tasks")
    _wrap(align, "union_hits", "union_hits")
    _wrap(align, "ranked_spans", "ranked_spans (rank + spans)")
    _wrap(span_refine, "refine_pages", "  of which refine_pages")
    _wrap(align.Aligner, "_positions", "  of which positions read")
    _wrap(align.Aligner, "_doc_id", "doc ids read")


def run(corpus: str, limit: int | None) -> None:
    old, new = load_pages(LLVM_DOCS, limit, corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    cfg = config()
    work: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(pages, cfg, Path(tmp) / "s")
        instrument()
        with Engine.open(Path(tmp) / "s", cfg) as engine:
            for page in pages:
                sk = engine.sketch(page)
                result = engine.indexer.index(sk, defer=True)
                if result.align is not None:
                    t = result.align.tasks
                    work["requests"] += 1
                    work["tasks"] += len(t)
                    work["candidates"] += len(np.unique(t.t_o))
                    work["passages"] += len(result.align.starts)
                found = engine.align(result)
                work["pages matched"] += len(found)
                with contextlib.suppress(PageRejected):
                    engine.indexer.finish(result, found)
            c = engine.aligner.counters
    n = len(pages)
    print(f"{corpus}: {n} pages, {work['requests']} align requests; counters {c}")
    print(f"{'step':44} {'CPU ms a page':>14} {'calls':>8}")
    for name, s in SPENT.items():
        print(f"{name:44} {1000 * s / n:14.3f} {CALLS[name]:8d}")
    for key, v in work.items():
        print(f"  {key}: {v} ({v / max(1, work['requests']):.1f} a request)")
    print(f"  hits: {c.hits} ({c.hits / max(1, c.tasks):.1f} a task)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="boost")
    ap.add_argument("--limit", type=int, default=None, help="pages per release")
    args = ap.parse_args()
    run(args.corpus, args.limit)


if __name__ == "__main__":
    main()
