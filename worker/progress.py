"""A throttled one-line progress report on stderr for long runs (scan, produce)."""

from __future__ import annotations

import time
from typing import IO


class Progress:
    def __init__(self, stream: IO[str], enabled: bool, every_s: float = 1.0) -> None:
        self.stream, self.enabled, self.every_s = stream, enabled, every_s
        self.start = self.last = time.monotonic()
        self.shown = False

    def rate(self, count: int) -> float:
        return count / max(time.monotonic() - self.start, 1e-9)

    def tick(self, line: str, force: bool = False) -> None:
        """Rewrite the progress line if enough time passed (or ``force``)."""
        now = time.monotonic()
        if self.enabled and (force or now - self.last >= self.every_s):
            self.stream.write("\r" + line)
            self.stream.flush()
            self.last = now
            self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\n")
