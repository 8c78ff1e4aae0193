"""dupalign against a broker that requires TLS and SASL (SCRAM-SHA-512) and enforces ACLs
(``secure_kafka``: deploy/kafka/broker.sh with BROKER_SASL_SSL=1), each process of its own:
the single worker gives ``scan``'s matches over the SASL_SSL listener (the stage roles':
test_stage_security_kafka.py); a wrong password, an untrusted certificate and a missing ACL
the process with one line and the Kafka exit code, nothing committed and nothing lost (a
run with the right settings afterwards gives every match); no password in a log line,
/metrics or ``dupalign stats --json``. The admin side (topics, readers) is the plaintext
listener's super user."""

from __future__ import annotations

import collections
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from dupalign.service.config import load_config
from dupalign.service.exits import Exit
from dupalign.wire import messages
from tests.conftest import BROKER_SH, SecureBroker
from tests.corpora import demo_pages
from tests.role_processes import REPO
from tests.service.test_ops_prometheus import free_port, http_get
from tests.service.test_worker_kafka import (
    Topics,
    embedded_matches,
    match_key,
    stop_when_committed,
)

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

    # nothing lost: the right settings afterwards give every match of scan, as a user with
    # only the single worker's ACLs
    grant(broker, config, ("worker", "worker", ()))
    log = tmp_path / "worker.log"
    await single_worker_until_done(broker, topics, config, store, "worker", len(pages), log)
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


# the topics exist (made by the admin side): no role may create one
NO_CREATE = {"DUPALIGN_KAFKA_CREATE_TOPICS": "false"}


def grant(broker: SecureBroker, config: Path, *grants: tuple[str, str, tuple[str, ...]]
          ) -> None:
    """Apply what ``dupalign acls --role ROLE --principal User:USER EXTRA...`` prints, for
    each (ROLE, USER, EXTRA) of ``grants``, verbatim, with kafka-acls.sh (broker.sh
    kafka-acls, all the commands in one JVM), on the admin side. ROLE ``stage:NAME``: the
    stage role NAME's (``--stage NAME``). The printouts are made side by side."""
    commands: list[str] = []
    printing = []
    for role, user, extra in grants:
        which = (["--stage", role.removeprefix("stage:")] if role.startswith("stage:") else
                 ["--role", role])
        printing.append(subprocess.Popen(
            [sys.executable, "-m", "dupalign.service.cli", "acls", *which,
             "--principal", f"User:{user}", "--config", str(config), "--bootstrap",
             broker.plaintext, *extra],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **NO_CREATE}))
    for proc in printing:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and out.strip(), err
        for line in out.splitlines():
            tool, *args = shlex.split(line)
            assert tool == "kafka-acls.sh", line
            commands += [*([";"] if commands else []), *args]
    subprocess.run(["bash", str(BROKER_SH), "kafka-acls", str(broker.dir), *commands],
                   check=True, capture_output=True, timeout=120)


async def refused(broker: SecureBroker, user: str, write: str | None = None,
                  read: str | None = None) -> str:
    """The authorization error ``user`` gets writing to ``write`` or reading ``read``."""
    kc = load_config(env=broker.kafka_env(user)).kafka
    client = (AIOKafkaProducer(**kc.client_kwargs()) if write is not None else
              AIOKafkaConsumer(**kc.client_kwargs(), group_id=None))
    try:
        await client.start()
        if isinstance(client, AIOKafkaProducer):
            await client.send_and_wait(write, b"not yours")
        else:
            client.assign([TopicPartition(str(read), 0)])
            await client.seek_to_beginning()
            await client.getmany(timeout_ms=5000)
    except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as exc:
        return type(exc).__name__
    finally:
        await client.stop()
    raise AssertionError(f"{user} was allowed to {'write' if write else 'read'} "
                         f"{write or read}")


DEMO_INPUTS = ("llvm-docs", "rfc", "web/creativecommons.org.warc.gz")  # demo_pages' order
