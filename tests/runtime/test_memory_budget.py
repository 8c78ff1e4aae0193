"""engine.cache.memory_mb: one budget the caches and the memtables share."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dupalign.config import BASE_MB, DEFAULT_MB, MEMORY_SHARES, CacheConfig
from dupalign.errors import ConfigError
from dupalign.store import options as store_options
from dupalign.store.database import Store
from tests.conftest import PRODUCT_MEMTABLE_BUCKETS


def _spent(b: dict[str, int]) -> int:
    """MB the budgets add up to (the engine holds two forward caches)."""
    return b["lists"] + b["blocks"] + b["memtables"] + 2 * b["forward"]


def test_without_a_budget_each_cache_keeps_its_default() -> None:
    assert CacheConfig().budgets_mb() == DEFAULT_MB | {"memtables": 0}
    assert CacheConfig(lists_mb=64).budgets_mb()["lists"] == 64


def test_a_budget_is_split_by_the_shares() -> None:
    b = CacheConfig(memory_mb=2048).budgets_mb()
    left = 2048 - BASE_MB
    assert left - 4 <= _spent(b) <= left
    assert b["lists"] == int(left * MEMORY_SHARES["lists"])  # the shares (forward twice) sum to 1
    assert b["lists"] > b["blocks"] > b["memtables"] > b["forward"] > 0


def test_keys_given_explicitly_are_honoured_and_the_rest_share_what_is_left() -> None:
    b = CacheConfig(memory_mb=2048, lists_mb=1000, forward_mb=10).budgets_mb()
    assert (b["lists"], b["forward"]) == (1000, 10)
    left = 2048 - BASE_MB - 1000 - 2 * 10
    assert left - 2 <= b["blocks"] + b["memtables"] <= left
    assert b["blocks"] / b["memtables"] == pytest.approx(0.2 / 0.15, rel=0.01)


@pytest.mark.parametrize("cache", [
    CacheConfig(memory_mb=BASE_MB + 5),
    CacheConfig(memory_mb=2048, lists_mb=2000),  # the explicit keys take it all
])
def test_a_budget_without_room_for_every_cache_is_refused(cache: CacheConfig) -> None:
    with pytest.raises(ConfigError) as info:
        cache.validate()
    assert info.value.key == "cache.memory_mb" and "no room" in str(info.value)


def test_the_memtables_of_every_family_stay_under_their_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real RocksDB: 60 MB written over four families as fast as it takes them, memtables
    bounded to 16 MB. Without the bound the peak was 68 MB (each family keeps up to its own
    64 MB write buffer). With it, each family written holds at most two memtables of an
    eighth of the budget, so four stay within it beside the empty hash memtable of ``oph``
    (16-21 MB seen), however far the writer outruns the flushes."""
    monkeypatch.setattr(store_options, "MEMTABLE_BUCKETS", PRODUCT_MEMTABLE_BUCKETS)
    budget = 16 << 20
    store = Store(tmp_path / "db", {"p": 1}, memtable_bytes=budget)
    try:
        peak = 0
        for i in range(600):
            batch = store.batch()
            for family in ("docs", "matches", "cws", "forward"):
                batch.put(family, i.to_bytes(8, "big"), os.urandom(25_000))
            store.write(batch)
            peak = max(peak, sum(cf.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
                                 for cf in store._cfs.values()))
        assert 0 < peak <= budget + PRODUCT_MEMTABLE_BUCKETS * 8, peak
    finally:
        store.close()
