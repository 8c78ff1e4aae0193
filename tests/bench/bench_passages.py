"""Passage alignment benchmark: accuracy against exact Jaccard, index size, cost vs store size.

Run: .venv/bin/python -m tests.bench.bench_passages [--quick] [--only accuracy|pan|scale]
     [--scale 1000,10000] [--lists-mb 256,1024] [--max-list 256,1024] [--compare-runs]
     [--compare-refine] [--stream steady|dense] [--max-candidates N] [--max-matches N]
     [--max-list-read 64,256]

1. Accuracy, the OPH paper's Table 2 (Exp-8): for a query Q and a text T, the truth S is every
   subsequence T[i..j] with exact Jaccard J(Q, T[i..j]) >= θ (brute force, no length limit:
   the paper's t = 1), ⊕S its token positions; R the ranges the OPH interval scan reports
   (k = 64), ⊕R theirs. Per pair P = |⊕S ∩ ⊕R| / |⊕R|, R = |⊕S ∩ ⊕R| / |⊕S|; P and R are
   averaged over pairs and F1 is the harmonic mean of the averages (that is how the paper's
   F1 column follows from its P and R columns). Pairs with an empty ⊕R (⊕S) are left out of
   the P (R) average and counted. Sets:
   * planted: a 128-word RFC passage (the query) whose copy, with 5-15% random word edits
     (substitute / insert / delete, words from the same RFC), is inserted into a 1000-word
     window of an RFC of another family or into a Clough answer (the text);
   * clough: a cut/light answer with word 3-gram containment >= 0.3 in its original (query)
     against that original (text);
   * rfc-chain: a 128-word passage of RFC 5321 (5322) against the 1500-word window of 2821
     (2822) around its best verbatim 8-gram matches.
   Units: words (as the paper), and word bigrams (the engine's default shingle = 2).
2. PAN text alignment (``pan_accuracy``, also run by ``--only pan``): character-level
   precision, recall, granularity and plagdet in both documents (tests/bench/pan.py), for
   the scan's merged spans (``passage.refine = false``) and the refined ones side by side:
   * planted: per edit level (none, light 5-15 %, heavy 25-35 % word edits), copies of a
     50-200-word passage of an RFC window (the source page, 600-1000 words) put into a
     1000-word window of an RFC of another family or a Clough answer;
   * clough: the cut/light/heavy answers against their originals; the true cases are the
     verbatim cores of the copies (word 5-gram tiles merged across gaps of <= 8 words).
   Every text is queried (``Engine.query_text``) against one store of all the sources; only
   its detections against its own source count, as in PAN's pairwise task.
3. Index size and cost as the store grows: Engine.process on pages of 300-1000 words with
   ``near.enabled = False`` (passage cost only), default passage config. Pages: real text
   (RFCs, Clough answers, llvm docs under ~/.cache/dupalign-docs if present) cut into chunks;
   when the real chunks run out, the same chunks with every word replaced by a random word of
   similar corpus frequency (a per-round permutation within frequency-rank bands), so list
   lengths grow as with natural text without pages copying each other; 10% of pages also get
   a planted, edited 100-200-word copy of an earlier page's passage. ``--stream dense``:
   dense duplication instead (``dense_stream``: random chunks of the RFCs, each region
   copied many times, 10% near copies), where the cost per page must stay flat thanks to
   the caps ``passage.max_candidates``, ``passage.max_matches`` and
   ``passage.max_list_read``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
from numba import njit

from dupalign.config import DEFAULT_MB, CacheConfig, EngineConfig, NearConfig, PassageConfig
from dupalign.page import Page
from dupalign.passage.interval_scan import align
from dupalign.passage.oph import compact_windows, oph_values
from dupalign.runtime.engine import Engine
from dupalign.text.hashing import token_hashes
from dupalign.text.tokens import html_to_text, tokenize
from tests import corpora
from tests.bench.pan import Alignment, pan_scores

I64 = npt.NDArray[np.int64]
FAMILIES = [{821, 2821, 5321}, {822, 2822, 5322}, {2246, 4346, 5246, 8446},
            {1945, 2068, 2616, 7230, 7231, 9110, 9112}, {1034, 1035}]


# -- accuracy -------------------------------------------------------------------------------

@njit(cache=True)
def _truth_ends(text: I64, in_q: npt.NDArray[np.bool_], q_size: int, p: int, q: int) -> I64:
    """For each start i, the largest j with J(Q, T[i..j]) >= p/q (-1 if none): O(n^2)."""
    n = text.shape[0]
    cnt = np.zeros(in_q.shape[0], dtype=np.int32)
    best = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        distinct = 0
        inter = 0
        for j in range(i, n):
            t = text[j]
            if cnt[t] == 0:
                distinct += 1
                if in_q[t]:
                    inter += 1
            cnt[t] += 1
            if q * inter >= p * (q_size + distinct - inter):
                best[i] = j
        for j in range(i, n):
            cnt[text[j]] = 0
    return best


def truth_positions(q_units: npt.NDArray[np.uint64], t_units: npt.NDArray[np.uint64],
                    p: int, q: int) -> npt.NDArray[np.bool_]:
    """⊕S: positions of T inside some subsequence with exact Jaccard >= p/q."""
    _, inv = np.unique(np.concatenate((q_units, t_units)), return_inverse=True)
    qi, ti = inv[: len(q_units)], inv[len(q_units):].astype(np.int64)
    in_q = np.zeros(int(inv.max()) + 1, dtype=np.bool_)
    in_q[qi] = True
    ends = _truth_ends(ti, in_q, int(in_q.sum()), p, q)
    cover = np.zeros(len(t_units) + 1, dtype=np.int64)
    starts = np.flatnonzero(ends >= 0)
    np.add.at(cover, starts, 1)
    np.add.at(cover, ends[starts] + 1, -1)
    return np.cumsum(cover[:-1]) > 0


def range_positions(ranges: list[tuple[int, int]], n: int) -> npt.NDArray[np.bool_]:
    m = np.zeros(n, dtype=np.bool_)
    for s, e in ranges:
        m[s:e] = True
    return m


@dataclass
class Pair:
    name: str
    query: list[str]
    text: list[str]


def edit(words: list[str], vocab: list[str], rate: float, rng: np.random.Generator) -> list[str]:
    """Random word edits: each word is substituted, followed by an insertion, or deleted
    with total probability ``rate`` (one third each)."""
    out: list[str] = []
    for w in words:
        r = rng.random()
        if r < rate / 3:
            out.append(vocab[rng.integers(len(vocab))])
        elif r < 2 * rate / 3:
            out += [w, vocab[rng.integers(len(vocab))]]
        elif r >= rate:
            out.append(w)
    return out


def rfc_words(number: int) -> list[str]:
    return tokenize(corpora.rfc_text(number)).tokens


def host_words(x: int, source_rfc: int, answers: list[list[str]],
               rng: np.random.Generator) -> list[str]:
    """The text a planted copy goes into: for even ``x`` a 1000-word window of an RFC of
    another family than the source's, for odd ``x`` a Clough answer."""
    if x % 2:
        return answers[int(rng.integers(len(answers)))]
    rfcs = corpora.rfc_numbers()
    fam = next(f for f in FAMILIES if source_rfc in f)
    words = rfc_words(int(rng.choice([r for r in rfcs if r not in fam])))
    h = int(rng.integers(0, len(words) - 1000))
    return words[h : h + 1000]


def planted_pairs(n: int, rng: np.random.Generator) -> list[Pair]:
    rfcs = corpora.rfc_numbers()
    answers = [tokenize(corpora.plain_text(a.body)).tokens for a in corpora.clough_answers()]
    pairs = []
    for x in range(n):
        a = int(rng.choice(rfcs))
        src = rfc_words(a)
        s = int(rng.integers(0, len(src) - 128))
        query = src[s : s + 128]
        copy = edit(query, src, float(rng.uniform(0.05, 0.15)), rng)
        host = host_words(x, a, answers, rng)
        at = int(rng.integers(0, len(host) + 1))
        pairs.append(Pair(f"rfc{a}@{s}", query, host[:at] + copy + host[at:]))
    return pairs


def clough_pairs() -> list[Pair]:
    out = []
    for a in corpora.clough_answers():
        ans = tokenize(corpora.plain_text(a.body)).tokens
        orig = tokenize(corpora.plain_text(corpora.clough_original(a.task))).tokens
        if a.category in ("cut", "light") and corpora.containment(ans, orig, 3) >= 0.3:
            out.append(Pair(a.file, ans, orig))
    return out


def chain_pairs(n: int, rng: np.random.Generator) -> list[Pair]:
    out = []
    for newer, older in ((5321, 2821), (5322, 2822)):
        new, old = rfc_words(newer), rfc_words(older)
        index: dict[tuple[str, ...], list[int]] = {}
        for i in range(len(old) - 7):
            index.setdefault(tuple(old[i : i + 8]), []).append(i)
        for _ in range(n // 2):
            s = int(rng.integers(0, len(new) - 128))
            q = new[s : s + 128]
            hits = [i for j in range(121) for i in index.get(tuple(q[j : j + 8]), [])]
            c = int(np.median(hits)) if hits else int(rng.integers(0, len(old)))
            lo = max(0, min(c - 750, len(old) - 1500))
            out.append(Pair(f"{newer}@{s}", q, old[lo : lo + 1500]))
    return out


def accuracy(sets: dict[str, list[Pair]], shingles: tuple[int, ...]) -> None:
    print("## Accuracy vs exact Jaccard (OPH interval scan, k = 64, t = 1)")
    print(f"{'set':<10} {'units':<7} {'θ':>4} {'pairs':>5} {'P':>6} {'R':>6} {'F1':>6} "
          f"{'pairF1':>6} {'noS':>4} {'noR':>4} {'align ms':>8} {'brute ms':>8} {'|T|':>5}")
    k = 64
    with tempfile.TemporaryDirectory() as d, Engine.open(d, EngineConfig()) as eng:
        units_of = eng.sketcher.passages.units
        warm = units_of(token_hashes(["a", "b", "c", "a"], 0))  # compile before timing
        align(oph_values(warm), compact_windows(oph_values(warm), k), k, (1, 2), 1)
        truth_positions(warm, warm, 1, 2)
        for shingle in shingles:
            cfg = PassageConfig(shingle=shingle)
            eng.sketcher.passages.cfg = cfg  # only ``units`` is used: it reads cfg.shingle
            for name, pairs in sets.items():
                enc = [(units_of(token_hashes(p.query, 0)), units_of(token_hashes(p.text, 0)))
                       for p in pairs]
                for num, den in ((3, 10), (2, 5), (1, 2)):
                    ps, rs, f1s, no_s, no_r, t_al, t_bf = [], [], [], 0, 0, [], []
                    for qu, tu in enc:
                        t0 = time.perf_counter()
                        got = align(oph_values(qu), compact_windows(oph_values(tu), k), k,
                                    (num, den), 1)
                        t1 = time.perf_counter()
                        truth = truth_positions(qu, tu, num, den)
                        t2 = time.perf_counter()
                        t_al.append(t1 - t0)
                        t_bf.append(t2 - t1)
                        rep = range_positions(got, len(tu))
                        both = int((rep & truth).sum())
                        p_ = both / rep.sum() if rep.any() else None
                        r_ = both / truth.sum() if truth.any() else None
                        no_r += p_ is None
                        no_s += r_ is None
                        if p_ is not None:
                            ps.append(p_)
                        if r_ is not None:
                            rs.append(r_)
                        if p_ is not None and r_ is not None:
                            f1s.append(2 * p_ * r_ / (p_ + r_) if p_ + r_ else 0.0)
                    mp = statistics.mean(ps) if ps else float("nan")
                    mr = statistics.mean(rs) if rs else float("nan")
                    f1 = 2 * mp * mr / (mp + mr) if mp + mr else 0.0
                    pf1 = statistics.mean(f1s) if f1s else float("nan")
                    n_t = statistics.mean(len(p.text) for p in pairs)
                    print(f"{name:<10} {'w' + str(shingle):<7} {num / den:>4.1f} {len(pairs):>5} "
                          f"{mp:>6.3f} {mr:>6.3f} {f1:>6.3f} {pf1:>6.3f} {no_s:>4} {no_r:>4} "
                          f"{1e3 * statistics.mean(t_al):>8.3f} "
                          f"{1e3 * statistics.mean(t_bf):>8.3f} {n_t:>5.0f}")
    print("noS / noR: pairs with no true / no reported position (left out of R / P). "
          "brute = numba O(n²) incremental exact Jaccard.")
    print()


# -- PAN text-alignment measures: the scan's spans and the refined ones ---------------------

# word edit rate ranges of the planted copies (substitute / insert / delete, see ``edit``)
EDIT_LEVELS = {"none": (0.0, 0.0), "light": (0.05, 0.15), "heavy": (0.25, 0.35)}
Range = tuple[int, int]


@dataclass
class PanDoc:
    """A suspicious text, the name of its source, and the true cases (char ranges)."""

    name: str
    group: str
    text: str
    src: str
    cases: list[tuple[Range, Range]]


def _char_starts(words: list[str]) -> list[int]:
    """Character offset of each word in ``" ".join(words)``."""
    out, at = [], 0
    for w in words:
        out.append(at)
        at += len(w) + 1
    return out


def _chars(words: list[str], starts: list[int], a: int, b: int) -> Range:
    return starts[a], starts[b - 1] + len(words[b - 1])


def planted_pan_docs(n: int, rng: np.random.Generator) -> tuple[dict[str, str], list[PanDoc]]:
    """Per edit level, ``n`` copies of a 50-200-word passage of an RFC window (600-1000
    words, the source page) inserted into a host text (a 1000-word window of an RFC of
    another family, or a Clough answer). Sources and suspicious texts."""
    rfcs = corpora.rfc_numbers()
    answers = [tokenize(corpora.plain_text(a.body)).tokens for a in corpora.clough_answers()]
    sources: dict[str, str] = {}
    docs = []
    for level, (lo, hi) in EDIT_LEVELS.items():
        for x in range(n):
            a = int(rng.choice(rfcs))
            words = rfc_words(a)
            w0 = int(rng.integers(0, len(words) - 1000))
            window = words[w0 : w0 + int(rng.integers(600, 1001))]
            ln = int(rng.integers(50, 201))
            s = int(rng.integers(0, len(window) - ln))
            copy = edit(window[s : s + ln], words, float(rng.uniform(lo, hi)), rng)
            host = host_words(x, a, answers, rng)
            at = int(rng.integers(0, len(host) + 1))
            susp = host[:at] + copy + host[at:]
            src_name = f"{level}-{x}-rfc{a}@{w0}"
            sources[src_name] = " ".join(window)
            case = (_chars(susp, _char_starts(susp), at, at + len(copy)),
                    _chars(window, _char_starts(window), s, s + ln))
            docs.append(PanDoc(f"{level}-{x}", level, " ".join(susp), src_name, [case]))
    return sources, docs


def verbatim_tiles(a: list[str], b: list[str], min_len: int = 5) -> list[tuple[int, int, int]]:
    """Greedy string tiling on words: maximal common word runs of ``min_len`` or more, the
    longest first, none sharing a word with an earlier one on either side: (i, j, length)."""
    where: dict[tuple[str, ...], list[int]] = {}
    for j in range(len(b) - min_len + 1):
        where.setdefault(tuple(b[j : j + min_len]), []).append(j)
    runs = []
    for i in range(len(a) - min_len + 1):
        for j in where.get(tuple(a[i : i + min_len]), []):
            if i and j and a[i - 1] == b[j - 1]:
                continue  # not maximal on the left
            n = min_len
            while i + n < len(a) and j + n < len(b) and a[i + n] == b[j + n]:
                n += 1
            runs.append((n, i, j))
    used_a, used_b = np.zeros(len(a), dtype=bool), np.zeros(len(b), dtype=bool)
    tiles = []
    for n, i, j in sorted(runs, key=lambda r: (-r[0], r[1], r[2])):
        if not used_a[i : i + n].any() and not used_b[j : j + n].any():
            used_a[i : i + n] = used_b[j : j + n] = True
            tiles.append((i, j, n))
    return sorted(tiles)


def clough_pan_docs(max_gap: int = 8) -> tuple[dict[str, str], list[PanDoc]]:
    """The 57 cut/light/heavy answers against their originals. The corpus marks no
    character ranges, so the true cases are taken to be the verbatim cores of the copied
    regions: word 5-gram tiles (greedy string tiling), merged while consecutive in both
    texts with gaps of at most ``max_gap`` words. That is a reader's marking for cut and
    light answers; for heavy ones (paraphrase) it keeps only the verbatim fragments."""
    sources = {f"orig_task{t}": corpora.plain_text(corpora.clough_original(t)) for t in "abcde"}
    docs = []
    for a in corpora.clough_answers():
        if a.category not in ("cut", "light", "heavy"):
            continue
        text, src = corpora.plain_text(a.body), f"orig_task{a.task}"
        at, ot = tokenize(text), tokenize(sources[src])
        groups: list[list[int]] = []  # [i0, i1, j0, j1] word ranges
        for i, j, n in verbatim_tiles(at.tokens, ot.tokens):
            g = groups[-1] if groups else None
            if g and 0 <= i - g[1] <= max_gap and 0 <= j - g[3] <= max_gap:
                g[1], g[3] = i + n, j + n
            else:
                groups.append([i, i + n, j, j + n])
        cases = [((int(at.starts[i0]), int(at.ends[i1 - 1])),
                  (int(ot.starts[j0]), int(ot.ends[j1 - 1]))) for i0, i1, j0, j1 in groups]
        docs.append(PanDoc(a.file, a.category, text, src, cases))
    return sources, docs


def pan_accuracy(sets: dict[str, tuple[dict[str, str], list[PanDoc]]]) -> None:
    """Every suspicious text queried against a store of the sources (default engine, near
    off), its detections against its own source scored with the PAN measures, for the
    scan's merged spans (``passage.refine = false``) and the refined ones."""
    from dupalign.passage import span_refine

    print("## PAN text alignment, character level in both documents (default engine): "
          "the scan's spans (raw) vs refined spans")
    print(f"{'set':<14} {'docs':>4} {'cases':>5} | {'raw P':>6} {'R':>6} {'gran':>5} "
          f"{'plagdet':>7} {'found':>5} | {'ref P':>6} {'R':>6} {'gran':>5} {'plagdet':>7} "
          f"{'found':>5} | {'raw ms':>6} {'ref ms':>6} {'refine':>6}")
    refine_time = [0.0]
    real_refine = span_refine.refine

    def timed_refine(*args: object, **kw: object) -> list[span_refine.Piece]:
        t = time.thread_time()
        out = real_refine(*args, **kw)  # type: ignore[arg-type]
        refine_time[0] += time.thread_time() - t
        return out

    span_refine.refine = timed_refine  # type: ignore[assignment]
    try:
        for set_name, (sources, docs) in sets.items():
            with tempfile.TemporaryDirectory() as d, Engine.open(
                    d, EngineConfig(near=NearConfig(enabled=False))) as eng:
                for name, text in sources.items():
                    eng.process(Page(id=name, body=text))
                eng.query_text(docs[0].text)  # warm up the kernels before timing
                groups = sorted({doc.group for doc in docs}, key=list(EDIT_LEVELS).index) \
                    if set_name == "planted" else ["cut", "light", "heavy"]
                rows: dict[str, dict[bool, list[Alignment]]] = {}
                all_cases: dict[str, list[Alignment]] = {}
                found: dict[str, dict[bool, int]] = {}
                wall = {False: 0.0, True: 0.0}
                refine_time[0] = 0.0
                for doc in docs:
                    cases = [Alignment(doc.name, doc.src, a, b) for a, b in doc.cases]
                    for key in (doc.group, "all"):
                        all_cases.setdefault(key, []).extend(cases)
                    for refine in (False, True):
                        eng.aligner.spans.cfg = replace(eng.aligner.spans.cfg, refine=refine)
                        t = time.thread_time()
                        matches = [m for m in eng.query_text(doc.text)
                                   if m.match_doc_id == doc.src]
                        wall[refine] += time.thread_time() - t
                        dets = [Alignment(doc.name, doc.src, sp.chars, sp.match_chars)
                                for m in matches for sp in m.spans or ()]
                        for key in (doc.group, "all"):
                            rows.setdefault(key, {False: [], True: []})[refine].extend(dets)
                            f = found.setdefault(key, {False: 0, True: 0})
                            f[refine] += bool(matches)
                n_docs = Counter(doc.group for doc in docs)
                n_docs["all"] = len(docs)
                for key in [*groups, "all"]:
                    cells = []
                    for refine in (False, True):
                        sc = pan_scores(all_cases[key], rows[key][refine])
                        cells.append(f"{sc.precision:>6.3f} {sc.recall:>6.3f} "
                                     f"{sc.granularity:>5.2f} {sc.plagdet:>7.3f} "
                                     f"{found[key][refine]:>5}")
                    timing = ""
                    if key == "all":
                        timing = (f"{1e3 * wall[False] / len(docs):>6.2f} "
                                  f"{1e3 * wall[True] / len(docs):>6.2f} "
                                  f"{1e3 * refine_time[0] / len(docs):>6.2f}")
                    print(f"{set_name + '/' + key:<14} {n_docs[key]:>4} "
                          f"{len(all_cases[key]):>5} | {cells[0]} | {cells[1]} | {timing}")
    finally:
        span_refine.refine = real_refine  # type: ignore[assignment]
    print("found: texts with a detection against their own source. ms: CPU ms per text "
          "(this thread), query_text with raw / refined spans; refine: of that, "
          "span_refine.refine (seeds and chains; the estimates and exact similarity of "
          "the spans are computed both ways). Planted edit rates: " + ", ".join(
              f"{k} {lo:.0%}-{hi:.0%}" for k, (lo, hi) in EDIT_LEVELS.items()) + ".")
    print()


# -- index size and cost as the store grows -------------------------------------------------

def real_chunks(rng: np.random.Generator, use_docs: bool) -> list[list[str]]:
    """Real text cut into chunks of 300-1000 words."""
    docs = [rfc_words(r) for r in corpora.rfc_numbers()]
    docs += [tokenize(corpora.plain_text(a.body)).tokens for a in corpora.clough_answers()]
    if use_docs:
        for f in corpora.llvm_doc_files():
            docs.append(tokenize(html_to_text(f.read_text(encoding="utf-8",
                                                          errors="replace"))).tokens)
    out = []
    for words in docs:
        s = 0
        while len(words) - s >= 300:
            n = int(rng.integers(300, 1001))
            out.append(words[s : s + n])
            s += n
    order = rng.permutation(len(out))
    return [out[i] for i in order]


class Remapper:
    """Replace every word by a random word of similar corpus frequency (a fixed permutation
    per round, within bands of frequency rank a quarter-octave wide)."""

    def __init__(self, chunks: list[list[str]]) -> None:
        freq = Counter(w for c in chunks for w in c)
        self.vocab = [w for w, _ in freq.most_common()]
        self.rank = {w: r for r, w in enumerate(self.vocab)}
        self.band = (4 * np.log2(np.arange(len(self.vocab)) + 1)).astype(np.int64)

    def mapping(self, rng: np.random.Generator) -> dict[str, str]:
        perm = np.arange(len(self.vocab))
        for b in np.unique(self.band):
            idx = np.flatnonzero(self.band == b)
            perm[idx] = rng.permutation(idx)
        return {w: self.vocab[perm[r]] for w, r in self.rank.items()}


# passage.max_list_read (0: a --baseline checkout from before it, which has no such cut)
LIST_READ = getattr(PassageConfig, "max_list_read", 0)
BLOCK = 500  # pages per remap block
RESERVOIR = 2000  # earlier pages kept as sources of planted copies


def page_stream(n: int, rng: np.random.Generator,
                use_docs: bool) -> Iterator[tuple[str, list[int] | None]]:
    """``n`` page texts whose duplication rate does not drift with the store size, each
    with the number of the earlier page it carries a planted copy of (a list of one, or
    None).

    Blocks of ``BLOCK`` pages, each drawing real chunks at random (without replacement in
    the block): the first block as they are, every later one through a fresh frequency-band
    remap (so a block is new text with real word statistics, and the natural copies inside
    the corpus, such as llvm-13 vs llvm-14 pages, recur at the same rate in every block).
    10% of the pages carry a planted copy of a passage of a uniformly random earlier page
    (reservoir sampling), with 5-15% word edits.
    """
    chunks = real_chunks(rng, use_docs)
    print(f"{len(chunks)} real chunks of 300-1000 words available; blocks of {BLOCK} pages, "
          "the first real text, the rest frequency-band remaps; 10% carry a planted copy")
    remap = Remapper(chunks)
    reservoir: list[tuple[int, list[str]]] = []
    mapping: dict[str, str] | None = None
    block: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
    for x in range(n):
        if x % BLOCK == 0:
            if x:
                mapping = remap.mapping(rng)
            block = rng.choice(len(chunks), size=min(BLOCK, len(chunks)), replace=False)
        c = chunks[int(block[(x % BLOCK) % len(block)])]
        words = c if mapping is None else [mapping[w] for w in c]
        source = None
        if x > 10 and rng.random() < 0.1:  # planted copy of an earlier page's passage
            source, src = reservoir[int(rng.integers(0, len(reservoir)))]
            ln = int(rng.integers(100, 201))
            s = int(rng.integers(0, max(1, len(src) - ln)))
            copy = edit(src[s : s + ln], remap.vocab[:5000], float(rng.uniform(0.05, 0.15)), rng)
            at = int(rng.integers(0, len(words) + 1))
            words = words[:at] + copy + words[at:]
        if len(reservoir) < RESERVOIR:
            reservoir.append((x, words))
        elif (r := int(rng.integers(0, x + 1))) < RESERVOIR:
            reservoir[r] = (x, words)
        yield " ".join(words), None if source is None else [source]


def dense_stream(n: int, rng: np.random.Generator) -> Iterator[tuple[str, list[int] | None]]:
    """Dense duplication: every page is a random 300-800-word chunk (random start) of one
    of the RFCs in ../shared/testdata (19), so each region of them is copied again and
    again as the stream grows; 10% of the pages get 5-15% word edits (near copies). What a
    crawl of licences, syndicated articles and mirrored docs looks like: a page's work
    must stay bounded (``passage.max_candidates``, ``passage.max_matches``) however many
    earlier copies there are. Each page comes with the earlier pages that share 100 or
    more words of the same RFC with it (its planted copies: finding one of them counts)."""
    texts = [rfc_words(r) for r in corpora.rfc_numbers()]
    if not texts:
        raise SystemExit(f"the dense stream needs the RFCs of {corpora.RFC} (../shared/testdata "
                         "beside the repository); none found")
    vocab = sorted({w for t in texts for w in t})
    print(f"dense duplication: chunks of {len(texts)} RFCs ({sum(map(len, texts))} words), "
          "10% edited; planted: pages sharing >= 100 words of their RFC with an earlier page")
    seen: list[list[tuple[int, int, int]]] = [[] for _ in texts]  # (start, end, page) per RFC
    for x in range(n):
        r = int(rng.integers(0, len(texts)))
        src = texts[r]
        ln = int(rng.integers(300, 801))
        s = int(rng.integers(0, max(1, len(src) - ln)))
        words = src[s : s + ln]
        if rng.random() < 0.1:
            words = edit(words, vocab, float(rng.uniform(0.05, 0.15)), rng)
        earlier = np.array(seen[r], dtype=np.int64).reshape(-1, 3)
        shared = np.minimum(earlier[:, 1], s + ln) - np.maximum(earlier[:, 0], s)
        sources = earlier[shared >= 100, 2].tolist()
        seen[r].append((s, s + ln, x))
        yield " ".join(words), sources or None


def family_bytes(eng: Engine, family: str) -> int:
    """Bytes of a column family after flush (0 if the store's format has no such family)."""
    cf = eng.store._cfs.get(family)
    if cf is None:
        return 0
    return int(cf.property_int_value("rocksdb.total-sst-files-size") or 0) + int(
        cf.property_int_value("rocksdb.size-all-mem-tables") or 0)


def cache_entries_per_mb(eng: Engine) -> float:
    """List entries held in the in-memory list cache per MB it uses."""
    cache = eng.passages.cache
    entries = int(np.maximum(cache.s_len[: cache.n_slots], 0).sum())
    return entries / max(1e-9, cache.bytes_used / 2**20)


@dataclass
class Variant:
    """One engine of the scale run; several are fed the same pages in turn."""

    name: str
    engine: Engine
    wall: float = 0.0  # seconds in Engine.process since the last checkpoint
    thread: float = 0.0  # CPU seconds of the calling thread in it
    matches: int = 0
    planted_found: int = 0  # planted copies matched with their source page
    stage_cpu: tuple[float, float, float] = (0.0, 0.0, 0.0)  # sketch, index, align seconds


def scale(checkpoints: list[int], use_docs: bool, profile_last: bool, store_root: str | None,
          lists_mbs: tuple[int, ...] = (DEFAULT_MB["lists"],), compare_runs: bool = False,
          max_lists: tuple[int, ...] = (PassageConfig.max_list,),
          compare_refine: bool = False, dense: bool = False,
          caps: tuple[int, int] = (PassageConfig.max_candidates, PassageConfig.max_matches),
          name: str | None = None,
          list_reads: tuple[int, ...] = (LIST_READ,)) -> None:
    rng = np.random.default_rng(5)
    texts = (dense_stream(checkpoints[-1], rng) if dense else
             page_stream(checkpoints[-1], rng, use_docs))
    print(f"## Cost vs store size (near disabled; passage config: "
          f"{PassageConfig(max_candidates=caps[0], max_matches=caps[1])}; {CacheConfig()}); "
          "ms/page (wall), fg cpu (CPU time of the calling "
          "thread), cpu ms (process CPU time per page, RocksDB compactions included) and "
          "the counters are over the pages since the previous checkpoint; sk/ix/al cpu: CPU ms "
          "per page of the sketch, index (with finish) and align stages; lc ent/MB: list "
          "entries in the list cache per MB it uses; stop/pass: passage "
          "bins whose list is a stop list; cut/pass: list entries past passage.max_list_read "
          "(not counted; per distinct list of a page) per passage; planted: share of the "
          "pages with a planted copy matched with the page it was copied from")
    # (name, passage.max_list, cache.lists_mb, pack lists read from the store, refine spans,
    # passage.max_list_read)
    specs = [(" ".join([f"ml {m}"] * (len(max_lists) > 1) + [f"mb {mb}"] * (len(lists_mbs) > 1)
                       + [f"lr {lr}"] * (len(list_reads) > 1))
              or name or ("refined" if compare_refine else "runs"), m, mb, True, True, lr)
             for m in max_lists for mb in lists_mbs for lr in list_reads]
    if compare_runs:
        specs.append(("no runs", max_lists[0], lists_mbs[0], False, True, list_reads[0]))
    if compare_refine:
        specs.append(("raw", max_lists[0], lists_mbs[0], True, False, list_reads[0]))
    if len(specs) > 1:
        print(f"Engines fed the same pages in turn: {', '.join(s[0] for s in specs)} "
              "('ml N': passage.max_list = N; 'mb N': cache.lists_mb = N; 'no runs' keeps one "
              "key per list entry, never packing lists read from the store into runs; 'lr N': "
              "passage.max_list_read = N; 'raw' "
              "reports the scan's merged spans, passage.refine = false); "
              "process CPU is not split: '-'")
    print(f"{'pages':>7} {'variant':>8} {'ms/page':>8} {'fg cpu':>7} {'cpu ms':>7} "
          f"{'pass/pg':>7} {'lists/pass':>10} {'entries/pass':>12} {'keys/pass':>9} "
          f"{'runs/pg':>7} {'stop/pass':>9} {'cut/pass':>8} {'cand/pass':>9} {'pruned/pass':>11} "
          f"{'match/pg':>8} {'planted':>7} {'sk/ix/al cpu':>14} {'lc ent/MB':>9} "
          f"{'B/token':>8} {'oph B/tok':>9} {'store MB':>8} {'RSS MB':>7}")
    if store_root is not None:
        os.makedirs(store_root, exist_ok=True)
    dirs = [tempfile.mkdtemp(dir=store_root) for _ in specs]
    tokens = 0
    prof = cProfile.Profile() if profile_last else None
    variants: list[Variant] = []
    first_with_text: dict[int, int] = {}  # an exact duplicate is matched to the first copy
    canonical: list[int] = []
    try:
        for (name, max_list, lists_mb, packed, refine, list_read), d in zip(specs, dirs,
                                                                             strict=True):
            cfg = EngineConfig(near=NearConfig(enabled=False),
                               passage=PassageConfig(max_list=max_list, refine=refine,
                                                     max_candidates=caps[0],
                                                     max_matches=caps[1],
                                                     **({"max_list_read": list_read}
                                                        if list_read else {})),
                               cache=CacheConfig(lists_mb=lists_mb))
            eng = Engine.open(d, cfg)
            if not packed:
                eng.passages.pack_min = 1 << 62
            variants.append(Variant(name, eng))
        done = 0
        for cp in checkpoints:
            c0 = [dict(vars(v.engine.passages.counters)) for v in variants]
            for v in variants:
                v.wall = v.thread = v.matches = v.planted_found = 0
                v.stage_cpu = (0.0, 0.0, 0.0)
            planted = 0
            last_batch = cp == checkpoints[-1]
            if prof is not None and last_batch:
                prof.enable()
            cpu = time.process_time()  # all threads (RocksDB compactions too)
            for x in range(done, cp):
                text, sources = next(texts)
                tokens += text.count(" ") + 1  # words joined by single spaces
                canonical.append(first_with_text.setdefault(hash(text), x))
                want = {f"p{canonical[s]}" for s in sources or ()}
                planted += bool(want)
                for v in variants:
                    t, th = time.perf_counter(), time.thread_time()
                    found = v.engine.process(Page(id=f"p{x}", body=text))
                    v.wall += time.perf_counter() - t
                    v.thread += time.thread_time() - th
                    v.matches += len(found)
                    v.planted_found += any(m.match_doc_id in want for m in found)
                    r = v.engine.last_report
                    v.stage_cpu = (v.stage_cpu[0] + r.cpu_sketch, v.stage_cpu[1] + r.cpu_index,
                                   v.stage_cpu[2] + r.cpu_align)
            dcpu = time.process_time() - cpu
            if prof is not None and last_batch:
                prof.disable()
            n = cp - done
            for v, c in zip(variants, c0, strict=True):
                c1 = vars(v.engine.passages.counters)
                dp = max(1, c1["passages"] - c["passages"])
                pending = getattr(v.engine.passages, "pending", None)
                if pending is not None:  # (list entries written behind: all in, for the size)
                    pending.drain(into_file=True)
                v.engine.store.flush()
                size = v.engine.store.size_bytes()
                # the passage index: lists, and the windows (forward records, or empty windows
                # beside lists that hold the rectangles in stores before format 6)
                oph = sum(family_bytes(v.engine, f) for f in ("oph", "oph_empty", "forward"))
                proc = "-" if len(variants) > 1 else f"{1e3 * dcpu / n:.2f}"
                print(f"{cp:>7} {v.name:>8} {1e3 * v.wall / n:>8.2f} {1e3 * v.thread / n:>7.2f} "
                      f"{proc:>7} {dp / n:>7.1f} "
                      f"{(c1['lists_read'] - c['lists_read']) / dp:>10.1f} "
                      f"{(c1['entries_read'] - c['entries_read']) / dp:>12.1f} "
                      f"{(c1['keys_read'] - c['keys_read']) / dp:>9.1f} "
                      f"{(c1['runs_written'] - c['runs_written']) / n:>7.2f} "
                      f"{(c1['stopped_bins'] - c['stopped_bins']) / dp:>9.2f} "
                      f"{(c1.get('entries_cut', 0) - c.get('entries_cut', 0)) / dp:>8.1f} "
                      f"{(c1['candidates_scanned'] - c['candidates_scanned']) / dp:>9.2f} "
                      f"{(c1['candidates_pruned'] - c['candidates_pruned']) / dp:>11.2f} "
                      f"{v.matches / n:>8.2f} {v.planted_found / max(1, planted):>7.3f} "
                      f"{'/'.join(f'{1e3 * c / n:.2f}' for c in v.stage_cpu):>14} "
                      f"{cache_entries_per_mb(v.engine):>9.0f} "
                      f"{size / tokens:>8.1f} {oph / tokens:>9.1f} "
                      f"{size / 2**20:>8.1f} "
                      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:>7.0f}",
                      flush=True)
            done = cp
        for v in variants:
            fams = {f: family_bytes(v.engine, f)
                    for f in ("oph", "oph_empty", "forward", "positions", "docs")}
            print(f"{v.name}: bytes per token by family after flush: " + ", ".join(
                f"{f} {b / tokens:.1f}" for f, b in fams.items()) + f" ({tokens} tokens)")
    finally:
        for v in variants:
            v.engine.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    if prof is not None:
        for order in ("cumulative", "tottime"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(order).print_stats(25)
            print(f"## Profile of the last batch ({order})")
            print("\n".join(s.getvalue().splitlines()[:60]))
    print()


def _git_state() -> str:
    """HEAD and whether the engine's passage code differs from it (others edit the tree)."""
    repo = Path(str(sys.modules[Engine.__module__].__file__)).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--short", "dupalign"], cwd=repo, text=True,
                               capture_output=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    changed = [x for x in dirty if x.endswith(".py")]
    return head + (f" + uncommitted {', '.join(changed)}" if changed else "")


def timed(label: str, fn: Callable[[], None]) -> None:
    t = time.perf_counter()
    fn()
    print(f"[{label}: {time.perf_counter() - t:.1f}s]\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("accuracy", "pan", "scale"),
                    help="accuracy: exact-Jaccard truth and PAN measures; pan: PAN only")
    ap.add_argument("--scale", help="comma-separated store sizes (pages) to report at")
    ap.add_argument("--no-docs", action="store_true", help="do not use the llvm docs")
    ap.add_argument("--profile", action="store_true", help="cProfile the last scale batch")
    ap.add_argument("--store-root", help="directory for the scale store (default: tmp)")
    ap.add_argument("--lists-mb", default=str(DEFAULT_MB["lists"]),
                    help="scale: comma-separated memory budgets for inverted lists "
                    "(engine.cache.lists_mb), one engine each")
    ap.add_argument("--max-list", default=str(PassageConfig.max_list),
                    help="scale: comma-separated passage.max_list values, one engine each")
    ap.add_argument("--max-list-read", default=str(LIST_READ),
                    help="scale: comma-separated passage.max_list_read values, one engine "
                    "each")
    ap.add_argument("--stream", choices=("steady", "dense"), default="steady",
                    help="scale: the steady stream (remapped real text, planted copies) or "
                    "dense duplication (random chunks of the RFCs, each copied many times)")
    ap.add_argument("--max-candidates", type=int, default=PassageConfig.max_candidates,
                    help="scale: passage.max_candidates of every engine")
    ap.add_argument("--max-matches", type=int, default=PassageConfig.max_matches,
                    help="scale: passage.max_matches of every engine")
    ap.add_argument("--compare-runs", action="store_true",
                    help="scale: also run an engine that never packs lists, pages in turn")
    ap.add_argument("--compare-refine", action="store_true",
                    help="scale: also run an engine reporting the scan's raw spans, pages in turn")
    ap.add_argument("--baseline", type=Path,
                    help="scale: first run the same scale command with the dupalign of this "
                    "checkout (e.g. made by git worktree add --detach DIR REF), rows 'base'")
    ap.add_argument("--name", help=argparse.SUPPRESS)  # the variant's name in the table
    args = ap.parse_args()
    if args.baseline is not None:
        run_baseline(args.baseline, [a for a in sys.argv[1:]
                                     if a != "--baseline" and a != str(args.baseline)])
    print(f"# dupalign at {_git_state()}\n")
    rng = np.random.default_rng(1)
    if args.only in (None, "accuracy"):
        n = 30 if args.quick else 100
        sets = {"planted": planted_pairs(n, rng), "clough": clough_pairs(),
                "rfc-chain": chain_pairs(n // 2, rng)}
        timed("accuracy", lambda: accuracy(sets, (1,) if args.quick else (1, 2)))
    if args.only in (None, "accuracy", "pan"):
        pan_sets = {"planted": planted_pan_docs(30 if args.quick else 100, rng),
                    "clough": clough_pan_docs()}
        timed("PAN", lambda: pan_accuracy(pan_sets))
    if args.only in (None, "scale"):
        default = "200,500" if args.quick else "500,1000,2000,3000"
        cps = [int(x) for x in (args.scale or default).split(",")]
        timed("scale", lambda: scale(cps, not args.no_docs and bool(corpora.llvm_doc_files(1)),
                                     args.profile, args.store_root,
                                     tuple(int(x) for x in args.lists_mb.split(",")),
                                     args.compare_runs,
                                     tuple(int(x) for x in args.max_list.split(",")),
                                     args.compare_refine,
                                     args.stream == "dense",
                                     (args.max_candidates, args.max_matches),
                                     args.name or ("ours" if args.baseline else None),
                                     tuple(int(x) for x in args.max_list_read.split(","))))


def run_baseline(checkout: Path, argv: list[str]) -> None:
    """This bench's scale command with the dupalign package (and tests.corpora) of another
    checkout: the same stream through the old engine, printed before ours."""
    code = ("import importlib.util, sys\n"
            f"sys.path.insert(0, {str(checkout.resolve())!r})\n"
            f"spec = importlib.util.spec_from_file_location('bench_base', {__file__!r})\n"
            "m = importlib.util.module_from_spec(spec)\n"
            "sys.modules['bench_base'] = m\n"
            "spec.loader.exec_module(m)\n"
            f"sys.argv = ['bench_passages', *{argv!r}, '--name', 'base']\n"
            "m.main()\n")
    print(f"# baseline: {checkout}", flush=True)
    subprocess.run([sys.executable, "-c", code], cwd=str(checkout), check=True)


if __name__ == "__main__":
    main()
