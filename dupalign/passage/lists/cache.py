"""Recently read inverted lists of the passage index, kept in memory in numba arrays.

A page's query names a few hundred distinct inverted lists (bin, min-hash), many of them
read again by later pages, and every new page appends its windows to the lists it shares.
Kept as Python objects this bookkeeping cost more than the alignment itself (~600 bytes and
several microseconds per list); here one kernel call looks up all the lists of a page, one
inserts the lists read from the store, and one appends a page's windows.

Layout: an arena of entries (page ordinals, 8 bytes: the windows themselves are in the
pages' forward records, dupalign.passage.forward) in which every cached list owns a contiguous
run, sorted by ordinal as in the store (appends come from later pages, so the order
holds); a list that outgrows its run moves to the arena's end with twice the room.
An open-addressing hash table (linear probing, one row of two int64 per entry: the key,
and slot << 16 | bin) maps (bin, key) to the list's slot: a numba typed dict cost about
0.5 µs per lookup at a million lists, a probe here is mostly one cache miss. Stop lists are
kept as a flag only; which list is one is the passage index's decision (``mark_long``), made
when a query reads the list, never here: appends only append, so the decision does not
depend on which lists happen to be in memory (dupalign.passage.index, "stop lists").

Slots stay valid until ``trim``: lookups and inserts only grow the arrays, so a query can
use the slots it got. ``trim`` (called after a page is committed) drops the least recently
used half of the lists while the bytes in use exceed the budget, and compacts the arena.

The budget bounds the arrays' room, not only the bytes in use: what a process keeps
resident is what its arrays once touched. Arrays double while the budget has room for it,
and grow only by what they need (at least an eighth) beyond; ``trim`` then also shrinks
them back within the budget (``_fit``). Doubling alone let the room reach twice the bytes
in use: 138 → 276 MB at once under a 352 MB budget (docs/performance/memory.md).

Invariant (tested against the store): every cached list equals the store's list.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Bools = npt.NDArray[np.bool_]

ENTRY_BYTES = 8  # a page ordinal (one per window of the page in the list)
# slot arrays + hash table rows (a power of two, at least half empty: up to 4 rows a slot)
SLOT_BYTES = 8 * 6 + 4 * 16
LONG = -1  # s_len of a list known to be long
_SLOT_ARRAYS = ("s_start", "s_len", "s_cap", "s_used", "s_bin", "s_key")
EMPTY = -1  # hash table row not in use (its second column)
BIN_BITS = 16  # bins (OPH) and hash functions (MonoActive) number at most 1024
MIN_SLOTS, MIN_ROWS = 1 << 10, 1 << 12  # the arrays' smallest room
# bytes of the arrays at their smallest: a budget below this is held to this
MIN_BYTES = MIN_SLOTS * 8 * len(_SLOT_ARRAYS) + 2 * MIN_SLOTS * 16 + MIN_ROWS * ENTRY_BYTES


class ListCache:
    """In-memory inverted lists under a byte budget (see the module docstring)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.clear()

    def clear(self) -> None:
        """Forget every list."""
        self.clock = 0
        self.s_start = np.zeros(MIN_SLOTS, dtype=np.int64)
        self.s_len = np.zeros(MIN_SLOTS, dtype=np.int64)
        self.s_cap = np.zeros(MIN_SLOTS, dtype=np.int64)
        self.s_used = np.zeros(MIN_SLOTS, dtype=np.int64)
        self.s_bin = np.zeros(MIN_SLOTS, dtype=np.int64)
        self.s_key = np.zeros(MIN_SLOTS, dtype=np.int64)
        self.n_slots = 0
        self.table = np.full((2 * MIN_SLOTS, 2), EMPTY, dtype=np.int64)
        self.ords = np.zeros(MIN_ROWS, dtype=np.int64)
        self.end = 0  # arena rows in use (including runs of dropped or moved lists)

    def __len__(self) -> int:
        return self.n_slots

    def reset(self) -> None:
        """Forget every list, keeping the arrays' room (``clear`` starts them small)."""
        self.n_slots = self.end = self.clock = 0
        self.table[:, 1] = EMPTY

    @property
    def bytes_used(self) -> int:
        return self.end * ENTRY_BYTES + self.n_slots * SLOT_BYTES

    @property
    def nbytes(self) -> int:
        """Bytes the arrays hold (their room, not only what is in use): what memory sees."""
        return sum(getattr(self, a).nbytes for a in (*_SLOT_ARRAYS, "table", "ords"))

    def lookup(self, bins: I64, keys: U64, touch: bool = True) -> I64:
        """Slot of each list (bin, key), or -1 if not cached; with ``touch``, marks hits as
        recently used."""
        self.clock += touch
        return _lookup(self.table, self.s_used, bins, keys.view(np.int64),
                       self.clock if touch else -1)

    def is_long(self, slots: I64) -> Bools:
        return (slots >= 0) & (self.s_len[np.maximum(slots, 0)] == LONG)

    def mark_long(self, slots: I64) -> None:
        """Turn the cached lists ``slots`` into stop-list flags (their entries are dropped)."""
        self.s_start[slots], self.s_len[slots], self.s_cap[slots] = 0, LONG, 0

    def insert(self, bins: I64, keys: U64, long: Bools, off: I64, ords: I64) -> I64:
        """Cache lists read from the store: rows ``off[x]:off[x + 1]`` of ``ords``, or
        only the flag where ``long``. Returns their slots."""
        self._reserve(len(bins), int(off[-1]) + len(bins))
        self.clock += 1
        slots, self.n_slots, self.end = _insert(
            self.table, self.s_bin, self.s_key, self.s_start, self.s_len, self.s_cap,
            self.s_used, self.n_slots, self.ords, self.end, bins,
            keys.view(np.int64), long, off, ords, self.clock)
        return slots

    def reserve_rows(self, n: int) -> None:
        """Room for ``n`` more rows in the arena (``append_to`` then never fails)."""
        self._reserve(0, n)

    def append_page(self, bins: I64, keys: U64, ordinal: int) -> None:
        """Append a page's windows (one entry per window) to the cached lists they belong to
        (not to stop-list flags)."""
        self.append_slots(self.lookup(bins, keys, touch=False), ordinal)

    def append_slots(self, slots: I64, ordinal: int) -> None:
        """``append_page`` with the windows' lists already looked up: ``slots[x]`` is the
        slot of window x's list (-1: not cached), valid since no trim or clear came between
        (the same appends, in the same order, without the hash table)."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        x = 0
        while x < len(slots):
            self.end, x = _append_slots(self.s_start, self.s_len, self.s_cap, self.ords,
                                        self.end, slots, ordinal, x)
            if x < len(slots):  # a run could not move: more room, then go on from x
                need = self.end + max(2 * int(self.s_len[slots[x]]), 2)
                self._grow_arena(self._grown(len(self.ords), need, ENTRY_BYTES))

    def remove_entries(self, bins: I64, keys: U64, ordinals: I64) -> None:
        """Remove the entries of pages ``ordinals`` (ascending) from the cached lists among
        (bin, key), in place: each stays equal to the store's list after the removal. A
        stop list stays one (as its mark in the store does)."""
        _remove(self.table, self.s_start, self.s_len, self.ords,
                np.ascontiguousarray(bins, dtype=np.int64),
                np.ascontiguousarray(keys, dtype=np.uint64).view(np.int64),
                np.ascontiguousarray(ordinals, dtype=np.int64))

    def entries(self, slot: int) -> I64:
        """A cached list's ordinals (a view; valid until the next ``trim``)."""
        a, n = int(self.s_start[slot]), int(self.s_len[slot])
        return self.ords[a : a + n]

    def trim(self) -> None:
        """Keep the bytes in use within the budget: compact, then drop the least recently
        used half of the lists until at most 3/4 of it is used (so that compactions stay
        rare). Invalidates slots."""
        if self.bytes_used <= self.budget and self.nbytes <= max(self.budget, MIN_BYTES):
            return
        self._compact(np.ones(self.n_slots, dtype=np.bool_))
        while self.n_slots and (4 * self.bytes_used > 3 * self.budget
                                or self._least_room() > max(self.budget, MIN_BYTES)):
            # the more recently used half (by rank: many lists share one clock value)
            keep = np.zeros(self.n_slots, dtype=np.bool_)
            order = np.argsort(self.s_used[: self.n_slots], kind="stable")
            keep[order[(self.n_slots + 1) // 2 :]] = True  # drops at least one
            self._compact(keep)
        self._fit()

    # -- arrays -----------------------------------------------------------------------------
    def _grown(self, have: int, need: int, item_bytes: int) -> int:
        """New length of an array of ``have`` items that must hold ``need``: twice as long
        while the budget has room for it, else what it needs, and at least an eighth more
        (so that a page's appends past the budget do not copy the arena each time)."""
        spare = max(0, self.budget - self.nbytes) // item_bytes
        return max(need, min(2 * have, have + spare), have + have // 8)

    def _resize_slots(self, n: int) -> None:
        for name in _SLOT_ARRAYS:
            old = getattr(self, name)
            new = np.zeros(n, dtype=old.dtype)
            new[: self.n_slots] = old[: self.n_slots]
            setattr(self, name, new)

    def _new_table(self, size: int) -> None:
        self.table = np.full((size, 2), EMPTY, dtype=np.int64)
        _fill(self.table, self.s_bin, self.s_key, self.n_slots)

    def _reserve(self, new_slots: int, new_rows: int) -> None:
        if self.n_slots + new_slots > len(self.s_start):
            self._resize_slots(self._grown(len(self.s_start), self.n_slots + new_slots,
                                           8 * len(_SLOT_ARRAYS)))
        if 2 * (self.n_slots + new_slots) > len(self.table):  # keep the table half empty
            size = len(self.table)
            while 2 * (self.n_slots + new_slots) > size:
                size *= 2
            self._new_table(size)
        if self.end + new_rows > len(self.ords):
            self._grow_arena(self._grown(len(self.ords), self.end + new_rows, ENTRY_BYTES))

    def _grow_arena(self, n: int) -> None:
        # written through at once: the room the budget counts is then resident from the
        # start, so RSS follows the budget, not the arena's slow fill (a calloc'd arena's
        # pages became resident over 50,000 pages as runs first reached them)
        ords = np.empty(n, dtype=np.int64)
        ords[: self.end] = self.ords[: self.end]
        ords[self.end :] = 0
        self.ords = ords

    def _least_sizes(self) -> tuple[int, int, int]:
        """The smallest room for what is held: slots, table rows, arena rows."""
        slots = max(MIN_SLOTS, self.n_slots)
        size = 2 * MIN_SLOTS
        while size < 2 * slots:
            size *= 2
        return slots, size, max(MIN_ROWS, self.end)

    def _least_room(self) -> int:
        slots, size, rows = self._least_sizes()
        return slots * 8 * len(_SLOT_ARRAYS) + size * 16 + rows * ENTRY_BYTES

    def _fit(self) -> None:
        """Shrink the arrays' room to the budget (after a compaction: the arena's rows in
        use are its live runs); the arena takes what the slots leave."""
        if self.nbytes <= max(self.budget, MIN_BYTES):
            return
        slots, size, rows = self._least_sizes()
        if slots < len(self.s_start):
            self._resize_slots(slots)
        if size < len(self.table):
            self._new_table(size)
        rows = max(rows, (self.budget - (self.nbytes - self.ords.nbytes)) // ENTRY_BYTES)
        if rows < len(self.ords):
            self._grow_arena(rows)

    def _compact(self, keep: Bools) -> None:
        self.n_slots, self.end = _compact(self.s_start, self.s_len, self.s_cap, self.s_used,
                                          self.s_bin, self.s_key, self.n_slots, self.ords,
                                          keep)
        self.table[:, 1] = EMPTY
        _fill(self.table, self.s_bin, self.s_key, self.n_slots)


@njit(cache=True)
def probe(table: I64, b: int, key: int) -> tuple[int, int]:
    """``(slot, row)`` of the list (b, key), or ``(-1, free row)`` if it is not in the table."""
    mask = table.shape[0] - 1
    h = (np.uint64(key) ^ (np.uint64(b) * np.uint64(0x9E3779B97F4A7C15))) * np.uint64(
        0xBF58476D1CE4E5B9)
    i = np.int64(h >> np.uint64(32)) & mask
    while True:
        v = table[i, 1]
        if v == EMPTY:
            return -1, i
        if table[i, 0] == key and (v & ((1 << BIN_BITS) - 1)) == b:
            return v >> BIN_BITS, i
        i = (i + 1) & mask


@njit(cache=True)
def _fill(table: I64, s_bin: I64, s_key: I64, n_slots: int) -> None:
    """Put slots ``0..n_slots-1`` into an empty table."""
    for s in range(n_slots):
        _, i = probe(table, s_bin[s], s_key[s])
        table[i, 0] = s_key[s]
        table[i, 1] = (s << BIN_BITS) | s_bin[s]


@njit(cache=True)
def _lookup(table: I64, s_used: I64, bins: I64, keys: I64, clock: int) -> I64:
    out = np.full(bins.shape[0], -1, dtype=np.int64)
    for x in range(bins.shape[0]):
        s, _ = probe(table, bins[x], keys[x])
        if s >= 0:
            out[x] = s
            if clock >= 0:
                s_used[s] = clock
    return out


@njit(cache=True)
def _insert(
    table: I64, s_bin: I64, s_key: I64, s_start: I64, s_len: I64, s_cap: I64, s_used: I64,
    n_slots: int, a_ord: I64, end: int, bins: I64, keys: I64, long: Bools,
    off: I64, ords: I64, clock: int,
) -> tuple[I64, int, int]:  # fmt: skip
    out = np.empty(bins.shape[0], dtype=np.int64)
    for x in range(bins.shape[0]):
        s, i = probe(table, bins[x], keys[x])
        if s < 0:
            s = n_slots
            n_slots += 1
            s_bin[s], s_key[s] = bins[x], keys[x]
            table[i, 0] = keys[x]
            table[i, 1] = (s << BIN_BITS) | bins[x]
        out[x] = s
        s_used[s] = clock
        if long[x]:
            s_start[s], s_len[s], s_cap[s] = 0, LONG, 0
            continue
        n = off[x + 1] - off[x]
        s_start[s], s_len[s], s_cap[s] = end, n, n + 1  # room for one append in place
        for r in range(n):
            a_ord[end + r] = ords[off[x] + r]
        end += n + 1
    return out, n_slots, end


@njit(cache=True)
def _append_slots(
    s_start: I64, s_len: I64, s_cap: I64, a_ord: I64, end: int, slots: I64, ordinal: int,
    x0: int,
) -> tuple[int, int]:  # fmt: skip
    """Appends windows x0.. (``slots[x]``: window x's list, -1 if not cached) and returns
    (new end, next x): next x is below ``len(slots)`` when the arena has no room to move
    a run (grow it and go on)."""
    for x in range(x0, slots.shape[0]):
        s = slots[x]
        if s < 0 or s_len[s] == LONG:
            continue
        moved = append_to(s, s_start, s_len, s_cap, a_ord, end, ordinal)
        if moved < 0:
            return end, x
        end = moved
    return end, slots.shape[0]


@njit(cache=True)
def append_to(s: int, s_start: I64, s_len: I64, s_cap: I64, a_ord: I64, end: int,
               ordinal: int) -> int:
    """Append ``ordinal`` to the list in slot ``s`` (a full run moves to the arena's end
    with twice the room); the arena's new end, or -1 if it has no room for the move."""
    n = s_len[s]
    if n == s_cap[s]:
        cap = max(2 * n, 2)
        if end + cap > a_ord.shape[0]:
            return -1
        for r in range(n):
            a_ord[end + r] = a_ord[s_start[s] + r]
        s_start[s], s_cap[s] = end, cap
        end += cap
    a_ord[s_start[s] + n] = ordinal
    s_len[s] = n + 1
    return end


@njit(cache=True)
def _compact(
    s_start: I64, s_len: I64, s_cap: I64, s_used: I64, s_bin: I64, s_key: I64, n_slots: int,
    a_ord: I64, keep: Bools,
) -> tuple[int, int]:  # fmt: skip
    """Keep the slots in ``keep``: renumber them densely and move their runs to the arena's
    front in arena order (a run only moves towards the front: copying in place is safe).
    The caller refills the hash table."""
    order = np.argsort(s_start[:n_slots], kind="mergesort")
    new_slot = np.full(n_slots, -1, dtype=np.int64)
    n_new = 0
    end = 0
    for s in order:
        if not keep[s]:
            continue
        n = s_len[s]
        if n != LONG:
            a = s_start[s]
            for r in range(n):
                a_ord[end + r] = a_ord[a + r]
            s_start[s] = end
            s_cap[s] = n
            end += n
        new_slot[s] = n_new
        n_new += 1
    st, ln, cp, us = s_start.copy(), s_len.copy(), s_cap.copy(), s_used.copy()
    bn, ky = s_bin.copy(), s_key.copy()
    for s in range(n_slots):
        t = new_slot[s]
        if t >= 0:
            s_start[t], s_len[t], s_cap[t], s_used[t] = st[s], ln[s], cp[s], us[s]
            s_bin[t], s_key[t] = bn[s], ky[s]
    return n_new, end


@njit(cache=True)
def _remove(table: I64, s_start: I64, s_len: I64, a_ord: I64, bins: I64, keys: I64,
            dead: I64) -> None:
    for x in range(bins.shape[0]):
        s, _ = probe(table, bins[x], keys[x])
        if s < 0 or s_len[s] == LONG:
            continue
        a, n, w = s_start[s], s_len[s], 0
        for r in range(n):
            o = a_ord[a + r]
            i = np.searchsorted(dead, o)
            if i < dead.shape[0] and dead[i] == o:
                continue
            a_ord[a + w] = o
            w += 1
        s_len[s] = w
