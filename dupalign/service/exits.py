"""Exit codes of the ``dupalign`` command and the one-line error that carries them.

Documented in the README ("Exit codes"); scripts may rely on them, so never renumber.
"""

from __future__ import annotations

import socket
from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug or an unforeseen failure (DUPALIGN_DEBUG=1 shows the traceback)
    USAGE = 2  # bad arguments or configuration (argparse also exits 2)
    INPUT = 3  # an input is missing or unreadable, a directory holds no document, ids clash
    STORE = 4  # store missing, not a directory, not writable, locked, other version/params
    KAFKA = 5  # the Kafka broker cannot be reached, or refuses TLS, the login or an ACL
    NOTHING_DONE = 6  # the run processed no page (every page rejected, or none in the inputs)
    UNCOMMITTED = 7  # compact/delete refused: the store holds pages past a Kafka commit
    INTERRUPTED = 130  # Ctrl-C


class CliError(Exception):
    """An error the command reports as one line on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.code = code


KAFKA_HINT = ("is the broker running and is the address right? (--bootstrap HOST:PORT or "
              "kafka.bootstrap_servers)")


def check_broker_reachable(bootstrap_servers: str, timeout_s: float = 5.0) -> None:
    """Raise CliError(KAFKA) unless one of the bootstrap servers accepts a TCP connection:
    a worker or producer started against a wrong address then fails at once, in one line,
    instead of retrying in the logs."""
    reasons = []
    for server in (s.strip() for s in bootstrap_servers.split(",") if s.strip()):
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)),
                                          timeout=timeout_s):
                return
        except (OSError, ValueError) as exc:
            reasons.append(f"{server}: {getattr(exc, 'strerror', None) or exc}")
    raise CliError(f"cannot reach the Kafka broker ({'; '.join(reasons)}): {KAFKA_HINT}",
                   Exit.KAFKA)
