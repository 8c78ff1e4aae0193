"""bench_stage_roles' projection (tests/bench/stage_projection.py) against brute force: the
partitions it asks for are the fewest that fit, and the model comes back from two setups."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.bench.stage_projection import UTILIZATION, linear, partitions_needed, projection

ms = st.floats(min_value=0.0, max_value=20.0, allow_nan=False)


@given(rate=st.sampled_from([10, 100, 1_000, 10_000]), work=ms, fixed=st.floats(0.0, 0.5))
def test_partitions_needed_is_the_fewest_that_fit(rate: int, work: float, fixed: float) -> None:
    def fits(p: int) -> bool:
        return rate * (work / p + fixed) <= 1000 * UTILIZATION + 1e-9

    got = partitions_needed(rate, work, fixed)
    fitting = [p for p in range(1, 5_001) if fits(p)]
    if got is None:
        assert not fitting
    elif fitting:  # (past 5,000 partitions brute force gives up)
        assert got == fitting[0]


@given(work=ms, fixed=st.floats(0.0, 2.0), p_lo=st.integers(1, 4), more=st.integers(1, 8))
def test_the_model_comes_back_from_two_setups(work: float, fixed: float, p_lo: int,
                                              more: int) -> None:
    p_hi = p_lo + more
    got = linear({"r": work + p_lo * fixed}, {"r": work + p_hi * fixed}, p_lo, p_hi)["r"]
    assert abs(got[0] - work) < 1e-6 and abs(got[1] - fixed) < 1e-6


def test_the_first_bottleneck_is_the_role_with_the_largest_fixed_cost() -> None:
    def row(p: int) -> dict[str, object]:
        return {"partitions": p, "copies": 1,
                "cpu_ms": {"a": 2.0 + p * 0.01, "b": 1.0 + p * 0.1, "c": 3.0},
                "bytes": {"t": 100.0 * p}, "changelog_bytes": {"c": 50.0}}

    text = projection([row(1), row(4)], ["a", "b", "c"])
    assert "first bottleneck at the measured turn sizes: the b role" in text
    assert "near 5,000 pages/s" in text  # 0.5 core / 0.1 ms
    assert "| c | 3.00 | 0.000 | no bound measured |" in text
    # every role counted in the partitions a rate needs, those no partitions fit named
    assert "at 1,000 pages/s (6 partitions per stage, the most any role needs)" in text
    assert ("at 10,000 pages/s (60 partitions per stage, the most the others need; no number "
            "of partitions fits the b role)") in text
