"""The projection of bench_stage_roles' measured costs to a crawl's rate (issue 43, deliver 6):
partitions and cores per role, broker bytes a second, and the first bottleneck, at 10^3 and
10^4 pages a second.

A role's CPU per page with P partitions of every stage is modelled as ``work + P * fixed``:
``work`` is shared out between the partitions (each handles its own pages), ``fixed`` is
what every partition spends on every page whatever it owns (the ledger over all decisions,
the sequence, a transaction per turn: the per-partition cost that does not fall with more
partitions). Both come from two setups that differ in partitions only (one copy of each
role, so that processes are alike). At a rate R pages/s a partition then needs
``R * (work / P + fixed)`` ms a second; with at most ``UTILIZATION`` of a core per
partition, P is the smallest that fits, and no P fits once ``R * fixed`` alone exceeds it:
that rate is the role's bound. Bytes per page of each topic are modelled alike (a page's
windows go to every list partition, the near shards answer it each).

A model from two points on a loaded shared machine: read the bounds as orders of magnitude.
And a pessimistic one: measured at tens of pages a second, ``fixed`` is mostly the
partitions' transactions (a turn a few pages: bench_stage_roles prints transactions per
page), which a faster stream spreads over more pages a turn; what stays per page and per
partition is the ledger over all decisions. So a bound here is where the partitions' cost
at the measured turn sizes alone takes UTILIZATION of a core, not a proven limit. With
``--backlog`` the same model is also fed each role's cost at saturation (stage_backlog.py:
every page already in its input, turns as large as the role makes them): the cost at a high
rate, the burst's kept beside it.
"""

from __future__ import annotations

import math
from typing import Any

UTILIZATION = 0.5  # of a core per partition: headroom for bursts and catch-up after outages
RATES = (1_000, 10_000)


def _pair(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The setups with the fewest and the most partitions, of the fewest copies both have."""
    by_copies: dict[int, dict[int, dict[str, Any]]] = {}
    for r in rows:
        by_copies.setdefault(r["copies"], {})[r["partitions"]] = r
    for copies in sorted(by_copies):
        got = by_copies[copies]
        if len(got) > 1:
            return got[min(got)], got[max(got)]
    raise ValueError("no two setups with the same copies and other partitions")


def linear(lo: dict[str, float], hi: dict[str, float], p_lo: int, p_hi: int
           ) -> dict[str, tuple[float, float]]:
    """(shared, per partition) of each key from its values at ``p_lo`` and ``p_hi``."""
    out = {}
    for key in lo:
        per = (hi[key] - lo[key]) / (p_hi - p_lo)
        out[key] = (lo[key] - p_lo * per, per)
    return out


def partitions_needed(rate: float, work_ms: float, fixed_ms: float) -> int | None:
    """The fewest partitions that keep each under UTILIZATION of a core; None if none do."""
    work, fixed = rate * max(work_ms, 0.0), rate * max(fixed_ms, 0.0)

    def fits(p: int) -> bool:  # (a cost exactly at the budget fits: floats round either way)
        return work / p + fixed <= 1000 * UTILIZATION + 1e-9

    room = 1000 * UTILIZATION + 1e-9 - fixed
    if room < 0 or (room == 0 and work > 0):
        return None
    p = 1 if work == 0 else max(1, math.ceil(work / room))
    for _ in range(2):  # (the division's rounding is off by one at most)
        if p > 1 and fits(p - 1):
            p -= 1
        elif not fits(p):
            p += 1
    return p


def projection(rows: list[dict[str, Any]], roles: list[str]) -> str:
    lo, hi = _pair(rows)
    p_lo, p_hi = lo["partitions"], hi["partitions"]
    cpu = linear(lo["cpu_ms"], hi["cpu_ms"], p_lo, p_hi)
    lines = [f"projection from the setups {p_lo} × {lo['copies']} and {p_hi} × {hi['copies']} "
             f"(partitions × copies): CPU ms per page = work + partitions × fixed; at most "
             f"{UTILIZATION:g} core per partition",
             "| role | work ms | fixed ms per partition (at the measured turns) | bound pages/s | "
             + " | ".join(f"partitions at {r:,} | cores at {r:,}" for r in RATES) + " |",
             "|---|---|---|---|" + "---|---|" * len(RATES)]
    bounds: dict[str, float] = {}
    wanted: dict[int, int] = dict.fromkeys(RATES, 1)
    unfit: dict[int, list[str]] = {rate: [] for rate in RATES}  # roles no partitions fit
    for role in roles:
        work, fixed = cpu[role]
        bound = math.inf if fixed <= 0 else 1000 * UTILIZATION / fixed
        bounds[role] = bound
        cells = []
        for rate in RATES:
            n = partitions_needed(rate, work, fixed)
            if n is None:
                cells += ["none fits", "-"]
                unfit[rate].append(role)
                continue
            wanted[rate] = max(wanted[rate], n)
            cells += [str(n), f"{rate * (work + n * fixed) / 1000:.1f}"]
        shown = "no bound measured" if math.isinf(bound) else f"{bound:,.0f}"
        lines.append(f"| {role} | {work:.2f} | {fixed:.3f} | {shown} | "
                     + " | ".join(cells) + " |")
    first = min(bounds, key=bounds.__getitem__)
    kinds = ("bytes", "changelog_bytes")
    sizes = {k: linear(lo[k], hi[k], p_lo, p_hi) for k in kinds}
    lines.append("")
    for rate in RATES:
        p = wanted[rate]
        per_page = {k: sum(max(a + p * b, 0.0) for a, b in sizes[k].values()) for k in kinds}
        some = ("the most any role needs" if not unfit[rate] else
                f"the most the others need; no number of partitions fits the "
                f"{', '.join(unfit[rate])} role{'s' if len(unfit[rate]) > 1 else ''}")
        lines.append(f"- at {rate:,} pages/s ({p} partitions per stage, {some}): the broker "
                     f"takes {rate * per_page['bytes'] / 1e6:.1f} MB/s "
                     f"between the roles and {rate * per_page['changelog_bytes'] / 1e6:.1f} "
                     f"MB/s into the changelogs (before compression and replication)")
    bound = bounds[first]
    lines.append(f"- first bottleneck at the measured turn sizes: the {first} role's "
                 "per-partition cost "
                 + ("(no bound measured: its fixed cost came out ≤ 0)" if math.isinf(bound)
                    else f"bounds the rate near {bound:,.0f} pages/s"))
    return "\n".join(lines)
