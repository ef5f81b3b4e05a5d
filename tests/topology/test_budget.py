"""One run budget for every engine and topology (``core.scenario.budget_spent``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tailtrain.core.scenario import Scenario, budget_spent


@given(st.integers(1, 500), st.integers(0, 1000))
def test_an_iteration_budget_counts_updates_and_a_unit_scale_leaves_it(iterations, step):
    s = Scenario(task="none", workers=2, iterations=iterations)
    assert budget_spent(s, step, 1e9) == (step >= iterations)
    assert budget_spent(s, step, 0.0, 1.0) == budget_spent(s, step, 0.0)


@given(st.integers(1, 200), st.sampled_from([1.0, 1.25, 1.5, 2.0]))
def test_a_scale_stretches_the_iterations_to_the_ceiling(iterations, scale):
    s = Scenario(task="none", workers=2, iterations=iterations)
    stretched = next(t for t in range(10**4) if budget_spent(s, t, 0.0, scale))
    assert stretched >= iterations and stretched - 1 < iterations * scale


@given(st.floats(0.0, 100.0), st.integers(0, 10**6))
def test_a_time_budget_ignores_the_steps_and_the_scale(now, step):
    s = Scenario(task="none", workers=2, iterations=None, time_budget=20.0)
    assert budget_spent(s, step, now, 1.5) == (now >= 20.0) == budget_spent(s, 0, now)
