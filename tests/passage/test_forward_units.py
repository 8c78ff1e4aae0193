"""A forward stage's ``forward`` records rebuilt from its ``positions`` and ``units``
(dupalign/passage/forward_units.py) are byte for byte the ones the sketch role sends
(``forward_value``): over random pages and passage configurations (every sketch mode, k,
shingle, tf mode), and for a ``Partitioned`` forward stage restored from its changelog, which
leaves them out, at random points of the random streams (revisits, deletes, sweeps). A
restored store that the stage has not opened yet lacks them (the check can fail)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig
from dupalign.near.idf import IdfTable
from dupalign.page import Page
from dupalign.passage import forward_units
from dupalign.passage.sketch import PassageSketcher
from dupalign.service.changelog import Changelog, decode_key
from dupalign.stages.forward_stage import DERIVED, ForwardStage, forward_value
from dupalign.stages.partitioned import Partitioned, Shape
from dupalign.stages.sketch import Sketcher
from dupalign.store import tables
from dupalign.store.database import Change, Store
from dupalign.store.keys import FAMILIES
from dupalign.wire.forward_record import decode_forward
from tests.reused_stores import temporary_stores
from tests.service.test_stage_partitions import CONFIG
from tests.stages.streams import SHARED_TEXTS, ops, pages_of, through

WORDS = [f"w{k}" for k in range(40)] + ["the", "of", "and"]
SHAPE = Shape(2, 2, 1, 2, 2)

configs = st.builds(
    lambda mode, k, shingle, tf, query_len: replace(EngineConfig(), passage=replace(
        EngineConfig().passage, mode=mode, k=k, shingle=shingle, tf_mode=tf,
        query_len=query_len, stride=max(1, query_len // 2), min_len=4)).validate(),
    st.sampled_from(["oph", "weighted_oph", "weighted"]), st.sampled_from([4, 16, 64, 128]),
    st.integers(1, 3), st.sampled_from(["log", "raw", "binary", "sqrt", "squared"]),
    st.sampled_from([8, 48]))
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=400).map(" ".join)


def record_of(config: EngineConfig, text: str) -> Any:
    sk = Sketcher(config).sketch(Page("p", text), IdfTable.uniform())
    raw = forward_value("p", sk.passage)
    return None if raw is None else decode_forward(raw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs, text=texts)
def test_the_windows_rebuilt_from_positions_and_units_are_the_ones_sent(
        config: EngineConfig, text: str) -> None:
    record = record_of(config, text)
    if record is None:
        return
    assert record.high is not None
    assert forward_units.rebuilt_windows(PassageSketcher(config), record.positions,
                                         record.high) == record.windows


def test_wide_positions_and_units_of_every_bit_rebuild_too() -> None:
    """A gap over 65,535 characters: the positions record of int32 offsets."""
    config = replace(EngineConfig(), passage=replace(EngineConfig().passage, min_len=4))
    text = " ".join(WORDS) + " " * 70_000 + " ".join(reversed(WORDS))
    record = record_of(config.validate(), text)
    assert record is not None and record.high is not None
    assert np.frombuffer(record.high, "<u4").max() >= 1 << 31  # (the top bit used)
    assert forward_units.rebuilt_windows(PassageSketcher(config), record.positions,
                                         record.high) == record.windows
    with pytest.raises(ValueError, match="high halves"):
        forward_units.page_units(record.positions, record.high[4:])


def stored(store: Store) -> dict[tuple[str, bytes], bytes]:
    return {(f, k): v for f in FAMILIES if store.has_family(f) for k, v in store.items(f)
            if (f, k) != ("meta", b"params")}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, cuts=st.sets(st.integers(0, 30)))
def test_a_forward_stage_restored_from_its_changelog_holds_the_same_records(
        stream: list[Any], cuts: set[int]) -> None:
    items = list(pages_of(stream, SHARED_TEXTS))
    params = CONFIG.frozen_params()
    with temporary_stores("forward-changelog-") as stores:
        logs: dict[str, Changelog] = {}

        def store(name: str) -> Store:
            s = stores.store(name, params)
            if name == "forward":
                logs[name] = Changelog(s, "changelog", 0, leave_out=DERIVED)
            return s

        p = Partitioned(CONFIG, SHAPE, store)
        committed: list[Change] = []
        for at in through(p, items, cuts):
            committed += [(*decode_key(o.key or b""), o.value)
                          for o in logs["forward"].outgoing()]
            live = p.forward.store
            fresh = stores.store(f"restored-{at}", params)
            fresh.apply(committed)
            want = stored(live)
            assert not any(DERIVED(f, k) for f, k in stored(fresh))
            if dict(tables.forward.items(live)):
                assert stored(fresh) != want
            ForwardStage(fresh, CONFIG)
            assert stored(fresh) == want
            assert ForwardStage(fresh, CONFIG).rebuilt == 0  # (the key says they are in)


def test_an_older_layouts_records_stay_and_removed_pages_records_go() -> None:
    """A store of the layout before (forward records without units, from a changelog that
    kept them and not their tombstones): a page's record without units stays, one without
    positions goes."""
    record = record_of(CONFIG, SHARED_TEXTS[0])
    assert record is not None and record.high is not None
    with temporary_stores("forward-older-") as stores:
        s = stores.store("older", CONFIG.frozen_params())
        for o in (1, 2, 3):
            tables.forward.put(s, o, record.windows)
        for o in (2, 3):
            tables.positions.put(s, o, record.positions)
        tables.units.put(s, 3, record.high)
        tables.forward.put(s, 3, b"stale")
        assert ForwardStage(s, CONFIG).rebuilt == 1
        assert dict(tables.forward.items(s)) == {2: record.windows, 3: record.windows}
