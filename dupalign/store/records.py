"""The engine's records over the store's families, by what they are rather than by key:
notes and logs a service keeps beside the engine's own, consumed offsets, forward records,
the ordinals stored, and removal by ordinal ranges."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from dupalign.store.database import Batch, Store
from dupalign.store.keys import offsets_key, read_u64, u64


def delete_ordinals(batch: Batch, families: Iterable[str], first: int, last: int) -> None:
    """Delete the keys ordinal ``first``..``last`` (keys that start with a big-endian u64
    ordinal) of each family: one point delete per key for a short run, one range delete
    (cheap to write, compacted away) for a longer one: many small range tombstones would
    slow reads."""
    for family in families:
        if last - first < 8:
            for o in range(first, last + 1):
                batch.delete(family, u64(o))
        else:
            batch.delete_range(family, u64(first), u64(last + 1))


# -- records a service keeps in the engine's store --------------------------------------------
# They go in ``meta`` beside the engine's own, written in the engine's batches where they must
# be atomic with a page. Their keys are fixed by the stores already written, so each name maps
# to its key here: a service names them and never builds a key.
NOTES = {  # one value each
    "forward_sent": b"topology_forward_sent",  # the index role's forward records sent below
    "align_partitions": b"topology_align_partitions",  # the align partition count keyed by
    "applied_seq": b"applied_seq",  # a shard process's last sequence record applied
}
LOGS = {  # values by sequence number
    "outbox": b"outbox/",  # the index fan-in's keys messages per sequence record
    "partials": b"partial/",  # a shard process's partials per sequence record
}


def _note_key(name: str) -> bytes:
    key = NOTES.get(name)
    if key is None:
        raise KeyError(f"unknown store note {name!r}; known: {', '.join(NOTES)}")
    return key


def _log_prefix(log: str) -> bytes:
    prefix = LOGS.get(log)
    if prefix is None:
        raise KeyError(f"unknown store log {log!r}; known: {', '.join(LOGS)}")
    return prefix


def get_note(store: Store, name: str) -> bytes | None:
    return store.get("meta", _note_key(name))


def put_note(target: Store | Batch, name: str, value: bytes) -> None:
    target.put("meta", _note_key(name), value)


def log_items(store: Store, log: str) -> Iterator[tuple[int, bytes]]:
    """(sequence number, value) of ``log``, ascending."""
    prefix = _log_prefix(log)
    for key, value in store.prefix("meta", prefix):
        yield read_u64(key, len(prefix)), value


def log_get(store: Store, log: str, seq: int) -> bytes | None:
    return store.get("meta", _log_prefix(log) + u64(seq))


def log_put(batch: Batch, log: str, seq: int, value: bytes) -> None:
    batch.put("meta", _log_prefix(log) + u64(seq), value)


def log_delete(batch: Batch, log: str, seq: int) -> None:
    batch.delete("meta", _log_prefix(log) + u64(seq))


def log_delete_below(batch: Batch, log: str, end: int) -> None:
    """Delete the entries of ``log`` below sequence number ``end``."""
    prefix = _log_prefix(log)
    batch.delete_range("meta", prefix, prefix + u64(end))


def get_offset(store: Store, topic: str, partition: int) -> int | None:
    """The next input offset stored for (topic, partition) (None: none stored)."""
    raw = store.get("offsets", offsets_key(topic, partition))
    return None if raw is None else read_u64(raw)


def put_offset(batch: Batch, topic: str, partition: int, next_offset: int) -> None:
    batch.put("offsets", offsets_key(topic, partition), u64(next_offset))


def unfinished_records(store: Store) -> Iterator[bytes]:
    """The ``unfinished`` records (a store opened read-only made before the family: none)."""
    if store.has_family("unfinished"):
        for _, value in store.items("unfinished"):
            yield value


def forward_record(store: Store, ordinal: int) -> tuple[bytes, bytes] | None:
    """The page's forward record as stored: its windows and positions (None: it has none)."""
    windows = store.get("forward", u64(ordinal))
    positions = store.get("positions", u64(ordinal))
    return None if windows is None or positions is None else (windows, positions)


def stored_ordinals(store: Store, start: int = 0) -> Iterator[int]:
    """The ordinals of the pages stored, from ``start`` on, ascending."""
    for key, _ in store.items_from("docs", u64(start)):
        yield read_u64(key)
