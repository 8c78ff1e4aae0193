"""The sticky co-partitioned assignment (dupalign.service.sticky): its properties against a
brute-force twin (every balanced co-partitioned assignment tried: none keeps more claimed
slots with their claimers), aiokafka's range assignor's answer when nobody claims anything,
and a group's rebalances played through aiokafka's own protocol structs: an owner keeps its
partitions as members join, a standby takes them when it leaves, a stale claim loses."""

from __future__ import annotations

import inspect
import itertools
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance, GroupCoordinator
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.service.sticky import (
    Claim,
    Partition,
    StickyAssignor,
    assign,
    claim_path,
    decode_claim,
    leaving,
    sticky,
)

TOPICS = ("a", "b", "c")


class Counts:
    """The one thing an assignor reads of aiokafka's cluster metadata."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return None if n is None else set(range(n))


@st.composite
def groups(draw: Any, same_topics: bool = True) -> tuple[dict[str, Claim], dict[str, int]]:
    counts = draw(st.dictionaries(st.sampled_from(TOPICS), st.integers(1, 5), min_size=1))
    every = [(t, p) for t, n in counts.items() for p in range(n)]
    ids = draw(st.lists(st.sampled_from("mnopq"), min_size=1, max_size=3, unique=True))
    members = {}
    for m in ids:
        topics = frozenset(counts) if same_topics else frozenset(
            draw(st.sets(st.sampled_from(TOPICS), min_size=1)))
        owned = draw(st.sets(st.sampled_from([*every, ("gone", 0)])))
        members[m] = Claim(topics, frozenset(owned), draw(st.integers(-1, 3)))
    return members, counts


def winners(members: dict[str, Claim], counts: dict[str, int]) -> dict[int, str]:
    """Slot -> the member whose claim on it wins: the newest epoch, then the least id."""
    out: dict[int, str] = {}
    for slot in range(max(counts.values())):
        claimers = [m for m, c in members.items()
                    if any(t in c.topics and p == slot and p < counts.get(t, 0)
                           for t, p in c.owned)]
        if claimers:
            out[slot] = min(claimers, key=lambda m: (-members[m].epoch, m))
    return out


def slots_of(given: dict[str, list[Partition]]) -> dict[str, set[int]]:
    return {m: {p for _, p in parts} for m, parts in given.items()}


@settings(max_examples=400, deadline=None)
@given(groups())
def test_every_partition_once_co_partitioned_balanced_and_as_many_kept_as_any_could(
        group: tuple[dict[str, Claim], dict[str, int]]) -> None:
    members, counts = group
    got = assign(members, counts)
    every = sorted((t, p) for t, n in counts.items() for p in range(n))
    assert sorted(tp for parts in got.values() for tp in parts) == every
    n_slots = max(counts.values())
    slots = slots_of(got)
    for m, parts in got.items():  # a member's slot: that partition of every topic
        assert sorted(parts) == sorted((t, s) for s in slots[m] for t in counts
                                       if s < counts[t])
    sizes = [len(s) for s in slots.values()]
    assert max(sizes) - min(sizes) <= 1
    win = winners(members, counts)
    kept = {m: sum(1 for s in slots[m] if win.get(s) == m) for m in members}
    claimed = {m: sum(1 for w in win.values() if w == m) for m in members}
    for m in members:  # a claimer keeps what its quota allows
        assert kept[m] == min(claimed[m], len(slots[m]))
    # the twin: every balanced map of slots to members; none keeps more
    ids = sorted(members)
    best = max(sum(1 for s, m in enumerate(choice) if win.get(s) == m)
               for choice in itertools.product(ids, repeat=n_slots)
               if max(choice.count(m) for m in ids) - min(choice.count(m) for m in ids) <= 1)
    assert sum(kept.values()) == best
    # deterministic: the same members listed in another order
    assert assign(dict(reversed(list(members.items()))), dict(reversed(counts.items()))) == got


@settings(max_examples=300, deadline=None)
@given(groups(same_topics=False))
def test_members_with_other_topics_get_each_partition_once_from_their_own_topics(
        group: tuple[dict[str, Claim], dict[str, int]]) -> None:
    members, counts = group
    got = assign(members, counts)
    subscribed = {t for c in members.values() for t in c.topics}
    every = sorted((t, p) for t, n in counts.items() if t in subscribed for p in range(n))
    assert sorted(tp for parts in got.values() for tp in parts) == every
    for m, parts in got.items():
        assert all(t in members[m].topics for t, _ in parts)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.sets(st.sampled_from(TOPICS), min_size=1),
       st.lists(st.text("xyz0123", min_size=1, max_size=6), min_size=1, max_size=5,
                unique=True))
def test_without_claims_it_is_the_range_assignors_assignment(
        n: int, topics: set[str], ids: list[str]) -> None:
    counts = {t: n for t in topics}
    got = assign({m: Claim(frozenset(topics)) for m in ids}, counts)
    md = {m: ConsumerProtocolMemberMetadata(0, sorted(topics), b"") for m in ids}
    ranged = RangePartitionAssignor.assign(Counts(counts), md)
    assert got == {m: sorted(a.partitions()) for m, a in ranged.items()}


@given(st.binary(max_size=64))
def test_a_claim_it_cannot_read_claims_nothing(data: bytes) -> None:
    claim = decode_claim(["t"], data)
    assert claim.topics == {"t"}


class Group:
    """A consumer group's rebalances as aiokafka runs them, minus the broker: every member's
    metadata encoded and decoded, the leader's ``assign``, each member's ``on_assignment``."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics
        self.members: dict[str, StickyAssignor] = {}

    def join(self, prefix: str, path: Path | None = None) -> str:
        """A process starting (``path``: its claim file, from its state directory)."""
        member = f"{prefix}-{uuid.uuid4()}"  # aiokafka's member ids: client id, random
        self.members[member] = StickyAssignor(path)
        return member

    def rebalance(self) -> dict[str, list[Partition]]:
        md = {m: ConsumerProtocolMemberMetadata.decode(a.metadata(set(self.topics)).encode())
              for m, a in self.members.items()}
        leader = self.members[next(iter(self.members))]
        out = leader.assign(Counts(self.topics), md)
        for m, a in self.members.items():
            a.on_assignment(ConsumerProtocolMemberAssignment.decode(out[m].encode()))
        return {m: a.owned for m, a in self.members.items()}


def test_the_owner_keeps_the_shard_as_standbys_join_and_a_standby_takes_it_when_it_leaves(
        ) -> None:
    group = Group({"sequence": 1, "sketches": 1, "aligned": 1})
    owner = group.join("z")  # sorts last: the range assignor gives the shard to any newcomer
    shard = [("aligned", 0), ("sequence", 0), ("sketches", 0)]
    assert group.rebalance()[owner] == shard
    for _ in range(3):
        standby = group.join("a")
        got = group.rebalance()
        assert got[owner] == shard and got[standby] == []
        del group.members[standby]
        assert group.rebalance()[owner] == shard
    standby = group.join("a")
    group.rebalance()
    del group.members[owner]
    assert group.rebalance()[standby] == shard
    # a member expelled (stopped past its session) while the group moved its shard on
    # comes back claiming it: the newer claim wins (the stale one sorts first)
    group.join("z")
    group.rebalance()
    expelled = group.members.pop(standby)
    owner = next(iter(group.members))
    assert group.rebalance()[owner] == shard
    group.members[standby] = expelled
    got = group.rebalance()
    assert got[owner] == shard and got[standby] == []


def test_a_group_settles_its_subscriptions_change_only_with_its_assignment() -> None:
    """The broker rebalances the whole group when a member rejoins with another subscription
    than it had, and aiokafka rejoins after some assignments: once members have what they
    claimed, another rebalance must leave every member's subscription as it was."""
    group = Group({"align": 4})
    for prefix in "bcad":
        group.join(prefix)
        group.rebalance()
        before = {m: a.metadata(["align"]).encode() for m, a in group.members.items()}
        group.rebalance()
        assert {m: a.metadata(["align"]).encode() for m, a in group.members.items()} == before


def test_a_joining_member_takes_only_the_surplus() -> None:
    group = Group({"keys": 4})
    first, second = group.join("b"), group.join("c")
    before = group.rebalance()
    third = group.join("a")
    after = group.rebalance()
    assert len(after[third]) == 1
    for m in (first, second):
        assert len(set(before[m]) & set(after[m])) == len(after[m]) >= 1


def test_one_strategy_only_since_aiokafka_joins_once_per_strategy_offered() -> None:
    """aiokafka sends a JoinGroup per strategy, each listing one more: a member offering two
    changes its protocols mid-join, and the broker rebalances the group again (a topology
    run: ~1500 rebalances in 5 minutes, 'Updating metadata for member ... during
    CompletingRebalance'). Fails once aiokafka joins once: then a fallback (the range or
    round-robin strategy of older versions) could let a rolling upgrade mix versions."""
    join = inspect.getsource(CoordinatorGroupRebalance.perform_group_join)
    loop = join[join.index("for assignor in self._assignors:"):]
    assert "JoinGroupRequest(" in loop[:loop.index("if error_type is Errors.NoError")]
    assert len(sticky()) == 1


def test_aiokafka_calls_the_assignors_it_is_given_on_the_objects_themselves() -> None:
    """The assignor is an instance per consumer (it remembers its consumer's partitions):
    aiokafka only reads ``name`` and calls ``metadata``, ``assign`` and ``on_assignment`` on
    the objects in ``partition_assignment_strategy``. Fails if that changes."""
    join = inspect.getsource(CoordinatorGroupRebalance.perform_group_join)
    assert "for assignor in self._assignors:" in join
    assert "metadata = assignor.metadata(topics)" in join
    assert "group_protocol = (assignor.name, metadata)" in join
    lookup = inspect.getsource(GroupCoordinator._lookup_assignor)
    assert "if assignor.name == name:" in lookup
    assert "assignor.assign(self._cluster, member_metadata)" in inspect.getsource(
        GroupCoordinator._perform_assignment)
    assert "assignor.on_assignment(assignment)" in inspect.getsource(
        GroupCoordinator._on_join_complete)


def test_a_claim_let_go_goes_to_its_other_claimer_with_room() -> None:
    """A member restarted with its claim on slot 0 (epoch 1) finds the other member holding
    both slots (epoch 2, given while it was down): the newer claim wins, and the winner,
    over its quota, lets go of the slot the restarted one claims, not of its own."""
    t = frozenset({"t"})
    got = assign({"a": Claim(t, frozenset({("t", 0), ("t", 1)}), 2),
                  "b": Claim(t, frozenset({("t", 0)}), 1)}, {"t": 2})
    assert got == {"a": [("t", 1)], "b": [("t", 0)]}


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6), st.data())
def test_a_member_back_with_a_stale_claim_gets_a_slot_from_an_owner_over_its_share(
        n: int, data: st.DataObject) -> None:
    """The group moved on while a member was down: the others own every slot (claims apart,
    a newer epoch). Back with its stale claim, it gets one of the slots it claims whenever
    one of their owners holds more than its share (which it must let go of)."""
    k = data.draw(st.integers(1, n - 1))  # the others
    owner = data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))  # by slot
    mine = data.draw(st.sets(st.integers(0, n - 1), min_size=1))
    t = frozenset({"t"})
    members = {f"o{i}": Claim(t, frozenset(("t", s) for s in range(n) if owner[s] == i), 2)
               for i in range(k)}
    members["r"] = Claim(t, frozenset(("t", s) for s in mine), 1)
    got = slots_of(assign(members, {"t": n}))
    if any(owner.count(owner[s]) > -(-n // (k + 1)) for s in mine):
        assert got["r"] & mine


def test_a_restarted_member_keeps_its_slot_against_members_joining_without_claims(
        tmp_path: Path) -> None:
    """The owner of the shard (its state in ``tmp_path``) restarts with a new member id,
    sorting last, as standbys without state join: its saved claim gets the shard back."""
    path = claim_path(tmp_path, "g-index")
    assert path is not None
    group = Group({"sequence": 1, "sketches": 1, "aligned": 1})
    owner = group.join("z", path)
    shard = [("aligned", 0), ("sequence", 0), ("sketches", 0)]
    assert group.rebalance()[owner] == shard
    group = Group(group.topics)  # the whole group restarts: nothing remembered but the file
    standbys = [group.join("a"), group.join("b")]
    owner = group.join("z", path)
    got = group.rebalance()
    assert got[owner] == shard and all(got[m] == [] for m in standbys)
    assert list(tmp_path.iterdir()) == [path]  # (no temporary file left)


def test_a_group_restarted_in_another_order_keeps_its_partitions(tmp_path: Path) -> None:
    """Every member restarts (new ids, which sort otherwise); one was already down, and the
    others held its partition at a newer epoch: each gets back the partitions it had."""
    group = Group({"align": 3, "forward": 3})
    paths = [tmp_path / f"{i}" / "claim.json" for i in range(3)]
    ids = [group.join(p, path) for p, path in zip("abc", paths, strict=True)]
    before = group.rebalance()
    had = {path: before[m] for m, path in zip(ids, paths, strict=True)}
    del group.members[ids[0]]  # down: the others take its slots
    group.rebalance()
    group = Group(group.topics)
    ids = [group.join(p, path) for p, path in zip("zyx", paths, strict=True)]
    after = group.rebalance()
    assert {path: after[m] for m, path in zip(ids, paths, strict=True)} == had


def test_a_stale_saved_claim_loses_to_a_newer_owners(tmp_path: Path) -> None:
    """The owner stops; a standby takes the shard over (a newer epoch) and keeps it when
    the old owner comes back with its saved claim."""
    path = tmp_path / "claim.json"
    group = Group({"sequence": 1, "sketches": 1})
    owner = group.join("a", path)
    standby = group.join("z")
    assert group.rebalance()[owner] != []
    del group.members[owner]
    assert group.rebalance()[standby] != []
    back = group.join("a", path)
    got = group.rebalance()
    assert got[standby] != [] and got[back] == []


def test_a_group_stopped_together_keeps_the_claims_it_had(tmp_path: Path) -> None:
    """Seen in CI: two members stopped together; the first to leave made the other, on its
    way out, take both partitions and save that claim, so at the restart it took its peer's
    partition. A member that stops (``leaving``) keeps the claim it had; one that does not
    (the check that this test can fail) saves the new one."""
    group = Group({"keys": 2})
    paths = [tmp_path / f"{i}" / "claim.json" for i in range(2)]
    a, b = (group.join(p, path) for p, path in zip("ab", paths, strict=True))
    before = group.rebalance()
    assert before[a] and before[b]
    for stopping in (True, False):
        leaving([group.members[a]] if stopping else [])
        del group.members[b]  # the first to leave
        assert sorted(group.rebalance()[a]) == [("keys", 0), ("keys", 1)]
        saved = StickyAssignor(paths[0]).owned
        assert (saved == before[a]) if stopping else len(saved) == 2
        group = Group(group.topics)
        a, b = (group.join(p, path) for p, path in zip("ab", paths, strict=True))
        group.rebalance()


@pytest.mark.parametrize("data", [b"", b"{", b"null", b"[1]", b'{"owned": {"t": 3}}',
                                  b'{"epoch": "x"}', b"\xff\xfe"])
def test_a_corrupt_claim_file_is_ignored_and_replaced(
        tmp_path: Path, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "claim.json"
    path.write_bytes(data)
    group = Group({"t": 2})
    with caplog.at_level(logging.WARNING, "dupalign.sticky"):
        member = group.join("b", path)
    assert "unreadable" in caplog.text
    assert (group.members[member].owned, group.members[member].epoch) == ([], -1)
    owned = group.rebalance()[member]
    assert StickyAssignor(path).owned == owned  # the next start reads what it was given


def test_an_unwritable_claim_file_costs_a_warning_not_the_assignment(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_bytes(b"")
    group = Group({"t": 1})
    member = group.join("a", tmp_path / "file" / "claim.json")  # (its directory a file)
    with caplog.at_level(logging.WARNING, "dupalign.sticky"):
        assert group.rebalance()[member] == [("t", 0)]
    assert "not saved" in caplog.text
