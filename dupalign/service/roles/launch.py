"""A process running roles of ``dupalign stage`` (dupalign/service/roles/stage_command.py):
each role a consumer-group member of its input topics, connected to the others by topics
only.

The process serves ``/metrics`` (dupalign/service/roles/metrics.py), ``/healthz`` and
``/readyz`` like the single worker (dupalign/service/http.py, ``[metrics]``): healthy until a
role fails, ready once every role consumes and until a stop; a failure stops every role, is
logged in one line and exits 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from dupalign.errors import StoreError
from dupalign.service.config import Config, KafkaConfig
from dupalign.service.exits import Exit
from dupalign.service.http import HttpServer
from dupalign.service.kafka_security import refusal
from dupalign.service.log_repeats import STARTUP
from dupalign.service.outage import KafkaUnavailable
from dupalign.service.roles.metrics import RoleMetrics

log = logging.getLogger("dupalign.roles")

def ordered_roles(names: set[str], known: tuple[str, ...], choices: str) -> tuple[str, ...]:
    """``names`` in ``known``'s order; ValueError naming ``choices`` for others or none."""
    unknown = names - set(known)
    if unknown or not names:
        raise ValueError(f"unknown roles {sorted(unknown)}: choose among {choices}")
    return tuple(r for r in known if r in names)


class RoleHealth:
    """``/healthz`` and ``/readyz`` of a process running roles."""

    def __init__(self, parts: list[Any], tasks: list[asyncio.Task[None]]) -> None:
        self.parts, self.tasks = parts, tasks
        self.stopping = False

    def healthy(self) -> tuple[bool, str]:
        failed = [f"{t.get_name()}: {t.exception()}" for t in self.tasks
                  if t.done() and not t.cancelled() and t.exception() is not None]
        if failed:
            return False, "failed: " + "; ".join(failed)
        ended = [t.get_name() for t in self.tasks if t.done()]
        if ended and not self.stopping:
            return False, f"roles ended: {', '.join(ended)}"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if self.stopping:
            return False, "stopping"
        ok, reason = self.healthy()
        if not ok:
            return False, reason
        starting = [p.name for p in self.parts if not p.started]
        if starting:
            return False, f"starting: {', '.join(starting)}"
        return True, f"running {', '.join(p.name for p in self.parts)}"


def failure_line(role: str, exc: BaseException, kc: KafkaConfig) -> tuple[str, bool]:
    """The one log line of a role's failure, and whether it is a known failure (Kafka, the
    store, the topics) that needs no traceback."""
    from dupalign.service.topology import TopologyError

    known = isinstance(exc, KafkaError | StoreError | TopologyError)
    cause = refusal(exc, kc) or (f"Kafka failed: {exc!r}" if isinstance(exc, KafkaError) else (
        str(exc) if known else f"unexpected {type(exc).__name__}: {exc}"))
    return f"{role} role stopped: {cause}", known


async def serve_roles(config: Config, roles: tuple[str, ...], store_dir: str | Path | None,
                      make: Callable[..., list[Any]]) -> int:
    """Run the roles until SIGTERM/SIGINT (exit 0) or the first failure (exit 1: the
    transactions in hand abort, and the next owner of the partitions redoes them).
    ``make``: what makes them (``make_stage_roles``: stage_command.py)."""
    from dupalign.wire import messages

    messages.compile_all()
    metrics = RoleMetrics()
    parts = make(config, roles, store_dir, metrics)
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []
    health = RoleHealth(parts, tasks)

    def stop() -> None:
        health.stopping = True
        for part in parts:
            part.stop()

    http: HttpServer | None = None
    if config.metrics.enabled:
        http = HttpServer(metrics.registry, health.healthy, health.ready)
        port = await http.start(config.metrics.host, config.metrics.port)
        log.info("http listening", extra={"host": config.metrics.host, "port": port})
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    STARTUP.begin(grace=120.0)  # (each role checks its topics, then subscribes)
    tasks += [asyncio.create_task(part.run(), name=part.name) for part in parts]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if t.exception() is not None]
        stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        refused = False
        for task in failed:
            exc = task.exception()
            assert exc is not None
            line, known = failure_line(task.get_name(), exc, config.kafka)
            log.error("%s", line, exc_info=None if known else exc)
            refused |= (refusal(exc, config.kafka) is not None
                        or isinstance(exc, KafkaUnavailable))
        return (Exit.KAFKA if refused else 1) if failed else 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if http is not None:
            await http.stop()
