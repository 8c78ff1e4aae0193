"""What the topology's align requests carry and cost on templated pages: llvm-13-doc then
llvm-14-doc as extracted text, through one engine, every page with passage tasks turned
into what the index role sends, side by side: the request carrying its candidates' forward
records (before align shards: ``Indexer.with_forward(...).to_bytes(forward=True)``) and the
parts of the request split by its candidates' owners among ``--parts`` align partitions
(``AlignRequest.split``, each ``to_bytes(forward=False)``), plus each stored page's forward
record (``pages.forward``, sent once per page).

Prints, per request: bytes, how many records exceed the record limit (the index role
aligns those pages itself), the bytes of each field of the old request, and the CPU of
building each.

    python -m tests.bench.bench_align_requests [--limit N] [--parts A] [--record-limit BYTES]
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
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.messages import AlignRequest
from dupalign.store.keys import u64
from dupalign.wire.forward_record import encode_forward
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
    ap.add_argument("--parts", type=int, default=4,
                    help="align partitions (default 4, kafka.align_partitions' default)")
    ap.add_argument("--record-limit", type=int, default=1 << 20,
                    help="kafka.max_request_size (default 1 MiB, the worker's default)")
    args = ap.parse_args()
    a, b = load_pages(args.docs, args.limit)
    pages = [Page(id=p.id, body=main_text(p).encode(), content_type="text/plain")
             for p in a + b]
    config = EngineConfig(text=TextConfig(main_content=True)).validate()
    fields: Counter[str] = Counter()
    cpu = {"carried": 0.0, "parts": 0.0}
    size = {"carried": 0, "parts": 0, "largest part": 0, "forward": 0}
    over = {"carried": 0, "parts": 0, "forward": 0}
    n = stored = n_parts = tasks = candidates = 0
    with tempfile.TemporaryDirectory() as d:
        warm_up(pages, config, Path(d) / "s")
        with Engine.open(Path(d) / "s", config) as engine:
            ix = engine.indexer
            for page in pages:
                try:
                    result = ix.index(engine.sketch(page), defer=True)
                except PageRejected:
                    continue
                if result.align is not None:
                    named = result.align.to_bytes(forward=False)
                    t0 = time.thread_time()
                    request = ix.with_forward(AlignRequest.from_bytes(named))
                    raw = request.to_bytes(forward=True)
                    t1 = time.thread_time()
                    parts = [r.to_bytes(forward=False) for r in
                             AlignRequest.from_bytes(named).split(args.parts).values()]
                    cpu["parts"] += time.thread_time() - t1
                    cpu["carried"] += t1 - t0
                    for key, value in request.to_dict(forward=True).items():
                        fields[key] += _size(value)
                    n += 1
                    n_parts += len(parts)
                    size["carried"] += len(raw)
                    size["parts"] += sum(map(len, parts))
                    size["largest part"] += max(map(len, parts))
                    over["carried"] += len(raw) > args.record_limit
                    over["parts"] += max(map(len, parts)) > args.record_limit
                    tasks += len(request.tasks)
                    candidates += len(request.others)
                with contextlib.suppress(PageRejected):
                    ix.finish(result, engine.align(result))
                if result.ordinal is not None:
                    windows = ix.store.get("forward", u64(result.ordinal))
                    positions = ix.store.get("positions", u64(result.ordinal))
                    if windows is not None and positions is not None:
                        record = encode_forward(page.id, windows, positions)
                        stored += 1
                        size["forward"] += len(record)
                        over["forward"] += len(record) > args.record_limit
    if not n:
        print("no page had passage tasks")
        return 0
    print(f"{len(pages)} llvm pages (text), {n} align requests: {candidates / n:.1f} candidate "
          f"pages and {tasks / n:.0f} tasks each; {args.parts} align partitions, "
          f"{n_parts / n:.2f} parts a request\n")
    print(f"{'sent':<44}{'KB each':>10}{'over ' + format(args.record_limit, ','):>18}"
          f"{'CPU ms each':>13}")
    print(f"{'request carrying its candidates (before)':<44}{size['carried'] / n / 1e3:>10,.1f}"
          f"{over['carried']:>18}{cpu['carried'] / n * 1e3:>13.2f}")
    print(f"{'request in parts, all parts (now)':<44}{size['parts'] / n / 1e3:>10,.1f}"
          f"{over['parts']:>18}{cpu['parts'] / n * 1e3:>13.2f}")
    print(f"{'  its largest part':<44}{size['largest part'] / n / 1e3:>10,.1f}")
    print(f"{'forward record, once per stored page (now)':<44}"
          f"{size['forward'] / max(stored, 1) / 1e3:>10,.1f}{over['forward']:>18}")
    print(f"\nper page of the stream: before {size['carried'] / len(pages) / 1e3:,.1f} KB, now "
          f"{(size['parts'] + size['forward']) / len(pages) / 1e3:,.1f} KB "
          f"({(size['parts'] + size['forward']) / size['carried']:.3f}x)\n")
    print(f"{'field of the request before':<28}{'KB/request':>12}")
    for key, value in fields.most_common():
        if value / n >= 100:
            print(f"{key:<28}{value / n / 1e3:>12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
