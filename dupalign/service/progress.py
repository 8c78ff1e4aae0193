"""Progress of long runs (scan, produce) on stderr.

On a terminal: a tqdm bar (messages printed through it, so they do not break it). Not on a
terminal (a log file, CI): nothing while the run goes, unless progress lines were asked for
(``--progress``), then one complete line every few seconds; the command prints its one-line
summary at the end either way.

Before the first item, a run may wait long for something else (a first run compiles the
engine's kernels: minutes): ``waiting`` names it on the bar until the first item is done,
and rates count from then, so neither shows a rate near 0 that is no rate at all.
"""

from __future__ import annotations

import time
from typing import IO, Any


class Progress:
    def __init__(self, stream: IO[str], enabled: bool = True, lines: bool = False,
                 unit: str = "pages", every_s: float = 5.0, waiting: str | None = None
                 ) -> None:
        self.stream, self.unit, self.every_s = stream, unit, every_s
        self.count = 0
        self.start = self.last = time.monotonic()
        self._first = 0  # items done when ``start`` was taken: rates count from the first
        self._waiting = waiting
        self._bar: Any = None
        self._lines = False
        if enabled and _isatty(stream):
            from tqdm import tqdm

            self._bar = tqdm(file=stream, unit=f" {unit}", mininterval=0.5, dynamic_ncols=True,
                             leave=True, desc=waiting)
        elif lines:
            self._lines = True

    def rate(self) -> float | None:
        """Items a second since the first was done; None before a second one."""
        elapsed = time.monotonic() - self.start
        if self.count <= self._first or elapsed <= 0:
            return None
        return (self.count - self._first) / elapsed

    def update(self, n: int = 1, status: str = "") -> None:
        """``n`` more done; ``status`` (e.g. "12 matches") shown beside the count."""
        if self.count == 0 and n > 0:  # the wait before the first item is over
            self.start = self.last = time.monotonic()
            self._first = n
        self.count += n
        if self._bar is not None:
            if self.count == n:
                self._bar.unpause()  # its rate and elapsed time from now, as ours
                if self._waiting:
                    self._bar.set_description(None, refresh=False)
            self._bar.update(n)
            if status:
                self._bar.set_postfix_str(status, refresh=False)
        elif self._lines and time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            self._line(status)

    def write(self, message: str) -> None:
        """A message line (a skipped input, say) that does not garble the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _line(self, status: str) -> None:
        rate = self.rate()
        shown = [f"{self.count} {self.unit}"] + (
            [] if rate is None else [f"{rate:.1f} {self.unit}/s"]) + ([status] if status else [])
        print(", ".join(shown), file=self.stream, flush=True)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
