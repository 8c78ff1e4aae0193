"""The near-only engine's loop over a docs corpus's extracted text, for a profiler to watch
(issue #44): ``Engine.process`` page by page (``--one-by-one``, main's path) or
``Engine.process_many`` on one core (near-only pages in batches, dupalign.runtime.batched),
over ``--passes`` fresh stores after a warm-up on another. Prints the CPU ms a page of each
pass.

    py-spy record -r 500 --format raw -o OUT -- python -m tests.bench.near_loop --corpus boost
    python -m tests.bench.spy_summary OUT --under process_batch
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

from dupalign.config import EngineConfig, PassageConfig, TextConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from tests.bench.bench_scan import WARM_UP, load_pages, main_text
from tests.corpora import DOCS_CORPORA, LLVM_DOCS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="boost")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--one-by-one", action="store_true", help="Engine.process page by page")
    args = ap.parse_args()
    old, new = load_pages(LLVM_DOCS, None, args.corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    cfg = EngineConfig(text=TextConfig(main_content=True),
                       passage=PassageConfig(enabled=False)).validate()
    tmp = Path(tempfile.mkdtemp(prefix="near-loop-"))
    with Engine.open(tmp / "warm", cfg) as engine:  # (numba's cached kernels load here)
        for _ in engine.process_many(((p, None) for p in pages[:WARM_UP]), jobs=1):
            pass
        for page in pages[WARM_UP:2 * WARM_UP]:
            with contextlib.suppress(PageRejected):
                engine.process(page)
    for n in range(args.passes):
        c0 = time.process_time()
        with Engine.open(tmp / f"pass{n}", cfg) as engine:
            if args.one_by_one:
                for page in pages:
                    with contextlib.suppress(PageRejected):
                        engine.process(page)
            else:
                for _ in engine.process_many(((p, None) for p in pages), jobs=1):
                    pass
        print(f"pass {n}: {(time.process_time() - c0) / len(pages) * 1e3:.3f} CPU ms a page",
              flush=True)


if __name__ == "__main__":
    main()
