"""Compile numba's kernels into its cache before the test workers start.

A fresh clone has no cache: each pytest-xdist worker would compile every kernel itself
(about two minutes of CPU each, the same work twice or three times). ``conftest`` runs this
module once per passage mode, the modes in parallel, before the workers start; the workers
and the role processes they spawn then load the kernels from the cache. A kernel this
workload misses is compiled where it is first called, as before: slower, never wrong.

Run as ``python -m tests.warm_kernels`` (both modes, when not cached; ``make warm-kernels``)
or ``python -m tests.warm_kernels MODE`` (MODE: oph or weighted).
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from dupalign.config import EngineConfig, PassageConfig, RetentionConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.align import Aligner
from dupalign.stages.messages import AlignRequest
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.stages.sketch import PageSketch

REPO = Path(__file__).resolve().parent.parent
MODES = ("oph", "weighted", "weighted_oph")
_WORDS = [f"w{i}" for i in range(400)]


def _pages(seed: int) -> list[Page]:
    """Pages made of shared paragraphs, some copied whole, some edited: every stage runs
    (exact, near, passage tasks and their alignment). Some words are not ASCII: Python
    stores such text in 2 or 4 bytes a character, and the tokenizer's kernel is compiled
    for each width."""
    rng = random.Random(seed)
    words = [*_WORDS, "caf\u00e9", "\u6f22\u5b57", "\U0001f600x"]
    paragraphs = [" ".join(rng.choice(words) for _ in range(120)) for _ in range(12)]
    pages: list[Page] = []
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
    with Engine.open(root / "s", config) as engine:
        for page in pages:
            engine.process(page)
        engine.process(Page("d3", str(pages[7].body) + " changed"))  # a revisit
        engine.delete(["d5"])
        engine.compact(now_ms=100)
        engine.process(pages[2])  # an unchanged revisit
    with Engine.open(root / "carried", config) as engine:
        _carried(engine, pages)
    # the partitioned pipeline's own kernels (the router's probes, the prefix shards' answers)
    with Partitioned.open(root / "partitioned", config, Shape(2, 1, 2, 2, 1)) as pipeline:
        for page in pages:
            with contextlib.suppress(PageRejected):
                pipeline.process(page)


def _carried(engine: Engine, pages: list[Page]) -> None:
    """Sketches and align requests through their wire form, align without a store, as
    tests.bench.align_replay replays them (the forward records carried: int64 rectangles,
    not the list cache's int32 ones)."""
    no_store = Aligner(engine.config)
    for page in pages:
        result = engine.index(PageSketch.from_bytes(engine.sketch(page).to_bytes()))
        if result.align is not None:
            carried = engine.indexer.with_forward(
                AlignRequest.from_bytes(result.align.to_bytes(forward=False)))
            no_store.align(AlignRequest.from_bytes(carried.to_bytes()))
        with contextlib.suppress(PageRejected):
            engine.indexer.finish(result, engine.align(result))


def warm_all() -> None:
    """Both modes, in parallel processes, when the costliest kernels are not cached."""
    from dupalign.runtime.kernel_status import kernels_cached

    if kernels_cached() is not False:
        return
    print("compiling the engine's numba kernels into their cache (about two minutes; "
          "python -m tests.warm_kernels)", file=sys.stderr, flush=True)
    runs = [subprocess.Popen([sys.executable, "-m", "tests.warm_kernels", mode], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for mode in MODES]
    for run in runs:
        out, _ = run.communicate()
        if run.returncode != 0:  # the tests that call the kernels compile them and fail
            print(f"tests.warm_kernels failed (exit {run.returncode}):\n{out[-2000:]}",
                  file=sys.stderr, flush=True)


def main() -> None:
    if len(sys.argv) < 2:
        warm_all()
        return
    with tempfile.TemporaryDirectory() as d:
        warm(sys.argv[1], Path(d))


if __name__ == "__main__":
    main()
