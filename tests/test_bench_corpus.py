"""The benchmarks' Clough + RFC corpus refuses more pages than it has: a benchmark that
sent fewer pages than it then waits for would wait forever (one did)."""

from __future__ import annotations

import pytest

from tests.bench.bench_worker import corpus


@pytest.mark.testdata
def test_corpus_gives_every_page_it_has_and_refuses_one_more() -> None:
    with pytest.raises(SystemExit, match=r"asked for 1000000 pages, the Clough \+ RFC "
                                         r"corpus has \d+$") as refused:
        corpus(10**6)
    total = int(str(refused.value).rsplit(" ", 1)[1])
    assert len(corpus(total)) == total
    with pytest.raises(SystemExit):
        corpus(total + 1)
