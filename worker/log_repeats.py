"""Kafka client log lines that repeat, folded: while the broker is away, aiokafka logs the
same few errors for every request it retries (about 175 lines a second on a worker seen in
tests/test_worker_broker_outage.py). The first line of a kind goes out; the same kind
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
