"""The shard role (``--roles shard``): index shard s of S holds the keyed part of the index
(dupalign/stages/shards.py: the verification sketches of the pages it owns, the inverted lists of
the keys it owns) and answers the index role (the fan-in) with its partial per page
(dupalign/service/roles/shard_protocol.py: the messages).

Input: partition s of the ``keys`` topic (S partitions), written by the fan-in in sequence
order: per sequence record, what the shard must remove, the page's query and its windows
in this shard's lists (``ShardMessage``). Any number of shard processes share the
partitions (a consumer group; each partition's store under ``<store>/shards/<s>``).

Per fetched batch of one partition, in one transaction: each message is applied in order
(``ShardStore.apply``: the partial from the state before the page, then the page), its
partial sent to the single-partition ``partials`` topic, then the batch's ``keys`` offsets.
The store is written before the transaction commits, with the partial and the input
offset: after a crash the messages from the committed offset on are read again and
answered from the stored partials (the fan-in keeps the first partial per page and shard).

A store behind the committed offset (a fresh directory: the shard moved to another
machine; a restored backup) is rebuilt by replaying the retained ``keys`` partition from
the store's offset (the beginning, for a new one), silently up to the committed offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from dupalign.service.config import Config
from dupalign.service.parts import PartsByOrdinal
from dupalign.service.roles.base import StatelessRole
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.roles.shard_protocol import ShardMessage, ShardStore
from dupalign.service.topology import (
    Outgoing,
    TopologyError,
    ordinal_header,
    record_ordinal,
    require_retained,
    send_all,
)

log = logging.getLogger("dupalign.roles.shard")


class ShardRole(StatelessRole):
    name = "shard"
    keeps_state = True

    def __init__(self, config: Config, store_dir: str | Path,
                 metrics: RoleMetrics | None = None) -> None:
        super().__init__(config, metrics)
        if self.kc.index_shards < 2:
            raise TopologyError("the shard role needs kafka.index_shards >= 2 (with 1, the "
                                "index role holds the whole index)")
        self.store_dir = Path(store_dir)
        self.stores: dict[TopicPartition, ShardStore] = {}
        self.silent_below: dict[TopicPartition, int] = {}  # rebuilding up to this offset
        # messages over the keys topic's record limit come as parts (a big page's windows)
        self.parts: dict[TopicPartition, PartsByOrdinal] = {}
        self.last_seq: dict[TopicPartition, int] = {}  # the last whole message's ordinal
        self.answered = 0

    def state_dir(self) -> Path | None:
        return self.store_dir

    @property
    def input_topic(self) -> str:
        return self.kc.keys_topic

    async def take(self, tp: TopicPartition, committed: int | None) -> int | None:
        loop = asyncio.get_running_loop()
        if tp not in self.stores:
            self.stores[tp] = await loop.run_in_executor(
                self.executor, ShardStore, self.store_dir, self.config.engine, tp.partition,
                self.kc.index_shards, self.kc.shard_partials_kept)
        stored = self.stores[tp].offset(tp.topic, tp.partition)
        start: int | None
        needed: int | None
        if committed is None and stored is not None:
            # the group lost its offsets (expired offsets.retention.minutes after it emptied,
            # deleted) but the store has applied messages: read again only the last ones
            # whose partials it keeps (their transaction may have aborted; the fan-in keeps
            # the first partial per page), not the partition from its beginning, whose
            # older messages it could not answer again
            start, needed = max(0, stored - self.kc.shard_partials_kept), stored
            log.warning("shard %d: no committed offset; resuming at %d, its store at %d",
                        tp.partition, start, stored)
        elif committed is not None and (stored is None or stored < committed):
            start = needed = stored  # None: from the beginning
            log.warning("shard %d store behind the committed input (%s < %d): rebuilding it "
                        "from the retained keys partition", tp.partition, stored, committed)
            self.silent_below[tp] = committed
        else:
            start = needed = committed
            self.silent_below.pop(tp, None)
            log.info("index shard %d owned: store at offset %s, committed %s", tp.partition,
                     stored, committed)
        await require_retained(self.consumer, tp, needed or 0, f"index shard {tp.partition}")
        self.parts[tp], self.last_seq[tp] = PartsByOrdinal(), -1
        return start

    async def release(self, tps: Iterable[TopicPartition]) -> None:
        loop = asyncio.get_running_loop()
        for tp in tps:
            store = self.stores.pop(tp, None)
            self.silent_below.pop(tp, None)
            self.parts.pop(tp, None)
            if store is not None:
                await loop.run_in_executor(self.executor, store.close)

    def offsets(self, tp: TopicPartition, records: list[Any]) -> dict[TopicPartition, int]:
        end = records[-1].offset + 1
        # not past the first part of a message still incomplete: a restart reads it all
        # (the fan-in writes a page's messages in sequence order: an older incomplete one
        # was cut short and sent again whole)
        incomplete = self.parts[tp].lowest_offset(self.last_seq[tp])
        if incomplete is not None:
            end = min(end, incomplete)
        if end <= self.silent_below.get(tp, 0):
            return {}  # rebuilding what was committed: nothing to commit
        return {tp: end}

    def prepare(self, tp: TopicPartition, records: list[Any]) -> list[Outgoing]:
        store = self.stores[tp]
        silent = self.silent_below.get(tp, 0)
        out = []
        parts = self.parts[tp]
        for rec in records:
            whole = parts.add(record_ordinal(rec), rec)
            if whole is None:
                continue
            msg = ShardMessage.from_bytes(whole[1])
            self.last_seq[tp] = msg.seq
            partial = store.apply(msg, (tp.topic, tp.partition, rec.offset))
            if partial is not None and rec.offset >= silent:
                # in the version its fan-in reads (one from before an upgrade: version 1)
                out.append(Outgoing(self.kc.partials_topic, partial.to_bytes(msg.partial_wire),
                                    partition=0, headers=[ordinal_header(partial.seq)]))
        if silent and records[-1].offset + 1 >= silent:
            log.info("shard %d rebuilt up to offset %d", tp.partition, silent)
            del self.silent_below[tp]
        return out

    async def produce(self, producer: AIOKafkaProducer, prepared: list[Outgoing]) -> None:
        await send_all(producer, prepared)
        self.answered += len(prepared)

    def outgoing(self, prepared: list[Outgoing]) -> list[Outgoing]:
        return prepared
