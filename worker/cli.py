"""The ``dupalign`` command: scan, query, stats (embedded engine) and worker, produce (Kafka)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from dupalign.config import EngineConfig
from dupalign.errors import ConfigError, PageRejected, StoreMismatch
from dupalign.page import Page
from dupalign.pipeline import default_jobs
from worker.inputs import InputError, iter_input
from worker.progress import Progress


def load_engine_config(path: str | None) -> EngineConfig:
    """The ``[engine]`` table of a TOML config file (or the whole file if it has none)."""
    if path is None:
        return EngineConfig().validate()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("<file>", f"cannot read {path}: {exc}") from exc
    section = data.get("engine", {}) if any(k in data for k in ("engine", "kafka")) else data
    return EngineConfig.from_dict(section)


def _scan_line(progress: Progress, pages: int, matches: int, errors: int) -> str:
    return (f"{pages} pages, {matches} matches, {errors} rejected, "
            f"{progress.rate(pages):.0f} pages/s")


def cmd_scan(args: argparse.Namespace) -> int:
    from dupalign.engine import Engine

    config = load_engine_config(args.config)
    out: IO[str] = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    pages = matches = errors = 0
    progress = Progress(sys.stderr, (not args.quiet and sys.stderr.isatty()) or args.progress)
    where: dict[int, str] = {}  # id(page) -> "path:line", for the rejection messages

    def pages_in() -> Iterator[tuple[Page, None]]:
        nonlocal errors
        for path in args.inputs:
            for number, item in iter_input(path):
                if isinstance(item, InputError):
                    errors += 1
                    print(f"skipped {item.where}: {item.reason}", file=sys.stderr)
                    continue
                where[id(item)] = f"{path}:{number}"
                yield item, None

    with Engine.open(args.store, config) as engine:
        for page, found in engine.process_many(pages_in(), jobs=args.jobs or default_jobs()):
            at = where.pop(id(page))
            if isinstance(found, PageRejected):
                errors += 1
                print(f"rejected {at} ({page.id}): {found}", file=sys.stderr)
                continue
            if isinstance(found, BaseException):
                raise found
            pages += 1
            now_ms = int(time.time() * 1000)
            for match in found:
                out.write(json.dumps(match.to_dict(now_ms), ensure_ascii=False) + "\n")
            matches += len(found)
            progress.tick(_scan_line(progress, pages, matches, errors))
    progress.tick(_scan_line(progress, pages, matches, errors), force=True)
    progress.done()
    if out is not sys.stdout:
        out.close()
    print(f"scan: {pages} pages, {matches} matches, {errors} rejected or skipped",
          file=sys.stderr)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from dupalign.engine import Engine

    config = load_engine_config(args.config)
    if args.file:
        text = Path(args.file).read_text(encoding="utf-8", errors="replace")
    elif args.text is not None:
        text = args.text
    else:
        text = sys.stdin.read()
    with Engine.open(args.store, config, read_only=True) as engine:
        for match in engine.query_text(text):
            print(json.dumps(match.to_dict(), ensure_ascii=False))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from dupalign.engine import Engine

    config = load_engine_config(args.config)
    with Engine.open(args.store, config, read_only=True) as engine:
        print(json.dumps(engine.stats(), indent=2, sort_keys=True))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dupalign",
        description="Streaming near-duplicate and copied-passage detection for web crawls.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    scan = sub.add_parser("scan", help="embedded mode: pages from JSONL/WARC in, matches out")
    scan.add_argument("inputs", nargs="+", metavar="INPUT", help="JSON Lines or WARC files")
    scan.add_argument("--store", required=True, help="RocksDB store directory")
    scan.add_argument("--config", help="TOML config file ([engine] table)")
    scan.add_argument("--out", help="write matches (JSON Lines) here instead of stdout")
    scan.add_argument("--progress", action="store_true", help="progress on stderr")
    scan.add_argument("--quiet", action="store_true", help="no progress line")
    scan.add_argument("--jobs", type=int, default=0,
                      help="cores for the sketch and align stages (default: all)")
    scan.set_defaults(func=cmd_scan)

    query = sub.add_parser("query", help="align one text against a store")
    query.add_argument("text", nargs="?", help="the text (default: --file or stdin)")
    query.add_argument("--file", help="read the text from this file")
    query.add_argument("--store", required=True)
    query.add_argument("--config")
    query.set_defaults(func=cmd_query)

    stats = sub.add_parser("stats", help="what a store holds")
    stats.add_argument("--store", required=True)
    stats.add_argument("--config")
    stats.set_defaults(func=cmd_stats)

    _add_optional(sub, "worker", "worker.service", "add_worker_arguments", "run_worker",
                  "run the Kafka worker service")
    _add_optional(sub, "produce", "worker.produce", "add_produce_arguments", "run_produce",
                  "publish JSONL/WARC pages to a Kafka topic")
    return parser


def _add_optional(sub: Any, name: str, module: str, add: str, run: str, help_: str) -> None:
    import importlib

    mod = importlib.import_module(module)
    p = sub.add_parser(name, help=help_)
    getattr(mod, add)(p)
    p.set_defaults(func=getattr(mod, run))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"dupalign: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except StoreMismatch as exc:
        print(f"dupalign: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
