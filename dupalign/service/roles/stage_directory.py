"""The directory stage as a role (docs/pipeline.md, "Roles on Kafka"): partition k of D decides
the pages whose ids it owns, in ordinal order, from ``<in>.entries`` partition k, and sends
each ``Decision`` to ``<in>.decisions`` partition k (header: the ordinal).

Its ledger applies every partition's decisions, read back from ``<in>.decisions`` (its own
once committed), and stops at each retention sweep point s (before the first page at each
multiple of ``retention.every`` ordinals): before deciding its first page at or after s,
the partition waits until its ledger holds every decision below s (a wait on its peers,
never on a stage downstream), sweeps it with the clock of s's batch and ``forget``s the
versions swept. Store: the ``DirectoryShard``'s tables, the ledger's rows, the cursor.
"""

from __future__ import annotations

from typing import Any

from dupalign.config import EngineConfig
from dupalign.service.roles.stage_ledger import LedgerSteps
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.sequence_batch import record_page
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import Outgoing, ordinal_header
from dupalign.stages.directory import DirectoryEntry, DirectoryShard
from dupalign.stages.ledger import Expired
from dupalign.store.database import Store


class DirectoryPartition(StagePartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        n = topics.shape.directory
        self.shard = DirectoryShard(store, config, partition, n)
        self.entries = self.merge(topics.entries, [partition])
        self.ledger = LedgerSteps(self, config, store)
        self.next_page: int = self.noted.get("next", 0)  # the next ordinal to decide

    def key_of(self, topic: str, record: Any) -> Any:
        if topic == self.topics.entries:
            return record_page(record)
        return self.ledger.key_of(record)

    def needed(self) -> int:
        return min(self.next_page, self.ledger.next_seq)

    def note(self, batch: Any) -> None:
        self.ledger.note(batch)

    def extra(self) -> dict[str, Any]:
        return {"next": self.next_page, **self.ledger.extra()}

    def _forget(self, swept: list[Expired]) -> None:
        self.shard.forget(e.seq for e in swept)

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        while True:
            self.ledger.catch_up()
            o = self.next_page
            ref = self.seq.page(o)
            if ref is None:
                break
            if not self.ledger.sweep_before(o, self._forget):
                break  # its peers' decisions below the sweep point are not all in
            if ref.dir == self.partition:
                raw = self.entries.take(self.partition, (ref.batch, ref.index))
                if raw is None:
                    break
                entry = DirectoryEntry.from_bytes(raw)
                entry.seq = o
                d = self.shard.decide(entry)
                out.append(Outgoing(self.topics.decisions, d.to_bytes(),
                                    key=d.doc_id.encode("utf-8"), partition=self.partition,
                                    headers=[ordinal_header(o)]))
            self.next_page = o + 1
        return out


class DirectoryRole(StageRole):
    name = stage = "directory"

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return DirectoryPartition(self.topics_, partition, store, self.config.engine)
