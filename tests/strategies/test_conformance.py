"""Invariants every registered strategy must satisfy, whichever engine drives it.

With constant delays (no stragglers) and k = n, every strategy's model equals synchronous
SGD's after the same number of updates (issue 3 and 4 conformance).
"""

from __future__ import annotations

import io
import json

import pytest
import torch

from tailtrain.core.records import clean
from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import Context, Strategy
from tailtrain.strategies.registry import BUILDERS, parse_strategy
from tailtrain.tasks import parse_task

N = 4

#: a spec of each registered strategy with k = n, or its no-straggler equivalent
NO_STRAGGLER_SPECS = {
    "sync": ["sync", "sync:mode=psw"],
    "k-sync": [f"k-sync:k={N}", f"k-sync:k={N},mode=psw", f"k-sync:k={N},mode=pull"],
    "k-batch-sync": [f"k-batch-sync:k={N}"],
    "k-async": [f"k-async:k={N}"],
    "k-batch-async": [f"k-batch-async:k={N}"],
    "async": [],  # K = 1 by definition: tested with one worker below
    "adasync": [
        f"adasync:base=k-sync,k0={N},interval=1",
        f"adasync:base=k-async,k0={N},interval=1",
    ],
    "dbw": ["dbw:window=3"],
    "b-dbw": ["b-dbw"],
    "lgc": [f"lgc:k={N},blocks=4"],
    "dropcompute": ["dropcompute:threshold=inf", "dropcompute:threshold=auto,calibrate=3"],
    "local-sgd": ["local-sgd:period=1"],
    "eager": ["eager:mode=solo", "eager:mode=majority", f"eager:mode=quorum,k={N}"],
    "dbw-quorum": ["dbw-quorum"],
    "rebalance": [
        "rebalance:warmup=1",
        "rebalance:warmup=1,then=dropcompute,threshold=inf",
        "rebalance:deal=demand",
    ],
}


class CaptureTask:
    """Delegates to a task and keeps the parameters of the last evaluation."""

    def __init__(self, task) -> None:
        self._task = task
        self.theta = None

    def __getattr__(self, name):
        return getattr(self._task, name)

    def evaluate(self, theta):
        self.theta = theta.clone()
        return self._task.evaluate(theta)


def final_params(strategy_text: str, scenario: Scenario, seed: int = 0) -> torch.Tensor:
    strategy = parse_strategy(strategy_text)
    task = CaptureTask(parse_task(scenario.task, seed=seed))
    simulate(scenario, strategy, seed, task=task)
    return task.theta


def constant_scenario(**kw) -> Scenario:
    base = dict(task="logreg", workers=N, delay="const:value=1", iterations=8, eval_every=4)
    return Scenario(**{**base, **kw})


def test_every_registered_strategy_is_covered():
    assert sorted(NO_STRAGGLER_SPECS) == sorted(BUILDERS)


@pytest.fixture(scope="module")
def sync_params():
    return final_params("sync", constant_scenario())


@pytest.mark.parametrize(
    "text", [t for specs in NO_STRAGGLER_SPECS.values() for t in specs if t != "sync"]
)
def test_without_stragglers_every_strategy_is_sync_sgd(text, sync_params):
    torch.testing.assert_close(final_params(text, constant_scenario()), sync_params)


def test_async_with_one_worker_is_sync_sgd():
    scenario = constant_scenario(workers=1)
    torch.testing.assert_close(final_params("async", scenario), final_params("sync", scenario))


def test_dispatcher_runs_every_engine():
    scenario = constant_scenario(iterations=2)
    for text in ("sync", "dropcompute:threshold=inf", "eager:mode=solo"):
        record = simulate(scenario, parse_strategy(text), 0)
        assert len(record.steps) == 2


@pytest.mark.parametrize("name", sorted(NO_STRAGGLER_SPECS))
def test_select_does_not_depend_on_arrival_order(name):
    import numpy as np

    from tailtrain.strategies.base import ArrivalColumns, Context

    text = (NO_STRAGGLER_SPECS[name] or ["async"])[0]
    strategy = parse_strategy(text)
    state = strategy.init(Context(n_workers=N, lr=0.1))
    rng = np.random.default_rng(0)
    start = rng.random(N)
    arrivals = ArrivalColumns(
        worker=np.arange(N),
        job=np.zeros(N, dtype=np.int64),
        version=np.zeros(N, dtype=np.int64),
        start=start,
        finish=start + rng.random(N),
        units=np.array([1.0, 1.0, 0.5, 1.0]),
        partial=np.array([False, False, True, False]),
    )
    order = np.array([2, 0, 3, 1])

    def by_worker(arr, selection):
        return {
            (int(arr.worker[i]), part): round(float(w[i]), 12)
            for part, w in (
                ("now", selection.now.over(arr.keys)),
                ("later", selection.later.over(arr.keys)),
            )
            for i in range(len(arr))
        }

    first = by_worker(arrivals, strategy.select(state, arrivals))
    shuffled = arrivals.take(order)
    assert by_worker(shuffled, strategy.select(state, shuffled)) == first


#: specs with stragglers (k < n, thresholds, partial collectives): states that really evolve
EVOLVING_SPECS = [
    "k-sync:k=2",
    "k-async:k=2",
    "k-batch-sync:k=3",
    "adasync:base=k-sync,k0=2,interval=2",
    "dbw:window=3",
    "b-dbw",
    "lgc:k=2,blocks=4",
    "dropcompute:threshold=auto,calibrate=3",
    "dropcompute:drop-rate=0.2,calibrate=2,recalibrate=5,compensate=extra-steps",
    "local-sgd:period=2,threshold=auto,calibrate=2",
    "eager:mode=majority",
    "dbw-quorum",
    "rebalance:deal=demand",
]


class RoundTrip(Strategy):
    """Delegates to a rule, and carries its state through torch.save / torch.load
    (weights_only=True) after every step: a checkpoint and resume at each step."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner
        self.name = inner.name
        self.topology = inner.topology

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def init(self, ctx):
        return self.inner.init(ctx)

    def plan(self, state):
        return self.inner.plan(state)

    def select(self, state, arrivals):
        return self.inner.select(state, arrivals)

    def adapt(self, state, stats):
        buffer = io.BytesIO()
        torch.save(self.inner.state_dict(self.inner.adapt(state, stats)), buffer)
        buffer.seek(0)
        return self.inner.load_state_dict(torch.load(buffer, weights_only=True))

    def describe(self) -> str:
        return self.inner.describe()


@pytest.mark.parametrize("text", EVOLVING_SPECS)
def test_state_dict_round_trip_continues_bit_identically(text):
    scenario = Scenario(
        task="logreg", workers=N, delay="exp:rate=1", micro_batches=3, iterations=14, eval_every=7
    )
    plain = simulate(scenario, parse_strategy(text), 3)
    resumed = simulate(scenario, RoundTrip(parse_strategy(text)), 3)
    assert json.dumps(clean(resumed.steps)) == json.dumps(clean(plain.steps))
    assert json.dumps(clean(resumed.evals)) == json.dumps(clean(plain.evals))


def test_a_state_of_another_strategy_is_refused():
    state = parse_strategy("k-sync:k=2").init(Context(n_workers=N))
    saved = parse_strategy("k-sync:k=2").state_dict(state)
    with pytest.raises(UsageError, match="resume with the strategy that wrote it"):
        parse_strategy("k-sync:k=3").load_state_dict(saved)
