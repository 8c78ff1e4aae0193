"""The align role (dupalign/service/roles/align.py) on a record it cannot align, and its temporary
store: no Kafka needed."""

from __future__ import annotations

import signal
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import msgpack
from aiokafka import TopicPartition

from dupalign.service.align_store import TEMPORARY_PREFIX, TemporaryStoreDir
from dupalign.service.config import Config
from dupalign.service.roles.align import AlignRole
from dupalign.service.topology import decode_aligned, ordinal_header
from dupalign.wire import messages
from tests.topology_harness import REPO


def test_an_align_request_it_cannot_read_is_dead_lettered_and_left_to_the_index() -> None:
    """A request of another wire version (retained requests after an upgrade) made the
    role raise: the process stopped at that offset, and so did every one that took the
    partition after it, while the index waited for that page's answer. Now: a dead letter
    with the record, and the answer "not aligned here" for its part, so the index aligns
    the page itself (no passage lost) and goes on; a record without an ordinal is only
    dead-lettered."""
    role = AlignRole(Config())
    kc = role.kc
    tp = TopicPartition(kc.align_topic, 0)
    old = msgpack.packb({"v": 1, "ordinal": 5}, use_bin_type=True)
    records = [SimpleNamespace(topic=tp.topic, partition=0, offset=offset, key=key,
                               value=value, headers=headers)
               for offset, key, value, headers in (
                   (0, struct.pack(">q", 5), old, [ordinal_header(5)]),
                   (1, None, b"\xc1", []))]
    out = role.prepare(tp, records)
    assert [o.topic for o in out] == [kc.dlq_topic, kc.aligned_topic, kc.dlq_topic]
    letters = [messages.decode_dead_letter(o.value) for o in out if o.topic == kc.dlq_topic]
    assert [(d["source"]["offset"], d["error"]) for d in letters] == [(0, "internal_error"),
                                                           (1, "internal_error")]
    assert "align request" in letters[0]["detail"]
    answer = decode_aligned(out[1].value)
    assert (answer.ordinal, answer.part, answer.ranked, answer.passages) == (5, 0, None, None)


_KILLED_WITH_A_TEMPORARY_STORE = """
import os, signal, sys
from dupalign.service.align_store import TemporaryStoreDir
t = TemporaryStoreDir(sys.argv[1])
t.store.mkdir()
(t.store / "000001.sst").write_bytes(b"x" * 4096)
print(t.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

_REMOVE_ORPHANS = """
import sys
from pathlib import Path
from dupalign.runtime.owned_dir import remove_orphaned
from dupalign.service.align_store import TEMPORARY_PREFIX
print(len(remove_orphaned(Path(sys.argv[1]), TEMPORARY_PREFIX)))
"""


def test_a_temporary_align_store_of_a_killed_process_is_removed_by_the_next_one(
        tmp_path: Path) -> None:
    """An align process without ``--store`` fills a temporary directory with its partitions'
    forward records. One killed by SIGKILL (the OOM killer) left it behind, and each
    restart made another: a disk filled by restarts. Now each one made first removes
    those whose owner is gone, and never one whose owner lives (its lock is held)."""
    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", code, str(tmp_path)], text=True,
                              capture_output=True, cwd=REPO, timeout=60)

    killed = run(_KILLED_WITH_A_TEMPORARY_STORE)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    dead = Path(killed.stdout.strip())
    assert (dead / "store" / "000001.sst").exists()
    not_ours = tmp_path / (TEMPORARY_PREFIX + "no-lock")  # (no lock file: left alone)
    not_ours.mkdir()

    live = TemporaryStoreDir(tmp_path)
    try:
        assert not dead.exists() and live.path.exists() and not_ours.exists()
        other = run(_REMOVE_ORPHANS)  # another process's start, while this one lives
        assert other.returncode == 0, other.stderr
        assert other.stdout.split() == ["0"] and live.path.exists()
    finally:
        live.remove()
    assert not live.path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [not_ours.name]
