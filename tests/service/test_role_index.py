"""The index role's turns on real engines and stores, without a broker: records handed to
``_route`` as the consumer would, ``_advance`` run as the role's loop runs it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dupalign.config import EngineConfig, RetentionConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.service.config import Config, KafkaConfig, WorkerConfig
from dupalign.service.roles.fan_in import FanInIndexer
from dupalign.service.roles.index import IndexRole, Waiting
from dupalign.service.roles.shard_protocol import ShardMessage, ShardStore
from dupalign.service.topology import (
    Outgoing,
    encode_aligned,
    encode_sequence,
    ordinal_header,
    record_ordinal,
)
from dupalign.wire import messages
from tests.runtime.test_lifecycle import config as lifecycle_config
from tests.runtime.test_lifecycle import text_of
from tests.stages.test_shard import _body, config


def test_a_fan_in_rebuilding_holds_the_pages_from_e_on_until_the_replay_is_over(
        tmp_path: Path) -> None:
    """A fan-in standby on a fresh store (E = 3: pages 0-2 published by the owner before
    it, pages 3 and 4 sequenced, not published) reads all five pages in one turn. Pages
    0-2 wait for their partials from the retained topic; a turn that is still rebuilding
    commits nothing, so the keys messages of pages 3 and 4 must not be made in it (they
    were made and dropped: those pages then waited for partials forever)."""
    cfg = config("oph", 4, 16)
    role = IndexRole(Config(kafka=KafkaConfig(index_shards=2), engine=cfg), tmp_path / "fan-in")
    with Engine.open(tmp_path / "sketcher", cfg) as sketcher, \
            Engine.open(tmp_path / "fan-in", cfg, shards=2,
                        remote_shards=role._open_fan_in) as engine:
        role.engine = engine
        role._reset(0, 3)
        role.owner = True
        sequence = [SimpleNamespace(offset=i, timestamp=i, headers=[],
                                    value=encode_sequence(f"d{i}", ("pages", 0, i)))
                    for i in range(5)]
        sketches = [SimpleNamespace(offset=i, timestamp=i, headers=[ordinal_header(i)],
                                    value=sketcher.sketch(Page(f"d{i}", _body(i))).to_bytes())
                    for i in range(5)]
        role._route(role.seq_tp, sequence)
        role._route(role.sketch_tp, sketches)
        out = role._advance()
        role.seq_read = 5
        assert [(w.ordinal, w.undecided) for w in role.waiting] == [(0, True), (1, True),
                                                                     (2, True)]
        assert role._rebuilding()
        assert out == []
        assert [ordinal for ordinal, _ in role.expected] == [3, 4]  # applied once it is over
    role.executor.shutdown()


def test_a_sweep_cut_by_a_crash_is_due_again_where_it_was(tmp_path: Path) -> None:
    """Retention sweeps at the first record at or past each multiple of 100. A crash cut
    the sweep at record 205 (records 198-204: transaction markers and aborted records):
    the store's offset S is 198, one past the last record whose changes it holds, so the
    schedule goes on from record 197 and the sweep is due at 205 again, not after."""
    cfg = replace(config("oph", 4, 16), retention=RetentionConfig(max_pages=2, every=100))
    role = IndexRole(Config(kafka=KafkaConfig(index_shards=2), engine=cfg), tmp_path / "x")
    role._resume_lifecycle(198)
    assert role._sweep_due(205)
    role.last_op = 205
    assert not role._sweep_due(206)
    role.executor.shutdown()


def test_a_fan_in_keeps_a_page_that_a_decided_page_matched_until_that_one_is_published(
        tmp_path: Path) -> None:
    """d1, an exact copy of d0, is decided and waits (for an align answer, say); then d0's
    tombstone comes. After a crash, the fan-in decides d1 again from its shards' partials
    and names d0 by ordinal: had d0 left the directory, that raised KeyError at every
    start. So the delete waits until d1 is published."""
    cfg = config("oph", 4, 16)
    role = IndexRole(Config(kafka=KafkaConfig(index_shards=2), engine=cfg), tmp_path / "fan-in")
    shards = [ShardStore(tmp_path / "shards", cfg, s, 2, kept=8) for s in range(2)]
    with Engine.open(tmp_path / "fan-in", cfg, shards=2,
                     remote_shards=role._open_fan_in) as engine:
        ix = role.fan_in
        assert ix is not None
        results = []
        for seq, doc in enumerate(["d0", "d1"]):
            ix.begin(seq)
            results.append(ix.index(engine.sketch(Page(doc, _body(0))), ("sequence", 0, seq)))
            partials = [shards[s].apply(m, ("keys", s, seq)) for s, m in ix.take()]
            ix.decide(seq, [p for p in partials if p is not None])
        ix.finish(results[0], [])
        assert [(m.kind, m.match_doc_id) for m in results[1].matches] == [("exact", "d0")]
        role.engine = engine
        role._reset(2, 0)
        role._resume_lifecycle(2)
        tombstone = engine.sketch(Page("d0", "", deleted=True))
        assert not role._must_wait(2, tombstone)  # nothing waits
        role.waiting.append(Waiting(1, ("pages", 0, 1), 1, results[1]))
        assert role._must_wait(2, tombstone)
        assert not role._must_wait(2, engine.sketch(Page("d9", "", deleted=True)))
    for shard in shards:
        shard.close()
    role.executor.shutdown()


def test_an_ordinal_sequenced_again_before_its_sketch_came_is_skipped_not_waited_for(
        tmp_path: Path) -> None:
    """At-least-once, a sketch process stopped between a batch's sequence records and
    their sketches: ordinal 1 (page d1) never gets a sketch, and the next process
    sequences d1 again, at ordinal 3. The index waits at 1 until 3's sketch has come (the
    sketches partition holds them in the order they were sent: 1's is not coming), then
    goes on without it; d1 is indexed after d2."""
    cfg = config("oph", 4, 16)
    role = IndexRole(Config(kafka=KafkaConfig(transactions=False), engine=cfg), tmp_path / "i")
    sources = {0: ("pages", 0, 10), 1: ("pages", 0, 11), 2: ("pages", 1, 5),
               3: ("pages", 0, 11)}
    docs = {0: "d0", 1: "d1", 2: "d2", 3: "d1"}
    with Engine.open(tmp_path / "sketcher", cfg) as sketcher, \
            Engine.open(tmp_path / "i", cfg) as engine:
        role.engine = engine
        role._reset(0, 0)
        role.owner = True

        def sketch(o: int) -> SimpleNamespace:
            page = Page(docs[o], _body(int(docs[o][1:])))
            return SimpleNamespace(offset=o, timestamp=o, headers=[ordinal_header(o)],
                                   value=sketcher.sketch(page).to_bytes())

        role._route(role.seq_tp, [SimpleNamespace(
            offset=o, timestamp=o, headers=[], value=encode_sequence(docs[o], sources[o]))
            for o in range(4)])
        role._route(role.sketch_tp, [sketch(0), sketch(2)])
        role._advance()
        assert [o for o, _ in role.expected] == [1, 2, 3]  # 1's sketch may still come
        role._route(role.sketch_tp, [sketch(3)])
        role._advance()
        assert not role.expected and not role.waiting and role.floor == 4
        stored = {d: engine.indexer.current(d) for d in ("d0", "d1", "d2")}
        assert [v.ordinal for v in stored.values() if v is not None] == [0, 2, 1]
    role.executor.shutdown()


T = 10**9  # every sequence record's timestamp: retention's clock (ms)
# ordinal -> page id, text (None: a tombstone), fetched_at
AGED = [
    ("x", text_of([7], 0, "x"), T),  # recent: the age sweep stops at it while it is stored
    ("y", text_of([3, 4], 0, "y"), 1),  # expired long ago, but behind x
    ("w", text_of([0, 1], 0, "w"), T),
    ("p", text_of([0, 5], 0, "p"), T),  # copies a passage of w: waits for align
    ("w", text_of([0, 1], 0, "w"), T),  # a replay; the sweep before it removes nothing
    ("x", None, T),  # p still waits: the delete stores no sequence offset
    ("z", text_of([3, 6], 0, "z"), T),  # copies a passage of y; the sweep before it takes y
]


class FanInTurns:
    """An index role as fan-in of two ``ShardStore``s, run turn by turn without a broker:
    each turn's keys messages are applied by the shards (their partials read in the next
    turn), align requests are answered by ``engine.align`` once ``aligning`` is set."""

    def __init__(self, root: Path, cfg: EngineConfig, shards: list[ShardStore],
                 sketcher: Engine) -> None:
        self.role = IndexRole(Config(kafka=KafkaConfig(index_shards=2), engine=cfg),
                              root / "fan-in")
        self.engine = self.role.engine = Engine.open(root / "fan-in", cfg, shards=2,
                                                     remote_shards=self.role._open_fan_in)
        self.shards, self.sketcher = shards, sketcher
        self.aligning = False
        self.requests: list[int] = []  # ordinals whose align request is not answered
        self.published: list[dict[str, Any]] = []

    def own(self, published: int) -> tuple[int | None, int | None]:
        """Take the store over from ``published`` on, as ``IndexRole._take_over`` does;
        returns the store's sequence offset and the record ``recover`` found cut short."""
        role, ix = self.role, self.engine.indexer
        assert isinstance(ix, FanInIndexer)
        stored, again = ix.recover(self.engine.stored_offsets().get(("sequence", 0)),
                                   published)
        role._reset(published, 0)
        role._resume_lifecycle(stored)
        role.resend = [Outgoing(role.kc.keys_topic, m.to_bytes(), partition=s,
                                headers=[ordinal_header(seq)]) for seq, s, m in again]
        role.owner = True
        return stored, None if ix.carried is None else ix.carried[0]

    def read(self, ordinals: range) -> None:
        role = self.role
        role._route(role.seq_tp, [SimpleNamespace(
            offset=i, timestamp=T, headers=[],
            value=encode_sequence(AGED[i][0], ("pages", 0, i))) for i in ordinals])
        role._route(role.sketch_tp, [SimpleNamespace(
            offset=i, timestamp=T, headers=[ordinal_header(i)], value=self.sketcher.sketch(
                Page(doc, "", deleted=True) if text is None
                else Page(doc, text, fetched_at=fetched)).to_bytes())
            for i in ordinals for doc, text, fetched in [AGED[i]]])

    def turns(self, n: int) -> None:
        role = self.role
        for _ in range(n):
            partials = []
            for o in role._advance():
                if o.topic == role.kc.keys_topic:
                    shard = self.shards[o.partition]
                    p = shard.apply(ShardMessage.from_bytes(o.value),
                                    ("keys", o.partition, shard.offset("keys", o.partition) or 0))
                    if p is not None:
                        partials.append(SimpleNamespace(value=p.to_bytes()))
                elif o.topic == role.kc.align_topic:
                    self.requests.append(record_ordinal(o))
                elif o.topic == role.kc.output_topic:
                    match = messages.decode_match(o.value)
                    del match["detected_at"]
                    self.published.append(match)
            role._route(role.partials_tp, partials)
            if self.aligning:
                role._route(role.aligned_tp, [SimpleNamespace(
                    headers=[ordinal_header(o)], value=encode_aligned(
                        o, self.engine.align(role.by_ordinal[o].result)))
                    for o in self.requests])
                self.requests = []

    def close(self) -> None:
        self.engine.close()
        self.role.executor.shutdown()


def _aged_run(root: Path, crash: bool) -> tuple[list[dict[str, Any]], list[Any]]:
    """Records 0-5 with align stopped (p waits), then, with ``crash``, a SIGKILL and a
    takeover of the store from E = 3 (records 3-5 read again); then align answers and z
    comes. Returns what was published and what the fan-in and the shards hold."""
    cfg = replace(lifecycle_config("oph"), retention=RetentionConfig(max_age=100, every=2))
    shards = [ShardStore(root / "shards", cfg, s, 2, kept=64) for s in range(2)]
    with Engine.open(root / "sketcher", cfg) as sketcher:
        run = FanInTurns(root, cfg, shards, sketcher)
        run.own(0)
        run.read(range(6))
        run.turns(3)
        assert [w.ordinal for w in run.role.waiting] == [3, 4, 5]
        if crash:
            published = run.published
            run.close()
            run = FanInTurns(root, cfg, shards, sketcher)
            run.published = published
            # the delete at 5 is whole and sent: counted in the store, not run again
            assert run.own(3) == (6, None)
            run.read(range(3, 6))
            run.turns(3)
        run.aligning = True
        run.turns(3)
        run.read(range(6, 7))
        run.turns(3)
        assert not run.role.waiting
        ix = run.engine.indexer
        held = [sorted(k for k, _ in ix.store.items("ids"))] + [
            [sorted(k for k, _ in s.store.items(f)) for f in ("cws", "forward")]
            for s in shards]
        run.close()
    for s in shards:
        s.close()
    return run.published, held


def test_a_delete_behind_an_unfinished_page_is_not_taken_for_a_record_cut_short(
        tmp_path: Path) -> None:
    """p waits for align when x's tombstone comes: the delete stores no sequence offset
    (an earlier page is unfinished), so after a SIGKILL ``recover`` took its outbox entry
    for a record cut short and the store's offset fell back to 4. Record 4 was applied
    again on a store without x: its sweep, which x had stopped, now removed y, under a
    sequence record the shards had passed, so they kept y; z, a copy of y, then named y
    in its shards' partials and the fan-in failed at every start ('pages [1] have no
    forward record'). Marked complete in its batch, the delete is counted: the takeover
    publishes what a run without the crash publishes, and ends with the same stores."""
    want = _aged_run(tmp_path / "whole", crash=False)
    got = _aged_run(tmp_path / "killed", crash=True)
    assert any(m["kind"] == "passage" for m in want[0])
    assert b"y" not in want[1][0]  # the sweep before z took y
    assert got == want


def test_a_page_sequenced_again_far_past_the_read_ahead_bound_still_supersedes(
        tmp_path: Path) -> None:
    """As above, but 40 pages of another partition are sequenced between d0's two
    ordinals, more than the sequence records the index reads ahead of its sketches (32
    with batches of one record): it must read on past the bound to find d0's second
    ordinal (it stopped reading there, and waited at ordinal 0 forever). Records go to
    the role as its turns take them: a partition only while ``_wanted`` names it."""
    cfg = config("oph", 4, 16)
    role = IndexRole(Config(kafka=KafkaConfig(transactions=False),
                            worker=WorkerConfig(batch_size=1), engine=cfg), tmp_path / "i")
    last = 41
    docs = {o: f"d{o % last}" for o in range(last + 1)}  # d0 at 0 and at 41
    sources = {o: ("pages", 0, 10) if o % last == 0 else ("pages", 1, o)
               for o in range(last + 1)}
    with Engine.open(tmp_path / "sketcher", cfg) as sketcher, \
            Engine.open(tmp_path / "i", cfg) as engine:
        role.engine = engine
        role._reset(0, 0)
        role.owner = True
        pending = {
            role.seq_tp: [SimpleNamespace(offset=o, timestamp=o, headers=[],
                                          value=encode_sequence(docs[o], sources[o]))
                          for o in range(last + 1)],
            role.sketch_tp: [SimpleNamespace(offset=o, timestamp=o, headers=[ordinal_header(o)],
                                             value=sketcher.sketch(Page(docs[o], _body(o % last)))
                                             .to_bytes())
                             for o in range(1, last + 1)]}  # ordinal 0's never comes
        for _ in range(200):
            for tp in role._wanted():
                if pending.get(tp):
                    role._route(tp, [pending[tp].pop(0)])
            role._advance()
        assert role.floor == last + 1 and not role.expected
        assert role.read_ahead > role.max_waiting
    role.executor.shutdown()


def test_an_align_answer_the_index_cannot_read_is_aligned_by_the_index(tmp_path: Path) -> None:
    """An aligned record of another wire version (align processes upgraded first) or a
    broken one stopped the index role at every start, the page's matches never published.
    The index aligns that page itself and publishes its matches."""
    from tests.runtime.test_engine import rfc_words

    cfg = EngineConfig()
    role = IndexRole(Config(engine=cfg), tmp_path / "i")
    words = rfc_words("rfc2821.txt", 0, 4000)
    pages = [Page("A", " ".join(words[:1500])),
             Page("C", " ".join(words[3000:3800] + words[200:500]))]  # a passage of A
    with Engine.open(tmp_path / "sketcher", cfg) as sketcher, \
            Engine.open(tmp_path / "i", cfg) as engine:
        role.engine = engine
        role._reset(0, 0)
        role.owner = True
        role._route(role.seq_tp, [
            SimpleNamespace(offset=i, timestamp=i, headers=[],
                            value=encode_sequence(p.id, ("pages", 0, i)))
            for i, p in enumerate(pages)])
        role._route(role.sketch_tp, [
            SimpleNamespace(offset=i, timestamp=i, headers=[ordinal_header(i)],
                            value=sketcher.sketch(p).to_bytes()) for i, p in enumerate(pages)])
        out = role._advance()
        assert [o.topic for o in out if o.topic == role.kc.align_topic] == [role.kc.align_topic]
        role._route(role.aligned_tp, [SimpleNamespace(
            topic=role.kc.aligned_topic, partition=0, offset=0, timestamp=2,
            headers=[ordinal_header(1)], value=b"\xc1 not an aligned record")])
        published = [messages.decode_match(o.value) for o in role._advance()
                     if o.topic == role.kc.output_topic]
        assert ("C", "passage", "A") in [(m["doc_id"], m["kind"], m["match_doc_id"])
                                         for m in published]
    role.executor.shutdown()
