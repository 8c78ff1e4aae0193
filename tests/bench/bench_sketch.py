"""The sketch stage alone (``Sketcher``), this checkout against a baseline revision, side by
side in one run (issue #44): CPU ms a page of near-only (``sketch_many`` over batches of the
engine's size) and of the default configuration (``sketch`` page by page, as ``--jobs 1``
runs it), and a digest of every page's sketch (``PageSketch.to_bytes``, the passage lists and
units the pickle carries) that must be the same on both sides.

The corpus's extracted text (main content, as bench_scan gives it) is written once for both
sides; each side runs in its own process (its own ``dupalign`` imported, kernels warmed
before the clock), the sides alternate ``--rounds`` times and the lowest of each is kept.

Run: python -m tests.bench.bench_sketch --corpus boost [--baseline-ref main] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODES = ("near-only", "default")


def _child(texts_path: str, mode: str) -> None:
    import dupalign
    from dupalign.config import EngineConfig, PassageConfig, TextConfig
    from dupalign.near.idf import IdfBuilder
    from dupalign.page import Page
    from dupalign.runtime.batched import BATCH_PAGES
    from dupalign.stages.sketch import Sketcher
    from dupalign.text.tokens import tokenize

    texts = pickle.loads(Path(texts_path).read_bytes())
    pages = [Page(id=i, body=t, content_type="text/plain") for i, t in texts]
    near_only = mode == "near-only"
    cfg = EngineConfig(text=TextConfig(main_content=True),
                       passage=PassageConfig(enabled=not near_only)).validate()
    builder = IdfBuilder()  # frozen from the first 1,000 pages, as the engine's first freeze
    for _, text in texts[:1000]:
        tokens = tokenize(text)
        if len(tokens):
            builder.add_document(np.unique(tokens.hashes(cfg.seed)), distinct=True)
    idf = builder.freeze(1)
    sketcher = Sketcher(cfg)

    def run() -> list[object]:
        if near_only:
            return [sk for a in range(0, len(pages), BATCH_PAGES)
                    for sk in sketcher.sketch_many(pages[a:a + BATCH_PAGES], idf)]
        return [sketcher.sketch(page, idf) for page in pages]

    run()  # (kernels load from numba's cache, tables fill)
    best = float("inf")
    for _ in range(2):
        c0 = time.process_time()
        out = run()
        best = min(best, time.process_time() - c0)
    digest = hashlib.sha256()
    for sk in out:
        digest.update(sk.to_bytes())  # type: ignore[attr-defined]
        state = sk.passage  # type: ignore[attr-defined]
        if state is not None and state.lists is not None:
            for a in (*state.lists, *state.window_lists, state.units):
                digest.update(np.ascontiguousarray(a).tobytes())
    print(json.dumps({"module": dupalign.__file__, "ms": best / len(pages) * 1e3,
                      "digest": digest.hexdigest(), "pages": len(pages)}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default="boost")
    ap.add_argument("--baseline-ref", default="main")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", choices=[*MODES, "both"], default="both")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return 0
    from tests.bench.bench_scan import load_pages, main_text
    from tests.bench.checkouts import commit_of, run_in, warm_checkout
    from tests.corpora import LLVM_DOCS

    old, new = load_pages(LLVM_DOCS, None, args.corpus)
    texts = [(p.id, main_text(p)) for p in old + new]
    base = warm_checkout(args.baseline_ref)
    trees = {f"{args.baseline_ref} ({commit_of(args.baseline_ref)[:7]})": base,
             f"this ({commit_of('HEAD')[:7]}+)": REPO}
    modes = MODES if args.mode == "both" else (args.mode,)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "texts.pickle"
        path.write_bytes(pickle.dumps(texts))
        best: dict[tuple[str, str], float] = {}
        digests: dict[tuple[str, str], str] = {}
        for _ in range(args.rounds):
            for mode in modes:
                for label, tree in trees.items():
                    out = run_in(tree, Path(__file__), "--child", str(path), mode)
                    key = (mode, label)
                    best[key] = min(best.get(key, float("inf")), out["ms"])
                    digests[key] = out["digest"]
    print(f"corpus {args.corpus}: {len(texts)} pages; sketch stage CPU ms a page, lowest of "
          f"{args.rounds} rounds (2 passes each)")
    base_label, this_label = trees
    print(f"{'mode':<10} {base_label:>22} {this_label:>22} {'ratio':>7}  sketches")
    for mode in modes:
        a, b = best[(mode, base_label)], best[(mode, this_label)]
        same = "identical" if digests[(mode, base_label)] == digests[(mode, this_label)] else (
            "DIFFERENT")
        print(f"{mode:<10} {a:>22.3f} {b:>22.3f} {a / b:>6.2f}x  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
