"""The sketch role's pages without Kafka (dupalign/service/roles/stage_sketch.py): it
dead-letters the records it cannot sketch (``sketch_record``: too large, empty, not a page)
and sequences the others in order; the stage role's entries
go to the directory partition of their id, one sequence record per batch."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from aiokafka import TopicPartition

from dupalign.config import NearConfig
from dupalign.page import Page
from dupalign.service.config import Config
from dupalign.service.roles.stage_sketch import StageSketchRole
from dupalign.stages.directory import DirectoryEntry, directory_owner
from dupalign.stages.partitioned import Shape
from dupalign.wire import messages

FROZEN = replace(Config(), engine=replace(Config().engine,
                                          near=NearConfig(idf_freeze_at=())).validate())


def records(tp: TopicPartition) -> list[SimpleNamespace]:
    pages = [Page(f"p{k}", f"text of page {k} " * 3) for k in range(6)]
    raw: list[tuple[bytes | None, bytes | None]] = [
        (p.id.encode(), messages.encode_page(p)) for p in pages]
    raw.insert(2, (b"empty", messages.encode_page(Page("empty", ""))))
    raw.insert(4, (b"big", b"x" * (FROZEN.worker.max_message_bytes + 1)))
    raw.insert(5, (b"junk", b"\xc1"))
    raw.append((b"p1", None))  # a tombstone: a delete, sequenced
    return [SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=o, key=k, value=v,
                            headers=[]) for o, (k, v) in enumerate(raw)]


def test_the_sketch_role_dead_letters_what_it_cannot_sketch_and_sequences_the_rest() -> None:
    tp = TopicPartition(FROZEN.kafka.input_topic, 1)
    recs = records(tp)
    new = StageSketchRole(FROZEN, Shape(3, 1, 1, 1, 1)).prepare(tp, recs)
    dead = [messages.decode_dead_letter(d.value)["source"]["offset"] for d in new.dead_letters]
    assert dead == [2, 4, 5]
    assert new.offsets == [o for o in range(len(recs)) if o not in dead]
    assert len(new.entries) == len(new.offsets)
    ids = [DirectoryEntry.from_bytes(e.value).doc_id for e in new.entries]
    assert ids == ["p0", "p1", "p2", "p3", "p4", "p5", "p1"]
    assert DirectoryEntry.from_bytes(new.entries[-1].value).deleted
    assert new.dirs == [directory_owner(i, 3) for i in ids]
    assert [e.partition for e in new.entries] == new.dirs


def test_the_stage_roles_take_the_default_engine_config() -> None:
    """Learned idf tables included (docs/pipeline.md, rule 7: the learner role)."""
    assert Config().engine.near.idf_freeze_at
    StageSketchRole(Config(), Shape())
