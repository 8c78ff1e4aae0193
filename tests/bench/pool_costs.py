"""Where the pool's hand-over CPU goes: ``--jobs 1`` against ``--jobs N`` on processes and
on threads, from the extracted text of a docs corpus, with the pool's own pieces timed.

CPU a page of each run, all of it (the calling thread, the calling process's other threads,
the pool processes), and for the process pool the CPU (``time.thread_time``) inside each of
its hand-over pieces, by side: pickling calls and results (``pickle.dumps``/``loads`` as
``dupalign.runtime.pool`` calls them) with their bytes, the files in /dev/shm (``_message``
writes one when the data is over its limit, ``_unspill`` reads and removes it), the
calling side's pipe work (``_flush``, ``_read``, ``_pump``), and in the workers the stages
themselves (``sketch_chunk_in_worker``, ``align_in_worker``) and the secondary instance's
catch-ups (``Store.catch_up``: work ``--jobs 1`` never does). Times of nested pieces are
inclusive (``_read`` includes the result ``loads`` and ``_unspill``). The pieces are
wrapped from here before the pool forks; nothing in the engine knows about it.

    python -m tests.bench.pool_costs [--corpus llvm|boost] [--jobs 2] [--limit N]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import resource
import shutil
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dupalign.config import EngineConfig, TextConfig
from dupalign.page import Page
from dupalign.runtime import pipeline, pool
from dupalign.runtime.engine import Engine
from dupalign.runtime.pipeline import ExecutorKind, Stages, run_pipeline
from dupalign.stages.align import Aligner
from dupalign.store.database import Store
from tests.bench.bench_pool import _rusage
from tests.bench.bench_scan import load_pages, main_text, warm_up
from tests.corpora import DOCS_CORPORA, LLVM_DOCS

# per process: piece -> [CPU seconds, calls, bytes]
_costs: collections.defaultdict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0])


def _timed(name: str, fn: Callable[..., Any], measure: bool = False) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c0 = time.thread_time()
        out = fn(*args, **kwargs)
        cost = _costs[name]
        cost[0] += time.thread_time() - c0
        cost[1] += 1
        if measure:
            cost[2] += (len(out) if isinstance(out, bytes | bytearray) else
                        sum(len(v or b"") for v in out) if isinstance(out, list) else
                        len(args[0]))
        return out
    return wrapper


def instrument(where: list[Path]) -> None:
    """Wrap the pool's pieces (in this process, and so in the workers it forks); a worker
    writes its costs into the directory ``where[0]`` when it ends."""
    pool.pickle = types.SimpleNamespace(  # type: ignore[assignment]
        dumps=_timed("pickle.dumps", pickle.dumps, True),
        loads=_timed("pickle.loads", pickle.loads, True),
        HIGHEST_PROTOCOL=pickle.HIGHEST_PROTOCOL)
    pool._message = _timed("shm/pipe message (write)", pool._message)
    pool._unspill = _timed("shm file read+unlink", pool._unspill)
    pool._read_exact = _timed("task pipe read", pool._read_exact)
    pool._SlotFiles.read = _timed("shm slot read", pool._SlotFiles.read)  # type: ignore
    pool._SlotFiles.write = _timed("shm slot write", pool._SlotFiles.write)  # type: ignore
    for name in ("_flush", "_read", "_pump"):
        setattr(pool.ProcessPool, name, _timed(name, getattr(pool.ProcessPool, name)))
    pool.ProcessPool.submit = _timed("submit", pool.ProcessPool.submit)  # type: ignore
    Store.catch_up = _timed("secondary catch_up", Store.catch_up)  # type: ignore
    Aligner.read_forward = _timed("forward records read", Aligner.read_forward,  # type: ignore
                                  True)
    pipeline.sketch_chunk_in_worker = _timed("sketch chunk (work)",
                                             pipeline.sketch_chunk_in_worker)
    pipeline.align_in_worker = _timed("align (work)", pipeline.align_in_worker)
    pipeline._run_here = _timed("taken back (work here)", pipeline._run_here)
    serve = pool._serve

    def serve_and_report(*args: Any) -> None:
        _costs.clear()
        c0 = time.process_time()
        try:
            serve(*args)
        finally:
            _costs["worker process (all)"] = [time.process_time() - c0, 1, 0]
            (where[0] / f"w{os.getpid()}.json").write_text(json.dumps(dict(_costs)))
    pool._serve = serve_and_report


def _wrapped(stages: Stages) -> Stages:
    """``stages`` with its calling-side stages timed."""
    return dataclasses.replace(stages, **{name: _timed(f"{name} (here)", getattr(stages, name))
                                          for name in ("sketch", "index", "align", "finish")})


def run(pages: list[Page], jobs: int, store: Path, executor: ExecutorKind, slots: bool = True
        ) -> tuple[dict[str, float], dict[str, list[float]], tuple[int, str]]:
    """CPU seconds a page (the calling thread, the process's other threads, the workers),
    the costs of the timed pieces in this process, and the matches (how many, a digest of
    every page's answer in order: identical whatever the jobs). ``slots=False``: every spilled
    message in a file made for it and removed once read (the pool before its slot files)."""
    pool._SLOT_BYTES = (1 << 20) if slots else 0
    config = EngineConfig(text=TextConfig(main_content=True)).validate()
    warm_up(pages, config, store)
    kids0 = _rusage(resource.RUSAGE_CHILDREN)
    _costs.clear()
    digest, matches = hashlib.sha256(), 0
    with Engine.open(store, config) as engine:
        t0, p0, c0 = time.perf_counter(), _rusage(resource.RUSAGE_SELF), time.thread_time()
        for page, found in run_pipeline(_wrapped(engine.stages()), ((p, None) for p in pages), jobs,
                              executor=executor):
            answer = [dataclasses.replace(m, engine={}) for m in found] if isinstance(
                found, list) else type(found).__name__
            digest.update(f"{page.id} {answer!r}\n".encode())
            matches += len(found) if isinstance(found, list) else 0
            if jobs == 1:  # (Engine.process: its own CPU a stage)
                r = engine.last_report
                for name, cpu in (("sketch (here)", r.cpu_sketch), ("align (here)", r.cpu_align),
                                  ("index+finish (here)", r.cpu_index)):
                    _costs[name][0] += cpu
                    _costs[name][1] += 1
        thread = time.thread_time() - c0
        if engine.passages.pending is not None:
            engine.passages.pending.drain(into_file=True)
    wall, process = time.perf_counter() - t0, _rusage(resource.RUSAGE_SELF) - p0
    kids = _rusage(resource.RUSAGE_CHILDREN) - kids0
    n = len(pages)
    return ({"wall": wall / n, "thread": thread / n, "others": (process - thread) / n,
             "workers": kids / n}, dict(_costs), (matches, digest.hexdigest()[:16]))


def show(costs: dict[str, list[float]], n: int, side: str) -> None:
    for name, (cpu, calls, size) in sorted(costs.items(), key=lambda kv: -kv[1][0]):
        extra = f"  {size / max(calls, 1) / 1e3:8.1f} KB a call" if size else ""
        print(f"  {side:<8}{name:<30}{cpu / n * 1e3:8.3f} ms a page  {calls:>7} calls{extra}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="llvm")
    ap.add_argument("--docs", type=Path, default=LLVM_DOCS)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="pages per release (default all)")
    args = ap.parse_args()
    old, new = load_pages(args.docs, args.limit, args.corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    n = len(pages)
    tmp = Path(tempfile.mkdtemp(prefix="pool-costs-"))
    try:
        print(f"{args.corpus}: {n} pages from text, load {os.getloadavg()[0]:.2f}; "
              f"CPU ms a page", flush=True)
        where = [tmp]
        instrument(where)
        rows = []
        for label, jobs, kind, slots in (
                ("1", 1, "process", True), (f"{args.jobs} threads", args.jobs, "thread", True),
                (f"{args.jobs} processes", args.jobs, "process", True),
                (f"{args.jobs} proc. no slots", args.jobs, "process", False)):
            where[0] = tmp / label.replace(" ", "-")
            where[0].mkdir()
            rows.append((label, *run(pages, jobs, where[0] / "store", kind, slots)))
        print(f"{'jobs':<17}{'pages/s':>8}{'thread':>8}{'others':>8}{'workers':>9}"
              f"{'all CPU':>9}{'- jobs 1':>9}  matches")
        base = sum(rows[0][1][k] for k in ("thread", "others", "workers"))
        for label, r, _, found in rows:
            cpu = r["thread"] + r["others"] + r["workers"]
            print(f"{label:<17}{1 / r['wall']:8.1f}{r['thread'] * 1e3:8.2f}"
                  f"{r['others'] * 1e3:8.2f}{r['workers'] * 1e3:9.2f}{cpu * 1e3:9.2f}"
                  f"{(cpu - base) * 1e3:9.2f}  {found[0]} ({found[1]})")
        same = len({found for *_, found in rows}) == 1
        print(f"matches identical in every run: {'yes' if same else 'NO'}")
        print(f"end load {os.getloadavg()[0]:.2f}")
        for label, _, costs, _ in rows:
            print(f"pieces of jobs {label}:")
            show(costs, n, "caller")
            for f in sorted((tmp / label.replace(" ", "-")).glob("w*.json")):
                show(json.loads(f.read_text()), n, "worker")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
