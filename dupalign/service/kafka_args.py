"""The arguments of ``dupalign worker``, ``stage`` and ``produce``, apart from their commands.

Defining them imports argparse only, so ``dupalign worker --help`` (``stage``, ``produce``)
answer at once: the commands' modules import aiokafka and the engine (numba), seconds of CPU.
"""

from __future__ import annotations

import argparse

__all__ = ["REMOVED_TOPOLOGY", "STAGE_ROLES", "add_produce_arguments", "add_stage_arguments",
           "add_worker_arguments"]

# the roles of the partitioned pipeline, in its order (docs/pipeline.md, "Roles on Kafka")
STAGE_ROLES = ("sketch", "directory", "exact", "learner", "router", "near", "lists", "combine",
               "align")

# what an option of the index topology (removed after commit 4e63f5c) says: bad config gets a
# clear error, never a silent ignore
REMOVED_TOPOLOGY = ("the index topology (`dupalign worker --roles`, index shards, their topics "
                    "and ACLs) was removed after commit 4e63f5c: run `dupalign worker` for "
                    "one process, or `dupalign stage ROLE...|all` to grow to many "
                    "(docs/topology.md)")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="Kafka bootstrap servers (overrides kafka.bootstrap_servers)")
    parser.add_argument("--store", metavar="DIR", help="RocksDB store directory (required)")
    parser.add_argument("--roles", help=argparse.SUPPRESS)  # removed: REMOVED_TOPOLOGY
    _add_process_arguments(parser, "consumer group id (overrides kafka.group_id)")


def add_stage_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("roles", nargs="+", metavar="ROLE",
                        help=f"roles to run in this process: {', '.join(STAGE_ROLES)}, or all "
                        "(any number of processes may run a role: its partitions are spread "
                        "over them)")
    parser.add_argument("--store", metavar="DIR",
                        help="where the roles keep their stores (DIR/<role>/<partition>; "
                        "every role but sketch): a cache, restored from Kafka when missing")
    parser.add_argument("--shape", metavar="D,E,P,S,C,R,A",
                        help="partitions of the directory, exact, near, lists, combine, router "
                        "and align stages (overrides kafka.shape; every process of a "
                        "deployment needs the same)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="Kafka bootstrap servers (overrides kafka.bootstrap_servers)")
    _add_process_arguments(parser, "prefix of the roles' consumer groups (overrides "
                           "kafka.group_id)")


def _add_process_arguments(parser: argparse.ArgumentParser, group_help: str) -> None:
    """What a long-running Kafka process (worker, stage) takes besides its roles."""
    parser.add_argument("--config", metavar="FILE",
                        help="TOML config ([kafka], [worker], [metrics], [engine]); "
                        "DUPALIGN_<TABLE>_<KEY> environment variables override it")
    parser.add_argument("--group", help=group_help)
    parser.add_argument("--metrics-port", type=int,
                        help="HTTP port for /metrics, /healthz, /readyz (0 = any free port)")
    parser.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                        help="log level (overrides worker.log_level)")


def add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="FILE",
                        help="JSON Lines (.jsonl[.gz]), WARC (.warc[.gz]), a directory of "
                        ".txt/.html files, or one document (page ids as for `scan`)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="Kafka bootstrap servers (overrides kafka.bootstrap_servers)")
    parser.add_argument("--topic", help="target topic (default: kafka.input_topic, 'pages')")
    parser.add_argument("--config", metavar="FILE", help="TOML config (its [kafka] table)")
    parser.add_argument("--limit", type=int, help="stop after this many pages")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
