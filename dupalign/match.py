"""A match between the current page and an earlier one, as published downstream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

MatchKind = Literal["exact", "near", "passage"]


@dataclass(frozen=True)
class Span:
    """One aligned passage: half-open token and character ranges in both pages."""

    tokens: tuple[int, int]
    chars: tuple[int, int]
    match_tokens: tuple[int, int]
    match_chars: tuple[int, int]
    est_jaccard: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "chars": list(self.chars),
            "match_tokens": list(self.match_tokens),
            "match_chars": list(self.match_chars),
            "est_jaccard": self.est_jaccard,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Span:
        return cls(
            tokens=(int(d["tokens"][0]), int(d["tokens"][1])),
            chars=(int(d["chars"][0]), int(d["chars"][1])),
            match_tokens=(int(d["match_tokens"][0]), int(d["match_tokens"][1])),
            match_chars=(int(d["match_chars"][0]), int(d["match_chars"][1])),
            est_jaccard=float(d["est_jaccard"]),
        )


@dataclass(frozen=True)
class Match:
    doc_id: str
    kind: MatchKind
    match_doc_id: str
    hamming: int | None = None
    est_jaccard: float | None = None
    spans: tuple[Span, ...] | None = None
    engine: dict[str, Any] = field(default_factory=dict, compare=False)

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
        if self.spans is not None:
            out["spans"] = [s.to_dict() for s in self.spans]
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
            spans=None if spans is None else tuple(Span.from_dict(s) for s in spans),
            engine=dict(d.get("engine", {})),
        )
