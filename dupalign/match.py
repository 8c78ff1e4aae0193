"""A match between the current page and an earlier one, as published downstream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

MatchKind = Literal["exact", "near", "passage", "revisit"]


@dataclass(frozen=True)
class Span:
    """One aligned passage: half-open token and character ranges in both pages, the sketch
    estimate of their similarity and, computed from the two spans' alignment units (word
    shingles), the exact Jaccard and the containment of each span's units in the other's.
    The exact values are None only against a page indexed before they were kept."""

    tokens: tuple[int, int]
    chars: tuple[int, int]
    match_tokens: tuple[int, int]
    match_chars: tuple[int, int]
    est_jaccard: float
    jaccard: float | None = None
    containment: float | None = None  # share of this span's units found in match_tokens
    match_containment: float | None = None  # share of match_tokens' units found in this span

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens": list(self.tokens),
            "chars": list(self.chars),
            "match_tokens": list(self.match_tokens),
            "match_chars": list(self.match_chars),
            "est_jaccard": self.est_jaccard,
        }
        # (the values read once, not by getattr twice: a page's matches record packs every
        # span of them; this order makes the bytes)
        for name, value in (("jaccard", self.jaccard), ("containment", self.containment),
                            ("match_containment", self.match_containment)):
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Span:
        return cls(
            tokens=(int(d["tokens"][0]), int(d["tokens"][1])),
            chars=(int(d["chars"][0]), int(d["chars"][1])),
            match_tokens=(int(d["match_tokens"][0]), int(d["match_tokens"][1])),
            match_chars=(int(d["match_chars"][0]), int(d["match_chars"][1])),
            est_jaccard=float(d["est_jaccard"]),
            jaccard=_float_or_none(d.get("jaccard")),
            containment=_float_or_none(d.get("containment")),
            match_containment=_float_or_none(d.get("match_containment")),
        )


def best_span(spans: tuple[Span, ...] | list[Span]) -> Span:
    """The span a passage match is summarized by: the one with the most copied units (its
    containment × its length; the estimate × length for spans without exact values), so a
    long copy is not outranked by a short stray piece that happens to be verbatim."""
    def weight(s: Span) -> tuple[float, float]:
        if s.jaccard is None or s.containment is None:
            return (s.est_jaccard * (s.tokens[1] - s.tokens[0]), s.est_jaccard)
        return (s.containment * (s.tokens[1] - s.tokens[0]), s.jaccard)
    return max(spans, key=weight)


def _float_or_none(x: Any) -> float | None:
    return None if x is None else float(x)


@dataclass(frozen=True)
class Match:
    doc_id: str
    kind: MatchKind
    match_doc_id: str
    hamming: int | None = None
    est_jaccard: float | None = None  # near: CWS-verified; passage: the best span's
    jaccard: float | None = None  # passage: the best span's exact Jaccard
    spans: tuple[Span, ...] | None = None
    engine: dict[str, Any] = field(default_factory=dict, compare=False)
    # revisit (match_doc_id == doc_id, the page's previous version): "unchanged" (same
    # content hash) or "changed"; the capture that holds the previous version's content
    # (for a WARC revisit record's WARC-Refers-To-Target-URI and WARC-Refers-To-Date)
    revisit: str | None = None
    previous_url: str | None = None
    previous_fetched_at: int | None = None

    def to_dict(self, detected_at_ms: int | None = None) -> dict[str, Any]:
        """The wire fields of a ``match`` message (the caller adds the version ``v``)."""
        out: dict[str, Any] = {
            "doc_id": self.doc_id,
            "kind": self.kind,
            "match_doc_id": self.match_doc_id,
        }
        if self.hamming is not None:
            out["hamming"] = self.hamming
        if self.est_jaccard is not None:
            out["est_jaccard"] = self.est_jaccard
        if self.jaccard is not None:
            out["jaccard"] = self.jaccard
        if self.spans is not None:
            out["spans"] = [s.to_dict() for s in self.spans]
        for name in ("revisit", "previous_url", "previous_fetched_at"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if detected_at_ms is not None:
            out["detected_at"] = detected_at_ms
        out["engine"] = dict(self.engine)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Match:
        spans = d.get("spans")
        return cls(
            doc_id=d["doc_id"],
            kind=d["kind"],
            match_doc_id=d["match_doc_id"],
            hamming=d.get("hamming"),
            est_jaccard=d.get("est_jaccard"),
            jaccard=d.get("jaccard"),
            spans=None if spans is None else tuple(Span.from_dict(s) for s in spans),
            engine=dict(d.get("engine", {})),
            revisit=d.get("revisit"),
            previous_url=d.get("previous_url"),
            previous_fetched_at=d.get("previous_fetched_at"),
        )
