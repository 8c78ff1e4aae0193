"""The RocksDB store: families, prefix scans, atomic batches, parameter check at open."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.errors import StoreError, StoreMismatch, StoreUnavailable
from dupalign.store.database import Store
from dupalign.store.keys import read_u64, u64


def test_prefix_scan_returns_exactly_the_prefix_in_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {"p": 1})
    batch = store.batch()
    for value in (7, 8, 255, 256):
        for ordinal in (3, 1, 2):
            batch.put("oph", u64(value) + u64(ordinal), u64(ordinal))
    batch.put("oph", b"\xff" * 8 + u64(0), b"")
    store.write(batch)
    assert [read_u64(v) for _, v in store.prefix("oph", u64(8))] == [1, 2, 3]
    assert len(list(store.prefix("oph", b"\xff" * 8))) == 1
    assert read_u64(store.last_key("oph") or b"", 8) == 0
    store.close()


@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.binary(min_size=1, max_size=4), max_size=30),
       gone=st.lists(st.integers(0, 29), max_size=10),
       prefixes=st.lists(st.binary(min_size=1, max_size=3), min_size=1, max_size=8))
def test_first_key_is_the_prefix_scans_first(tmp_path_factory: pytest.TempPathFactory,
                                             keys: list[bytes], gone: list[int],
                                             prefixes: list[bytes]) -> None:
    """``first_key``: the first key ``prefix`` gives, deleted keys and all."""
    store = Store(tmp_path_factory.mktemp("db") / "db", {"p": 1})
    batch = store.batch()
    for key in keys:
        batch.put("exact", key, b"")
    store.write(batch)
    batch = store.batch()
    for i in gone:
        if i < len(keys):
            batch.delete("exact", keys[i])
    store.write(batch)
    for prefix in [*prefixes, *keys, b"\xff", b"\xff\xff"]:
        expected = next((k for k, _ in store.prefix("exact", prefix)), None)
        assert store.first_key("exact", prefix) == expected
    reader = store.prefix_reader("exact")  # (``tables.exact.first_many``: one for many)
    for prefix in [*prefixes, *keys, b"\xff", b"\xff\xff"]:
        found, _ = reader.items(prefix, 1)
        assert (found[0] if found else None) == store.first_key("exact", prefix)
    store.close()



def test_prefix_reader_stops_at_a_group_header(tmp_path: Path) -> None:
    """A key equal to the prefix sorts before the group's entries: with ``header`` it is
    returned alone, without reading the group; without, it is read like any entry."""
    store = Store(tmp_path / "db", {"p": 1})
    batch = store.batch()
    group, other = b"\x00\x01" + u64(5), b"\x00\x01" + u64(6)
    batch.put("oph", group, u64(99))
    for ordinal in range(4):
        batch.put("oph", group + u64(ordinal) + b"\0\0\0\0", u64(ordinal))
        batch.put("oph", other + u64(ordinal) + b"\0\0\0\0", u64(ordinal))
    store.write(batch)
    reader = store.prefix_reader("oph")
    assert reader.items(group, 10, header=True) == ([group], [u64(99)])
    keys, values = reader.items(group, 10)
    assert keys[0] == group and [read_u64(v) for v in values[1:]] == [0, 1, 2, 3]
    assert len(reader.items(group, 3)[0]) == 3
    keys, _ = reader.items(other, 10, header=True)  # no header: the whole group
    assert len(keys) == 4 and all(k.startswith(other) for k in keys)
    store.close()

def test_prefix_reader_finds_which_prefixes_are_present(tmp_path: Path) -> None:
    """``present``: one seek per prefix; the key of another prefix that a seek to an
    absent one lands on is not taken for it."""
    store = Store(tmp_path / "db", {"p": 1})
    batch = store.batch()
    stored = [b"\x00\x01" + u64(5), b"\x00\x01" + u64(7), b"\x00\x02" + u64(0)]
    for prefix in stored:
        batch.put("oph", prefix + u64(3), b"")
    store.write(batch)
    reader = store.prefix_reader("oph")
    asked = [b"\x00\x01" + u64(4), stored[0], b"\x00\x01" + u64(6), stored[1],
             b"\x00\x01" + u64(8), stored[2], b"\xff\xff" + u64(2**64 - 1)]
    assert reader.present(asked) == [1, 3, 5]
    assert reader.present([]) == []
    store.close()


def test_batch_is_invisible_until_written_and_survives_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {"p": 1})
    batch = store.batch()
    batch.put("docs", u64(0), b"doc")
    batch.put("ids", b"x", u64(0))
    assert store.get("docs", u64(0)) is None
    store.write(batch)
    store.close()
    again = Store(tmp_path / "db", {"p": 1})
    assert again.get("docs", u64(0)) == b"doc"
    assert again.multi_get("ids", [b"x", b"y"]) == [u64(0), None]
    again.close()


def test_delete_range(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {})
    batch = store.batch()
    for i in range(10):
        batch.put("idf_pending", u64(i), b"v")
    store.write(batch)
    batch = store.batch()
    batch.delete_range("idf_pending", u64(0), u64(6))
    store.write(batch)
    assert [read_u64(k) for k, _ in store.items("idf_pending")] == [6, 7, 8, 9]
    store.close()


def test_other_parameters_refuse_to_open(tmp_path: Path) -> None:
    Store(tmp_path / "db", {"k": 64, "seed": 1}).close()
    with pytest.raises(StoreMismatch, match="k: store has 64, asked for 128"):
        Store(tmp_path / "db", {"k": 128, "seed": 1})
    ro = Store(tmp_path / "db", {}, read_only=True)
    assert ro.params == {"k": 64, "seed": 1}
    ro.close()


def test_parameters_added_later_are_implied_for_older_stores(tmp_path: Path) -> None:
    """A store made before a frozen parameter existed was built with its implied value: it
    opens with that value and refuses another one."""
    Store(tmp_path / "db", {"k": 64}).close()
    implied = {"near_shingle": 3}
    Store(tmp_path / "db", {"k": 64, "near_shingle": 3}, implied=implied).close()
    with pytest.raises(StoreMismatch, match="near_shingle: store has 3, asked for 5"):
        Store(tmp_path / "db", {"k": 64, "near_shingle": 5}, implied=implied)



def test_upgradable_parameters_are_upgraded_in_place(tmp_path: Path) -> None:
    """A store of an older format that the new one only extends opens for writing and
    records the new format; a read-only open leaves it as it is; any other difference
    (or a format not listed) still refuses to open."""
    upgrades = {"format": (2,)}
    Store(tmp_path / "a", {"format": 2, "k": 64}).close()
    with pytest.raises(StoreMismatch, match="k: store has 64, asked for 128"):
        Store(tmp_path / "a", {"format": 3, "k": 128}, upgrades=upgrades)
    ro = Store(tmp_path / "a", {"format": 3, "k": 64}, read_only=True, upgrades=upgrades)
    assert ro.params["format"] == 2
    ro.close()
    Store(tmp_path / "a", {"format": 3, "k": 64}, upgrades=upgrades).close()
    ro = Store(tmp_path / "a", {}, read_only=True)
    assert ro.params == {"format": 3, "k": 64}
    ro.close()
    with pytest.raises(StoreMismatch, match=r"has format 3, which this version of dupalign "
                       r"does not read \(it reads format 2 and the ones it upgrades\): rebuild"):
        Store(tmp_path / "a", {"format": 2, "k": 64}, upgrades=upgrades)
    Store(tmp_path / "b", {"format": 1, "k": 64}).close()
    with pytest.raises(StoreMismatch, match=r"has format 1, .* reads format 3"):
        Store(tmp_path / "b", {"format": 3, "k": 64}, upgrades=upgrades)

def test_read_only_needs_an_existing_store(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="no store at"):
        Store(tmp_path / "missing", {}, read_only=True)


def test_a_store_locked_by_another_process_raises_store_error(tmp_path: Path) -> None:
    """rocksdict raises plain Exception; the store says it is locked and by which process."""
    path = tmp_path / "db"
    Store(path, {"p": 1}).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from dupalign.store.database import Store; "
         f"s = Store({str(path)!r}, {{'p': 1}}); print('open', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError) as info:
            Store(path, {"p": 1})
    finally:
        holder.kill()
        holder.wait()
    # a StoreUnavailable: the worker stops on it like any store failure, the CLI names the holder
    assert isinstance(info.value, StoreUnavailable) and info.value.operation == "open"
    assert str(info.value).startswith(f"store {path} is locked by pid {holder.pid} ")


@pytest.mark.parametrize("made", ["oph", "weighted", "weighted_oph"])
def test_a_store_made_in_one_passage_mode_refuses_the_others(tmp_path: Path, made: str
                                                             ) -> None:
    """Windows and lists of one mode mean nothing to another (OPH min-hashes, MonoActive
    keys, weighted OPH ICWS samples): an engine in another mode is refused, a reader takes
    the store's."""
    from dupalign.config import PASSAGE_MODES, EngineConfig, PassageConfig
    from dupalign.runtime.engine import Engine

    def config(mode: str) -> EngineConfig:
        return EngineConfig(passage=PassageConfig(mode=mode)).validate()

    Engine.open(tmp_path / "s", config(made)).close()
    for other in PASSAGE_MODES:
        if other != made:
            with pytest.raises(StoreMismatch, match=f"passage_mode: store has '{made}', "
                                                    f"asked for '{other}'"):
                Engine.open(tmp_path / "s", config(other))
    with Engine.open(tmp_path / "s", config("oph"), read_only=True) as reader:
        assert reader.config.passage.mode == made


def test_a_weighted_oph_store_of_gaps_is_read_but_not_written(tmp_path: Path) -> None:
    """A weighted_oph store made before its empty windows became steps (no
    ``passage_woph`` recorded) refuses a writer, whose pages' windows would disagree with
    its own; a reader opens it (its gap records read as before)."""
    import msgpack

    from dupalign.config import WOPH_VERSION, EngineConfig, PassageConfig
    from dupalign.runtime.engine import Engine

    cfg = EngineConfig(passage=PassageConfig(mode="weighted_oph")).validate()
    with Engine.open(tmp_path / "s", cfg) as engine:
        assert engine.store.params["passage_woph"] == WOPH_VERSION
        old = {k: v for k, v in engine.store.params.items() if k != "passage_woph"}
        engine.store.put("meta", b"params", msgpack.packb(old))
    with pytest.raises(StoreMismatch, match=f"passage_woph: store has None, asked for "
                                            f"{WOPH_VERSION}"):
        Engine.open(tmp_path / "s", cfg)
    with Engine.open(tmp_path / "s", cfg, read_only=True) as reader:
        assert reader.config.passage.mode == "weighted_oph"
