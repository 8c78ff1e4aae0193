"""The index role's lifecycle: deletes, new versions and retention sweeps, applied in ordinal
order so that every process replaying the sequence removes the same pages at the same
place.
"""

from __future__ import annotations

import logging
from collections import deque

import numpy as np

from dupalign.match import Match
from dupalign.runtime.engine import Engine
from dupalign.service.config import Config
from dupalign.service.roles.fan_in import FanInIndexer
from dupalign.service.roles.index_align import Waiting
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.stages.sketch import PageSketch

log = logging.getLogger("dupalign.roles.index")


class Lifecycle:
    """The lifecycle half of ``IndexRole`` (dupalign/service/roles/index.py)."""

    config: Config
    engine: Engine | None
    metrics: RoleMetrics
    fan_in: FanInIndexer | None
    waiting: deque[Waiting]

    # -- lifecycle: deletes, new versions and retention, in ordinal order ------------------
    # A removal must not undo what a page before it still needs: a page's matches are read
    # again from the store after a crash (pages from the published ordinal E on), so a page
    # or a retention sweep that removes stored pages waits until the pages before it that
    # read them are published and committed (``_must_wait``). Below the store's sequence
    # offset S (every ordinal below it is in the store), a delete or a sweep read again
    # after a crash is not done twice: it could remove a later version of the id, or pages
    # the other processes keep.

    def _resume_lifecycle(self, stored: int | None) -> None:
        """On taking the shard: ``stored`` is the store's sequence offset S."""
        self.applied_below = stored or 0
        self.last_op = self.applied_below - 1  # retention's schedule goes on from here
        self.sequenced_at: dict[int, int] = {}  # ordinal -> sequence record timestamp (ms)

    def _sweep_due(self, ordinal: int) -> bool:
        """Retention (``[engine.retention]``) sweeps before the first page at or after each
        multiple of ``every`` ordinals: at the same pages in every process that replays
        the sequence, whatever its timing."""
        r = self.config.engine.retention
        return bool(r.max_pages or r.max_age) and ordinal // r.every > self.last_op // r.every

    def _must_wait(self, ordinal: int, sk: PageSketch) -> bool:
        """Whether the page at ``ordinal`` must wait for pages before it (in ``waiting``)
        to be published: it removes stored pages (a retention sweep due there, or
        ``Indexer.removes``: the version it replaces or deletes) that a waiting page has
        the id of (its matches, its revisit message are read from that version after a
        crash), aligns against (``Engine.open`` aligns an unfinished page from the store)
        or, with index shards, names as its exact or near match."""
        if ordinal < self.applied_below or not self.waiting:
            return False
        engine = self.engine
        assert engine is not None
        removed = [(o, sk.id) for o in engine.removes(sk)]  # mostly []: one read
        if self._sweep_due(ordinal):  # before the page: both must wait
            r = self.config.engine.retention
            removed += [(v.ordinal, v.doc_id) for v in engine.expired(
                r.max_pages, r.max_age, self.sequenced_at[ordinal], engine.alive + 1)]
        if not removed:
            return False
        if any(w.undecided for w in self.waiting):
            # (index shards) a page not decided yet may name a removed page in its matches
            # or align against it: it reads the directory when its partials are in
            self.metrics.lifecycle_waits.inc()
            return True
        ids = {doc_id for _, doc_id in removed}
        ordinals = np.array([o for o, _ in removed], dtype=np.int64)
        # (index shards) a decided page read again after a crash is decided again from its
        # partials, which name its exact and near matches by ordinal: they must still be
        # in the directory then (a single index stores the decided matches instead)
        fan_in = self.fan_in is not None

        def reads_removed(w: Waiting) -> bool:
            result = w.result
            return (result.doc_id in ids
                    or (result.align is not None
                        and bool(np.isin(ordinals, result.align.others).any()))
                    or (fan_in and any(m.match_doc_id in ids for m in result.matches)))

        wait = any(map(reads_removed, self.waiting))
        if wait:
            self.metrics.lifecycle_waits.inc()
        return wait

    def _lifecycle(self, ordinal: int, sk: PageSketch) -> bool:
        """Before the page at ``ordinal`` is indexed: the sweep due there. True for a delete
        that the store already holds (read again after a crash): nothing to do."""
        due = self._sweep_due(ordinal)
        self.last_op = max(self.last_op, ordinal)
        now_ms = self.sequenced_at.pop(ordinal)  # max_age's clock: the same in any replay
        if ordinal < self.applied_below:
            return sk.deleted
        if due:
            assert self.engine is not None
            expired = self.engine.compact(now_ms=now_ms)
            self.metrics.lifecycle.labels("expired").inc(expired)
            if expired:
                log.info("retention: %d pages left the store at ordinal %d", expired, ordinal)
        if sk.deleted:
            self.metrics.lifecycle.labels("deleted").inc()
        return False

    def _count_revisits(self, matches: list[Match]) -> None:
        for m in matches:
            if m.revisit is not None:
                self.metrics.lifecycle.labels(f"revisit_{m.revisit}").inc()
