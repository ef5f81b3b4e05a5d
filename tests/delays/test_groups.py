"""Replica groups (issue 38 item 4): the one rule that turns per-rank unit times into
per-group ones, its source for the engines and its law for predict."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tailtrain.delays import DelayProcess, parse_delay
from tailtrain.delays.groups import GroupedDelays, check_grouping, group_unit_times
from tailtrain.errors import UsageError
from tailtrain.theory.group_max import GroupMax

Z = 4.0


@st.composite
def rank_times(draw):
    """(I, N, M) or (I, N) non-negative unit times and a G that divides N."""
    g = draw(st.integers(1, 4))
    groups = draw(st.integers(1, 4))
    shape = (draw(st.integers(1, 5)), g * groups)
    if draw(st.booleans()):
        shape = (*shape, draw(st.integers(1, 4)))
    values = st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False)
    return draw(arrays(np.float64, shape, elements=values)), g


@settings(max_examples=60, deadline=None)
@given(rank_times(), st.floats(0.0, 10.0, allow_nan=False))
def test_a_group_unit_is_the_max_over_its_ranks_plus_the_cost(drawn, cost):
    times, g = drawn
    grouped = group_unit_times(times, g, cost)
    assert grouped.shape == (times.shape[0], times.shape[1] // g, *times.shape[2:])
    for group in range(times.shape[1] // g):
        ranks = times[:, group * g : (group + 1) * g]  # consecutive ranks, as an HSDP mesh
        np.testing.assert_array_equal(grouped[:, group], ranks.max(axis=1) + cost)


@settings(max_examples=30, deadline=None)
@given(rank_times())
def test_group_size_one_without_cost_is_the_identity(drawn):
    times, _ = drawn
    assert group_unit_times(times, 1) is times
    # with a cost, G = 1 only adds it
    np.testing.assert_array_equal(group_unit_times(times, 1, 0.5), times + 0.5)


def test_a_wrong_grouping_is_one_line():
    with pytest.raises(UsageError, match="does not divide --workers 8"):
        check_grouping(8, 3)
    with pytest.raises(UsageError, match="--group-size must be >= 1, got 0"):
        check_grouping(8, 0)
    with pytest.raises(UsageError, match="--group-cost must be finite"):
        check_grouping(8, 2, -1.0)
    with pytest.raises(UsageError, match="does not divide"):
        group_unit_times(np.ones((2, 6)), 4)


def test_the_grouped_source_groups_the_ranks_blocks():
    ranks = DelayProcess("exp:rate=1", None, 3, 8, 4)
    again = DelayProcess("exp:rate=1", None, 3, 8, 4)
    grouped = GroupedDelays(ranks, 2, 0.1)
    assert grouped.workers == 4
    for size in (5, 7):
        np.testing.assert_array_equal(
            grouped.next_block(size), group_unit_times(again.next_block(size), 2, 0.1)
        )


def test_a_time_scheduled_pattern_is_refused_for_groups():
    ranks = DelayProcess("exp:rate=1", "slowdown:at=1,factor=2,fraction=0.5", 0, 4)
    with pytest.raises(UsageError, match="changes speed at virtual times"):
        GroupedDelays(ranks, 2)


@pytest.mark.parametrize(
    "spec", ["exp:rate=2", "lognormal:mu=0,sigma=0.5", "uniform:low=0.5,high=1.5"]
)
def test_the_law_of_a_group_is_f_to_the_g(spec):
    """cdf F(x - c)^G, its quantile inverts it, and its mean and variance match draws."""
    base, g, cost = parse_delay(spec), 4, 0.05
    law = GroupMax(base, g, cost)
    x = np.linspace(0.1, 3.0, 7)
    np.testing.assert_allclose(law.cdf(x), base.cdf(x - cost) ** g)
    u = np.array([0.01, 0.3, 0.5, 0.9, 0.999])
    np.testing.assert_allclose(law.cdf(law.quantile(u)), u, rtol=1e-9)
    draws = group_unit_times(base.sample(np.random.default_rng(1), (200_000, g)), g, cost)
    assert abs(draws.mean() - law.mean) <= Z * draws.std() / np.sqrt(draws.size)
    assert law.var == pytest.approx(draws.var(), rel=0.02)


def test_the_max_of_exponentials_is_the_harmonic_sum():
    """E[max of G Exp(rate)] = H_G / rate, Var = sum 1/(k rate)^2 (Renyi)."""
    rate, g = 2.0, 5
    law = GroupMax(parse_delay(f"exp:rate={rate}"), g)
    assert law.mean == pytest.approx(sum(1 / k for k in range(1, g + 1)) / rate, rel=1e-10)
    assert law.var == pytest.approx(sum(1 / k**2 for k in range(1, g + 1)) / rate**2, rel=1e-8)
    assert GroupMax(parse_delay("const:value=1"), 3, 0.5).mean == pytest.approx(1.5)


def test_a_trace_of_ranks_becomes_one_of_its_groups():
    """Each unit of a group: max over its ranks + cost; samples add up, noncompute is the
    least, censored if a rank's was; a unit no rank recorded has no row."""
    from tailtrain.delays.groups import group_trace
    from tailtrain.delays.trace import Trace

    fields = ("iteration", "worker", "micro_batch", "seconds", "censored", "noncompute")
    fields += ("samples", "run")

    # 2 iterations x 4 ranks x 2 micro-batches; rank 3 never recorded iteration 1's second
    i, w, m = np.meshgrid(np.arange(2), np.arange(4), np.arange(2), indexing="ij")
    seconds = 1.0 + np.arange(16.0).reshape(2, 4, 2) % 5
    keep = ~((i == 1) & (w == 3) & (m == 1))
    noncompute = np.where(m == 1, 10.0 - w, np.nan)
    trace = Trace(
        iteration=i[keep],
        worker=w[keep] + 7,  # ids need not start at 0: groups follow id order
        micro_batch=m[keep],
        seconds=seconds[keep],
        censored=(w == 0)[keep],
        noncompute=noncompute[keep],
        samples=np.full(keep.sum(), 3),
    )
    grouped = group_trace(trace, 2, 0.25)
    order = np.lexsort((grouped.micro_batch, grouped.worker, grouped.iteration))
    grouped = Trace(
        *(None if c is None else c[order] for c in (getattr(grouped, f) for f in fields))
    )
    assert grouped.worker.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    expected = group_unit_times(seconds, 2, 0.25)
    expected[1, 1, 1] = seconds[1, 2, 1] + 0.25  # rank 3 missing: the max of the one left
    np.testing.assert_array_equal(grouped.seconds, expected.ravel())
    assert grouped.samples.tolist() == [6, 6, 6, 6, 6, 6, 6, 3]
    assert grouped.censored.tolist() == [True, True, False, False] * 2
    np.testing.assert_array_equal(grouped.noncompute[1::2], [9.0, 7.0, 9.0, 8.0])
    assert np.isnan(grouped.noncompute[::2]).all()
    with pytest.raises(UsageError, match="does not divide"):
        group_trace(trace, 3)


def test_the_group_law_keeps_its_far_tail():
    """P(max of G > x) = 1 - (1 - e^-x)^G ~ G e^-x far out, where 1 - F^G in doubles is 0:
    the split convolution of a group's micro-batches reads these logs (``theory.sums``)."""
    law = GroupMax(parse_delay("exp:rate=1"), 3, 0.5)
    log_sf, log_cdf = law.tail_logs(np.array([1.5, 40.5]))
    np.testing.assert_allclose(log_sf[0], np.log(1 - (1 - np.exp(-1.0)) ** 3), rtol=1e-12)
    np.testing.assert_allclose(log_sf[1], np.log(3.0) - 40.0, rtol=1e-12)
    np.testing.assert_allclose(np.exp(log_cdf[0]), law.cdf(1.5), rtol=1e-12)
    assert law.isf(3 * np.exp(-40.0)) == pytest.approx(40.5, rel=1e-9)
