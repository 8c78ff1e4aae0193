"""Where a near-only page's sketch goes, step by step, on a docs corpus (issue #44).

The corpus's pages as bench_scan gives them from text (main content extracted), then:
- the pages: tokens and characters a page, how many hold a non-ASCII character (the
  tokenizer reads those as UTF-32 code points), how many are long enough to be near-indexed;
- CPU µs a page of each step of the sketch stage, each timed over every page in turn: the
  unicode check, the replay key, the text, tokenizing, the content hash, the token hashes,
  the near sketch (``near_sketch``), and the whole ``Sketcher.sketch``;
- CPU µs a near-indexed page of the near kernel's parts, each as a kernel of its own: the
  distinct tokens and their counts (the hash table of ``_distinct_kernel`` against the
  sort of all tokens, ``_sorted_runs``), the shingle features, the K min-hashes, the tf-idf
  weights and the weighted simhash; and the whole ``_near_kernel``.

The idf table is frozen from the first 1,000 pages, as the engine's first freeze does.

Run: .venv/bin/python -m tests.bench.near_parts [--corpus llvm|boost] [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig, PassageConfig, TextConfig
from dupalign.kernel_cache import njit
from dupalign.near.cws import _minhash_kernel, _shingle_features_kernel, shingle_minhash_keys
from dupalign.near.idf import IdfBuilder, IdfTable, tf_table, weights_by_directory, weights_into
from dupalign.near.index import (
    _SHINGLE_SALT,
    _distinct_kernel,
    _near_kernel,
    _sorted_runs,
    near_sketch,
)
from dupalign.near.simhash import simhash_into
from dupalign.page import Page, check_unicode
from dupalign.stages.sketch import Sketcher, replay_key
from dupalign.text.tokens import page_text, tokenize
from tests.bench.bench_scan import load_pages, main_text
from tests.corpora import LLVM_DOCS

U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]


@njit(cache=True, nogil=True)
def _features(h: U64, span: int, mixes: U64) -> U64:
    base = np.empty(h.shape[0] - span + 1, dtype=np.uint64)
    _shingle_features_kernel(h, span, mixes[0], mixes[1], mixes[2], base)
    return base


@njit(cache=True, nogil=True)
def _minhashes(base: U64, sample_keys: U64, mixes: U64, out: U64) -> None:
    _minhash_kernel(base, sample_keys, mixes[3], out)


@njit(cache=True, nogil=True)
def _weights(uniq: U64, counts: npt.NDArray[np.int64], keys: U64,
             values: npt.NDArray[np.float32], default: float, tf: F64, out: F64) -> bool:
    return weights_into(uniq, counts, keys, values, default, tf, out)


@njit(cache=True, nogil=True)
def _simhash(uniq: U64, weights: F64, W: F64) -> np.uint64:
    return simhash_into(uniq, weights, W)


def per_item(steps: dict[str, Callable[[int], object]], n: int, repeat: int) -> None:
    """CPU µs an item of each step, the lowest of ``repeat`` passes over the ``n`` items."""
    for name, step in steps.items():
        step(0)  # (a kernel loads from numba's cache on its first call)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.thread_time()
            for i in range(n):
                step(i)
            best = min(best, time.thread_time() - t0)
        print(f"  {name:<34} {best / n * 1e6:8.1f} µs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=["llvm", "boost"], default="llvm")
    ap.add_argument("--repeat", type=int, default=3, help="passes per step (the lowest kept)")
    args = ap.parse_args()
    old, new = load_pages(LLVM_DOCS, None, args.corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    cfg = EngineConfig(text=TextConfig(main_content=True),
                       passage=PassageConfig(enabled=False)).validate()
    texts = [str(p.body) for p in pages]
    tokens = [tokenize(t) for t in texts]
    hashes = [t.hashes(cfg.seed) for t in tokens]
    builder = IdfBuilder()
    for h in hashes[:1000]:
        builder.add_document(np.unique(h), distinct=True)
    idf: IdfTable = builder.freeze(1)
    n_tok = np.array([len(t) for t in tokens])
    indexed = [h for h in hashes if len(h) >= cfg.near.min_tokens]
    print(f"corpus {args.corpus}: {len(pages)} pages; tokens a page mean {n_tok.mean():.0f}, "
          f"median {np.median(n_tok):.0f}, 90th percentile {np.percentile(n_tok, 90):.0f}; "
          f"characters a page mean {np.mean([len(t) for t in texts]):.0f}; "
          f"{sum(not t.isascii() for t in texts)} pages hold a non-ASCII character; "
          f"{len(indexed)} near-indexed (>= {cfg.near.min_tokens} tokens)")

    encoded = [check_unicode(p) for p in pages]
    sketcher = Sketcher(cfg)
    print("sketch stage, CPU a page:")
    per_item({
        "check_unicode": lambda i: check_unicode(pages[i]),
        "replay_key": lambda i: replay_key(pages[i], encoded[i]),
        "page_text": lambda i: page_text(pages[i], True, cfg.text.max_page_bytes, encoded[i]),
        "tokenize": lambda i: tokenize(texts[i], cfg.text.max_tokens),
        "content hash": lambda i: tokens[i].content_hash(cfg.seed),
        "token hashes": lambda i: tokens[i].hashes(cfg.seed),
        "near_sketch": lambda i: near_sketch(hashes[i], idf, cfg),
        "Sketcher.sketch (all of it)": lambda i: sketcher.sketch(pages[i], idf),
    }, len(pages), args.repeat)

    mixes, sample_keys = shingle_minhash_keys(_SHINGLE_SALT, cfg.near.cws_samples, cfg.seed)
    tf = tf_table("log")
    span = cfg.near.shingle
    W, sketch = np.empty(64), np.empty(cfg.near.cws_samples, dtype=np.uint64)
    distinct = [_distinct_kernel(h) for h in indexed]
    features = [_features(h, min(span, h.size), mixes) for h in indexed]
    weights = [np.empty(u.size) for u, _ in distinct]
    for (u, c), w in zip(distinct, weights, strict=True):
        _weights(u, c, idf.keys, idf.values, idf.default_idf, tf, w)
    print("near kernel, CPU a near-indexed page:")
    per_item({
        "distinct and counts: hash table": lambda i: _distinct_kernel(indexed[i]),
        "distinct and counts: sort all": lambda i: _sorted_runs(indexed[i]),
        "shingle features": lambda i: _features(indexed[i], min(span, indexed[i].size), mixes),
        f"{cfg.near.cws_samples} min-hashes": lambda i: _minhashes(features[i], sample_keys,
                                                                    mixes, sketch),
        "tf-idf weights: binary search": lambda i: _weights(
            distinct[i][0], distinct[i][1], idf.keys, idf.values, idf.default_idf, tf,
            weights[i]),
        "tf-idf weights: directory": lambda i: weights_by_directory(
            distinct[i][0], distinct[i][1], idf.keys, idf.values, idf.directory,
            idf.default_idf, tf, weights[i]),
        "weighted simhash": lambda i: _simhash(distinct[i][0], weights[i], W),
        "_near_kernel (all of it)": lambda i: _near_kernel(
            indexed[i], idf.keys, idf.values, idf.directory, idf.default_idf, tf,
            min(span, indexed[i].size), mixes, sample_keys, W, sketch),
    }, len(indexed), args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
