"""The align stage alone on a run's recorded requests: where its tasks come from.

``record``: both releases of a corpus (tests.corpora.DOCS_CORPORA) as extracted text
through one default engine, as ``bench_scan``'s ``--jobs 1`` run gives them; every
page's align request with its candidates' forward data attached
(``Indexer.with_forward``) is written to a file, with the matches align gave it.
``replay``: the requests through ``Aligner.align_ranked`` alone (no store), their CPU, and
counts of where the tasks go: tasks, viable tasks, hits, candidate pages hit, pages
kept by ``passage.max_matches``, and how many candidates (and tasks) could not have
entered the kept pages (``rank_bound``), or repeat another candidate's forward record.

    python -m tests.bench.align_replay record --corpus boost --out /tmp/boost.req
    python -m tests.bench.align_replay replay /tmp/boost.req [--limit N]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import pickle
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from dupalign.config import EngineConfig, TextConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.align import Aligner, union_hits
from dupalign.stages.messages import AlignRequest
from dupalign.store import tables
from tests.bench.bench_scan import load_pages, main_text, warm_up
from tests.corpora import LLVM_DOCS
from tests.passage.test_union_hits import every_hit


def config() -> EngineConfig:
    return EngineConfig(text=TextConfig(main_content=True)).validate()


def record(corpus: str, out: Path, limit: int | None) -> None:
    old, new = load_pages(LLVM_DOCS, limit, corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    cfg = config()
    requests: list[tuple[bytes, list[tuple[str, int]]]] = []
    digests: dict[int, bytes] = {}  # per stored page: a digest of its forward record
    with tempfile.TemporaryDirectory() as tmp:
        warm_up(pages, cfg, Path(tmp) / "s")
        with Engine.open(Path(tmp) / "s", cfg) as engine:
            for page in pages:
                sk = engine.sketch(page)
                result = engine.indexer.index(sk, defer=True)
                found = engine.align(result)
                if result.align is not None:
                    carried = engine.indexer.with_forward(AlignRequest.from_bytes(
                        result.align.to_bytes(forward=False)))
                    requests.append((carried.to_bytes(), [(d, len(s)) for d, s in found]))
                with contextlib.suppress(PageRejected):
                    engine.indexer.finish(result, found)
                if result.ordinal is not None:
                    raw = tables.forward.get(engine.store, result.ordinal)
                    if raw is not None:
                        digests[result.ordinal] = hashlib.blake2b(
                            raw, digest_size=16).digest()
    out.write_bytes(pickle.dumps((requests, digests)))
    print(f"{len(pages)} pages, {len(requests)} align requests written to {out}")


def passage_rows(req: AlignRequest) -> list[bytes]:
    """Per passage: a digest of what its tasks read of the query (the key of its list in
    each bin, 0 for a stop list, and its empty bins): two tasks with equal rows and
    candidates with equal forward records give the same hits."""
    t = req.tasks
    keys = np.where(t.lid >= 0, t.list_key[np.maximum(t.lid, 0)], np.uint64(2**64 - 1))
    return [hashlib.blake2b(keys[p].tobytes() + t.q_empty[p].tobytes(),
                            digest_size=16).digest() for p in range(len(keys))]


def replay(path: Path, limit: int | None) -> None:
    requests, digests = pickle.loads(path.read_bytes())
    requests = requests[:limit]
    cfg = config()
    aligner, old_aligner = Aligner(cfg), Aligner(cfg)
    c: Counter[str] = Counter()
    seen_o: set[tuple[bytes, int]] = set()
    seen_rec: set[tuple[bytes, bytes]] = set()
    cpu = cpu_every = 0.0
    for raw, expected in requests:
        req = AlignRequest.from_bytes(raw)
        t = req.tasks
        c["requests"] += 1
        c["tasks"] += len(t)
        cands = np.unique(t.t_o).tolist()
        c["candidates"] += len(cands)
        c["candidates_same_record"] += len(cands) - len({digests.get(o, o) for o in cands})
        rows = passage_rows(req)
        here: set[tuple[bytes, bytes]] = set()
        for p, o in zip(t.t_p.tolist(), t.t_o.tolist(), strict=True):
            rec = digests.get(o, o.to_bytes(8, "little"))
            c["tasks_seen_same_page"] += (rows[p], o) in seen_o
            c["tasks_seen_same_record"] += (rows[p], rec) in seen_rec
            c["tasks_same_record_in_request"] += (rows[p], rec) in here
            here.add((rows[p], rec))
            seen_o.add((rows[p], o))
            seen_rec.add((rows[p], rec))
        c0 = time.process_time()
        found = aligner.align_ranked(AlignRequest.from_bytes(raw))
        c1 = time.process_time()
        with every_hit():
            before = old_aligner.align_ranked(AlignRequest.from_bytes(raw))
        cpu += c1 - c0
        cpu_every += time.process_time() - c1
        got = [(p.doc_id, len(p.spans)) for p in found if p.spans]
        c["mismatch_recorded"] += got != expected
        c["mismatch_every_hit"] += found != before
        # the pages hit and the upper bound of each candidate's rank key: the units its
        # tasks' passages cover
        hits = aligner.scan(AlignRequest.from_bytes(raw).tasks)
        h_t = hits[0]
        c["hits_after_union"] += len(union_hits(*hits)[0])
        hit_pages = np.unique(t.t_o[h_t])
        c["pages_hit"] += len(hit_pages)
        c["pages_kept"] += min(len(hit_pages), cfg.passage.max_matches)
        c["requests_over_cap"] += len(hit_pages) > cfg.passage.max_matches
        c["tasks_hit_page"] += int(np.isin(t.t_o, hit_pages).sum())
        bound = rank_bound(req)
        kept = {p.ordinal: p.covered for p in found}
        if len(kept) >= cfg.passage.max_matches:
            floor = min(kept.values())
            out = [o for o, b in bound.items() if b < floor]
            c["candidates_dominated"] += len(out)
            c["tasks_dominated"] += int(np.isin(t.t_o, out).sum())
    counters = aligner.counters
    print(f"align CPU {cpu:.2f} s over {c['requests']} requests ({cpu_every:.2f} s with "
          f"every hit: union_hits off); counters {counters}")
    for key, value in c.items():
        print(f"  {key}: {value}")


def rank_bound(req: AlignRequest) -> dict[int, int]:
    """Per candidate: the most units of the query page its hits can cover (the union of
    its tasks' passages), the first rank key (``align.rank_keys``)."""
    t = req.tasks
    starts, ends = np.asarray(req.starts), np.asarray(req.ends)
    out = {}
    for o in np.unique(t.t_o).tolist():
        p = np.unique(t.t_p[t.t_o == o])
        prev = np.concatenate(([-1], ends[p[:-1]]))
        out[o] = int(np.maximum(0, ends[p] - np.maximum(starts[p], prev)).sum())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--corpus", default="boost")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--limit", type=int, default=None, help="pages per release")
    p = sub.add_parser("replay")
    p.add_argument("path", type=Path)
    p.add_argument("--limit", type=int, default=None, help="requests")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.corpus, args.out, args.limit)
    else:
        replay(args.path, args.limit)


if __name__ == "__main__":
    main()
