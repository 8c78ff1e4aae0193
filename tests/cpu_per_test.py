"""A pytest plugin that writes each test's CPU time (its process and the children it
waited for: role processes, CLI runs) and wall time, to see where the suite's CPU goes:

    DUPALIGN_TEST_CPU_LOG=/tmp/cpu.log .venv/bin/python -m pytest -q -n 3 -p tests.cpu_per_test
    sort -rn /tmp/cpu.log | head -30

One line per test: CPU seconds, wall seconds, node id (appended: under xdist every worker
writes to the same file). A shared broker's CPU is in no test's figure.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

import pytest


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    log = os.environ.get("DUPALIGN_TEST_CPU_LOG")
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    if log:
        with open(log, "a") as out:
            out.write(f"{_cpu_seconds() - cpu:.1f} {time.monotonic() - wall:.1f} "
                      f"{item.nodeid}\n")
