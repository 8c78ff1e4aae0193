"""A stream with planted near duplicates and copied passages, its truth known by construction."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from dupalign.page import Page


@dataclass
class Stream:
    pages: list[Page]
    near: set[tuple[int, int]] = field(default_factory=set)  # (page, earlier page)
    copies: set[tuple[int, int]] = field(default_factory=set)


def planted_stream(n_sources: int = 40, copies_each: int = 6, near_each: int = 1,
                   words: int = 220, copied: int = 90, edits: int = 2,
                   seed: int = 7) -> Stream:
    """``n_sources`` random pages, then in a shuffled order: ``copies_each`` pages per source
    holding ``copied`` of its words among fresh ones, ``near_each`` near duplicates (``edits``
    words changed). Every pair of pages holding the same copied words is a copy pair."""
    rng = random.Random(seed)
    vocab = [f"w{rng.getrandbits(40):x}" for _ in range(20_000)]
    texts = [[rng.choice(vocab) for _ in range(words)] for _ in range(n_sources)]
    out = Stream([])
    holders: dict[int, list[int]] = {}  # source -> pages holding its copied words
    for s, t in enumerate(texts):
        out.pages.append(Page(id=f"src{s}", body=" ".join(t)))
        holders[s] = [s]
    later = [("copy", s) for s in range(n_sources) for _ in range(copies_each)]
    later += [("near", s) for s in range(n_sources) for _ in range(near_each)]
    rng.shuffle(later)
    for kind, s in later:
        n = len(out.pages)
        if kind == "copy":
            a = (words - copied) // 2
            fresh = [rng.choice(vocab) for _ in range(words - copied)]
            body = fresh[:a] + texts[s][a:a + copied] + fresh[a:]
            for o in holders[s]:
                out.copies.add((n, o))
            holders[s].append(n)
        else:
            body = list(texts[s])
            for _ in range(edits):
                body[rng.randrange(words)] = rng.choice(vocab)
            out.near.add((n, s))
            for o in holders[s]:
                out.copies.add((n, o))
            holders[s].append(n)
        out.pages.append(Page(id=f"p{n}", body=" ".join(body)))
    return out
