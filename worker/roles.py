"""``dupalign worker --roles sketch,index,align``: the stages as roles of a topology on Kafka
(docs/topology.md). All three roles (the default) is the single worker of worker/service.py,
whose behaviour is unchanged; any other choice runs the listed roles in this process, each
a consumer-group member of its input topics, connected to the others by topics only.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

from worker.config import Config

log = logging.getLogger("dupalign.roles")

ROLES = ("sketch", "index", "align")


def parse_roles(text: str) -> tuple[str, ...]:
    """``"sketch,align"`` -> the roles in the topology's order; ValueError for others."""
    names = {r.strip() for r in text.split(",") if r.strip()}
    unknown = names - set(ROLES)
    if unknown or not names:
        raise ValueError(f"unknown roles {sorted(unknown)}: choose among {', '.join(ROLES)}")
    return tuple(r for r in ROLES if r in names)


def make_roles(config: Config, roles: tuple[str, ...], store_dir: str | Path | None
               ) -> list[Any]:
    from worker.role_align import AlignRole
    from worker.role_index import IndexRole
    from worker.role_sketch import SketchRole

    out: list[Any] = []
    if "sketch" in roles:
        out.append(SketchRole(config))
    if "index" in roles:
        if store_dir is None:
            raise ValueError("the index role needs --store")
        out.append(IndexRole(config, store_dir))
    if "align" in roles:
        out.append(AlignRole(config))
    return out


async def serve_roles(config: Config, roles: tuple[str, ...], store_dir: str | Path | None
                      ) -> int:
    """Run the roles until SIGTERM/SIGINT (exit 0) or the first failure (exit 1: the
    transactions in hand abort, and the next owner of the partitions redoes them)."""
    from worker import messages

    messages.compile_all()
    parts = make_roles(config, roles, store_dir)
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for part in parts:
            part.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    tasks = [asyncio.create_task(part.run(), name=part.name) for part in parts]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if t.exception() is not None]
        stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in failed:
            exc = task.exception()
            log.error("%s role stopped: %r", task.get_name(), exc, exc_info=exc)
        return 1 if failed else 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
