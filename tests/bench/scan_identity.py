"""Whether ``dupalign scan`` of this checkout writes what another revision's does: the
matches, without ``detected_at``, byte for byte in order, near-only (``[engine.passage]
enabled = false``) and the default engine, ``--jobs`` 1 and 2, on the demo corpus and on a
docs corpus's extracted text (bench_scan's text pages, written as JSON Lines). Prints one
line a run: the matches' count and ``same`` or ``DIFFER``; exits 1 on a difference.

    python -m tests.bench.scan_identity [--ref main] [--corpora demo,boost,llvm]
        [--engines near,default] [--jobs 1,2] [--pages DIR]

``--pages``: where the corpora's JSON Lines are kept between runs (written if missing).

The other revision is checked out and warmed by tests.bench.checkouts ``warm_checkout``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bench.checkouts import REPO, shared_env, warm_checkout

DEMO = ["demo/llvm-docs", "demo/rfc", "demo/web/creativecommons.org.warc.gz"]
NEAR_ONLY = "[engine.passage]\nenabled = false\n"


def write_pages(corpus: str, path: Path) -> None:
    """bench_scan's text pages of ``corpus`` as JSON Lines (both releases, in its order)."""
    from tests.bench.bench_scan import load_pages, main_text
    from tests.corpora import LLVM_DOCS

    old, new = load_pages(LLVM_DOCS, None, corpus)
    with path.open("w", encoding="utf-8") as f:
        for p in old + new:
            f.write(json.dumps({"id": p.id, "body": main_text(p),
                                "content_type": "text/plain"}) + "\n")


def scan(checkout: Path, inputs: list[str], config: Path, jobs: int, work: Path) -> list[str]:
    """The matches ``dupalign scan`` of ``checkout`` writes, one JSON line each, without
    ``detected_at``."""
    store, out = work / "store", work / "out.jsonl"
    shutil.rmtree(store, ignore_errors=True)
    subprocess.run([sys.executable, "-c", "import sys; from dupalign.service.cli import main; "
                    "sys.exit(main())", "scan", "--quiet", "--jobs", str(jobs), "--config",
                    str(config), "--store", str(store), "--out", str(out), *inputs],
                   cwd=REPO, env=shared_env(checkout), check=True, capture_output=True)
    lines = []
    for line in out.read_text("utf-8").splitlines():
        d = json.loads(line)
        d.pop("detected_at", None)
        lines.append(json.dumps(d, sort_keys=True))
    shutil.rmtree(store, ignore_errors=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="main")
    ap.add_argument("--corpora", default="demo,boost,llvm")
    ap.add_argument("--engines", default="near,default")
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--pages", type=Path, help="keep the corpora's JSON Lines here")
    args = ap.parse_args()
    ref = warm_checkout(args.ref)
    work = Path(tempfile.mkdtemp(prefix="scan-identity-"))
    differ = False
    try:
        configs = {engine: work / f"{engine}.toml" for engine in args.engines.split(",")}
        for engine, config in configs.items():
            config.write_text(NEAR_ONLY if engine == "near" else "")
        for corpus in args.corpora.split(","):
            inputs = DEMO
            if corpus != "demo":
                pages = (args.pages or work) / f"{corpus}.jsonl"
                if not pages.exists():
                    write_pages(corpus, pages)
                inputs = [str(pages)]
            for engine in args.engines.split(","):
                want = scan(ref, inputs, configs[engine], 1, work)
                for jobs in (int(j) for j in args.jobs.split(",")):
                    got = scan(REPO, inputs, configs[engine], jobs, work)
                    same = got == want
                    differ |= not same
                    print(f"{corpus} {engine} --jobs {jobs}: {len(got)} matches here, "
                          f"{len(want)} at {args.ref} --jobs 1: "
                          f"{'same' if same else 'DIFFER'}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if differ else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
