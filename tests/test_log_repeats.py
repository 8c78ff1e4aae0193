"""Repeated Kafka client log lines are folded into one line per kind and window."""

from __future__ import annotations

import logging

from worker.log_repeats import RepeatFolder


def record(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_a_kind_repeated_within_the_window_is_counted_then_reported_once() -> None:
    now = [100.0]
    folder = RepeatFolder(window=30.0, clock=lambda: now[0])
    connect = "Unable connect to node with id %s: %s"
    assert folder.filter(record("aiokafka", connect, 1, "refused"))
    shown = []
    for t in range(1, 30):  # 175 a second in the broker outage test; one a second here
        now[0] = 100.0 + t
        shown.append(folder.filter(record("aiokafka", connect, 1, f"refused {t}")))
    assert not any(shown)
    # another kind (other logger, level or template) is not held back by the first
    assert folder.filter(record("aiokafka.consumer.fetcher", connect, 1, "refused"))
    assert folder.filter(record("aiokafka", connect, 1, "x", level=logging.WARNING))
    assert folder.filter(record("aiokafka", "Unable to update metadata from %s", [1]))
    now[0] = 131.0
    after = record("aiokafka", connect, 1, "refused again")
    assert folder.filter(after)
    assert after.getMessage() == ("Unable connect to node with id 1: refused again "
                                  "(and 29 more like it in the last 31 s)")
    now[0] = 132.0  # a new window began with that line
    assert not folder.filter(record("aiokafka", connect, 1, "refused"))


def test_other_loggers_pass_untouched() -> None:
    folder = RepeatFolder(clock=lambda: 0.0)
    for _ in range(3):
        line = record("dupalign.worker", "batch of %s failed", "p-0")
        assert folder.filter(line)
        assert line.getMessage() == "batch of p-0 failed"
    assert folder.filter(record("aiokafkax", "same"))
    assert folder.filter(record("aiokafkax", "same"))
