"""``dupalign acls --stage``: the ACLs of the roles of ``dupalign stage`` (dupalign/service/roles/
stage_acls.py). docs/security.md's table is the one the code derives; what the roles write
(``StageTopics.outputs``) agrees with what they read (their partitions' merges) and with what
the sketch role sends (the stage partitions' outputs are checked on every turn of the
partition tests: tests/service/test_stage_partitions.py ``Owner.turn``); one writer a topic;
a process of several roles gets the union; the printout names exactly the config's
resources. (tests/service/test_stage_security_kafka.py runs the roles under these ACLs on a
broker that enforces them.)"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from aiokafka import TopicPartition

from dupalign.page import Page
from dupalign.service.config import Config, KafkaConfig, load_config
from dupalign.service.kafka_args import STAGE_ROLES
from dupalign.service.roles import stage_acls
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.roles.stage_command import make_stage_roles
from dupalign.service.roles.stage_role import StageRole
from dupalign.service.roles.stage_sketch import StageSketchRole
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import transactional_id
from dupalign.stages.partitioned import Shape
from dupalign.store.database import Store
from dupalign.wire import messages
from tests.service.test_acls import generated_table
from tests.service.test_stage_sketch import FROZEN, records

REPO = Path(__file__).resolve().parents[2]
NO_CREATE = replace(Config(), kafka=KafkaConfig(create_topics=False))


def test_the_docs_table_is_the_one_the_code_derives() -> None:
    found = generated_table("`dupalign acls --stage all --table` (kafka.create_topics = false)")
    assert found == stage_acls.table(NO_CREATE, STAGE_ROLES), (
        "docs/security.md's stage table differs from the code: paste `dupalign acls --stage "
        "all --table` of a config with kafka.create_topics = false")


def test_each_topic_has_one_writer_and_every_read_topic_is_written() -> None:
    """The outputs (``StageTopics.outputs``) against the reads the roles' partitions derive:
    every topic between the roles is written by exactly one role and read by another (the
    matches by their readers, the dead letters by an operator), ``pages`` by produce."""
    grants = stage_acls.stage_grants(NO_CREATE, STAGE_ROLES)
    kc = NO_CREATE.kafka
    topics = StageTopics(kc, Shape.parse(kc.shape))
    writers = Counter(t for g in grants.values() for t in g.writes)
    assert {t for t, n in writers.items() if n > 1} == set()
    assert set(writers) == {*topics.wanted(), topics.idf,
                            *(topics.changelog(s) for s in STAGE_ROLES if s != "sketch")
                            } - {kc.input_topic}
    read = {t for g in grants.values() for t in g.reads}
    assert read - set(writers) == {kc.input_topic}
    assert set(writers) - read == {kc.output_topic, kc.dlq_topic}
    # a role reads another's output only (and its own changelog and ledger's decisions)
    assert grants["near"].reads == {topics.near_ops, topics.changelog("near")}
    assert not grants["combine"].writes & {topics.exact, topics.decisions, topics.sketches}


def test_the_sketch_role_sends_its_outputs_only() -> None:
    """Its entries, windows, near states, sketches and dead letters (and, per batch, the
    sequence record ``produce`` sends first): what ``outputs`` grants it."""
    tp = TopicPartition(FROZEN.kafka.input_topic, 0)
    role = StageSketchRole(FROZEN, Shape(2, 1, 1, 1, 1))
    rfc = Page("rfc", (REPO / "demo" / "rfc" / "rfc5321.txt").read_text("utf-8")[:20_000])
    recs = [*records(tp), SimpleNamespace(topic=tp.topic, partition=0, offset=99, key=b"rfc",
                                          value=messages.encode_page(rfc), headers=[])]
    sent = {o.topic for o in role.outgoing(role.prepare(tp, recs))}
    assert sent | {role.topics_.batches} == set(role.topics_.outputs("sketch"))


def test_the_grants_are_the_roles_own_names() -> None:
    """A stage role's group, transactional ids and changelog are those it uses, not the
    index topology's (its sketch and align roles have groups of their own)."""
    config = load_config(env={}, overrides={"kafka": {"input_topic": "crawl", "group_id":
                                                      "dedup", "transactional_id_prefix": "tx"}})
    grants = stage_acls.stage_grants(config, ("sketch", "exact", "align"))
    assert grants["sketch"].groups == {"dedup-stage-sketch"}
    assert grants["align"].groups == {"dedup-stage-align"}
    assert grants["exact"].transactional == {"tx-dedup-exact-crawl.exact.changelog-"}
    tid = transactional_id(config.kafka, "dedup-exact", TopicPartition("crawl.exact.changelog", 1))
    assert tid is not None and tid.startswith(next(iter(grants["exact"].transactional)))
    assert grants["sketch"].reads == {"crawl"}
    assert "crawl" not in grants["exact"].reads | grants["exact"].writes
    assert grants["align"].configs == {"crawl.align.changelog"}


def acls(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``dupalign acls ARGS`` with the default config and ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUPALIGN_KAFKA_")}
    return subprocess.run([sys.executable, "-m", "dupalign.service.cli", "acls", *args],
                          cwd=REPO, capture_output=True, text=True, check=False,
                          env={**clean, **env})


def granted(stdout: str) -> set[tuple[str, str, str]]:
    """(operation, kind, name) of every ACL of a printout."""
    out = set()
    for line in stdout.splitlines():
        argv = shlex.split(line)
        assert argv[:2] == ["kafka-acls.sh", "--bootstrap-server"] and "--add" in argv
        ops = [argv[i + 1] for i, a in enumerate(argv) if a == "--operation"]
        names = [(a, argv[i + 1]) for i, a in enumerate(argv)
                 if a in ("--topic", "--group", "--transactional-id")]
        out |= {(op, kind, name) for op in ops for kind, name in names}
    return out


def test_a_process_of_several_roles_gets_the_union() -> None:
    runs = {args: acls("--stage", *args, "--principal", "User:p") for args in (
        ("directory",), ("exact",), ("directory,exact",), ("all",))}
    assert all(r.returncode == 0 for r in runs.values()), [r.stderr for r in runs.values()]
    d, e, both, every = (granted(r.stdout) for r in runs.values())
    assert both == d | e
    assert d | e < every
    assert ("Write", "--topic", "pages.decisions") in d
    assert ("Write", "--topic", "pages.entries") not in d  # (read only)
    assert ("Read", "--topic", "pages.entries") in d
    assert ("Read", "--group", "dupalign-directory") in d
    # the index topology's groups are not the stage roles'
    assert not {n for _, kind, n in every if kind == "--group"} & {"dupalign-sketch",
                                                                   "dupalign-align"}


def test_bad_choices_are_usage_errors() -> None:
    cases = {("--stage", "shard", "--principal", "User:x"): "shard",
             ("--stage", "exact", "--role", "sketch", "--principal", "User:x"): "not both",
             ("--stage", "exact", "--principal", "x"): "give TYPE:NAME",
             ("--stage", "exact"): "give --principal TYPE:NAME (or --table)"}
    for args, says in cases.items():
        run = acls(*args)
        assert run.returncode == 2 and says in run.stderr, (args, run.stderr)
    without = acls("--stage", "exact", "--principal", "User:x",
                   DUPALIGN_KAFKA_TRANSACTIONS="false")
    assert without.returncode == 2 and "kafka.transactions = true" in without.stderr



def test_the_partitions_read_on_one_shared_store_what_each_reads_on_its_own(
    tmp_path: Path,
) -> None:
    """The grants open every partition of every role on one empty store, which the lists'
    partitions write to at open: each role's reads must be those of its partitions opened
    each on an empty store of its own (a write at open that changed what a later partition
    reads would grant the wrong topics)."""
    shape = Shape.parse(NO_CREATE.kafka.shape)
    topics = StageTopics(NO_CREATE.kafka, shape)
    grants = stage_acls.stage_grants(NO_CREATE, STAGE_ROLES)
    made = make_stage_roles(NO_CREATE, STAGE_ROLES, str(tmp_path / "roles"), RoleMetrics(),
                            shape)
    try:
        for name, role in zip(STAGE_ROLES, made, strict=True):
            if not isinstance(role, StageRole):
                continue
            own = {role.input_topic}
            for p in range(topics.partitions(role.stage)):
                store = Store(tmp_path / "own" / f"{name}-{p}", NO_CREATE.engine.frozen_params())
                try:
                    own |= {tp.topic for tp in role.open_partition(p, store).positions()}
                finally:
                    store.close()
            assert grants[name].reads == own, name
    finally:
        for role in made:
            role.executor.shutdown(wait=True)
