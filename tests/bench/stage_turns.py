"""How many pages each committed turn of a stage partition applied, read back from its
changelog (bench_stage_roles; issue 43): a turn that changed the store is one transaction,
whose records sit at consecutive offsets followed by its commit marker, and the ledger's
``next_seq`` note (the near partition's cursor "next") in it says how far the partition got.

A transaction's pages are the rise of that note since the partition's previous one (0 when
the transaction has none: it took records that applied nothing yet, or it answered or
finished pages held back, as the combine's align answers). Aborted transactions leave wider
gaps between offsets and are not turns here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

# upper bounds of the histogram's buckets (pages a turn): 0, 1, 2-3, 4-7, ... 256+
BUCKETS = (0, 1, 3, 7, 15, 31, 63, 127, 255)


def transactions_of(records: Iterable[Any]) -> dict[int, list[list[Any]]]:
    """The records of each partition grouped by transaction, in offset order: records at
    consecutive offsets belong to one (a changelog partition has one transactional writer at
    a time; a commit marker takes the offset after a transaction's last record)."""
    by_part: dict[int, list[Any]] = {}
    for r in records:
        by_part.setdefault(r.partition, []).append(r)
    out: dict[int, list[list[Any]]] = {}
    for p, recs in by_part.items():
        recs.sort(key=lambda r: r.offset)
        groups: list[list[Any]] = []
        for r in recs:
            if groups and r.offset == groups[-1][-1].offset + 1:
                groups[-1].append(r)
            else:
                groups.append([r])
        out[p] = groups
    return out


def turn_pages(records: Iterable[Any], progress: Callable[[Any], int | None],
               since: int = 0, until: float = float("inf")) -> list[int]:
    """Pages applied by each committed transaction of every partition, those that began
    with the partition's progress in [``since``, ``until``) (the warm-up's pages and those
    sent later left out). ``progress``: the ordinal a record notes the partition has
    reached, or None for any other record."""
    out: list[int] = []
    for groups in transactions_of(records).values():
        at = 0
        for group in groups:
            noted = [n for n in map(progress, group) if n is not None]
            new = noted[-1] if noted else at
            if since <= at < until:
                out.append(new - at)
            at = new
    return out


def bucket_name(i: int) -> str:
    lo = 0 if i == 0 else BUCKETS[i - 1] + 1
    if i == len(BUCKETS):
        return f"{lo}+"
    hi = BUCKETS[i]
    return str(lo) if lo == hi else f"{lo}-{hi}"


def histogram(pages: list[int]) -> list[int]:
    """How many turns fall in each bucket of ``BUCKETS`` (and the last, past them)."""
    counts = [0] * (len(BUCKETS) + 1)
    for n in pages:
        counts[next((i for i, hi in enumerate(BUCKETS) if n <= hi), len(BUCKETS))] += 1
    return counts


def turns_table(rows: list[tuple[str, dict[str, list[int]]]]) -> str:
    """Per setup and stage: the turns (transactions), the pages a turn (mean over the turns
    that applied any, median, largest) and the histogram."""
    names = [bucket_name(i) for i in range(len(BUCKETS) + 1)]
    lines = ["pages applied per committed turn of each stage partition (changelog "
             "transactions after the warm-up; histogram: turns by pages)",
             "| setup | stage | turns | mean (turns with pages) | median | max | "
             + " | ".join(names) + " |", "|---|---|---|---|---|---|" + "---|" * len(names)]
    for setup, stages in rows:
        for stage, pages in stages.items():
            applying = [n for n in pages if n > 0]
            mean = statistics.fmean(applying) if applying else 0.0
            median = statistics.median(pages) if pages else 0
            lines.append(f"| {setup} | {stage} | {len(pages)} | {mean:.1f} | {median:g} | "
                         f"{max(pages, default=0)} | "
                         + " | ".join(str(c) for c in histogram(pages)) + " |")
    return "\n".join(lines)
