"""The index stage's PSM lookup, one page at a time, on a docs corpus (issue #44): every
lookup a near-only run makes (its fingerprint, W, bound) recorded, then replayed against the
run's final table through ``psm_search_one`` and through the batch kernel called for one
query, as ``psm_search_one`` did before it kept its working arrays (``--rounds`` each,
alternating, the lowest kept). Prints CPU µs a lookup and checks both give the same answers.

    python -m tests.bench.psm_one --corpus boost [--rounds 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import dupalign.near.index as near_index
from dupalign.config import EngineConfig, PassageConfig, TextConfig
from dupalign.near.psm import _psm_batch_kernel, psm_search_one
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from tests.bench.bench_scan import load_pages, main_text
from tests.corpora import DOCS_CORPORA, LLVM_DOCS


def batch_of_one(table: Any, fp: int, W: Any, h: int, budget: int, first: bool, model: Any,
                 before: int) -> tuple[list[tuple[int, int]], int]:
    """``psm_search_one`` as it was: the batch kernel of one query (its arrays made and
    returned at each call)."""
    surv, y_max, prior_scale = model.kernel_params()
    offsets, ords, hams, probes = _psm_batch_kernel(
        table.fps, table.ordinals, table.directory, table.header_bits, table.probe_bits,
        table.buffer_fps, table.buffer_ordinals, np.array([fp], dtype=np.uint64),
        W.reshape(1, 64), np.array([before], dtype=np.int64), surv, y_max, prior_scale, h,
        budget, first)
    n = int(offsets[1])
    found = list(zip(ords[:n].tolist(), hams[:n].tolist(), strict=True)) if n else []
    if n > 1:
        found.sort(key=lambda r: (r[1], r[0]))
    return found, int(probes[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="boost")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    old, new = load_pages(LLVM_DOCS, None, args.corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    cfg = EngineConfig(text=TextConfig(main_content=True),
                       passage=PassageConfig(enabled=False)).validate()
    calls: list[tuple[Any, ...]] = []
    real = near_index.psm_search_one

    def record(*a: Any) -> Any:
        calls.append(a)
        return real(*a)

    near_index.psm_search_one = record  # type: ignore[assignment]
    try:
        with Engine.open(Path(tempfile.mkdtemp(prefix="psm-one-")), cfg) as engine:
            for _ in engine.process_many(((p, None) for p in pages), jobs=1):
                pass
    finally:
        near_index.psm_search_one = real
    table = calls[-1][0]
    print(f"{args.corpus}: {len(calls)} lookups, table of {len(table)} rows, "
          f"probe width {table.probe_bits}")
    ways = {"batch kernel of one (before)": batch_of_one, "psm_search_one": psm_search_one}
    answers = {name: [way(table, *a[1:]) for a in calls] for name, way in ways.items()}
    same = answers["psm_search_one"] == answers["batch kernel of one (before)"]
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds):
        for name, way in ways.items():
            t0 = time.thread_time()
            for a in calls:
                way(table, *a[1:])
            best[name] = min(best[name], time.thread_time() - t0)
    print("| lookup | CPU µs a lookup (lowest of rounds) |\n|---|---|")
    for name, cpu in best.items():
        print(f"| {name} | {cpu / len(calls) * 1e6:.2f} |")
    print(f"same answers and probes: {same}")


if __name__ == "__main__":
    main()
