"""Kafka client log lines that repeat, folded: while the broker is away, aiokafka logs the
same few errors for every request it retries (about 175 lines a second on a worker seen in
tests/service/test_worker_broker_outage.py). The first line of a kind goes out; the same kind
(logger, level, message template) within the next ``window`` seconds is counted instead,
and the next one after the window says how many were folded."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

Key = tuple[str, int, str]


class RepeatFolder(logging.Filter):
    def __init__(self, prefix: str = "aiokafka", window: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.prefix, self.window, self.clock = prefix, window, clock
        self.shown: dict[Key, tuple[float, int]] = {}  # kind -> (shown at, folded since)

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name == self.prefix or record.name.startswith(self.prefix + ".")):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        last = self.shown.get(key)
        if last is not None and now - last[0] < self.window:
            self.shown[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record.msg = f"{record.msg} (and {last[1]} more like it in the last " \
                         f"{now - last[0]:.0f} s)"
        if len(self.shown) > 1024:  # bounded, whatever the client logs
            self.shown.clear()
        self.shown[key] = (now, 0)
        return True


# aiokafka's errors that a healthy start produces: a consumer subscribed to a topic that the
# broker creates on first use (auto.create.topics.enable) reads "not found" until it exists;
# on a new broker, the group coordinator is not available until __consumer_offsets exists.
STARTUP_NOISE = {
    ("aiokafka.cluster", "Topic %s not found in cluster metadata"),
    ("aiokafka.consumer.group_coordinator", "Group Coordinator Request failed: %s"),
    ("aiokafka.consumer.group_coordinator", "Marking the coordinator dead (node %s)for group %s."),
}


class StartupGrace(logging.Filter):
    """The STARTUP_NOISE lines, INFO instead of ERROR or WARNING while the process starts
    consuming: from ``begin()`` (just before it subscribes; a first run's kernel compilation
    comes before) until ``end()`` (it has its first partitions) or ``grace`` seconds,
    whichever comes first. Outside that they are what aiokafka says they are: a topic
    missing then is an error. Only retriable coordinator errors are demoted."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.until = float("-inf")

    def begin(self, grace: float = 60.0) -> None:
        self.until = self.clock() + grace

    def end(self) -> None:
        self.until = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno <= logging.INFO or (record.name, record.msg) not in STARTUP_NOISE
                or self.clock() >= self.until):
            return True
        if str(record.msg).startswith("Group Coordinator Request failed"):
            err = record.args[0] if isinstance(record.args, tuple) and record.args else None
            if not getattr(err, "retriable", False):
                return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = f"{record.msg} (usual while a worker starts on a new topic or broker)"
        return logging.getLogger().isEnabledFor(logging.INFO)


# the process's one StartupGrace: setup_logging installs it, the worker begins and ends it
STARTUP = StartupGrace()
