"""A sticky, co-partitioned assignment for consumer groups whose partitions carry local state
(the single worker's store, a stage role's partition stores): a member that joins does not
take a partition from the member that owns it, since the owner would let go of its state
and the newcomer rebuild it by replay.

Partition i of every subscribed topic goes to one member (a *slot*, as the range assignor
gives it: a member needs partition i of each topic together). Each member's
subscription says which partitions it was last given, the *epoch* they were given at and
the highest epoch it has seen: partitions that change hands are given at 1 + the highest
epoch any member has seen, so when two members claim a slot (one was expelled and the group
moved on without it) the newer claim wins. An assignment that changes nothing keeps every
epoch, so every subscription stays the same: the broker rebalances the whole group again
when a member rejoins with another subscription than it had (aiokafka rejoins after some
assignments: with an epoch bumped at every assignment, a group rebalanced without end).
The leader keeps each claimed slot with its claimer, up to the claimer's quota (the slots
spread within one over the members: the larger quotas to the members that claim most;
a claimer over its quota lets go of the slots others claim too first, which go to those
others' best claim with room), and gives the other slots in order to the members with
room, taken by member id: without claims that is the range assignor's assignment.

``assign`` is the pure core; ``StickyAssignor`` is its aiokafka adapter, one instance per
consumer (it remembers what its consumer was given: aiokafka calls ``name``, ``metadata``,
``assign`` and ``on_assignment`` on the objects in ``partition_assignment_strategy``,
tests/service/test_sticky.py). Ownership is never a correctness matter here (a new owner
fences the old one and rebuilds what it lacks): a claim that loses only costs a replay.

A consumer whose state lives in a directory keeps its claim there (``claim_path``: written
at each assignment, read when its assignor is made), so a restarted process, a new member
id, claims the partitions its local state is for at its first join. The epoch rule still
holds: if another member took a partition over while it was down, that newer claim wins;
it gets its partitions back when nobody took them over since, as when a whole group
restarts. A claim file it cannot read is ignored (a warning): the start goes on unclaimed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

log = logging.getLogger("dupalign.sticky")

Partition = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class Claim:
    """What a member says when it joins: its topics, the partitions it was last given, the
    epoch they were given at and the highest epoch it has seen (-1: none yet)."""

    topics: frozenset[str]
    owned: frozenset[Partition] = frozenset()
    epoch: int = -1
    seen: int = -1


def assign(members: Mapping[str, Claim], partitions: Mapping[str, int]
           ) -> dict[str, list[Partition]]:
    """Each member's partitions (sorted), given the members' claims and each topic's
    partition count. Every partition of a subscribed topic goes to exactly one subscriber;
    with one subscription for all, partition i of every topic goes to one member, the
    members' slot counts differ by at most one, and a claimer keeps min(its claimed slots,
    its quota) of them. Deterministic: a function of its arguments' contents."""
    ids = sorted(members)
    counts = {t: n for t, n in sorted(partitions.items())
              if any(t in members[m].topics for m in ids)}
    if not ids:
        return {}
    n_slots = max(counts.values(), default=0)
    claimers: dict[int, list[tuple[int, str]]] = {}  # slot -> (-epoch, claimer), best first
    for m in ids:
        c = members[m]
        for slot in {p for t, p in c.owned if t in c.topics and p < counts.get(t, 0)}:
            claimers.setdefault(slot, []).append((-c.epoch, m))
    for found in claimers.values():
        found.sort()
    claimed = {m: sorted((s for s, found in claimers.items() if found[0][1] == m),
                         key=lambda s: (len(claimers[s]) > 1, s)) for m in ids}
    base, extra = divmod(n_slots, len(ids))
    by_claims = sorted(ids, key=lambda m: (-len(claimed[m]), m))
    quota = {m: base + (i < extra) for i, m in enumerate(by_claims)}
    # a winner over its quota lets go of the slots others claim too, first; a slot let go
    # goes to the best of its other claimers with room (a member restarted with its claim,
    # whose slot the group gave another while it was down, gets it back if that one has
    # more than its share): then the rest, in order
    slots = {m: claimed[m][:quota[m]] for m in ids}
    kept = {s for m in ids for s in slots[m]}
    for s in range(n_slots):
        room = [m for _, m in claimers.get(s, [])[1:] if len(slots[m]) < quota[m]]
        if s not in kept and room:
            slots[room[0]].append(s)
            kept.add(s)
    free = iter(s for s in range(n_slots) if s not in kept)
    for m in ids:
        slots[m] += [next(free) for _ in range(quota[m] - len(slots[m]))]
    given: dict[str, list[Partition]] = {m: [] for m in ids}
    orphans: list[Partition] = []  # (topic, slot) whose slot's member lacks the topic
    for m in ids:
        for s in sorted(slots[m]):
            for t, n in counts.items():
                if s < n:
                    (given[m] if t in members[m].topics else orphans).append((t, s))
    for t, p in sorted(orphans):
        m = min((m for m in ids if t in members[m].topics), key=lambda m: (len(given[m]), m))
        given[m].append((t, p))
    return {m: sorted(given[m]) for m in ids}


def latest_epoch(members: Iterable[Claim]) -> int:
    return max((max(c.epoch, c.seen) for c in members), default=-1)


def encode_claim(owned: Iterable[Partition], epoch: int, seen: int) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for t, p in sorted(owned):
        by_topic.setdefault(t, []).append(p)
    return json.dumps({"epoch": epoch, "owned": by_topic, "seen": seen},
                      sort_keys=True).encode()


def parse_claim(data: bytes) -> tuple[frozenset[Partition], int, int]:
    """(owned, epoch, seen) from ``encode_claim``'s bytes; ValueError, TypeError or
    AttributeError from bytes that are not that."""
    obj = json.loads(data)
    owned = frozenset((str(t), int(p)) for t, ps in obj.get("owned", {}).items() for p in ps)
    return owned, int(obj.get("epoch", -1)), int(obj.get("seen", -1))


def decode_claim(topics: Iterable[str], user_data: bytes | None) -> Claim:
    """A member's claim from its subscription; none from user data it cannot read (another
    version's): that member just claims nothing."""
    topics = frozenset(topics)
    try:
        return Claim(topics, *parse_claim(user_data or b"{}"))
    except (ValueError, TypeError, AttributeError):
        return Claim(topics)


def decode_epochs(user_data: bytes | None) -> tuple[int, int]:
    """(the epoch a member's partitions were given at, the highest epoch seen)."""
    try:
        _, epoch, seen = parse_claim(user_data or b"{}")
        return epoch, seen
    except (ValueError, TypeError, AttributeError):
        return -1, -1


class StickyAssignor(AbstractPartitionAssignor):
    """``assign`` for aiokafka: one instance per consumer, its only
    ``partition_assignment_strategy`` (``sticky``)."""

    name = "dupalign-sticky"
    version = 0

    def __init__(self, path: Path | None = None) -> None:
        self.owned: list[Partition] = []  # what this member was last given
        self.epoch = -1  # and the epoch they were given at
        self.seen = -1  # the highest epoch the group has given
        self.path = path  # where the claim outlives the process (None: nowhere)
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            owned, self.epoch, self.seen = parse_claim(path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("sticky claim %s unreadable (%s): joining without a claim", path, exc)
            return
        self.owned = sorted(owned)
        log.info("sticky claim from %s: %d partitions, epoch %d", path, len(self.owned),
                 self.epoch)

    def _save(self, path: Path) -> None:
        """Written whole or not at all (a temporary file renamed over the last claim). A
        failure costs a replay after a restart, not the consumer: a warning."""
        temp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as f:
                f.write(encode_claim(self.owned, self.epoch, self.seen))
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
        except OSError as exc:
            log.warning("sticky claim %s not saved (%s)", path, exc)

    def leave(self) -> None:
        """The member is stopping: its claim file keeps what it says from now on. On its way
        out it may still be given the partitions of members that left before it, which its
        state is not for; saved, that claim would take them from their owners at a restart."""
        self.path = None

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics),
                                              encode_claim(self.owned, self.epoch, self.seen))

    def assign(self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
               ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """(The leader's: ``cluster`` is aiokafka's metadata, read for partition counts.)"""
        claims = {m: decode_claim(md.subscription, md.user_data) for m, md in members.items()}
        counts = {}
        for t in sorted({t for c in claims.values() for t in c.topics}):
            found = cluster.partitions_for_topic(t)
            if found:
                counts[t] = max(found) + 1
        given = assign(claims, counts)
        changed = [m for m, parts in given.items() if set(parts) != claims[m].owned]
        epoch = latest_epoch(claims.values()) + bool(changed)
        if changed:
            moved = sum(1 for m, parts in given.items() for tp in parts
                        if any(tp in c.owned for o, c in claims.items() if o != m))
            log.info("sticky assignment (epoch %d): %d members, %d partitions, %d moved from "
                     "another member", epoch, len(given), sum(map(len, given.values())), moved)
        out = {}
        for m, parts in given.items():
            by_topic: dict[str, list[int]] = {}
            for t, p in parts:
                by_topic.setdefault(t, []).append(p)
            user_data = {"epoch": epoch if m in changed else claims[m].epoch, "seen": epoch}
            out[m] = ConsumerProtocolMemberAssignment(
                self.version, sorted(by_topic.items()),
                json.dumps(user_data, sort_keys=True).encode())
        return out

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self.owned = sorted((tp.topic, tp.partition) for tp in assignment.partitions())
        self.epoch, self.seen = decode_epochs(assignment.user_data)
        if self.path is not None:
            self._save(self.path)


def claim_path(state_dir: str | Path | None, group_id: str) -> Path | None:
    """Where a member of ``group_id`` whose state is in ``state_dir`` keeps its claim (None:
    no state directory, no claim kept). Named by group: roles of one process may share it."""
    return None if state_dir is None else Path(state_dir) / f"sticky-claim-{group_id}.json"


def leaving(strategy: Iterable[Any]) -> None:
    """A consumer's member stopping: the claim of its sticky assignor, if any, stays as it is
    (``StickyAssignor.leave``)."""
    for assignor in strategy:
        if isinstance(assignor, StickyAssignor):
            assignor.leave()


def sticky(path: Path | None = None) -> tuple[Any, ...]:
    """A consumer's ``partition_assignment_strategy``: this assignor alone. aiokafka (0.14)
    sends one JoinGroup per strategy offered, each naming one more: a member offering two
    changes its subscription mid-join, and the broker rebalances the group again, without
    end once two members do (tests/service/test_sticky.py). So no fallback strategy: every
    member of a group must run a version with this assignor (stop the old ones first).
    ``path``: the claim file (``claim_path``) of a consumer with local state."""
    return (StickyAssignor(path),)
