"""The staged engine on two releases of Debian docs, next to datasketch, rensa and main.

The same HTML documentation in two releases (Debian packages, unpacked by
../shared/scripts/fetch-debian-docs.sh into tests.corpora.LLVM_DOCS): ``--corpus llvm``
(llvm-13-doc, llvm-14-doc: the default, the corpus the engine was tuned on) or ``--corpus
boost`` (libboost1.74-doc, libboost1.81-doc: 7,709 pages not used for tuning); see
tests.corpora.DOCS_CORPORA. The earlier release's pages go first, then the later one's,
twice: from the HTML, and from the same extracted text given to every engine as text/plain
(engine against engine, the shared extraction left out).

Methods (pages/s over the whole stream, start-up excluded except the worker pool's; and
pages per CPU second of the run, worker processes included, which other work on a shared
machine disturbs less than wall time):
- dupalign default (near + passages) and near-only, ``--jobs 1`` (the three stages one
  after the other on one thread) and ``--jobs 2`` (one pool process and the calling
  thread), each in a process of its own (``run_staged_apart``), so that no run inherits
  the state the others leave in a process;
- ``main``: the single-threaded engine of a checkout of another revision (``--main-ref``,
  default ``main``) run as a subprocess on the same pages, so that the ratio to the old
  path is measured in the same run;
- ``--baseline-ref REV``: the ``--jobs 1`` staged runs of a checkout of an earlier staged
  engine (its own ``run_staged_one_core``, in a subprocess), with their stage CPU: what a
  change to one stage gained, measured side by side;
- both checkouts are kept by commit (tests.bench.checkouts ``warm_checkout``), their numba
  kernels compiled by their own ``tests.warm_kernels`` before any clock starts; a run
  that still compiles a kernel inside its clock is named under the table (WARNING);
- datasketch MinHashLSH and rensa RMinHashLSH: threshold 0.8, 128 permutations, as their
  users write them (tests.bench.scan_peers: regex words, Python word 5-shingles, timed as
  a whole with the MinHash and the LSH), each in a process of its own; from HTML they also
  pay our text extraction. From text, a second rensa row is the engine-only view: the
  shingles of our tokens made before its clock starts.
- every dupalign run's clock stops when its last page is stored and the store closed; the
  store write (the page's WriteBatch, its staging and RocksDB's write) is counted in the
  index stage and shown apart.

Truth: pairs (later-release page, earlier page) with word 5-shingle Jaccard ≥ 0.85 on the
extracted text. Recall: the fraction of later-release pages whose same-path earlier page
is such a pair that a method pairs with some earlier page of Jaccard ≥ 0.85 (so an exact
copy of another member of the page's exact-duplicate cluster counts as found); precision:
the fraction of reported pairs with Jaccard ≥ 0.85. Only exact and near matches count.

Then, from the ``--jobs 1`` runs: CPU per page of each stage (sketch, index with the
storing of matches, align), the index stage's share (the part that cannot run in
parallel), and the wire size of ``PageSketch`` and of the align tasks per page and per
token (per token of all pages): the tasks alone (the query page's passages and sketches'
lists, the candidates' ordinals: what the process pool receives, its workers reading the
candidates' forward records from the store), and the share of the candidate pages' forward
records that ``AlignRequest.to_bytes(forward=True)`` adds for an align stage without
store access (their windows in the lists, empty windows, ids and positions records).

Run: .venv/bin/python -m tests.bench.bench_scan [--corpus llvm|boost] [--limit N]
     [--only html|text] [--no-main] [--jobs 1,2] [--threads] [--baseline-ref REV]
     [--near-only] (the near-only runs and the peers, no default runs)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.match import Match
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.runtime.pipeline import ExecutorKind
from dupalign.stages.messages import AlignRequest, IndexResult
from dupalign.stages.sketch import PageSketch
from dupalign.text.tokens import page_text, tokenize
from tests.bench.checkouts import warm_checkout
from tests.bench.scan_peers import PEERS
from tests.corpora import DOCS_CORPORA, LLVM_DOCS, docs_releases

HERE = Path(__file__).resolve().parents[2]
SHINGLE = 5
TRUTH_J = 0.85
WARM_UP = 30  # pages processed into a throwaway store before each timed run
Pairs = set[tuple[str, str]]


@dataclass
class Run:
    label: str
    seconds: float
    pairs: Pairs
    cpu: float = float("nan")  # CPU seconds of the run, worker processes included
    kinds: dict[str, int] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)  # CPU seconds per stage
    wire: dict[str, int] = field(default_factory=dict)  # bytes per message kind, tokens
    compiled: list[str] = field(default_factory=list)  # kernels compiled inside the clock


def load_pages(docs: Path, limit: int | None, corpus: str = "llvm"
               ) -> tuple[list[Page], list[Page]]:
    """Both releases' HTML pages, ids ``<release>/<path>`` (fetched on first use)."""
    return docs_releases(corpus, docs, limit)


def shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + SHINGLE]) for i in range(max(0, len(tokens) - SHINGLE + 1))}


def jaccard(a: set[tuple[str, ...]], b: set[tuple[str, ...]]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def main_text(page: Page) -> str:
    """The page's main content (``text.main_content = true``, the engine's default): what
    every method and the truth see."""
    return page_text(page, main_content=True)


def cpu_now() -> float:
    """CPU seconds of this process and of its children that have ended."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(run: Callable[[], Run]) -> Run:
    c0 = cpu_now()
    out = run()
    if out.cpu != out.cpu:  # nan: not measured by the run itself
        out.cpu = cpu_now() - c0
    return out


def run_peer(peer: str, tokens: str, pages_file: Path) -> Run:
    """rensa or datasketch in a process of its own (tests.bench.scan_peers): ``user``, as
    its users write it; ``ours``, the engine-only view on the shingles of our tokens."""
    out = subprocess.run([sys.executable, "-m", "tests.bench.scan_peers", peer, tokens,
                          str(pages_file)], cwd=HERE, check=True, capture_output=True,
                         text=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    label = PEERS[peer][0] + (" (engine only: our shingles, untimed)" if tokens == "ours"
                              else "")
    return Run(label, d["seconds"], {(a, b) for a, b in d["pairs"]}, d["cpu"])


def _collect(found: Pairs, kinds: dict[str, int], matches: list[Match]) -> None:
    for m in matches:
        kinds[m.kind] = kinds.get(m.kind, 0) + 1
        if m.kind in ("exact", "near"):
            found.add((m.doc_id, m.match_doc_id))


@dataclass
class StagedPage:
    """One page through the stages one after the other, as ``--jobs 1`` runs them, with
    each stage's thread CPU seconds (``index`` counts the finish)."""

    sketch: PageSketch
    result: IndexResult
    matches: list[Match]  # none when the finish rejected the page
    cpu: dict[str, float]


def staged_page(engine: Engine, page: Page) -> StagedPage:
    c0 = time.thread_time()
    sk = engine.sketch(page)
    c1 = time.thread_time()
    result = engine.indexer.index(sk, defer=True)
    c2 = time.thread_time()
    found = engine.align(result)
    c3 = time.thread_time()
    matches: list[Match] = []
    with contextlib.suppress(PageRejected):
        matches = engine.indexer.finish(result, found)
    c4 = time.thread_time()
    return StagedPage(sk, result, matches,
                      {"sketch": c1 - c0, "index": c2 - c1 + c4 - c3, "align": c3 - c2})


def run_staged_one_core(label: str, pages: list[Page], config: EngineConfig, store: Path) -> Run:
    """``--jobs 1``: the three stages in turn on this thread, each timed (CPU), with the wire
    size of the messages between them (serialized aside, not timed). Near-only, the pages
    go through ``Engine.process_many`` as ``dupalign scan --jobs 1`` gives them, in batches
    (dupalign.runtime.batched): ``run_batched``."""
    if not config.passage.enabled:
        return run_batched(label, pages, config, store)
    run = Run(label, 0.0, set())
    cpu = dict.fromkeys(("sketch", "index", "align"), 0.0)
    wire = dict.fromkeys(("page_sketch", "align_task", "forward", "tokens"), 0)
    warm_up(pages, config, store)
    serialize = serialize_cpu = 0.0
    engine, closed = Engine.open(store, config), False
    store_write = _time_writes(engine)
    try:
        t0, p0 = time.perf_counter(), time.process_time()
        for page in pages:
            staged = staged_page(engine, page)
            sk, result = staged.sketch, staged.result
            _collect(run.pairs, run.kinds, staged.matches)
            for stage, seconds in staged.cpu.items():
                cpu[stage] += seconds
            # the wire sizes, left out of the run's time
            t_wire, p_wire = time.perf_counter(), time.process_time()
            wire["page_sketch"] += len(sk.to_bytes())
            wire["tokens"] += sk.n_tokens
            if result.align is not None:
                # the request as the pool gets it (candidates named), and with the share
                # of their forward records an align stage without store access needs
                task = result.align.to_bytes(forward=False)
                wire["align_task"] += len(task)
                carried = engine.indexer.with_forward(AlignRequest.from_bytes(task))
                wire["forward"] += len(carried.to_bytes()) - len(task)
            serialize += time.perf_counter() - t_wire
            serialize_cpu += time.process_time() - p_wire
        pending = engine.passages.pending
        if pending is not None:
            # the last pages' entries (fewer than a file's) go into the store now, counted
            # as index; the files built on this thread are a stage of their own: any
            # process can build them (``--jobs N``: the pool)
            c0 = time.thread_time()
            pending.drain(into_file=True)  # (as Engine.close does)
            cpu["index"] += time.thread_time() - c0 - pending.build_seconds
            cpu["lists"] = pending.build_seconds
        c0 = time.thread_time()
        engine.close()  # the store closed: what is written is there for the next open
        closed = True
        cpu["index"] += time.thread_time() - c0
        run.seconds = time.perf_counter() - t0 - serialize
        run.cpu = time.process_time() - p0 - serialize_cpu
    finally:
        if not closed:
            engine.close()
    run.stages, run.wire = cpu, wire
    run.stages["store"] = store_write[0]
    return run


def run_batched(label: str, pages: list[Page], config: EngineConfig, store: Path) -> Run:
    """Near-only ``--jobs 1`` through ``Engine.process_many``: each page's stage CPU as the
    engine reports it (a batch's shared parts split over its pages); no wire sizes (no
    message leaves the thread)."""
    run = Run(label, 0.0, set())
    cpu = dict.fromkeys(("sketch", "index", "align"), 0.0)
    warm_up(pages, config, store)
    engine, closed = Engine.open(store, config), False
    store_write = _time_writes(engine)
    try:
        t0, p0 = time.perf_counter(), time.process_time()
        for _, found in engine.process_many(((p, None) for p in pages), jobs=1):
            report = engine.last_report
            cpu["sketch"] += report.cpu_sketch
            cpu["index"] += report.cpu_index
            if isinstance(found, list):
                _collect(run.pairs, run.kinds, found)
            elif not isinstance(found, PageRejected):
                raise found
        c0 = time.thread_time()
        engine.close()
        closed = True
        cpu["index"] += time.thread_time() - c0
        run.seconds = time.perf_counter() - t0
        run.cpu = time.process_time() - p0
    finally:
        if not closed:
            engine.close()
    run.stages, run.wire = cpu, dict.fromkeys(("page_sketch", "align_task", "forward",
                                               "tokens"), 0)
    run.stages["store"] = store_write[0]
    return run


def _time_writes(engine: Engine) -> list[float]:
    """Counts the CPU of this thread in the index stage's store writes (a page's WriteBatch
    staged, written, and the in-memory indexes updated; a batch of pages' write) into the
    list's one item."""
    spent = [0.0]
    write, flush = engine.indexer._write, engine.indexer.flush

    def timed_write(*args: Any) -> None:
        c0 = time.thread_time()
        write(*args)
        spent[0] += time.thread_time() - c0

    def timed_flush() -> None:
        c0 = time.thread_time()
        flush()
        spent[0] += time.thread_time() - c0

    engine.indexer._write = timed_write  # type: ignore[method-assign,assignment]
    engine.indexer.flush = timed_flush  # type: ignore[method-assign]
    return spent


def run_staged(label: str, pages: list[Page], config: EngineConfig, store: Path,
               jobs: int, executor: ExecutorKind = "process") -> Run:
    run = Run(label, 0.0, set())
    warm_up(pages, config, store)
    engine, closed = Engine.open(store, config), False
    try:
        t0 = time.perf_counter()
        for _, found in engine.process_many(((p, None) for p in pages), jobs=jobs,
                                            executor=executor):
            if isinstance(found, list):
                _collect(run.pairs, run.kinds, found)
            elif not isinstance(found, PageRejected):
                raise found
        engine.close()  # the last pages' list entries into the store, the pool stopped
        closed = True
        run.seconds = time.perf_counter() - t0
    finally:
        if not closed:
            engine.close()
    return run


def warm_up(pages: list[Page], config: EngineConfig, store: Path) -> None:
    """A few pages into a throwaway store first: numba's cached kernels load, so that the
    timed run leaves start-up out (the worker processes fork from this one)."""
    with Engine.open(store.with_name(store.name + "-warm"), config) as engine:
        if not config.passage.enabled:  # (the batched path's kernels: ``run_batched``)
            for _ in engine.process_many(((p, None) for p in pages[:WARM_UP]), jobs=1):
                pass
        for page in pages[WARM_UP:2 * WARM_UP]:
            with contextlib.suppress(PageRejected):
                engine.process(page)


# (run in the process of a checkout of any revision: numba's own event API only) the
# kernels compiled, not loaded from the cache, after the clock started: a run's
# clock started ``seconds`` before it stopped (a pool's processes are not seen)
_COMPILES = """
import time
from numba.core import event
recorder = event.install_recorder("numba:compile")
compiles = recorder.__enter__()
def compiled_since(seconds):
    start = time.time() - seconds
    return sorted({e.data["dispatcher"].py_func.__qualname__ for t, e in compiles.buffer
                   if e.is_start and t >= start})
"""

_MAIN_SCRIPT = _COMPILES + """
import json, pickle, sys, time
from dupalign.config import EngineConfig, PassageConfig, TextConfig
from dupalign.runtime.engine import Engine
from dupalign.errors import PageRejected
pages = pickle.load(open(sys.argv[1], "rb"))
cfg = EngineConfig(text=TextConfig(main_content=True),
                   passage=PassageConfig(enabled=sys.argv[3] == "1")).validate()
with Engine.open(sys.argv[2] + "-warm", cfg) as engine:  # start-up left out, as above
    for page in pages[:int(sys.argv[4])]:
        try:
            engine.process(page)
        except PageRejected:
            pass
pairs, kinds = [], {}
with Engine.open(sys.argv[2], cfg) as engine:
    t0, c0 = time.perf_counter(), time.process_time()
    for page in pages:
        try:
            found = engine.process(page)
        except PageRejected:
            continue
        for m in found:
            kinds[m.kind] = kinds.get(m.kind, 0) + 1
            if m.kind in ("exact", "near"):
                pairs.append((m.doc_id, m.match_doc_id))
    pending = getattr(engine.passages, "pending", None)  # (revisions that write lists behind)
    if pending is not None:
        pending.drain(into_file=True)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
print(json.dumps({"seconds": seconds, "cpu": cpu, "pairs": pairs, "kinds": kinds,
                  "compiled": compiled_since(seconds)}))
"""


_STAGED_SCRIPT = _COMPILES + """
import json, pickle, sys
from pathlib import Path
from dupalign.config import EngineConfig, PassageConfig, TextConfig
from tests.bench.bench_scan import run_staged, run_staged_one_core, timed
pages = pickle.load(open(sys.argv[1], "rb"))
cfg = EngineConfig(text=TextConfig(main_content=True),
                   passage=PassageConfig(enabled=sys.argv[3] == "1")).validate()
label, jobs, executor = sys.argv[4], int(sys.argv[5]), sys.argv[6]
if jobs == 1:
    r = run_staged_one_core(label, pages, cfg, Path(sys.argv[2]))
else:
    r = timed(lambda: run_staged(label, pages, cfg, Path(sys.argv[2]), jobs, executor))
print(json.dumps({"seconds": r.seconds, "cpu": r.cpu, "pairs": sorted(r.pairs),
                  "kinds": r.kinds, "stages": r.stages, "wire": r.wire,
                  "compiled": compiled_since(r.seconds)}))
"""


def run_staged_apart(label: str, code: Path, pages_file: Path, store: Path, passages: bool,
                     jobs: int = 1, executor: ExecutorKind = "process") -> Run:
    """A staged run (``run_staged_one_core`` for ``--jobs 1``, else ``run_staged``) in a
    process of its own, importing the code at ``code`` (this checkout, or one of
    ``--baseline-ref``): each run starts from the same state, whatever ran before it (in
    one process, ``--jobs 2`` ran at 1.31-1.36x ``--jobs 1`` after the other methods and at
    1.56x before them)."""
    out = subprocess.run([sys.executable, "-c", _STAGED_SCRIPT, str(pages_file), str(store),
                          "1" if passages else "0", label, str(jobs), executor], cwd=code,
                         check=True, capture_output=True, text=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return Run(label, d["seconds"], {(a, b) for a, b in d["pairs"]}, d["cpu"], d["kinds"],
               d["stages"], d["wire"], d["compiled"])


def run_main(label: str, ref: Path, pages_file: Path, store: Path, passages: bool) -> Run:
    """The old single-threaded engine: a checkout of ``ref`` imported first in a subprocess."""
    out = subprocess.run([sys.executable, "-c", _MAIN_SCRIPT, str(pages_file), str(store),
                          "1" if passages else "0", str(WARM_UP)], cwd=ref, check=True,
                         capture_output=True, text=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return Run(label, d["seconds"], {(a, b) for a, b in d["pairs"]}, d["cpu"], d["kinds"],
               compiled=d["compiled"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="llvm",
                    help="two releases of Debian docs (tests.corpora.DOCS_CORPORA)")
    ap.add_argument("--docs", type=Path, default=LLVM_DOCS)
    ap.add_argument("--limit", type=int, default=None, help="pages per release (default all)")
    ap.add_argument("--only", choices=["html", "text"], help="one input form only")
    ap.add_argument("--main-ref", default="main", help="revision of the old path (git ref)")
    ap.add_argument("--no-main", action="store_true", help="skip the old path")
    ap.add_argument("--baseline-ref", help="also run the --jobs 1 stages of this revision "
                    "(a staged engine: stage CPU side by side)")
    ap.add_argument("--jobs", default="1,2", help="worker counts of the staged runs")
    ap.add_argument("--near-only", action="store_true",
                    help="only the near-only runs of dupalign (and the peers)")
    ap.add_argument("--threads", action="store_true",
                    help="also run the stages with jobs > 1 on worker threads")
    args = ap.parse_args()
    old, new = load_pages(args.docs, args.limit, args.corpus)
    html = old + new
    text = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in html]
    a, b = (r.label for r in DOCS_CORPORA[args.corpus])
    print(f"corpus {args.corpus}: {len(old)} {a} + {len(new)} {b} HTML pages, "
          f"{sum(len(str(p.body).encode()) for p in text) / 1e6:.1f} MB of text")
    sh = {p.id: shingles(tokenize(str(p.body)).tokens) for p in text}
    old_ids = {p.id for p in old}
    same_path = {(p.id, a + p.id[len(b):]) for p in new}
    truth = {x for x, y in same_path if y in sh and jaccard(sh[x], sh[y]) >= TRUTH_J}
    print(f"truth: {len(truth)} of {len(same_path)} {b} pages have word 5-shingle Jaccard "
          f">= {TRUTH_J} with their same-path {a} page", flush=True)
    jobs = [int(j) for j in args.jobs.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    ref = base = None
    try:
        # (kept under CHECKOUTS by commit, their kernels compiled before any clock starts)
        if not args.no_main:
            ref = warm_checkout(args.main_ref)
        if args.baseline_ref:
            base = warm_checkout(args.baseline_ref)
        for form, pages in (("html", html), ("text", text)):
            if args.only and form != args.only:
                continue
            pages_file = tmp / f"{form}.pickle"
            pages_file.write_bytes(pickle.dumps(pages))
            runs = run_all(form, pages, pages_file, tmp, ref, args.main_ref, jobs, args.threads,
                           (base, args.baseline_ref) if base is not None else None,
                           args.near_only)
            report(form, len(pages), runs, truth, sh, old_ids)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def run_all(form: str, pages: list[Page], pages_file: Path, tmp: Path, ref: Path | None,
            ref_name: str, jobs: list[int], threads: bool = False,
            baseline: tuple[Path, str] | None = None, near_only: bool = False) -> list[Run]:
    """Every method on the same pages, one after the other (``near_only``: no default
    runs)."""
    runs: list[Run] = []

    def done(run: Run) -> None:
        runs.append(run)
        print(f"  {form}: {run.label} done in {run.seconds:.1f} s", flush=True)

    for peer in ("datasketch", "rensa"):
        done(run_peer(peer, "user", pages_file))
    if form == "text":
        done(run_peer("rensa", "ours", pages_file))
    # (each staged run makes its configuration: the default, or passages off)
    for name, passages in (("default", True), ("near-only", False)):
        if near_only and passages:
            continue
        if ref is not None:
            done(run_main(f"{ref_name} {name} (one thread)", ref, pages_file,
                          tmp / f"m-{form}-{name}", passages))
        if baseline is not None:
            done(run_staged_apart(f"{baseline[1]} {name} --jobs 1", baseline[0], pages_file,
                                  tmp / f"b-{form}-{name}", passages))
        for j in jobs:
            label, store = f"dupalign {name} --jobs {j}", tmp / f"{form}-{name}-{j}"
            done(run_staged_apart(label, HERE, pages_file, store, passages, j))
            if threads and j > 1:  # the same stages on worker threads instead of processes
                done(run_staged_apart(f"{label} threads", HERE, pages_file,
                                      tmp / f"{form}-{name}-{j}t", passages, j, "thread"))
    return runs


def report(form: str, n_pages: int, runs: list[Run], truth: set[str],
           sh: dict[str, set[tuple[str, ...]]], old_ids: set[str]) -> None:
    print(f"\n## from {'the HTML' if form == 'html' else 'the extracted text (text/plain)'}")
    header = (f"{'method':<40} {'seconds':>8} {'pages/s':>8} {'CPU ms/page':>11} "
              f"{'pages/CPU-s':>11} "
              f"{'reported':>9} {'recall':>7} {'precision':>9}  matches by kind")
    print(header)
    print("-" * len(header))
    rate, cpu_rate = {}, {}
    for r in runs:
        pairs = {(a, b) for a, b in r.pairs if a not in old_ids}
        good = {(a, b) for a, b in pairs if jaccard(sh[a], sh[b]) >= TRUTH_J}
        recall = len(truth & {a for a, _ in good}) / len(truth) if truth else float("nan")
        precision = len(good) / len(pairs) if pairs else float("nan")
        rate[r.label] = n_pages / r.seconds
        cpu_rate[r.label] = n_pages / r.cpu
        print(f"{r.label:<40} {r.seconds:8.2f} {rate[r.label]:8.1f} "
              f"{r.cpu / n_pages * 1e3:11.2f} {cpu_rate[r.label]:11.1f} {len(pairs):9d} "
              f"{recall:7.3f} {precision:9.3f}  {r.kinds or ''}")
    for r in runs:  # (a cold kernel cache: its compile time is in that run's figures)
        if r.compiled:
            print(f"  WARNING {r.label}: kernels compiled inside its clock: "
                  f"{', '.join(r.compiled)}")

    def ratio(a: str, b: str) -> None:
        if a in rate and b in rate:
            per_cpu = cpu_rate[a] / cpu_rate[b]
            print(f"  {a} / {b}: {rate[a] / rate[b]:.2f}x"
                  + ("" if "--jobs 2" in a else f" (per CPU second: {per_cpu:.2f}x)"))

    print("ratios (pages/s; per CPU second too where both use one core: on a machine shared "
          "with other work, wall time is noisy)")
    for name in ("default", "near-only"):
        ratio(f"dupalign {name} --jobs 2", f"dupalign {name} --jobs 1")
        for r in runs:
            if r.label.endswith(f"{name} (one thread)") or (
                    r.stages and r.label.endswith(f" {name} --jobs 1")
                    and not r.label.startswith("dupalign")):  # --baseline-ref
                ratio(f"dupalign {name} --jobs 1", r.label)
                ratio(f"dupalign {name} --jobs 2", r.label)
    for name in ("default", "near-only"):  # the same matches whatever the jobs
        same = [r for r in runs if r.label.startswith(f"dupalign {name} --jobs")]
        if len(same) > 1:
            equal = all(r.pairs == same[0].pairs and r.kinds == same[0].kinds for r in same)
            print(f"  dupalign {name}: exact and near pairs and matches by kind "
                  f"{'the same' if equal else 'DIFFER'} in its {len(same)} runs")
    ratio("dupalign near-only --jobs 1", "rensa RMinHashLSH")
    ratio("dupalign near-only --jobs 1", "datasketch MinHashLSH")
    ratio("dupalign default --jobs 1", "datasketch MinHashLSH")
    for r in runs:
        if r.label.endswith("untimed)"):  # the engine-only view
            ratio("dupalign near-only --jobs 1", r.label)
    print("\nstages of the --jobs 1 runs (CPU ms per page; index includes the store write and"
          " closing the store; store: the page's WriteBatch staged and written, CPU within"
          " index; list files: building the table files of list entries,"
          " dupalign.passage.lists.files), wire bytes per page and per token:")
    for r in runs:
        if not r.stages:
            continue
        total = sum(v for k, v in r.stages.items() if k != "store")
        per = {k: v / n_pages * 1e3 for k, v in r.stages.items()}
        tok = max(1, r.wire["tokens"])
        print(f"  {r.label:<30} sketch {per['sketch']:6.2f}  index {per['index']:6.2f}  "
              f"(store {per.get('store', float('nan')):5.2f})  "
              f"align {per['align']:6.2f}  list files {per.get('lists', 0.0):5.2f}  "
              f"index share {r.stages['index'] / total:6.1%}  |  "
              f"PageSketch {r.wire['page_sketch'] / n_pages:8.0f} B/page "
              f"{r.wire['page_sketch'] / tok:5.1f} B/token; AlignTasks "
              f"{r.wire['align_task'] / n_pages:8.0f} B/page "
              f"{r.wire['align_task'] / tok:5.1f} B/token, + candidates' forward data "
              f"{r.wire['forward'] / tok:5.1f} B/token")


if __name__ == "__main__":
    sys.exit(main())
