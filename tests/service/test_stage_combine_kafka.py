"""The combine role on a real broker: it starts and takes its partitions (tests/service/
test_stage_combine.py checks what it does; test_stage_align_kafka.py runs the whole chain
through it, passages on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dupalign.service.topology import ensure_topics
from dupalign.stages.partitioned import Shape
from tests.role_processes import check_alive, stop_all, wait_log
from tests.service.test_stage_roles_kafka import Roles

pytestmark = pytest.mark.kafka


async def test_the_combine_role_starts_and_takes_its_partitions(kafka_bootstrap: str,
                                                                tmp_path: Path) -> None:
    roles = Roles(kafka_bootstrap, tmp_path, shape=Shape(1, 1, 1, 1, 2))
    await ensure_topics(roles.kc, roles.topics.wanted())
    try:
        _, log = roles.start("combine", "combine")
        await wait_log(log, "combine role assigned", 120)
        check_alive(roles.procs)
    finally:
        stop_all(roles.procs)
    taken = [line for line in log.read_text().splitlines() if "taken:" in line]
    assert len(taken) == 2, log.read_text()
