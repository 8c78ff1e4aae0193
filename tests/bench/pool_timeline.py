"""Diagnostic: when the pool of ``--jobs N`` is idle, and what the calling thread does then.

Runs the staged engine (``run_pipeline``) on llvm-13-doc vs llvm-14-doc with ``--jobs N``
and records, with one monotonic clock for every process, each call a pool process runs
(a chunk of sketches, an alignment) and, in the calling thread, each ``index`` and each
piece of work it takes back from the pool (``_run_here``). Prints how busy the pool
processes were, their idle time by the length of the idle gap, and what the calling
thread was doing during it; and how much of the idle time the pool's next call had
already been submitted (``submit`` is timed too). (The pipeline's functions are wrapped
from here, before the pool forks: nothing in the engine knows about it.)

    python -m tests.bench.pool_timeline [--only html|text] [--jobs 2] [--limit N]
"""

from __future__ import annotations

import collections
import functools
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dupalign.config import EngineConfig, TextConfig
from dupalign.runtime import pipeline
from dupalign.runtime.engine import Engine
from tests.bench.bench_pool import arguments, page_forms
from tests.bench.bench_scan import warm_up

Event = tuple[float, float, int, str]  # start, end, the work's key (a pool call's, and
# its submission's: -1 for others), what
GAPS_MS = (1, 5, 20)  # idle gaps are counted by length: < 1 ms, < 5 ms, < 20 ms, longer


def _record(where: Path, what: str, start: float, key: int = -1) -> None:
    with open(where / str(os.getpid()), "a") as fh:
        fh.write(f"{start!r} {time.perf_counter()!r} {key} {what}\n")


def _key(fn: Any, arg: Any) -> int:
    """A pool call's key: its first page's id (a chunk of sketches) or its page's ordinal
    (an alignment)."""
    name = getattr(fn, "__name__", "")
    if name == "sketch_chunk_in_worker":
        return zlib.crc32(arg[0].id.encode("utf-8"))
    return 1 << 40 | int(getattr(arg, "ordinal", 0)) if name == "align_in_worker" else -1


def _traced(where: Path, what: str | Callable[[tuple[Any, ...]], str],
            fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)  # (same name: the pool pickles the function by its name)
    def traced(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _record(where, what(args) if callable(what) else what, start,
                    _key(fn, args[0]) if args else -1)
    return traced


def _traced_submit(where: Path, submit: Callable[..., Any]) -> Callable[..., Any]:
    """The pool's ``submit``, noting when each pool call was submitted."""
    def traced(fn: Any, *args: Any, **kwargs: Any) -> Any:
        _record(where, "submit", time.perf_counter(), _key(fn, args[0]))
        return submit(fn, *args, **kwargs)
    return traced


def _taken_back(work: Any) -> str:
    fn = getattr(work, "func", work)  # a functools.partial
    return {"_sketch_here": "sketches taken back", "align": "alignments taken back"}.get(
        getattr(fn, "__name__", ""), "other work taken back")


def trace(where: Path) -> None:
    """Wrap the pool's calls and the calling thread's index and taken-back work."""
    pipeline.sketch_chunk_in_worker = _traced(
        where, "pool: sketches", pipeline.sketch_chunk_in_worker)
    pipeline.align_in_worker = _traced(
        where, "pool: alignments", pipeline.align_in_worker)
    pipeline._run_here = _traced(
        where, lambda args: _taken_back(args[0]), pipeline._run_here)
    Engine.index = _traced(where, "index", Engine.index)  # type: ignore[method-assign]


def events(where: Path) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = {}
    for f in where.iterdir():
        rows = (line.split(" ", 3) for line in f.read_text().splitlines())
        out[int(f.name)] = sorted((float(a), float(b), int(k), w) for a, b, k, w in rows)
    return out


def idle_gaps(busy: list[Event], t0: float, t1: float) -> list[tuple[float, float]]:
    """The stretches of [t0, t1] covered by none of ``busy`` (sorted by start)."""
    gaps, at = [], t0
    for start, end, _, _ in busy:
        if start > at:
            gaps.append((at, min(start, t1)))
        at = max(at, end)
    if at < t1:
        gaps.append((at, t1))
    return gaps


def _by_size(seconds: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(seconds.items(), key=lambda item: -item[1])


def report(form: str, evs: dict[int, list[Event]], caller: int, t0: float, t1: float) -> None:
    wall = t1 - t0
    mine = [e for e in evs.get(caller, []) if e[0] >= t0 and e[3] != "submit"]
    submitted = {e[2]: e[0] for e in evs.get(caller, []) if e[3] == "submit"}
    handover: list[float] = []  # per pool call: idle while it was submitted, not started
    print(f"\n{form}: {wall:.2f} s wall")
    doing: dict[str, float] = collections.defaultdict(float)  # seconds
    gap_len: dict[str, float] = collections.defaultdict(float)
    for pid, rows in sorted(evs.items()):
        if pid == caller:
            continue
        rows = [e for e in rows if e[0] >= t0]
        spent: dict[str, float] = collections.defaultdict(float)
        for start, end, _, what in rows:
            spent[what] += end - start
        print(f"  pool process {pid}: busy {sum(spent.values()) / wall:.0%} of the wall time ("
              + ", ".join(f"{w[6:]} {s / wall:.0%}" for w, s in sorted(spent.items())) + ")")
        free_at = t0
        for start, end, key, _ in rows:
            if key in submitted and start > free_at:
                handover.append(start - max(submitted[key], free_at))
            free_at = max(free_at, end)
        for g0, g1 in idle_gaps(rows, t0, t1):
            ms = (g1 - g0) * 1e3
            gap_len[next((f"< {b} ms" for b in GAPS_MS if ms < b), f">= {GAPS_MS[-1]} ms")] += (
                g1 - g0)
            covered = 0.0
            for start, end, _, what in mine:
                overlap = min(end, g1) - max(start, g0)
                if overlap > 0:
                    doing[what] += overlap
                    covered += overlap
            doing["waiting, bookkeeping"] += (g1 - g0) - covered
    idle = sum(gap_len.values())
    labels = [f"< {b} ms" for b in GAPS_MS] + [f">= {GAPS_MS[-1]} ms"]
    spent = collections.defaultdict(float)
    for start, end, _, what in mine:
        spent[what] += end - start
    print("  calling thread: " + ", ".join(f"{w} {s / wall:.0%}" for w, s in _by_size(spent))
          + " of the wall time")
    if idle:
        print(f"  pool idle {idle:.2f} s; by the length of the idle stretch: "
              + ", ".join(f"{k} {gap_len[k] / idle:.0%}" for k in labels if k in gap_len))
        print("  the calling thread meanwhile: "
              + ", ".join(f"{w} {s / idle:.0%}" for w, s in _by_size(doing)))
    if idle and handover:
        waits = sorted(handover)
        print(f"  pool idle with its next call already submitted: {sum(waits):.2f} s "
              f"({sum(waits) / idle:.0%} of its idle time), over {len(waits)} calls; median "
              f"{waits[len(waits) // 2] * 1e3:.2f} ms, 90th percentile "
              f"{waits[len(waits) * 9 // 10] * 1e3:.2f} ms, longest {waits[-1] * 1e3:.1f} ms")


def main() -> int:
    args = arguments(__doc__)
    n_pages, forms = page_forms(args)
    tmp = Path(tempfile.mkdtemp(prefix="pool-timeline-"))
    try:
        print(f"{n_pages} llvm pages, --jobs {args.jobs}")
        for form, make_pages in forms.items():
            pages = make_pages()
            config = EngineConfig(text=TextConfig(main_content=True)).validate()
            warm_up(pages, config, tmp / f"{form}-store")
            where = tmp / f"{form}-events"
            where.mkdir()
            saved = (pipeline.sketch_chunk_in_worker, pipeline.align_in_worker,
                     pipeline._run_here, Engine.index)
            trace(where)
            try:
                with Engine.open(tmp / f"{form}-store", config) as engine:
                    pool = engine.worker_pool("process", args.jobs - 1)  # forks: traced
                    pool.executor.submit = _traced_submit(  # type: ignore[method-assign]
                        where, pool.executor.submit)
                    t0 = time.perf_counter()
                    for _ in pipeline.run_pipeline(engine.stages(), ((p, None) for p in pages),
                                                   args.jobs):
                        pass
                    t1 = time.perf_counter()
            finally:
                (pipeline.sketch_chunk_in_worker, pipeline.align_in_worker,
                 pipeline._run_here, Engine.index) = saved  # type: ignore[method-assign]
            report(form, events(where), os.getpid(), t0, t1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
