"""The recall audit's cost, side by side in one run.

    python -m tests.bench.bench_audit [--pages 600] [--rates 0,0.001,0.05] [--worker]
                                      [--corpus clough-rfc|llvm|boost]

The same pages (Clough answers and RFC text in ~3 KB pages, as bench_worker; or both
releases of a documentation corpus of tests.corpora, HTML, for a longer stream where the
reservoir's fill is spread as in a long crawl) through the engine once per audit rate, in
alternation (rate order rotated each round, ``--rounds``), ``Engine.process`` then
``run_audits`` per page as ``scan`` does; reported: CPU seconds per page (process CPU,
this thread's work and the audit's), the audits run, CPU per audited page (from the
highest rate against rate 0) and the throughput ratio to rate 0. ``--worker`` adds the
Kafka worker (a real broker, deploy/kafka/broker.sh; Clough + RFC pages) with the audit off
(``DUPALIGN_ENGINE_AUDIT_SAMPLE=0``) and at its default, alternated: pages/s between the
first and last commit, and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dupalign.config import WORKER_AUDIT_SAMPLE, EngineConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.wire import messages
from tests.bench.bench_worker import (
    corpus,
    create_topics,
    produce,
    run_with_broker,
    worker_rate,
)
from tests.corpora import DOCS_CORPORA, docs_releases


def engine_run(pages: list[Page], store: Path, rate: float) -> tuple[float, int]:
    """CPU seconds of the whole run (pages and audits) and the pages audited."""
    with Engine.open(store, EngineConfig.from_dict({"audit": {"sample": rate}})) as engine:
        engine.process(Page(id="warm-up", body="warm up the numba kernels " * 20))
        engine.run_audits()
        audited = 0
        c0 = time.process_time()
        for page in pages:
            with contextlib.suppress(PageRejected):
                engine.process(page)
            audited += len(engine.run_audits())
        return time.process_time() - c0, audited


def engine_pages(name: str, n: int) -> list[Page]:
    if name == "clough-rfc":
        return corpus(n)
    old, new = docs_releases(name)
    pages = old + new
    if len(pages) < n:
        raise SystemExit(f"asked for {n} pages, {name} has {len(pages)}")
    return pages[:n]


async def workers(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    pages = corpus(args.pages)
    topic = f"bench-audit-{uuid.uuid4().hex[:6]}"
    await create_topics(bootstrap, topic)
    await produce(bootstrap, topic, [(p.id.encode(), messages.encode_page(p)) for p in pages])
    rates: dict[str, list[float]] = {"off": [], "default": []}
    for r in range(args.rounds):
        for name in (("off", "default") if r % 2 == 0 else ("default", "off")):
            env = {"DUPALIGN_ENGINE_AUDIT_SAMPLE": "0"} if name == "off" else None
            rates[name].append(await worker_rate(bootstrap, topic, len(pages), tmp,
                                                 f"{name}{r}", env))
    off, on = sum(rates["off"]) / args.rounds, sum(rates["default"]) / args.rounds
    print(f"\nworker, {len(pages)} pages, 1 partition, {args.rounds} rounds alternated")
    for name, values in rates.items():
        print(f"  audit {name:<8} {' '.join(f'{v:7.1f}' for v in values)} p/s")
    print(f"  default / off: {on / off:.3f} (audit.sample {WORKER_AUDIT_SAMPLE})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--rates", default=f"0,{WORKER_AUDIT_SAMPLE},0.05")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help="also the Kafka worker")
    parser.add_argument("--corpus", choices=["clough-rfc", *sorted(DOCS_CORPORA)],
                        default="clough-rfc", help="the engine part's pages")
    args = parser.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    pages = engine_pages(args.corpus, args.pages)
    cpu: dict[float, list[float]] = {r: [] for r in rates}
    audited: dict[float, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        for rnd in range(args.rounds):
            order = rates[rnd % len(rates):] + rates[:rnd % len(rates)]
            for rate in order:
                s, n = engine_run(pages, Path(tmp) / f"{rate}-{rnd}", rate)
                cpu[rate].append(s)
                audited[rate] = n
    base = min(cpu[0.0]) if 0.0 in cpu else None
    what = "Clough + RFC, ~3 KB" if args.corpus == "clough-rfc" else f"{args.corpus} HTML"
    print(f"\nengine, {len(pages)} pages ({what}), {args.rounds} rounds "
          f"alternated, {os.cpu_count()} CPUs; CPU s per page (min over rounds)")
    print(f"{'audit.sample':>12} {'audited':>8} {'CPU ms/page':>12} {'ratio to 0':>11}  rounds")
    for rate in rates:
        per = min(cpu[rate]) / len(pages)
        ratio = "" if base is None else f"{base / min(cpu[rate]):>11.3f}"
        rounds = " ".join(f"{1000 * c / len(pages):.2f}" for c in cpu[rate])
        print(f"{rate:>12g} {audited[rate]:>8} {per * 1000:>12.2f} {ratio}  {rounds}")
    top = max(rates)
    if base is not None and audited.get(top):
        each = (min(cpu[top]) - base) / audited[top]
        per_page = base / len(pages)
        if each <= 0:
            print(f"CPU per audited page: below this run's noise (rate {top:g} ran faster)")
        else:
            print(f"CPU per audited page: {each * 1000:.1f} ms; at audit.sample "
                  f"{WORKER_AUDIT_SAMPLE}, expected throughput ratio "
                  f"{per_page / (per_page + WORKER_AUDIT_SAMPLE * each):.4f}")
    if args.worker:
        return run_with_broker(None, "bench-audit-", lambda b, t: workers(args, b, t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
