"""dupalign against a broker that requires TLS and SASL (SCRAM-SHA-512) and enforces ACLs
(``secure_kafka``: deploy/kafka/broker.sh with BROKER_SASL_SSL=1), each process of its own:
the single worker and a topology of one process per role give ``scan``'s matches over the
SASL_SSL listener; a wrong password, an untrusted certificate and a missing ACL each stop
the process with one line and the Kafka exit code, nothing committed and nothing lost (a
run with the right settings afterwards gives every match); no password in a log line,
/metrics or ``dupalign stats --json``. The admin side (topics, readers) is the plaintext
listener's super user."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dupalign.service.exits import Exit
from dupalign.wire import messages
from tests.conftest import SecureBroker
from tests.corpora import demo_pages
from tests.service.test_ops_prometheus import free_port, http_get
from tests.service.test_worker_kafka import (
    Topics,
    embedded_matches,
    match_key,
    stop_when_committed,
)
from tests.topology_harness import REPO, Topology

pytestmark = pytest.mark.kafka


def dupalign(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "dupalign.service.cli", *args], cwd=REPO,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                stdout=fh, stderr=subprocess.STDOUT)


def assert_no_secret(broker: SecureBroker, *texts: str) -> None:
    for text in texts:
        for user, password in broker.passwords.items():
            assert password not in text, f"{user}'s password is in:\n{text[-3000:]}"


async def single_worker_until_done(broker: SecureBroker, topics: Topics, config: Path,
                                   store: Path, user: str, n_pages: int, log: Path) -> None:
    """The single worker as ``user`` over SASL_SSL until it committed ``n_pages``; its
    /metrics checked for secrets; then SIGTERM (exit 0)."""
    port = free_port()
    proc = dupalign("worker", "--store", str(store), "--config", str(config),
                    "--metrics-port", str(port), env=broker.kafka_env(user), log=log)

    def no_secret_in_metrics() -> None:
        status, metrics = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "dupalign_pages_total" in metrics
        assert_no_secret(broker, metrics)
    await stop_when_committed(proc, topics, log, n_pages, "every page committed",
                              timeout=600, before_stop=no_secret_in_metrics)  # (a first compile)


def misconfigured(broker: SecureBroker) -> dict[str, dict[str, str]]:
    """The environment of each misconfiguration, and (below) what its line must say."""
    return {
        "wrong password": broker.kafka_env("admin", password="not-the-password"),
        # no kafka.ssl_cafile: the system's CAs, none of which signed the broker's certificate
        "untrusted certificate": {**broker.kafka_env("admin"), "DUPALIGN_KAFKA_SSL_CAFILE": ""},
        "missing ACL": broker.kafka_env("nobody"),
    }


SAYS = {
    "wrong password": "refused the SCRAM-SHA-512 credentials of user 'admin'",
    "untrusted certificate": "is not trusted (self-signed certificate in certificate chain)",
    "missing ACL": "to user 'nobody': ",
}


async def test_misconfigurations_stop_with_one_line_and_lose_nothing_then_the_worker_matches_scan(
        secure_kafka: SecureBroker, tmp_path: Path) -> None:
    broker = secure_kafka
    pages = demo_pages()
    topics = await Topics(broker.plaintext, partitions=1).create()
    await topics.send(pages)
    _, config = topics.config(tmp_path)
    store = tmp_path / "store"
    for name, env in misconfigured(broker).items():
        for command in (["worker", "--store", str(store), "--config", str(config)],
                        ["produce", str(REPO / "demo" / "rfc"), "--config", str(config),
                         "--topic", topics.pages]):
            log = tmp_path / f"{command[0]}-{name.replace(' ', '-')}.log"
            proc = dupalign(*command, env=env, log=log)
            assert proc.wait(180) == Exit.KAFKA, log.read_text()[-4000:]
            text = log.read_text()
            errors = [line for line in text.splitlines() if " ERROR " in line or (
                line.startswith("dupalign ") and "compiling the engine's kernels" not in line)]
            assert len(errors) == 1, f"{name}, {command[0]}:\n{text}"
            assert SAYS[name] in errors[0], errors[0]
            assert "Traceback" not in text
            assert_no_secret(broker, text)
        assert await topics.committed_total() == 0, name  # nothing committed
        assert await topics.read(topics.matches) == []
        assert len(await topics.read(topics.pages)) == len(pages), name  # nothing produced

    # nothing lost: the right settings afterwards give every match of scan
    log = tmp_path / "worker.log"
    await single_worker_until_done(broker, topics, config, store, "admin", len(pages), log)
    published = [match_key(messages.decode_match(r.value))
                 for r in await topics.read(topics.matches)]
    expected = embedded_matches(pages, tmp_path / "embedded")
    assert {k[1] for k in expected} == {"exact", "near", "passage"}
    assert collections.Counter(published) == collections.Counter(expected)
    stats = subprocess.run([sys.executable, "-m", "dupalign.service.cli", "stats", "--store",
                            str(store), "--json"], cwd=REPO, capture_output=True, text=True,
                           check=True, env={**os.environ, **broker.kafka_env("admin")})
    assert json.loads(stats.stdout)["pages"] == len(pages)
    assert_no_secret(broker, log.read_text(), stats.stdout, stats.stderr)


async def test_a_topology_of_one_process_per_role_over_sasl_ssl_gives_the_matches_of_scan(
        secure_kafka: SecureBroker, tmp_path: Path) -> None:
    broker = secure_kafka
    topo = await Topology(broker.plaintext, tmp_path).create()
    try:
        env = broker.kafka_env("admin")
        topo.start("sketch", env=env)
        topo.start("index", tmp_path / "index", env=env)
        topo.start("align", env=env)
        pages = demo_pages()
        await topo.send(pages)
        published = await topo.published(len(pages), timeout=600)
        expected = await topo.scan_in_sequence_order(tmp_path / "oracle")
        got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
        assert {k[1] for k in expected} == {"exact", "near", "passage"}
        assert got == expected
    finally:
        topo.stop_all()
    assert_no_secret(broker, *(log.read_text() for _, log in topo.procs))
