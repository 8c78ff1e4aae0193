"""Least privilege on a Kafka cluster with an authorizer: what the single worker, ``dupalign
produce`` and a reader of the matches read, write and use (topics, consumer groups,
transactional ids), and the exact ACLs that allow it, as ``kafka-acls.sh`` commands
(``dupalign acls --role``) and as the table of docs/security.md (tests/service/test_acls.py
checks the docs against ``table``); the stage roles' are dupalign/service/roles/stage_acls.py.

Derived from ``[kafka]``: the single worker's group is ``group_id``; a transactional id is
``{transactional_id_prefix}-{group}-{input topic}-{partition}`` (one per input partition),
granted by prefix. Idempotent producers need no cluster ACL: Write on a topic implies
IdempotentWrite (Kafka 3.0 and later).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from dupalign.service.config import KafkaConfig

# the processes ``dupalign acls --role`` knows: the single worker (``dupalign worker``),
# ``dupalign produce``, a reader of the matches
ROLES = ("worker", "produce", "consumer")
# the removed index topology's roles (``dupalign acls --stage`` names the stage roles')
REMOVED_ROLES = ("sketch", "index", "shard", "align")
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


def accesses(role: str, kc: KafkaConfig, group: str | None = None) -> list[Access]:
    """What ``role`` does on the cluster of ``kc``; ``group``: the consumer role's group
    (default ``{group_id}-matches``)."""
    out: list[Access | None]
    if role == "worker":
        out = [Access("topic", (kc.input_topic,), ("Read",)),
               Access("topic", (kc.output_topic, kc.dlq_topic), ("Write",)),
               Access("group", (kc.group_id,), ("Read",)),
               _txn(kc, kc.group_id, kc.input_topic)]
        if kc.create_topics:
            out.append(Access("topic", (kc.input_topic, kc.output_topic, kc.dlq_topic),
                              ("Describe", "Create")))
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
    for role in ROLES:
        found = accesses(role, kc)
        also = [f"{op} on " + ", ".join(f"`{n}`" for n in a.names)
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
