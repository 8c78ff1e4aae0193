"""``dupalign stage ROLE...``: roles of the partitioned pipeline (docs/pipeline.md, "Roles on
Kafka") in this process, until SIGTERM/SIGINT (exit 0) or a failure (exit 1; 5 when Kafka
refuses or stays away). ``all`` runs every role here: one process holds the whole pipeline,
and more processes, each running some of the roles, take over partitions of them as they
join (each role a consumer group; docs/topology.md, "Growing").

The shape (the partitions of each stage) is ``kafka.shape``, which ``--shape`` overrides: every
process of a deployment needs the same, and a role whose topics were made with another stops
at start, naming it (``StageTopics.options``). Missing topics are made at start
(``kafka.create_topics``, true by default), the changelogs compacted. The process serves
``/metrics``, ``/healthz`` and ``/readyz`` (``serve_roles``: launch.py).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from pathlib import Path
from typing import Any

from dupalign.service.config import Config
from dupalign.service.exits import CliError, Exit
from dupalign.service.kafka_args import STAGE_ROLES
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.stages.partitioned import Shape


def parse_stage_roles(names: list[str]) -> tuple[str, ...]:
    """``["directory,exact", "near"]`` or ``["all"]`` -> the roles in the pipeline's order;
    ValueError for others."""
    wanted = {n.strip() for name in names for n in name.split(",") if n.strip()}
    from dupalign.service.roles.launch import ordered_roles  # (it imports aiokafka)

    if "all" in wanted:
        wanted = (wanted - {"all"}) | set(STAGE_ROLES)
    return ordered_roles(wanted, STAGE_ROLES, f"{', '.join(STAGE_ROLES)}, or all")


def make_stage_roles(config: Config, roles: tuple[str, ...], store_dir: str | Path | None,
                     metrics: RoleMetrics, shape: Shape) -> list[Any]:
    """The roles, sharing the process's metrics; each stage keeps its stores under
    ``store_dir``/<stage>."""
    from dupalign.service.roles.stage_align import AlignStageRole
    from dupalign.service.roles.stage_combine import CombineRole
    from dupalign.service.roles.stage_directory import DirectoryRole
    from dupalign.service.roles.stage_exact import ExactRole
    from dupalign.service.roles.stage_learner import LearnerRole
    from dupalign.service.roles.stage_lists import ListsRole
    from dupalign.service.roles.stage_near import NearRole
    from dupalign.service.roles.stage_router import RouterRole
    from dupalign.service.roles.stage_sketch import StageSketchRole

    kinds = {"directory": DirectoryRole, "exact": ExactRole, "learner": LearnerRole,
             "router": RouterRole,
             "near": NearRole, "lists": ListsRole, "combine": CombineRole,
             "align": AlignStageRole}
    out: list[Any] = []
    for role in roles:
        if role == "sketch":
            out.append(StageSketchRole(config, shape, metrics))
        else:
            assert store_dir is not None  # (run_stage checks)
            out.append(kinds[role](config, shape, store_dir, metrics))
    return out


def stage_roles(args: argparse.Namespace) -> tuple[str, ...]:
    """The roles ``args`` names; a usage error (exit 2) for unknown ones, or without the
    store they need."""
    try:
        roles = parse_stage_roles(args.roles)
    except ValueError as exc:
        raise CliError(str(exc), Exit.USAGE) from None
    if roles != ("sketch",) and not args.store:
        raise CliError("--store is required (every role but sketch keeps its stores there)",
                       Exit.USAGE)
    return roles


def run_stage(args: argparse.Namespace, roles: tuple[str, ...], config: Config) -> int:
    """The command: ``roles`` (``stage_roles``) with ``config`` (dupalign/service/cli.py)."""
    from dupalign.service.kafka_security import quiet_refusals
    from dupalign.service.logs import setup_logging
    from dupalign.service.roles.launch import serve_roles

    shape = Shape.parse(config.kafka.shape)  # (checked by the config: kafka.shape)
    setup_logging(config.worker.log_level, config.worker.log_format)
    quiet_refusals()
    make = functools.partial(make_stage_roles, shape=shape)
    return asyncio.run(serve_roles(config, roles, args.store, make=make))
