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
where they fail. A test that reads the shared folder without the marker fails, wherever the
corpora are (``_SharedReads``): while an unmarked test's setup, call and teardown run, an audit
hook notes every file opened and every directory listed under it, and every subprocess given
a path under it; while a test module is imported, every file opened under it. Not seen: what
a subprocess finds there on its own (from an inherited DUPALIGN_SHARED or a config file), and
C/C++ code opening files directly (RocksDB).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import subprocess
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dupalign.store import options as store_options
from tests.corpora import SHARED, TESTDATA

# The stores that tests open in their own process have memtables of fewer hash buckets: the
# product's 1M buckets (an 8 MB array, zeroed for every memtable of the ``oph`` family) were
# a third of the CPU of tests that open many small stores (most of it page faults), and the
# bucket count changes no result (a bucket holds a skip list of its keys). Processes that
# tests start (CLI runs, roles) keep the product's count, and so does test_memory_budget.
PRODUCT_MEMTABLE_BUCKETS = store_options.MEMTABLE_BUCKETS
store_options.MEMTABLE_BUCKETS = 1 << 12

REPO = Path(__file__).resolve().parent.parent
BROKER_SH = REPO / "deploy" / "kafka" / "broker.sh"
PROMETHEUS_SH = REPO / "deploy" / "prometheus" / "install.sh"
TOOLS_MISSING = 2  # broker.sh and install.sh exit code: the tools are not available here
SHARED_BROKER = "kafka-broker"  # under xdist: the broker's directory in the run's temp root
SHARED_SASL_BROKER = "kafka-sasl-broker"  # and that of ``secure_kafka``


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
    """The xdist controller stops the brokers its workers shared (``kafka_bootstrap``,
    ``secure_kafka``)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    for name in (SHARED_BROKER, SHARED_SASL_BROKER):
        broker_dir = config._tmp_path_factory.getbasetemp() / name  # type: ignore[attr-defined]
        if broker_dir.exists():
            _stop_broker(broker_dir)


def _skip_without_corpora(item: pytest.Item) -> None:
    if item.get_closest_marker("testdata") is not None and not TESTDATA.is_dir():
        message = (f"needs the shared test corpora: {TESTDATA} not found "
                   "(set DUPALIGN_SHARED to the folder holding testdata/)")
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


class _SharedReads:
    """The paths under the shared folder read between ``watch`` and ``stop``. One per
    process: audit hooks cannot be removed, so the hook stays, off between watches; each
    xdist worker imports this conftest and installs its own."""

    _EVENTS = frozenset({"open", "os.scandir", "os.listdir", "subprocess.Popen"})

    def __init__(self, shared: Path) -> None:
        roots = {os.path.abspath(shared), os.path.realpath(shared)}
        self.prefixes = tuple(root.rstrip(os.sep) + os.sep for root in roots)
        self.roots = frozenset(root.rstrip(os.sep) for root in roots)
        self.events: frozenset[str] = frozenset()  # the events noted now: none between watches
        self.found: list[str] = []
        sys.addaudithook(self._audit)

    def _under(self, path: object) -> str | None:
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):  # a file descriptor, or None (the working directory)
            return None
        if not path.startswith(self.prefixes) and path not in self.roots:
            if os.path.isabs(path) and ".." not in path:  # the common case: quick
                return None
            path = os.path.abspath(path)
            if not path.startswith(self.prefixes) and path not in self.roots:
                return None
        return path

    def _audit(self, event: str, args: tuple[object, ...]) -> None:
        # on every audit event of the process (files opened by imports included): the
        # set lookup first, which is all it costs between watches
        if event not in self.events:
            return
        if event == "subprocess.Popen":  # (executable, args, cwd, env): an argument naming
            _, argv, cwd, _ = args       # a path under the folder, or run in it
            argv = [argv] if isinstance(argv, str | bytes | os.PathLike) else argv or []
            for arg in [*argv, cwd]:
                text = os.fsdecode(os.fspath(arg)) if isinstance(
                    arg, str | bytes | os.PathLike) else ""
                if any(root in text for root in self.roots):
                    self.found.append(f"{text} (given to a subprocess)")
                    return
            return
        path = self._under(args[0])
        if path is not None:
            self.found.append(path)

    def watch(self, events: frozenset[str]) -> None:
        self.found = []
        self.events = events

    def stop(self) -> list[str]:
        self.events = frozenset()
        return list(dict.fromkeys(self.found))


# a shared folder holding the repository (DUPALIGN_SHARED=$HOME, say): its testdata/ only,
# or every test would read it
_shared_reads = _SharedReads(
    TESTDATA if REPO.resolve().is_relative_to(SHARED.resolve()) else SHARED)


def _unmarked_read_message(where: str, paths: list[str], advice: str) -> str:
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (f"{where} reads the shared folder {SHARED} without @pytest.mark.testdata: {shown}. "
            f"{advice} so that it is skipped where the corpora are missing.")


def _watched(item: pytest.Item) -> Generator[None, None, None]:
    """Runs one phase of an unmarked test (the hook's yield) with the reads noted; fails it
    if it read the shared folder (also when the phase failed: the reason comes first)."""
    if item.get_closest_marker("testdata") is not None:
        return (yield)
    _shared_reads.watch(_SharedReads._EVENTS)
    try:
        return (yield)
    finally:
        found = _shared_reads.stop()
        if found:
            pytest.fail(_unmarked_read_message(
                item.nodeid, found, "Add @pytest.mark.testdata to the test (or a pytestmark "
                "to its module)"), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    _skip_without_corpora(item)
    return (yield from _watched(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _watched(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _watched(item))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[
        None, pytest.CollectReport, pytest.CollectReport]:
    """A test module that opens a file of the shared folder while it is imported fails to
    collect: whether its tests are marked is not known then (listing the folder to
    parametrize marked tests is fine: tests/service/test_cli.py)."""
    if not isinstance(collector, pytest.Module):
        return (yield)
    _shared_reads.watch(frozenset({"open"}))
    try:
        report = yield
    finally:
        found = _shared_reads.stop()
    if found:
        message = _unmarked_read_message(
            f"{collector.nodeid} (at import)", found,
            "Read it in a test or fixture marked @pytest.mark.testdata instead")
        if report.outcome == "failed":  # the read itself failed: the reason comes first
            message += f"\n\n{report.longrepr}"
        report.outcome = "failed"
        report.longrepr = message
    return report


def _start_broker(broker_dir: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(0, bootstrap) or (broker.sh's exit code, the message to fail or skip with);
    ``env``: more of broker.sh's environment (BROKER_SASL_SSL, ...)."""
    proc = subprocess.run(["bash", str(BROKER_SH), "start", str(broker_dir)],
                          capture_output=True, text=True, timeout=600, check=False,
                          env=None if env is None else {**os.environ, **env})
    if proc.returncode == 0:
        return 0, proc.stdout.strip().splitlines()[-1]
    _stop_broker(broker_dir)
    return proc.returncode, (f"Kafka broker did not start (broker.sh exit {proc.returncode}):"
                             f"\n{proc.stderr}")


def _stop_broker(broker_dir: Path) -> None:
    subprocess.run(["bash", str(BROKER_SH), "stop", str(broker_dir)], check=False,
                   capture_output=True, timeout=120)


def _start_shared_broker(tmp_path_factory: pytest.TempPathFactory, name: str,
                         env: dict[str, str] | None = None) -> tuple[int, str]:
    """``_start_broker`` of the broker the xdist workers share, in the run's temp root: each
    would spend ~40 s of CPU starting its own and ~5 % of a core idling. The first to need
    it starts it, the controller stops it (pytest_unconfigure); the outcome is kept for the
    others."""
    root = tmp_path_factory.getbasetemp().parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        outcome = root / f"{name}.outcome"
        if not outcome.exists():
            code, found = _start_broker(root / name, env)
            outcome.write_text(f"{code}\n{found}")
        code_line, found = outcome.read_text().split("\n", 1)
        return int(code_line), found


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
        code, found = _start_shared_broker(tmp_path_factory, SHARED_BROKER)
    if code != 0:
        if code == TOOLS_MISSING and not _in_ci():
            pytest.skip(found.strip())
        pytest.fail(found, pytrace=False)
    try:
        yield found
    finally:
        if own is not None:
            _stop_broker(own)


@dataclass(frozen=True)
class SecureBroker:
    """A broker of its own with a SASL_SSL listener (SCRAM-SHA-512, ACLs enforced) beside the
    plaintext one (anonymous, a super user: the tests' admin side): broker.sh with
    BROKER_SASL_SSL=1."""

    dir: Path
    plaintext: str  # bootstrap of the plaintext listener
    sasl_ssl: str  # bootstrap of the SASL_SSL listener
    cafile: Path  # the CA that signed the broker's certificate
    passwords: dict[str, str]  # SCRAM user -> password

    def kafka_env(self, user: str, password: str | None = None) -> dict[str, str]:
        """A dupalign process's [kafka] security settings for ``user``, as environment."""
        return {"DUPALIGN_KAFKA_BOOTSTRAP_SERVERS": self.sasl_ssl,
                "DUPALIGN_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "DUPALIGN_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                "DUPALIGN_KAFKA_SASL_PLAIN_USERNAME": user,
                "DUPALIGN_KAFKA_SASL_PLAIN_PASSWORD": (
                    self.passwords[user] if password is None else password),
                "DUPALIGN_KAFKA_SSL_CAFILE": str(self.cafile)}


# the SCRAM users of ``secure_kafka``: a super user, one a process (the single worker,
# produce, the stage roles': tests/service/test_stage_security_kafka.py), one without ACLs
SECURE_USERS = ("admin", "worker", "produce", "nobody", "stage-sketch", "directory", "exact",
                "learner", "router", "near", "lists", "combine", "stage-align")


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """Under xdist, one that the workers share, as ``kafka_bootstrap``'s (the users and their
    passwords read back from its sasl/users); else one of the session's own."""
    passwords = {u: f"{u}-{secrets.token_urlsafe(12)}" for u in SECURE_USERS}
    env = {"BROKER_SASL_SSL": "1",
           "BROKER_SCRAM_USERS": " ".join(f"{u}:{p}" for u, p in passwords.items())}
    own = None if os.environ.get("PYTEST_XDIST_WORKER") else tmp_path_factory.mktemp(
        "kafka-sasl")
    if own is not None:
        broker_dir = own
        code, found = _start_broker(broker_dir, env)
    else:
        broker_dir = tmp_path_factory.getbasetemp().parent / SHARED_SASL_BROKER
        code, found = _start_shared_broker(tmp_path_factory, SHARED_SASL_BROKER, env)
    if code != 0:
        if code == TOOLS_MISSING and not _in_ci():
            pytest.skip(found.strip())
        pytest.fail(found, pytrace=False)
    sasl = broker_dir / "sasl"
    passwords = dict(line.split(":", 1) for line in (sasl / "users").read_text().split())
    try:
        yield SecureBroker(broker_dir, found, (sasl / "bootstrap").read_text().strip(),
                           sasl / "ca.pem", passwords)
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


# The longest tests of each half of CI (``-m "not testdata"``, then ``-m testdata``), started
# first, so that the short ones fill the end of the run rather than one of these being its
# tail. Node ids without parameters; a test not found here merely loses its place. xdist
# (--maxschedchunk 1) hands each worker two at first, the first two to the first worker,
# and then one whenever a worker finishes one. The first half's first worker gets the tests
# that mostly wait (the broker outage, then a SASL broker's start and misconfigurations)
# while the other two begin with the tests that compute, so that both cores stay busy; the
# other waiting ones come once those are under way.
LONG_FIRST = (
    "tests/service/test_worker_broker_outage.py::test_the_worker_waits_out_a_broker_restart_and_an_idle_one_exits_5",
    "tests/service/test_kafka_security.py::test_misconfigurations_stop_with_one_line_and_lose_nothing_then_the_worker_matches_scan",
    "tests/passage/test_forward.py::test_gather_equals_unpacking_every_record",
    "tests/passage/test_passage_align.py::test_scan_tasks_equal_pairwise_alignment",
    "tests/runtime/test_kernel_cache.py::test_kernels_cached_by_two_processes_never_call_each_other_s_code",
    "tests/runtime/test_lifecycle.py::test_matches_after_removals_equal_a_fresh_store_of_the_pages_alive",
    "tests/near/test_psm.py::test_psm_unlimited_budget_equals_brute_force",
    "tests/near/test_psm.py::test_psm_is_subset_of_brute_force",
    "tests/runtime/test_lifecycle.py::test_stop_lists_do_not_depend_on_the_list_cache",
    # -m testdata: the three longest each begin a worker's pair, a short one (a few s)
    # after it, which waits for it. The partitioned pipeline's corpora oracle and the list
    # stage's were the second worker's pair, one after the other (~240 + ~105 s of the
    # half's 6:13 in CI at 7fade33). The stages' corpora oracles are one test now (one
    # engine run for the three)
    "tests/stages/test_partitioned.py::test_the_stages_find_what_the_engine_finds_on_corpora",
    "tests/near/test_simhash.py::test_light_edits_stay_close_unrelated_documents_do_not",
    # every stage role twice, a SIGKILL of each (1-2 min, 4 at load 22)
    "tests/service/test_stage_chain_kafka.py::test_every_role_twice_publishes_scan_s_matches_across_a_sigkill_of_each",
    "tests/service/test_stage_chain_kafka.py::test_with_passages_every_role_and_align_twice_publish_scan_s_matches_across_kills",
    "tests/near/test_cws.py::test_real_text_estimates_with_tf_idf_weights",
    "tests/test_bench_corpus.py::test_corpus_gives_every_page_it_has_and_refuses_one_more",
    "tests/service/test_worker_store_failures.py::test_disk_full_stops_the_worker_without_committing_and_loses_nothing",
    "tests/service/test_worker_kafka.py::test_a_group_without_offsets_resumes_where_the_store_says_matches_were_published",
)
_RANK = {nodeid: rank for rank, nodeid in enumerate(LONG_FIRST)}


def _skipped_here(item: pytest.Item) -> bool:
    """Skipped by a mark whose condition is known now (a case that is opt-in)."""
    return any(m.name == "skip" or (m.name == "skipif" and m.args and m.args[0] is True)
               for m in item.iter_markers())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The known long tests first (LONG_FIRST), then the slow ones, then the Kafka ones (a
    # broker outage waits out a minute): collected last, xdist handed them out near the end
    # and the suite waited for them alone, while short tests fill the tail. Tests skipped
    # by a mark last: in the list, one would take a place of LONG_FIRST's pairs. (Every
    # worker sorts alike: xdist needs one order.)
    if os.environ.get("DUPALIGN_CONTAINER_TESTS") != "1":
        skip = pytest.mark.skip(reason="container build and run take minutes: set DUPALIGN_"
                                       "CONTAINER_TESTS=1 (needs podman, see deploy/README.md)")
        for item in items:
            if "container" in item.keywords:
                item.add_marker(skip)
    items.sort(key=lambda item: (_skipped_here(item),
                                 _RANK.get(item.nodeid.split("[")[0], len(_RANK)),
                                 item.get_closest_marker("slow") is None,
                                 item.get_closest_marker("kafka") is None))
