"""What the topology's align requests carry and cost on templated pages: llvm-13-doc then
llvm-14-doc as extracted text, through one engine, every page with passage tasks turned
into the request the index role sends (``Indexer.with_forward(...).to_bytes(forward=True)``).

Prints, per request: its size, how many exceed the record limit (the index role aligns
those itself), the bytes of each field, and the CPU of building it with the candidates'
forward records read afresh against through the index's record cache, side by side.

    python -m tests.bench.bench_align_requests [--limit N] [--record-limit BYTES]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dupalign.config import EngineConfig, TextConfig
from dupalign.engine import Engine
from dupalign.errors import PageRejected
from dupalign.index import AlignRequest
from dupalign.page import Page
from tests.bench.bench_scan import load_pages, main_text, warm_up
from tests.corpora import LLVM_DOCS


def _size(value: Any) -> int:
    if isinstance(value, bytes | bytearray | str):
        return len(value)
    if isinstance(value, list):
        return sum(_size(v) for v in value)
    return 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=Path, default=LLVM_DOCS)
    ap.add_argument("--limit", type=int, default=None, help="pages per release (default all)")
    ap.add_argument("--record-limit", type=int, default=1 << 20,
                    help="kafka.max_request_size (default 1 MiB, the worker's default)")
    args = ap.parse_args()
    a, b = load_pages(args.docs, args.limit)
    pages = [Page(id=p.id, body=main_text(p).encode(), content_type="text/plain")
             for p in a + b]
    config = EngineConfig(text=TextConfig(main_content=True)).validate()
    fields: Counter[str] = Counter()
    cpu = {"read afresh": 0.0, "record cache": 0.0}
    n = over = size = tasks = candidates = 0
    with tempfile.TemporaryDirectory() as d:
        warm_up(pages, config, Path(d) / "s")
        with Engine.open(Path(d) / "s", config) as engine:
            ix = engine.indexer
            cache = ix.forward_records
            for page in pages:
                try:
                    result = ix.index(engine.sketch(page), defer=True)
                except PageRejected:
                    continue
                if result.align is not None:
                    named = result.align.to_bytes(forward=False)
                    # the same request both ways, in turn first (the first warms what
                    # both read)
                    for label in list(cpu)[::1 if n % 2 else -1]:
                        ix.forward_records = cache if label == "record cache" else None
                        t0 = time.thread_time()
                        request = ix.with_forward(AlignRequest.from_bytes(named))
                        raw = request.to_bytes(forward=True)
                        cpu[label] += time.thread_time() - t0
                    ix.forward_records = cache
                    for key, value in request.to_dict(forward=True).items():
                        fields[key] += _size(value)
                    n += 1
                    size += len(raw)
                    over += len(raw) > args.record_limit
                    tasks += len(request.tasks)
                    candidates += len(request.others)
                with contextlib.suppress(PageRejected):
                    ix.finish(result, engine.align(result))
    if not n:
        print("no page had passage tasks")
        return 0
    print(f"{len(pages)} llvm pages (text), {n} align requests: {size / n / 1e3:,.1f} KB each "
          f"on average, {over} over {args.record_limit:,} bytes (aligned by the index role "
          f"itself); {candidates / n:.1f} candidate pages and {tasks / n:.0f} tasks each\n")
    print(f"{'field':<18}{'KB/request':>12}")
    for key, value in fields.most_common():
        if value / n >= 100:
            print(f"{key:<18}{value / n / 1e3:>12.1f}")
    print(f"\nCPU of with_forward + to_bytes, ms per request: read afresh "
          f"{cpu['read afresh'] / n * 1e3:.2f}, record cache {cpu['record cache'] / n * 1e3:.2f} "
          f"({cpu['record cache'] / cpu['read afresh']:.2f}x; {cache.hits} hits, "
          f"{cache.misses} misses)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
