"""eager-SGD's rule: parsing, the synchronisation schedule, majority's draws and the weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.strategies.base import Context, StepStats
from tailtrain.strategies.eager import (
    REFERENCE_STALENESS_BOUND,
    Collective,
    EagerSGD,
    majority_initiator,
)
from tailtrain.strategies.registry import parse_strategy
from tailtrain.strategies.testing import ArrivalRow, arrivals, weights


def rounds(rule: EagerSGD, n: int, count: int, seed: int = 0):
    """The plans of ``count`` consecutive rounds."""
    state = rule.init(Context(n_workers=n, seed=seed))
    plans = []
    for r in range(count):
        plans.append(rule.plan(state))
        state = rule.adapt(state, StepStats(r, r + 1, float(r), plans[-1].k))
    return plans


def test_parse_defaults_and_describe():
    rule = parse_strategy("eager")
    assert (rule.mode, rule.sync_every, rule.staleness_bound) == (
        Collective.SOLO,
        0,
        REFERENCE_STALENESS_BOUND,
    )
    assert rule.topology == "partial-collective"
    for text in (
        "eager:mode=quorum,k=3,sync-every=7",
        "eager:mode=majority,staleness-bound=0",
    ):
        rule = parse_strategy(text)
        assert parse_strategy(rule.describe()) == rule
    assert parse_strategy("eager:mode=quorum,k=3").k == 3


@pytest.mark.parametrize(
    "text",
    [
        "eager:mode=allreduce",
        "eager:mode=fast",
        "eager:mode=solo,k=2",
        "eager:mode=quorum,k=0",
        "eager:sync-every=-1",
        "eager:staleness-bound=x",
        "eager:hop=0",
        "dbw-quorum:hop=1e-6",
        "eager:speed=2",
    ],
)
def test_bad_specs_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_strategy(text)


def test_quorum_larger_than_the_processes_is_refused():
    with pytest.raises(UsageError):
        parse_strategy("eager:mode=quorum,k=9").init(Context(n_workers=8))


def test_quorum_defaults_to_half():
    assert parse_strategy("eager:mode=quorum").init(Context(n_workers=7)).k == 4


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 9), st.integers(0, 9), st.sampled_from(["solo", "majority", "quorum"]))
def test_synchronisation_schedule(bound, every, mode):
    """Every ``bound``-th call is a synchronous allreduce (the reference's solo limiter), and
    every ``every``-th round also averages the models."""
    rule = parse_strategy(f"eager:mode={mode},staleness-bound={bound},sync-every={every}")
    plans = rounds(rule, n=6, count=40)
    for r, plan in enumerate(plans):
        average = every > 0 and (r + 1) % every == 0
        full = average or (bound > 0 and _since_last_full(plans[:r]) + 1 >= bound)
        assert plan.average_models == average
        assert plan.synchronous == full
        assert plan.k == (6 if full else 3 if mode == "quorum" else 1)
        assert plan.collective == (Collective.ALLREDUCE if full else Collective(mode))


def _since_last_full(previous) -> int:
    for back, plan in enumerate(reversed(previous)):
        if plan.synchronous:
            return back
    return len(previous)


def test_reference_bound_makes_every_33rd_call_synchronous():
    plans = rounds(parse_strategy("eager"), n=4, count=100)
    assert [r for r, p in enumerate(plans) if p.synchronous] == [32, 65, 98]


def test_majority_initiator_is_shared_and_uniform():
    n, count = 8, 4000
    plans = rounds(parse_strategy("eager:mode=majority,staleness-bound=0"), n, count, seed=3)
    ranks = np.array([p.initiator for p in plans])
    assert ranks.tolist() == [majority_initiator(3, r, n) for r in range(count)]
    # each rank's frequency within 4 binomial standard errors of 1/n
    freq = np.bincount(ranks, minlength=n) / count
    assert np.all(np.abs(freq - 1 / n) <= 4 * np.sqrt((1 / n) * (1 - 1 / n) / count))
    other = [p.initiator for p in rounds(parse_strategy("eager:mode=majority"), n, 50, seed=4)]
    assert other != ranks[:50].tolist()


@settings(max_examples=30, deadline=None)
@given(st.permutations(list(range(5))), st.integers(2, 9))
def test_every_contribution_weighs_one_over_p_in_any_order(order, n):
    """eager-SGD Alg. 2 line 6: the partial allreduce's sum divided by P."""
    rule = parse_strategy("eager:mode=solo")
    state = rule.init(Context(n_workers=n))
    cols = arrivals(
        [ArrivalRow(worker=w, version=w % 2, start=0.0, finish=float(w)) for w in order]
    )
    now, later = weights(rule.select(state, cols), cols)
    assert now.tolist() == [1 / n] * 5
    assert not later.any()


def test_hop_latency_is_a_network_property_not_a_rule_parameter():
    with pytest.raises(UsageError, match="--network hop=2e-6"):
        parse_strategy("eager:mode=solo,hop=2e-6")
