"""A page's alignment tasks: the message from the index stage, which finds them from the
inverted lists (``PassageIndex.find_tasks``), to the align stage, which gathers the task
pages' windows from their forward records (``Tasks.gather``) and scans them
(``Aligner.scan``); and the integer thresholds both apply (``Weights``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dupalign.config import PassageConfig
from dupalign.passage import forward, monoactive_query

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class Weights:
    """Thresholds as exact integers: θ = p/q, a matched non-empty window weighs
    ``w_match`` = q, a jointly empty bin ``w_empty`` = p, and a subsequence is similar when
    its weight reaches ``need`` = k·p (OPH and weighted OPH: N_mat / (k − N_emp) ≥ θ).
    MonoActive has no
    empty windows: weight 1 each, threshold ⌈kθ⌉."""

    p: int
    q: int
    w_match: int
    w_empty: int
    need: int

    @classmethod
    def of(cls, cfg: PassageConfig) -> Weights:
        theta = cfg.theta_fraction
        p, q = theta.numerator, theta.denominator
        if cfg.mode in ("oph", "weighted_oph"):
            return cls(p, q, q, p, cfg.k * p)
        return cls(p, q, 1, 0, monoactive_query.threshold_count(cfg.k, (p, q)))


@dataclass
class Tasks:
    """A page's alignment tasks. The index stage's part (``find_tasks``, from the lists):
    pairs (passage ``t_p``, earlier page ``t_o``) sorted by passage then page; ``lid[p,
    b]``, the list named by passage p's min-hash in bin b (-1: an empty bin of the passage,
    whose ``q_empty[p, b]`` is set), as an index into ``list_bin``/``list_key`` (sorted by
    bin, then key; list 0 is the empty list that stop lists are mapped to: a stop list is
    neither a collision nor an empty bin). The align stage's part (``gather``, from the
    task pages' forward records): the lists restricted to the windows of the task pages
    (CSR ``start``/``count`` into ``ords``/``rects``, sorted by ordinal, then window), and
    those pages' empty windows in the passages' empty bins (CSR keyed by ``ordinal << 16 |
    bin`` with (l, r) rows). Every entry and empty window is keyed by its page, so the
    tasks split by earlier page for shards of align."""

    t_p: I64
    t_o: I64
    lid: I64
    q_empty: npt.NDArray[np.bool_]
    list_bin: I64
    list_key: U64
    gathered: bool = False
    start: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    count: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ords: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    rects: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros((0, 4), np.int32))
    empty_keys: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    empty_off: I64 = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    empty_lr: I64 = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))
    # the task pages' records while their empty windows are not gathered yet
    _records: tuple[I64, forward.U8, I64] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.t_p.shape[0])

    @property
    def pages(self) -> I64:
        """The task pages, ascending: whose forward records ``gather`` reads."""
        return np.unique(self.t_o)

    def gather(self, read: forward.ReadForward, cache: forward.RecordCache | None = None,
               empty_later: bool = False) -> Tasks:
        """Fill in the align stage's part from the task pages' forward records (through
        ``cache`` when given). ``empty_later``: the empty windows are left for
        ``gather_empty``, which reads them for some of the tasks only."""
        if not self.gathered:
            pages = self.pages
            if cache is None:
                buf, at = forward.joined_records(pages.tolist(), read)
            else:
                buf, at = cache.records(pages.tolist(), read)
            (self.start, self.count, self.ords, self.rects) = forward.gather_lists_at(
                buf, at, pages, self.list_bin, self.list_key)
            self._records = (pages, buf, at)
            self.gathered = True
            if not empty_later:
                self.gather_empty(np.arange(len(self)))
        return self

    def gather_empty(self, tasks: I64) -> None:
        """The empty windows of ``tasks`` (indices, ascending), if ``gather`` left them for
        later (otherwise nothing to do: every task's are there)."""
        if self._records is None:
            return
        pages, buf, at = self._records
        self._records = None
        self.empty_keys = forward.empty_keys(self.t_p, self.t_o, np.asarray(tasks, np.int64),
                                             self.q_empty)
        self.empty_off, self.empty_lr = forward.gather_empty_at(buf, at, pages, self.empty_keys)


@dataclass
class PassageTrace:
    """What the passage query of one page saw, for the recall audit (dupalign.audit): filled
    by ``PassageIndex.find_tasks`` when asked (``PassageIndex.trace``)."""

    stopped: npt.NDArray[np.bool_] | None = None  # [passage, bin]: the bin's list is a stop list
    tasks: frozenset[int] = frozenset()  # pages that became alignment tasks
    heads: frozenset[int] = frozenset()  # pages counted (in a list's first max_list_read)
    beyond: frozenset[int] = frozenset()  # pages in a list past its first max_list_read
    heads_known: bool = False  # whether ``heads`` was filled (the lists' heads counted)
