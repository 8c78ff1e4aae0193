"""Text repeated inside a page: the cost of aligning a copy of it, with and without
``passage.max_repeats``.

A page is one block of RFC 5321 (3,000 words) written again and again up to ``--words``,
then a copy of it with 5 % of its words replaced. Each passage of the copy meets the
page's windows at every repeat, so without a cap its align work grows with the number of
repeats, and a page's with the square of its length. For each length the copy goes
through the engine twice, in one run: with the default ``max_repeats`` and uncapped;
the table gives the copy's CPU per stage, the ratio, and the spans found.

    python -m tests.bench.bench_repeats [--words 15000,30000,60000,120000] [--block 3000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from tests.runtime.test_engine import rfc_words

UNCAPPED = 100_000_000


def copy_cost(words: list[str], copy: list[str], max_repeats: int) -> tuple[float, float, int]:
    """CPU seconds of the copy's index and align stages, and its passage spans."""
    cfg = EngineConfig(near=NearConfig(enabled=False),
                       passage=PassageConfig(max_repeats=max_repeats)).validate()
    with tempfile.TemporaryDirectory() as tmp, Engine.open(Path(tmp) / "s", cfg) as engine:
        engine.process(Page("page", " ".join(words)))
        sk = engine.sketch(Page("copy", " ".join(copy)))
        c0 = time.process_time()
        result = engine.indexer.index(sk, defer=True)
        c1 = time.process_time()
        found = engine.align(result)
        c2 = time.process_time()
        matches = engine.indexer.finish(result, found)
    return c1 - c0, c2 - c1, sum(len(m.spans or ()) for m in matches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--words", default="15000,30000,60000,120000",
                    help="page lengths in words, comma-separated")
    ap.add_argument("--block", type=int, default=3000, help="words of the repeated block")
    args = ap.parse_args()
    block = rfc_words("rfc5321.txt", 0, args.block)
    cap = PassageConfig().max_repeats
    # compile the kernels before anything is timed (a copy that is no exact duplicate)
    copy_cost(block * 2, block * 2 + ["edited"], cap)
    print(f"block of {len(block)} words repeated; copy with 5 % of its words replaced; "
          f"CPU seconds of the copy's stages; max_repeats {cap} (default) vs uncapped")
    print(f"{'words':>8} {'repeats':>8} {'index':>7} {'align':>8} {'spans':>6} "
          f"{'uncapped index':>15} {'align':>8} {'spans':>6} {'align ratio':>12}")
    for n in (int(x) for x in args.words.split(",")):
        words = (block * (n // len(block) + 1))[:n]
        rng = random.Random(n)
        copy = [f"edited{rng.randrange(10**6)}" if rng.random() < 0.05 else w for w in words]
        ix, al, spans = copy_cost(words, copy, cap)
        ix_u, al_u, spans_u = copy_cost(words, copy, UNCAPPED)
        print(f"{n:8d} {n / len(block):8.1f} {ix:7.2f} {al:8.2f} {spans:6d} "
              f"{ix_u:15.2f} {al_u:8.2f} {spans_u:6d} {al / al_u:11.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
