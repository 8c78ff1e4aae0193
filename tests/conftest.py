"""Shared fixtures. ``kafka_bootstrap`` starts one real Apache Kafka broker (KRaft, from the
official Maven Central artifacts, via deploy/kafka/broker.sh, on free ports) on first use and
stops it when the session ends: under pytest-xdist (``make test``), one that the workers
share, started by the first that needs it and stopped by the controller. No mocks of Kafka.
Under xdist the controller also compiles numba's kernels first (``pytest_configure``).

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

import fcntl
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
SHARED_BROKER = "kafka-broker"  # under xdist: the broker's directory in the run's temp root


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, compile numba's kernels once, before the workers start, rather
    than in every worker at once (tests/warm_kernels.py): only when they are not cached."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    from tests.warm_kernels import warm_all

    warm_all()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The xdist controller stops the broker its workers shared (``kafka_bootstrap``)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    broker_dir = config._tmp_path_factory.getbasetemp() / SHARED_BROKER  # type: ignore[attr-defined]
    if broker_dir.exists():
        _stop_broker(broker_dir)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("testdata") is not None and not TESTDATA.is_dir():
        message = (f"needs the shared test corpora: {TESTDATA} not found "
                   "(set DUPALIGN_SHARED to the folder holding testdata/)")
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _start_broker(broker_dir: Path) -> tuple[int, str]:
    """(0, bootstrap) or (broker.sh's exit code, the message to fail or skip with)."""
    proc = subprocess.run(["bash", str(BROKER_SH), "start", str(broker_dir)],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode == 0:
        return 0, proc.stdout.strip().splitlines()[-1]
    _stop_broker(broker_dir)
    return proc.returncode, (f"Kafka broker did not start (broker.sh exit {proc.returncode}):"
                             f"\n{proc.stderr}")


def _stop_broker(broker_dir: Path) -> None:
    subprocess.run(["bash", str(BROKER_SH), "stop", str(broker_dir)], check=False,
                   capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("DUPALIGN_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    own = None if os.environ.get("PYTEST_XDIST_WORKER") else tmp_path_factory.mktemp("kafka")
    if own is not None:
        code, found = _start_broker(own)
    else:
        # the workers share one broker (each would spend ~40 s of CPU starting its own and
        # ~5 % of a core idling): the first to need it starts it, the controller stops it
        # (pytest_unconfigure); the outcome is kept for the others
        root = tmp_path_factory.getbasetemp().parent
        with open(root / "kafka-broker.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            outcome = root / "kafka-broker.outcome"
            if not outcome.exists():
                code, found = _start_broker(root / SHARED_BROKER)
                outcome.write_text(f"{code}\n{found}")
            code_line, found = outcome.read_text().split("\n", 1)
            code = int(code_line)
    if code != 0:
        if code == TOOLS_MISSING and not _in_ci():
            pytest.skip(found.strip())
        pytest.fail(found, pytrace=False)
    try:
        yield found
    finally:
        if own is not None:
            _stop_broker(own)


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
    # The slow tests first (the 5,000-page topology takes minutes): collected last, xdist
    # handed it out near the end and the suite waited for it alone. (Every worker sorts
    # alike: xdist needs one order.)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if os.environ.get("DUPALIGN_CONTAINER_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="container build and run take minutes: set DUPALIGN_"
                                   "CONTAINER_TESTS=1 (needs podman, see deploy/README.md)")
    for item in items:
        if "container" in item.keywords:
            item.add_marker(skip)
