"""The broker dies mid-stream (SIGKILL) and comes back 25 s later, under a topology of one
process per role (issue 42, acceptance (b)): every role waits for it (``kafka.max_outage_s``)
without exiting, says so once, and the published matches are exactly ``scan``'s, none twice;
an idle role with a shorter ``kafka.max_outage_s`` gives up meanwhile, with exit code 5.
The test runs a broker of its own, restarted on the ports and data directory it recorded
(tests/service/test_worker_broker_outage.py), not the session's."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dupalign.wire import messages
from tests.service.test_worker_broker_outage import (
    IDLE_MAX_OUTAGE_S,
    OUTAGE_S,
    QUICKER,
    broker,
    corpus,
    free_port,
    outage_seconds,
)
from tests.service.test_worker_kafka import match_key
from tests.topology_harness import Topology, progressed, wait_log

pytestmark = [pytest.mark.kafka]

ROLES = ("sketch", "align", "index")


async def test_every_role_waits_out_a_broker_restart_and_an_idle_one_exits_5_after_max_outage_s(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """One broker outage, two topologies. The busy one's roles wait it out and publish
    exactly ``scan``'s matches, none twice. An idle sketch role of the other (assigned, no
    pages; ``max_outage_s`` = IDLE_MAX_OUTAGE_S) notices the outage by its consumer losing
    the group coordinator, says so once, and gives up with the Kafka exit code once
    ``max_outage_s`` has passed. (One test: each would start, kill and restart a broker of
    its own for the same outage.)"""
    del kafka_bootstrap  # (started first: this broker's Java and jars are there)
    home = tmp_path / "broker"
    bootstrap = broker("start", home)
    pages = corpus(copies=6)
    port = free_port()
    topo = await Topology(bootstrap, tmp_path).create()
    topo.config_path.write_text(topo.config_path.read_text().replace(
        "[worker]", f"{QUICKER}[worker]"))
    (tmp_path / "idle").mkdir()
    other = await Topology(bootstrap, tmp_path / "idle").create()
    other.config_path.write_text(other.config_path.read_text().replace(
        "[worker]", f"max_outage_s = {IDLE_MAX_OUTAGE_S}\n[worker]"))
    try:
        idle, idle_log = other.start("sketch")
        for role in ROLES:
            if role == "index":
                _, index_log = topo.start(role, tmp_path / "index", metrics_port=port)
            else:
                topo.start(role)
        await wait_log(index_log, "index shard owned", 120)
        await wait_log(idle_log, "sketch role assigned", 120)
        await topo.send(pages)
        at = await progressed(topo, 10)
        sequence = await topo.read("sequence")
        # (ordinals are offsets of ``sequence``, where transaction markers take offsets too)
        assert len(sequence) < len(pages) or at <= sequence[-1].offset, \
            "the stream ended before the broker went away"
        sizes = [log.stat().st_size for _, log in topo.procs]
        pid = int((home / "broker.pid").read_text())
        subprocess.run(["kill", "-KILL", str(pid)], check=True)  # transactions in flight
        killed = time.monotonic()
        idle_took = None  # the broker comes back once the idle role exited
        while time.monotonic() < killed + OUTAGE_S or idle_took is None:
            topo.check_alive()
            for proc, log in topo.procs:
                assert proc.poll() is None, log.read_text()[-4000:]
            if idle_took is None and idle.poll() is not None:
                idle_took = time.monotonic() - killed
            assert time.monotonic() < killed + OUTAGE_S + 60, "the idle role did not exit"
            await asyncio.sleep(0.5)
        assert await outage_seconds(port) > 0  # the index process found out, and says so
        assert broker("start", home) == bootstrap  # same ports, same data directory

        published = await topo.published(len(pages), timeout=240)
        for proc, log in topo.procs:
            assert proc.poll() is None, log.read_text()[-4000:]
        assert await outage_seconds(port) == 0
        expected = await topo.scan_in_sequence_order(tmp_path / "oracle")
        for proc, _ in topo.procs:
            proc.send_signal(signal.SIGTERM)
        for proc, log in topo.procs:
            assert proc.wait(60) == 0, log.read_text()[-4000:]
    finally:
        other.stop_all()
        topo.stop_all()
        broker("stop", home)
    said = idle_log.read_text("utf-8", "replace")
    assert idle.returncode == 5, said[-4000:]
    assert idle_took is not None and idle_took >= IDLE_MAX_OUTAGE_S, said[-4000:]
    lines = said.splitlines()
    assert len([line for line in lines if "waiting for Kafka" in line]) == 1, said[-4000:]
    stopped = [line for line in lines if "sketch role stopped" in line]
    assert len(stopped) == 1 and "kafka.max_outage_s" in stopped[0], said[-4000:]
    for (_, log), size in zip(topo.procs, sizes, strict=True):
        said = log.read_bytes()[size:].decode("utf-8", "replace").splitlines()
        waiting = [line for line in said if "waiting for Kafka" in line]
        assert len(waiting) == 1 and " WARNING " in waiting[0], (log.name, said[:60])
        back = [line for line in said if "Kafka is back" in line]
        assert len(back) == 1 and " INFO " in back[0], (log.name, said[:60])
        assert not [line for line in said if " asyncio: " in line], (log.name, said)
    got = collections.Counter(match_key(messages.decode_match(r.value)) for r in published)
    twice = [k for k, n in got.items() if n > expected[k]]
    assert not twice, f"published twice: {twice[:5]}"
    assert got == expected
