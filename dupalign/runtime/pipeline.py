"""The three stages over a stream of pages on several cores: sketch ∥ index ∥ align.

``sketch`` and ``align`` need no shared index state, so they run in a pool of ``jobs - 1``
worker processes (or threads: ``executor="thread"``; CPython holds the GIL in most of
their Python and numba code, so processes are what spreads them over cores), and on the
calling thread: whenever it would wait for a worker, it cancels work no worker has
started and does it itself (``steal``), so it is the ``jobs``-th core instead of an idle
one (what it takes is not read from a secondary instance). The process pool
(dupalign.runtime.pool) needs no thread of this process to hand calls over or take results back,
and keeps every call cancellable until a worker starts it. Their
messages (``PageSketch``, ``AlignRequest``) cross the process boundary pickled, which
copies the numpy arrays once (their msgpack forms, ``to_bytes``, cost more and are for
other transports: Kafka). An ``AlignRequest`` names the candidate pages only: each worker
process reads their forward records (dupalign.passage.forward) from its own RocksDB secondary
instance of the store, which catches up with this process's writes when a record is
newer than what it has seen (threads read the store itself). ``index`` runs here, on
the calling thread, one page at a time in input (ordinal) order, and so does ``finish``,
which stores each page's matches.
Both queues are bounded (``depth`` pages each), so memory stays flat whatever the input.

Results never depend on ``jobs``: the index sees the pages in the same order as
``Engine.process`` one by one, every page's tasks are found against the same index state,
and align is a pure function of its tasks; a page with many tasks is aligned in parts, by
candidate page (``align_parts``), merged as the align partitions' answers are
(``align.merge_ranked``): the same matches, with both cores on one long alignment. The
only state the sketch stage reads, the idf table, may change while sketches are in flight
(an idf freeze): the index recomputes the fingerprint of a page sketched under an older
table (dupalign.near.index). Each chunk of pages names the table in force when it was
sent (``PageChunk``); a worker that holds an older one reads the new one from the store,
where it was written before it came in force, so that the same workers serve the whole
run (a new pool costs a fork of this process and a new secondary instance).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import BrokenExecutor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import islice
from multiprocessing.util import Finalize
from typing import Any, Literal, TypeVar

import numpy as np

from dupalign.config import EngineConfig
from dupalign.errors import StoreError
from dupalign.match import Match, Span
from dupalign.near.idf import IdfTable
from dupalign.page import Page
from dupalign.passage.lists.files import PendingLists
from dupalign.runtime.owned_dir import OwnedTempDir
from dupalign.runtime.pool import Call, ProcessPool
from dupalign.stages.align import Aligner, RankedPage
from dupalign.stages.messages import AlignRequest, IndexResult
from dupalign.stages.sketch import PageSketch, Sketcher
from dupalign.store import tables
from dupalign.store.database import Store
from dupalign.store.forward_reader import StoreForward, open_secondary

ExecutorKind = Literal["process", "thread"]
Source = tuple[str, int, int]  # where a page was read: (topic or file, partition, offset)
PassageMatches = list[tuple[str, list[Span]]]  # the align stage's answer for one page
T = TypeVar("T")
Pending = Call | Future[Any]  # a call into the pool (processes | threads)
Work = Callable[[], Any]  # a pool call's work, done here instead
# Pages in flight per queue. Pages are finished in order, so one page whose alignment is
# slow (a templated llvm page: tens of ms) holds back those behind it; a shallow queue then
# fills and idles the other workers. On llvm-13/14 from text, --jobs 2, depth 64 against 8:
# 1.10-1.14x the pages/s (one run of each of three executor shapes). A page in flight holds
# its PageSketch (~90 KB on llvm) and align request (~17 KB): 64 pages are a few MB.
DEPTH = 64
SKETCH_CHUNK = 4  # pages per call of the sketch stage in a worker (sketch_chunk_in_worker)
# An align request of at least twice this many tasks goes to the pool in ``jobs`` parts (by
# candidate page: ``align_parts``), so that both cores share it. On llvm text 1 % of the
# pages took 62-65 % of the align stage's CPU (one up to 0.79 s; its CPU follows its tasks,
# correlation 0.88): one page's alignment on one core held back the in-order finish of the
# pages behind it while the other core ran out of work. The parts cost 1.02-1.05x the
# whole's CPU (each ranks and refines its own best pages), so only large requests split, in
# as few parts as there are cores (tests/bench/pool_schedule.py: on two idle cores llvm
# 1.64x -> 1.72x, Boost 1.75x -> 1.74x, from 1,024 tasks in 2 parts; in 4, 1.67x and 1.72x).
SPLIT_TASKS = 512
SECONDARY_PREFIX = "dupalign-pool-secondary-"  # a pool process's secondary instance's files


def default_jobs() -> int:
    """All the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


# -- the worker side: one Sketcher and Aligner per worker (per thread with threads) ----------
_local = threading.local()


def _init_worker(config: EngineConfig, idf: IdfTable, store: Store | tuple[str, dict[str, Any]]
                 ) -> None:
    """``store``: the store itself (threads), or its path and parameters (processes: each
    opens a secondary instance when it first aligns)."""
    _local.config, _local.idf, _local.store = config, idf, store


def _stage(name: str) -> Any:
    if not hasattr(_local, name):
        if name == "sketcher":
            _local.sketcher = Sketcher(_local.config)
        else:
            _local.aligner = Aligner(_local.config, StoreForward(_worker_store()))
    return getattr(_local, name)


def _worker_store() -> Store:
    """The worker's view of the store (opened once per worker)."""
    if not hasattr(_local, "opened"):
        _local.opened = _open_worker_store()
    opened: Store = _local.opened
    return opened


def _open_worker_store() -> Store:
    store = _local.store
    if isinstance(store, Store):
        return store
    path, params = store
    # the secondary's own files (its info log) live in a directory of this process,
    # removed when it exits with the pool (multiprocessing runs Finalize, not atexit), or
    # by a later pool process if this one is killed (it cannot remove its own then)
    here = OwnedTempDir(SECONDARY_PREFIX)
    secondary = open_secondary(path, params, here.path, 64 << 20)
    Finalize(secondary, here.remove, exitpriority=1)
    Finalize(secondary, secondary.close, exitpriority=2)
    return secondary


def sketch_in_worker(page: Page) -> PageSketch:
    """The sketch stage in a worker."""
    sketcher: Sketcher = _stage("sketcher")
    return sketcher.sketch(page, _local.idf)


class PageChunk(list[Page]):
    """Pages for one call of ``sketch_chunk_in_worker``, with the version of the idf table
    in force when they were sent."""

    def __init__(self, pages: Iterable[Page], idf_version: int) -> None:
        super().__init__(pages)
        self.idf_version = idf_version


def sketch_chunk_in_worker(pages: list[Page]) -> list[PageSketch | Exception]:
    """The sketch stage in a worker for a few pages at once: each call through the pool
    costs the calling thread its own work (pickling, a write, a read, a claim), so pages
    travel in chunks. A page whose sketch fails gets
    its exception, the others their sketches."""
    version = getattr(pages, "idf_version", None)
    if version is not None and version != _local.idf.version:
        _local.idf = _idf_table(version, _local.idf)
    return _sketch_each(sketch_in_worker, pages)


def _idf_table(version: int, held: IdfTable) -> IdfTable:
    """The idf table ``version`` as the store has it, or ``held`` while this worker cannot
    read it (the index recomputes the fingerprint of a page sketched under an older one)."""
    store = _worker_store()
    raw = tables.idf_tables.get(store, version)
    if raw is None and store.catch_up():
        raw = tables.idf_tables.get(store, version)
    return held if raw is None else IdfTable.from_bytes(raw)


def _sketch_each(sketch: Callable[[Page], PageSketch], pages: list[Page]
                 ) -> list[PageSketch | Exception]:
    """``sketch`` of each page, or the exception it raised for that page."""
    out: list[PageSketch | Exception] = []
    for page in pages:
        try:
            out.append(sketch(page))
        except Exception as exc:
            out.append(exc)
    return out


def align_in_worker(request: AlignRequest) -> list[tuple[str, list[Span]]]:
    """The align stage in a worker."""
    aligner: Aligner = _stage("aligner")
    return aligner.align(request)


def align_part_in_worker(request: AlignRequest) -> list[RankedPage]:
    """The align stage in a worker, on a part of a request (``align_parts``)."""
    aligner: Aligner = _stage("aligner")
    return aligner.align_ranked(request)


def align_parts(request: AlignRequest, most: int) -> list[AlignRequest]:
    """``request`` split by candidate page into up to ``most`` parts of about as many tasks
    each (the candidates with most tasks first, each to the part with fewest so far), when
    it has ``2 * SPLIT_TASKS`` tasks or more; else ``[request]``. Each part's
    ``Aligner.align_ranked``, merged by ``align.merge_ranked``, gives ``Aligner.align`` of
    the whole (``AlignRequest.split_by``)."""
    t_o = request.tasks.t_o
    others, inverse, tasks = np.unique(t_o, return_inverse=True, return_counts=True)
    k = min(most, len(t_o) // SPLIT_TASKS, len(others))
    if k < 2:
        return [request]
    load = np.zeros(k, dtype=np.int64)
    part_of = np.empty(len(others), dtype=np.int64)
    for c in np.argsort(-tasks, kind="stable").tolist():
        part_of[c] = part = int(np.argmin(load))
        load[part] += tasks[c]
    return list(request.split_by(part_of[inverse]).values())


def _in_flight_reading(aligns: deque[tuple[Page, IndexResult | BaseException, Any]],
                       removed: list[int]) -> int:
    """How many of the pages in flight (``aligns``, in order) must finish before the pages
    ``removed`` leave the store: up to the last one that is one of them, a replay of one
    (answered from its stored matches, which the removal deletes), or aligns against one
    of them (align reads the candidates' forward and docs records)."""
    if not removed:
        return 0
    dead = np.asarray(removed, dtype=np.int64)
    n = 0
    for x, (_, result, _) in enumerate(aligns):
        if not isinstance(result, IndexResult):
            continue
        if result.ordinal in removed or result.replay_of in removed or (
                result.align is not None and np.isin(result.align.others, dead).any()):
            n = x + 1
    return n


# -- the calling side ----------------------------------------------------------------------
class WorkerPool:
    """Worker processes (or threads) that start with the idf table in force when it was
    made (and read later ones from the store: ``PageChunk``); kept by the engine across
    ``process_many`` calls."""

    def __init__(self, kind: ExecutorKind, jobs: int, config: EngineConfig, idf: IdfTable,
                 store: Store):
        self.kind, self.jobs = kind, jobs
        args = (config, idf, store if kind == "thread" else (str(store.path), store.params))
        self.executor: ProcessPool | ThreadPoolExecutor = (
            ProcessPool(jobs, initializer=_init_worker, initargs=args)
            if kind == "process" else
            ThreadPoolExecutor(jobs, initializer=_init_worker, initargs=args))

    def close(self, wait: bool = True) -> None:
        """``wait=False``: the work already submitted still runs (the pipeline waits for
        it), then the workers exit."""
        if isinstance(self.executor, ProcessPool):
            self.executor.close(wait=wait)
        else:
            self.executor.shutdown(wait=wait)

    @property
    def broken(self) -> bool:
        """A worker died: no more work runs here."""
        return isinstance(self.executor, ProcessPool) and self.executor.broken


@dataclass(frozen=True)
class Stages:
    """What ``run_pipeline`` drives: the stages as calls on the thread that owns the index
    (``Engine.stages`` makes them), the pool of sketch and align workers, and the list
    files the pool also builds."""

    process: Callable[[Page, Source | None], list[Match]]  # every stage of one page, here
    sketch: Callable[[Page], PageSketch]  # the sketch stage here, as a worker runs it
    index: Callable[[PageSketch, Source | None], IndexResult]
    align: Callable[[IndexResult], PassageMatches]  # the align stage here, on the store
    align_part: Callable[[AlignRequest], list[RankedPage]]  # a part of one (``align_parts``)
    merge: Callable[[list[list[RankedPage]]], PassageMatches]  # the parts' answers, merged
    finish: Callable[[IndexResult, PassageMatches], list[Match]]  # store the matches
    skip: Callable[[str, Source | None], object]  # a failed page: its offset advances
    removes: Callable[[PageSketch], list[int]]  # stored pages that indexing it removes
    reported: Callable[[IndexResult], None]  # the index stage's times of a page, for metrics
    pool: Callable[[ExecutorKind, int], WorkerPool]  # the pool of sketch and align workers
    idf_version: Callable[[], int]  # the idf table in force now
    lists: PendingLists | None  # list files written behind (dupalign.passage.lists.files)


def _run_here(work: Callable[[], T]) -> Future[T]:
    """``work()`` run now, as a done future (its result, or the exception it raised)."""
    future: Future[T] = Future()
    try:
        future.set_result(work())
    except Exception as exc:
        future.set_exception(exc)
    return future


def _sketch_here(stages: Stages, pages: list[Page]) -> list[PageSketch | Exception]:
    """``sketch_chunk_in_worker`` in the calling thread (the same sketch: no store read)."""
    return _sketch_each(stages.sketch, pages)


def _aligned(here: Work, future: Pending) -> Any:
    """The worker's answer (a page's passage matches, or a part's ranked pages); if the
    worker failed (its view of the store, say a secondary instance that could not catch
    up), the same work ``here``, on the store itself, so that no page's result depends on a
    worker: an error of the page's own raises here the same way."""
    try:
        return future.result()
    except Exception:
        return here()


def run_pipeline(
    stages: Stages, items: Iterable[tuple[Page, Source | None]], jobs: int,
    executor: ExecutorKind = "process", depth: int | None = None, caller_works: bool = True,
) -> Iterator[tuple[Page, list[Match] | BaseException]]:
    """``stages.process`` over ``items`` with sketch and align on ``jobs`` cores; yields
    each page with its matches or its exception, in input order. A ``StoreError`` is
    raised instead: it is no fault of the page, and no later page may be indexed past it.
    ``caller_works=False``: ``jobs`` pool processes and a calling thread that only
    indexes and waits (the shape before it took work back: benchmarks compare them)."""
    if jobs <= 1:
        for page, source in items:
            try:
                yield page, stages.process(page, source)
            except StoreError:
                raise
            except Exception as exc:
                yield page, exc
        return
    depth = depth or max(DEPTH, 4 * jobs)
    # the calling thread is one of the ``jobs``: it indexes, and runs the pool's work
    # itself whenever it would wait for it (``steal``)
    workers = jobs - 1 if caller_works else jobs
    chunk = max(1, min(SKETCH_CHUNK, depth // jobs))  # every worker gets a chunk
    pool = stages.pool(executor, workers)
    # a page, its source, and its chunk's future with its place in the chunk
    sketches: deque[tuple[Page, Source | None, Pending, int]] = deque()
    # a page, its index result, and its alignment's pool calls (one, or one per part) with
    # the same work to do here if no worker has started it
    aligns: deque[tuple[Page, IndexResult | BaseException, list[tuple[Pending, Work]]]] = (
        deque())
    # the pages of each sketch chunk not done yet, in submission order (its first pages
    # may have left ``sketches`` already)
    chunk_pages: dict[Pending, list[Page]] = {}
    # work taken back from the pool (cancelled before a worker started it) and done here:
    # the cancelled future -> a future done with its result (until its pages are done)
    stolen: dict[Pending, Future[Any]] = {}
    pending = iter(items)
    more = True
    # list files are built by the pool too (dupalign.passage.lists.files): the file in flight
    # is ingested at the end
    lists = stages.lists
    if lists is not None:
        lists.submit = lambda fn, arg: pool.executor.submit(fn, arg)

    def now(future: Pending) -> Pending:
        return stolen.get(future, future)

    def steal(waited: Pending, work: Work | None = None) -> bool:
        """While ``waited`` is not done, run here one piece of work no worker has started
        (cancelled in the pool): ``waited``'s (``work``), else the earliest alignment (or
        part of one), else the earliest chunk of sketches (the one ``waited``, when it is
        a chunk). The calling thread, idle otherwise, is one of the ``jobs``. False:
        nothing left to take."""
        if not caller_works or now(waited).done():
            return False
        if work is not None and take(waited, work):
            return True
        for _, _, calls in aligns:
            for future, job in calls:
                if take(future, job):
                    return True
        for future, pages in chunk_pages.items():
            if take(future, partial(_sketch_here, stages, pages)):
                return True
        return False

    def take(future: Pending, work: Callable[[], Any]) -> bool:
        """Cancel ``future`` in the pool and do its ``work`` here, if no worker has it."""
        if future in stolen or not future.cancel():
            return False
        stolen[future] = _run_here(work)
        return True

    def finish() -> tuple[Page, list[Match] | BaseException]:
        page, result, calls = aligns.popleft()
        if isinstance(result, BaseException):
            return page, result
        stages.reported(result)
        try:
            answers = []
            for future, job in calls:
                while steal(future, job):
                    pass
                answers.append(_aligned(job, stolen.pop(future, future)))
            found = (answers[0] if len(answers) == 1 else stages.merge(answers)) if calls else []
            return page, stages.finish(result, found)
        except StoreError:
            raise
        except Exception as exc:
            return page, exc

    try:
        while True:
            # whole chunks only: refilled a page at a time, a call could carry one page
            while more and len(sketches) + chunk <= depth:
                batch = list(islice(pending, chunk))
                if not batch:
                    more = False
                    break
                pages = [p for p, _ in batch]
                sketched = pool.executor.submit(sketch_chunk_in_worker,
                                                PageChunk(pages, stages.idf_version()))
                chunk_pages[sketched] = pages
                sketches.extend((page, source, sketched, x)
                                for x, (page, source) in enumerate(batch))
            while aligns and all(now(f).done() for f, _ in aligns[0][2]):
                yield finish()
            if not sketches:
                if not aligns:
                    return
                yield finish()
                continue
            if len(aligns) >= depth:
                yield finish()
                continue
            page, source, sketched, at = sketches.popleft()
            try:
                while steal(sketched):
                    pass
                chunk_sketches = now(sketched).result()
                if at == len(chunk_sketches) - 1:  # the chunk's last page
                    del chunk_pages[sketched]
                    stolen.pop(sketched, None)
                sk = chunk_sketches[at]
                if isinstance(sk, Exception):
                    raise sk
                # a page that removes a stored one (a new version, a delete) waits for the
                # alignments in flight that read the removed page's records (the lookup
                # costs two store reads on this serial thread: only when something is)
                if aligns:
                    for _ in range(_in_flight_reading(aligns, stages.removes(sk))):
                        yield finish()
                result: IndexResult | BaseException = stages.index(sk, source)
            except (StoreError, BrokenExecutor):
                # no fault of the page (a worker process killed, say by the OOM killer,
                # breaks the pool): no later page may be indexed past it, nor its offset
                # advance as a failed page's does; the caller starts again from it
                raise
            except Exception as exc:
                # an unexpected sketch or index error: the page's offset still advances
                result = exc
                stages.skip(page.id, source)
            calls: list[tuple[Pending, Work]] = []
            if isinstance(result, IndexResult) and result.align is not None:
                parts = align_parts(result.align, jobs)
                if len(parts) == 1:
                    calls = [(pool.executor.submit(align_in_worker, result.align),
                              partial(stages.align, result))]
                else:
                    calls = [(pool.executor.submit(align_part_in_worker, part),
                              partial(stages.align_part, part)) for part in parts]
            aligns.append((page, result, calls))
    finally:  # the caller stopped reading: pages not indexed yet are dropped, pages
        # indexed are finished (their matches stored, for a replay to find)
        for _, _, sketched, _ in sketches:
            sketched.cancel()
        sketches.clear()  # (nor are they sketched here while the alignments finish)
        chunk_pages.clear()
        while aligns:
            finish()
        if lists is not None:
            lists.submit = None
            lists.settle()
