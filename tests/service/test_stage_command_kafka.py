"""``dupalign stage`` as a user runs it (README, "Running on Kafka"): the demo corpus produced with
``dupalign produce``, one process of every role (``dupalign stage all``), a second one joining
mid-stream (each role's partitions then spread over both), the topics made by the roles
themselves with the default settings (``kafka.create_topics``, ``kafka.shape``). The matches
on the output topic are ``dupalign scan``'s over the same inputs with the same config; the
processes' ``/metrics`` show every stage partition held and caught up (the series of
deploy/grafana/dashboards/dupalign-stages.json). A process started with another shape stops
at once, naming ``kafka.shape``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from prometheus_client.parser import text_string_to_metric_families

from dupalign.service.config import load_config
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import record_ordinal
from dupalign.stages.partitioned import Shape
from dupalign.wire import messages
from tests.role_processes import REPO, check_alive, read_topic, stop_all

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

DEMO = REPO / "demo"
FIRST = [DEMO / "llvm-docs"]  # produced to the first process alone
THEN = [DEMO / "rfc", DEMO / "web" / "creativecommons.org.warc.gz"]  # after the second joins
Procs = list[tuple[subprocess.Popen[bytes], Path]]


def dupalign(*args: str | Path) -> list[str]:
    """The ``dupalign`` command (its console script's module), with this checkout's code."""
    return [sys.executable, "-m", "dupalign.service.cli", *map(str, args)]


def write_config(tmp: Path, bootstrap: str) -> Path:
    """Defaults but for the broker, topics and group of this test (the broker is shared)
    and quick rebalances."""
    tag = uuid.uuid4().hex[:8]
    path = tmp / "dupalign.toml"
    path.write_text(f"""
[kafka]
bootstrap_servers = "{bootstrap}"
input_topic = "pages-{tag}"
output_topic = "matches-{tag}"
dlq_topic = "dlq-{tag}"
group_id = "g-{tag}"
session_timeout_ms = 6000
heartbeat_interval_ms = 500
transaction_timeout_ms = 15000
[worker]
log_format = "text"
""", "utf-8")
    return path


def start(procs: Procs, tmp: Path, name: str, *args: str | Path) -> subprocess.Popen[bytes]:
    log = tmp / f"{name}.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(dupalign(*args), cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    procs.append((proc, log))
    return proc


def logs(procs: Procs) -> str:
    return "\n".join(f"== {log.name}\n{log.read_text()[-3000:]}" for _, log in procs)


def by_page(matches: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The matches by page, in the order found, without the time they were found."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m in matches:
        m = {k: v for k, v in m.items() if k not in ("detected_at", "v")}
        out.setdefault(m["doc_id"], []).append(m)
    return out


async def taken(procs: Procs, shape: Shape, timeout: float) -> None:
    """Until every partition of every stage has been taken by a process (its log says so)."""
    want = {"directory": shape.directory, "exact": shape.exact, "router": shape.router,
            "near": shape.near, "lists": shape.lists, "combine": shape.combine,
            "align": shape.align}
    deadline = time.monotonic() + timeout
    while True:
        check_alive(procs)
        lines = [line for _, log in procs for line in log.read_text().splitlines()
                 if " taken: " in line]
        held = {(s, line.split(" partition ")[1].split(" ")[0]) for line in lines
                for s in want if f"{s} partition " in line}
        if all(len({p for t, p in held if t == s}) == n for s, n in want.items()):
            return
        assert time.monotonic() < deadline, logs(procs)
        await asyncio.sleep(0.5)


def big_page(tmp: Path) -> Path:
    """A directory with a page of about 3 MB (the default limits: 1 MB records, 8 MB pages):
    an RFC of the demo, then distinct words. Its sketch, near state, list windows and
    partials, forward record and changelog values are all over 1 MB: they go in parts."""
    rfc = (DEMO / "rfc" / "rfc5321.txt").read_text("utf-8")
    words = " ".join(f"w{i:07d}" for i in range(320_000))
    (tmp / "big").mkdir()
    (tmp / "big" / "big.txt").write_text(rfc + "\n" + words, "utf-8")
    return tmp / "big"


async def test_dupalign_stage_grows_from_one_process_to_two_and_publishes_scan_s_matches(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    config_path = write_config(tmp_path, kafka_bootstrap)
    then = [*THEN, big_page(tmp_path)]
    config = load_config(config_path, env={})
    kc, shape = config.kafka, Shape.parse(config.kafka.shape)
    subprocess.run(dupalign("scan", *FIRST, *then, "--store", tmp_path / "scan", "--config",
                            config_path, "--out", tmp_path / "scan.jsonl", "--quiet"),
                   cwd=REPO, check=True)
    want = by_page([json.loads(line) for line in
                    (tmp_path / "scan.jsonl").read_text("utf-8").splitlines()])
    assert {m["kind"] for ms in want.values() for m in ms} >= {"exact", "near", "passage"}
    procs: Procs = []
    try:
        ports = [free_port(), free_port()]
        start(procs, tmp_path, "first", "stage", "all", "--config", config_path,
              "--store", tmp_path / "first", "--metrics-port", str(ports[0]))
        await taken(procs, shape, 240)
        subprocess.run(dupalign("produce", *FIRST, "--config", config_path, "--quiet"),
                       cwd=REPO, check=True)
        start(procs, tmp_path, "second", "stage", "all", "--config", config_path,
              "--store", tmp_path / "second", "--metrics-port", str(ports[1]))
        subprocess.run(dupalign("produce", *then, "--config", config_path, "--quiet"),
                       cwd=REPO, check=True)
        # another shape: the process stops at its topics, naming the setting
        wrong = start(procs, tmp_path, "wrong", "stage", "directory", "--config", config_path,
                      "--store", tmp_path / "wrong", "--shape", "3,2,2,2,2,2,2",
                      "--metrics-port", "0")
        assert wrong.wait(120) == 1
        said = (tmp_path / "wrong.log").read_text()
        assert "has 2 partitions, not the 3 that kafka.shape = 3,2,2,2,2,2,2" in said, said
        procs.remove((wrong, tmp_path / "wrong.log"))
        deadline, count = time.monotonic() + 300, sum(map(len, want.values()))
        while len(out := await read_topic(kafka_bootstrap, kc.output_topic, 1)) < count:
            check_alive(procs)
            assert time.monotonic() < deadline, f"{len(out)} of {count} matches\n{logs(procs)}"
            await asyncio.sleep(1)
        await asyncio.sleep(3)  # (any match published twice would come by now)
        out = await read_topic(kafka_bootstrap, kc.output_topic, 1)
        # both processes hold partitions of every stage role
        for _, log in procs:
            assert " taken: " in log.read_text(), log.name
        compaction = await cleanup_policies(kc, StageTopics(kc, shape))
        await caught_up(procs, ports, StageTopics(kc, shape), 60)
        n_dlq = await partition_count(kafka_bootstrap, kc.dlq_topic)  # (0: never made)
        dead = await read_topic(kafka_bootstrap, kc.dlq_topic, n_dlq) if n_dlq else []
    finally:
        stop_all(procs)
    ordered = sorted(out, key=record_ordinal)
    got = by_page([messages.decode_match(r.value) for r in ordered])
    assert got == want
    assert "big.txt" in str(got.keys()), sorted(got)  # (the big page has matches)
    assert dead == []
    assert set(compaction.values()) == {"compact"}, compaction


async def cleanup_policies(kc: Any, topics: StageTopics) -> dict[str, str]:
    """The ``cleanup.policy`` of every stage's changelog, as the roles made them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kc.bootstrap_servers)
    await admin.start()
    try:
        names = [topics.changelog(s) for s in ("directory", "exact", "router", "near",
                                                 "lists", "combine", "align")]
        resources = [ConfigResource(ConfigResourceType.TOPIC, t,
                                    configs={"cleanup.policy": None}) for t in names]
        out = {}
        for response in await admin.describe_configs(resources):
            for _, _, _, topic, entries in response.resources:
                out[topic] = {e[0]: e[1] for e in entries}["cleanup.policy"]
        return out
    finally:
        await admin.close()


async def partition_count(bootstrap: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        await consumer.topics()  # (fetches the cluster's metadata)
        return len(consumer.partitions_for_topic(topic) or ())
    finally:
        await consumer.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, dict[tuple[str, str], float]]:
    """The stage series of a process's /metrics, by name, then (role, partition)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple[str, str], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(("dupalign_stage_", "dupalign_role_assigned")):
                key = (sample.labels["role"], sample.labels.get("partition", ""))
                out.setdefault(sample.name, {})[key] = sample.value
    return out


async def caught_up(procs: Procs, ports: list[int], topics: StageTopics, timeout: float
                    ) -> None:
    """Until the two processes' /metrics show every partition of every stage role held by
    one of them, each having applied every ordinal it has read of the sequence, the same
    last one everywhere."""
    roles = {"directory": "directory", "exact": "exact", "learner": "learner",
             "router": "router", "near": "near", "lists": "lists", "combine": "combine",
             "stage-align": "align"}
    deadline = time.monotonic() + timeout
    while True:
        check_alive(procs)
        seen = [scrape(port) for port in ports]
        held = {r: sum(s["dupalign_role_assigned_partitions"].get((r, ""), 0) for s in seen)
                for r in roles}
        applied = {k: v for s in seen for k, v in s["dupalign_stage_ordinal_applied"].items()}
        sequenced = {k: v for s in seen
                     for k, v in s["dupalign_stage_ordinal_sequenced"].items()}
        want = {(r, str(p)) for r, stage in roles.items()
                for p in range(topics.partitions(stage))}
        if (held == {r: topics.partitions(s) for r, s in roles.items()}
                and set(applied) == want and applied == sequenced
                and len(set(applied.values())) == 1 and min(applied.values()) > 0):
            return
        assert time.monotonic() < deadline, (
            f"held {held}; partitions without series {sorted(want - set(applied))}; "
            f"applied {sorted(applied.items())}; sequenced {sorted(sequenced.items())}")
        await asyncio.sleep(1)
