"""Least privilege for the roles of ``dupalign stage`` (docs/security.md, "The stage roles"):
what each role reads, writes and uses on the cluster, taken from the roles themselves, as
``dupalign acls --stage`` prints it. The roles are made as ``dupalign stage`` makes them
(``make_stage_roles``, on a throwaway store directory): a role's consumer group is its
``group_id``, the topic it consumes with it its ``input_topic`` (a stage role's: its
changelog, which it also restores from and writes), its transactional ids
``transactional_id`` of that topic's partitions (granted by prefix), the topics it checks
at start its ``topics()`` (and its changelog, ``ensure_changelog``); what a stage role reads
is what its partitions' merges read (``positions`` of each partition, opened on an empty
store). What a role writes is made inside its turns: ``StageTopics.outputs`` says it (one
writer a topic), checked against what the roles send and read by
tests/service/test_stage_acls.py.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from dupalign.service.acls import Access
from dupalign.service.config import Config
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.roles.stage_command import make_stage_roles
from dupalign.service.roles.stage_role import StageRole
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import transactional_id
from dupalign.stages.partitioned import Shape
from dupalign.store.database import Store


@dataclass
class Grants:
    """What one role (or the roles of one process: ``union``) needs, by operation."""

    reads: set[str] = field(default_factory=set)  # topics (Read)
    writes: set[str] = field(default_factory=set)  # topics (Write)
    described: set[str] = field(default_factory=set)  # topics checked at start (Describe)
    configs: set[str] = field(default_factory=set)  # topics whose configs it reads
    groups: set[str] = field(default_factory=set)  # consumer groups (Read)
    transactional: set[str] = field(default_factory=set)  # transactional id prefixes

    def union(self, other: Grants) -> Grants:
        return Grants(*(getattr(self, f) | getattr(other, f) for f in _FIELDS))


_FIELDS = ("reads", "writes", "described", "configs", "groups", "transactional")


def stage_grants(config: Config, roles: Iterable[str]) -> dict[str, Grants]:
    """Each of ``roles``' (``dupalign stage``'s names) grants on the cluster of
    ``config.kafka``, with its shape. TopologyError without ``kafka.transactions`` (the
    stage roles need it)."""
    roles = tuple(roles)
    kc = config.kafka
    shape = Shape.parse(kc.shape)
    topics = StageTopics(kc, shape)
    with tempfile.TemporaryDirectory(prefix="dupalign-acls-") as tmp:
        made = make_stage_roles(config, roles, tmp, RoleMetrics(), shape)
        # one empty store for every partition, not one each (each open costs ~0.3 s of
        # RocksDB): a partition opened on it names the positions it reads from. Not opened
        # read-only: a list shard writes at open (``rebuild_entries``' mark, nothing to
        # rebuild); tests/service/test_stage_acls.py holds every partition's reads here to
        # those on a store of its own
        empty = Store(Path(tmp) / "empty", config.engine.frozen_params())
        try:
            return {name: _grants(config, name, role, topics, empty) for name, role in zip(
                roles, made, strict=True)}
        finally:
            empty.close()
            for role in made:
                role.executor.shutdown(wait=True)


def _grants(config: Config, name: str, role: Any, topics: StageTopics, empty: Store
            ) -> Grants:
    kc = config.kafka
    g = Grants(reads={role.input_topic}, writes=set(topics.outputs(name)),
               described=set(role.topics()), groups={role.group_id})
    if isinstance(role, StageRole):
        changelog = role.input_topic  # (its group's topic: ownership, restores, turns)
        g.writes.add(changelog)
        g.described.add(changelog)
        g.configs.add(changelog)  # (ensure_changelog: its cleanup.policy)
        for p in range(topics.partitions(role.stage)):
            g.reads |= {tp.topic for tp in role.open_partition(p, empty).positions()}
    # the compacted idf topic is checked at start (ensure_idf) by the roles that use it
    if topics.idf in g.reads | g.writes:
        g.described.add(topics.idf)
        g.configs.add(topics.idf)
    # one per partition of the group's topic, the partition's number last
    tid = transactional_id(kc, role.group_id, TopicPartition(role.input_topic, 0))
    if tid is not None:
        g.transactional.add(tid.removesuffix("0"))
    return g


def union(grants: Iterable[Grants]) -> Grants:
    """The grants of one process running several roles."""
    out = Grants()
    for g in grants:
        out = out.union(g)
    return out


def accesses(g: Grants, create_topics: bool) -> list[Access]:
    """``g`` as ACLs (``dupalign.service.acls.render`` prints them); with
    ``kafka.create_topics``, Create on the topics checked at start."""
    out = [Access("topic", tuple(sorted(g.reads)), ("Read",)),
           Access("topic", tuple(sorted(g.writes)), ("Write",)),
           Access("topic", tuple(sorted(g.described)), ("Describe",)),
           Access("topic", tuple(sorted(g.configs)), ("DescribeConfigs",))]
    if create_topics:
        out.append(Access("topic", tuple(sorted(g.described)), ("Create",)))
    out += [Access("group", (group,), ("Read",)) for group in sorted(g.groups)]
    out += [Access("transactional-id", (t,), ("Write", "Describe"), prefixed=True)
            for t in sorted(g.transactional)]
    return [a for a in out if a.names]


def table(config: Config, roles: Iterable[str]) -> str:
    """docs/security.md's table of the stage roles: one row a role."""
    grants = stage_grants(config, roles)
    every = set(StageTopics(config.kafka, Shape.parse(config.kafka.shape)).wanted())
    rows = ["| role | reads (Read) | writes (Write) | consumer group (Read) | transactional "
            "ids (Write, Describe; prefix) | also |", "|---|---|---|---|---|---|"]
    for name, g in grants.items():
        also = ["Describe on every topic between the roles"
                + (f" and {_names(g.described - every)}" if g.described - every else "")]
        if g.configs:
            also.append(f"DescribeConfigs on {_names(g.configs)}")
        rows.append(f"| {name} | {_names(g.reads)} | {_names(g.writes)} | "
                    f"{_names(g.groups)} | {', '.join(f'`{t}*`' for t in sorted(g.transactional))}"
                    f" | {'; '.join(also)} |")
    return "\n".join(rows)


def _names(names: set[str]) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names)) or "-"
