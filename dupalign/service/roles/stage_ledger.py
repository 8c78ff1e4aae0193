"""The ledger of a stage role's partition (dupalign.stages.ledger_store): every directory
partition's decisions, read from ``<in>.decisions`` and merged in ordinal order by the
sequence, and the retention sweeps, each before the first page at a multiple of
``retention.every`` ordinals with the clock of that page's batch. The decisions at and
after a sweep point wait until the stage has swept there (``sweep_before``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dupalign.config import EngineConfig
from dupalign.service.roles.stage_role import StagePartition
from dupalign.service.topology import record_ordinal
from dupalign.stages.directory import Decision, Decisions
from dupalign.stages.index import engine_info
from dupalign.stages.ledger import Expired, Placed, Placements
from dupalign.stages.ledger_store import StoredLedger
from dupalign.store.database import Batch, Store
from dupalign.wire.versions import DIRECTORY_DECISION

RUN_WINDOW = 16  # ordinals of the sequence a run reads first (then 32, 64, ...)


class LedgerSteps:
    """The ledger of ``part`` over ``store``; its place in the decisions is the part's
    merge of ``<in>.decisions``."""

    def __init__(self, part: StagePartition, config: EngineConfig, store: Store) -> None:
        self.part, self.retention = part, config.retention
        self.engine = engine_info(config)
        self.ledger = StoredLedger(store)
        self.decisions = part.merge(part.topics.decisions, range(part.topics.shape.directory))
        self.swept: int = part.noted.get("swept", 0)  # the last sweep point swept
        # (next_seq, swept) when the rows were last written: unchanged, nothing to write
        self._written: tuple[int, int] | None = None

    @property
    def next_seq(self) -> int:
        return self.ledger.next_seq

    @staticmethod
    def key_of(record: Any) -> int:
        return record_ordinal(record)

    def due(self, o: int) -> bool:
        """A sweep is due before page ``o`` and not done yet."""
        r = self.retention
        return bool(r.max_pages or r.max_age) and o > self.swept and o % r.every == 0

    def sweep_before(self, o: int, forget: Callable[[list[Expired]], Any]) -> bool:
        """Before page ``o``: the sweep due there, once the ledger holds every decision
        below it (False: not yet)."""
        if not self.due(o):
            return True
        if self.ledger.next_seq < o:
            return False
        ref = self.part.seq.page(o)
        assert ref is not None
        r = self.retention
        forget(self.ledger.sweep(r.max_pages, r.max_age, ref.at_ms))
        self.swept = o
        return True

    def peek(self) -> Decision | None:
        """The next decision, not applied (None: not read yet, or a sweep is due first)."""
        o = self.ledger.next_seq
        ref = self.part.seq.page(o)
        if ref is None or self.due(o):
            return None
        raw = self.decisions.peek(ref.dir, o)
        return None if raw is None else Decision.from_bytes(raw, self.engine)

    def next(self, peeked: Decision | None = None) -> tuple[Decision, Placed] | None:
        """The next decision, placed (None: not read yet, or a sweep is due first);
        ``peeked``: the same decision, as ``peek`` read it (not read again)."""
        o = self.ledger.next_seq
        ref = self.part.seq.page(o)
        if ref is None or self.due(o):
            return None
        raw = self.decisions.take(ref.dir, o)
        if raw is None:
            return None
        d = Decision.from_bytes(raw, self.engine) if peeked is None else peeked
        return d, self.ledger.apply(d)

    def run(self, fits: Callable[[dict[str, Any]], bool], limit: int = 10_000
            ) -> tuple[Decisions, Placements] | None:
        """The decisions from the next one on that are read, up to the next sweep point
        and while ``fits`` says so of each one's wire fields (``DIRECTORY_DECISION``),
        taken and placed at once (``StoredLedger.apply_run``; None: not one). Each is
        decoded once, to its fields: the step of a page a partition does not own needs no
        more (no ``Decision``, no ``Placed``). The sequence is read in windows that double
        (``RUN_WINDOW`` first): a run as long as the decisions that fit, not as the
        backlog (a turn of a backlog reads thousands of ordinals ahead, and a partition
        of P asks for a run at every P-th page or so)."""
        o, every = self.ledger.next_seq, self.retention.every
        if self.due(o):
            return None
        stop = o + limit
        if self.retention.max_pages or self.retention.max_age:
            stop = min(stop, (o // every + 1) * every)  # (the next sweep point)
        dirs: list[int] = []
        fields: list[dict[str, Any]] = []
        window = RUN_WINDOW
        while len(fields) == len(dirs) and (at := o + len(dirs)) < stop:
            more = self.part.seq.dirs(at, min(stop, at + window))
            if not more:
                break
            dirs += more
            for k, d in enumerate(more, at):
                raw = self.decisions.peek(d, k)
                if raw is None:
                    break
                f = DIRECTORY_DECISION.unpack(raw)
                if not fits(f):
                    break
                fields.append(f)
            window *= 2
        if not fields:
            return None
        for k in range(len(fields)):
            self.decisions.take(dirs[k], o + k)
        run = Decisions.of_fields(fields)
        return run, self.ledger.apply_run(run)

    def catch_up(self) -> None:
        while self.run(lambda fields: True) is not None:
            pass

    def note(self, batch: Batch) -> None:
        """The rows and counters changed, if any: every change is an apply (next_seq
        moves) or a sweep (swept moves); a turn that applied nothing writes nothing, so it
        needs no transaction (``StageRole._work``)."""
        at = (self.ledger.next_seq, self.swept)
        if at != self._written:
            self.ledger.write(batch)
            self._written = at

    def extra(self) -> dict[str, Any]:
        return {"swept": self.swept}


class LedgerPartition(StagePartition):
    """A stage partition whose place is its ledger's (``self.ledger``, made by the
    subclass): the decisions' merge key, the lowest ordinal needed, the ledger's rows."""

    ledger: LedgerSteps

    def key_of(self, topic: str, record: Any) -> Any:
        return self.ledger.key_of(record)

    def needed(self) -> int:
        return self.ledger.next_seq

    def note(self, batch: Any) -> None:
        self.ledger.note(batch)

    def extra(self) -> dict[str, Any]:
        return self.ledger.extra()
