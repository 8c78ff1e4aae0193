"""The align role (worker/role_align.py) on a record it cannot align: no Kafka needed."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import msgpack
from aiokafka import TopicPartition

from worker import messages
from worker.config import Config
from worker.role_align import AlignRole
from worker.topology import decode_aligned, ordinal_header


def test_an_align_request_it_cannot_read_is_dead_lettered_and_left_to_the_index() -> None:
    """A request of another wire version (retained requests after an upgrade) made the
    role raise: the process stopped at that offset, and so did every one that took the
    partition after it, while the index waited for that page's answer. Now: a dead letter
    with the record, and the answer "not aligned here" for its part, so the index aligns
    the page itself (no passage lost) and goes on; a record without an ordinal is only
    dead-lettered."""
    role = AlignRole(Config())
    kc = role.kc
    tp = TopicPartition(kc.align_topic, 0)
    old = msgpack.packb({"v": 1, "ordinal": 5}, use_bin_type=True)
    records = [SimpleNamespace(topic=tp.topic, partition=0, offset=offset, key=key,
                               value=value, headers=headers)
               for offset, key, value, headers in (
                   (0, struct.pack(">q", 5), old, [ordinal_header(5)]),
                   (1, None, b"\xc1", []))]
    out = role.prepare(tp, records)
    assert [o.topic for o in out] == [kc.dlq_topic, kc.aligned_topic, kc.dlq_topic]
    letters = [messages.decode_dead_letter(o.value) for o in out if o.topic == kc.dlq_topic]
    assert [(d["source"]["offset"], d["error"]) for d in letters] == [(0, "internal_error"),
                                                           (1, "internal_error")]
    assert "align request" in letters[0]["detail"]
    answer = decode_aligned(out[1].value)
    assert (answer.ordinal, answer.part, answer.ranked, answer.passages) == (5, 0, None, None)
