"""`dupalign scan` next to datasketch MinHashLSH on llvm-13-doc vs llvm-14-doc.

The same HTML documentation in two releases (Debian packages, unpacked by
../shared/scripts/fetch-debian-docs.sh). llvm-13 pages are processed first, then llvm-14
pages. Ground truth: the llvm-14 pages whose same-path llvm-13 page has word 5-shingle
Jaccard ≥ 0.85 with them, computed exactly on the same extracted text every method sees.
Recall: the fraction of those pages a method flags as a duplicate of some earlier page
with true Jaccard ≥ 0.85 (its same-path page, or an identical copy of it: an exact match
names the first copy only). Precision: the fraction of reported pairs (llvm-14 page,
earlier page) whose true Jaccard is ≥ 0.85.

Both sides start from the raw HTML bytes: datasketch gets our text extraction and word
tokens (it has none of its own), then 5-shingles, MinHash(128) and MinHashLSH(0.8).
Text is the pages' main content (boilerplate removal, `text.main_content = true`) for the
truth and for every method, since site navigation repeated on every page is not what a
passage detector should report; `--full-text` uses the whole page text instead.

"docs/s after text" leaves out the time of text extraction + tokenization, which both sides
share (the same functions); the last line gives the ceiling of the end-to-end ratio, (E + D) / E
with E the shared per-page text time and D datasketch's own per-page time: what scan would
reach if its own work cost nothing.

Run: .venv/bin/python -m tests.bench.bench_scan [--docs DIR] [--limit N] [--near-only]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dupalign.config import EngineConfig, PassageConfig, TextConfig
from dupalign.engine import Engine
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.text import page_text, tokenize

HERE = Path(__file__).resolve().parents[2]
SHINGLE = 5
TRUTH_J = 0.85


def load_pages(docs: Path, limit: int | None) -> tuple[list[Page], list[Page]]:
    releases = []
    for name in ("llvm-13-doc", "llvm-14-doc"):
        root = docs / name / "usr/share/doc" / name / "html"
        if not root.is_dir():
            raise SystemExit(f"missing {root}: run ../shared/scripts/fetch-debian-docs.sh {docs} "
                             "llvm-13-doc llvm-14-doc")
        files = sorted(root.rglob("*.html"))[:limit]
        releases.append([Page(id=f"{name[:7]}/{f.relative_to(root).as_posix()}",
                              body=f.read_bytes(), content_type="text/html") for f in files])
    return releases[0], releases[1]


def shingles(tokens: list[str]) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + SHINGLE]) for i in range(max(0, len(tokens) - SHINGLE + 1))}


def jaccard(a: set[tuple[str, ...]], b: set[tuple[str, ...]]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def run_datasketch(pages: list[Page], main: bool) -> tuple[float, float, set[tuple[str, str]]]:
    """Seconds in all, seconds of it in text extraction + tokenization, pairs found."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    found: set[tuple[str, str]] = set()
    t0 = time.perf_counter()
    t_text = 0.0
    for page in pages:
        t1 = time.perf_counter()
        toks = tokenize(page_text(page, main_content=main)).tokens
        t_text += time.perf_counter() - t1
        mh = MinHash(num_perm=128)
        mh.update_batch([" ".join(s).encode() for s in shingles(toks)])
        for other in lsh.query(mh):
            found.add((page.id, other))
        lsh.insert(page.id, mh)
    return time.perf_counter() - t0, t_text, found


def run_scan(
    pages: list[Page], config: EngineConfig, store: Path
) -> tuple[float, float, set[tuple[str, str]], dict[str, int]]:
    found: set[tuple[str, str]] = set()
    kinds: dict[str, int] = {}
    t_text = 0.0
    t0 = time.perf_counter()
    with Engine.open(store, config) as engine:
        for page in pages:
            try:
                page_matches = engine.process(page)
            except PageRejected:
                continue
            t_text += engine.last_report.text
            for m in page_matches:
                kinds[m.kind] = kinds.get(m.kind, 0) + 1
                if m.kind in ("exact", "near"):
                    found.add((m.doc_id, m.match_doc_id))
    return time.perf_counter() - t0, t_text, found, kinds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=Path, default=Path.home() / ".cache/dupalign-docs")
    ap.add_argument("--limit", type=int, default=None, help="pages per release (default all)")
    ap.add_argument("--full-text", action="store_true", help="whole page text, not main content")
    ap.add_argument("--near-only", action="store_true", help="skip the near + passages run")
    args = ap.parse_args()
    if not (args.docs / "llvm-14-doc").is_dir():
        subprocess.run(["bash", str(HERE.parent / "shared/scripts/fetch-debian-docs.sh"),
                        str(args.docs), "llvm-13-doc", "llvm-14-doc"], check=True)
    old, new = load_pages(args.docs, args.limit)
    pages = old + new
    print(f"corpus: {len(old)} llvm-13 + {len(new)} llvm-14 HTML pages")

    main = not args.full_text
    sh = {p.id: shingles(tokenize(page_text(p, main_content=main)).tokens) for p in pages}
    print("truth shingles computed", flush=True)
    old_ids = {p.id for p in old}

    def cross(pairs: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Pairs (llvm-14 page, earlier page): what the truth is about."""
        return {(a, b) for a, b in pairs if a not in old_ids}

    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    try:
        runs = []
        t_ds, text_ds, ds_pairs = run_datasketch(pages, main)
        runs.append(("datasketch MinHashLSH(0.8,128) 5-shingles", t_ds, text_ds, cross(ds_pairs),
                     {}))
        print(f"datasketch done in {t_ds:.1f} s", flush=True)
        text = TextConfig(main_content=main)
        full = EngineConfig(text=text).validate()
        near_only = EngineConfig(text=text, passage=PassageConfig(enabled=False)).validate()
        configs = [("dupalign scan (near only)", near_only, tmp / "a"),
                   ("dupalign scan (near + passages)", full, tmp / "b")]
        for label, cfg, store in configs[: 1 if args.near_only else 2]:
            t, t_text, pairs, kinds = run_scan(pages, cfg, store)
            runs.append((label, t, t_text, cross(pairs), kinds))
            print(f"{label} done in {t:.1f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    same_path = {(f"llvm-14/{p.id[8:]}", f"llvm-13/{p.id[8:]}") for p in new}
    same_path = {pair for pair in same_path if pair[1] in sh}
    truth = {a for a, b in same_path if jaccard(sh[a], sh[b]) >= TRUTH_J}
    print(f"truth: {len(truth)} of {len(same_path)} llvm-14 pages have word 5-shingle Jaccard "
          f">= {TRUTH_J} with their same-path llvm-13 page\n")
    header = (f"{'method':<44} {'seconds':>8} {'docs/s':>8} {'docs/s after text':>17} "
              f"{'reported':>9} {'recall':>7} {'precision':>9}")
    print(header)
    print("-" * len(header))
    rates, rates_after = {}, {}
    for label, t, t_text, pairs, kinds in runs:
        good = {(a, b) for a, b in pairs if jaccard(sh[a], sh[b]) >= TRUTH_J}
        recall = len(truth & {a for a, _ in good}) / len(truth) if truth else float("nan")
        precision = len(good) / len(pairs) if pairs else float("nan")
        rates[label] = len(pages) / t
        rates_after[label] = len(pages) / max(t - t_text, 1e-9)
        print(f"{label:<44} {t:8.2f} {rates[label]:8.1f} {rates_after[label]:17.1f} "
              f"{len(pairs):9d} {recall:7.3f} {precision:9.3f}" + (f"  {kinds}" if kinds else ""))
    base, base_after = rates[runs[0][0]], rates_after[runs[0][0]]
    for label, *_ in runs[1:]:
        print(f"speed ratio {label} / datasketch: {rates[label] / base:.2f}x end to end, "
              f"{rates_after[label] / base_after:.2f}x after text extraction")
    e_text = runs[0][2] / len(pages)
    d_ds = (runs[0][1] - runs[0][2]) / len(pages)
    print(f"shared text extraction + tokenization E = {e_text * 1e3:.2f} ms/page, datasketch's "
          f"own work D = {d_ds * 1e3:.2f} ms/page: end-to-end ratio ceiling (E + D) / E = "
          f"{(e_text + d_ds) / e_text:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
