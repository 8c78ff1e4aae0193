"""Where the CPU of ``--jobs N`` goes: the staged engine (``Engine.process_many``) on
llvm-13-doc vs llvm-14-doc with ``--jobs 1`` and ``--jobs N``, side by side in one run;
``--jobs N`` twice: as it runs (N - 1 pool processes, the calling thread taking back
the work it would wait for) and in the shape before (N pool processes, a calling thread
that only indexes and waits: ``run_pipeline(caller_works=False)``).

Per page: wall time; CPU of the calling thread (index, finish, the pool's bookkeeping),
of the calling process's other threads (RocksDB's flushes and compactions, the pool's
feeder and result threads) and of the pool's worker processes (sketch, align, pickling,
their secondary instances' catch-ups). Then the best ``--jobs N`` could do on N idle
cores if all its CPU spread evenly (total CPU / N, and never less than the calling
thread's), and the ratio to ``--jobs 1`` that bound allows against the one measured:
how much is lost to the pool's extra CPU, how much to imbalance.

    python -m tests.bench.bench_pool [--only html|text] [--jobs 2] [--limit N]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dupalign.config import EngineConfig, TextConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.runtime.pipeline import run_pipeline
from tests.bench.bench_scan import load_pages, main_text, warm_up
from tests.corpora import LLVM_DOCS


def _rusage(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run(pages: list[Page], jobs: int, store: Path, caller_works: bool = True
        ) -> dict[str, float]:
    """Seconds per page of wall time and of CPU by where it ran."""
    config = EngineConfig(text=TextConfig(main_content=True)).validate()
    warm_up(pages, config, store)
    kids0 = _rusage(resource.RUSAGE_CHILDREN)
    with Engine.open(store, config) as engine:
        t0, p0, c0 = time.perf_counter(), _rusage(resource.RUSAGE_SELF), time.thread_time()
        for _ in run_pipeline(engine.stages(), ((p, None) for p in pages), jobs,
                              caller_works=caller_works):
            pass
        if engine.passages.pending is not None:  # (the last pages' list entries, as at close)
            engine.passages.pending.drain(into_file=True)
        wall, thread = time.perf_counter() - t0, time.thread_time() - c0
        process = _rusage(resource.RUSAGE_SELF) - p0
    # the pool's processes have ended with the engine: their CPU is the children's
    kids = _rusage(resource.RUSAGE_CHILDREN) - kids0
    n = len(pages)
    return {"wall": wall / n, "thread": thread / n, "others": (process - thread) / n,
            "workers": kids / n}


def arguments(doc: str) -> argparse.Namespace:
    """The options of the pool benchmarks (this one and pool_timeline)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--docs", type=Path, default=LLVM_DOCS)
    ap.add_argument("--only", choices=["html", "text"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="pages per release (default all)")
    return ap.parse_args()


def page_forms(args: argparse.Namespace) -> tuple[int, dict[str, Callable[[], list[Page]]]]:
    """The number of llvm pages, and the pages as HTML and as their extracted text
    (extracted only when asked for): the forms ``--only`` selects."""
    old, new = load_pages(args.docs, args.limit)
    html = old + new
    forms = {"html": lambda: html,
             "text": lambda: [Page(id=p.id, body=main_text(p), content_type="text/plain")
                              for p in html]}
    return len(html), {form: make for form, make in forms.items() if args.only in (None, form)}


def main() -> int:
    args = arguments(__doc__)
    n_pages, forms = page_forms(args)
    tmp = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    try:
        print(f"{n_pages} llvm pages; ms per page\n")
        print(f"{'input':<6}{'jobs':>9}{'wall':>8}{'calling thread':>16}{'other threads':>15}"
              f"{'workers':>9}{'all CPU':>9}{'bound':>8}{'ratio':>7}{'bound ratio':>13}")
        for form, make_pages in forms.items():
            pages = make_pages()
            one = run(pages, 1, tmp / f"{form}-1")
            many = run(pages, args.jobs, tmp / f"{form}-{args.jobs}")
            before = run(pages, args.jobs, tmp / f"{form}-{args.jobs}-before", False)
            for jobs, label, r in ((1, "1", one), (args.jobs, str(args.jobs), many),
                                   (args.jobs, f"{args.jobs} (old)", before)):
                cpu = r["thread"] + r["others"] + r["workers"]
                bound = max(cpu / jobs, r["thread"]) if jobs > 1 else r["wall"]
                print(f"{form:<6}{label:>9}{r['wall'] * 1e3:8.2f}{r['thread'] * 1e3:16.2f}"
                      f"{r['others'] * 1e3:15.2f}{r['workers'] * 1e3:9.2f}{cpu * 1e3:9.2f}"
                      f"{bound * 1e3:8.2f}{one['wall'] / r['wall']:7.2f}x"
                      f"{one['wall'] / bound:12.2f}x")
            # the CPU of --jobs 1 spread over the cores: what a pool without costs of its
            # own would allow at best
            free = (one["thread"] + one["others"]) / args.jobs
            print(f"{'':<11}a pool without costs of its own: {free * 1e3:.2f} ms per page, "
                  f"{one['wall'] / free:.2f}x --jobs 1 at best")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
