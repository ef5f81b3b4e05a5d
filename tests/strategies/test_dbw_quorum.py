"""dbw-quorum: eager-SGD's quorum collective steered by DBW's rule (DBW Eq. 19)."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.errors import UsageError
from tailtrain.strategies.base import ArrivalColumns, Context, StepStats
from tailtrain.strategies.dbw import Dbw
from tailtrain.strategies.eager import Collective
from tailtrain.strategies.registry import parse_strategy
from tailtrain.strategies.testing import ArrivalRow, arrivals, weights

N = 6


def test_parse_and_describe():
    rule = parse_strategy("dbw-quorum:window=3,beta=1.05,lr=proportional,sync-every=10")
    assert (rule.window, rule.beta, rule.lr_rule, rule.sync_every) == (3, 1.05, "proportional", 10)
    assert rule.topology == "partial-collective"
    assert parse_strategy(rule.describe()) == rule


@pytest.mark.parametrize("text", ["dbw-quorum:k=3", "dbw-quorum:lr=fast", "dbw-quorum:beta=0.5"])
def test_bad_specs(text):
    with pytest.raises(UsageError):
        parse_strategy(text)


def test_starts_with_every_process_and_plans_a_quorum():
    rule = parse_strategy("dbw-quorum:staleness-bound=0")
    plan = rule.plan(rule.init(Context(n_workers=N)))
    assert plan.collective is Collective.QUORUM and plan.k == N


def test_weights_are_the_mean_or_one_over_p():
    cols = arrivals([ArrivalRow(w, 0, 0.0, 1.0) for w in range(4)])
    fixed = parse_strategy("dbw-quorum")
    now, later = weights(fixed.select(fixed.init(Context(N)), cols), cols)
    assert now.tolist() == [0.25] * 4 and not later.any()
    prop = parse_strategy("dbw-quorum:lr=proportional")
    now, _ = weights(prop.select(prop.init(Context(N)), cols), cols)
    assert now.tolist() == [1 / N] * 4


def synthetic_round(rng, step: int, k: int, now: float, loss: float) -> StepStats:
    """A parameter-server-like round: the first k of N fresh calls used, the rest late."""
    finish = now + np.sort(rng.exponential(size=N))
    cols = ArrivalColumns.of(np.arange(N), np.full(N, step), np.full(N, now), finish)
    g2, mean2 = rng.uniform(2, 4) * k, rng.uniform(0.1, 0.5)
    return StepStats(
        step, step + 1, float(finish[k - 1]), k, cols, cols.keys[:k], loss, g2, mean2, 0.1
    )


def test_same_k_as_dbw_on_the_same_statistics():
    """With all of a round's used gradients fresh, DBW's own adapt and dbw-quorum's steering
    are the same functions on the same numbers, so they choose the same k_t."""
    ctx = Context(n_workers=N, lr=0.1)
    quorum = parse_strategy("dbw-quorum:window=3,staleness-bound=0")
    dbw = Dbw("dbw", window=3)
    q_state, d_state = quorum.init(ctx), dbw.init(ctx)
    rng, now, loss, chosen = np.random.default_rng(0), 0.0, 2.0, []
    for step in range(40):
        k = quorum.plan(q_state).k
        assert k == dbw.plan(d_state).k
        loss *= rng.uniform(0.9, 1.02)
        stats = synthetic_round(rng, step, k, now, loss)
        q_state, d_state = quorum.adapt(q_state, stats), dbw.adapt(d_state, stats)
        now = stats.time
        chosen.append(k)
    assert len(set(chosen)) > 1  # the rule did move k
