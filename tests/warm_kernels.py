"""Compile numba's kernels into its cache before the test workers start.

A fresh clone has no cache: each pytest-xdist worker would compile every kernel itself
(about two minutes of CPU each, the same work twice or three times). ``conftest`` runs this
module once per passage mode, the modes in parallel, before the workers start; the workers
and the role processes they spawn then load the kernels from the cache. A kernel this
workload misses is compiled where it is first called, as before: slower, never wrong.

Run as ``python -m tests.warm_kernels MODE`` (MODE: oph or weighted).
"""

from __future__ import annotations

import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from dupalign.config import EngineConfig, PassageConfig, RetentionConfig
from dupalign.engine import Engine
from dupalign.page import Page

_WORDS = [f"w{i}" for i in range(400)]


def _pages(seed: int) -> list[Page]:
    """Pages made of shared paragraphs, some copied whole, some edited: every stage runs
    (exact, near, passage tasks and their alignment)."""
    rng = random.Random(seed)
    paragraphs = [" ".join(rng.choice(_WORDS) for _ in range(120)) for _ in range(12)]
    pages = []
    for i in range(30):
        parts = rng.sample(paragraphs, 3)
        if i % 5 == 4:  # a near copy of an earlier page
            words = str(pages[i - 1].body).split()
            words[rng.randrange(len(words))] = "edited"
            parts = [" ".join(words)]
        pages.append(Page(f"d{i}", " ".join(parts), fetched_at=i))
    return pages


def warm(mode: str, root: Path) -> None:
    config = replace(EngineConfig(passage=PassageConfig(mode=mode)),
                     retention=RetentionConfig(max_pages=20)).validate()
    pages = _pages(1)
    for shards in (1, 2):
        with Engine.open(root / f"s{shards}", config, shards=shards) as engine:
            for page in pages:
                engine.process(page)
            engine.process(Page("d3", str(pages[7].body) + " changed"))  # a revisit
            engine.delete(["d5"])
            engine.compact(now_ms=100)
            engine.process(pages[2])  # an unchanged revisit


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        warm(sys.argv[1], Path(d))


if __name__ == "__main__":
    main()
