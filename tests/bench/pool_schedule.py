"""What ``--jobs 2`` could reach on two idle cores, from each page's stage CPU: a model of
the pipeline's schedule, independent of the machine's load.

First the default engine runs the corpus's text one page at a time (``Engine.process``'s
stages by hand), each stage timed in CPU (``time.thread_time``): sketch, index (with
``finish``), align, and, for a request ``align_parts`` splits, each part's
``Aligner.align_ranked`` timed apart (aligned a second time, aside). Then a replay of
``run_pipeline``'s policy with those costs, on a calling thread and one pool worker: chunks
of 4 sketches submitted up to ``depth`` pages ahead, the index and finish in order on the
calling thread, each alignment (or each part) a pool call, and the calling thread taking
back, whenever it would wait, the work no worker has started (the awaited call's, else the
earliest alignment, else the earliest chunk); the hand-over's CPU per page (``--caller-ms``,
``--worker-ms``: from tests/bench/pool_costs.py) added to each side. The list file built at
close runs after the rest: whole on the calling thread, or split in two (one part each).

Prints ``--jobs 1`` (the stages' sum) against the modelled ``--jobs 2``, whole and in parts,
and how long each core waits. A model: no RocksDB background threads, no cache effects, no
GIL; the costs are the recording's, measured on a loaded machine alike for all rows.

    python -m tests.bench.pool_schedule [--corpus llvm|boost] [--depth 64] [--windows 64,256]
        [--keep FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from dupalign.config import EngineConfig, TextConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime import pipeline
from dupalign.runtime.engine import Engine
from tests.bench.bench_scan import load_pages, main_text, staged_page, warm_up
from tests.corpora import DOCS_CORPORA, LLVM_DOCS


@dataclass
class Costs:
    """One page's CPU seconds by stage (``parts``: its alignment's parts, when split)."""

    sketch: float
    index: float = 0.0
    align: float | None = None  # None: no alignment
    tasks: int = 0
    parts: dict[int, list[float]] = field(default_factory=dict)  # at most N parts: theirs


def record(pages: list[Page], store: Path, most: tuple[int, ...]) -> tuple[list[Costs], float]:
    """Each page's costs, and the CPU of the close (the last list file, built here)."""
    config = EngineConfig(text=TextConfig(main_content=True)).validate()
    warm_up(pages, config, store)
    out = []
    with Engine.open(store, config) as engine:
        for page in pages:
            c0 = time.thread_time()
            try:
                staged = staged_page(engine, page)
            except PageRejected:
                out.append(Costs(time.thread_time() - c0))
                continue
            costs = Costs(staged.cpu["sketch"], staged.cpu["index"])
            result = staged.result
            if result.align is not None:
                costs.align, costs.tasks = staged.cpu["align"], len(result.align.tasks.t_o)
                for k in most:
                    parts = pipeline.align_parts(result.align, k)
                    for part in parts if len(parts) > 1 else []:
                        p0 = time.thread_time()
                        engine.aligner.align_ranked(part)
                        costs.parts.setdefault(k, []).append(time.thread_time() - p0)
            out.append(costs)
        c0 = time.thread_time()
        if engine.passages.pending is not None:
            engine.passages.pending.drain(into_file=True)
        close = time.thread_time() - c0
    return out, close


@dataclass
class _Call:
    cost: float
    submitted: float
    start: float | None = None  # on the worker
    done: float | None = None  # (on either side)
    taken: bool = False


class _Worker:
    """One pool process: its calls in submission order, each run once it is free."""

    def __init__(self) -> None:
        self.queue: deque[_Call] = deque()
        self.free_at = 0.0
        self.busy = 0.0

    def advance(self, until: float) -> None:
        """Start every call it would have started by ``until``."""
        while self.queue:
            call = self.queue[0]
            if call.taken:
                self.queue.popleft()
                continue
            start = max(self.free_at, call.submitted)
            if start > until:
                return
            self.queue.popleft()
            call.start, call.done = start, start + call.cost
            self.free_at = call.done
            self.busy += call.cost


def simulate(pages: list[Costs], split: tuple[int, int] | None, depth: int, caller_s: float,
             worker_s: float, window: int | None = None, chunk: int = pipeline.SKETCH_CHUNK
             ) -> tuple[float, float, float]:
    """The modelled wall seconds of ``run_pipeline`` with ``jobs=2``, and the seconds the
    calling thread and the worker were idle; ``split``: (at most N parts, from T tasks) the
    requests of T tasks or more aligned in their recorded N parts; ``window``: pages
    indexed and not finished at most (``depth`` if None), ``depth``: pages submitted and
    not indexed."""
    window = window or depth
    worker = _Worker()
    t = 0.0
    caller_idle = 0.0
    sketches: deque[tuple[int, _Call]] = deque()
    chunks: deque[_Call] = deque()
    aligns: deque[list[_Call]] = deque()
    ahead = 0

    def submit(cost: float) -> _Call:
        call = _Call(cost, t)
        worker.queue.append(call)
        return call

    def steal(waited: _Call) -> bool:
        """Take back and run here one call no worker has started (False: none, or
        ``waited`` is done)."""
        nonlocal t
        worker.advance(t)
        if waited.done is not None and waited.done <= t:
            return False
        for call in [waited, *(c for calls in aligns for c in calls), *chunks]:
            if call.start is None and call.done is None:
                call.taken = True
                t += call.cost
                call.done = t
                return True
        return False

    def wait(call: _Call) -> None:
        nonlocal t, caller_idle
        while steal(call):
            pass
        assert call.done is not None  # (else it was there to take)
        if call.done > t:  # the worker runs it: nothing else starts meanwhile
            caller_idle += call.done - t
            t = call.done

    def finish() -> None:
        for call in aligns.popleft():
            wait(call)

    while True:
        while ahead < len(pages) and len(sketches) + chunk <= depth:
            batch = list(range(ahead, min(ahead + chunk, len(pages))))
            ahead += len(batch)
            call = submit(sum(pages[x].sketch + worker_s / 2 for x in batch))
            chunks.append(call)
            sketches.extend((x, call) for x in batch)
        worker.advance(t)
        while aligns and all(c.done is not None and c.done <= t for c in aligns[0]):
            aligns.popleft()
        if not sketches:
            if not aligns:
                break
            finish()
            continue
        if len(aligns) >= window:
            finish()
            continue
        x, call = sketches.popleft()
        wait(call)
        if not sketches or sketches[0][1] is not call:
            with contextlib.suppress(ValueError):
                chunks.remove(call)
        page = pages[x]
        t += page.index + caller_s
        calls = []
        if page.align is not None:
            costs = [page.align]
            if split is not None and page.tasks >= split[1] and page.parts.get(split[0]):
                costs = page.parts[split[0]]
            calls = [submit(c + worker_s / 2 / len(costs)) for c in costs]
        aligns.append(calls)
    worker.advance(float("inf"))
    return t, caller_idle, t - worker.busy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="llvm")
    ap.add_argument("--depth", type=int, default=pipeline.DEPTH)
    ap.add_argument("--windows", default="64,256",
                    help="pages indexed and not finished at most, each modelled")
    ap.add_argument("--keep", type=Path, help="the recording: read if there, else written")
    ap.add_argument("--caller-ms", type=float, default=0.45,
                    help="the hand-over's CPU a page on the calling thread")
    ap.add_argument("--worker-ms", type=float, default=0.55,
                    help="the hand-over's CPU a page in the pool's process")
    ap.add_argument("--limit", type=int, default=None, help="pages per release (default all)")
    args = ap.parse_args()
    old, new = load_pages(LLVM_DOCS, args.limit, args.corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    tmp = Path(tempfile.mkdtemp(prefix="pool-schedule-"))
    try:
        print(f"{args.corpus}: {len(pages)} pages from text, load {os.getloadavg()[0]:.1f}; "
              "recording each page's stage CPU", flush=True)
        if args.keep is not None and args.keep.exists():
            costs, close = pickle.loads(args.keep.read_bytes())
        else:
            costs, close = record(pages, tmp / "store", (2, 4))
            if args.keep is not None:
                args.keep.write_bytes(pickle.dumps((costs, close)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n = len(costs)
    one = sum(c.sketch + c.index + (c.align or 0.0) for c in costs)
    aligned = sorted((c.align for c in costs if c.align is not None), reverse=True)
    top = max(1, len(costs) // 100)
    split = [c for c in costs if c.parts.get(4)]
    parts_ratio = sum(sum(c.parts[4]) for c in split) / max(sum(c.align or 0 for c in split),
                                                            1e-9)
    print(f"--jobs 1: {one:.2f} s + close {close:.2f} s ({(one + close) / n * 1e3:.2f} ms a "
          f"page); align {sum(aligned):.2f} s, its longest {aligned[0] * 1e3:.0f} ms, the "
          f"top 1 % of pages ({top}) {sum(aligned[:top]) / max(sum(aligned), 1e-9):.0%} of it; "
          f"{len(split)} requests split in up to 4, their parts {parts_ratio:.2f}x the whole's "
          "CPU")
    caller_s, worker_s = args.caller_ms / 1e3, args.worker_ms / 1e3
    print(f"modelled --jobs 2 (sketches {args.depth} pages ahead, hand-over {args.caller_ms} + "
          f"{args.worker_ms} ms a page):")
    shapes: list[tuple[str, tuple[int, int] | None]] = [("whole alignments", None)] + [
        (f"parts: up to {k}, from {t} tasks", (k, t)) for k in (2, 4) for t in (512, 1024, 2048)]
    for window in (int(w) for w in args.windows.split(",")):
        for label, split_as in shapes:
            wall, idle_c, idle_w = simulate(costs, split_as, args.depth, caller_s, worker_s,
                                            window)
            print(f"  window {window:>4}: {label:<28} close on one core "
                  f"{(one + close) / (wall + close):.2f}x --jobs 1, close split "
                  f"{(one + close) / (wall + close / 2):.2f}x; idle: calling thread "
                  f"{idle_c:.2f} s, worker {idle_w:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
