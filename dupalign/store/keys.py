"""The store's key layout: its column families, what each holds and how its keys are built.

Keys are big-endian so that byte order is numeric order; a family keyed by ordinal starts
every key with the page's ordinal as a u64. This module and the rest of ``dupalign.store``
are the only code that builds a key.
"""

from __future__ import annotations

import struct

FAMILIES = (
    "meta",  # b"params" -> frozen engine parameters; b"idf/<version>" -> idf tables;
    # b"next_ordinal" -> the ordinal after the last one ever given (dupalign.stages.index);
    # b"lists_through" -> every page below has its inverted-list entries in ``oph``
    # (dupalign.passage.lists.files: the later pages' are read back from their forward records);
    # b"lists_entries" -> b"": the inverted lists' entries and runs are in ``oph`` (absent in a
    # list shard's store restored from its changelog: rebuilt from its forward records);
    # b"forward_windows" -> b"": the ``forward`` records are in the store (absent in a forward
    # stage's store restored from its changelog: rebuilt from ``positions`` and ``units``);
    # b"published/" ‖ topic ‖ partition -> an offset below which the Kafka worker published
    # every page's matches
    "docs",  # ordinal -> doc record (msgpack)
    "ids",  # doc id -> latest ordinal
    "replay",  # 16-byte hash of (doc id, body) -> ordinal ‖ how the body was read
    # (dupalign.text.tokens.reading; nothing after the ordinal in stores written before): a page
    # seen before
    "matches",  # ordinal -> the matches the page produced (msgpack), returned on replay
    "exact",  # content hash (16 B) ‖ ordinal -> b""
    "simhash",  # fingerprint ‖ ordinal -> b""
    "cws",  # ordinal -> K uint64 min-hashes of the page's word shingles (verification)
    "oph",  # bin ‖ min-hash value ‖ ordinal -> b"" or <u4 n: inverted lists of page
    # ordinals (the page has 1 or n windows in the list); bin ‖ min-hash value -> u64 n: the
    # list holds at least n entries (marks long lists); bin ‖ min-hash value ‖ ordinal ‖
    # 0xFFFFFFFF -> a run: every entry of the list up to that ordinal packed in one value,
    # varint deltas (dupalign.passage.index: packed when read)
    "forward",  # ordinal -> the page's windows: non-empty (bin, key, rectangle) and empty
    # (bin, l, r); with ``positions`` the page's forward record (dupalign.passage.forward)
    "positions",  # ordinal -> token character offsets (int32 starts, ends) and unit hashes
    "units",  # ordinal -> the high 32 bits of the page's unit hashes (<u4; the low ones are in
    # ``positions``): a forward stage rebuilds the page's ``forward`` record from them
    # (dupalign.passage.forward_units)
    "idf_pending",  # ordinal -> distinct token hashes, kept until the last idf freeze
    "offsets",  # topic ‖ partition -> next offset to consume
    "unfinished",  # ordinal -> the page's index result (dupalign.stages.index), until its matches
    # are stored: written with the page's index entries, finished (aligned) at open if a
    # crash came first
)

_U64 = struct.Struct(">Q")


def u64(value: int) -> bytes:
    return _U64.pack(value)


def read_u64(data: bytes, at: int = 0) -> int:
    return int(_U64.unpack_from(data, at)[0])


# Families read by prefix: the fixed key prefix that names one group (an inverted list is
# bin ‖ min-hash, 10 bytes). RocksDB keeps Bloom filters of these prefixes, so a seek to a
# list that does not exist (most lists a new page asks for) reads no data block
# (tests/bench/bench_store.py).
PREFIX_LENGTHS = {"oph": 10}
