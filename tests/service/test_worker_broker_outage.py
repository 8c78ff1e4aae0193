"""The broker dies mid-stream (SIGKILL) and comes back 25 s later, under a single worker
(issue 42, acceptance (b)): it waits for it (``kafka.max_outage_s``) without exiting, says
so once, and loses and repeats nothing; an idle worker with a shorter
``kafka.max_outage_s`` gives up meanwhile, with exit code 5. The test runs a broker of its
own (deploy/kafka/broker.sh, restarted on the ports and data directory it recorded, so
clients find it again), not the session's."""

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


async def test_the_worker_waits_out_a_broker_restart_and_an_idle_one_exits_5(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """One broker outage, two loads on it. A busy single worker (``max_outage_s`` far beyond
    the outage) waits it out, says so once, and publishes exactly ``scan``'s matches, none
    twice. An idle worker (every page committed), with ``max_outage_s`` =
    IDLE_MAX_OUTAGE_S, tries no send and no commit: it notices the outage by its consumer
    losing the group coordinator, says so once, shows it in the gauge, and gives up with the
    Kafka exit code once ``max_outage_s`` has passed. (One test: each load would start,
    kill and restart a broker of its own for the same outage.)"""
    # kafka_bootstrap: the session's broker is started first, so that this one's Java and
    # jars are known to be there (and a missing toolchain skips or fails the same way)
    del kafka_bootstrap
    home = tmp_path / "broker"
    bootstrap = broker("start", home)
    pages, idle_pages = corpus(), demo_pages()[:8]
    log, idle_log = tmp_path / "worker.log", tmp_path / "idle.log"
    port, idle_port = free_port(), free_port()
    proc: subprocess.Popen[bytes] | None = None
    idle: subprocess.Popen[bytes] | None = None
    try:
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
        idle = start_worker_process(idle_config, tmp_path / "idle-store", idle_log)
        proc = start_worker_process(config_path, tmp_path / "store", log)

        def check_alive(idle_too: bool = False) -> None:
            for p, lg in [(proc, log)] + ([(idle, idle_log)] if idle_too else []):
                assert p is not None and p.poll() is None, lg.read_text()[-4000:]

        async def idle_committed() -> bool:
            check_alive(idle_too=True)
            return await idle_topics.committed_total() == len(idle_pages)
        await wait_for(idle_committed, 180, "every idle page committed")
        await topics.send(pages)

        async def some_progress() -> bool:
            check_alive(idle_too=True)
            return await topics.committed_total() >= 4
        await wait_for(some_progress, 180, "the worker's first commits")
        check_alive(idle_too=True)
        before = await topics.committed_total()
        stopped_at, idle_at = log.stat().st_size, idle_log.stat().st_size
        pid = int((home / "broker.pid").read_text())
        subprocess.run(["kill", "-KILL", str(pid)], check=True)  # transactions in flight
        killed = time.monotonic()
        assert before < len(pages), "the worker's stream ended before the broker went away"

        async def idle_said_so() -> bool:
            assert idle is not None and idle.poll() is None, idle_log.read_text()[-4000:]
            check_alive()
            return b"waiting for Kafka" in idle_log.read_bytes()[idle_at:]
        await wait_for(idle_said_so, 60, "the idle worker's 'waiting for Kafka'")
        assert await outage_seconds(idle_port) > 0
        idle_took = None  # the broker comes back once the idle one exited
        while time.monotonic() < killed + OUTAGE_S or idle_took is None:
            check_alive()
            if idle_took is None and idle.poll() is not None:
                idle_took = time.monotonic() - killed
            assert time.monotonic() < killed + OUTAGE_S + 60, "the idle worker did not exit"
            await asyncio.sleep(0.5)
        # the busy worker found out, and says so in the gauge
        assert await outage_seconds(port) > 0
        assert broker("start", home) == bootstrap  # same ports, same data directory

        async def finished() -> bool:
            check_alive()
            return await topics.committed_total() == len(pages)
        await wait_for(finished, 300, "every offset committed after the broker came back")
        check_alive()
        assert await outage_seconds(port) == 0
        records = await topics.read(topics.matches)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
    finally:
        clean_up(idle, None)
        clean_up(proc, home)
    said = said_since(idle_log, idle_at)
    assert idle.returncode == 5, "\n".join(said[-60:])
    assert idle_took is not None and idle_took >= IDLE_MAX_OUTAGE_S, "\n".join(said[-60:])
    assert said_once(said, "waiting for Kafka", "WARNING"), "\n".join(said[:60])
    stopped = [line for line in said if "worker stopped: " in line]
    assert len(stopped) == 1 and "kafka.max_outage_s" in stopped[0], "\n".join(said[-60:])

    said = said_since(log, stopped_at)
    assert said_once(said, "waiting for Kafka", "WARNING"), said[:60]
    assert said_once(said, "Kafka is back", "INFO"), said[:60]
    # nothing left behind: no unawaited future or task of a producer given up on
    assert not [line for line in said if " asyncio: " in line], said
    # the Kafka client's retries are folded (dupalign/service/log_repeats.py)
    lines = log.read_text("utf-8", "replace").splitlines()
    assert len(lines) < 200, "\n".join(lines[:40])
    assert not [line for line in lines if " asyncio: " in line], "\n".join(lines)

    expected = collections.Counter(embedded_matches(pages, tmp_path / "oracle"))
    got = collections.Counter(match_key(messages.decode_match(r.value)) for r in records)
    twice = [k for k, n in got.items() if n > expected[k]]
    assert not twice, f"published twice: {twice[:5]}"
    assert got == expected
