"""A new version's ``revisit`` message does not depend on the idf table its sketch was made
under. A sketch made elsewhere can be under an older table than the index's: the uniform
one (version 0) or one before a freeze (a pipeline's sketch runs ahead). The index recomputes such a
fingerprint before it searches: the revisit's ``hamming`` must use the recomputed one too,
or it differs from ``Engine.process``'s once a table is frozen."""

from __future__ import annotations

from pathlib import Path

from dupalign.config import EngineConfig, NearConfig
from dupalign.near.idf import UNIFORM_IDF
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.sketch import Sketcher
from tests.corpora import DEMO


def test_a_revisit_sketched_under_an_older_idf_table_gets_the_engine_s_message(
        tmp_path: Path) -> None:
    config = EngineConfig(near=NearConfig(idf_freeze_at=(4,)))
    words = (DEMO / "rfc" / "rfc2821.txt").read_text("utf-8").split()
    pages = [Page(id=f"p{i}", body=" ".join(words[300 * i:300 * i + 300])) for i in range(6)]
    edited = words[300:600]
    edited[10:14] = ["an", "edited", "revisit", "here"]
    revisit = Page(id="p1", body=" ".join(edited))

    def first_pages(store: Path) -> Engine:
        engine = Engine.open(store, config)
        for page in pages:
            engine.process(page)
        assert engine.near.idf.version == 1  # a table was frozen after the 4th page
        return engine

    with first_pages(tmp_path / "one") as engine:
        (expected,) = [m for m in engine.process(revisit) if m.kind == "revisit"]
    with first_pages(tmp_path / "two") as engine:
        sk = Sketcher(config).sketch(revisit, UNIFORM_IDF)  # as the sketch role does
        (got,) = [m for m in engine.index(sk).matches if m.kind == "revisit"]
    assert expected.revisit == got.revisit == "changed"
    assert expected.hamming is not None
    assert (got.hamming, got.est_jaccard) == (expected.hamming, expected.est_jaccard)
