"""Progress of long runs (scan, produce) on stderr.

On a terminal: a tqdm bar (messages printed through it, so they do not break it). Not on a
terminal (a log file, CI): nothing while the run goes, unless progress lines were asked for
(``--progress``), then one complete line every few seconds; the command prints its one-line
summary at the end either way.
"""

from __future__ import annotations

import time
from typing import IO, Any


class Progress:
    def __init__(self, stream: IO[str], enabled: bool = True, lines: bool = False,
                 unit: str = "pages", every_s: float = 5.0) -> None:
        self.stream, self.unit, self.every_s = stream, unit, every_s
        self.count = 0
        self.start = self.last = time.monotonic()
        self._bar: Any = None
        self._lines = False
        if enabled and _isatty(stream):
            from tqdm import tqdm

            self._bar = tqdm(file=stream, unit=f" {unit}", mininterval=0.5, dynamic_ncols=True,
                             leave=True)
        elif lines:
            self._lines = True

    def rate(self) -> float:
        return self.count / max(time.monotonic() - self.start, 1e-9)

    def update(self, n: int = 1, status: str = "") -> None:
        """``n`` more done; ``status`` (e.g. "12 matches") shown beside the count."""
        self.count += n
        if self._bar is not None:
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
        extra = f", {status}" if status else ""
        print(f"{self.count} {self.unit}, {self.rate():.1f} {self.unit}/s{extra}",
              file=self.stream, flush=True)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
