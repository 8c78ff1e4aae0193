"""Prometheus metrics of the recall audit (dupalign.audit), in the registry of the process
that runs it: the single worker."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge


class AuditMetrics:
    """Counts of this process's audits, estimates of the store's."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.pages = Counter(
            "dupalign_audit_pages", "Pages audited for recall, by kind (near, passage)",
            ["kind"], registry=r,
        )
        self.pairs = Counter(
            "dupalign_audit_pairs", "True pairs of the audited pages, by kind and outcome "
            "(hit, miss) and, for misses, cause (budget, stop_list, list_cut, candidate_cut, "
            "align_cap, other)", ["kind", "outcome", "cause"], registry=r,
        )
        self.recall = Gauge(
            "dupalign_audit_recall", "Recall estimated by the audit since the store was made, "
            "by kind, with its 95 % Wilson interval (bound: estimate, low, high)",
            ["kind", "bound"], registry=r,
        )
        self.sample_pairs = Gauge(
            "dupalign_audit_sample_pairs", "True pairs the recall estimate rests on, by kind",
            ["kind"], registry=r,
        )

    def audited(self, results: list[Any], estimates: dict[str, dict[str, Any]]) -> None:
        """Export what ``Engine.run_audits`` returned and the store's estimates."""
        for res in results:
            for kind in ("near", "passage"):
                counts = getattr(res, kind)
                if counts is None:
                    continue
                hits, misses = counts
                self.pages.labels(kind).inc()
                self.pairs.labels(kind, "hit", "").inc(hits)
                for cause, n in misses.items():
                    self.pairs.labels(kind, "miss", cause).inc(n)
        for kind, e in estimates.items():
            self.sample_pairs.labels(kind).set(e["pairs"])
            if e["recall"] is not None:
                for bound in ("recall", "low", "high"):
                    self.recall.labels(kind, "estimate" if bound == "recall" else bound
                                       ).set(e[bound])
