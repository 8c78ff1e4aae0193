"""Least privilege on a Kafka cluster with an authorizer: what each process of dupalign
reads, writes and uses (topics, consumer groups, transactional ids), and the exact ACLs
that allow it, as ``kafka-acls.sh`` commands (``dupalign acls``) and as the table of
docs/security.md (tests/service/test_acls.py checks the docs against ``table``).

Derived from ``[kafka]`` as the roles use it: a role's group is ``{group_id}-{role}``
(dupalign/service/roles/base.py), the single worker's ``group_id``; a transactional id is
``{transactional_id_prefix}-{group}-{input topic}-{partition}`` (one per input partition),
granted by prefix. Every topology role checks every topic of the topology at start-up
(Describe; DescribeConfigs on the retained ones and the ones whose record limit it reads);
with ``kafka.create_topics`` it may create them (Create). Idempotent producers need no
cluster ACL: Write on a topic implies IdempotentWrite (Kafka 3.0 and later).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from dupalign.service.config import KafkaConfig
from dupalign.service.topics import retained_topics, topology_topics

# the processes ``dupalign acls --role`` knows: the topology's roles, the single worker
# (``dupalign worker`` with its default roles), ``dupalign produce``, a reader of the matches
ROLES = ("worker", "sketch", "index", "shard", "align", "produce", "consumer")
KINDS = {"topic": "--topic", "group": "--group", "transactional-id": "--transactional-id"}


@dataclass(frozen=True)
class Access:
    """Operations on resources of one kind (a name, or every name starting with it)."""

    kind: str  # topic, group, transactional-id
    names: tuple[str, ...]
    operations: tuple[str, ...]
    prefixed: bool = False


def _txn(kc: KafkaConfig, group: str, topic: str) -> Access | None:
    if not kc.transactions:  # at-least-once: no transactional producer
        return None
    return Access("transactional-id", (f"{kc.transactional_id_prefix}-{group}-{topic}-",),
                  ("Write", "Describe"), prefixed=True)


def _startup(kc: KafkaConfig, limits: tuple[str, ...]) -> list[Access]:
    """What every topology role needs before it consumes (``ensure_topics``,
    ``record_limit``): the topology's topics described, the retained ones' and ``limits``'
    configs read, and with ``kafka.create_topics`` the missing ones created."""
    topics = tuple(topology_topics(kc))
    out = [Access("topic", topics, ("Describe",)),
           Access("topic", tuple(sorted(retained_topics(kc) | set(limits))),
                  ("DescribeConfigs",))]
    if kc.create_topics:
        out.append(Access("topic", topics, ("Create",)))
    return out


def accesses(role: str, kc: KafkaConfig, group: str | None = None) -> list[Access]:
    """What ``role`` does on the cluster of ``kc``; ``group``: the consumer role's group
    (default ``{group_id}-matches``)."""
    sharded = kc.index_shards > 1
    out: list[Access | None]
    if role == "worker":
        out = [Access("topic", (kc.input_topic,), ("Read",)),
               Access("topic", (kc.output_topic, kc.dlq_topic), ("Write",)),
               Access("group", (kc.group_id,), ("Read",)),
               _txn(kc, kc.group_id, kc.input_topic)]
        if kc.create_topics:
            out.append(Access("topic", (kc.input_topic, kc.output_topic, kc.dlq_topic),
                              ("Describe", "Create")))
    elif role == "sketch":
        g = f"{kc.group_id}-sketch"
        # sequence: read back to resume a partition whose group lost its offsets
        out = [Access("topic", (kc.input_topic, kc.sequence_topic), ("Read",)),
               Access("topic", (kc.sequence_topic, kc.sketch_topic, kc.dlq_topic), ("Write",)),
               Access("group", (g,), ("Read",)), _txn(kc, g, kc.input_topic),
               *_startup(kc, (kc.sketch_topic,))]
    elif role == "index":
        g = f"{kc.group_id}-index"
        reads = (kc.sequence_topic, kc.sketch_topic, kc.aligned_topic,
                 *((kc.partials_topic,) if sharded else ()))
        writes = (kc.output_topic, kc.align_topic, kc.forward_topic,
                  *((kc.keys_topic,) if sharded else ()))
        out = [Access("topic", reads, ("Read",)), Access("topic", writes, ("Write",)),
               Access("group", (g,), ("Read",)), _txn(kc, g, kc.sequence_topic),
               *_startup(kc, (kc.align_topic, kc.forward_topic))]
    elif role == "shard":
        g = f"{kc.group_id}-shard"
        out = [Access("topic", (kc.keys_topic,), ("Read",)),
               Access("topic", (kc.partials_topic,), ("Write",)),
               Access("group", (g,), ("Read",)), _txn(kc, g, kc.keys_topic),
               *_startup(kc, ())]
    elif role == "align":
        g = f"{kc.group_id}-align"
        # forward: its partitions' records, read without a group (assigned)
        out = [Access("topic", (kc.align_topic, kc.forward_topic), ("Read",)),
               Access("topic", (kc.aligned_topic, kc.dlq_topic), ("Write",)),
               Access("group", (g,), ("Read",)), _txn(kc, g, kc.align_topic),
               *_startup(kc, ())]
    elif role == "produce":
        # dead letters: records cut or corrupt in the inputs
        out = [Access("topic", (kc.input_topic, kc.dlq_topic), ("Write",))]
    elif role == "consumer":
        out = [Access("topic", (kc.output_topic,), ("Read",)),
               Access("group", (group or f"{kc.group_id}-matches",), ("Read",))]
    else:
        raise ValueError(f"unknown role {role!r}: choose among {', '.join(ROLES)}")
    return [a for a in out if a is not None]


def commands(role: str, principal: str, kc: KafkaConfig, bootstrap: str | None = None,
             command_config: str | None = None, group: str | None = None) -> list[str]:
    """``kafka-acls.sh --add`` commands granting ``principal`` exactly ``role``'s access."""
    return render(accesses(role, kc, group), principal, kc, bootstrap, command_config)


def render(found: list[Access], principal: str, kc: KafkaConfig, bootstrap: str | None = None,
           command_config: str | None = None) -> list[str]:
    """``kafka-acls.sh --add`` commands granting ``principal`` ``found``."""
    head = ["kafka-acls.sh", "--bootstrap-server", bootstrap or kc.bootstrap_servers]
    if command_config:
        head += ["--command-config", command_config]
    out = []
    for a in found:
        argv = [*head, "--add", "--allow-principal", principal]
        for op in a.operations:
            argv += ["--operation", op]
        for name in a.names:
            argv += [KINDS[a.kind], name]
        if a.prefixed:
            argv += ["--resource-pattern-type", "prefixed"]
        out.append(shlex.join(argv))
    return out


def table(kc: KafkaConfig) -> str:
    """docs/security.md's table for ``kc``: one row a role."""
    rows = ["| role | reads (Read) | writes (Write) | consumer group (Read) | transactional "
            "ids (Write, Describe; prefix) | also |",
            "|---|---|---|---|---|---|"]
    every = tuple(topology_topics(kc))
    for role in ROLES:
        found = accesses(role, kc)
        also = [f"{op} on " + ("every topic of the topology" if a.names == every else
                               ", ".join(f"`{n}`" for n in a.names))
                for a in found if a.kind == "topic"
                for op in a.operations if op not in ("Read", "Write")]
        txn = [f"`{a.names[0]}*`" for a in found if a.kind == "transactional-id"]
        rows.append(f"| {role} | {_names(found, 'topic', 'Read')} | "
                    f"{_names(found, 'topic', 'Write')} | {_names(found, 'group', 'Read')} | "
                    f"{', '.join(txn) or '-'} | "
                    f"{'; '.join(also) or '-'} |")
    return "\n".join(rows)


def _names(found: list[Access], kind: str, op: str) -> str:
    listed = [n for a in found if a.kind == kind and op in a.operations for n in a.names]
    return ", ".join(f"`{n}`" for n in listed) or "-"
