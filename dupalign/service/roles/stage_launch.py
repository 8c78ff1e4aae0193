"""Run one role of the partitioned pipeline in this process (docs/pipeline.md, "Roles on
Kafka"), until SIGTERM/SIGINT (exit 0) or a failure (exit 1)::

    python -m dupalign.service.roles.stage_launch ROLE --config FILE \\
        [--shape D,E,P,S,C[,R[,A]]] [--store DIR]

ROLE: ``sketch``, ``directory``, ``exact``, ``learner``, ``router``, ``near``, ``lists``,
``combine`` or ``align``; the shape: ``kafka.shape`` unless given. The tests' launcher, with no
HTTP server: users run ``dupalign stage`` (stage_command.py), which serves metrics and runs any
roles.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from dupalign.service.config import Config, load_config
from dupalign.service.kafka_args import STAGE_ROLES
from dupalign.service.logs import setup_logging
from dupalign.service.roles.launch import failure_line
from dupalign.stages.partitioned import Shape

log = logging.getLogger("dupalign.roles")


def make_role(config: Config, role: str, shape: Shape, store: str | None) -> Any:
    from dupalign.service.roles.metrics import RoleMetrics
    from dupalign.service.roles.stage_command import make_stage_roles

    if role != "sketch" and store is None:
        raise ValueError(f"the {role} role needs --store")
    (made,) = make_stage_roles(config, (role,), store, RoleMetrics(), shape)
    return made


async def serve(config: Config, role: Any) -> int:
    from dupalign.wire import messages

    messages.compile_all()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, role.stop)
    try:
        await role.run()
        return 0
    except Exception as exc:
        line, known = failure_line(role.name, exc, config.kafka)
        log.error("%s", line, exc_info=None if known else exc)
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stage_launch", description=__doc__.split("\n")[0])
    p.add_argument("role", choices=STAGE_ROLES)
    p.add_argument("--config", required=True)
    p.add_argument("--shape", help="D,E,P,S,C[,R[,A]] (default: kafka.shape)")
    p.add_argument("--store", help="the role's stores (every role but sketch)")
    args = p.parse_args(argv)
    config = load_config(args.config)
    setup_logging(config.worker.log_level, config.worker.log_format)
    role = make_role(config, args.role, Shape.parse(args.shape or config.kafka.shape),
                     args.store)
    return asyncio.run(serve(config, role))


if __name__ == "__main__":
    sys.exit(main())
