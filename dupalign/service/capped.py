"""Per-item messages of a run (a rejected line, a skipped record), capped: garbage input
would otherwise print one stderr line per bad line, without end. The first ``limit`` are
shown, the others counted and said in one line at the end, beside the run's summary."""

from __future__ import annotations

from collections.abc import Callable

LIMIT = 20


class CappedLines:
    def __init__(self, write: Callable[[str], None], limit: int = LIMIT) -> None:
        self.write, self.limit = write, limit
        self.count = 0

    def add(self, line: str) -> None:
        self.count += 1
        if self.count <= self.limit:
            self.write(line)

    @property
    def hidden(self) -> int:
        return max(0, self.count - self.limit)

    def close(self, what: str = "rejected or skipped") -> None:
        """Say how many were not shown, if any."""
        if self.hidden:
            self.write(f"... and {self.hidden} more {what} (not shown: the first "
                       f"{self.limit} are)")
