"""The ``dupalign`` command: scan, query, stats (embedded engine) and worker, produce (Kafka).

Start-up stays cheap (``dupalign --help`` imports neither the engine nor aiokafka): each
command imports what it needs when it runs. Every failure the user can fix is one line on
stderr and an exit code of ``dupalign.service.exits.Exit`` (README, "Exit codes").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dupalign.service.cli_store import (
    cmd_audit,
    cmd_compact,
    cmd_delete,
    cmd_query,
    cmd_stats,
    load_engine_config,
    open_engine,
)
from dupalign.service.exits import CliError, Exit

if TYPE_CHECKING:
    from dupalign.config import EngineConfig


def _open_scan(args: argparse.Namespace, config: EngineConfig) -> Any:
    """The engine ``scan`` runs, or with --partitions the partitioned pipeline in one process
    (dupalign.stages.partitioned: the same matches, each stage over stores of its own)."""
    if args.partitions is None:
        return open_engine(args.store, config)
    from dupalign.stages.partitioned import Partitioned

    path = Path(args.store)
    try:
        Partitioned.refuse_used(path)
    except ValueError as exc:
        raise CliError(f"--store with --partitions: {exc}", Exit.USAGE) from None
    return _PartitionedScan.open(Partitioned.open(path, config, args.partitions))


class _PartitionedScan:
    """The partitioned pipeline as ``cmd_scan`` drives an engine."""

    def __init__(self, pipeline: Any) -> None:
        from types import SimpleNamespace

        self.pipeline = pipeline
        self.last_report = SimpleNamespace(replayed=False)

    @classmethod
    @contextlib.contextmanager
    def open(cls, opened: Any) -> Iterator[_PartitionedScan]:
        with opened as pipeline:
            yield cls(pipeline)

    @property
    def alive(self) -> int:
        return int(self.pipeline.alive)

    def process_many(self, items: Iterator[tuple[Any, None]], jobs: int
                     ) -> Iterator[tuple[Any, Any]]:
        """(page, its matches or PageRejected), in order; one process (``jobs`` unused)."""
        for page, found in self.pipeline.process_many(p for p, _ in items):
            self.last_report.replayed = self.pipeline.replayed
            yield page, found

    def run_audits(self) -> None:
        """(The recall audit is the engine's: not run here.)"""


def _check_out_path(out: str) -> None:
    """--out must be creatable; checked before the store is created or opened."""
    path = Path(out)
    if path.is_dir():
        raise CliError(f"--out {out} is a directory", Exit.USAGE)
    parent = path.parent
    if not parent.is_dir():
        raise CliError(f"--out {out}: directory {parent} does not exist", Exit.USAGE)
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise CliError(f"--out {out} is not writable", Exit.USAGE)


def cmd_scan(args: argparse.Namespace) -> int:
    from dupalign.errors import PageRejected
    from dupalign.page import Page
    from dupalign.service.capped import CappedLines
    from dupalign.service.inputs import InputError, check_inputs, iter_input
    from dupalign.service.progress import Progress

    # Nothing is created or truncated before the config, every input, --out and the store
    # have been checked or opened: a typo must not cost the previous run's output.
    if args.shards is not None:  # (removed: a clear error, not an unknown option)
        raise CliError("--shards: index shards were removed after commit 4e63f5c: scan keeps "
                       "one index (or --partitions, the stages in one process); `dupalign "
                       "stage` spreads them over processes (docs/topology.md)", Exit.USAGE)
    config = load_engine_config(args.config)
    check_inputs(args.inputs)
    if args.out:
        _check_out_path(args.out)
    pages = new = matches = 0
    compiling = not args.quiet and _note_first_compile("scan")
    progress = Progress(sys.stderr, enabled=not args.quiet, lines=args.progress, unit="pages",
                        waiting=COMPILING if compiling else None)
    rejects = CappedLines(progress.write)
    ctrl_c = _CtrlC()
    where: dict[int, str] = {}  # id(page) -> "path:line", for the rejection messages

    def pages_in() -> Iterator[tuple[Page, None]]:
        for path in args.inputs:
            for number, item in iter_input(path):
                if isinstance(item, InputError):
                    rejects.add(f"skipped {item.where}: {item.reason}")
                    continue
                ctrl_c.check()
                where[id(item)] = f"{path}:{number}"
                yield item, None

    def summary(head: str) -> str:
        return (f"{head}: {pages} pages ({new} new, {pages - new} already in the store), "
                f"{matches} matches, {rejects.count} rejected or skipped")

    with _open_scan(args, config) as engine:
        # --out is opened at the first page processed: a run that processes none leaves the
        # previous output as it was; one that stops early keeps what it found
        out: IO[str] | None = None if args.out else sys.stdout
        interrupted = False
        ctrl_c.catch()
        try:
            from dupalign.runtime.pipeline import default_jobs  # (numba: after the checks)

            jobs = args.jobs or default_jobs()
            for page, found in engine.process_many(pages_in(), jobs=jobs):
                ctrl_c.check()
                at = where.pop(id(page))
                if isinstance(found, PageRejected):
                    rejects.add(f"rejected {at} ({page.id}): {found}")
                    continue
                if isinstance(found, BaseException):
                    raise found
                if out is None:
                    out = open(args.out, "w", encoding="utf-8")  # noqa: SIM115
                pages += 1
                new += not engine.last_report.replayed
                now_ms = int(time.time() * 1000)
                for match in found:
                    out.write(json.dumps(match.to_dict(now_ms), ensure_ascii=False) + "\n")
                matches += len(found)
                engine.run_audits()  # (engine.audit.sample: off unless set)
                progress.update(1, f"{matches} matches, {rejects.count} rejected")
        except BaseException as exc:
            interrupted = _interrupted(exc)
            raise
        finally:
            ctrl_c.release()
            progress.close()
            rejects.close()
            if out is not None and out is not sys.stdout:
                out.close()
            if interrupted:  # (the store holds pages indexed ahead of their matches too)
                print(summary("scan interrupted") + f"; the store holds {engine.alive} "
                      "pages: a run again answers those from the store, matches included, "
                      "and goes on", file=sys.stderr)
    print(summary("scan"), file=sys.stderr)
    if pages == 0:
        why = "every page was rejected or skipped (see above)" if rejects.count else \
            "no page found"
        raise CliError(f"nothing was processed: {why}", Exit.NOTHING_DONE)
    return 0


COMPILING = "compiling kernels (first run, ~2 min)…"  # the progress bar's, until a page is done


class _CtrlC:
    """Ctrl-C during a scan's pages: the first is noted and the scan stops at the next page
    (raised inside numba's code, a KeyboardInterrupt came out as a SystemError or was taken
    for one page's failure and lost), the second interrupts at once."""

    def __init__(self) -> None:
        self.pressed = False
        self.previous: Any = None

    def catch(self) -> None:
        self.previous = signal.signal(signal.SIGINT, self._handler)

    def release(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt


def _interrupted(exc: BaseException | None) -> bool:
    """``exc`` is Ctrl-C, or an error it caused (numba wraps it in a SystemError)."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False




def _note_first_compile(command: str) -> bool:
    """A first run compiles the engine's numba kernels before its first page: say so
    (True: it does)."""
    from dupalign.runtime.kernel_status import kernels_cached

    if kernels_cached() is not False:
        return False
    print(f"dupalign {command}: compiling the engine's kernels on this first run (about "
          "two minutes of CPU per process; cached, later runs start in seconds)",
          file=sys.stderr)
    return True


_STORE_HELP = "RocksDB store directory (made by scan or a worker)"
# a reader takes the store's frozen parameters whatever its config says; a writer must match
_READ_CONFIG_HELP = ("TOML config file ([engine] table); the store's frozen parameters are "
                     "its own whatever it says")
_WRITE_CONFIG_HELP = ("TOML config file ([engine] table): the frozen parameters the store was "
                      "made with")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dupalign",
        description="Streaming near-duplicate and copied-passage detection for web crawls.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 usage or configuration, 3 input, "
        "4 store, 5 Kafka unreachable or refusing (TLS, SASL, ACL), 6 nothing processed, "
        "7 store ahead of its Kafka commit (compact, delete), 130 interrupted.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    scan = sub.add_parser("scan", help="embedded mode: pages from files in, matches out",
                          description="Pages from files through the engine; matches as JSON "
                          "Lines. Page ids: JSON Lines and WARC carry theirs; a document file "
                          "is named by its path as given, a file found in a directory by its "
                          "path relative to that directory.")
    scan.add_argument("inputs", nargs="+", metavar="INPUT",
                      help="JSON Lines, WARC, a directory of .txt/.html files, or one document")
    scan.add_argument("--store", required=True, help="RocksDB store directory")
    scan.add_argument("--config", help="TOML config file ([engine] table)")
    scan.add_argument("--out", help="write matches (JSON Lines) here instead of stdout")
    scan.add_argument("--progress", action="store_true",
                      help="progress lines on stderr even when it is not a terminal")
    scan.add_argument("--quiet", action="store_true", help="no progress bar")
    scan.add_argument("--jobs", type=_jobs, default=0,
                      help="cores for the sketch and align stages: N - 1 processes and this one "
                           "(default, or 0: all)")
    scan.add_argument("--shards", help=argparse.SUPPRESS)  # removed (cmd_scan says so)
    scan.add_argument("--partitions", type=_partitions, default=None, metavar="D,E,P,S,C[,R]",
                      help="run the partitioned pipeline in this process: directory, exact, "
                           "near (a power of 2), list, combine and router partitions (R: 1 "
                           "if not given), each over its own store under --store (a new "
                           "directory); the same matches")
    scan.set_defaults(func=cmd_scan)

    query = sub.add_parser("query", help="align one text against a store")
    query.add_argument("text", nargs="?", help="the text (default: --file or stdin)")
    query.add_argument("--file", help="read the text from this file")
    query.add_argument("--store", required=True, help=_STORE_HELP)
    query.add_argument("--config", help=_READ_CONFIG_HELP)
    query.set_defaults(func=cmd_query)

    stats = sub.add_parser("stats", help="what a store holds")
    stats.add_argument("--store", required=True, help=_STORE_HELP)
    stats.add_argument("--config", help=_READ_CONFIG_HELP)
    stats.add_argument("--json", action="store_true",
                       help="the store's figures and frozen parameters, as JSON")
    stats.set_defaults(func=cmd_stats)

    audit = sub.add_parser("audit", help="recall of the index over a sample of stored pages")
    audit.add_argument("--store", required=True, help=_STORE_HELP)
    audit.add_argument("--config", help=_READ_CONFIG_HELP)
    audit.add_argument("--pages", type=_positive, default=200,
                       help="stored pages audited, a seeded uniform sample (default 200)")
    audit.add_argument("--reservoir", type=_positive, default=None,
                       help="stored pages passages are aligned against (default: "
                            "engine.audit.reservoir; the live audit's reservoir when kept)")
    audit.add_argument("--json", action="store_true", help="print the estimates as JSON")
    audit.set_defaults(func=cmd_audit)

    delete = sub.add_parser("delete", help="remove pages from every index of a store")
    delete.add_argument("ids", nargs="+", metavar="ID", help="page ids")
    delete.add_argument("--store", required=True, help=_STORE_HELP)
    delete.add_argument("--config", help=_WRITE_CONFIG_HELP)
    delete.add_argument("--force", action="store_true",
                        help="delete even when the store holds pages a Kafka worker stored "
                             "past its commit (it reads them again and expects them "
                             "stored: wrong matches); without it that exits 7")
    delete.set_defaults(func=cmd_delete)

    compact = sub.add_parser("compact", help="apply retention: the oldest pages leave")
    compact.add_argument("--store", required=True, help=_STORE_HELP)
    compact.add_argument("--config",
                         help=_WRITE_CONFIG_HELP + ", and [engine.retention]")
    compact.add_argument("--max-pages", type=int,
                         help="keep at most this many pages (retention.max_pages)")
    compact.add_argument("--max-age", type=int, metavar="SECONDS",
                         help="remove pages fetched longer ago (retention.max_age)")
    compact.add_argument("--force", action="store_true",
                         help="sweep even when the store holds pages a Kafka worker stored "
                              "past its commit (it reads them again and expects them "
                              "stored: wrong matches); without it that exits 7")
    compact.set_defaults(func=cmd_compact)

    # Their arguments are defined apart (dupalign.service.kafka_args): the commands' modules import
    # aiokafka and the engine, seconds of CPU that --help must not cost.
    from dupalign.service.kafka_args import (
        add_produce_arguments,
        add_stage_arguments,
        add_worker_arguments,
    )

    worker = sub.add_parser("worker", help="run the Kafka worker service")
    add_worker_arguments(worker)
    worker.set_defaults(func=_run_worker)
    stage = sub.add_parser("stage", help="run roles of the partitioned pipeline on Kafka",
                           description="Run roles of the partitioned pipeline in this process "
                           "(docs/topology.md): `all` for one process, then more processes "
                           "of any roles to grow; each role's partitions are spread over the "
                           "processes running it. The matches are those of `scan` over the "
                           "pages in sequence order.")
    add_stage_arguments(stage)
    stage.set_defaults(func=_run_stage)
    produce = sub.add_parser("produce", help="publish pages from files to a Kafka topic")
    add_produce_arguments(produce)
    produce.set_defaults(func=_run_produce)

    acls = sub.add_parser("acls", help="the Kafka ACLs a role needs, as kafka-acls.sh commands",
                          description="Print the kafka-acls.sh commands that grant PRINCIPAL "
                          "exactly what ROLE needs on the cluster of the config's [kafka] "
                          "table (topics, consumer group, transactional ids): least "
                          "privilege on a cluster with an authorizer (docs/security.md).")
    acls.add_argument("--role", metavar="{" + ",".join(_ACL_ROLES) + "}",
                      help="worker (the single worker), produce, or consumer (a reader of the "
                           "matches)")
    acls.add_argument("--stage", action="append", metavar="ROLE[,ROLE...]",
                      help="roles of `dupalign stage` instead (sketch, directory, exact, "
                           "learner, router, near, lists, combine, align, or all): what a "
                           "process running them needs, together")
    acls.add_argument("--principal", metavar="TYPE:NAME", help="e.g. User:sketch")
    acls.add_argument("--config", metavar="FILE",
                      help="TOML config ([kafka]: topic names, group, transactional id prefix)")
    acls.add_argument("--bootstrap", metavar="HOST:PORT",
                      help="--bootstrap-server of the commands (default kafka.bootstrap_servers)")
    acls.add_argument("--command-config", metavar="FILE",
                      help="kafka-acls.sh's --command-config (the admin's client properties)")
    acls.add_argument("--group", help="consumer role: the reader's group "
                                      "(default {kafka.group_id}-matches)")
    acls.add_argument("--table", action="store_true",
                      help="every role's access as a Markdown table instead (with --stage: "
                           "the stage roles named)")
    acls.set_defaults(func=cmd_acls)
    return parser


# dupalign.service.acls.ROLES (not imported at parse time; tests/service/test_acls.py checks)
_ACL_ROLES = ("worker", "produce", "consumer")


def cmd_acls(args: argparse.Namespace) -> int:
    from dupalign.service import acls
    from dupalign.service.config import load_config

    overrides = {"kafka": {"bootstrap_servers": args.bootstrap}} if args.bootstrap else {}
    config = load_config(args.config, overrides=overrides)
    kc = config.kafka
    if args.stage:
        return _stage_acls(args, config)
    if args.table:
        print(acls.table(kc))
        return 0
    if args.role in acls.REMOVED_ROLES:
        from dupalign.service.kafka_args import REMOVED_TOPOLOGY

        raise CliError(f"--role {args.role}: {REMOVED_TOPOLOGY}; the stage roles' ACLs: "
                       "`dupalign acls --stage ROLE`", Exit.USAGE)
    if args.role is not None and args.role not in acls.ROLES:
        raise CliError(f"--role {args.role}: choose among {', '.join(acls.ROLES)}", Exit.USAGE)
    if not args.role or not args.principal:
        raise CliError("give --role (or --stage) and --principal, or --table", Exit.USAGE)
    _check_principal(args.principal)
    for line in acls.commands(args.role, args.principal, kc, args.bootstrap,
                              args.command_config, args.group):
        print(line)
    return 0


def _check_principal(principal: str | None) -> None:
    if principal is None:
        raise CliError("give --principal TYPE:NAME (or --table)", Exit.USAGE)
    if ":" not in principal:
        raise CliError(f"--principal {principal}: give TYPE:NAME, e.g. User:sketch",
                       Exit.USAGE)


def _stage_acls(args: argparse.Namespace, config: Any) -> int:
    """``dupalign acls --stage ROLES``: the ACLs of a process running them (or their table)."""
    from dupalign.service import acls
    from dupalign.service.roles import stage_acls
    from dupalign.service.roles.stage_command import parse_stage_roles
    from dupalign.service.topology import TopologyError

    if args.role:
        raise CliError("give --role (the single worker, produce or a consumer) or --stage "
                       "(roles of `dupalign stage`), not both", Exit.USAGE)
    try:
        roles = parse_stage_roles(args.stage)
        if args.table:
            print(stage_acls.table(config, roles))
            return 0
        _check_principal(args.principal)
        grants = stage_acls.union(stage_acls.stage_grants(config, roles).values())
    except (ValueError, TopologyError) as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    found = stage_acls.accesses(grants, config.kafka.create_topics)
    for line in acls.render(found, args.principal, config.kafka, args.bootstrap,
                            args.command_config):
        print(line)
    return 0


def _partitions(text: str) -> Any:
    """--partitions D,E,P,S,C[,R] (dupalign.stages.partitioned ``Shape``)."""
    from dupalign.stages.partitioned import Shape

    try:
        return Shape.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _jobs(text: str) -> int:
    """--jobs: 0 means all cores, as worker.jobs = 0 does, and the same range [0, 1024]."""
    try:
        jobs = int(text)
    except ValueError:
        jobs = -1
    if not 0 <= jobs <= 1024:
        raise argparse.ArgumentTypeError(f"{text}: give a count of cores (at most 1024), or 0 "
                                         "for all")
    return jobs


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a positive count")
    return n


def _kafka_config(args: argparse.Namespace) -> Any:
    """The config of a Kafka command (worker, stage), its port, broker and credentials
    checked first: each failure is one line and its exit code."""
    from dupalign.service import worker as service
    from dupalign.service.exits import check_broker_reachable
    from dupalign.service.http import check_port

    config = service.config_from_args(args)
    if config.metrics.enabled:  # a port in use is said before anything else is tried
        check_port(config.metrics.host, config.metrics.port)
    check_broker_reachable(config.kafka.bootstrap_servers)
    import asyncio

    from dupalign.service.kafka_security import check_security

    asyncio.run(check_security(config.kafka))
    return config


def _run_worker(args: argparse.Namespace) -> int:
    from dupalign.service import worker as service
    from dupalign.service.kafka_args import REMOVED_TOPOLOGY

    if args.roles is not None:  # (before the broker is tried)
        raise CliError(f"--roles: {REMOVED_TOPOLOGY}", Exit.USAGE)
    _kafka_config(args)
    _note_first_compile("worker")
    return int(service.run_worker(args))


def _run_stage(args: argparse.Namespace) -> int:
    from dupalign.service.roles.stage_command import run_stage, stage_roles

    roles = stage_roles(args)  # (a usage error before the broker is tried)
    config = _kafka_config(args)
    _note_first_compile("stage")
    return run_stage(args, roles, config)


def _run_produce(args: argparse.Namespace) -> int:
    from dupalign.service.produce import run_produce

    return run_produce(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return Exit.INTERRUPTED
    except Exception as exc:
        if _interrupted(exc):
            return Exit.INTERRUPTED
        code, message = classify(exc)
        if code == Exit.INTERNAL and os.environ.get("DUPALIGN_DEBUG"):
            raise
        print(f"dupalign {args.command}: {message}", file=sys.stderr)
        return code


def classify(exc: BaseException) -> tuple[Exit, str]:
    """Exit code and one-line message for an exception that ends a command."""
    from dupalign.errors import ConfigError, StoreError, StoreMismatch
    from dupalign.service.inputs import InputsUnusable

    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, ConfigError):
        return Exit.USAGE, f"invalid configuration: {exc}"
    if isinstance(exc, InputsUnusable):
        return Exit.INPUT, str(exc)
    if isinstance(exc, StoreMismatch | StoreError):  # StoreUnavailable is a StoreError
        return Exit.STORE, str(exc)
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return Exit.INTERNAL, (f"internal error: {type(exc).__name__}: {first_line} "
                           "(DUPALIGN_DEBUG=1 shows the traceback)")


if __name__ == "__main__":
    sys.exit(main())
