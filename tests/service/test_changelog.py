"""The changelog's records without a broker (dupalign/service/changelog.py): keys name the
family and the store key and read back as they were; a turn's records are the last value per
key of what the store changed, tombstones for deletions."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from dupalign.service.changelog import Changelog, decode_key, encode_key
from dupalign.store.database import Store
from dupalign.store.keys import FAMILIES


@given(family=st.sampled_from(FAMILIES), key=st.binary())
def test_a_key_reads_back_as_written(family: str, key: bytes) -> None:
    assert decode_key(encode_key(family, key)) == (family, key)


def test_a_turn_sends_the_last_value_per_key_then_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {"p": 1})
    log = Changelog(store, "t.changelog", 3)
    batch = store.batch()
    batch.put("cws", b"a", b"1")
    batch.put("exact", b"a", b"")
    batch.put("cws", b"a", b"2")
    batch.put("cws", b"b", b"1")
    store.write(batch)
    batch = store.batch()
    batch.delete("cws", b"b")
    store.write(batch)
    out = log.outgoing()
    assert {(o.topic, o.partition) for o in out} == {("t.changelog", 3)}
    assert sorted((decode_key(o.key or b""), o.value) for o in out) == [
        (("cws", b"a"), b"2"), (("cws", b"b"), None), (("exact", b"a"), b"")]
    assert log.outgoing() == []
    log.close()
    store.put("cws", b"c", b"1")  # no longer observed
    assert log.outgoing() == []
    store.close()


def test_holds_only_says_whether_one_key_alone_changed_and_keeps_it_for_later(
        tmp_path: Path) -> None:
    """A stage partition whose turns only moved its cursor commits nothing (stage_role.py):
    the cursor stays pending and goes out with the next turn's records, as last written."""
    store = Store(tmp_path / "db", {"p": 1})
    log = Changelog(store, "t.changelog", 0)
    cursor = ("meta", b"stage_cursor")
    assert log.holds_only(cursor)  # (nothing changed)
    store.put(*cursor, b"1")
    store.put(*cursor, b"2")
    assert log.holds_only(cursor) and not log.holds_only(("meta", b"other"))
    store.put("cws", b"a", b"x")
    assert not log.holds_only(cursor)
    out = log.outgoing()
    assert sorted((decode_key(o.key or b""), o.value) for o in out) == [
        (("cws", b"a"), b"x"), (cursor, b"2")]
    log.close()
    store.close()
