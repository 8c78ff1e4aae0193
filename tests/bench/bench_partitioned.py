"""The partitioned pipeline in one process (``scan --partitions``,
dupalign.stages.partitioned) against the single engine (``Engine.process``: ``scan --jobs
1``) on the same pages, in the same run: CPU per page of the whole, and per stage of the
pipeline, with the matches checked identical (the run fails at the first difference).

Each pass runs the engine, then the pipeline at every ``--shapes`` (fresh stores each
time), one after the other; several passes alternate them, so that the machine's load
falls on all alike. Kernels load in a throwaway run of each first.

CPU per page: ``time.thread_time`` of the calling thread around each ``process`` call and
the closing of the stores (the engine's last list files are built at its close), and
``time.process_time`` of the whole run (RocksDB's background threads too). The pipeline's
stages are timed inside the same runs: every stage object's entry points (``decide``,
``apply``, ``route``, ``finish``, ``align``...), every ``Ledger.apply``, and the wire
codecs ``Partitioned.process`` calls (``to_bytes``/``from_bytes`` of each message, by
message), are wrapped from here; time is exclusive (a codec called inside a stage is the
codec's, not the stage's), so the rows add up to the whole. ``other``: the pipeline's own
glue and the clocks' own cost. The engine's stages are its ``last_report``'s (sketch,
index, align).

Corpora: ``llvm``/``boost`` (both releases' HTML, as bench_scan: tests.corpora.DOCS_CORPORA)
or ``synthetic`` (tests/stages/test_exact.py ``corpus_items``: the 5,000-page synthetic
stream, the RFCs and Clough with new versions, deletes and a sweep every 500 pages), with
the default engine.

    python -m tests.bench.bench_partitioned [--corpus llvm|boost|synthetic] [--limit N]
        [--passes 3] [--shapes "1,1,1,1,1;2,2,4,3,2"] [--profile SHAPE]

A shape with ``+behind`` (``2,2,4,3,2+behind``) has its list shards write their entries
behind, in list files (``PassageIndex.write_lists_behind``), as the single engine does,
rather than in each page's batch as a list shard does (so that a role can roll back a page
and note every change in its changelog): what that choice costs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dupalign.stages.partitioned as partitioned_module
from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.directory import Decision, DirectoryEntry
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.list_shard import ListPartial, ListWindows
from dupalign.stages.messages import AlignRequest
from dupalign.stages.near_shard import NearOps
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.stages.sketch import PageSketch
from tests.corpora import DOCS_CORPORA, LLVM_DOCS, docs_releases

Sweep = tuple[int, int, int]  # max_pages, max_age_s, now_ms
Item = Page | Sweep
Outcome = list[dict[str, Any]] | tuple[str, str]
WARM_UP = 30
MESSAGES = (PageSketch, DirectoryEntry, Decision, ExactAnswer, NearOps, ListWindows,
            ListPartial, AlignRequest)


class Clock:
    """Exclusive ``thread_time`` per label of nested timed calls, and their counts."""

    def __init__(self) -> None:
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.calls: defaultdict[str, int] = defaultdict(int)
        self._stack: list[list[Any]] = []  # [label, time of its last resumption]

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._enter(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self._leave()
        return timed

    def _enter(self, label: str) -> None:
        now = time.thread_time()
        if self._stack:
            top = self._stack[-1]
            self.spent[top[0]] += now - top[1]
        self._stack.append([label, now])
        self.calls[label] += 1

    def _leave(self) -> None:
        now = time.thread_time()
        label, since = self._stack.pop()
        self.spent[label] += now - since
        if self._stack:
            self._stack[-1][1] = now


@contextlib.contextmanager
def patched(owner: Any, name: str, clock: Clock, label: str) -> Iterator[None]:
    """``owner.name`` timed as ``label`` (a class's method, classmethod or staticmethod, or
    an instance's or a module's attribute), restored after."""
    raw = owner.__dict__[name] if name in vars(owner) else None
    if isinstance(raw, classmethod):
        setattr(owner, name, classmethod(clock.wrap(label, raw.__func__)))
    elif isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(clock.wrap(label, raw.__func__)))
    else:
        setattr(owner, name, clock.wrap(label, getattr(owner, name)))
    try:
        yield
    finally:
        if raw is None:
            delattr(owner, name)  # (an instance's bound method: the class's again)
        else:
            setattr(owner, name, raw)


def instrument(p: Partitioned, clock: Clock, stack: contextlib.ExitStack) -> None:
    """Every stage call and wire codec of ``p`` timed into ``clock``."""
    def on(owner: Any, name: str, label: str) -> None:
        stack.enter_context(patched(owner, name, clock, label))

    for cls in MESSAGES:
        for name in ("to_bytes", "from_bytes"):
            on(cls, name, f"wire {cls.__name__}.{name}")
    for name in ("answer_to_bytes", "answer_from_bytes"):
        on(partitioned_module, name, f"wire NearAnswer {name}")
    for name in ("entry_of", "list_windows"):  # (the sketch role's split of its output)
        on(partitioned_module, name, f"sketch {name}")
    on(p.sketcher, "sketch", "sketch")
    on(p.dir_ledger, "apply", "ledger")
    for shard in p.dirs:
        on(shard, "decide", "directory")
    for role, pairs in (("exact", p.exacts), ("router", p.routers), ("lists", p.lists),
                        ("combine", p.combines)):
        for stage, ledger in pairs:
            on(ledger, "apply", "ledger")
            on(stage, {"router": "route"}.get(role, "apply"), role)
    for router, _ in p.routers:
        on(router, "forget", "sweep")
    for combine, _ in p.combines:
        on(combine, "finish", "combine")
    for near in p.nears:
        on(near, "apply", "near")
    on(p.forward_ledger, "apply", "ledger")
    on(p.forward, "apply", "forward")
    on(p.aligner, "align", "align")
    on(p, "sweep", "sweep")


# -- the runs -----------------------------------------------------------------------------
class Run:
    """One run's outcomes, CPU (thread, process) and stage CPU, in seconds."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.outcomes: list[Outcome] = []
        self.thread = self.process = 0.0
        self.stages: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.gc = 0  # the collector's runs of its oldest generation

    def measure(self) -> Callable[[], None]:
        """Starts the clocks; the returned function stops them."""
        t0, p0, g0 = time.thread_time(), time.process_time(), gc.get_stats()[2]["collections"]

        def stop() -> None:
            self.thread, self.process = time.thread_time() - t0, time.process_time() - p0
            self.gc = gc.get_stats()[2]["collections"] - g0
        return stop


def _outcome(process: Callable[[Page], list[Any]], page: Page) -> Outcome:
    try:
        return [m.to_dict() for m in process(page)]
    except PageRejected as exc:
        return (exc.reason, exc.detail)


def run_engine(items: list[Item], config: EngineConfig, root: Path) -> Run:
    run, stages = Run("engine"), dict.fromkeys(("sketch", "index", "align", "sweep"), 0.0)
    stop = run.measure()
    engine = Engine.open(root / "engine", config)
    try:
        for item in items:
            if isinstance(item, Page):
                before = engine.last_report
                run.outcomes.append(_outcome(engine.process, item))
                r = engine.last_report
                if r is not before:  # (a page rejected by its sketch reports nothing)
                    stages["sketch"] += r.cpu_sketch
                    stages["index"] += r.cpu_index
                    stages["align"] += r.cpu_align
            else:
                c0 = time.thread_time()
                while expired := engine.expired(*item, 1000):
                    engine.indexer.remove(expired)
                stages["sweep"] += time.thread_time() - c0
    finally:
        c0 = time.thread_time()
        engine.close()
        stages["close"] = time.thread_time() - c0
    stop()
    run.stages = stages
    return run


def run_partitioned(items: list[Item], config: EngineConfig, shape: Shape, root: Path,
                    behind: bool = False) -> Run:
    """``behind``: the list shards keep their new entries pending in memory and write them
    in list files, as the single engine does (``PassageIndex.write_lists_behind``), not in
    each page's batch."""
    run, clock = Run(label_of(shape, behind)), Clock()
    stop = run.measure()
    with Partitioned.open(root / run.label, config, shape) as p, \
            contextlib.ExitStack() as stack:
        instrument(p, clock, stack)
        if behind:
            for lists, _ in p.lists:
                lists.passages.write_lists_behind()
        process = clock.wrap("other", p.process)
        for item in items:
            if isinstance(item, Page):
                run.outcomes.append(_outcome(process, item))
            else:
                p.sweep(*item)
        c0 = time.thread_time()
        for lists, _ in p.lists:
            if lists.passages.pending is not None:  # (as Engine.close)
                lists.passages.pending.drain(into_file=True)
    run.stages = dict(clock.spent)
    run.stages["close"] = time.thread_time() - c0
    run.calls = dict(clock.calls)
    stop()
    return run


def profile(items: list[Item], config: EngineConfig, shape: Shape, root: Path) -> None:
    """cProfile of the pipeline (no clocks) at ``shape``, the top 40 by own time."""
    prof = cProfile.Profile()
    with Partitioned.open(root, config, shape) as p:
        prof.enable()
        for item in items:
            if isinstance(item, Page):
                with contextlib.suppress(PageRejected):
                    p.process(item)
            else:
                p.sweep(*item)
        prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(40)


def label_of(shape: Shape, behind: bool = False) -> str:
    return ",".join(str(n) for n in (shape.directory, shape.exact, shape.near, shape.lists,
                                     shape.combine, shape.router)) + (" behind" if behind else "")


def parse_shape(text: str) -> tuple[Shape, bool]:
    """``D,E,P,S,C[,R]``, ``+behind``: the list shards write their entries behind."""
    shape, _, flag = text.partition("+")
    if flag not in ("", "behind"):
        raise ValueError(f"shape {text!r}: only +behind after the counts")
    return Shape.parse(shape), flag == "behind"


def same_matches(want: Run, got: Run) -> None:
    """SystemExit at the first page whose outcome differs."""
    if len(want.outcomes) != len(got.outcomes):
        sys.exit(f"{got.label}: {len(got.outcomes)} outcomes, the engine "
                 f"{len(want.outcomes)}")
    for i, (w, g) in enumerate(zip(want.outcomes, got.outcomes, strict=True)):
        if w != g:
            sys.exit(f"{got.label}: page {i} differs from the engine's:\n{g}\nengine:\n{w}")


# -- the corpora --------------------------------------------------------------------------
def load(corpus: str, limit: int | None) -> list[Item]:
    if corpus == "synthetic":
        from tests.stages.test_exact import corpus_items

        items: list[Item] = []
        for step, item in corpus_items():
            items.append(item if isinstance(item, Page) else (*item, step * 1000))
        return items[:limit]
    old, new = docs_releases(corpus, LLVM_DOCS, limit)
    return [*old, *new]


def warm(items: list[Item], config: EngineConfig, shape: Shape, root: Path) -> None:
    """The kernels loaded and the code paths run once, in throwaway stores."""
    pages = [i for i in items if isinstance(i, Page)][:WARM_UP]
    run_engine(list(pages), config, root / "warm-engine")
    run_partitioned(list(pages), config, shape, root / "warm-partitioned")


# -- the table ----------------------------------------------------------------------------
def ms(seconds: float, pages: int) -> str:
    return f"{1000 * seconds / pages:.2f}"


def report(runs: dict[str, list[Run]], pages: int) -> None:
    engine = runs["engine"]
    print(f"\nCPU per page (ms), {pages} pages, median of {len(engine)} passes "
          "[each pass's value]")
    print("| run | thread CPU | process CPU | thread / engine | process / engine | gen-2 GCs |")
    print("|---|---|---|---|---|---|")
    for label, rs in runs.items():
        th = [r.thread for r in rs]
        pr = [r.process for r in rs]
        ratio_t = [r.thread / e.thread for r, e in zip(rs, engine, strict=True)]
        ratio_p = [r.process / e.process for r, e in zip(rs, engine, strict=True)]
        name = "engine (scan --jobs 1)" if label == "engine" else f"partitioned {label}"
        print(f"| {name} | {ms(statistics.median(th), pages)} "
              f"[{' '.join(ms(t, pages) for t in th)}] | {ms(statistics.median(pr), pages)} "
              f"| {statistics.median(ratio_t):.2f} [{' '.join(f'{x:.2f}' for x in ratio_t)}]"
              f" | {statistics.median(ratio_p):.2f} | {statistics.median(r.gc for r in rs)} |")
    side_by_side(runs, pages)
    for label, rs in runs.items():
        if label == "engine":
            continue
        whole = statistics.median(r.thread for r in rs)
        keys = sorted({k for r in rs for k in r.stages},
                      key=lambda k: -statistics.median(r.stages.get(k, 0.0) for r in rs))
        print(f"\nPartitioned {label}: stage CPU (thread, exclusive), median ms/page, share "
              "of the whole, calls/page, cores at 1,000 and 10,000 pages/s")
        print("| stage | ms/page | share | calls/page | cores @1k | cores @10k |")
        print("|---|---|---|---|---|---|")
        for k in keys:
            s = statistics.median(r.stages.get(k, 0.0) for r in rs)
            per_page = s / pages
            print(f"| {k} | {1000 * per_page:.3f} | {s / whole:.1%} "
                  f"| {rs[0].calls.get(k, 0) / pages:.2f} | {1000 * per_page:.2f} "
                  f"| {10000 * per_page:.1f} |")


ENGINE_STAGES = ("sketch", "align", "sweep", "close")  # the pipeline's rows of these names


def engine_part(r: Run, label: str, stage: str) -> float:
    """Run ``r``'s CPU in the engine's ``stage``: the pipeline's stage of that name, or
    for ``index`` all its stages but those (wire codecs, ledgers and glue included)."""
    if label == "engine" or stage in ENGINE_STAGES:
        return r.stages.get(stage, 0.0)
    return sum(v for k, v in r.stages.items() if k not in ENGINE_STAGES)


def side_by_side(runs: dict[str, list[Run]], pages: int) -> None:
    """The engine's stages next to the pipeline's stages that do their work."""
    labels = list(runs)
    print("\nBy the engine's stages: ms/page, median (the engine's ``last_report``; the "
          "pipeline's index = every stage but sketch and align)")
    print("| stage | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for stage in ("sketch", "index", "align", "sweep", "close"):
        cells = [ms(statistics.median(engine_part(r, label, stage) for r in runs[label]), pages)
                 for label in labels]
        print(f"| {stage} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=[*DOCS_CORPORA, "synthetic"], default="llvm")
    ap.add_argument("--limit", type=int, default=None,
                    help="pages per release (synthetic: items of the stream); default all")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--shapes", default="1,1,1,1,1;2,2,4,3,2")
    ap.add_argument("--profile", metavar="SHAPE", default=None,
                    help="then cProfile the pipeline at SHAPE (untimed), top 40 to stderr")
    args = ap.parse_args()
    config = EngineConfig().validate()
    shapes = [parse_shape(s) for s in args.shapes.split(";")]
    items = load(args.corpus, args.limit)
    pages = sum(isinstance(i, Page) for i in items)
    runs: dict[str, list[Run]] = {"engine": [], **{label_of(*s): [] for s in shapes}}
    kinds: dict[str, int] = {}
    root = Path(tempfile.mkdtemp(prefix="bench-partitioned-"))
    try:
        warm(items, config, shapes[0][0], root)
        for n in range(args.passes):
            want = run_engine(items, config, root / f"pass{n}")
            runs["engine"].append(want)
            print(f"pass {n}: engine {ms(want.thread, pages)} ms/page", file=sys.stderr)
            for shape, behind in shapes:
                got = run_partitioned(items, config, shape, root / f"pass{n}", behind)
                same_matches(want, got)
                got.outcomes = []
                runs[got.label].append(got)
                print(f"pass {n}: {got.label} {ms(got.thread, pages)} ms/page, same "
                      "matches", file=sys.stderr)
            if n == 0:
                for found in want.outcomes:
                    for m in found if isinstance(found, list) else []:
                        kinds[m["kind"]] = kinds.get(m["kind"], 0) + 1
            want.outcomes = []
            shutil.rmtree(root / f"pass{n}")
        if args.profile:
            profile(items, config, Shape.parse(args.profile), root / "profile")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"corpus {args.corpus}, {pages} pages ({len(items) - pages} sweeps), "
          f"limit {args.limit}, default engine; matches identical in every run: "
          + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    report(runs, pages)


if __name__ == "__main__":
    main()
