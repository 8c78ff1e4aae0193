"""Repeated Kafka client log lines are folded into one line per kind and window."""

from __future__ import annotations

import logging
from typing import Any

from dupalign.service.log_repeats import RepeatFolder


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


def test_startup_noise_is_info_while_the_worker_starts_and_an_error_after() -> None:
    """Issue 40: aiokafka's "Topic ... not found" on a healthy first start was an ERROR."""
    from dupalign.service.log_repeats import StartupGrace

    now = [0.0]
    grace = StartupGrace(clock=lambda: now[0])
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)  # (the demoted lines go out only if INFO does)
    try:
        _check_startup_grace(grace, now)
    finally:
        root.setLevel(level)


def _check_startup_grace(grace: Any, now: list[float]) -> None:
    from aiokafka.errors import GroupAuthorizationFailedError, GroupCoordinatorNotAvailableError

    missing = "Topic %s not found in cluster metadata"
    coordinator = "Group Coordinator Request failed: %s"
    before = record("aiokafka.cluster", missing, "pages")
    assert grace.filter(before) and before.levelno == logging.ERROR  # not begun yet
    grace.begin(grace=60.0)
    during = [record("aiokafka.cluster", missing, "pages"),
              record("aiokafka.consumer.group_coordinator", coordinator,
                     GroupCoordinatorNotAvailableError())]
    for line in during:
        assert grace.filter(line) and line.levelname == "INFO", line.getMessage()
        assert line.getMessage().endswith("(usual while a worker starts on a new topic or "
                                          "broker)")
    fatal = record("aiokafka.consumer.group_coordinator", coordinator,
                   GroupAuthorizationFailedError())
    other = record("aiokafka.cluster", "'%s' is not a valid topic name", "p@ges")
    for line in (fatal, other):
        assert grace.filter(line) and line.levelno == logging.ERROR
    grace.end()  # the worker has its partitions: a topic missing now is an error
    after = record("aiokafka.cluster", missing, "pages")
    assert grace.filter(after) and after.levelno == logging.ERROR
    grace.begin(grace=60.0)
    now[0] = 61.0  # or the start took longer than the grace
    late = record("aiokafka.cluster", missing, "pages")
    assert grace.filter(late) and late.levelno == logging.ERROR
