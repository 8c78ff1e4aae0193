"""The list stage as a role (docs/pipeline.md, "Roles on Kafka"): partition s of S applies,
for every ordinal in order, what ``Partitioned`` gives list shard s (``ListShard.apply``):
the page's decision (every directory partition's, from ``<in>.decisions``, placed by its
ledger), the exact answer of a stored page and the page's ``ListWindows`` for s; at each
sweep point the ledger's sweep (``ListShard.forget``). Each ``ListPartial`` goes to
``<in>.partials``, to the combine partition owning the query page's id (header: the
ordinal).

Which records ordinal n waits for, all upstream: its decision, on the directory partition
the sequence names; if the decision stores the page (kind ``stored``), one exact answer, on
``<in>.exact`` partition ``exact_owner(content hash, E)`` (the only exact partition that
answers a stored page is the owner of its hash; no other decision has an answer); if the
sequence says the page has list windows, its record on ``<in>.windows`` partition s, keyed
by the page's (b, i). None is taken before all are in, so a turn that stops at n leaves
nothing half applied. The sketch role cannot know n: its windows records carry ordinal 0,
set here (as the directory sets an entry's).

Store: the ``ListShard``'s lists and forward records, the ledger's rows, the cursor. Its
changelog leaves out the lists' entries and runs (a few records a page, not hundreds): the
shard rebuilds them from its forward records when it opens a restored store.
"""

from __future__ import annotations

from typing import Any

from dupalign.config import EngineConfig
from dupalign.service.changelog import LeaveOut
from dupalign.service.roles.stage_ledger import LedgerPartition, LedgerSteps
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.sequence_batch import PageRef, record_page
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import Outgoing, ordinal_header, record_ordinal
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.exact import ExactAnswer, exact_owner
from dupalign.stages.list_shard import ListShard, ListWindows, Step
from dupalign.store import lists
from dupalign.store.database import Store


def exact_partition(d: Decision, n_exact: int) -> int | None:
    """The exact partition that answers decision ``d`` (None: no answer)."""
    if d.kind != "stored":
        return None
    if d.content_hash is None:
        raise ValueError(f"stored page {d.seq} has no content hash")
    return exact_owner(d.content_hash, n_exact)


def has_windows(ref: PageRef) -> bool:
    """Whether the page has list windows (and a forward record: the sketch role sends
    both, or neither)."""
    if ref.windows is None:
        raise ValueError(f"sequence batch {ref.batch} does not say which pages have list "
                         "windows (written by an older sketch role?)")
    return ref.windows


class ListsPartition(LedgerPartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        shape = topics.shape
        self.shard = ListShard(store, config, partition, shape.lists)
        self.ledger = LedgerSteps(self, config, store)
        self.exacts = self.merge(topics.exact, range(shape.exact))
        self.windows = self.merge(topics.windows, [partition])

    def leave_out(self) -> LeaveOut | None:
        """The lists' entries and runs: the shard rebuilds them from its forward records
        when it opens a restored store (``ListShard``)."""
        return lists.derived

    def key_of(self, topic: str, record: Any) -> Any:
        if topic == self.topics.windows:
            return record_page(record)
        if topic == self.topics.exact:
            return record_ordinal(record)
        return self.ledger.key_of(record)

    def advance(self) -> list[Outgoing]:
        # the pages between sweep points go to the shard together: one run a turn
        # (``ListShard.apply_run``), not one call a page
        steps: list[Step] = []
        out: list[Outgoing] = []
        while (ref := self.seq.page(o := self.ledger.next_seq)) is not None:
            if self.ledger.due(o):
                self._apply(steps, out)
            self.ledger.sweep_before(o, self.shard.forget)  # (the ledger is at o)
            d = self.ledger.peek()
            if d is None:
                break
            e = exact_partition(d, self.topics.shape.exact)
            page = (ref.batch, ref.index)
            windowed = has_windows(ref)
            if ((e is not None and self.exacts.peek(e, o) is None)
                    or (windowed and self.windows.peek(self.partition, page) is None)):
                break  # (nothing taken: the next turn starts at o again)
            step = self.ledger.next(d)  # (the decision peeked: not decoded again)
            assert step is not None
            d, placed = step
            exact = None
            if e is not None:
                raw = self.exacts.take(e, o)
                assert raw is not None
                exact = ExactAnswer.from_bytes(raw)
            windows = None
            if windowed:
                raw = self.windows.take(self.partition, page)
                assert raw is not None
                windows = ListWindows.from_bytes(raw)
                windows.seq = o
            steps.append((d, placed, exact, windows))
        self._apply(steps, out)
        return out

    def _apply(self, steps: list[Step], out: list[Outgoing]) -> None:
        """The shard's partials of ``steps`` to the combine partitions; empties ``steps``."""
        for (d, _, _, _), partial in zip(steps, self.shard.apply_run(steps), strict=True):
            if partial is not None:
                # (the combine partition owning the id: ``CombineShard.owns``)
                combine = directory_owner(d.doc_id, self.topics.shape.combine)
                out.append(Outgoing(self.topics.partials, partial.to_bytes(),
                                    partition=combine, headers=[ordinal_header(partial.seq)]))
        steps.clear()


class ListsRole(StageRole):
    name = stage = "lists"

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return ListsPartition(self.topics_, partition, store, self.config.engine)
