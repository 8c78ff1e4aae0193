"""The broker dies mid-stream (SIGKILL) and comes back 25 s later, under a single worker and
under a topology of one process per role (issue 42, acceptance (b)): each process waits for
it (``kafka.max_outage_s``) without exiting, says so once, and loses and repeats nothing;
an idle worker and an idle role with a shorter ``kafka.max_outage_s`` give up meanwhile,
with exit code 5. The test runs a broker of its own (deploy/kafka/broker.sh, restarted on
the ports and data directory it recorded, so clients find it again), not the session's."""

from __future__ import annotations

import asyncio
import collections
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from dupalign.page import Page
from dupalign.wire import messages
from tests.conftest import BROKER_SH
from tests.corpora import demo_pages
from tests.service.test_worker_kafka import (
    Topics,
    embedded_matches,
    match_key,
    start_worker_process,
    wait_for,
)
from tests.topology_harness import Topology, progressed, wait_log

pytestmark = [pytest.mark.kafka]

# The product's timings, shortened for the test: a Kafka step is cut after 15 s (40 s by
# default) and retries wait at most 1 s (10 s), so that a shorter outage still outlasts the
# cut of the transactions in flight at the kill (15 s, then up to 8 s to drop their
# producer): each is committed again by a new producer, as after a longer one.
QUICKER = "request_timeout_ms = 15000\noutage_backoff_max_s = 1.0\n"
OUTAGE_S = 25  # > 15 + 8 s; the broker's restart (~10 s) lengthens the outage further
# the limit of an idle process, which gives up during the outage (its warning, then this,
# come well within OUTAGE_S; the broker is restarted only once it exited)
IDLE_MAX_OUTAGE_S = 10.0


def broker(command: str, directory: Path) -> str:
    proc = subprocess.run(["bash", str(BROKER_SH), command, str(directory)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def outage_seconds(port: int) -> float:
    async with aiohttp.ClientSession() as http, http.get(
            f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found = re.search(r"^dupalign_kafka_outage_seconds (\S+)$", text, re.M)
    assert found, text[-2000:]
    return float(found.group(1))


def clean_up(proc: subprocess.Popen[bytes] | None, home: Path | None) -> None:
    """The worker killed if it still runs, the broker stopped (``home``)."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(30)
    if home is not None:
        broker("stop", home)


def said_since(log: Path, size: int) -> list[str]:
    return log.read_bytes()[size:].decode("utf-8", "replace").splitlines()


def said_once(said: list[str], text: str, level: str) -> bool:
    lines = [line for line in said if text in line]
    return len(lines) == 1 and f" {level} " in lines[0]


def corpus(copies: int = 4) -> list[Page]:
    """The demo corpus ``copies`` times (then under other ids: exact copies of the first),
    so that the stream is still flowing when the broker goes away."""
    pages = demo_pages()
    return pages + [Page(id=f"{p.id}#{n}", body=p.body, content_type=p.content_type)
                    for n in range(1, copies) for p in pages]


async def test_the_worker_and_every_role_wait_out_a_broker_restart_and_idle_ones_exit_5(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """One broker outage, four loads on it. A busy single worker and a busy topology of one
    process per role (``max_outage_s`` far beyond the outage) wait it out, each process says
    so once, and they publish exactly ``scan``'s matches, none twice. An idle worker (every
    page committed) and the idle sketch role of another topology (assigned, no pages), with
    ``max_outage_s`` = IDLE_MAX_OUTAGE_S, try no send and no commit: they notice the outage
    by their consumer losing the group coordinator, say so once, show it in the gauge (the
    idle worker), and give up with the Kafka exit code once ``max_outage_s`` has passed.
    (One test: each load would start, kill and restart a broker of its own for the same
    outage.)"""
    # kafka_bootstrap: the session's broker is started first, so that this one's Java and
    # jars are known to be there (and a missing toolchain skips or fails the same way)
    del kafka_bootstrap
    home = tmp_path / "broker"
    bootstrap = broker("start", home)
    pages, idle_pages, topo_pages = corpus(), demo_pages()[:8], corpus(copies=6)
    log, idle_log = tmp_path / "worker.log", tmp_path / "idle.log"
    port, idle_port, index_port = free_port(), free_port(), free_port()
    for folder in ("topology", "idle-topology"):
        (tmp_path / folder).mkdir()
    proc: subprocess.Popen[bytes] | None = None
    idle: subprocess.Popen[bytes] | None = None
    topo = Topology(bootstrap, tmp_path / "topology")
    other = Topology(bootstrap, tmp_path / "idle-topology")
    try:
        await topo.create()
        await other.create()
        topics = await Topics(bootstrap, partitions=1).create()  # one order: scan's
        idle_topics = await Topics(bootstrap, partitions=1).create()
        await idle_topics.send(idle_pages)
        _, config_path = topics.config(tmp_path, batch_size=1)
        config_path.write_text(config_path.read_text().replace("port = 0", f"port = {port}")
                               .replace("[worker]", f"max_outage_s = 300.0\n{QUICKER}[worker]"))
        _, idle_config = idle_topics.config(tmp_path, batch_size=4)
        idle_config.write_text(idle_config.read_text().replace(
            "port = 0", f"port = {idle_port}").replace(
            "[worker]", f"max_outage_s = {IDLE_MAX_OUTAGE_S}\n[worker]"))
        topo.config_path.write_text(topo.config_path.read_text().replace(
            "[worker]", f"{QUICKER}[worker]"))
        other.config_path.write_text(other.config_path.read_text().replace(
            "[worker]", f"max_outage_s = {IDLE_MAX_OUTAGE_S}\n[worker]"))
        idle = start_worker_process(idle_config, tmp_path / "idle-store", idle_log)
        proc = start_worker_process(config_path, tmp_path / "store", log)
        idle_role, idle_role_log = other.start("sketch")
        for role in ("sketch", "align"):
            topo.start(role)
        _, index_log = topo.start("index", tmp_path / "index", metrics_port=index_port)
        await wait_log(index_log, "index shard owned", 120)
        await wait_log(idle_role_log, "sketch role assigned", 120)

        def check_alive(idle_too: bool = False) -> None:
            topo.check_alive()
            busy = [(proc, log), *topo.procs]
            for p, lg in busy + ([(idle, idle_log), (idle_role, idle_role_log)]
                                 if idle_too else []):
                assert p is not None and p.poll() is None, lg.read_text()[-4000:]

        async def idle_committed() -> bool:
            check_alive(idle_too=True)
            return await idle_topics.committed_total() == len(idle_pages)
        await wait_for(idle_committed, 180, "every idle page committed")
        # both streams at once, so that both still flow when the broker goes away
        await asyncio.gather(topics.send(pages), topo.send(topo_pages))

        async def some_progress() -> bool:
            check_alive(idle_too=True)
            return await topics.committed_total() >= 4
        await wait_for(some_progress, 180, "the worker's first commits")
        at = await progressed(topo, 10)
        check_alive(idle_too=True)
        before = await topics.committed_total()
        sequence = await topo.read("sequence")
        stopped_at, idle_at = log.stat().st_size, idle_log.stat().st_size
        sizes = [lg.stat().st_size for _, lg in topo.procs]
        pid = int((home / "broker.pid").read_text())
        subprocess.run(["kill", "-KILL", str(pid)], check=True)  # transactions in flight
        killed = time.monotonic()
        assert before < len(pages), "the worker's stream ended before the broker went away"
        # (ordinals are offsets of ``sequence``, where transaction markers take offsets too)
        assert len(sequence) < len(topo_pages) or at <= sequence[-1].offset, \
            "the topology's stream ended before the broker went away"

        async def idle_said_so() -> bool:
            assert idle is not None and idle.poll() is None, idle_log.read_text()[-4000:]
            check_alive()
            return b"waiting for Kafka" in idle_log.read_bytes()[idle_at:]
        await wait_for(idle_said_so, 60, "the idle worker's 'waiting for Kafka'")
        assert await outage_seconds(idle_port) > 0
        idle_took = idle_role_took = None  # the broker comes back once both idle ones exited
        while (time.monotonic() < killed + OUTAGE_S or idle_took is None
               or idle_role_took is None):
            check_alive()
            if idle_took is None and idle.poll() is not None:
                idle_took = time.monotonic() - killed
            if idle_role_took is None and idle_role.poll() is not None:
                idle_role_took = time.monotonic() - killed
            assert time.monotonic() < killed + OUTAGE_S + 60, "an idle process did not exit"
            await asyncio.sleep(0.5)
        # every busy process found out, and says so in the gauge
        assert await outage_seconds(port) > 0 and await outage_seconds(index_port) > 0
        assert broker("start", home) == bootstrap  # same ports, same data directory

        async def finished() -> bool:
            check_alive()
            return await topics.committed_total() == len(pages)
        await wait_for(finished, 300, "every offset committed after the broker came back")
        published = await topo.published(len(topo_pages), timeout=240)
        check_alive()
        assert await outage_seconds(port) == 0 and await outage_seconds(index_port) == 0
        records = await topics.read(topics.matches)
        expected_topo = await topo.scan_in_sequence_order(tmp_path / "topology-oracle")
        for p, _ in [(proc, log), *topo.procs]:
            p.send_signal(signal.SIGTERM)
        for p, lg in [(proc, log), *topo.procs]:
            assert p.wait(60) == 0, lg.read_text()[-4000:]
    finally:
        other.stop_all()
        topo.stop_all()
        clean_up(idle, None)
        clean_up(proc, home)
    said = said_since(idle_log, idle_at)
    assert idle.returncode == 5, "\n".join(said[-60:])
    assert idle_took is not None and idle_took >= IDLE_MAX_OUTAGE_S, "\n".join(said[-60:])
    assert said_once(said, "waiting for Kafka", "WARNING"), "\n".join(said[:60])
    stopped = [line for line in said if "worker stopped: " in line]
    assert len(stopped) == 1 and "kafka.max_outage_s" in stopped[0], "\n".join(said[-60:])

    said = idle_role_log.read_text("utf-8", "replace").splitlines()
    assert idle_role.returncode == 5, "\n".join(said[-60:])
    assert idle_role_took is not None and idle_role_took >= IDLE_MAX_OUTAGE_S, \
        "\n".join(said[-60:])
    assert len([line for line in said if "waiting for Kafka" in line]) == 1, \
        "\n".join(said[-60:])
    stopped = [line for line in said if "sketch role stopped" in line]
    assert len(stopped) == 1 and "kafka.max_outage_s" in stopped[0], "\n".join(said[-60:])

    for name, said in [(log.name, said_since(log, stopped_at)), *(
            (lg.name, said_since(lg, size))
            for (_, lg), size in zip(topo.procs, sizes, strict=True))]:
        assert said_once(said, "waiting for Kafka", "WARNING"), (name, said[:60])
        assert said_once(said, "Kafka is back", "INFO"), (name, said[:60])
        # nothing left behind: no unawaited future or task of a producer given up on
        assert not [line for line in said if " asyncio: " in line], (name, said)
    # the Kafka client's retries are folded (dupalign/service/log_repeats.py)
    lines = log.read_text("utf-8", "replace").splitlines()
    assert len(lines) < 200, "\n".join(lines[:40])
    assert not [line for line in lines if " asyncio: " in line], "\n".join(lines)

    for got_records, expected in (
            (records, collections.Counter(embedded_matches(pages, tmp_path / "oracle"))),
            (published, expected_topo)):
        got = collections.Counter(match_key(messages.decode_match(r.value))
                                  for r in got_records)
        twice = [k for k, n in got.items() if n > expected[k]]
        assert not twice, f"published twice: {twice[:5]}"
        assert got == expected
