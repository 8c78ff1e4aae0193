"""The engine end to end on a real RocksDB store: exact, near, replay, restart, bad input."""

from __future__ import annotations

import csv
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.errors import ConfigError, PageRejected, StoreMismatch
from dupalign.near.cws import weighted_jaccard
from dupalign.near.idf import IdfTable, tf_idf_weights
from dupalign.near.simhash import hamming, weighted_simhash
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.service.exits import Exit
from dupalign.store.database import Store
from dupalign.text.hashing import token_hashes
from dupalign.text.tokens import decode_body, tokenize
from tests.corpora import CLOUGH, DEMO, RFC


def rfc_words(name: str, start: int = 0, count: int = 600) -> list[str]:
    """Words of an RFC: from the demo corpus if it ships it, else from the shared test data
    (tests reading one of those carry @pytest.mark.testdata)."""
    path = DEMO / "rfc" / name
    if not path.exists():
        path = RFC / name
    words = path.read_text(encoding="utf-8", errors="replace").split()
    return words[start:start + count]


def edit(words: list[str], rate: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = list(words)
    for _ in range(int(len(out) * rate)):
        i = rng.randrange(len(out))
        out[i] = f"edited{rng.randrange(10**6)}"
    return out


def page(doc_id: str, words: list[str]) -> Page:
    return Page(id=doc_id, body=" ".join(words))


@pytest.mark.testdata
def test_exact_near_and_unrelated(tmp_path: Path) -> None:
    base = rfc_words("rfc2821.txt", 2000)
    with Engine.open(tmp_path / "s") as engine:
        assert engine.process(page("a", base)) == []
        exact = engine.process(Page(id="b", body="  ".join(base).upper()))
        assert [(m.kind, m.match_doc_id) for m in exact] == [("exact", "a")]
        near = engine.process(page("c", edit(base, 0.01, 1)))
        kinds = {(m.kind, m.match_doc_id) for m in near}
        assert ("near", "a") in kinds
        n = next(m for m in near if m.kind == "near")
        assert n.hamming is not None and n.hamming <= 3
        assert n.est_jaccard is not None and n.est_jaccard >= 0.8
        assert engine.process(page("d", rfc_words("rfc1035.txt", 3000))) == []


def test_near_matches_agree_with_exact_weighted_jaccard(tmp_path: Path) -> None:
    """Every reported near pair has true weighted Jaccard near the threshold or above, and
    pairs far above it (light edits, Hamming small) are all found."""
    base = rfc_words("rfc5321.txt", 5000, 800)
    variants = {f"v{i}": edit(base, rate, i) for i, rate in enumerate((0.0, 0.005, 0.01, 0.3, 0.6))}
    cfg = EngineConfig(passage=PassageConfig(enabled=False)).validate()
    found = {}
    with Engine.open(tmp_path / "s", cfg) as engine:
        engine.process(page("base", base))
        for doc_id, words in variants.items():
            found[doc_id] = {m.match_doc_id for m in engine.process(page(doc_id, words))}
    uniform = IdfTable.uniform()
    hb = token_hashes(tokenize(" ".join(base)).tokens, cfg.seed)
    ub, wb = tf_idf_weights(hb, uniform, "log")
    for doc_id, words in variants.items():
        hv = token_hashes(tokenize(" ".join(words)).tokens, cfg.seed)
        uv, wv = tf_idf_weights(hv, uniform, "log")
        truth = weighted_jaccard(ub, wb, uv, wv)
        if truth >= 0.9:
            assert "base" in found[doc_id], (doc_id, truth)
        if truth < 0.7:
            assert "base" not in found[doc_id], (doc_id, truth)


def test_replay_returns_the_same_matches_and_writes_nothing(tmp_path: Path) -> None:
    base = rfc_words("rfc2821.txt", 2000)
    with Engine.open(tmp_path / "s") as engine:
        engine.process(page("a", base))
        first = engine.process(page("b", edit(base, 0.01, 2)))
        pages_before = engine.next_ordinal
        again = engine.process(page("b", edit(base, 0.01, 2)), source=("pages", 0, 41))
        assert again == first and first
        assert engine.next_ordinal == pages_before
        assert engine.stored_offsets() == {("pages", 0): 42}


def test_published_offsets_are_kept_apart_from_the_stored_ones(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s") as engine:
        engine.process(page("a", rfc_words("rfc2821.txt", 300)), source=("pages", 0, 6))
        engine.set_checkpoint("pages", 0, 4)
        engine.set_checkpoint("pages", 0, 7)  # a later commit replaces the note
        engine.set_checkpoint("other", 3, 2)
    with Engine.open(tmp_path / "s") as engine:
        assert engine.checkpoints() == {("pages", 0): 7, ("other", 3): 2}
        assert engine.stored_offsets() == {("pages", 0): 7}


@pytest.mark.testdata
def test_reopen_continues_identically(tmp_path: Path) -> None:
    """A run interrupted by close/reopen yields the same matches as one uninterrupted run,
    including across idf freezes and volatility-model updates."""
    docs = []
    for i in range(14):
        base = rfc_words("rfc2616.txt", 1500 * (i % 5), 400)
        docs.append(page(f"d{i}", edit(base, 0.02 * (i // 5), i)))
    cfg = EngineConfig(near=NearConfig(idf_freeze_at=(4, 9))).validate()

    def run(stops: set[int], store: Path) -> list[list[tuple[str, str]]]:
        out: list[list[tuple[str, str]]] = []
        engine = Engine.open(store, cfg)
        for i, doc in enumerate(docs):
            if i in stops:
                engine.close()
                engine = Engine.open(store, cfg)
            out.append(sorted((m.kind, m.match_doc_id) for m in engine.process(doc)))
        assert engine.near.idf.version == 2
        engine.close()
        return out

    straight = run(set(), tmp_path / "one")
    assert run({3, 4, 9, 12}, tmp_path / "two") == straight
    assert any(straight), "the corpus must produce some matches for this test to mean anything"


def test_store_refuses_other_frozen_parameters(tmp_path: Path) -> None:
    Engine.open(tmp_path / "s").close()
    with pytest.raises(StoreMismatch, match="passage_k"):
        Engine.open(tmp_path / "s", EngineConfig(passage=PassageConfig(k=128)))
    # thresholds are not frozen
    Engine.open(tmp_path / "s", EngineConfig(near=NearConfig(cws_threshold=0.9))).close()


@pytest.mark.testdata
def test_a_store_made_under_the_older_near_defaults_answers_as_a_new_one(
        tmp_path: Path) -> None:
    """``near.hamming`` and ``near.cws_threshold`` are read at each lookup, not stored: a store
    made with h = 3 and 0.8 (the defaults before issue #45) gives, opened with today's
    defaults, the matches of a store made with them."""
    docs = [page(f"d{i}", edit(rfc_words("rfc2616.txt", 1500 * (i % 5), 400), 0.03 * (i // 5), i))
            for i in range(20)]
    older = EngineConfig(near=NearConfig(hamming=3, cws_threshold=0.8)).validate()
    for name, cfg in (("older", older), ("new", EngineConfig())):
        with Engine.open(tmp_path / name, cfg) as engine:
            for doc in docs[:10]:
                engine.process(doc)
    answers = []
    for name in ("older", "new"):
        with Engine.open(tmp_path / name) as engine:
            answers.append([sorted((m.kind, m.match_doc_id) for m in engine.process(doc))
                            for doc in docs[10:]])
    assert answers[0] == answers[1]
    assert any(answers[0]), "the pages must match something for this test to mean anything"


def test_rejected_pages_write_nothing(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "s") as engine:
        with pytest.raises(PageRejected) as err:
            engine.process(Page(id="bin", body=bytes(range(256)) * 50), source=("pages", 1, 7))
        assert err.value.reason == "undecodable"
        with pytest.raises(PageRejected) as err:
            engine.process(Page(id="blank", body="<p> </p>", content_type="text/html"))
        assert err.value.reason == "empty"
        # JSON escapes can carry lone surrogates, which UTF-8 (the store) cannot
        with pytest.raises(PageRejected) as err:
            engine.process(Page(id="u", url="http://x/\ud800", body="some words here"),
                           source=("pages", 1, 8))
        assert err.value.reason == "bad_unicode" and "url" in err.value.detail
        assert engine.next_ordinal == 0
        assert engine.stored_offsets() == {("pages", 1): 9}


def test_a_page_written_but_not_committed_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If processing fails after a page's batch is written, before the lists in memory
    learn of it, the next page drops those lists and reads them again from the store: it
    still finds the page, and answers from memory equal answers from the store."""
    words = rfc_words("rfc2821.txt", 0, 400)
    with Engine.open(tmp_path / "s") as engine:
        engine.process(page("a", words[:150]))
        engine.process(page("b", words[150:300]))

        def crash(ordinal: int, state: object) -> None:
            raise RuntimeError("crash after the write")

        monkeypatch.setattr(engine.passages, "commit", crash)
        with pytest.raises(RuntimeError):
            engine.process(page("c", words[100:200]))
        monkeypatch.undo()
        found = engine.process(page("d", words[120:180]))
        assert {m.match_doc_id for m in found if m.kind == "passage"} >= {"a", "c"}
        engine.process(page("e", words[140:220]))
        probe = " ".join(words[100:200])
        hot = [(m.match_doc_id, m.spans) for m in engine.query_text(probe)]
        engine.passages.cache.clear()
        assert [(m.match_doc_id, m.spans) for m in engine.query_text(probe)] == hot
        assert {doc for doc, _ in hot} >= {"a", "b", "c", "d", "e"}


def test_invalid_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"near\.hamming"):
        EngineConfig.from_dict({"near": {"hamming": 40}})
    with pytest.raises(ConfigError, match=r"passage\.theta"):
        EngineConfig.from_dict({"passage": {"theta": "7/5"}})
    with pytest.raises(ConfigError, match="nope"):
        EngineConfig.from_dict({"nope": 1})


def _clough() -> tuple[dict[str, tuple[str, str]], dict[str, list[str]]]:
    with open(CLOUGH / "file_information.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    info = {r["File"]: (r["Category"], r["Task"]) for r in rows if r["Category"] != "orig"}
    toks = {f: tokenize(decode_body((CLOUGH / f).read_bytes())).tokens for f in info}
    for t in "abcde":
        orig = CLOUGH / f"orig_task{t}.txt"
        toks[orig.name] = tokenize(decode_body(orig.read_bytes())).tokens
    return info, toks


def _shingle_jaccard(a: list[str], b: list[str], n: int) -> float:
    sa, sb = ({tuple(t[i:i + n]) for i in range(len(t) - n + 1)} for t in (a, b))
    return len(sa & sb) / len(sa | sb)


@pytest.mark.testdata
def test_clough_near_duplicates_match_the_oracle(tmp_path: Path) -> None:
    """Whole-document near duplicates on Clough: no `non` answer matches its original; every
    answer within the simhash radius (Hamming ≤ h under the same weights, computed here by
    brute force) whose exact Jaccard of word ``near.shingle``-shingles (what the verification
    estimates) is ≥ ``cws_threshold`` + 0.04 is found; nothing below 0.6 is reported. (Most
    `cut` answers copy part of the original: they are passages, not near duplicates of the
    whole page; test_passages checks those. Weighted word Jaccard is not the oracle: a heavy
    edit at 0.905 has 3-shingle Jaccard 0.798.)"""
    info, toks = _clough()
    cfg = EngineConfig(passage=PassageConfig(enabled=False)).validate()
    reported: dict[str, set[str]] = {}
    with Engine.open(tmp_path / "s", cfg) as engine:
        for t in "abcde":
            engine.process(Page(id=f"orig_task{t}.txt", body=" ".join(toks[f"orig_task{t}.txt"])))
        for f in info:
            found = engine.process(Page(id=f, body=" ".join(toks[f])))
            reported[f] = {m.match_doc_id for m in found if m.match_doc_id.startswith("orig")}
    uniform = IdfTable.uniform()
    high = 0
    for f, (category, task) in info.items():
        orig = f"orig_task{task}.txt"
        ua, wa = tf_idf_weights(token_hashes(toks[f], cfg.seed), uniform, "log")
        ub, wb = tf_idf_weights(token_hashes(toks[orig], cfg.seed), uniform, "log")
        truth = _shingle_jaccard(toks[f], toks[orig], cfg.near.shingle)
        distance = hamming(weighted_simhash(ua, wa)[0], weighted_simhash(ub, wb)[0])
        if category == "non":
            assert not reported[f], f
        if truth >= cfg.near.cws_threshold + 0.04 and distance <= cfg.near.hamming:
            high += 1
            assert category in ("cut", "light", "heavy")
            assert orig in reported[f], (f, truth)
        if truth < 0.6:
            assert orig not in reported[f], (f, truth)
    assert high >= 2


def test_uncommitted_memory_state_matches_store_after_reopen(tmp_path: Path) -> None:
    base = rfc_words("rfc2821.txt", 100)
    with Engine.open(tmp_path / "s") as engine:
        engine.process(page("a", base))
        table_before = np.sort(engine.near.table.all_arrays()[0])
    with Engine.open(tmp_path / "s") as engine:
        assert np.array_equal(np.sort(engine.near.table.all_arrays()[0]), table_before)
        assert engine.next_ordinal == 1


@pytest.mark.parametrize("budget", [None, 100_000])
def test_in_memory_lists_stay_equal_to_the_store(tmp_path: Path, budget: int | None) -> None:
    """Lists read while processing are kept in memory and extended by later pages; a query
    on the warm engine must equal the same query on a freshly opened (cold) one, also when
    a small memory budget evicts lists all the time."""
    texts = [rfc_words("rfc2821.txt", 700 * i, 700) for i in range(6)]
    pages = [page(f"p{i}", edit(texts[i % 3], 0.05, i)) for i in range(6)]
    probe = " ".join(edit(texts[0], 0.05, 99) + edit(texts[1], 0.05, 98))
    cfg = EngineConfig(near=NearConfig(enabled=False)).validate()
    with Engine.open(tmp_path / "s", cfg) as warm:
        if budget is not None:
            warm.passages.cache.budget = budget
        for p in pages:
            warm.process(p)
            assert warm.passages.cache.bytes_used <= warm.passages.cache.budget
        assert warm.passages.counters.lists_cached > 0
        if budget is not None:  # evictions happened: fewer lists kept than read
            assert len(warm.passages.cache) < warm.passages.counters.lists_read
        hot = [(m.match_doc_id, m.spans) for m in warm.query_text(probe)]
    with Engine.open(tmp_path / "s", cfg) as cold:
        assert [(m.match_doc_id, m.spans) for m in cold.query_text(probe)] == hot
    assert {doc for doc, _ in hot} >= {"p0", "p1", "p3", "p4"}


def test_same_words_in_another_order_are_not_near_duplicates(tmp_path: Path) -> None:
    """Verification compares word 3-shingle sets: a page whose 4-word blocks are shuffled
    has the same bag of words (same simhash, so PSM nominates it) but is not a near
    duplicate (weighted word Jaccard 1, which the earlier word-level check accepted)."""
    words = rfc_words("rfc2821.txt", 0, 400)
    blocks = [words[i : i + 4] for i in range(0, len(words), 4)]
    random.Random(3).shuffle(blocks)
    shuffled = [w for b in blocks for w in b]
    cfg = EngineConfig(passage=PassageConfig(enabled=False)).validate()
    with Engine.open(tmp_path / "s", cfg) as engine:
        engine.process(page("orig", words))
        found = engine.process(page("shuffled", shuffled))
        assert engine.near.counters.candidates >= 1  # nominated by PSM ...
        assert not [m for m in found if m.kind == "near"]  # ... rejected by verification
        assert engine.near.counters.filter.pairs >= 1
    # with 1-word shingles (config near.shingle) verification sees the same word set
    words_cfg = EngineConfig(near=NearConfig(shingle=1),
                             passage=PassageConfig(enabled=False)).validate()
    with Engine.open(tmp_path / "w", words_cfg) as engine:
        engine.process(page("orig", words))
        found = engine.process(page("shuffled", shuffled))
        assert [m.match_doc_id for m in found if m.kind == "near"] == ["orig"]


@pytest.mark.parametrize("old_format", [2, 5])
def test_an_older_format_store_is_refused_with_how_to_rebuild_it(tmp_path: Path,
                                                                 old_format: int) -> None:
    """Format 6 keeps windows in forward records, not in the inverted lists: a store of
    an older format (its families, oph_empty among them, and its format in meta) is
    refused for writing and for reading, with a message that says how to rebuild it, and
    is left as it was."""
    import msgpack
    from rocksdict import Options, Rdict

    base = rfc_words("rfc2821.txt", 0, 400)
    with Engine.open(tmp_path / "s") as engine:
        engine.process(page("a", base))
        engine.store.put("meta", b"params",
                         msgpack.packb({**engine.store.params, "format": old_format}))
    db = Rdict(str(tmp_path / "s"), Options(raw_mode=True),
               column_families={n: Options(raw_mode=True)
                                for n in Rdict.list_cf(str(tmp_path / "s")) if n != "default"})
    db.create_column_family("oph_empty", Options(raw_mode=True))[b"\0"] = b"rows"
    db.close()
    for read_only in (False, True):
        with pytest.raises(StoreMismatch, match=(
                f"has format {old_format}, which this version of dupalign does not read .*"
                "rebuild it by processing the pages again into a new store")):
            Engine.open(tmp_path / "s", read_only=read_only)
    run = subprocess.run([sys.executable, "-m", "dupalign.service.cli", "scan",
                          str(DEMO / "rfc" / "rfc2821.txt"),
                          "--store", str(tmp_path / "s")], capture_output=True, text=True)
    assert run.returncode == Exit.STORE and "dupalign scan --store NEW" in run.stderr
    store = Store(tmp_path / "s", {}, read_only=True)
    assert msgpack.unpackb(store.get("meta", b"params") or b"")["format"] == old_format
    store.close()
