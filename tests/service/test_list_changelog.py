"""A list shard's store restored from its changelog, which leaves out the lists' entries and
runs (``lists.derived``; dupalign/service/roles/stage_lists.py), holds the same lists as the
store it was kept from once the shard opens it (``rebuild_entries``, from the forward
records): at random points of the random streams (revisits, deletes, sweeps), with stop
lists and packed runs, every list's long mark and entries (a page once per window), every
key the changelog keeps, and at the end every list's heads as a query reads them. A
restored store that the shard has not opened yet lacks entries the live one has (the
check can fail). A store restored from a changelog of the layout before (every key) has its
entries and runs replaced by the rebuilt ones."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dupalign.page import Page
from dupalign.passage.lists.cache import ListCache
from dupalign.service.changelog import Changelog, decode_key
from dupalign.stages.list_shard import ListShard, copy_heads
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.store import lists, tables
from dupalign.store.database import Change, Store
from dupalign.store.keys import FAMILIES, read_u64
from tests.reused_stores import temporary_stores
from tests.service.test_stage_partitions import CONFIG
from tests.stages.streams import SHARED_TEXTS, ops, pages_of, through
from tests.stages.test_list_shard import STOPS

SHAPE = Shape(2, 2, 1, 2, 2)
Item = tuple[int, Page | tuple[int, int]]
Lists = dict[bytes, tuple[int | None, list[int]]]  # prefix -> (long mark, entry ordinals)


def lists_of(store: Store) -> Lists:
    """Every list of the store: its long mark (None: none) and its entries' ordinals,
    ascending, a page once per window (from its run and its own keys alike)."""
    marks: dict[bytes, int] = {}
    ords: dict[bytes, list[int]] = defaultdict(list)
    for key, value in store.items(lists.FAMILY):
        prefix = key[:10]
        if len(key) == 10:
            marks[prefix] = read_u64(value)
        elif key.endswith(lists.RUN_SEQ):
            ords[prefix] += lists.decode_run(np.frombuffer(value, dtype=np.uint8)).tolist()
        else:
            n = 1 if not value else lists.COUNT.unpack(value)[0]
            ords[prefix] += [read_u64(key, 10)] * n
    return {p: (marks.get(p), sorted(ords.get(p, []))) for p in {*marks, *ords}}


def kept(store: Store) -> dict[tuple[str, bytes], bytes]:
    """What the changelog keeps of the store: every key but the derived ones."""
    return {(f, k): v for f in FAMILIES if store.has_family(f) for k, v in store.items(f)
            if not lists.derived(f, k) and (f, k) != ("meta", b"params")}


def heads(shard: ListShard, prefixes: list[bytes]) -> list[Any]:
    """The lists ``prefixes`` as a query after every page reads them."""
    bins, keys = lists.names(prefixes)
    long, start, n, ords = shard.passages.list_heads(bins, keys, 1 << 40)
    return [long.tolist(), n.tolist(), copy_heads(start, n, ords).tolist()]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, max_list=st.sampled_from([2, 5, 40]), cuts=st.sets(st.integers(0, 30)),
       cached=st.booleans())
@example(STOPS, 2, {2, 4, 5}, False)  # (stop lists)
@example(STOPS, 40, {3, 5}, False)  # (runs)
def test_a_list_shard_restored_from_its_changelog_holds_the_same_lists(
        stream: list[Any], max_list: int, cuts: set[int], cached: bool) -> None:
    """(``cached``: the list cache of the default size; else none, so that every query reads
    its lists from the store, and packs them into runs)"""
    check(list(pages_of(stream, SHARED_TEXTS)), max_list, cuts, cached)


def test_a_page_with_several_windows_in_a_list_is_restored_as_often() -> None:
    repeated = " ".join(["alpha beta gamma delta epsilon"] * 4)
    texts = [repeated, repeated + " zeta", SHARED_TEXTS[2], "zeta " + repeated]
    items: list[Item] = [(o, Page(f"d{o}", text)) for o, text in enumerate(texts)]
    lists_seen = check(items, 40, {1, 2}, False)
    assert any(len(o) > len(set(o)) for _, o in lists_seen.values())


def check(items: list[Item], max_list: int, cuts: set[int],
          cached: bool) -> Lists:
    """The pipeline on ``items``, each list shard's store restored after the items ``cuts``
    and the last one, and compared; the lists of every shard at the end."""
    config = replace(CONFIG, passage=replace(CONFIG.passage, max_list=max_list)).validate()
    params = config.frozen_params()
    with temporary_stores("list-changelog-") as stores:
        logs: dict[str, Changelog] = {}

        def store(name: str) -> Store:
            s = stores.store(name, params)
            if name.startswith("lists"):
                logs[name] = Changelog(s, "changelog", 0, leave_out=lists.derived)
            return s

        p = Partitioned(config, SHAPE, store)
        for shard, _ in p.lists:
            shard.passages.pack_min = 2  # (runs on these short lists)
            if not cached:
                shard.passages.cache = ListCache(0)
        committed: dict[int, list[Change]] = defaultdict(list)
        restores = 0
        for at in through(p, items, cuts):
            for k, (live, _) in enumerate(p.lists):
                committed[k] += [(*_decoded(o.key), o.value)
                                 for o in logs[f"lists{k}"].outgoing()]
                fresh = stores.store(f"restored{k}-{restores}", params)
                restores += 1
                fresh.apply(committed[k])
                want = lists_of(live.store)
                if any(o for _, o in want.values()):  # (the entries came back from elsewhere)
                    assert lists_of(fresh) != want
                assert all(not o for _, o in lists_of(fresh).values())
                restored = ListShard(fresh, config, k, SHAPE.lists)
                assert lists_of(fresh) == want
                assert kept(fresh) == kept(live.store)
                assert tables.lists_entries.get(fresh) is not None
                if at == len(items) - 1 and want:
                    named = sorted(want)
                    assert heads(restored, named) == heads(live, named)
                # a changelog of the layout before (every key but ``lists_entries``): its
                # entries and runs go, the forward records' come instead, none twice
                older = stores.store(f"older{k}-{restores}", params)
                older.apply([(f, key, v) for f in FAMILIES if live.store.has_family(f)
                             for key, v in live.store.items(f)
                             if (f, key) not in (("meta", b"params"),
                                                 ("meta", tables.lists_entries.key))])
                ListShard(older, config, k, SHAPE.lists)
                assert lists_of(older) == want
        return {k: v for shard, _ in p.lists for k, v in lists_of(shard.store).items()}


def _decoded(key: bytes | None) -> tuple[str, bytes]:
    assert key is not None
    return decode_key(key)
