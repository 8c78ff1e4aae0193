"""Shared fixtures. ``kafka_bootstrap`` starts one real Apache Kafka broker (KRaft, from the
official Maven Central artifacts, via deploy/kafka/broker.sh, on free ports) on first use and
stops it when the session ends: under pytest-xdist (``make test``), one per worker that runs
a Kafka test. No mocks of Kafka.

* Java or Maven missing: Kafka tests are skipped with that reason, except when CI=true,
  where they fail (CI must never pass without having run them).
* Any other broker failure fails the tests that need it, with the script's output.
* DUPALIGN_TEST_BOOTSTRAP=HOST:PORT uses an already running broker instead.

``prometheus_bin`` is the directory holding Prometheus and promtool from Debian's package
(deploy/prometheus/install.sh fetches and caches them): skipped where the package is not
available, failed under CI=true. Tests marked ``container`` build and run the image with
podman; they take minutes, so they run only with DUPALIGN_CONTAINER_TESTS=1.

Tests marked ``testdata`` read the shared corpora in ``$DUPALIGN_SHARED/testdata`` (default
``../shared/testdata``): without them they are skipped with that reason, except under CI=true,
where they fail.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.corpora import TESTDATA

REPO = Path(__file__).resolve().parent.parent
BROKER_SH = REPO / "deploy" / "kafka" / "broker.sh"
PROMETHEUS_SH = REPO / "deploy" / "prometheus" / "install.sh"
TOOLS_MISSING = 2  # broker.sh and install.sh exit code: the tools are not available here


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("testdata") is not None and not TESTDATA.is_dir():
        message = (f"needs the shared test corpora: {TESTDATA} not found "
                   "(set DUPALIGN_SHARED to the folder holding testdata/)")
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("DUPALIGN_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    broker_dir = tmp_path_factory.mktemp("kafka-broker")
    proc = subprocess.run(
        ["bash", str(BROKER_SH), "start", str(broker_dir)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    if proc.returncode != 0:
        message = f"Kafka broker did not start (broker.sh exit {proc.returncode}):\n{proc.stderr}"
        subprocess.run(["bash", str(BROKER_SH), "stop", str(broker_dir)], check=False,
                       capture_output=True, timeout=60)
        if proc.returncode == TOOLS_MISSING and not _in_ci():
            pytest.skip(message.strip())
        pytest.fail(message, pytrace=False)
    try:
        yield proc.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(BROKER_SH), "stop", str(broker_dir)], check=False,
                       capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    proc = subprocess.run(["bash", str(PROMETHEUS_SH)], capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode != 0:
        message = f"Prometheus not available (install.sh exit {proc.returncode}): {proc.stderr}"
        if proc.returncode == TOOLS_MISSING and not _in_ci():
            pytest.skip(message.strip())
        pytest.fail(message, pytrace=False)
    return Path(proc.stdout.strip().splitlines()[-1])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DUPALIGN_CONTAINER_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="container build and run take minutes: set DUPALIGN_"
                                   "CONTAINER_TESTS=1 (needs podman, see deploy/README.md)")
    for item in items:
        if "container" in item.keywords:
            item.add_marker(skip)
