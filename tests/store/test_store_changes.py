"""What an observed store hands over (``Store.observe``) rebuilds it: the changes of random
batches, compacted as a Kafka changelog is (the last value per key), applied to a fresh store
(``Store.apply``) give the same contents, family by family."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.store.database import Batch, Change, Store
from dupalign.store.keys import FAMILIES

FAMS = ("docs", "exact", "cws", "oph")  # oph: a prefix-extracted family (meta holds the
# parameters, written at open before anything observes)
keys = st.binary(min_size=1, max_size=3)
values = st.binary(max_size=4)  # b"" too: a value, not a deletion
op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(FAMS), keys, values),
    st.tuples(st.just("delete"), st.sampled_from(FAMS), keys),
    st.tuples(st.just("range"), st.sampled_from(FAMS), keys, keys),
    st.tuples(st.just("many"), st.sampled_from(FAMS), st.lists(st.tuples(keys, values),
                                                                max_size=4)),
)
batch_or_put = st.one_of(st.lists(op, max_size=12),
                         st.tuples(st.sampled_from(FAMS), keys, values))  # a direct put


def _apply_op(batch: Batch, o: tuple) -> None:  # type: ignore[type-arg]
    if o[0] == "put":
        batch.put(o[1], o[2], o[3])
    elif o[0] == "delete":
        batch.delete(o[1], o[2])
    elif o[0] == "range":
        batch.delete_range(o[1], min(o[2], o[3]), max(o[2], o[3]))
    else:
        batch.put_many(o[1], [k for k, _ in o[2]], [v for _, v in o[2]])


def _contents(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    return {f: [(bytes(k), bytes(v)) for k, v in store.items(f)] for f in FAMILIES}


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(batch_or_put, max_size=8), drop_tombstones=st.booleans())
def test_changes_compacted_rebuild_the_store(tmp_path_factory: pytest.TempPathFactory,
                                             writes: list, drop_tombstones: bool) -> None:  # type: ignore[type-arg]
    root = tmp_path_factory.mktemp("changes")
    store = Store(root / "a", {"p": 1})
    log: list[Change] = []
    store.observe(log.extend)
    for w in writes:
        if isinstance(w, tuple):
            store.put(*w)
            continue
        batch = store.batch()
        for o in w:
            _apply_op(batch, o)
        store.write(batch)
    compacted: dict[tuple[str, bytes], bytes | None] = {}
    for family, key, value in log:  # as the log cleaner keeps them: the last record per key
        compacted.pop((family, key), None)
        compacted[(family, key)] = value
    if drop_tombstones:  # after delete.retention.ms, the cleaner drops tombstones too
        compacted = {k: v for k, v in compacted.items() if v is not None}
    fresh = Store(root / "b", {"p": 1})
    fresh.apply((f, k, v) for (f, k), v in compacted.items())
    assert _contents(fresh) == _contents(store)
    store.close()
    fresh.close()


def test_an_unobserved_store_notes_nothing_and_an_observed_one_refuses_old_batches(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {"p": 1})
    assert type(store.batch()) is Batch  # nothing noted, nothing paid
    old = store.batch()
    old.put("meta", b"k", b"v")
    seen: list[list[Change]] = []
    store.observe(seen.append)
    with pytest.raises(RuntimeError, match="before the store was observed"):
        store.write(old)
    with pytest.raises(RuntimeError, match="cannot ingest"):
        store.ingest("oph", [])
    batch = store.batch()
    batch.put("meta", b"k", b"v")
    store.write(batch)
    store.write(store.batch())  # nothing changed: nothing handed over
    assert seen == [[("meta", b"k", b"v")]]
    store.observe(None)
    store.put("meta", b"k", b"w")
    assert len(seen) == 1
    store.close()
