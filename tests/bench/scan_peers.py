"""rensa and datasketch as their users write them, for ``bench_scan``.

A user of either library brings a tokenizer and shingles of their own (neither has one):
here lower-cased ``\\w+`` words and word 5-shingles joined by spaces, in Python, timed as a
whole with the MinHash and the LSH insert and query: the loop a user writes. From HTML the
peer also pays the text extraction (ours, main content, as every method sees it). Each peer
runs in a process of its own, so that none inherits another's heap or caches.

The engine-only view (``--tokens ours``) times only the MinHash and the LSH: the shingles of
our tokens are made before the clock starts. It says what the peer's engine costs, not what
its user waits for.

Run by bench_scan: python -m tests.bench.scan_peers PEER user|ours PAGES_PICKLE
"""

from __future__ import annotations

import json
import pickle
import re
import sys
import time
from collections.abc import Callable, Iterator

from dupalign.page import Page
from dupalign.text.tokens import page_text, tokenize

THRESHOLD, PERMS, SHINGLE = 0.8, 128, 5
_WORD = re.compile(r"\w+")


def user_shingles(text: str) -> list[str]:
    """What a user of rensa or datasketch writes: words by regex, 5 words joined."""
    words = _WORD.findall(text.lower())
    return [" ".join(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)]


def our_shingles(text: str) -> list[str]:
    """Word 5-shingles of the engine's own tokens, distinct (the engine-only view's input)."""
    t = tokenize(text).tokens
    return list({" ".join(t[i:i + SHINGLE]) for i in range(len(t) - SHINGLE + 1)})


def _text(page: Page) -> str:
    if page.content_type == "text/plain":
        return str(page.body)
    return page_text(page, main_content=True)


def rensa(items: Iterator[tuple[str, list[str]]]) -> set[tuple[str, str]]:
    """rensa's LSH takes a band count dividing 128 (16 bands of 8 rows, a curve centred below
    0.8), so its candidates are kept when their MinHash estimate reaches 0.8, as rensa's own
    deduplicator does."""
    from rensa import RMinHash, RMinHashLSH

    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=PERMS, num_bands=16)
    sketches: list[RMinHash] = []
    ids: list[str] = []
    found: set[tuple[str, str]] = set()
    for n, (doc_id, shingles) in enumerate(items):
        mh = RMinHash(num_perm=PERMS, seed=42)
        mh.update(shingles)
        for other in lsh.query(mh):
            if mh.jaccard(sketches[other]) >= THRESHOLD:
                found.add((doc_id, ids[other]))
        lsh.insert(n, mh)
        sketches.append(mh)
        ids.append(doc_id)
    return found


def datasketch(items: Iterator[tuple[str, list[str]]]) -> set[tuple[str, str]]:
    """datasketch's LSH candidates as they are (it takes bytes)."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=PERMS)
    found: set[tuple[str, str]] = set()
    for doc_id, shingles in items:
        mh = MinHash(num_perm=PERMS)
        mh.update_batch([s.encode("utf-8") for s in shingles])
        for other in lsh.query(mh):
            found.add((doc_id, other))
        lsh.insert(doc_id, mh)
    return found


PEERS: dict[str, tuple[str, Callable[[Iterator[tuple[str, list[str]]]], set[tuple[str, str]]]]] = {
    "rensa": ("rensa RMinHashLSH", rensa),
    "datasketch": ("datasketch MinHashLSH", datasketch),
}


def main() -> int:
    peer, tokens, pages_file = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(pages_file, "rb") as fh:
        pages: list[Page] = pickle.load(fh)
    run = PEERS[peer][1]
    if tokens == "ours":  # shingles made before the clock starts
        ready = [(p.id, our_shingles(_text(p))) for p in pages]
        t0, c0 = time.perf_counter(), time.process_time()
        found = run(iter(ready))
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        found = run((p.id, user_shingles(_text(p))) for p in pages)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"seconds": seconds, "cpu": cpu, "pairs": sorted(found)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
