"""Where a process's time went, by function, from py-spy's raw collapsed stacks (one line a
stack: ``frame;frame;... count``, a frame ``function (file:line)``): each function's share of
the samples inside it (inclusive) and at the top (self), largest first.

    python -m tests.bench.spy_summary FILE [FILE ...] [--top 40] [--under FUNCTION]

Several files are summed (the copies of one role). ``--under``: only the stacks through a
function whose name contains it (the shares stay of all samples). Samples waiting in the
event loop's ``select`` or on a lock are left out (py-spy ``--nonblocking`` counts some of
them as active): shares are of the samples doing work.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

# leaves that wait, not work
IDLE = ("EpollSelector.select", "Condition.wait", "Event.wait", "_worker (thread.py)")
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """``function (file)`` without the line number: one name per function."""
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip()
    return f"{m['fn']} ({m['file'].rsplit('/', 1)[-1]})"


def summary(paths: list[Path], under: str | None = None) -> tuple[int, Counter[str],
                                                                  Counter[str]]:
    total, inclusive, own = 0, Counter[str](), Counter[str]()
    for path in paths:
        for line in path.read_text("utf-8", "replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [frame_name(f) for f in stack.split(";")]
            if frames[-1].startswith(IDLE):
                continue
            total += n
            if under is not None and not any(under in f for f in frames):
                continue
            for f in set(frames):
                inclusive[f] += n
            own[frames[-1]] += n
    return total, inclusive, own


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--under")
    args = p.parse_args()
    total, inclusive, own = summary(args.files, args.under)
    if not total:
        print("no samples")
        return 1
    print(f"{total} samples")
    print("| inclusive % | self % | function |\n|---|---|---|")
    for f, n in inclusive.most_common(args.top):
        print(f"| {100 * n / total:.1f} | {100 * own[f] / total:.1f} | {f} |")
    print("\nself, largest first")
    for f, n in own.most_common(args.top // 2):
        print(f"| {100 * inclusive[f] / total:.1f} | {100 * n / total:.1f} | {f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
