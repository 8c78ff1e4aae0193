"""The roles of ``dupalign stage`` against a broker that requires TLS and SASL (SCRAM-SHA-512)
and enforces ACLs (``secure_kafka``: deploy/kafka/broker.sh with BROKER_SASL_SSL=1): every
stage role in a process of its own, each a user holding only what ``dupalign acls --stage
ROLE`` prints for it, and ``dupalign produce`` as a user of its own, give ``scan``'s matches
over the demo corpus; a process started as another role's user stops at start, naming what it
may not see, with nothing lost; and no role can read or write a topic that is not its own.
The topics are made by the admin side (the plaintext listener's super user)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dupalign.service.changelog import ensure_changelog
from dupalign.service.config import load_config
from dupalign.service.kafka_args import STAGE_ROLES
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import ensure_topics, record_ordinal
from dupalign.stages.partitioned import Shape
from dupalign.wire import messages
from tests.conftest import SecureBroker
from tests.role_processes import REPO, check_alive, read_topic, stop_all
from tests.service.test_kafka_security import DEMO_INPUTS, assert_no_secret, grant, refused
from tests.service.test_stage_command_kafka import by_page
from tests.service.test_stage_command_kafka import write_config as stage_config

pytestmark = pytest.mark.kafka

# each stage role's SCRAM user (tests/conftest.py SECURE_USERS), as its Kubernetes Secret
# names it (deploy/k8s-stages: dupalign-kafka-stage-sketch, -stage-align)
USERS = {role: {"sketch": "stage-sketch", "align": "stage-align"}.get(role, role)
         for role in STAGE_ROLES}
Procs = list[tuple[subprocess.Popen[bytes], Path]]


def write_config(tmp: Path, bootstrap: str) -> Path:
    """tests/service/test_stage_command_kafka.py's (topics and group of this test, quick
    rebalances), with one partition of every stage and topic (the fewest turns on a loaded
    machine), topics made by the admin side (no role may create one) and no HTTP server
    (nine processes on one machine). The credentials: each process's environment."""
    path = stage_config(tmp, bootstrap)
    path.write_text(path.read_text("utf-8").replace("[worker]", """\
shape = "1,1,1,1,1,1,1"
topic_partitions = 1
create_topics = false
[metrics]
enabled = false
[worker]"""), "utf-8")
    return path


async def make_topics(broker: SecureBroker, config: Path) -> StageTopics:
    """Every topic of the stage roles, as an admin makes them (the changelogs and the idf
    topic compacted)."""
    kc = load_config(config, env={"DUPALIGN_KAFKA_BOOTSTRAP_SERVERS": broker.plaintext,
                                  "DUPALIGN_KAFKA_CREATE_TOPICS": "true"}).kafka
    topics = StageTopics(kc, Shape.parse(kc.shape))
    await ensure_topics(kc, topics.wanted(), **topics.options())
    await ensure_changelog(kc, topics.idf, 1)
    for stage in STAGE_ROLES[1:]:
        await ensure_changelog(kc, topics.changelog(stage), topics.partitions(stage))
    return topics


def dupalign(procs: Procs, tmp: Path, name: str, env: dict[str, str], *args: str | Path
             ) -> subprocess.Popen[bytes]:
    """``dupalign ARGS`` with ``env`` (a user's [kafka] settings), logging to ``name``.log."""
    log = tmp / f"{name}.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "dupalign.service.cli", *map(str, args)],
                                cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                stdout=fh, stderr=subprocess.STDOUT)
    procs.append((proc, log))
    return proc


async def started(procs: Procs, timeout: float) -> None:
    """Until the sketch role consumes and every stage partition is taken (the logs say so)."""
    deadline = time.monotonic() + timeout
    while True:
        check_alive(procs)
        text = "\n".join(log.read_text() for _, log in procs)
        if "stage-sketch role started (group " in text and all(
                f"{stage} partition 0 taken: " in text for stage in STAGE_ROLES[1:]):
            return
        assert time.monotonic() < deadline, "\n".join(
            f"== {log.name}\n{log.read_text()[-3000:]}" for _, log in procs)
        await asyncio.sleep(0.5)


async def test_each_stage_role_with_only_its_acls_publishes_the_matches_of_scan(
        secure_kafka: SecureBroker, tmp_path: Path) -> None:
    broker = secure_kafka
    config = write_config(tmp_path, broker.plaintext)
    procs: Procs = []
    # the oracle meanwhile (one process: the machine is shared)
    oracle = dupalign(procs, tmp_path, "scan", {}, "scan",
                      *(REPO / "demo" / d for d in DEMO_INPUTS), "--store", tmp_path / "scan",
                      "--config", config, "--out", tmp_path / "scan.jsonl", "--quiet",
                      "--jobs", "1")
    try:
        topics = await make_topics(broker, config)
        kc = topics.kc
        grant(broker, config, *((f"stage:{role}", user, ()) for role, user in USERS.items()),
              ("produce", "produce", ()))
        # a role under another role's user: it may not see the lists changelog, so it stops
        # at start (exit 1), naming it; nothing consumed (the run below gives every match)
        wrong = dupalign([], tmp_path, "wrong", broker.kafka_env("near"), "stage", "lists",
                         "--config", config, "--store", tmp_path / "wrong")
        for role, user in USERS.items():
            dupalign(procs, tmp_path, role, broker.kafka_env(user), "stage", role, "--config",
                     config, *(("--store", tmp_path / role) if role != "sketch" else ()))
        assert wrong.wait(180) == 1
        said = (tmp_path / "wrong.log").read_text()
        assert (f"topics ['{topics.changelog('lists')}'] do not exist" in said
                and "no ACL lets near describe them" in said), said[-3000:]
        await started(procs, 240)
        produce = dupalign([], tmp_path, "produce", broker.kafka_env("produce"), "produce",
                           *(REPO / "demo" / d for d in DEMO_INPUTS), "--config", config,
                           "--quiet")
        assert produce.wait(180) == 0, (tmp_path / "produce.log").read_text()
        assert oracle.wait(300) == 0, (tmp_path / "scan.log").read_text()
        want = by_page([json.loads(line) for line in
                        (tmp_path / "scan.jsonl").read_text("utf-8").splitlines()])
        assert {m["kind"] for ms in want.values() for m in ms} >= {"exact", "near", "passage"}
        count, deadline = sum(map(len, want.values())), time.monotonic() + 300
        while len(out := await read_topic(broker.plaintext, kc.output_topic, 1)) < count:
            check_alive(procs)
            assert time.monotonic() < deadline, f"{len(out)} of {count} matches"
            await asyncio.sleep(1)
        await asyncio.sleep(3)  # (any match published twice would come by now)
        out = await read_topic(broker.plaintext, kc.output_topic, 1)
    finally:
        stop_all(procs)
    got = by_page([messages.decode_match(r.value) for r in sorted(out, key=record_ordinal)])
    assert got == want
    assert await read_topic(broker.plaintext, kc.dlq_topic, 1) == []
    # least privilege: no role reads or writes another's topics (its inputs, its changelog)
    denied = "TopicAuthorizationFailedError"
    assert await refused(broker, USERS["sketch"], write=kc.output_topic) == denied
    assert await refused(broker, "directory", write=topics.exact) == denied
    assert await refused(broker, "exact", write=topics.changelog("directory")) == denied
    assert await refused(broker, "near", read=topics.entries) == denied
    assert await refused(broker, "combine", write=topics.decisions) == denied
    assert await refused(broker, "combine", read=kc.input_topic) == denied
    assert await refused(broker, USERS["align"], read=topics.near_ops) == denied
    assert await refused(broker, "produce", read=kc.input_topic) == denied
    assert_no_secret(broker, *(log.read_text() for _, log in procs))
