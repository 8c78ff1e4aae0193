"""The broker goes away mid-stream (SIGKILL of its process) and comes back: the worker
loses and repeats nothing. The test runs a broker of its own (deploy/kafka/broker.sh, on
the ports it recorded, so clients find it again), not the session's."""

from __future__ import annotations

import asyncio
import collections
import signal
import subprocess
from pathlib import Path

import pytest

from dupalign.wire import messages
from tests.conftest import BROKER_SH
from tests.service.test_worker_kafka import (
    Topics,
    clough_pages,
    embedded_matches,
    match_key,
    start_worker_process,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.testdata]


def broker(command: str, directory: Path) -> str:
    proc = subprocess.run(["bash", str(BROKER_SH), command, str(directory)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


async def test_a_broker_killed_mid_stream_and_restarted_loses_and_repeats_nothing(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    # kafka_bootstrap: the session's broker is started first, so that this one's Java and
    # jars are known to be there (and a missing toolchain skips or fails the same way)
    del kafka_bootstrap
    home = tmp_path / "broker"
    bootstrap = broker("start", home)
    pages = clough_pages()
    log = tmp_path / "worker.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        topics = await Topics(bootstrap, partitions=1).create()
        await topics.send(pages)
        _, config_path = topics.config(tmp_path, batch_size=4)
        proc = start_worker_process(config_path, tmp_path / "store", log)

        async def some_progress() -> bool:
            assert proc is not None and proc.poll() is None, log.read_text()[-4000:]
            return await topics.committed_total() >= len(pages) // 4
        await wait_for(some_progress, 120, "first commits")
        pid = int((home / "broker.pid").read_text())
        subprocess.run(["kill", "-KILL", str(pid)], check=True)
        killed_at_s = log.stat().st_size
        await asyncio.sleep(8)  # the worker's transaction in flight cannot commit
        exited = proc.poll()
        assert broker("start", home) == bootstrap
        # The worker may wait for the broker or stop with an error; a stop must name Kafka,
        # and a restart (what its supervisor does) goes on from the committed offsets.
        if exited is not None or proc.poll() is not None:
            assert proc.wait(60) != 0
            said = log.read_bytes()[killed_at_s:].decode("utf-8", "replace")
            assert "Kafka" in said or "broker" in said, said[-3000:]
            proc = start_worker_process(config_path, tmp_path / "store", log)

        async def finished() -> bool:
            assert proc is not None and proc.poll() is None, log.read_text()[-4000:]
            return await topics.committed_total() == len(pages)
        await wait_for(finished, 240, "every offset committed after the broker came back")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
        records = await topics.read(topics.matches)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)
        broker("stop", home)
    # the Kafka client's retries are folded (dupalign/service/log_repeats.py): 2,574 lines before,
    # 19 with the folding, in one run each
    lines = log.read_text("utf-8", "replace").splitlines()
    assert len(lines) < 200, "\n".join(lines[:40])
    published = collections.Counter(match_key(messages.decode_match(r.value)) for r in records)
    expected = collections.Counter(embedded_matches(pages, tmp_path / "oracle"))
    twice = [k for k, n in published.items() if n > expected[k]]
    assert not twice, f"published twice: {twice[:5]}"
    assert published == expected
