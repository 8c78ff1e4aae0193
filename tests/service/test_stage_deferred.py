"""A stage partition's turns that send nothing downstream commit no transaction of their own
(dupalign/service/roles/stage_role.py, ``StageRole._commit``): their store changes go with the
partition's next transaction, or with one of their own once the reader is idle or they have
waited ``DEFER_S``; the store stays dirty (not kept) meanwhile. Without a broker: the
transaction is a stub that records what it would commit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from dupalign.service import loop
from dupalign.service.changelog import Changelog
from dupalign.service.config import Config
from dupalign.service.roles import stage_role
from dupalign.service.roles.stage_role import StageRole
from dupalign.service.topology import Outgoing
from dupalign.stages.partitioned import Shape
from dupalign.store.database import Store

TP = TopicPartition("pages.stage.changelog", 0)


class Applied:
    """A partition whose ``applied`` is what the test says."""

    def __init__(self) -> None:
        self.value = b"0"

    def applied(self) -> bytes:
        return self.value


@pytest.fixture
def role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    committed: list[list[Outgoing]] = []

    async def commit(self: loop.Checkpoint, *args: Any, **kw: Any) -> None:
        committed.append(list(self.outgoing))
    monkeypatch.setattr(loop.Checkpoint, "commit", commit)
    r = StageRole(Config(), Shape(), tmp_path)
    store = Store(tmp_path / "s", Config().engine.frozen_params())
    part = Applied()
    r.parts[TP] = part  # type: ignore[assignment]
    r.changelogs[TP] = Changelog(store, TP.topic, TP.partition)
    r.committed[TP] = part.applied()
    r.producers[TP] = None  # type: ignore[assignment]
    yield r, store, part, committed
    r.changelogs[TP].close()
    store.close()
    r.executor.shutdown()


def _change(store: Store, key: bytes) -> None:
    batch = store.batch()
    batch.put("meta", b"test/" + key, b"v")  # (a store change other than the cursor)
    store.write(batch)


def test_a_turn_that_sends_nothing_goes_with_the_next_transaction(role: Any) -> None:
    r, store, part, committed = role
    _change(store, b"a")
    part.value = b"1"
    r.dirty.add(TP)
    asyncio.run(r._commit(TP, []))
    assert committed == [] and TP in r.deferred and TP in r.dirty  # (not kept if let go)
    _change(store, b"b")
    part.value = b"2"
    out = Outgoing("pages.decisions", b"d", partition=0)
    asyncio.run(r._commit(TP, [out]))
    assert len(committed) == 1 and committed[0][0] is out
    assert len(committed[0]) == 3  # the output and both turns' changes
    assert TP not in r.deferred and TP not in r.dirty and r.committed[TP] == b"2"


def test_deferred_changes_commit_when_the_reader_is_idle_or_after_defer_s(
        role: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    r, store, part, committed = role
    _change(store, b"a")
    part.value = b"1"
    asyncio.run(r._commit(TP, [], idle=True))
    assert len(committed) == 1 and TP not in r.deferred
    _change(store, b"b")
    part.value = b"2"
    asyncio.run(r._commit(TP, []))
    assert len(committed) == 1 and TP in r.deferred
    r.deferred[TP] -= stage_role.DEFER_S  # (deferred that long ago)
    _change(store, b"c")
    asyncio.run(r._commit(TP, []))
    assert len(committed) == 2 and TP not in r.deferred


def test_a_turn_that_only_moved_the_cursor_still_commits_nothing(role: Any) -> None:
    r, _, _, committed = role
    r.dirty.add(TP)
    asyncio.run(r._commit(TP, []))  # (nothing changed, nothing applied)
    assert committed == [] and TP not in r.deferred and TP not in r.dirty


def test_a_deferred_partition_without_records_of_its_own_commits_in_another_s_turn(
        role: Any) -> None:
    """``_work`` hands every deferred partition to ``_commit``, records or not (which
    commits it when the reader is idle, as here, or once it has waited ``DEFER_S``)."""
    r, store, part, committed = role

    async def nothing(most: int, wait: bool) -> tuple[dict[Any, Any], int]:
        return {}, most
    r._fetched = nothing
    _change(store, b"a")
    part.value = b"1"
    asyncio.run(r._commit(TP, []))
    assert TP in r.deferred and committed == []
    asyncio.run(r._work({}))  # (nothing fetched: idle)
    assert TP not in r.deferred and len(committed) == 1
