"""The engine's records over the store's families, by what they are rather than by key:
notes and logs a service keeps beside the engine's own, consumed offsets, forward records,
the ordinals stored, and removal by ordinal ranges."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from dupalign.store import tables
from dupalign.store.database import Batch, Store
from dupalign.store.keys import read_u64, u64

# -- records a service keeps in the engine's store --------------------------------------------
# They go in ``meta`` beside the engine's own, written in the engine's batches where they must
# be atomic with a page. Their keys are fixed by the stores already written, so each name maps
# to its key here: a service names them and never builds a key.
NOTES = {  # one count (u64) each
    # a stage's ledger (dupalign.stages.ledger_store)
    "ledger_next_ordinal": b"ledger_next_ordinal",
    "ledger_next_seq": b"ledger_next_seq",
    "router_learned": b"router_learned",  # the pages a router counted as learned (InForce)
}
BLOBS = {  # one value each
    "stage_cursor": b"stage_cursor",  # a stage role's place in its inputs (msgpack)
    "learner_model": b"learner_model",  # the learner role's volatility model as learned
}
LOGS = {  # values by sequence number
    "audit_tally": b"audit_tally/",  # the recall audit's counts (sequence 0)
    "audit_reservoir": b"audit_reservoir/",  # the audit's reservoir of pages, by slot
    "ledger": b"ledger/",  # a stage's ledger rows: sequence ordinal -> store ordinal, fetched_at
    "router_rows": b"router_rows/",  # a router's rows: store ordinal -> fingerprint (or none)
    # the combine role's (dupalign/service/roles/stage_combine.py): store ordinal -> id of each
    # page alive; sequence ordinal -> a page waiting for align
    "combine_ids": b"combine_ids/",
    "combine_pending": b"combine_pending/",
    # a router's exact copies: store ordinal -> fingerprint (for a revisit's distance)
    "router_kept": b"router_kept/",
    # the learner role's (dupalign/service/roles/stage_learner.py): the distinct tokens of
    # each page learned, until the last freeze; the tables it froze, by version
    "learner_pending": b"learner_pending/",
    "learner_tables": b"learner_tables/",
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


def get_note(store: Store, name: str) -> int | None:
    raw = store.get("meta", _note_key(name))
    return None if raw is None else read_u64(raw)


def put_note(target: Store | Batch, name: str, value: int) -> None:
    target.put("meta", _note_key(name), u64(value))


def get_blob(store: Store, name: str) -> bytes | None:
    if name not in BLOBS:
        raise KeyError(f"unknown store blob {name!r}; known: {', '.join(BLOBS)}")
    return store.get("meta", BLOBS[name])


def put_blob(target: Store | Batch, name: str, value: bytes) -> None:
    if name not in BLOBS:
        raise KeyError(f"unknown store blob {name!r}; known: {', '.join(BLOBS)}")
    target.put("meta", BLOBS[name], value)


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


def log_write(batch: Batch, changes: Iterable[tuple[str, int, bytes | None]]) -> None:
    """(log, sequence number, value; None: deleted) in order, as ``log_put`` and
    ``log_delete`` one by one: a stretch of puts to one log in one call (``put_many``)."""
    keys: list[bytes] = []
    values: list[bytes] = []
    for log, seq, value in changes:
        key = _log_prefix(log) + u64(seq)
        if value is None:
            if keys:
                batch.put_many("meta", keys, values)
                keys, values = [], []
            batch.delete("meta", key)
        else:
            keys.append(key)
            values.append(value)
    if keys:
        batch.put_many("meta", keys, values)


def log_delete_below(batch: Batch, log: str, end: int) -> None:
    """Delete the entries of ``log`` below sequence number ``end``."""
    prefix = _log_prefix(log)
    batch.delete_range("meta", prefix, prefix + u64(end))


_PARTITION = struct.Struct(">I")


def _offsets_key(topic: str, partition: int) -> bytes:
    return topic.encode("utf-8") + b"\x00" + _PARTITION.pack(partition)


def _parse_offsets_key(key: bytes) -> tuple[str, int]:
    return key[:-5].decode("utf-8"), int(_PARTITION.unpack_from(key, len(key) - 4)[0])


def get_offset(store: Store, topic: str, partition: int) -> int | None:
    """The next input offset stored for (topic, partition) (None: none stored)."""
    raw = store.get("offsets", _offsets_key(topic, partition))
    return None if raw is None else read_u64(raw)


def put_offset(batch: Batch, topic: str, partition: int, next_offset: int) -> None:
    batch.put("offsets", _offsets_key(topic, partition), u64(next_offset))


def stored_offsets(store: Store) -> dict[tuple[str, int], int]:
    """Every (topic, partition) -> the next input offset stored."""
    return {_parse_offsets_key(key): read_u64(value) for key, value in store.items("offsets")}


# meta keys: the prefix, then (topic, partition) as the offsets family keys them
_PUBLISHED = b"published/"


def checkpoints(store: Store) -> dict[tuple[str, int], int]:
    """Per input partition, an offset below which a caller published every page's matches
    (``put_checkpoint``)."""
    n = len(_PUBLISHED)
    return {_parse_offsets_key(key[n:]): read_u64(value)
            for key, value in store.prefix("meta", _PUBLISHED)}


def put_checkpoint(store: Store, topic: str, partition: int, position: int) -> None:
    store.put("meta", _PUBLISHED + _offsets_key(topic, partition), u64(position))


def unfinished_records(store: Store) -> Iterator[bytes]:
    """The ``unfinished`` records (a store opened read-only made before the family: none)."""
    if tables.unfinished.in_store(store):
        for _, value in tables.unfinished.items(store):
            yield value


def forward_record(store: Store, ordinal: int) -> tuple[bytes, bytes] | None:
    """The page's forward record as stored: its windows and positions (None: it has none)."""
    windows = tables.forward.get(store, ordinal)
    positions = tables.positions.get(store, ordinal)
    return None if windows is None or positions is None else (windows, positions)


def stored_ordinals(store: Store, start: int = 0) -> Iterator[int]:
    """The ordinals of the pages stored, from ``start`` on, ascending."""
    return tables.docs.ordinals(store, start)
