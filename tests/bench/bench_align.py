"""Passage-alignment kernels of this checkout next to a baseline checkout, on recorded inputs.

1. Record: ``Engine.process`` over two page streams, saving the arguments of every call of
   ``passage_align.select_candidates``, ``viable_tasks`` and ``scan_tasks`` (only the list
   entries a call can read are kept): the llvm-13 + llvm-14 documentation (main content, the
   default config, passages on) and the synthetic scale stream of bench_passages (near
   disabled). Recordings are cached under ``--cache`` (``--record`` redoes them). A third
   stream, ``crawl``, is llvm's ``select_candidates`` calls with the ordinals spread over
   10^7 (as deep in a long crawl, where lists of copied text span its history).
2. Replay: the same recorded calls through the kernels of both checkouts, each in its own
   process (one ``dupalign`` per process), alternating baseline/ours ``--pairs`` times;
   CPU time of the replaying thread, the best of each process's ``--rounds`` rounds. The
   outputs' digests must be equal: the new kernels return identical results.
3. Threads: ``viable_tasks`` + ``scan_tasks`` over the llvm calls on one thread, then split
   over two threads (the kernels release the GIL): wall time ratio.
4. End to end (``--e2e``): ``dupalign scan`` of the llvm pages (JSON Lines, HTML bodies) with
   each checkout, pinned to one core (taskset), alternating ``--pairs`` times: pages/s.

The baseline defaults to ``main`` checked out in a temporary git worktree (removed after).

Run: .venv/bin/python -m tests.bench.bench_align [--baseline DIR | --baseline-rev REV]
     [--scale-pages N] [--rounds R] [--pairs P] [--e2e] [--record]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
KERNELS = ("select_candidates", "viable_tasks", "scan_tasks")
Calls = dict[str, list[tuple[Any, ...]]]  # kernel -> recorded argument tuples
CRAWL_SPREAD = 6_131  # the "crawl" stream: llvm's 1,631 pages' ordinals times this, ~10^7


# -- recording ------------------------------------------------------------------------------

def _compact_lists(args: tuple[Any, ...], at: int, rects: bool) -> tuple[Any, ...]:
    """Arguments with the list arrays (``n_before, start, ords``, then ``rects`` if given,
    from position ``at``) cut down to the entries the kernels read: rows
    ``[start[x], start[x] + n_before[x])``."""
    n_before, start, ords = args[at], args[at + 1], args[at + 2]
    new_start = np.cumsum(n_before) - n_before
    idx = np.repeat(start - new_start, n_before) + np.arange(int(n_before.sum()))
    out = list(args)
    out[at + 1], out[at + 2] = new_start.astype(np.int64), ords[idx]
    if rects:
        out[at + 3] = args[at + 3][idx]
    return tuple(out)


def record(pages: Any, config: Any) -> Calls:
    """Run the engine over ``pages`` and keep every kernel call's arguments."""
    from dupalign.errors import PageRejected
    from dupalign.passage import batch_align as passage_align
    from dupalign.runtime.engine import Engine

    calls: Calls = {k: [] for k in KERNELS}
    originals = {k: getattr(passage_align, k) for k in KERNELS}
    # where n_before, start, ords(, rects) are in each kernel's arguments
    list_at = {"select_candidates": (1, False), "viable_tasks": (3, True),
               "scan_tasks": (3, True)}

    def wrap(name: str) -> Any:
        def call(*args: Any) -> Any:
            calls[name].append(_compact_lists(args, *list_at[name]))
            return originals[name](*args)
        return call

    tmp = tempfile.mkdtemp(prefix="bench-align-")
    try:
        for k in KERNELS:
            setattr(passage_align, k, wrap(k))
        with Engine.open(Path(tmp) / "store", config) as engine:
            for page in pages:
                with contextlib.suppress(PageRejected):
                    engine.process(page)
    finally:
        for k in KERNELS:
            setattr(passage_align, k, originals[k])
        shutil.rmtree(tmp, ignore_errors=True)
    return calls


def llvm_pages(docs: Path) -> list[Any]:
    from tests.bench.bench_scan import load_pages

    old, new = load_pages(docs, None)
    return old + new


def recordings(cache: Path, docs: Path, scale_pages: int, again: bool) -> dict[str, Calls]:
    from dupalign.config import EngineConfig, NearConfig, TextConfig
    from dupalign.page import Page
    from tests.bench.bench_passages import page_stream

    out = {}
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("llvm", "scale"):
        path = cache / (f"{name}.pkl" if name == "llvm" else f"{name}-{scale_pages}.pkl")
        if again or not path.exists():
            t = time.perf_counter()
            if name == "llvm":
                calls = record(llvm_pages(docs),
                               EngineConfig(text=TextConfig(main_content=True)).validate())
            else:
                texts = page_stream(scale_pages, np.random.default_rng(5), True)
                calls = record((Page(id=f"p{x}", body=text) for x, (text, _) in
                                enumerate(texts)),
                               EngineConfig(near=NearConfig(enabled=False)).validate())
            with open(path, "wb") as fh:
                pickle.dump(calls, fh, protocol=pickle.HIGHEST_PROTOCOL)
            print(f"recorded {name} in {time.perf_counter() - t:.0f} s -> {path}", flush=True)
        with open(path, "rb") as fh:
            out[name] = pickle.load(fh)
    # the llvm candidate selections as at page 10^7 of a crawl: the same pages spread over
    # 10^7 ordinals (a list of text copied over a long crawl spans its whole history)
    crawl = {k: [] for k in KERNELS}
    for a in out["llvm"]["select_candidates"]:
        crawl["select_candidates"].append((*a[:3], a[3] * CRAWL_SPREAD + 7, a[4],
                                           a[5] * CRAWL_SPREAD + 7, *a[6:]))
    with open(cache / "crawl.pkl", "wb") as fh:
        pickle.dump(crawl, fh, protocol=pickle.HIGHEST_PROTOCOL)
    out["crawl"] = crawl
    return out


# -- replay (runs in a child process, against whichever dupalign is on sys.path) ------------

def _digest(result: Any, h: Any) -> None:
    for part in result if isinstance(result, tuple) else (result,):
        h.update(np.ascontiguousarray(part).tobytes() if isinstance(part, np.ndarray)
                 else repr(part).encode())


def replay(paths: list[Path], rounds: int) -> dict[str, Any]:
    """Per stream and kernel: calls, best CPU seconds over ``rounds``, output digest."""
    from dupalign.passage import batch_align as passage_align

    out: dict[str, Any] = {"module": passage_align.__file__}
    for path in paths:
        with open(path, "rb") as fh:
            calls: Calls = pickle.load(fh)
        for name in KERNELS:
            fn = getattr(passage_align, name)
            if calls[name]:
                fn(*calls[name][0])  # compile or load from the numba cache
            best = float("inf")
            h = hashlib.sha256()
            for r in range(rounds):
                t = time.thread_time()
                results = [fn(*a) for a in calls[name]]
                best = min(best, time.thread_time() - t)
                if r == 0:
                    for res in results:
                        _digest(res, h)
            out[f"{path.stem}/{name}"] = {"calls": len(calls[name]), "cpu": best,
                                          "digest": h.hexdigest()[:16]}
    return out


# -- threads --------------------------------------------------------------------------------

def thread_scaling(calls: Calls) -> dict[str, float]:
    """Wall seconds of viable_tasks + scan_tasks over the calls on 1 thread, split over 2
    threads, and split over 2 processes (the control: what the machine gives two workers
    that share nothing, on a machine shared with others); and the CPU seconds per wall
    second the 2 threads used."""
    import multiprocessing

    from dupalign.passage import batch_align as passage_align

    work = [(passage_align.viable_tasks, a) for a in calls["viable_tasks"]]
    work += [(passage_align.scan_tasks, a) for a in calls["scan_tasks"]]
    for fn, a in work[:1] + work[-1:]:
        fn(*a)

    def run(part: list[Any], cpu: list[float]) -> None:
        t = time.thread_time()
        for fn, a in part:
            fn(*a)
        cpu.append(time.thread_time() - t)

    t = time.perf_counter()
    run(work, [])
    out = {"1 thread": time.perf_counter() - t}
    def in_parallel(workers: list[Any]) -> float:
        t = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - t

    cpu: list[float] = []
    out["2 threads"] = in_parallel(
        [threading.Thread(target=run, args=(work[x::2], cpu)) for x in range(2)])
    out["thread cpu/wall"] = sum(cpu) / out["2 threads"]
    fork = multiprocessing.get_context("fork")
    out["2 processes"] = in_parallel(
        [fork.Process(target=run, args=(work[x::2], [])) for x in range(2)])
    # GIL probe, whatever the machine's load: a pure-Python thread counts while the kernels
    # run on another; if they held the GIL it would get CPU only between calls
    stop = threading.Event()
    probe: list[float] = []

    def count() -> None:
        t = time.thread_time()
        while not stop.is_set():
            pass
        probe.append(time.thread_time() - t)

    th = threading.Thread(target=count)
    th.start()
    kernel_cpu: list[float] = []
    run(work, kernel_cpu)
    stop.set()
    th.join()
    out["kernel cpu"], out["python cpu"] = kernel_cpu[0], probe[0]
    return out


# -- end to end -----------------------------------------------------------------------------

def write_jsonl(pages: list[Any], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for p in pages:
            fh.write(json.dumps({"id": p.id, "body": p.body.decode("utf-8", "replace"),
                                 "content_type": p.content_type}) + "\n")


def run_scan(checkout: Path, jsonl: Path, work: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``dupalign scan`` (default config, one core) and a digest of
    its matches."""
    store, out = work / "store", work / "out.jsonl"
    shutil.rmtree(store, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, "-m", "dupalign.service.cli", "scan", str(jsonl), "--store", str(store),
           "--out", str(out), "--quiet"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    before = os.times()
    t = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=str(checkout), check=True)
    wall = time.perf_counter() - t
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system)
    matches = sorted(json.dumps({k: v for k, v in json.loads(line).items()
                                 if not k.startswith("detected")}, sort_keys=True)
                     for line in out.read_text().splitlines())
    return wall, cpu, hashlib.sha256("\n".join(matches).encode()).hexdigest()[:16]


# -- main -----------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with")
    ap.add_argument("--baseline-rev", default="main",
                    help="else this revision, checked out in a temporary git worktree")
    ap.add_argument("--docs", type=Path, default=Path.home() / ".cache/dupalign-docs")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache/dupalign-bench-align")
    ap.add_argument("--scale-pages", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=2, help="baseline/ours alternations")
    ap.add_argument("--record", action="store_true", help="record the inputs again")
    ap.add_argument("--e2e", action="store_true", help="also dupalign scan end to end")
    ap.add_argument("--replay-worker", nargs="+", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay_worker:
        print(json.dumps(replay(args.replay_worker, args.rounds)))
        return 0

    recs = recordings(args.cache, args.docs, args.scale_pages, args.record)
    paths = [args.cache / "llvm.pkl", args.cache / f"scale-{args.scale_pages}.pkl",
             args.cache / "crawl.pkl"]
    # (here, not at the top: the child runs this file in the baseline checkout, which may
    # predate the module)
    from tests.bench.checkouts import baseline_checkout, run_in

    with baseline_checkout(args.baseline, args.baseline_rev) as baseline:
        sides: dict[str, list[dict[str, Any]]] = {"baseline": [], "ours": []}
        for _ in range(args.pairs):
            for side, checkout in (("baseline", baseline), ("ours", REPO)):
                sides[side].append(run_in(checkout, HERE, "--replay-worker", *map(str, paths),
                                          "--rounds", str(args.rounds)))
        pages = {"llvm": 0, "scale": args.scale_pages}
        pages["llvm"] = pages["crawl"] = len(llvm_pages(args.docs))
        print(f"\n## Kernels on recorded inputs: baseline {baseline} vs ours {REPO}; CPU ms of "
              f"the replaying thread, best of {args.rounds} rounds x {args.pairs} processes "
              "each, alternating")
        head = (f"{'stream':<6} {'kernel':<18} {'calls':>6} {'base ms/call':>12} "
                f"{'ours ms/call':>12} {'base ms/page':>12} {'ours ms/page':>12} "
                f"{'speed-up':>8} {'identical':>9}")
        print(head)
        print("-" * len(head))
        for key in sides["ours"][0]:
            if key == "module" or not sides["ours"][0][key]["calls"]:
                continue
            stream, name = key.split("/")[0].split("-")[0], key.split("/")[1]
            b = min(r[key]["cpu"] for r in sides["baseline"])
            o = min(r[key]["cpu"] for r in sides["ours"])
            n = sides["ours"][0][key]["calls"]
            same = {r[key]["digest"] for side in sides.values() for r in side}
            print(f"{stream:<6} {name:<18} {n:>6} {1e3 * b / max(n, 1):>12.3f} "
                  f"{1e3 * o / max(n, 1):>12.3f} {1e3 * b / pages[stream]:>12.3f} "
                  f"{1e3 * o / pages[stream]:>12.3f} {b / max(o, 1e-9):>7.2f}x "
                  f"{'yes' if len(same) == 1 else 'NO':>9}")
        ts = thread_scaling(recs["llvm"])
        print(f"\n## Threads (ours): viable_tasks + scan_tasks over the llvm calls, wall s: "
              f"1 thread {ts['1 thread']:.2f}, 2 threads {ts['2 threads']:.2f} "
              f"({ts['1 thread'] / ts['2 threads']:.2f}x; they used "
              f"{ts['thread cpu/wall']:.2f} CPU s per wall s), 2 processes (control) "
              f"{ts['2 processes']:.2f} ({ts['1 thread'] / ts['2 processes']:.2f}x); GIL "
              f"probe: a pure-Python thread got {ts['python cpu']:.2f} CPU s while the kernels "
              f"used {ts['kernel cpu']:.2f} on another thread")
        if args.e2e:
            end_to_end(baseline, args.docs, args.pairs)
    return 0


def end_to_end(baseline: Path, docs: Path, pairs: int) -> None:
    pages = llvm_pages(docs)
    work = Path(tempfile.mkdtemp(prefix="bench-align-e2e-"))
    try:
        jsonl = work / "llvm.jsonl"
        write_jsonl(pages, jsonl)
        warm = work / "warm.jsonl"
        write_jsonl(pages[:40], warm)
        for checkout in (baseline, REPO):  # numba compiles (or loads its cache) untimed
            run_scan(checkout, warm, work)
        runs: dict[str, list[tuple[float, float, str]]] = {"baseline": [], "ours": []}
        for _ in range(pairs):
            runs["baseline"].append(run_scan(baseline, jsonl, work))
            runs["ours"].append(run_scan(REPO, jsonl, work))
        print(f"\n## dupalign scan, llvm-13 then llvm-14 ({len(pages)} HTML pages, main content, "
              "passages on), taskset -c 0, alternating; pages/s by wall and by CPU time "
              "(start-up included), best run")
        head = f"{'checkout':<9} {'wall s':>7} {'CPU s':>7} {'pages/s':>8} {'pages/CPU s':>11} " \
               f"{'matches digest':>16}"
        print(head)
        print("-" * len(head))
        best = {}
        for side, rs in runs.items():
            wall = min(r[0] for r in rs)
            cpu = min(r[1] for r in rs)
            best[side] = (wall, cpu)
            print(f"{side:<9} {wall:>7.1f} {cpu:>7.1f} {len(pages) / wall:>8.1f} "
                  f"{len(pages) / cpu:>11.1f} {','.join(sorted({r[2] for r in rs})):>16}")
        print(f"ratio ours / baseline: {best['baseline'][0] / best['ours'][0]:.2f}x pages/s by "
              f"wall, {best['baseline'][1] / best['ours'][1]:.2f}x by CPU")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
