"""The arguments of ``dupalign worker`` and ``dupalign produce``, apart from their commands.

Defining them imports argparse only, so ``dupalign worker --help`` and ``produce --help``
answer at once: the commands' modules import aiokafka and the engine (numba), seconds of CPU.
"""

from __future__ import annotations

import argparse

__all__ = ["add_produce_arguments", "add_worker_arguments"]


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="Kafka bootstrap servers (overrides kafka.bootstrap_servers)")
    parser.add_argument("--store", metavar="DIR",
                        help="RocksDB store directory (needed by the index and shard roles; "
                             "the align role keeps its forward records under DIR/align, "
                             "else in a temporary directory)")
    parser.add_argument("--roles", default="sketch,index,align", metavar="ROLES",
                        help="comma-separated roles of the topology to run here: sketch, "
                        "index, shard (kafka.index_shards > 1), align (default sketch,index,"
                        "align: the single worker; docs/topology.md)")
    parser.add_argument("--config", metavar="FILE",
                        help="TOML config ([kafka], [worker], [metrics], [engine]); "
                        "DUPALIGN_<TABLE>_<KEY> environment variables override it")
    parser.add_argument("--group", help="consumer group id (overrides kafka.group_id)")
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
