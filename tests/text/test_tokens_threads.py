"""The tokenizer's table of code points (dupalign/text/tokens.py ``_FLAGS``) is learned as
pages bring characters, from whichever thread tokenizes them (the roles' executors, the
scan pools), while the tokenizer's kernel reads it in other threads without the GIL: a
thread that reads a character another thread is learning tokenizes as one thread does."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from dupalign.text import tokens
from tests.text.test_text import _tokenize_twin


class _PausedAt:
    """``tokens._WORD`` that, in the thread learning ``ch`` first, waits while another
    thread tokenizes (at most 60 s): the learning thread is inside ``_learn``, ``ch`` met
    and classified in part."""

    def __init__(self, ch: str) -> None:
        self.ch, self.word = ch, tokens._WORD
        self.inside, self.resume = threading.Event(), threading.Event()
        self.learner: int | None = None

    def fullmatch(self, text: str) -> re.Match[str] | None:
        if text == self.ch and self.learner is None:
            self.learner = threading.get_ident()
            self.inside.set()
            self.resume.wait(60.0)
        return self.word.fullmatch(text)


_PAGES = {"A": "un caf\u00e9 noir", "B": "caf\u00e9 x\u00e9 ok"}


@pytest.fixture
def fresh_table(monkeypatch: pytest.MonkeyPatch) -> Iterator[_PausedAt]:
    """A table that knows ASCII only, as in a process that starts (the kernel compiled or
    loaded first: a compile in the paused thread could outlast the waits)."""
    for text in _PAGES.values():
        tokens.tokenize(text)
    monkeypatch.setattr(tokens, "_FLAGS", np.zeros_like(tokens._FLAGS))
    tokens._learn(np.arange(128, dtype=np.uint32))
    paused = _PausedAt("\u00e9")
    monkeypatch.setattr(tokens, "_WORD", paused)
    yield paused


def test_a_thread_that_meets_a_character_another_is_learning_tokenizes_it_right(
    fresh_table: _PausedAt,
) -> None:
    """A learns "é" and stops in the middle; B tokenizes a page with "é" then. The table
    holds 0 for "é" until A writes its whole byte: B learns it too (the same byte) and reads
    "é" as a word character, as A does (a byte written in parts, known first and a word
    character after, gave B "caf" and "x")."""
    pages = _PAGES
    found: dict[str, list[str]] = {}

    def tokenize(name: str) -> None:
        found[name] = tokens.tokenize(pages[name]).tokens

    a = threading.Thread(target=tokenize, args=("A",))
    a.start()
    assert fresh_table.inside.wait(60.0)
    tokenize("B")  # while A is inside _learn
    fresh_table.resume.set()
    a.join()
    assert found == {name: _tokenize_twin(text)[0] for name, text in pages.items()}
    assert found["B"] == ["caf\u00e9", "x\u00e9", "ok"]
