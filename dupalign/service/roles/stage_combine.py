"""The combine stage as a role (docs/pipeline.md, "Roles on Kafka"): partition c of C makes the
matches of the pages whose ids it owns (``CombineShard.owns``), as ``Partitioned`` does for
combine c, and publishes them.

Inputs, in ordinal order (the sequence says which comes next): every decision (all D
partitions of ``<in>.decisions``, placed by its ledger, swept at the same points as every
stage), the exact answer of every stored page (partition ``exact_owner(hash, E)`` of
``<in>.exact``), and for a page it owns: its sketch (``<in>.sketches`` partition c, by (b, i)),
the near shards' answers and the list shards' partials (``<in>.near_answers`` and
``<in>.partials`` partition c, keyed here by (ordinal, shard)), and for a changed revisit of
a near-indexed page (``Router.relates``) the router's distance to the replaced version
(``<in>.revisits`` partition c, by ordinal). How many of those to wait for
follows from what the partition has already (no count travels): a stored page that is not an
exact copy gets an answer from every near shard (P) if its decision is near-indexed
(``Decision.near``: the router routes its query to every shard), and a partial from every list
shard (S) if its sketch has passage windows (``list_windows`` cuts one per shard); other pages
get none. A step takes nothing until all its records are in (``OrderedMerge.peek``).

Output: a page's matches (``CombineShard.finish``) to ``kafka.output_topic``, keyed by id
as the single worker publishes them (``published``), in the step's transaction. A page with
passage tasks first sends its ``AlignRequest`` to the align stage (``<in>.align_requests``,
one part per align partition owning some of its candidates' ids: stage_align.py
``request_parts``; a ``reply_header`` names where it answers), and waits in the store
(``combine_pending``) for the answers on ``<in>.aligned`` partition c (header: the ordinal; a
whole answer or every part asked), taken in ordinal order; then its matches are finished and
published. After each turn that stepped, an ``UPTO`` record to every align partition says
which ordinals it is past (``upto_records``: align answers page n once its combine is).
The steps after it go on meanwhile: ``finish`` only writes the page's stored matches, which
nothing reads before a replay of the same id (that step waits for the id's pending pages)
and which a removal or sweep of the page in between drops (the page is then finished
unstored, as ``Partitioned`` stores then removes them).

Store: the ``CombineShard``'s matches, the ids of the pages alive by store ordinal
(``combine_ids``: the shard keeps them in memory), the pages waiting for align, the ledger's
rows, the cursor.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.match import Match, Span
from dupalign.service.config import KafkaConfig
from dupalign.service.roles.stage_align import request_parts, upto_records
from dupalign.service.roles.stage_ledger import LedgerSteps
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.sequence_batch import PageRef, record_page
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import (
    Outgoing,
    aligned_part,
    decode_aligned,
    published,
    record_ordinal,
)
from dupalign.stages.align import merge_ranked
from dupalign.stages.combine import Combined, CombineShard
from dupalign.stages.directory import NONE, STORED, Decision
from dupalign.stages.exact import ExactAnswer, exact_owner
from dupalign.stages.ledger import Expired, Placed
from dupalign.stages.list_shard import ListPartial
from dupalign.stages.near_shard import NearAnswer, answer_from_bytes, answer_shard
from dupalign.stages.router import Router
from dupalign.stages.sketch import PageSketch
from dupalign.store import records
from dupalign.store.database import Batch, Store

log = logging.getLogger("dupalign.roles.stage")
IDS, PENDING = "combine_ids", "combine_pending"  # the store's logs (by store / seq ordinal)
WHOLE = -1  # the part of a whole align answer (one that names no part)


@dataclass
class Pending:
    """A page waiting for align: its matches so far (``out.ordinal`` None once the page left
    the store: finished unstored), where it is in the input, the align partitions asked."""

    out: Combined
    source: tuple[str, int, int]
    parts: list[int]

    def to_bytes(self) -> bytes:
        o = self.out
        return bytes(msgpack.packb([o.seq, o.doc_id, o.ordinal, [m.to_dict() for m in o.matches],
                                    list(self.source), self.parts]))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Pending:
        seq, doc_id, ordinal, matches, source, parts = msgpack.unpackb(raw)
        return cls(Combined(seq, doc_id, ordinal, [Match.from_dict(m) for m in matches]),
                   (source[0], source[1], source[2]), parts)


@dataclass
class Inputs:
    """What one step needs besides its decision, all read (peeked, not taken yet)."""

    exact: ExactAnswer | None = None
    exact_part: int = 0
    sketch: PageSketch | None = None
    near: list[NearAnswer] | None = None
    partials: list[ListPartial] | None = None
    related: bool = False  # the router's revisit distance read (``Router.relates``)
    hamming: int | None = None


class CombinePartition(StagePartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        s = topics.shape
        self.kc: KafkaConfig = topics.kc
        self.max_matches = config.passage.max_matches
        self.shard = CombineShard(store, config, partition, s.combine, s.lists)
        self.shard.ids = {o: raw.decode("utf-8") for o, raw in records.log_items(store, IDS)}
        self.pending = {o: Pending.from_bytes(raw)
                        for o, raw in records.log_items(store, PENDING)}
        self.changed: dict[tuple[str, int], bytes | None] = {}  # (log, ordinal) -> row
        self.ledger = LedgerSteps(self, config, store)
        self.exact = self.merge(topics.exact, range(s.exact))
        self.sketches = self.merge(topics.sketches, [partition])
        self.near = self.merge(topics.near_answers, [partition])
        self.partials = self.merge(topics.partials, [partition])
        self.aligned = self.merge(topics.aligned, [partition])
        self.revisits = self.merge(topics.revisits, [partition])

    def key_of(self, topic: str, record: Any) -> Any:
        t = self.topics
        if topic == t.sketches:
            return record_page(record)
        # (keyed by the shard or part alone: the value is decoded when its step reads it)
        if topic == t.near_answers:
            return record_ordinal(record), answer_shard(record.value)
        if topic == t.partials:
            return record_ordinal(record), ListPartial.shard_of(record.value)
        if topic == t.aligned:
            part = aligned_part(record.value)
            return record_ordinal(record), WHOLE if part is None else part
        return self.ledger.key_of(record)  # (decisions, exact answers: by ordinal)

    def needed(self) -> int:
        return self.ledger.next_seq  # (a page waiting for align keeps its source)

    def note(self, batch: Batch) -> None:
        self.ledger.note(batch)
        records.log_write(batch, ((name, o, row) for (name, o), row in self.changed.items()))
        self.changed = {}

    def extra(self) -> dict[str, Any]:
        return self.ledger.extra()

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        start = self.ledger.next_seq
        while self._finish_next(out) or self._others() or self._step(out):
            pass
        if self.ledger.next_seq > start:
            out += upto_records(self.topics, self.partition, self.ledger.next_seq)
        return out

    # -- a step: the next ordinal -----------------------------------------------------------
    def _step(self, out: list[Outgoing]) -> bool:
        o = self.ledger.next_seq
        ref = self.seq.page(o)
        if ref is None or not self.ledger.sweep_before(o, self._forget):
            return False
        raw = self.ledger.decisions.peek(ref.dir, o)
        if raw is None:
            return False
        peeked = Decision.from_bytes(raw, self.ledger.engine)
        inputs = self._inputs(peeked, ref)
        if inputs is None:
            return False
        step = self.ledger.next(peeked)
        assert step is not None
        d, placed = step
        self._take(d, ref, inputs)
        combined = self.shard.apply(d, placed, inputs.sketch, inputs.exact, inputs.near,
                                    inputs.partials, inputs.hamming)
        self._placed(d, placed)
        if combined is not None:
            self._combined(combined, self.seq.source(o), out)
        return True

    def _others(self) -> bool:
        """The next pages, as long as they are of ids other partitions own and their
        decisions (and a stored page's exact answer) are read, up to the next sweep point:
        placed at once (``LedgerSteps.run``), their exact answers taken unread, the ids
        alive kept (``CombineShard.apply_others``). False: the next page is not one."""
        o = self.ledger.next_seq
        if self.seq.page(o) is None or not self.ledger.sweep_before(o, self._forget):
            return False
        got = self.ledger.run(self._other)
        if got is None:
            return False
        run, placed = got
        n_exact = self.topics.shape.exact
        for i in run.stored():
            self.exact.take(exact_owner(run.content_hash[i] or b"", n_exact), run.seq[i])
        self.shard.apply_others(run, placed)
        gone = []
        for doc_id, ordinal, removed in zip(run.doc_id, placed.ordinal, placed.removed,
                                            strict=True):
            if removed != NONE:  # (as ``_placed``)
                self.changed[(IDS, removed)] = None
                gone.append(removed)
            if ordinal != NONE:
                self.changed[(IDS, ordinal)] = doc_id.encode("utf-8")
        self._unstored(gone)  # (once a run: it reads every page waiting for align)
        return True

    def _other(self, d: dict[str, Any]) -> bool:
        """The decision of wire fields ``d`` is of an id another partition owns, and its
        step has all it takes (``_inputs``: a stored page's exact answer)."""
        if self.shard.owns(d["id"]):
            return False
        return d["kind"] != STORED or self.exact.peek(
            exact_owner(d["hash"], self.topics.shape.exact), d["seq"]) is not None

    def _inputs(self, d: Decision, ref: PageRef) -> Inputs | None:
        """The step's records if all are in (None: not yet)."""
        got = Inputs()
        if d.kind == "stored":
            assert d.content_hash is not None
            got.exact_part = exact_owner(d.content_hash, self.topics.shape.exact)
            raw = self.exact.peek(got.exact_part, d.seq)
            if raw is None:
                return None
            got.exact = ExactAnswer.from_bytes(raw)
        if not self.shard.owns(d.doc_id):
            return got
        if d.kind == "replay" and any(p.out.doc_id == d.doc_id for p in self.pending.values()):
            return None  # the version it repeats has no stored matches before align answers
        raw = self.sketches.peek(self.partition, (ref.batch, ref.index))
        if raw is None:
            return None
        got.sketch = sk = PageSketch.from_bytes(raw)
        if Router.relates(d):  # (the router of the id sends it: stage_router.py)
            related = self.revisits.peek(self.partition, d.seq)
            if related is None:
                return None
            got.related, got.hamming = True, msgpack.unpackb(related)
        queried = got.exact is not None and got.exact.original is None
        s = self.topics.shape
        if queried and d.near:  # (the router's rule: every near shard answers)
            near = [self.near.peek(self.partition, (d.seq, p)) for p in range(s.near)]
            if any(a is None for a in near):
                return None
            got.near = [answer_from_bytes(a)[2] for a in near if a is not None]
        if queried and sk.passage is not None and sk.passage.keys is not None:
            # (``list_windows``: every list shard has the page's windows, and answers)
            partials = [self.partials.peek(self.partition, (d.seq, k)) for k in range(s.lists)]
            if any(p is None for p in partials):
                return None
            got.partials = [ListPartial.from_bytes(p) for p in partials if p is not None]
        return got

    def _take(self, d: Decision, ref: PageRef, inputs: Inputs) -> None:
        """The step's records taken from their merges (all were peeked)."""
        c = self.partition
        if inputs.exact is not None:
            self.exact.take(inputs.exact_part, d.seq)
        if inputs.sketch is not None:
            self.sketches.take(c, (ref.batch, ref.index))
        if inputs.related:
            self.revisits.take(c, d.seq)
        for merge, got in ((self.near, inputs.near), (self.partials, inputs.partials)):
            for k in range(len(got or ())):
                merge.take(c, (d.seq, k))

    def _placed(self, d: Decision, placed: Placed) -> None:
        """The ids alive as the shard changed them, and a pending page removed."""
        if placed.removed is not None:
            self.changed[(IDS, placed.removed)] = None
            self._unstored([placed.removed])
        if placed.ordinal is not None:
            self.changed[(IDS, placed.ordinal)] = d.doc_id.encode("utf-8")

    def _forget(self, expired: list[Expired]) -> None:
        self.shard.forget(expired)
        for e in expired:
            self.changed[(IDS, e.ordinal)] = None
        self._unstored([e.ordinal for e in expired])

    def _unstored(self, ordinals: list[int]) -> None:
        """Pages waiting for align that left the store: finished without storing."""
        if not ordinals or not self.pending:
            return
        gone = set(ordinals)
        for seq, p in self.pending.items():
            if p.out.ordinal in gone:
                p.out.ordinal = None
                self.changed[(PENDING, seq)] = p.to_bytes()

    def _combined(self, combined: Combined, source: tuple[str, int, int],
                  out: list[Outgoing]) -> None:
        """A page's matches published, or its align request sent and the page kept."""
        if combined.align is None:
            self._publish(combined, [], source, out)
            return
        parts = request_parts(self.topics, combined.align, combined.seq, self.partition,
                              self.shard.ids, self.kc.max_request_size)
        p = self.pending[combined.seq] = Pending(
            combined, source, sorted({o.partition for o in parts if o.partition is not None}))
        self.changed[(PENDING, combined.seq)] = p.to_bytes()
        out.extend(parts)

    def _publish(self, combined: Combined, passages: list[tuple[str, list[Span]]],
                 source: tuple[str, int, int], out: list[Outgoing]) -> None:
        try:
            matches = self.shard.finish(combined, passages)
        except PageRejected:  # (the sketch role dead-letters these: never sequenced)
            matches = []
        out.extend(published(self.kc, combined.doc_id, matches, source, int(time.time() * 1000),
                             combined.seq))

    # -- align's answers, in ordinal order ---------------------------------------------------
    def _finish_next(self, out: list[Outgoing]) -> bool:
        """The first page waiting for align, finished and published if its answers are in."""
        if not self.pending:
            return False
        seq = next(iter(self.pending))  # (the lowest: pages wait in ordinal order)
        p, c = self.pending[seq], self.partition
        whole = self.aligned.peek(c, (seq, WHOLE))
        if whole is not None:
            self.aligned.take(c, (seq, WHOLE))
            passages = decode_aligned(whole).passages or []
        else:
            raw = [self.aligned.peek(c, (seq, part)) for part in p.parts]
            if any(r is None for r in raw):
                return False
            for part in p.parts:
                self.aligned.take(c, (seq, part))
            answers = [decode_aligned(r) for r in raw if r is not None]
            if any(a.ranked is None for a in answers):
                # (the combine has no forward records to align such a part itself)
                log.warning("page %d: an align part was not aligned there; its passages "
                            "from the other parts only", seq)
            passages = merge_ranked([a.ranked or [] for a in answers], self.max_matches)
        del self.pending[seq]
        self.changed[(PENDING, seq)] = None
        self._publish(p.out, passages, p.source, out)
        return True


class CombineRole(StageRole):
    name = stage = "combine"

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return CombinePartition(self.topics_, partition, store, self.config.engine)
