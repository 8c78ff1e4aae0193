"""The topics of the partitioned pipeline's roles (docs/pipeline.md, "Roles on Kafka"), named
after ``kafka.input_topic``, with the partition counts of the shape."""

from __future__ import annotations

from typing import Any

from dupalign.service.changelog import changelog_topic
from dupalign.service.config import KafkaConfig
from dupalign.stages.partitioned import Shape


class StageTopics:
    """``batches`` (1 partition: the sequence), ``entries`` and ``decisions`` (D),
    ``exact`` (E), ``near_state`` (R), ``near_ops`` (P), ``windows`` (S: the list partitions'
    windows of each page), the combine's inputs ``sketches``, ``near_answers``, ``partials``
    and ``aligned`` (C: partition c = the combine partition that owns the page's id), and
    the align stage's inputs ``passages`` and ``align_requests`` (A), the learner's ``idf``
    (1, compacted) and the routers' ``revisits`` (C), and each stage's changelog (as many as
    the stage has partitions)."""

    def __init__(self, kc: KafkaConfig, shape: Shape) -> None:
        base = kc.input_topic
        self.kc, self.shape = kc, shape
        self.batches = f"{base}.batches"
        self.entries = f"{base}.entries"
        self.decisions = f"{base}.decisions"
        self.exact = f"{base}.exact"
        self.windows = f"{base}.windows"
        # the near stage: the routers' inputs by id, their ops by prefix
        self.near_state = f"{base}.near_state"
        self.near_ops = f"{base}.near_ops"
        # the combine's inputs (C partitions each: partition c = the combine partition that
        # owns the page's id) and its align answers; its requests go to today's align topic
        self.sketches = f"{base}.sketches"
        self.near_answers = f"{base}.near_answers"
        self.partials = f"{base}.partials"
        self.aligned = f"{base}.aligned"
        # the align stage (A partitions: partition a = the align partition owning the
        # page's id, ``directory_owner(id, A)``): the sketch role's forward records, the
        # combine's requests and its progress (stage_align.py)
        self.passages = f"{base}.passages"
        self.align_requests = f"{base}.align_requests"
        # the learner's frozen idf tables and models (1 partition, compacted: stage_learner.py)
        # and the routers' revisit distances, for the combine (C)
        self.idf = f"{base}.idf"
        self.revisits = f"{base}.revisits"

    def parted(self) -> frozenset[str]:
        """The stage roles' outputs that grow with a page and go in parts over the record
        limit (their readers' merges put them together: ``StagePartition._add``)."""
        return frozenset({self.partials, self.near_answers, self.aligned})

    def partitions(self, stage: str) -> int:
        """The partitions of ``stage`` (a role's changelog has as many)."""
        counts = {"directory": self.shape.directory, "exact": self.shape.exact,
                  "router": self.shape.router, "near": self.shape.near,
                  "lists": self.shape.lists, "combine": self.shape.combine,
                  "align": self.shape.align, "learner": 1}
        if stage not in counts:
            raise ValueError(f"no stage role {stage!r} yet: {', '.join(counts)}")
        return counts[stage]

    def changelog(self, stage: str) -> str:
        return changelog_topic(self.kc, stage)

    def outputs(self, role: str) -> tuple[str, ...]:
        """What ``role`` of ``dupalign stage`` writes besides its changelog: one writer a
        topic (the roles' reads come from their partitions' merges: ``dupalign acls
        --stage``, dupalign/service/roles/stage_acls.py; tests/service/test_stage_acls.py
        checks these against what the roles send and read)."""
        kc = self.kc
        written = {"sketch": (self.batches, self.entries, self.windows, self.near_state,
                              self.sketches, self.passages, kc.dlq_topic),
                   "directory": (self.decisions,), "exact": (self.exact,),
                   "learner": (self.idf,), "router": (self.near_ops, self.revisits),
                   "near": (self.near_answers,), "lists": (self.partials,),
                   "combine": (self.align_requests, kc.output_topic), "align": (self.aligned,)}
        if role not in written:
            raise ValueError(f"no stage role {role!r}: {', '.join(written)}")
        return written[role]

    def wanted(self) -> dict[str, int | None]:
        """Every topic between the roles built so far, with its partition count."""
        kc, shape = self.kc, self.shape
        return {kc.input_topic: None, kc.dlq_topic: None, self.batches: 1,
                self.entries: shape.directory, self.decisions: shape.directory,
                self.exact: shape.exact, self.near_state: shape.router,
                self.near_ops: shape.near, self.windows: shape.lists, **self._combine(),
                **self._align()}

    # -- how the roles make and check them (``dupalign stage``) ------------------------------
    def options(self) -> dict[str, Any]:
        """``ensure_topics``' options for these topics: the shape named when a topic's
        partition count is another (none is kept forever: each stage's state is in its
        compacted changelog)."""
        s = self.shape
        shape = (f"{s.directory},{s.exact},{s.near},{s.lists},{s.combine},{s.router},"
                 f"{s.align}")
        return {"counts_from": (
            f"kafka.shape = {shape} (the partitions of the directory, exact, near, lists, "
            "combine, router and align stages) gives it: every process of a deployment needs "
            "the shape its topics were made with, and another shape needs new topics "
            "(another kafka.input_topic; docs/topology.md)")}

    def _combine(self) -> dict[str, int | None]:
        c, kc = self.shape.combine, self.kc
        return {self.sketches: c, self.near_answers: c, self.partials: c, self.aligned: c,
                self.revisits: c, kc.output_topic: None}

    def _align(self) -> dict[str, int | None]:
        return {self.passages: self.shape.align, self.align_requests: self.shape.align}
